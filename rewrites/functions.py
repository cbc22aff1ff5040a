"""Named legality predicates and attribute functions, each with two meanings.

`egg` compiles to egglog (facts for a predicate, one list per alternative; an expression for an attribute
function), given a compile context; `py` is the meaning on concrete values, used by the soundness checker.
`ranks` names the variables whose rank (tensor) or length (vec) must be a known number to compile: egglog
has no loops over vectors, so such rules are expanded once per rank.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from superopt.core import lazy
from superopt.core.dtypes import exp_moderate_bound, is_float, moderate_bounds, smallest_normal
from superopt.core.formats import FORMATS
from superopt.core.ir import DOMAIN_CHECKS
from superopt.egraph.capture import capture
from superopt.rewrites.pattern import DTYPE, FLOAT, FORMAT, INT, TENSOR, VEC, Const, Var, _coerce

# The egglog meanings are built where a rule is compiled; defining rules (and a call the cache answers)
# imports none of these.
E = lazy.module("egglog")
T = lazy.module("superopt.egraph.terms")
encoding = lazy.module("superopt.egraph.encode")

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
# Terms of int8 products an int32 sum always holds: each product lies in [-128 * 127, (-128) ** 2] =
# [-16256, 16384], so K terms fit while K * 2**14 <= 2**31 - 1 (the negative side, K * 16256 <= 2**31,
# allows more). 131072 terms of (-128) * (-128) sum to 2**31, one past int32's largest value.
INT8_TERMS = (2**31 - 1) // 2**14   # 131071


@dataclass(frozen=True)
class Predicate:
    name: str
    sorts: tuple[str, ...]
    doc: str
    egg: Callable            # (ctx, *args) -> list[list[fact]]: alternatives, any of which suffices
    py: Callable             # (*values) -> bool
    ranks: Callable = lambda *args: ()


@dataclass(frozen=True)
class AttributeFn:
    name: str
    egg: Callable            # (ctx, *args) -> egglog expression
    py: Callable             # (*values) -> value
    ranks: Callable = lambda *args: ()


def moderate_elements(values: np.ndarray) -> np.ndarray:
    """Where each element of `values` is `moderate` (False everywhere for a dtype that is not a float)."""
    if not is_float(values.dtype):
        return np.zeros(values.shape, bool)
    lo, hi = moderate_bounds(values.dtype)
    mag = np.abs(values.astype(np.float64))
    return (mag >= lo) & (mag <= hi)


def exp_moderate_elements(values: np.ndarray) -> np.ndarray:
    """Where each element of `values` is `exp_moderate` (False everywhere for a dtype that is not a float)."""
    if not is_float(values.dtype):
        return np.zeros(values.shape, bool)
    return np.abs(values.astype(np.float64)) <= exp_moderate_bound(values.dtype)


def _positive_py(t) -> bool:
    values = np.asarray(t)
    tiny = smallest_normal(values.dtype) if is_float(values.dtype) else 1.0
    values = values.astype(np.float64)
    return not np.any(values < tiny)     # NaN compares false: allowed


def _integral_py(t) -> bool:
    values = np.asarray(t)
    if not is_float(values.dtype):
        return True
    values = values.astype(np.float64)
    finite = values[np.isfinite(values)]
    return bool(np.all(np.floor(finite) == finite))


def _vec(values) -> E.Vec[E.i64]:
    values = [v if not isinstance(v, int) else E.i64(v) for v in values]
    return E.Vec[E.i64](*values) if values else E.Vec[E.i64].empty()


def _rank(v) -> int:
    return len(v) if isinstance(v, tuple) else np.ndim(v)


def _swap_last(r: int) -> tuple[int, ...]:
    return (*range(r - 2), r - 1, r - 2)


def _keyed(*args):
    """The arguments whose rank must be fixed: tensor patterns, and vector variables (a constant vector's
    length is known)."""
    return tuple(a for a in args if a.sort == TENSOR or isinstance(a, Var))


# ---- packed layouts (superopt/core/formats.py) ----

def _fills_blocks_egg(c, s, f) -> list:
    """One alternative per format that packs vectors of this length: it is the format, and each blocked
    axis is a multiple of its block."""
    r, out = c.rank(s), []
    for fmt in FORMATS.values():
        if not fmt.fits(r) or (isinstance(f, Const) and f.value != fmt.name):
            continue
        facts = [] if isinstance(f, Const) else [E.eq(c.expr(f)).to(E.String(fmt.name))]
        lead = fmt.batch(r)
        facts += [E.eq(c.expr(s)[lead + i] % E.i64(b)).to(E.i64(0)) for i, b in enumerate(fmt.blocks) if b > 1]
        out.append(facts)
    return out


def _fills_blocks_py(s, f) -> bool:
    return f in FORMATS and FORMATS[f].fills_blocks(tuple(s))


# The convolution parameters the checker draws from (rewrites/checker.py); a conv pattern's params id,
# and a conv predicate's argument, index this table.
class _ConvTable:
    """Convolution parameters the checker draws from; a `conv` pattern's params id indexes this table."""

    def __init__(self):
        self._params = None

    @property
    def conv_params(self) -> list:
        if self._params is None:  # captured from a real call, so they are exactly what capture produces
            fn = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "VALID",  # noqa: E731
                                                       dimension_numbers=("NHWC", "HWIO", "NHWC"))
            graph = capture(fn, (jnp.ones((1, 3, 3, 2)), jnp.ones((2, 2, 2, 4)))).graph
            params = next(n.attrs[0] for n in graph.nodes if n.op == "conv")
            self._params = [params, encoding.int32_twin(params)]
        return self._params


CONV_TABLE = _ConvTable()  # entry 0: NHWC input, HWIO kernel, stride 1, VALID padding; 1: the same in int32


PREDICATES: dict[str, Predicate] = {p.name: p for p in [
    Predicate("same_shape", (TENSOR, TENSOR), "the two tensors have the same shape",
              lambda c, a, b: [[E.eq(c.shape(a)).to(c.shape(b))]], lambda a, b: np.shape(a) == np.shape(b)),
    Predicate("shape_is", (TENSOR, VEC), "the tensor has exactly this shape",
              lambda c, t, s: [[E.eq(c.shape(t)).to(c.expr(s))]], lambda t, s: tuple(np.shape(t)) == tuple(s)),
    Predicate("has_dtype", (TENSOR, DTYPE), "the tensor has this dtype",
              lambda c, t, d: [[E.eq(T.dtype(c.expr(t))).to(c.expr(d))]], lambda t, d: str(np.asarray(t).dtype) == d),
    Predicate("float_dtype", (DTYPE,), "a floating-point dtype",
              lambda c, d: [[T.float_dtype(c.expr(d))]], lambda d: d in FLOAT_DTYPES),
    Predicate("rank", (TENSOR, INT), "the tensor has this rank",
              lambda c, t, r: [[E.eq(c.shape(t).length()).to(c.expr(r))]], lambda t, r: np.ndim(t) == r),
    Predicate("scalar", (TENSOR,), "a rank-0 tensor",
              lambda c, t: [[E.eq(c.shape(t).length()).to(E.i64(0))]], lambda t: np.ndim(t) == 0),
    Predicate("same_rank", (TENSOR, TENSOR), "the two tensors have the same rank",
              lambda c, a, b: [[E.eq(c.shape(a).length()).to(c.shape(b).length())]],
              lambda a, b: np.ndim(a) == np.ndim(b)),
    Predicate("fits", (VEC, TENSOR), "a permutation or axis list as long as the tensor's rank",
              lambda c, p, t: [[E.eq(c.expr(p).length()).to(c.shape(t).length())]], lambda p, t: len(p) == np.ndim(t)),
    Predicate("matmul_ok", (TENSOR, TENSOR), "a@b is a valid matmul: a rank-2 b, or equal ranks",
              lambda c, a, b: [[E.eq(c.shape(b).length()).to(E.i64(2))],
                               [E.eq(c.shape(a).length()).to(c.shape(b).length())]],
              lambda a, b: np.ndim(a) >= 2 and (np.ndim(b) == 2 or np.ndim(a) == np.ndim(b))),
    Predicate("identity_perm", (VEC,), "the identity permutation",
              lambda c, p: [[E.eq(c.expr(p)).to(_vec(range(c.rank(p))))]], lambda p: tuple(p) == tuple(range(len(p))),
              lambda p: _keyed(p)),
    Predicate("swaps_last_two", (VEC,), "the permutation that swaps the last two axes",
              lambda c, p: [[E.eq(c.expr(p)).to(_vec(_swap_last(c.rank(p))))]] if c.rank(p) >= 2 else [],
              lambda p: len(p) >= 2 and tuple(p) == _swap_last(len(p)), lambda p: _keyed(p)),
    Predicate("same_numel", (TENSOR, VEC), "the tensor has as many elements as the shape describes",
              lambda c, t, s: [[E.eq(_product(c.shape(t), c.rank(t))).to(_product(c.expr(s), c.rank(s)))]],
              lambda t, s: math.prod(np.shape(t)) == math.prod(s), lambda t, s: _keyed(t, s)),
    Predicate("differs_shape", (TENSOR, VEC), "the tensor's shape is not this one",
              lambda c, t, s: [[E.ne(c.shape(t)).to(c.expr(s))]], lambda t, s: tuple(np.shape(t)) != tuple(s)),
    Predicate("last_axis", (VEC, TENSOR), "the axis list names exactly the tensor's last axis",
              lambda c, p, t: [[E.eq(c.expr(p)).to(_vec([c.rank(t) - 1]))]] if c.rank(t) else [],
              lambda p, t: np.ndim(t) > 0 and tuple(p) == (np.ndim(t) - 1,), lambda p, t: _keyed(t)),
    Predicate("equal", (INT, INT), "a = b (two sizes, e.g. of axes a rule's right side joins or adds)",
              lambda c, a, b: [[E.eq(c.expr(a)).to(c.expr(b))]], lambda a, b: a == b),
    Predicate("less", (INT, INT), "a < b (orders leaves so a group is matched once)",
              lambda c, a, b: [[c.expr(a) < c.expr(b)]], lambda a, b: a < b),
    Predicate("conv_channels_last", (INT,), "conv params whose output and kernel features are the last axis",
              lambda c, n: [[T.conv_channels_last(c.expr(n))]], lambda n: _conv_channels_last_py(n)),
    Predicate("has_int32_conv", (INT,), "conv params that have a twin accumulating in int32 (those that give "
              "the operands' dtype: no preferred_element_type, or float32)",
              lambda c, n: [[T.conv_int32(c.expr(n)) >= E.i64(0)]], lambda n: _int32_conv_py(n) is not None),
    Predicate("int32_accumulates_conv", (TENSOR,), "int8 products summed over a channels-last conv kernel's "
              f"window and input features (all axes but the last) fit int32 (2 to {INT8_TERMS} terms: one "
              "product keeps float32's -0.0, which XLA's zero-started sum of two or more turns to +0.0 as int32 does)",
              lambda c, t: [[_product(c.shape(t), c.rank(t) - 1) <= E.i64(INT8_TERMS),
                             _product(c.shape(t), c.rank(t) - 1) >= E.i64(2)]] if c.rank(t) else [],
              lambda t: np.ndim(t) > 0 and 2 <= math.prod(np.shape(t)[:-1]) <= INT8_TERMS, lambda t: _keyed(t)),
    Predicate("nonzero", (FLOAT,), "a nonzero constant (egglog's f64 holds -0.0 and 0.0 as one value)",
              lambda c, v: [[E.ne(c.expr(v)).to(E.f64(0.0))]], lambda v: v != 0.0),
    Predicate("int8_scale", (FLOAT,), "a float32 scale an int8 matmul or conv may take inside or outside: zero, "
              "or 2**-60 <= |c| <= 2**48, so that with at most INT8_TERMS products (each at most 2**14) and a "
              "scale on each operand, neither side overflows float32 or leaves its normal range",
              lambda c, v: [[E.eq(c.expr(v)).to(E.f64(0.0))],
                            [c.expr(v) >= E.f64(2.0**-60), c.expr(v) <= E.f64(2.0**48)],
                            [c.expr(v) >= E.f64(-2.0**48), c.expr(v) <= E.f64(-2.0**-60)]],
              lambda v: v == 0.0 or 2.0**-60 <= abs(v) <= 2.0**48),
    Predicate("fold_in_range", (FLOAT, DTYPE), "a folded constant is a normal number of the float dtype: "
              "not NaN, and rounding it to the dtype neither overflows nor underflows; not zero, whose sign "
              "egglog's f64 does not keep (-0.0 and 0.0 are one value there)",
              lambda c, v, d: _in_range_egg(c.expr(v), c.expr(d)), lambda v, d: _in_range_py(v, d)),
    Predicate("row_vector", (TENSOR,), "a rank-2 tensor with one row (a per-column vector, as broadcast)",
              lambda c, t: [[E.eq(c.shape(t).length()).to(E.i64(2)), E.eq(c.shape(t)[E.i64(0)]).to(E.i64(1))]],
              lambda t: np.ndim(t) == 2 and np.shape(t)[0] == 1),
    Predicate("int32_accumulates", (TENSOR,), "int8 products summed over the tensor's last axis fit int32 "
              f"(2 to (2**31 - 1) // 2**14 = {INT8_TERMS} terms: one product keeps float32's -0.0, which "
              "XLA's zero-started sum of two or more turns to +0.0 as int32 does)",
              lambda c, t: [[c.shape(t)[c.rank(t) - 1] <= E.i64(INT8_TERMS), c.shape(t)[c.rank(t) - 1] >= E.i64(2)]]
              if c.rank(t) else [],
              lambda t: np.ndim(t) > 0 and 2 <= np.shape(t)[-1] <= INT8_TERMS, lambda t: _keyed(t)),
    Predicate("all_axes", (VEC, TENSOR), "the axis list names every axis of the tensor (a full reduction)",
              lambda c, p, t: [[E.eq(c.expr(p)).to(_vec(range(c.rank(t))))]] if c.rank(t) else [],
              lambda p, t: np.ndim(t) > 0 and tuple(p) == tuple(range(np.ndim(t))), lambda p, t: _keyed(t)),
    Predicate("unit_axes", (VEC, TENSOR), "every axis the list names has size one in the tensor",
              lambda c, p, t: [[E.eq(c.shape(t)[c.expr(p)[E.i64(i)]]).to(E.i64(1)) for i in range(c.rank(p))]]
              if c.rank(p) <= c.rank(t) else [],
              lambda p, t: all(np.shape(t)[a] == 1 for a in p), lambda p, t: _keyed(p, t)),
    Predicate("long_last_axis", (TENSOR,), "the tensor's last axis has more than one element",
              lambda c, t: [[c.shape(t)[c.rank(t) - 1] > E.i64(1)]] if c.rank(t) else [],
              lambda t: np.ndim(t) > 0 and np.shape(t)[-1] > 1, lambda t: _keyed(t)),
    Predicate("nonneg", (TENSOR,), "no element is below -0 (each is +-0, positive, +inf or NaN), as the sign "
              "analysis derives it (egraph/analysis.py)",
              lambda c, t: [[T.nonneg(c.expr(t))]], lambda t: not np.any(np.asarray(t, dtype=np.float64) < 0)),
    Predicate("finite", (TENSOR,), "no element is NaN or +-inf, as the range analysis derives it "
              "(egraph/analysis.py)", lambda c, t: [[T.finite(c.expr(t))]],
              lambda t: bool(np.all(np.isfinite(np.asarray(t, dtype=np.float64))))),
    Predicate("positive", (TENSOR,), "every element is at least its dtype's smallest normal number, +inf or NaN, "
              "as the range analysis derives it (egraph/analysis.py)", lambda c, t: [[T.positive(c.expr(t))]],
              _positive_py),
    Predicate("moderate", (TENSOR,), "every element is finite, and its magnitude is between the square roots of "
              "its dtype's smallest normal number and of its largest finite value (a product or quotient of two "
              "such is a normal number); no analysis proves it: a rule may only assume it (`given`) and have it "
              "checked at run time", lambda c, t: [], lambda t: bool(np.all(moderate_elements(np.asarray(t))))),
    Predicate("exp_moderate", (TENSOR,), "every element is finite and at most half the log of its dtype's "
              "largest finite value, less EXP_MARGIN, in magnitude (float32: 43; exp of it, and a product or "
              "quotient of two such exps, is a finite normal number); no analysis proves it: only assumed (`given`) "
              "and checked at run time",
              lambda c, t: [], lambda t: bool(np.all(exp_moderate_elements(np.asarray(t))))),
    Predicate("at_most_one", (TENSOR,), "no element is above 1 (-inf and NaN allowed), as the range analysis "
              "derives it (egraph/analysis.py)", lambda c, t: [[T.at_most_one(c.expr(t))]],
              lambda t: not np.any(np.asarray(t, dtype=np.float64) > 1)),
    Predicate("integral", (TENSOR,), "every element is an integer, +-inf or NaN, as the integer analysis derives "
              "it (egraph/analysis.py)",
              lambda c, t: [[T.integral(c.expr(t))]], _integral_py),
    Predicate("column_vector", (TENSOR,), "a rank-2 tensor with one column (a per-row vector, as broadcast)",
              lambda c, t: [[E.eq(c.shape(t).length()).to(E.i64(2)), E.eq(c.shape(t)[E.i64(1)]).to(E.i64(1))]],
              lambda t: np.ndim(t) == 2 and np.shape(t)[1] == 1),
    Predicate("square", (TENSOR,), "a rank-2 tensor with as many rows as columns",
              lambda c, t: [[E.eq(c.shape(t)[E.i64(0)]).to(c.shape(t)[E.i64(1)])]] if c.rank(t) == 2 else [],
              lambda t: np.ndim(t) == 2 and np.shape(t)[0] == np.shape(t)[1], lambda t: _keyed(t)),
    Predicate("main_diagonal", (VEC, VEC, VEC, TENSOR), "a slice (start, limit, strides) of a square matrix "
              "flattened that takes its main diagonal: from 0 to its size, every (columns + 1)-th element",
              lambda c, p, q, t, m: [[E.eq(c.shape(m)[E.i64(0)]).to(c.shape(m)[E.i64(1)]),
                                      E.eq(c.expr(p)).to(_vec([0])),
                                      E.eq(c.expr(q)).to(_vec([c.shape(m)[E.i64(0)] * c.shape(m)[E.i64(1)]])),
                                      E.eq(c.expr(t)).to(_vec([c.shape(m)[E.i64(1)] + E.i64(1)]))]]
              if c.rank(m) == 2 else [],
              lambda p, q, t, m: np.ndim(m) == 2 and np.shape(m)[0] == np.shape(m)[1] and tuple(p) == (0,)
              and tuple(q) == (np.size(m),) and tuple(t) == (np.shape(m)[1] + 1,), lambda p, q, t, m: _keyed(m)),
    Predicate("fills_blocks", (VEC, FORMAT), "shape s divides into the blocks of format f: packing it adds "
              "no padding, so unpacking and packing again gives back the same tensor",
              _fills_blocks_egg, _fills_blocks_py, lambda s, f: _keyed(s)),
]}


# ---- constant folding (rulesets/algebra.py `_fold`) ----
# egglog folds in f64. Of two literals exactly representable in a dtype, the f64 sum, difference, product
# or quotient rounded once to the dtype is the dtype's own correctly rounded result (f64 has more than
# 2p + 2 bits for every p here, so the double rounding is innocuous), i.e. what XLA computes. Where the
# result overflows or underflows the dtype it is not: the f64 value of a later fold would not be the
# dtype's inf or zero. `fold_in_range` keeps folded values to zero or the dtype's normal numbers, so every
# literal in an e-graph is either captured (representable) or such a folded value.

def _dtype_range(dtype: str) -> tuple[float, float]:
    """(smallest normal, largest finite) of a float dtype."""
    return smallest_normal(dtype), float(ml_dtypes.finfo(dtype).max)


def _in_range_egg(v, d) -> list:
    # egglog orders f64 with NaN above +inf, so `v <= hi` excludes NaN in the positive alternative, and
    # `v <= -lo` in the negative one
    out = []
    for dt in FLOAT_DTYPES:
        lo, hi = _dtype_range(dt)
        out += [[E.eq(d).to(E.String(dt)), v >= E.f64(lo), v <= E.f64(hi)],
                [E.eq(d).to(E.String(dt)), v >= E.f64(-hi), v <= E.f64(-lo)]]
    return out


def _in_range_py(v: float, d: str) -> bool:
    if d not in FLOAT_DTYPES:
        return False
    lo, hi = _dtype_range(d)
    return lo <= abs(v) <= hi


def _fmax(a: float, b: float) -> float:
    """lax.max: NaN if either is NaN, and max(-0.0, 0.0) = 0.0."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return b if a < b or (a == b and math.copysign(1.0, a) < 0) else a


def _fmin(a: float, b: float) -> float:
    """lax.min: NaN if either is NaN, and min(-0.0, 0.0) = -0.0."""
    return -_fmax(-a, -b)


def _int32_conv_py(n: int) -> int | None:
    """The checker's table id of conv params n accumulating in int32, or None."""
    twin = encoding.int32_twin(CONV_TABLE.conv_params[n])
    return CONV_TABLE.conv_params.index(twin) if twin in CONV_TABLE.conv_params else None


def _conv_channels_last_py(n: int) -> bool:
    return encoding.channels_last(CONV_TABLE.conv_params[n])


def _center(s, ref, r: int, low: bool):
    """Padding that centres a kernel of shape s in one of shape ref, on the last two (spatial) axes."""
    out = []
    for i in range(r):
        if i < r - 2:
            out.append(E.i64(0))
        else:
            half = (ref[i] - s[i]) / 2
            out.append(half if low else ref[i] - s[i] - half)
    return out


def _center_py(s, ref, low: bool) -> tuple:
    r = len(s)
    return tuple(0 if i < r - 2 else ((ref[i] - s[i]) // 2 if low else ref[i] - s[i] - (ref[i] - s[i]) // 2)
                 for i in range(r))


def _product(v, r: int):
    out = E.i64(1)
    for i in range(r):
        out = out * v[i]
    return out


ATTRIBUTES: dict[str, AttributeFn] = {f.name: f for f in [
    AttributeFn("compose", lambda c, p, q: _vec(c.expr(p)[c.expr(q)[i]] for i in range(c.rank(q))),
                lambda p, q: tuple(p[i] for i in q), lambda p, q: _keyed(q)),
    AttributeFn("shape_of", lambda c, t: c.shape(t), lambda t: tuple(np.shape(t))),
    AttributeFn("dtype_of", lambda c, t: c.dtype(t), lambda t: str(np.asarray(t).dtype)),
    AttributeFn("dim", lambda c, t, i: c.shape(t)[c.expr(i)], lambda t, i: np.shape(t)[i]),
    AttributeFn("zeros_like", lambda c, t: _vec([0] * c.rank(t)), lambda t: (0,) * np.ndim(t), lambda t: _keyed(t)),
    AttributeFn("ones_like", lambda c, t: _vec([1] * c.rank(t)), lambda t: (1,) * np.ndim(t), lambda t: _keyed(t)),
    AttributeFn("set_last", lambda c, v, x: c.expr(v).set(c.expr(v).length() - 1, c.expr(x)),
                lambda v, x: tuple(v[:-1]) + (x,)),
    AttributeFn("set_at", lambda c, v, i, x: c.expr(v).set(c.expr(i), c.expr(x)),
                lambda v, i, x: tuple(v[:i]) + (x,) + tuple(v[i + 1:])),
    AttributeFn("center_low", lambda c, t, ref: _vec(_center(c.shape(t), c.shape(ref), c.rank(t), low=True)),
                lambda t, ref: _center_py(np.shape(t), np.shape(ref), low=True), lambda t, ref: _keyed(t)),
    AttributeFn("center_high", lambda c, t, ref: _vec(_center(c.shape(t), c.shape(ref), c.rank(t), low=False)),
                lambda t, ref: _center_py(np.shape(t), np.shape(ref), low=False), lambda t, ref: _keyed(t)),
    AttributeFn("iadd", lambda c, a, b: c.expr(a) + c.expr(b), lambda a, b: a + b),
    AttributeFn("fadd", lambda c, a, b: c.expr(a) + c.expr(b), lambda a, b: a + b),
    AttributeFn("fsub", lambda c, a, b: c.expr(a) - c.expr(b), lambda a, b: a - b),
    AttributeFn("fmul", lambda c, a, b: c.expr(a) * c.expr(b), lambda a, b: a * b),
    AttributeFn("fdiv", lambda c, a, b: c.expr(a) / c.expr(b), lambda a, b: a / b),
    # egglog's f64 max propagates NaN (its order puts NaN above +inf) but its min drops it, so min is
    # computed as -max(-a, -b). Its f64 holds -0.0 and 0.0 as one value: the sign of a folded zero is
    # whichever the e-graph saw first (a rounding-sized difference).
    AttributeFn("fmax", lambda c, a, b: c.expr(a).max(c.expr(b)), _fmax),
    AttributeFn("fmin", lambda c, a, b: -((-c.expr(a)).max(-c.expr(b))), _fmin),
    AttributeFn("int32_conv", lambda c, n: c.bind(T.conv_int32(c.expr(n)), E.i64), lambda n: _int32_conv_py(n)),
    AttributeFn("last_axis_of", lambda c, t: _vec([c.rank(t) - 1]), lambda t: (np.ndim(t) - 1,), lambda t: _keyed(t)),
    AttributeFn("axes_of", lambda c, t: _vec(range(c.rank(t))), lambda t: tuple(range(np.ndim(t))),
                lambda t: _keyed(t)),
]}


# The conditions a rule may assume of an operand where the analysis cannot prove them (`given`): a search that
# speculates takes the rule anyway, and the program it returns runs behind a run-time check of the condition
# on that operand's values (extract/guard.py). Each is a tensor predicate above: what the analysis proves and
# what the check tests are the same condition.
DOMAINS = DOMAIN_CHECKS


@dataclass(frozen=True)
class Given:
    """A domain condition of a rule: `name` (one of DOMAINS) holds for every element of the tensor `arg`."""
    name: str
    arg: Var


def given(name: str, x) -> Given:
    """A rule's domain condition on the tensor variable `x`: proven by the analysis (as `when(name, x)`), or,
    in a search that speculates, assumed and checked at run time on the value `x` matched (extract/guard.py)."""
    if name not in DOMAINS:
        raise KeyError(f"unknown domain condition {name!r}; known: {', '.join(DOMAINS)}")
    if not (isinstance(x, Var) and x.sort == TENSOR):
        raise TypeError(f"domain condition {name}: its operand must be a tensor variable, not {x!r}")
    return Given(name, x)


def when(name: str, *args) -> tuple:
    """A predicate application in a rule's `when` list, checked against the predicate's sorts."""
    if name not in PREDICATES:
        raise KeyError(f"unknown predicate {name!r}; known: {', '.join(sorted(PREDICATES))}")
    pred = PREDICATES[name]
    if len(args) != len(pred.sorts):
        raise TypeError(f"predicate {name} takes {len(pred.sorts)} arguments, got {len(args)}")
    return (name, tuple(_coerce(a, s, f"predicate {name} argument {i}") for i, (a, s) in
                        enumerate(zip(args, pred.sorts))))

