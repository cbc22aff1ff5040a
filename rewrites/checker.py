"""Soundness checker: for a rule, draw bindings with Hypothesis, evaluate both sides with the numpy
reference evaluator, and compare.

Bindings are generated top-down from the left-hand side: each sub-pattern is given the type its parent
needs (a matmul picks a contracting size, a transpose a permutation, a broadcast its dimensions), so
shapes are consistent by construction and shared variables stay consistent. Bindings that break a
predicate, or a left-hand side that is still ill typed, are rejected; a right-hand side that is ill typed
or differs is unsound.

Values, by the rule's `numerics` (rewrites/rule.py):
- "exact" and "rounding" rules see, in tensors and in literal constants alike, ordinary values and the
  values that break rules: NaN, +-inf, -0, subnormals, the dtype's largest finite value, values near
  half of it and near its square root (`_extremes`). Both sides are evaluated in the declared dtypes.
  "exact" sides must be equal, NaN where NaN, zeros of the same sign. "rounding" sides must be finite,
  NaN and +-inf (with the sign) at the same elements, and equal within the dtype's rounding tolerance
  or as close to the float64 value as the original; the one allowed difference is a result within
  rounding tolerance of the dtype's largest finite value that rounds to inf of the same sign on one
  side only (`_range_edge`).
- "order" rules (the same products summed in another order) see the same values as "rounding" rules but
  the magnitudes near the range's top: finite magnitudes stop at the square root of the largest value
  over 64, so that no partial sum of the checker's few products can overflow in either order, the one
  difference their label allows. NaN, +-inf, -0 and subnormals, which every order propagates alike,
  stay; the sides are compared as "rounding" sides are.
- "reals" rules (legal only under numerics="fast") see moderate finite values, since they may differ
  where an intermediate overflows; they must still be equal over the reals, up to rounding.
Literal constants are drawn as the e-graph holds them: values of the rule's dtype (what capture
produces), or normal numbers of it (what constant folding produces, `fold_in_range`).
"""
from __future__ import annotations

import functools
import math
from contextlib import contextmanager
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, Phase, assume, given, settings, strategies as st
from hypothesis.internal.conjecture import providers as _providers

from superopt.core.dtypes import exp_moderate_bound, is_float, smallest_normal
from superopt.core.formats import FORMATS, LayoutError, packed_shape
from superopt.core.ops import SCANS, flagged, knowing
from superopt.core.reference import evaluate_node
from superopt.core.verify import TOLERANCES, as_accurate, int_extremes, integer_edges as _verification_edges, mismatch
from superopt.egraph.encode import decode
from superopt.rewrites.functions import ATTRIBUTES, CONV_TABLE, FLOAT_DTYPES, PREDICATES, moderate_elements
from superopt.rewrites.infer import IllTyped, infer
from superopt.rewrites.pattern import (
    CONSTRUCTORS,
    DTYPE,
    FLOAT,
    INT,
    LIST,
    SCALAR,
    SCALAR_AS_TENSOR,
    TENSOR,
    App,
    Const,
    Var,
    variables,
)

DTYPES = ("float32", "float16", "bfloat16")
# Integer dtypes a rule guarded by an analysis fact is also checked in (where its ops take integers), and in
# which every derivation of the facts is checked (`check_facts`): integer arithmetic wraps, as XLA's does.
FACT_DTYPES = ("int8", "int16", "int32", "uint8", "uint16", "uint32")
# The dtypes every derivation is checked in once per process (about 12 s each: most of it saturating the
# analysis over `_fact_terms`): the analysis tells integer dtypes apart by signedness alone, and the width
# moves only where a value wraps, which `integer_edges` draws in each.
FACT_CHECK_DTYPES = ("int8", "uint8", "int32")
INTEGER_OPS = frozenset({"neg", "abs", "sign", "add", "sub", "mul", "max", "min", "gt", "eq"})
DRAWN_ELEMENTS = 128   # larger arrays are mostly ordinary values, with 16 extremes (`_large_arrays`)
# Targets of a cast in a rule's left-hand side are drawn from these, independently of the operands'
# dtype, so a cast rule is checked on real conversions (narrowing, widening, float <-> int).
CAST_DTYPES = DTYPES + ("int8", "int32")
UNARY = ("neg", "abs", "exp", "log", "tanh", "logistic", "sqrt", "rsqrt", "sin", "floor", "sign", "square",
         "erf", "is_finite")
BINARY = ("add", "sub", "mul", "div", "max", "min", "pow", "gt", "eq")
REDUCE = ("reduce_sum", "reduce_max", "reduce_min")
SCAN = tuple(sorted(SCANS))
BOOL_RESULT = flagged("bool_result")
FLOATS = (0.0, 1.0, -1.0, 2.0, 0.5, -3.25, 1e-3, 100.0)
DIMS = (1, 2, 3)
_LEAVES = ("arg", "const")


WINDOWS = ("reduce_window_max", "reduce_window_min", "reduce_window_sum")


class Reject(Exception):
    """These bindings do not satisfy the rule's left-hand side or predicates."""


@dataclass
class Counterexample:
    bindings: dict
    problem: str

    def __str__(self):
        lines = [f"  {k} = {_describe(v)}" for k, v in self.bindings.items()]
        return "\n".join([f"  problem: {self.problem}", *lines])


@dataclass
class CheckResult:
    rule: str
    cases: int = 0          # bindings that satisfied the left-hand side and were compared
    rejected: int = 0
    counterexample: Counterexample | None = None
    notes: list = field(default_factory=list)
    dtypes: set = field(default_factory=set)   # the dtypes of the bindings compared

    @property
    def sound(self) -> bool:
        return self.counterexample is None and self.cases > 0


def _describe(v) -> str:
    if isinstance(v, np.ndarray):
        flat = ", ".join(f"{x:.4g}" if v.dtype.kind == "f" or str(v.dtype) == "bfloat16" else str(x)
                         for x in v.reshape(-1)[:8].tolist())
        more = ", ..." if v.size > 8 else ""
        return f"{v.dtype}{list(v.shape)} [{flat}{more}]"
    return repr(v)


# ---- evaluation ----

def evaluate(p, env: dict):
    """Value of a pattern under bindings (tensor leaves keyed by Var, or by ("arg", i) / ("const", i))."""
    if isinstance(p, Var):
        return env[p]
    if isinstance(p, Const):
        return "float64" if _REFERENCE and p.value in FLOAT_DTYPES else p.value
    if p.fn in ATTRIBUTES:
        return ATTRIBUTES[p.fn].py(*(evaluate(a, env) for a in p.args))
    if p.fn in _LEAVES:
        return env[(p.fn, evaluate(p.args[0], env))]
    if p.fn == "tnil":
        return []
    if p.fn == "tcons":
        return [evaluate(p.args[0], env)] + evaluate(p.args[1], env)
    if p.fn == "kernel" or CONSTRUCTORS[p.fn][1] == SCALAR:
        return _evaluate_scalar(p, [evaluate(a, env) for a in p.args])
    sorts = CONSTRUCTORS[p.fn][0]
    values = [evaluate(a, env) for a in p.args]
    prims = tuple(v for v, s in zip(values, sorts) if s not in (TENSOR, LIST))
    tensors = []
    for v, s in zip(values, sorts):
        if s == TENSOR:
            tensors.append(v)
        elif s == LIST:
            tensors.extend(v)
    typed = (CONV_TABLE.conv_params[prims[0]],) if p.fn == "conv" else prims
    shape, dtype = infer(p.fn, typed, [(tuple(np.shape(t)), str(np.asarray(t).dtype)) for t in tensors])
    if p.fn == "lit":
        with np.errstate(over="ignore"):   # a literal past the dtype's range is its inf, as XLA holds it
            return np.asarray(prims[0], dtype=np.dtype(dtype))
    op, attrs = decode(p.fn, prims, (), CONV_TABLE)
    if _REFERENCE and op == "reduce_sum" and np.dtype(dtype) == np.float64:
        return _fsum(tensors[0], tuple(attrs[0]) if attrs else ())
    return evaluate_node(op, attrs, tensors, shape, np.dtype(dtype))


# Set while `_precise` computes a float64 reference value: every float dtype, bound or written in the
# pattern (`matmul(x, y, "float32")`), is float64, and sums are exact.
_REFERENCE = False


def _fsum(x, axes: tuple) -> np.ndarray:
    """A float64 sum over `axes`, correctly rounded (math.fsum): a reference whose terms cancel is exact,
    not the float64 rounding of one order of adding them."""
    x = np.asarray(x, np.float64)
    kept = [a for a in range(x.ndim) if a not in axes]
    moved = np.transpose(x, kept + list(axes)).reshape([x.shape[a] for a in kept] + [-1])
    out = np.empty(moved.shape[:-1])
    for idx in np.ndindex(out.shape):
        out[idx] = math.fsum(moved[idx])
    return out


# Kernel bodies evaluate like tensors: a Scalar's value is the array it stands for on chip, and each
# Scalar constructor is the tensor constructor it applies (pattern.SCALAR_AS_TENSOR).


def _broadcast_to(x, shape) -> np.ndarray:
    x, shape = np.asarray(x), tuple(shape)
    if not (x.ndim == 0 or (x.ndim == len(shape) and all(a in (1, b) for a, b in zip(x.shape, shape)))):
        raise IllTyped(f"{x.shape} does not broadcast to {shape}")
    return np.array(np.broadcast_to(x, shape))


def _evaluate_scalar(p, values):
    fn = p.fn
    if fn == "kernel":
        return np.asarray(values[0])
    if fn in ("sarg", "sbcast"):
        return _broadcast_to(values[0], values[1])
    if fn == "srow":
        x = np.asarray(values[1])
        if x.ndim == 0:
            raise IllTyped("a row reduction of a rank-0 value")
        out = evaluate_node(values[0], ((x.ndim - 1,),), [x], x.shape[:-1], x.dtype)
        return out.reshape(x.shape[:-1] + (1,))
    ctor = SCALAR_AS_TENSOR[fn]
    prims = tuple(v for v, sort in zip(values, CONSTRUCTORS[fn][0]) if sort not in (TENSOR, SCALAR))
    tensors = [v for v, sort in zip(values, CONSTRUCTORS[fn][0]) if sort in (TENSOR, SCALAR)]
    if fn == "sbinary" and np.shape(tensors[0]) != np.shape(tensors[1]):
        raise IllTyped("operands of a body op have different shapes")
    typed = (CONV_TABLE.conv_params[prims[0]],) if ctor == "conv" else prims
    shape, dtype = infer(ctor, typed, [(tuple(np.shape(t)), str(np.asarray(t).dtype)) for t in tensors])
    op, attrs = decode(ctor, prims, (), CONV_TABLE)
    return evaluate_node(op, attrs, tensors, shape, np.dtype(dtype))


# ---- binding generation ----

class _Generator:
    def __init__(self, rule, draw):
        self.rule, self.draw = rule, draw
        self.dtype = draw(st.sampled_from(DTYPES + (FACT_DTYPES if _integer_checkable(rule) else ())))
        self.env: dict = {}
        self.types: dict = {}     # tensor leaf key -> (shape, dtype)
        self.hints: dict = {}     # tensor leaf key -> rank
        self.dtype_hints: dict = {}
        self.row_vectors: set = set()  # leaves that broadcast as one row ([1, N]) where a matrix is wanted
        self.column_vectors: set = set()  # ... as one column ([N, 1])
        self.facts: dict = {}          # leaf -> the analysis facts it is drawn to meet (`_meeting`)
        ints = []
        cast_targets = {t for lhs, _ in rule.pairs for t in _cast_targets(lhs)}
        for lhs, _ in rule.pairs:
            for v in variables(lhs):
                if v.sort == DTYPE and v not in self.env:
                    self.env[v] = draw(st.sampled_from(CAST_DTYPES)) if v in cast_targets else self.dtype
                elif v.sort == FLOAT:
                    self.env[v] = draw(_literals(self.dtype, rule.numerics))
                elif v.sort == INT and v not in ints:
                    ints.append(v)
        # Integer variables are leaf ids; drawn distinct and increasing, so `less` chains hold.
        for v, n in zip(ints, sorted(draw(st.sets(st.integers(0, 7), min_size=len(ints), max_size=len(ints))))):
            self.env[v] = n
        for name, args in rule.conditions:
            if name in ("scalar", "rank") and _is_leaf(args[0]):
                self.hints[self.key(args[0])] = 0 if name == "scalar" else args[1].value
            if name == "has_dtype" and _is_leaf(args[0]) and isinstance(args[1], Const):
                self.dtype_hints[self.key(args[0])] = args[1].value
            if name == "row_vector" and _is_leaf(args[0]):
                self.row_vectors.add(self.key(args[0]))
            if name == "column_vector" and _is_leaf(args[0]):
                self.column_vectors.add(self.key(args[0]))
            if name in LEAF_FACTS and _is_leaf(args[0]):
                self.facts.setdefault(self.key(args[0]), set()).add(name)
        self.diagonals = {tuple(args[:3]) for name, args in rule.conditions if name == "main_diagonal"}
        # axis-list variable -> the tensor whose last axis alone it must name (predicate last_axis)
        self.last_axes = {args[0]: args[1] for name, args in rule.conditions if name == "last_axis" and isinstance(args[0], Var)}

    def key(self, p):
        return p if isinstance(p, Var) else (p.fn, evaluate(p.args[0], self.env))

    def shape(self, rank: int | None = None, lo: int = 0) -> tuple:
        r = self.draw(st.integers(lo, 3)) if rank is None else rank
        return tuple(self.draw(st.sampled_from(DIMS)) for _ in range(r))

    def op(self, v, choices):
        if isinstance(v, Const):
            return v.value
        if v not in self.env:
            self.env[v] = self.draw(st.sampled_from(choices))
        return self.env[v]

    def bound(self, v, make):
        """A constant's value, or the value drawn (by `make`, once) for a variable."""
        if isinstance(v, Const):
            return v.value
        if v not in self.env:
            self.env[v] = make()
        return self.env[v]

    def vec(self, v, make):
        return self.bound(v, lambda: tuple(make()))

    def scalarish(self, p) -> bool:
        if isinstance(p, App) and p.fn == "lit":
            return True
        if isinstance(p, Var) or (isinstance(p, App) and p.fn in _LEAVES):
            k = self.key(p)
            return (k in self.types and self.types[k][0] == ()) or self.hints.get(k) == 0
        return False

    def leaf(self, p, want):
        k = self.key(p)
        if k in self.types:
            if want is not None and self.types[k] != want:
                raise Reject(f"{p!r} needed as {want} and {self.types[k]}")
            return self.types[k]
        rank = self.hints.get(k)
        t = want or (self.shape(rank), self.dtype)
        t = (t[0], self.dtype_hints.get(k, t[1]))
        if k in self.row_vectors and len(t[0]) == 2:
            t = ((1, t[0][1]), t[1])
        if k in self.column_vectors and len(t[0]) == 2:
            t = ((t[0][0], 1), t[1])
        if rank is not None and len(t[0]) != rank:
            raise Reject(f"{p!r} must have rank {rank}")
        self.types[k] = t
        return t

    def gen(self, p, want=None):
        """Give sub-pattern `p` the type `want` (or any type); returns the type it got."""
        if isinstance(p, Var) or p.fn in _LEAVES:
            return self.leaf(p, want)
        shape = want[0] if want else None
        a = p.args
        if p.fn in _SCALAR_GEN:
            return _SCALAR_GEN[p.fn](self, p.args, shape)
        if p.fn in _LAYOUT_GEN:
            return _LAYOUT_GEN[p.fn](self, p.args, want)
        if p.fn == "lit":
            if shape not in (None, ()):
                raise Reject("a literal is rank 0")
            return (), evaluate(a[1], self.env)
        if p.fn in ("unary", "integer_pow"):
            op = self.op(a[0], UNARY) if p.fn == "unary" else "integer_pow"
            operand = a[1] if p.fn == "unary" else a[0]
            if shape is None:
                shape = () if self.scalarish(operand) else self.shape()
            t = self.gen(operand, (shape, self.dtype))
            return t[0], ("bool" if op in BOOL_RESULT else self.dtype)
        if p.fn == "binary":
            op = self.op(a[0], BINARY)
            if shape is None:
                shape = () if all(self.scalarish(o) for o in a[1:]) else self.shape(_fixed_rank(p))
            for operand in a[1:]:
                self.gen(operand, ((), self.dtype) if self.scalarish(operand) else (shape, self.dtype))
            return shape, ("bool" if op in BOOL_RESULT else self.dtype)
        if p.fn == "select":
            shape = shape if shape is not None else self.shape()
            self.gen(a[0], (() if self.scalarish(a[0]) else shape, "bool"))
            self.gen(a[1], (shape, self.dtype))
            self.gen(a[2], (shape, self.dtype))
            return shape, self.dtype
        if p.fn == "matmul":
            lhs_t = self.types.get(self.key(a[0])) if _is_leaf(a[0]) else None
            rhs_t = self.types.get(self.key(a[1])) if _is_leaf(a[1]) else None
            if shape is None and lhs_t is not None and len(lhs_t[0]) >= 2:
                n = rhs_t[0][-1] if rhs_t is not None else self.draw(st.sampled_from(DIMS))
                shape = lhs_t[0][:-1] + (n,)
            shape = shape if shape is not None else self.shape(lo=2)
            if len(shape) < 2:
                raise Reject("a matmul result has rank >= 2")
            k = lhs_t[0][-1] if lhs_t is not None else rhs_t[0][-2] if rhs_t is not None and len(rhs_t[0]) >= 2 \
                else self.draw(st.sampled_from(DIMS))
            rhs_hint = self.hints.get(self.key(a[1])) if _is_leaf(a[1]) else None
            rhs_rank2 = len(shape) == 2 or rhs_hint == 2 or (rhs_t is not None and len(rhs_t[0]) == 2) \
                or (rhs_t is None and rhs_hint is None and self.draw(st.booleans()))
            self.gen(a[0], (shape[:-1] + (k,), self.dtype))
            self.gen(a[1], (((k, shape[-1]) if rhs_rank2 else shape[:-2] + (k, shape[-1])), self.dtype))
            return shape, evaluate(a[2], self.env)
        if p.fn == "transpose":
            shape = shape if shape is not None else self.shape()
            perm = self.vec(a[1], lambda: self.draw(st.permutations(range(len(shape)))))
            if sorted(perm) != list(range(len(shape))):
                raise Reject("permutation rank")
            inner = [0] * len(shape)
            for i, src in enumerate(perm):
                inner[src] = shape[i]
            self.gen(a[0], (tuple(inner), self.dtype))
            return shape, self.dtype
        if p.fn == "reshape":
            if shape is None and isinstance(a[1], Var) and a[1] not in self.env and self.draw(st.booleans()):
                # the operand first, the target one of its reshapes (a flattening, say)
                inner, dt = self.gen(a[0], None)
                n = math.prod(inner)
                target = self.draw(st.sampled_from([(n,), inner, (1,) + inner]))
                self.env[a[1]] = target
                return target, dt
            shape = tuple(self.vec(a[1], lambda: shape if shape is not None else self.shape()))
            n = math.prod(shape)
            choices = [shape, (n,), (1,) + shape, tuple(d for d in shape if d != 1)]
            self.gen(a[0], (self.draw(st.sampled_from(choices)), self.dtype))
            return shape, self.dtype
        if p.fn == "broadcast":
            shape = tuple(self.vec(a[1], lambda: shape if shape is not None else self.shape()))
            dims = self.vec(a[2], lambda: sorted(self.draw(st.sets(st.integers(0, len(shape) - 1)))) if shape else ())
            if any(k >= len(shape) for k in dims):
                raise Reject("a broadcast's dimensions past its shape's rank")
            inner = tuple(shape[k] if self.draw(st.booleans()) else 1 for k in dims)
            self.gen(a[0], (inner, self.dtype))
            return shape, self.dtype
        if p.fn == "scan":
            self.op(a[0], SCAN)
            shape = shape if shape is not None else self.shape(lo=1)
            if not shape:
                raise Reject("a scan needs an axis")
            self.bound(a[2], lambda: self.draw(st.integers(0, len(shape) - 1)))
            self.bound(a[3], lambda: self.draw(st.integers(0, 1)))
            self.gen(a[1], (shape, self.dtype))
            return shape, self.dtype
        if p.fn == "reduce":
            self.op(a[0], REDUCE)
            shape = shape if shape is not None else self.shape()
            # over the operand's last axis alone, where the rule says so: the other axis lists are rejected
            last = a[2] not in self.env and self.last_axes.get(a[2]) == a[1]
            rank = len(shape) + (1 if last else self.draw(st.integers(0, 2)))
            extra = rank - len(shape)
            axes = self.vec(a[2], lambda: [rank - 1] if last else sorted(
                self.draw(st.sets(st.integers(0, rank - 1), min_size=extra, max_size=extra))) if rank else ())
            it = iter(shape)
            inner = tuple(self.draw(st.sampled_from(DIMS)) if i in axes else next(it, 1) for i in range(len(axes) + len(shape)))
            self.gen(a[1], (inner, self.dtype))
            return shape, self.dtype
        if p.fn == "concat":
            items = _list_items(a[0])
            shape = shape if shape is not None else self.shape(lo=1)
            dim = evaluate(a[1], self.env)
            if not 0 <= dim < len(shape) or shape[dim] < len(items):
                raise Reject("concat")
            cuts = sorted(self.draw(st.sets(st.integers(1, shape[dim] - 1), min_size=len(items) - 1,
                                            max_size=len(items) - 1))) if len(items) > 1 else []
            for item, lo, hi in zip(items, [0] + cuts, cuts + [shape[dim]]):
                self.gen(item, (shape[:dim] + (hi - lo,) + shape[dim + 1:], self.dtype))
            return shape, self.dtype
        if p.fn == "pool":
            self.op(a[0], WINDOWS)
            shape = shape if shape is not None else self.shape(lo=1)
            window = self.vec(a[2], lambda: [self.draw(st.sampled_from((1, 2))) for _ in shape])
            strides = self.vec(a[3], lambda: [self.draw(st.sampled_from((1, 2))) for _ in shape])
            pads = [self.vec(v, lambda: [0] * len(shape)) if not isinstance(v, App) else [0] * len(shape)
                    for v in a[4:6]]
            if not len(window) == len(strides) == len(shape):
                raise Reject("pool attribute ranks")
            inner = tuple((o - 1) * t + w - lo - hi for o, w, t, lo, hi in zip(shape, window, strides, *pads))
            if min(inner, default=1) < 1:
                raise Reject("pool input")
            self.gen(a[1], (inner, self.dtype))
            return shape, self.dtype
        if p.fn == "conv":
            shape = shape if shape is not None else self.shape(4, lo=4)
            if len(shape) != 4:
                raise Reject("the checker's convolutions are NHWC")
            if isinstance(a[2], Var):
                self.env[a[2]] = 0  # the one configuration in CONV_TABLE
            kh, kw, c = (self.draw(st.sampled_from(DIMS)) for _ in range(3))
            n, h, w, o = shape
            self.gen(a[0], ((n, h + kh - 1, w + kw - 1, c), self.dtype))
            self.gen(a[1], ((kh, kw, c, o), self.dtype))
            return shape, self.dtype
        if p.fn == "convert":
            shape = shape if shape is not None else self.shape()
            inner = a[0]
            source = self.dtype_hints.get(self.key(inner)) if _is_leaf(inner) else None
            if isinstance(inner, App) and inner.fn == "convert":
                source = None  # a chain of casts: the innermost operand decides
            self.gen(inner, (shape, source or self.dtype))
            return shape, evaluate(a[1], self.env)
        if p.fn == "slice":
            xs, xd = self.gen(a[0], None)
            stubs = self.stubs()
            bounds = []
            for k, v in enumerate(a[1:4]):
                if isinstance(v, Var) and v not in self.env:
                    bounds.append(None)
                    continue
                try:
                    bounds.append(tuple(evaluate(v, stubs)))
                except (KeyError, IllTyped) as exc:
                    raise Reject(f"slice bound: {exc}") from exc
            if bounds == [None, None, None] and tuple(a[1:4]) in self.diagonals:
                # a main-diagonal slice (predicate main_diagonal): of a flattened square matrix
                n = math.isqrt(xs[0]) if len(xs) == 1 else 0
                if n * n != (xs[0] if len(xs) == 1 else -1) or n == 0:
                    raise Reject("a main diagonal is taken of a flattened square matrix")
                bounds = [(0,), (n * n,), (n + 1,)]
                for v, b in zip(a[1:4], bounds):
                    self.env[v] = b
            start = bounds[0] or self.vec(a[1], lambda: [self.draw(st.integers(0, n - 1)) if n else 0 for n in xs])
            limit = bounds[1] or self.vec(a[2], lambda: [self.draw(st.integers(b + 1, n)) if n else 0
                                                         for b, n in zip(start, xs)])
            strides = bounds[2] or self.vec(a[3], lambda: [self.draw(st.sampled_from((1, 2))) for _ in xs])
            try:
                out = infer("slice", (start, limit, strides), [(xs, xd)])
            except IllTyped as exc:
                raise Reject(str(exc)) from exc
            if want is not None and out[0] != want[0]:
                raise Reject("slice result shape")
            return out
        if p.fn == "iota":
            shape = tuple(self.vec(a[1], lambda: shape if shape is not None else self.shape(lo=1)))
            if not 0 <= evaluate(a[0], self.env) < len(shape):
                raise Reject("iota dimension")
            return shape, evaluate(a[2], self.env)
        raise Reject(f"the checker cannot generate bindings for {p.fn!r} yet")

    def stubs(self) -> dict:
        """Bindings with zero arrays for the tensors typed so far: enough for shape-only attributes."""
        env = dict(self.env)
        env.update({k: np.zeros(shape, dtype=np.dtype(dtype)) for k, (shape, dtype) in self.types.items()})
        return env

    def values(self, numerics: str) -> None:
        for k, (shape, dtype) in sorted(self.types.items(), key=lambda kv: str(kv[0])):
            drawn = _arrays if math.prod(shape) <= DRAWN_ELEMENTS else _large_arrays
            self.env[k] = self.draw(drawn(shape, dtype, numerics))
            if k in self.facts:
                self.env[k] = _meeting(self.env[k], self.facts[k])


LEAF_FACTS = ("nonneg", "integral", "finite", "positive", "at_most_one", "moderate", "exp_moderate")


def integer_edges(dtype: str) -> list[int]:
    """An integer dtype's extremes, sorted (`core/verify.py`'s `integer_edges`, which verification draws)."""
    return sorted(set(_verification_edges(dtype)))


def integer_elements(dtype: str):
    """Elements of an integer dtype, half of them its extremes (`integer_edges`)."""
    info = np.iinfo(np.dtype(dtype))
    return st.one_of(st.sampled_from(integer_edges(dtype)), st.integers(int(info.min), int(info.max)))


def _integer_checkable(rule) -> bool:
    """Whether `rule` reads an analysis fact and every op it names takes integers (`INTEGER_OPS`)."""
    if not any(name in LEAF_FACTS for name, _ in rule.conditions):
        return False
    stack = [p for pair in rule.pairs for p in pair]
    while stack:
        p = stack.pop()
        if isinstance(p, App):
            if p.fn not in ("binary", "unary", "lit", "arg", "const", "broadcast", "reshape") \
                    or (p.fn in ("binary", "unary") and not (isinstance(p.args[0], Const)
                                                             and p.args[0].value in INTEGER_OPS)):
                return False
            stack.extend(p.args[1:] if p.fn in ("binary", "unary") else p.args)
    return True


def _meeting(values: np.ndarray, facts: set) -> np.ndarray:
    """`values` moved into the analysis facts (rewrites/functions.py) a rule's leaf must meet, keeping every
    value that meets them already: negative values take their magnitude where nonneg (-0 stays: it is >= -0);
    on floats, values are truncated where integral (-0.5 -> -0; NaN and +-inf stay), NaN and inf become 1
    where finite, values below the smallest normal number become their magnitude plus it where positive,
    values above 1 become 1 - v where at most one."""
    if not is_float(values.dtype) and values.dtype != np.bool_:
        return _meeting_integers(values, facts)
    if "nonneg" in facts:
        values = np.where(values == 0, values, np.abs(values))
    if not is_float(values.dtype) or not facts - {"nonneg"}:
        return values
    v, tiny = values.astype(np.float64), smallest_normal(values.dtype)
    if "integral" in facts:
        v = np.trunc(v)
    if "finite" in facts:
        v = np.where(np.isfinite(v), v, 1.0)
    if "positive" in facts:
        v = np.where(v < tiny, np.abs(v) + tiny, v)
    if "at_most_one" in facts:
        v = np.where(v > 1, 1 - v, v)
    if {"positive", "at_most_one"} <= facts:   # both: what left [tiny, 1] takes 0.5 (NaN stays)
        v = np.where((v < tiny) | (v > 1), 0.5, v)
    if "moderate" in facts:   # outside the range, or not finite: 1.5, with the value's sign where it has one
        v = np.where(moderate_elements(v.astype(values.dtype)), v, np.where(v < 0, -1.5, 1.5))
    if "exp_moderate" in facts:   # clipped into the range; NaN takes 1
        bound = exp_moderate_bound(values.dtype)
        v = np.where(np.isnan(v), 1.0, np.clip(v, -bound, bound))
    out = v.astype(values.dtype)
    if "finite" in facts:   # a value that rounds to inf in the dtype (float16 past 65504)
        out = np.where(np.isfinite(out.astype(np.float64)), out, np.asarray(1.0, values.dtype))
    return out


def _meeting_integers(values: np.ndarray, facts: set) -> np.ndarray:
    """`_meeting` for an integer dtype, in which every value is finite and integral: a value outside the
    facts' range (at least 0 where nonneg, 1 where positive; at most 1 where at most one) becomes its
    magnitude taken into that range (abs of the dtype's smallest value would be that value)."""
    info, v = np.iinfo(values.dtype), values.astype(np.int64)
    lo = 1 if "positive" in facts else 0 if "nonneg" in facts else int(info.min)
    hi = 1 if "at_most_one" in facts else int(info.max)
    inside = (v >= lo) & (v <= hi)
    return np.where(inside, v, lo + np.abs(v) % (hi - lo + 1)).astype(values.dtype)


def _inner_of(gen: _Generator, shape: tuple) -> tuple:
    """A shape that broadcasts to `shape`: rank 0, or some axes reduced to 1."""
    if gen.draw(st.integers(0, 4)) == 0:
        return ()
    return tuple(n if gen.draw(st.booleans()) else 1 for n in shape)


def _gen_load(gen: _Generator, a, shape):
    shape = tuple(gen.vec(a[1], lambda: shape if shape is not None else gen.shape()))
    inner = _inner_of(gen, shape) if gen.draw(st.booleans()) else shape
    return shape, gen.gen(a[0], (inner, gen.dtype))[1]


def _gen_same(gen: _Generator, operands, shape, dtype=None):
    shape = shape if shape is not None else gen.shape()
    for o in operands:
        gen.gen(o, (shape, gen.dtype))
    return shape, dtype or gen.dtype


def _gen_row(gen: _Generator, a, shape):
    gen.op(a[0], REDUCE)
    shape = shape if shape is not None else gen.shape(lo=1)
    if not shape or shape[-1] != 1:
        raise Reject("a row reduction keeps its last axis with size 1")
    gen.gen(a[1], (shape[:-1] + (gen.draw(st.sampled_from(DIMS)),), gen.dtype))
    return shape, gen.dtype


def _gen_unary(gen: _Generator, a, shape):
    op = gen.op(a[0], UNARY)
    shape, _ = _gen_same(gen, [a[1]], shape)
    return shape, ("bool" if op == "is_finite" else gen.dtype)


def _gen_binary(gen: _Generator, a, shape):
    op = gen.op(a[0], BINARY)
    shape, _ = _gen_same(gen, a[1:], shape)
    return shape, ("bool" if op in ("gt", "eq") else gen.dtype)


def _gen_select(gen: _Generator, a, shape):
    shape = shape if shape is not None else gen.shape()
    gen.gen(a[0], (shape, "bool"))
    return _gen_same(gen, a[1:], shape)


def _gen_bcast(gen: _Generator, a, shape):
    shape = tuple(gen.vec(a[1], lambda: shape if shape is not None else gen.shape()))
    gen.gen(a[0], (_inner_of(gen, shape), gen.dtype))
    return shape, gen.dtype


def _gen_via(ctor: str, order):
    """Generate a Scalar constructor as the tensor constructor it mirrors (arguments reordered)."""
    def gen_fn(gen: _Generator, a, shape):
        return gen.gen(App(ctor, tuple(a[i] for i in order)), (shape, gen.dtype) if shape is not None else None)
    return gen_fn


_SCALAR_GEN = {
    "kernel": lambda gen, a, shape: gen.gen(a[0], (shape, gen.dtype) if shape is not None else None),
    "sarg": _gen_load, "sbcast": _gen_bcast, "srow": _gen_row, "sunary": _gen_unary, "sbinary": _gen_binary,
    "sselect": _gen_select,
    "sconvert": _gen_via("convert", (0, 1)), "spow": _gen_via("integer_pow", (0, 1)),
    "sperm": _gen_via("transpose", (0, 1)), "smm": _gen_via("matmul", (0, 1, 2)), "sconv": _gen_via("conv", (0, 1, 2)),
    "schain": _gen_via("matmul", (0, 1, 2)), "sconvchain": _gen_via("conv", (0, 1, 2)),
}


# ---- packed layouts (superopt/core/formats.py) ----

def _block_dims(block: int) -> tuple:
    """Sizes drawn for an axis split into blocks: ragged (padded) ones and whole multiples of the block."""
    return DIMS if block == 1 else (1, block - 1, block, block + 1, 2 * block)


def _layout_shape(gen: _Generator, fmt: str) -> tuple:
    """A logical shape format `fmt` packs: a batch axis or none, then its blocked axes."""
    f = FORMATS[fmt]
    if not f.blocks:
        return gen.shape()
    lead = () if f.rank is not None else tuple(gen.draw(st.sampled_from(DIMS)) for _ in
                                               range(gen.draw(st.integers(0, 1))))
    return lead + tuple(gen.draw(st.sampled_from(_block_dims(b))) for b in f.blocks)


def _logical_for(gen: _Generator, fmt: str, packed: tuple) -> tuple:
    """A logical shape that packs to `packed` in `fmt` (each padded axis loses 0 to block - 1 elements)."""
    f = FORMATS[fmt]
    rank = len(packed) - sum(b > 1 for b in f.blocks)
    if not f.fits(rank):
        raise Reject(f"{fmt} packs no rank-{rank} shape into {packed}")
    split = [0] * len(packed)
    for axis, src in enumerate(f.full_perm(rank)):
        split[src] = packed[axis]
    dims, i = list(split[:f.batch(rank)]), f.batch(rank)
    for b in f.blocks:
        if b == 1:
            dims.append(split[i])
            i += 1
            continue
        outer, inner = split[i], split[i + 1]
        if inner != b or outer < 1:
            raise Reject(f"{packed} is not a {fmt} array")
        dims.append(outer * b - gen.draw(st.sampled_from((0, 0, b - 1, b // 2))))
        i += 2
    return tuple(dims)


def _gen_pack(gen: _Generator, a, want):
    x, f = a
    if want is None:
        fmt = gen.op(f, tuple(FORMATS))
        known = gen.types.get(gen.key(x)) if _is_leaf(x) else None
        logical = known[0] if known else _layout_shape(gen, fmt)
    else:
        fmt = gen.op(f, tuple(FORMATS))
        logical = _logical_for(gen, fmt, want[0])
    t = gen.gen(x, (logical, want[1] if want else gen.dtype))
    try:
        return packed_shape(fmt, t[0]), t[1]
    except LayoutError as exc:
        raise Reject(str(exc)) from exc


def _gen_unpack(gen: _Generator, a, want):
    y, f, s = a
    fmt = gen.op(f, tuple(n for n, fm in FORMATS.items() if want is None or fm.fits(len(want[0]))))
    shape = tuple(gen.vec(s, lambda: want[0] if want else _layout_shape(gen, fmt)))
    if (want and shape != tuple(want[0])) or not FORMATS[fmt].fits(len(shape)):
        raise Reject(f"unpack {fmt} to {shape}")
    dtype = want[1] if want else gen.dtype
    if isinstance(y, App) and y.fn == "pack" and gen.op(y.args[1], (fmt,)) == fmt:
        return shape, gen.gen(y.args[0], (shape, dtype))[1]   # a round trip: the packed tensor holds `shape`
    return shape, gen.gen(y, (packed_shape(fmt, shape), dtype))[1]


def _gen_fractal_matmul(gen: _Generator, a, want):
    x, y, d = a
    if want is not None:
        out = tuple(want[0])
        if len(out) < 4 or out[-2:] != (16, 16):
            raise Reject("a fractal_matmul result is [..., N1, M1, 16, 16]")
        batch, n1, m1 = out[:-4], out[-4], out[-3]
    else:
        batch = tuple(gen.draw(st.sampled_from(DIMS)) for _ in range(gen.draw(st.integers(0, 1))))
        n1, m1 = (gen.draw(st.sampled_from((1, 2))) for _ in range(2))
    k1 = gen.draw(st.sampled_from((1, 2)))
    gen.gen(x, (batch + (m1, k1, 16, 16), gen.dtype))
    rhs_batch = batch if batch and gen.draw(st.booleans()) else ()
    gen.gen(y, (rhs_batch + (k1, n1, 16, 16), gen.dtype))
    return batch + (n1, m1, 16, 16), evaluate(d, gen.env)


_LAYOUT_GEN = {"pack": _gen_pack, "unpack": _gen_unpack, "fractal_matmul": _gen_fractal_matmul}


def _fixed_rank(p) -> int | None:
    """The rank an elementwise pattern must have because a convolution (the checker's are NHWC) is
    among its operands; None when any rank will do."""
    if isinstance(p, App) and p.fn == "conv":
        return 4
    if isinstance(p, App) and p.fn in ("binary", "unary", "select"):
        return next((r for r in map(_fixed_rank, p.args) if r is not None), None)
    return None


def _cast_targets(p) -> list:
    """DTYPE variables that are the target of a cast (`convert`, `sconvert`) somewhere in `p`."""
    out, stack = [], [p]
    while stack:
        q = stack.pop()
        if isinstance(q, App):
            if q.fn in ("convert", "sconvert") and isinstance(q.args[1], Var):
                out.append(q.args[1])
            stack.extend(q.args)
    return out


def _is_leaf(p) -> bool:
    return isinstance(p, Var) or (isinstance(p, App) and p.fn in _LEAVES)


def _list_items(p) -> list:
    items = []
    while isinstance(p, App) and p.fn == "tcons":
        items.append(p.args[0])
        p = p.args[1]
    return items


@functools.lru_cache(maxsize=None)
def _extremes(dtype: str, numerics: str = "rounding") -> tuple[float, ...]:
    """The values of a float dtype that break rules: NaN, +-inf, -0, subnormals, the smallest normal,
    the largest finite value, values near half of it and near its square root (where a square or a
    product of two overflows), each with both signs. For an "order" rule, no magnitude above the square
    root over 64 (module doc)."""
    info, dt = ml_dtypes.finfo(dtype), np.dtype(dtype)
    big, root = float(info.max), math.sqrt(float(info.max))
    large = [root / 64] if numerics == "order" else [root / 2, root, 2 * root, big / 2, big / 1.5, big]
    magnitudes = [float(info.smallest_subnormal), 3 * float(info.smallest_subnormal), float(info.tiny), *large]
    out = [0.0, -0.0, math.nan, math.inf, -math.inf]
    for m in magnitudes:
        exact = float(np.asarray(m).astype(dt).astype(np.float64))   # as the dtype holds it
        out += [exact, -exact]
    return tuple(out)


def _literals(dtype: str, numerics: str):
    """A literal constant for a rule whose tensors have `dtype`. "reals" rules see `FLOATS`; the others
    see the dtype's extremes too, and normal numbers that the dtype does not hold exactly (a folded
    constant), which `FLOATS` has (1e-3, say)."""
    if numerics == "reals":
        return st.sampled_from(FLOATS)
    if dtype in FACT_DTYPES:
        return st.one_of(st.sampled_from(FLOATS), integer_elements(dtype).map(float))
    return st.one_of(st.sampled_from(FLOATS), st.sampled_from(_extremes(dtype, numerics)))


def _arrays(shape, dtype: str, numerics: str):
    """Arrays of `shape` whose elements are drawn independently as `_elements` draws them, from one byte
    per element and a seed that Hypothesis draws: drawing each element through Hypothesis's strategies
    cost most of a check. Hypothesis shrinks the bytes towards zeros (simple elements: 0, False) and
    deletes some (the elements after them move forward), and a shape that shrinks keeps the first elements,
    so a counterexample still shrinks to the few values that break a rule."""
    n = math.prod(shape)
    return st.tuples(st.binary(min_size=n, max_size=max(n, DRAWN_ELEMENTS)), st.integers(0, 2**32 - 1)).map(
        lambda drawn: _elements(*drawn, n, dtype, numerics).reshape(shape))


# Values Hypothesis's bounded float strategies favour (among its constants), besides the zeros and the bounds
# (`_ranged`).
_FAVOURED = (0.5, 1.1, 1.5, 1.9, 1 / 3, 1e-5, 1 - 1e-5, 2 + 1e-5, 2.0**-24, 2.0**-14, 2.0**-149, 2.0**-126,
             float(np.finfo(np.float32).eps))


def _elements(kinds: bytes, seed: int, n: int, dtype: str, numerics: str) -> np.ndarray:
    """n elements of `dtype`, each independently (element i by byte i of `kinds` and the seed): for bools,
    either; for integers, half of them the dtype's extremes (`integer_edges`), the others uniform over its
    range; for floats of an "exact", "rounding" or "order" rule, a third of them its extremes (`_extremes`:
    NaN, +-inf, -0, subnormals, values near overflow), a third 1, -1, 2 or 0.5, a third in [-100, 100]
    (ordinary values twice as often as extremes, so that a matmul also sees finite sums); for a "reals"
    rule, moderate values: half of them 0, 1 or -1, the others in [-4, 4]. A zero byte is the simplest
    element: False, 0 or +0."""
    r = np.random.default_rng(seed).random((n, 3)).T   # element i: the row's i-th, whatever n is
    u = (np.frombuffer(kinds[:n], np.uint8) + r[0]) / 256    # uniform in [0, 1), by the byte first
    if dtype == "bool":
        return u >= 0.5
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        wide = np.minimum(int(info.min) + np.floor(r[1] * (float(info.max) - float(info.min) + 1)), int(info.max))
        edges = sorted(integer_edges(dtype), key=abs)
        return np.where(u < 0.5, _pick(edges, 2 * u), wide.astype(np.int64)).astype(dt)
    if numerics == "reals":
        return np.where(u < 0.5, _pick((0.0, 1.0, -1.0), 2 * u), _ranged(r[1], r[2], 4.0)).astype(dt)
    return np.select([u < 1 / 3, u < 2 / 3],
                     [_pick(_extremes(dtype, numerics), 3 * u), _pick((1.0, -1.0, 2.0, 0.5), 3 * u - 1)],
                     _ranged(r[1], r[2], 100.0)).astype(dt)


def _ranged(u: np.ndarray, edge: np.ndarray, bound: float) -> np.ndarray:
    """float32 values in [-bound, bound]: uniform (by `u`), or, where `edge` < 1/8, as Hypothesis's bounded
    floats favour them, a zero of either sign, a bound or one of `_FAVOURED`, with either sign."""
    favoured = [v for m in (0.0, bound, *_FAVOURED) if m <= bound for v in (m, -m)]
    uniform = (u * 2 * bound - bound).astype(np.float32).astype(np.float64)
    return np.where(edge < 1 / 8, _pick(favoured, edge * 8), uniform)


def _pick(values, u: np.ndarray) -> np.ndarray:
    """values[floor(u * len(values))] for each u in [0, 1) (clipped: those outside are not used)."""
    values = np.asarray(values)
    return values[np.clip((u * values.size).astype(np.int64), 0, values.size - 1)]


def _large_arrays(shape, dtype: str, numerics: str):
    """Arrays of more than DRAWN_ELEMENTS (a packed fractal alone is 256 elements): a seeded pseudo-random
    fill of ordinary values, so that long sums are not all NaN or Inf, with 16 values drawn as `_arrays`
    draws them (zeros, NaN, Inf, large magnitudes) at seeded positions."""
    n, dt = math.prod(shape), np.dtype(dtype)

    def build(drawn):
        seed, special = drawn
        rng = np.random.default_rng(seed)
        if dtype == "bool":
            base = rng.random(n) < 0.5
        elif dt.kind in "iu":
            base = rng.integers(0 if dt.kind == "u" else -100, 100, n)
        else:
            base = rng.uniform(-4, 4, n) if numerics == "reals" else rng.uniform(-100, 100, n)
        out = base.astype(np.float32).astype(dt) if dt.kind == "f" or dtype == "bfloat16" else base.astype(dt)
        out[rng.choice(n, special.size, replace=False)] = special.reshape(-1)
        return out.reshape(shape)
    return st.tuples(st.integers(0, 2**32 - 1), _arrays((16,), dtype, numerics)).map(build)


# ---- the check ----

# The predicates (rewrites/functions.py) that read no element of a tensor, only shapes, dtypes, attributes
# and literals: `_one_case` checks them on zeros of the bindings' types (`_Generator.stubs`) before it draws
# the values, which they cannot change. The others read elements (`LEAF_FACTS`).
SHAPE_PREDICATES = frozenset({
    "same_shape", "shape_is", "has_dtype", "float_dtype", "rank", "scalar", "same_rank", "fits", "matmul_ok",
    "identity_perm", "swaps_last_two", "same_numel", "differs_shape", "last_axis", "equal", "less",
    "conv_channels_last", "has_int32_conv", "int32_accumulates_conv", "nonzero", "int8_scale", "fold_in_range",
    "row_vector", "int32_accumulates", "all_axes", "unit_axes", "long_last_axis", "column_vector", "square",
    "main_diagonal", "fills_blocks"})


def _admitted(rule, env: dict, predicates, sides: bool = True) -> list:
    """Whether the rule's predicates named in `predicates` hold under `env`, and the values of its left-hand
    sides (none unless `sides`): Reject where a predicate does not hold, or it or a side is ill typed."""
    try:
        for name, args in rule.conditions:
            if name in predicates and not PREDICATES[name].py(*(evaluate(a, env) for a in args)):
                raise Reject(f"predicate {name} does not hold")
        return [evaluate(lhs, env) for lhs, _ in rule.pairs] if sides else []
    except IllTyped as exc:
        raise Reject(str(exc)) from exc


def _one_case(rule, draw) -> tuple[dict, str | None]:
    """Draw one binding; returns (bindings, problem) with problem None when both sides agree."""
    gen = _Generator(rule, draw)
    for lhs, _ in rule.pairs:
        gen.gen(lhs)
    _admitted(rule, gen.stubs(), SHAPE_PREDICATES, sides=False)   # most rejections, before any value is drawn
    gen.values(rule.numerics)
    env = gen.env
    lhs_values = _admitted(rule, env, PREDICATES)
    shown = {"dtype": gen.dtype} | {str(k): v for k, v in env.items()}
    for (lhs, rhs), left in zip(rule.pairs, lhs_values):
        try:
            right = evaluate(rhs, env)
        except IllTyped as exc:
            return shown, f"right-hand side is ill typed: {exc}"
        left, right = np.asarray(left), np.asarray(right)
        if rule.numerics == "exact":
            problem = _inexact(left, right)
        else:
            if rule.numerics in ("rounding", "order"):
                right = _range_edge(left, right)
            problem = mismatch(left, right)
            if problem:
                # Sides that round differently (x@y + x@z cancels where x@(y+z) does not) pass if the
                # rewritten one is as close to the float64 value as the original (either way round, for a
                # two-way rule).
                truth = _precise(lhs, env)
                if truth is not None and _accurate(left, right, truth, lhs, env, rule.two_way):
                    problem = None
        if problem:
            return shown | {"lhs": left, "rhs": right}, problem
    return shown, None


def _accurate(left, right, truth, lhs, env: dict, two_way: bool) -> bool:
    """Whether the rewritten side is about as close to the float64 value as the original
    (`verify.as_accurate`; either way round for a two-way rule), allowing the rounding error of cancelling
    terms (`_wobble`: computed once, and only where the sides need it)."""
    slack: list = []

    def close(original, rewritten) -> bool:
        if as_accurate(original, rewritten, truth) is None:
            return True
        if not slack:
            slack.append(_wobble(lhs, env, truth))
        return as_accurate(original, rewritten, truth, slack=slack[0]) is None

    return close(left, right) and (not two_way or close(right, left))


def _inexact(left: np.ndarray, right: np.ndarray) -> str | None:
    """None if the two sides are equal in IEEE arithmetic: the same values, NaN at the same elements
    (any payload), zeros of the same sign."""
    if left.shape != right.shape or left.dtype != right.dtype:
        return f"type {right.dtype}{list(right.shape)} != {left.dtype}{list(left.shape)}"
    if not is_float(left.dtype):
        bad = int(np.sum(left != right))
        return f"{bad} of {left.size} elements differ" if bad else None
    a, b = left.astype(np.float64), right.astype(np.float64)
    if not np.array_equal(a, b, equal_nan=True):
        return "values differ (the rule is labelled exact)" if np.array_equal(np.isnan(a), np.isnan(b)) \
            else "NaN positions differ"
    if not np.array_equal(np.signbit(a[a == 0]), np.signbit(b[a == 0])):
        return "zeros of different signs (the rule is labelled exact)"
    return None


def _range_edge(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """`right`, with each element where one side is +-inf and the other a finite value of the same sign
    within rounding tolerance of the dtype's largest finite value taken from `left`: the contract's one
    allowed difference in where results are finite."""
    if left.shape != right.shape or left.dtype != right.dtype or not is_float(left.dtype) \
            or str(left.dtype) not in TOLERANCES:
        return right
    big = float(ml_dtypes.finfo(left.dtype).max) * (1 - TOLERANCES[str(left.dtype)][0])
    a, b = left.astype(np.float64), right.astype(np.float64)
    edge = ((np.isinf(a) & np.isfinite(b) & (np.abs(b) >= big)) |
            (np.isinf(b) & np.isfinite(a) & (np.abs(a) >= big))) & (np.sign(a) == np.sign(b))
    return np.where(edge, left, right) if edge.any() else right


def _precise(pattern, env: dict):
    """The pattern's value with every float binding and dtype widened to float64, or None if that is
    not well typed (an integer-only pattern, say)."""
    wide = {}
    for k, v in env.items():
        if isinstance(v, np.ndarray) and is_float(v.dtype):
            wide[k] = v.astype(np.float64)
        elif isinstance(v, str) and v in FLOAT_DTYPES:
            wide[k] = "float64"
        else:
            wide[k] = v
    global _REFERENCE
    _REFERENCE = True
    try:
        with np.errstate(all="ignore"):
            return np.asarray(evaluate(pattern, wide))
    except (IllTyped, ValueError, TypeError):
        return None
    finally:
        _REFERENCE = False


WOBBLE_ULPS, WOBBLE_TRIALS = 4, 8
# Ops whose value moves by little when their operands move by little: `_wobble` measures only patterns made
# of these (a floor, a comparison or a cast to integers jumps by a whole step at a boundary, and a slack of
# a step would excuse a wrong rule that differs only there).
CONTINUOUS = frozenset(knowing("continuous")) | set(FLOAT_DTYPES) | set(FORMATS)   # the op table's facts


def _continuous(pattern, env: dict) -> bool:
    """Whether every op, dtype and format the pattern names (or its bindings give) is in `CONTINUOUS`."""
    stack = [pattern]
    while stack:
        p = stack.pop()
        if isinstance(p, App):
            if p.fn == "argreduce":
                return False
            stack.extend(p.args)
        elif isinstance(p, (Const, Var)):
            value = p.value if isinstance(p, Const) else env.get(p)
            if isinstance(value, str) and value not in CONTINUOUS:
                return False
    return True


def _wobble(pattern, env: dict, truth: np.ndarray) -> float:
    """How far the float64 value moves (normwise) when every float input moves by a few units in the last
    place of its dtype (`WOBBLE_ULPS`, signs drawn at random, the largest of `WOBBLE_TRIALS` moves): the
    error that rounding in any order of evaluation makes where terms cancel. There a result of 0 is
    exact in one order and a few ulps of the terms in another, and no multiple of the original's error
    (0) or of the result's scale (0) allows for it. 0 for a pattern that is not `_continuous`."""
    if not _continuous(pattern, env):
        return 0.0
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(WOBBLE_TRIALS):
        moved = {k: v * (1 + WOBBLE_ULPS * float(ml_dtypes.finfo(v.dtype).eps) * rng.choice([-1.0, 1.0], v.shape))
                 if isinstance(v, np.ndarray) and is_float(v.dtype) else v for k, v in env.items()}
        value = _precise(pattern, moved)
        if value is None or np.shape(value) != np.shape(truth):
            return 0.0
        both = np.isfinite(value) & np.isfinite(truth)
        worst = max(worst, float(np.linalg.norm(value[both] - truth[both])))
    return worst


@contextmanager
def _only_drawn_values():
    """Hypothesis (from 6.13x) also draws literals it finds in the project's modules that the process has
    imported, so even a derandomized run depended on what was imported before it and on the text of
    those modules (a rule was judged on other values after an unrelated test file changed). The checker
    draws its own extremes (`_extremes`); while it runs, Hypothesis gets none from the modules."""
    get, cache = getattr(_providers, "_get_local_constants", None), getattr(_providers, "CONSTANTS_CACHE", None)
    if get is None or cache is None:       # a Hypothesis without the feature
        yield
        return
    _providers._get_local_constants = type(get())     # an empty set of constants
    cache.cache.clear()                                 # the pools drawn from, computed with the modules'
    try:
        yield
    finally:
        _providers._get_local_constants = get
        cache.cache.clear()


def check_rule(rule, examples: int = 60, seed: int = 0, shrink: bool = True) -> CheckResult:
    """Check one rule on `examples` bindings (Hypothesis shrinks any counterexample it finds, unless
    `shrink` is False: then the first one found is kept, which is faster to find than to shrink). Hypothesis's
    explain phase does not run: it varies the shrunk counterexample to annotate a report the checker does not
    print, and took more than half of an unsound rule's check."""
    result = CheckResult(rule.name)
    failure: list = []
    phases = (Phase.explicit, Phase.generate, Phase.target) + ((Phase.shrink,) if shrink else ())

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck), phases=phases)
    @given(st.data())
    def run(data):
        try:
            shown, problem = _one_case(rule, data.draw)
        except Reject:
            result.rejected += 1
            assume(False)
            return
        result.cases += 1
        result.dtypes.add(shown.get("dtype", ""))
        if problem:
            failure[:] = [Counterexample(shown, problem)]
            raise AssertionError(problem)

    try:
        with _only_drawn_values():
            run()
    except Exception as exc:  # an AssertionError, or a group of them when Hypothesis finds several
        if not failure:       # otherwise Hypothesis gave up: nearly every binding was rejected
            result.notes.append(f"{type(exc).__name__}: {exc}")
    if failure:
        result.counterexample = failure[-1]
    read = {name for name, _ in rule.conditions if name in FACT_HOLDS}
    for dtype in FACT_CHECK_DTYPES if read and result.counterexample is None else ():
        derived = _fact_failures(dtype, FACT_EXAMPLES)   # the same for every rule: checked once per process
        wrong = next((derived.failures[f] for f in sorted(read) if f in derived.failures), None)
        if wrong is not None:
            result.counterexample = Counterexample(wrong.bindings, f"the fact it reads: {wrong.problem}")
            break
    return result


# ---- the analysis's derivations of facts ----

FACT_HOLDS = {name: PREDICATES[name].py for name in LEAF_FACTS}
FACT_HOLDS["nonpos"] = lambda t: not np.any(np.asarray(t, dtype=np.float64) > 0)
FACT_HOLDS["at_least_one"] = lambda t: not np.any(np.asarray(t, dtype=np.float64) < 1)
FACT_SHAPE = (12, 12)   # one operand pair holds every pair of a dtype's extremes (`_edge_grid`)
FACT_EXAMPLES = 20      # random operand pairs after the grid, per dtype (the check runs once per process)


def _fact_terms(a, b) -> tuple:
    """Values that reach every derivation of the analysis's facts a value of an integer dtype can take
    (egraph/analysis.py): squares, powers, abs, negations, signs, sums, differences, products, quotients,
    min and max with 0 and 1, reductions, a value less its maximum; and each of those ops again on them."""
    import jax.numpy as jnp
    from jax import lax

    def peak(t):
        return t - jnp.max(t, axis=-1, keepdims=True)
    divisor = jnp.maximum(b, 1)
    factful = [a * a, jnp.abs(a), jnp.maximum(a, 0), jnp.minimum(a, 0), jnp.maximum(a, 1), jnp.minimum(a, 1),
               peak(a), -(a * a)]
    base = factful + [a * b, lax.integer_pow(a, 2), lax.integer_pow(a, 3), -a, jnp.sign(a), a + b, a - b,
                      lax.div(a, divisor)]
    out = [a, *base]
    for t in base:
        out += [-t, jnp.abs(t), t * t, t + t, jnp.sign(t), lax.integer_pow(t, 2), jnp.minimum(t, 1),
                jnp.maximum(t, 0), peak(t), lax.div(t, divisor), jnp.minimum(t, a), jnp.maximum(t, a),
                *(r(t, axis=-1) for r in (jnp.sum, jnp.prod, jnp.min, jnp.max))]
    out += [op(t, u) for t in factful for u in factful for op in (lax.add, lax.sub, lax.mul)]
    return tuple(out)


@dataclass
class FactCheck:
    dtype: str
    cases: int = 0
    failures: dict = field(default_factory=dict)    # fact -> the first Counterexample that breaks it


def _derived_facts(dtype: str, extra: tuple = ()) -> tuple[list[set], object]:
    """The analysis's facts (and those of `extra` rules) of each value of `_fact_terms` in `dtype`, and the
    program as captured."""
    from egglog import ruleset

    from superopt.egraph.analysis import analysis, analysis_rules
    from superopt.egraph.capture import capture
    from superopt.egraph.encode import encode
    from superopt.egraph.frozen import freeze
    zeros = np.zeros(FACT_SHAPE, np.dtype(dtype))
    graph = capture(lambda a, b: _fact_terms(a, b), (zeros, zeros)).graph
    enc = encode(graph)
    enc.egraph.run((ruleset(*analysis_rules(), *extra) if extra else analysis()).saturate())
    frozen = freeze(enc.egraph, facts=True)
    return [frozen.facts.get(frozen.outputs[k], set()) & set(FACT_HOLDS) for k in range(len(frozen.outputs))], graph


@functools.lru_cache(maxsize=32)
def _fact_failures(dtype: str, examples: int, extra: tuple = ()) -> FactCheck:
    """Each fact the analysis derives of a value of `_fact_terms`, checked on `examples` pairs of operands
    drawn from the integer dtype's extremes (`int_extremes`), the values computed as XLA computes them
    (by the reference evaluator: compiling the few hundred values takes XLA seconds): the first operands that
    break each fact. Integer arithmetic wraps, so a fact that holds over the reals may not."""
    from superopt.core.reference import evaluate as run_graph
    facts, graph = _derived_facts(dtype, extra)
    checked = FactCheck(dtype)
    n = math.prod(FACT_SHAPE)
    # numpy draws each operand from a seed Hypothesis draws, half of it the dtype's extremes as
    # `integer_elements` draws: drawn element by element, the operands took a third of the check's time
    operand = st.integers(0, 2**32 - 1).map(
        lambda seed: int_extremes(np.random.default_rng(seed), n, np.dtype(dtype)).reshape(FACT_SHAPE))

    def one(a, b):
        checked.cases += 1
        for k, out in enumerate(run_graph(graph, [a, b])):
            for fact in sorted(facts[k] - set(checked.failures)):
                if not FACT_HOLDS[fact](np.asarray(out)):
                    checked.failures[fact] = Counterexample(
                        {"a": a, "b": b, f"value {k} of checker._fact_terms": np.asarray(out)},
                        f"the analysis derives {fact} of value {k} of checker._fact_terms in {dtype}, "
                        "which it is not (integer arithmetic wraps)")

    one(*_edge_grid(dtype))

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck), phases=(Phase.generate,))
    @given(operand, operand)
    def each(a, b):
        one(a, b)
    with _only_drawn_values():
        each()
    return checked


def _edge_grid(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Operands a, b of FACT_SHAPE with a[i, j], b[i, j] = e_i, e_j over the dtype's extremes e (repeated
    to fill): every elementwise op meets every pair of extremes, and every row reduction the whole set."""
    edges = integer_edges(dtype)
    rows = np.resize(np.array(edges, np.int64), FACT_SHAPE[0]).astype(np.dtype(dtype))
    a = np.repeat(rows[:, None], FACT_SHAPE[1], axis=1)
    return a, a.T.copy()


def check_facts(dtype: str, examples: int = FACT_EXAMPLES, extra: tuple = ()) -> CheckResult:
    """Every derivation of the analysis's facts (with `extra` rules added) checked in an integer `dtype`
    on its extremes (`_fact_failures`): unsound where a derived fact does not hold of a value."""
    checked = _fact_failures.__wrapped__(dtype, examples, tuple(extra)) if extra else _fact_failures(dtype, examples)
    result = CheckResult(f"facts in {dtype}", cases=checked.cases, dtypes={dtype})
    if checked.failures:
        result.counterexample = checked.failures[min(checked.failures)]
    return result
