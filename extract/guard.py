"""Guarded programs: a rewrite equal over the reals only, made legal under strict numerics by a check at run time.

A "reals" rewrite (superopt/numerics.py: a matrix product re-associated, a full sum of products factored) breaks
the strict contract in one way only: an intermediate of the rewritten program may overflow, or fall below the
dtype's smallest normal number, where the original's do not. Where neither program's intermediates can do either,
the two compute the same sums of the same products added in another order, as an "order" rewrite does: each value
within 2 (n + 1) u sum|terms| of the original's (`core/verify.py`, `reordered_sum_bound`; README's contract), which
strict numerics allows. Where terms cancel exactly that bound can be all of the value: nothing here proves more.

`exponent` proves that for a program of polynomial ops (products, sums, contractions, moves): given that every
float argument's elements are zero or of magnitude within [2**-e, 2**e], it bounds every value's nonzero
magnitudes from above and from below, and returns the largest such e for which every value is zero or normal
and finite in its dtype. The lower bound is the one cancellation leaves: the exact sum of floats that are each
a multiple of 2**g is a multiple of 2**g, and so is its rounding, so a nonzero sum is at least 2**g however its
terms cancel; a float of magnitude at least 2**lo is a multiple of 2**(lo - p + 1) (p: its significand bits); a
product not rounded before it is added (a fused multiply-add) is a multiple of the product of its factors'
grids; a quotient by a constant with no zero element (a mean's count) is rounded, so a multiple of its own ulp.
A program with any other op (a quotient by a value, a transcendental, a comparison) gets no bound.

The program superopt returns runs the rewritten program where the check holds on the call's arguments (finite,
and every nonzero magnitude within the bounds) and the original otherwise (`lowering/jax.py`); the check
(`check_graph`) is one pass over the float arguments the programs read.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from superopt.core.dtypes import is_float
from superopt.core.ir import Graph, Node, unfused

# The least exponent worth a check: at 2**-8, 200 standard normal draws hold a nonzero element below the range
# about half the time, and the original would run as often.
MIN_EXPONENT = 8

_MOVES = frozenset({"neg", "abs", "transpose", "reshape", "broadcast", "slice", "reduce_max", "reduce_min",
                    "stop_gradient"})
_UNIONS = frozenset({"concat", "max", "min", "pad"})
_SUMS = frozenset({"add", "sub"})


def _float_info(dtype: str):
    """(significand bits, least normal exponent, largest exponent of a finite value) of a float dtype, or
    None for any other dtype."""
    if dtype == "bool" or not is_float(dtype) or np.dtype(dtype).kind == "c":
        return None
    info = ml_dtypes.finfo(np.dtype(dtype))
    return info.nmant + 1, int(info.minexp), int(info.maxexp) - 1


class _Unbounded(Exception):
    """The program has an op the analysis does not bound."""


def _literal(values: np.ndarray, p: int):
    """The (lo, hi, grid) state of a known value: None where it is all zeros."""
    mags = np.abs(np.asarray(values, dtype=np.float64)).ravel()
    if not np.all(np.isfinite(mags)):
        raise _Unbounded("a constant is not finite")
    mags = mags[mags != 0]
    if mags.size == 0:
        return None
    lo, hi = math.floor(math.log2(mags.min())), math.ceil(math.log2(mags.max()))
    return lo, hi, lo - p + 1


def _union(states):
    states = [s for s in states if s is not None]
    if not states:
        return None
    return min(s[0] for s in states), max(s[1] for s in states), min(s[2] for s in states)


def _product(a, b, p: int):
    """A product's state: its magnitude bounds, and the grid of the product as a sum would add it (exact,
    where it is fused into the addition, or rounded to p bits)."""
    if a is None or b is None:
        return None
    lo = a[0] + b[0]
    return lo, a[1] + b[1], min(a[2] + b[2], lo - p + 1)


def _sum(state, terms: int):
    """The state of a sum of `terms` values of `state`: any cancellation stops at one grid step."""
    if state is None:
        return None
    return state[2], state[1] + math.ceil(math.log2(max(terms, 1))), state[2]


def _states(flat: Graph, e: int) -> bool:
    """Whether every value of `flat` (a program without kernel nodes: `unfused`) is zero or normal and finite,
    given float arguments whose nonzero magnitudes lie within [2**-e, 2**e]. Raises _Unbounded for a program
    the analysis does not cover."""
    state: dict[int, tuple | None] = {}
    divisors: set[int] = set()   # constants with no zero element (and their moves): what a value may be divided by
    for i in flat.live():
        node: Node = flat.nodes[i]
        info = _float_info(node.dtype)
        if info is None:
            raise _Unbounded(f"{node.op} of {node.dtype}")
        p, least, largest = info
        ins = [state[j] for j in node.inputs]
        if node.op == "arg":
            s = (-e, e, -e - p + 1)
        elif node.op in ("lit", "const"):
            values = np.asarray(node.attrs[0]) if node.op == "lit" else flat.consts[node.attrs[0]]
            s = _literal(values, p)
            if np.all(values != 0):
                divisors.add(i)
        elif node.op in _MOVES:
            s = ins[0]
            if node.inputs[0] in divisors:
                divisors.add(i)
        elif node.op == "div" and node.inputs[1] in divisors:   # a mean's division by its count
            x, y = ins
            s = None if x is None else (x[0] - y[1], x[1] - y[0], x[0] - y[1] - p + 1)
        elif node.op in _UNIONS:
            s = _union(ins)
        elif node.op == "convert":
            s = None if ins[0] is None else (ins[0][0], ins[0][1], min(ins[0][2], ins[0][0] - p + 1))
        elif node.op == "mul":
            s = _product(ins[0], ins[1], p)
        elif node.op == "square":
            s = _product(ins[0], ins[0], p)
        elif node.op == "integer_pow" and node.attrs[0] >= 1:
            s = ins[0]
            for _ in range(node.attrs[0] - 1):
                s = _product(s, ins[0], p)
        elif node.op in _SUMS:
            s = _sum(_union(ins), 2)
        elif node.op == "reduce_sum":
            shape = flat.nodes[node.inputs[0]].shape
            s = _sum(ins[0], int(np.prod([shape[a] for a in node.attrs[0]], dtype=np.int64)))
        elif node.op == "matmul":
            s = _sum(_product(ins[0], ins[1], p), flat.nodes[node.inputs[0]].shape[-1])
        else:
            raise _Unbounded(node.op)
        if s is not None and (s[0] < least or s[1] > largest):   # a sum's least magnitude is its grid
            return False
        state[i] = s
    return True


def exponent(*graphs: Graph) -> int | None:
    """The largest e (at least MIN_EXPONENT) such that, for float arguments whose elements are zero or of
    magnitude within [2**-e, 2**e], every value of every one of `graphs` is zero or normal and finite; None
    where a graph has an op the analysis does not bound, or no such e exists."""
    flats = [unfused(g) for g in graphs]
    try:
        if not all(_states(g, MIN_EXPONENT) for g in flats):
            return None
        lo, hi = MIN_EXPONENT, 1 << 12   # bisect: a wider range only widens every bound
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if all(_states(g, mid) for g in flats):
                lo = mid
            else:
                hi = mid - 1
        return lo
    except _Unbounded:
        return None


def worth_trying(graph: Graph) -> bool:
    """Whether a guarded program may pay for `graph`: it is bounded (`exponent`) and has a sum or a matrix
    product, which "reals" rules re-associate or factor."""
    flat = unfused(graph)
    ops = flat.op_counts()
    if "matmul" not in ops and "reduce_sum" not in ops:
        return False
    try:
        return _states(flat, MIN_EXPONENT)
    except _Unbounded:
        return False


def checked_args(*graphs: Graph) -> tuple[int, ...]:
    """The arguments the run-time check reads: every one that one of `graphs` reads."""
    return tuple(sorted({g.nodes[i].attrs[0] for g in graphs for i in g.live() if g.nodes[i].op == "arg"}))


def check_graph(exponent: int, args: tuple[int, ...], *graphs: Graph) -> Graph:
    """The run-time check as a program, priced like any other and lowered as it is (lowering/jax.py): its one
    output counts the elements of the arguments `args` (`arg` nodes of `graphs`) that are not zero or of
    magnitude within [2**-exponent, 2**exponent] (NaN fails every comparison). Each argument's count is
    two matrix-vector products with ones over its element flags: on a CPU, XLA runs those faster than a
    reduction of the same elements (about 11 us against 25 us for 200x200 float32 on the development
    machine)."""
    nodes = {n.attrs[0]: n for g in graphs for n in g.nodes if n.op == "arg"}
    check = Graph(n_args=graphs[0].n_args)

    def fill(value: float, shape: tuple, dtype: str) -> int:
        return check.add(Node("broadcast", (check.add(Node("lit", (), (value,), (), dtype)),), ((),), shape, dtype))

    total = None
    for k in args:
        shape, dtype = nodes[k].shape, nodes[k].dtype
        x = check.add(nodes[k])
        a = check.add(Node("abs", (x,), (), shape, dtype))
        small = check.add(Node("le", (a, fill(2.0 ** exponent, shape, dtype)), (), shape, "bool"))
        large = check.add(Node("ge", (a, fill(2.0 ** -exponent, shape, dtype)), (), shape, "bool"))
        zero = check.add(Node("eq", (a, fill(0.0, shape, dtype)), (), shape, "bool"))
        good = check.add(Node("and", (small, check.add(Node("or", (large, zero), (), shape, "bool"))), (), shape,
                              "bool"))
        bad = check.add(Node("select", (good, fill(1.0, shape, "float32"), fill(0.0, shape, "float32")), (), shape,
                             "float32"))
        cols = shape[-1] if shape else 1
        rows = int(np.prod(shape, dtype=np.int64)) // max(cols, 1)
        flags = check.add(Node("reshape", (bad,), (), (rows, cols), "float32"))
        per_row = check.add(Node("matmul", (flags, fill(1.0, (cols, 1), "float32")), (), (rows, 1), "float32"))
        count = check.add(Node("matmul", (fill(1.0, (1, rows), "float32"), per_row), (), (1, 1), "float32"))
        total = count if total is None else check.add(Node("add", (total, count), (), (1, 1), "float32"))
    if total is None:   # no argument to check (fn takes none, or only arguments that bound nothing)
        total = fill(0.0, (1, 1), "float32")
    check.outputs = [check.add(Node("reshape", (total,), (), (), "float32"))]
    return check
