"""The numerics label a rule of tensor arithmetic deserves, decided by evaluating both sides on symbols.

A rule read from elsewhere (Tensat's files, `rewrites/tensat.py`) arrives without a label, and random
inputs cannot tell a re-association (which can overflow where the original does not) from a commutation
(which cannot): both pass most draws. Here both sides are evaluated at small concrete shapes with every
input element a distinct symbol, and each output element is a term over those symbols. The label is the
strongest under which the two terms agree:

- `exact`: equal up to the commutativity of + and * (bitwise in IEEE arithmetic) and relu(relu(x)) =
  relu(x). Data movement (concat, split, transpose) moves symbols without touching them.
- `order`: equal once nested sums and dot products are flattened into the multiset of terms they add: the
  same products summed in another grouping (README's numerics contract, the sum edge; strict runs it).
- `reals`: equal as polynomials over the reals (activations kept as opaque functions of their
  argument's polynomial): distribution, re-association of products, factoring. Not sound in floating point.
- `wrong`: not even equal over the reals.

Shapes come from TASO's typing of the operators: `shapes` draws sizes 1 to 3 for every axis of every input
such that both sides are well-formed (elementwise operands equal, matmul inner sizes equal, concat operands
equal off their axis), several different draws per rule. `float_counterexample` then looks for float32
inputs on which the two sides differ under the strict contract, and shrinks them.
"""
from __future__ import annotations

import itertools
import math
import random
from functools import lru_cache

import numpy as np

from superopt.core.verify import compare_outputs

LABELS = ("exact", "order", "reals", "wrong")     # strongest first
ACTIVATIONS = {0: None, 1: "sigmoid", 2: "relu", 3: "tanh"}    # TASO's ActiMode


class IllFormed(ValueError):
    """The operands of an operator do not fit at these shapes."""


# ---- the operators, over any element algebra ----

def evaluate(tree, env: dict, alg) -> np.ndarray:
    """Evaluate a Tensat term (nested lists, `?name` leaves) with inputs `env` in algebra `alg`."""
    if isinstance(tree, str):
        return env[tree[1:]]
    head, rest = tree[0], tree[1:]
    if head in ("ewadd", "ewmul"):
        a, b = evaluate(rest[0], env, alg), evaluate(rest[1], env, alg)
        if a.shape != b.shape:
            raise IllFormed(f"{head} of shapes {a.shape} and {b.shape}")
        return alg.add(a, b) if head == "ewadd" else alg.mul(a, b)
    if head == "smul":
        a, s = evaluate(rest[0], env, alg), evaluate(rest[1], env, alg)
        if s.ndim:
            raise IllFormed(f"smul by a tensor of shape {s.shape}")
        return alg.mul(a, np.broadcast_to(s, a.shape))
    if head in ("relu", "tanh", "sigmoid"):
        return alg.unary(head, evaluate(rest[0], env, alg))
    if head == "transpose":
        a = evaluate(rest[0], env, alg)
        if a.ndim != 2:
            raise IllFormed(f"transpose of rank {a.ndim}")
        return a.T
    if head == "matmul":
        act, (x, y) = (int(rest[0]), rest[1:]) if len(rest) == 3 else (0, rest)
        a, b = evaluate(x, env, alg), evaluate(y, env, alg)
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise IllFormed(f"matmul of shapes {a.shape} and {b.shape}")
        out = alg.matmul(a, b)
        return out if ACTIVATIONS[act] is None else alg.unary(ACTIVATIONS[act], out)
    if head == "conv2d":
        return _conv2d([int(v) for v in rest[:4]], evaluate(rest[4], env, alg), evaluate(rest[5], env, alg), alg)
    if head == "concat":
        axis, rank, (x, y) = concat_args(rest)
        a, b = evaluate(x, env, alg), evaluate(y, env, alg)
        if a.ndim != b.ndim or (rank is not None and a.ndim != rank) or not 0 <= axis < a.ndim or \
                any(m != n for i, (m, n) in enumerate(zip(a.shape, b.shape)) if i != axis):
            raise IllFormed(f"concat on axis {axis} of shapes {a.shape} and {b.shape}")
        return np.concatenate([a, b], axis)
    if head in ("split_0", "split_1"):
        axis, whole = int(tree[1][1]), tree[1][2]
        joined = concat_within(whole, axis)
        if joined is None:
            raise IllFormed(f"{head}: no concat on axis {axis} says where to split")
        point = evaluate(concat_args(joined[1:])[2][0], env, alg).shape[int(joined[1])]
        x = evaluate(whole, env, alg)
        return np.take(x, range(point) if head == "split_0" else range(point, x.shape[axis]), axis)
    raise KeyError(head)


def _conv2d(params, x, w, alg):
    """TASO's conv2d: x NCHW, w OIHW with I = C / groups, stride (sh, sw), padding 0 SAME or 1 VALID
    (padded positions add no product), then activation."""
    (sh, sw, pad, act), (n, c, h, wd), (o, cg, kh, kw) = params, x.shape, w.shape
    if x.ndim != 4 or w.ndim != 4 or c % cg or o % (c // cg) or pad not in (0, 1) or act not in ACTIVATIONS:
        raise IllFormed(f"conv2d {params} of shapes {x.shape} and {w.shape}")
    groups = c // cg
    if pad == 0:
        ho, wo = -(-h // sh), -(-wd // sw)
        ph, pw = max((ho - 1) * sh + kh - h, 0) // 2, max((wo - 1) * sw + kw - wd, 0) // 2
    else:
        ho, wo, ph, pw = (h - kh) // sh + 1, (wd - kw) // sw + 1, 0, 0
        if ho < 1 or wo < 1:
            raise IllFormed(f"conv2d VALID of a {kh}x{kw} kernel over {h}x{wd}")
    out = np.empty((n, o, ho, wo), dtype=x.dtype)
    for b, f, i, j in np.ndindex(out.shape):
        first = (f // (o // groups)) * cg
        pairs = [(x[b, first + ci, y, z], w[f, ci, dy, dz])
                 for ci in range(cg) for dy in range(kh) for dz in range(kw)
                 for y, z in [(i * sh - ph + dy, j * sw - pw + dz)] if 0 <= y < h and 0 <= z < wd]
        out[b, f, i, j] = alg.dot(pairs)
    return out if ACTIVATIONS[act] is None else alg.unary(ACTIVATIONS[act], out)


def concat_args(rest):
    """(axis, rank or None, operands) of concat's arguments: `axis rank a b` or the older `axis a b`."""
    return (int(rest[0]), int(rest[1]), rest[2:]) if len(rest) == 4 else (int(rest[0]), None, rest[1:])


def concat_within(tree, axis: int):
    """The concat on `axis` that `tree` is computed from, or None: where TASO's split cuts. It is found
    through elementwise ops (their first operand), a matmul (rows from its first operand, columns from
    its second) and a conv2d (batch from its input, channels from its kernels' first axis)."""
    while isinstance(tree, list):
        if tree[0] == "concat":
            return tree if int(tree[1]) == axis else None
        if tree[0] == "matmul" and axis in (0, 1):
            tree = tree[-2] if axis == 0 else tree[-1]
            continue
        if tree[0] == "conv2d" and axis in (0, 1):    # batch from the input, channels from the kernels
            tree, axis = (tree[5], 0) if axis == 0 else (tree[6], 0)
            continue
        if tree[0] not in ("ewadd", "ewmul", "smul", "relu", "tanh", "sigmoid"):
            return None
        tree = tree[1]
    return None


class Symbols:
    """Elements are terms: ("in", name, index), ("add", a, b), ("mul", a, b), ("dot", ((a, b), ...)),
    (activation, a)."""

    @staticmethod
    def add(a, b):
        return _each(lambda x, y: ("add", x, y), a, b)

    @staticmethod
    def mul(a, b):
        return _each(lambda x, y: ("mul", x, y), a, b)

    @staticmethod
    def unary(op, a):
        return _each(lambda x: (op, x), a)

    @staticmethod
    def dot(pairs):
        return ("dot", tuple(pairs))

    @staticmethod
    def matmul(a, b):
        out = np.empty((a.shape[0], b.shape[1]), dtype=object)
        for i, j in itertools.product(range(a.shape[0]), range(b.shape[1])):
            out[i, j] = ("dot", tuple((a[i, k], b[k, j]) for k in range(a.shape[1])))
        return out


class Floats:
    """float32 numbers, as XLA computes them (NaN and inf propagate)."""

    @staticmethod
    def add(a, b):
        return (a + b).astype(np.float32)

    @staticmethod
    def mul(a, b):
        return (a * b).astype(np.float32)

    @staticmethod
    def unary(op, a):
        if op == "relu":
            return np.maximum(a, np.float32(0))
        if op == "tanh":
            return np.tanh(a)
        return (1 / (1 + np.exp(-a))).astype(np.float32)

    @staticmethod
    def dot(pairs):
        total = np.float32(0)
        for a, b in pairs:
            total = np.float32(total + np.float32(a * b))
        return total

    @staticmethod
    def matmul(a, b):
        return (a @ b).astype(np.float32)


def _each(f, *arrays):
    """f applied to the elements at each index of equally shaped object arrays."""
    out = np.empty(arrays[0].shape, dtype=object)
    for idx in np.ndindex(out.shape):
        out[idx] = f(*(a[idx] for a in arrays))
    return out


def symbols(shapes: dict) -> dict:
    """Each input a tensor of distinct symbols."""
    env = {}
    for name, shape in shapes.items():
        arr = np.empty(shape, dtype=object)
        for idx in np.ndindex(shape):
            arr[idx] = ("in", name, idx)
        env[name] = arr
    return env


# ---- canonical forms, one per label ----

def _sorted(items) -> tuple:
    return tuple(sorted(items, key=repr))


@lru_cache(maxsize=None)
def exact_form(t):
    op = t[0]
    if op == "in":
        return t
    if op in ("add", "mul"):
        return (op,) + _sorted((exact_form(t[1]), exact_form(t[2])))
    if op == "dot":
        return ("dot", tuple(_sorted((exact_form(a), exact_form(b))) for a, b in t[1]))
    inner = exact_form(t[1])
    return inner if op == "relu" and inner[0] == "relu" else (op, inner)


@lru_cache(maxsize=None)
def order_form(t):
    op = t[0]
    if op == "in":
        return t
    if op in ("add", "dot"):
        summands = [order_form(t[1]), order_form(t[2])] if op == "add" else \
            [order_form(("mul", a, b)) for a, b in t[1]]
        flat = [s for x in summands for s in (x[1] if x[0] == "sum" else (x,))]
        return flat[0] if len(flat) == 1 else ("sum", _sorted(flat))
    if op == "mul":
        return ("mul",) + _sorted((order_form(t[1]), order_form(t[2])))
    inner = order_form(t[1])
    return inner if op == "relu" and inner[0] == "relu" else (op, inner)


@lru_cache(maxsize=None)
def polynomial(t) -> frozenset:
    """The term as a polynomial over the reals: {(monomial, coefficient)}, a monomial a sorted tuple of atoms."""
    return frozenset((m, c) for m, c in _poly(t).items() if c)


def _poly(t) -> dict:
    op = t[0]
    if op == "in":
        return {(t,): 1}
    if op == "add":
        return _padd(_poly(t[1]), _poly(t[2]))
    if op == "mul":
        return _pmul(_poly(t[1]), _poly(t[2]))
    if op == "dot":
        out: dict = {}
        for a, b in t[1]:
            out = _padd(out, _pmul(_poly(a), _poly(b)))
        return out
    inner = polynomial(t[1])
    if op == "relu" and len(inner) == 1:
        ((mono, coeff),) = inner
        if coeff == 1 and len(mono) == 1 and mono[0][0] == "relu":
            return {mono: 1}                        # relu(relu(x)) = relu(x)
    return {((op, _sorted(inner)),): 1}


def _padd(a: dict, b: dict) -> dict:
    out = dict(a)
    for m, c in b.items():
        out[m] = out.get(m, 0) + c
    return out


def _pmul(a: dict, b: dict) -> dict:
    out: dict = {}
    for (ma, ca), (mb, cb) in itertools.product(a.items(), b.items()):
        m = _sorted(ma + mb)
        out[m] = out.get(m, 0) + ca * cb
    return out


def label_at(pairs, shapes: dict) -> str:
    """The strongest label under which every pair's sides agree, elements as symbols, at these shapes."""
    env = symbols(shapes)
    best = 0
    for lhs, rhs in pairs:
        left, right = evaluate(lhs, env, Symbols), evaluate(rhs, env, Symbols)
        if left.shape != right.shape:
            return "wrong"
        for a, b in zip(left.flat, right.flat):
            for level, form in enumerate((exact_form, order_form, polynomial)):
                if level >= best and form(a) == form(b):
                    break
                best = max(best, level + 1)
            else:
                return "wrong"
    return LABELS[best]


def label(pairs, shape_draws: list[dict]) -> str:
    """The weakest of the labels at each drawn shape (the forms' caches hold one rule's terms only)."""
    try:
        return max((label_at(pairs, s) for s in shape_draws), key=LABELS.index)
    finally:
        for form in (exact_form, order_form, polynomial):
            form.cache_clear()


# ---- shapes ----

def shapes(pairs, draws: int = 3, seed: int = 0, tries: int = 4000) -> list[dict]:
    """Up to `draws` different shape assignments (sizes 1 to 3) under which every side is well-formed and
    each pair's sides have one shape; those with the most different sizes first (an uneven split), then
    the most elements."""
    names = sorted({leaf[1:] for pair in pairs for side in pair for leaf in leaves(side)})
    ranks = _ranks(pairs, names)
    rng = random.Random(seed)
    found: dict = {}
    for k in range(tries):
        if k % 2:    # every size drawn apart
            s = {n: tuple(rng.randint(1, 3) for _ in range(ranks[n])) for n in names}
        else:        # one shape per rank, a few sizes changed: where many sizes must agree
            base = {r: [rng.randint(1, 3) for _ in range(r)] for r in set(ranks.values())}
            s = {n: tuple(rng.randint(1, 3) if rng.random() < 0.25 else b for b in base[ranks[n]]) for n in names}
        key = tuple(sorted(s.items()))
        if key in found:
            continue
        try:
            env = {n: np.zeros(v, np.float32) for n, v in s.items()}
            if all(evaluate(lhs, env, Floats).shape == evaluate(rhs, env, Floats).shape for lhs, rhs in pairs):
                found[key] = s
        except IllFormed:
            continue
        if len(found) >= 4 * draws:
            break
    ordered = sorted(found.values(), key=lambda s: (-len({d for v in s.values() for d in v}),
                                                    -sum(math.prod(v) for v in s.values())))
    return ordered[:draws]


def leaves(tree):
    if isinstance(tree, str):
        if tree.startswith("?"):
            yield tree
        return
    for t in tree[1:]:
        yield from leaves(t)


def _ranks(pairs, names) -> dict:
    """Each input's rank, as the operators it meets require (2 where nothing says)."""
    rank: dict = {}

    def need(tree, r):
        if isinstance(tree, str):
            if tree.startswith("?") and r is not None and rank.get(tree[1:]) is None:
                rank[tree[1:]] = r
            return
        head, rest = tree[0], tree[1:]
        if head in ("ewadd", "ewmul"):
            need(rest[0], r), need(rest[1], r)
        elif head == "smul":
            need(rest[0], r), need(rest[1], 0)
        elif head in ("relu", "tanh", "sigmoid"):
            need(rest[0], r)
        elif head in ("transpose",):
            need(rest[0], 2)
        elif head == "matmul":
            for x in rest[-2:]:
                need(x, 2)
        elif head == "conv2d":
            need(rest[4], 4), need(rest[5], 4)
        elif head == "concat":
            axis, given, operands = concat_args(rest)
            for x in operands:
                need(x, given if given is not None else r)
        elif head in ("split_0", "split_1"):
            need(tree[1][2], r)

    for _ in range(3):   # a rank found on one side reaches the other through the pair
        for lhs, rhs in pairs:
            r = _rank_of(lhs, rank)
            r = r if r is not None else _rank_of(rhs, rank)
            need(lhs, r), need(rhs, r)
    return {n: rank[n] if rank.get(n) is not None else 2 for n in names}


def _rank_of(tree, rank):
    if isinstance(tree, str):
        return rank.get(tree[1:])
    head, rest = tree[0], tree[1:]
    if head in ("matmul", "transpose"):
        return 2
    if head == "conv2d":
        return 4
    if head == "concat":
        axis, given, operands = concat_args(rest)
        if given is not None:
            return given
        a = _rank_of(operands[0], rank)
        return a if a is not None else _rank_of(operands[1], rank)
    if head in ("split_0", "split_1"):
        return _rank_of(tree[1][2], rank)
    if head in ("smul", "relu", "tanh", "sigmoid"):
        return _rank_of(rest[0], rank)
    a, b = _rank_of(rest[0], rank), _rank_of(rest[1], rank)     # ewadd, ewmul
    return a if a is not None else b


# ---- a float counterexample ----

POOL = (0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 3.0e38, -3.0e38, 1.0e30, -1.0e30, 2.0e19, -2.0e19, 1.0e-30, 1.0e-45,
        np.inf, -np.inf, np.nan)


def float_counterexample(pairs, shape_draws: list[dict], tries: int = 3000, seed: int = 0) -> str:
    """float32 inputs on which the sides differ under the strict contract (NaN and inf where the left
    side's are, finite values within float32's tolerance), shrunk toward 0, 1 and -1; "" if none found."""
    rng = np.random.default_rng(seed)

    def differs(env):
        with np.errstate(all="ignore"):
            for lhs, rhs in pairs:
                want, got = evaluate(lhs, env, Floats), evaluate(rhs, env, Floats)
                problem = compare_outputs([want], [got])
                if problem:
                    return problem, want, got
        return None

    for k in range(tries):
        s = shape_draws[-1 - k % len(shape_draws)]        # the smallest shapes most
        env = {}
        for name, shape in s.items():
            values = rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3, shape)
            pick = rng.random(shape) < (0.5 if k % 2 else 0.1)
            values[pick] = rng.choice(np.array(POOL), size=int(pick.sum()))
            env[name] = np.asarray(values, np.float32)
        if differs(env):
            return _shrunk(env, differs)
    return ""


def _shrunk(env: dict, differs) -> str:
    for name in sorted(env):
        for idx in np.ndindex(env[name].shape):
            for simple in (0.0, 1.0, -1.0, 2.0):
                old = env[name][idx]
                if old == simple and math.copysign(1, old) == 1:
                    break
                env[name][idx] = simple
                if differs(env):
                    break
                env[name][idx] = old
    problem, want, got = differs(env)
    shapes = ", ".join(f"?{n} {tuple(v.shape)}" for n, v in sorted(env.items()))
    inputs = ", ".join(f"?{n}={_short(v)}" for n, v in sorted(env.items()))
    return f"{problem}; at shapes {shapes}: {inputs}; left {_short(want)}, right {_short(got)}"


def _short(v, width: int = 160) -> str:
    text = np.array2string(np.asarray(v), separator=", ", threshold=12, edgeitems=2).replace("\n", "")
    return " ".join(text.split()) if len(text) <= width else " ".join(text.split())[:width] + " ..."
