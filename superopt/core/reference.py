"""A pure-numpy reference evaluator for the IR: the checker's ground truth for rule soundness.

Each op is one small numpy function in `EVAL`, written to be obviously right rather than fast, with
the semantics of the lax primitive of the same name (and of `lowering/jax.py`). Where lax and numpy
differ, lax wins: integer `div`/`rem` truncate (C semantics), division by zero gives -1 and `rem` by
zero gives the dividend, float->int `convert` saturates with NaN -> 0, out-of-range shifts give 0 (or
the sign), and `max`/`min` propagate NaN.

Dtypes: float16 computes natively in numpy, which rounds every op to float16. bfloat16 (and the
float8 types) have no numpy arithmetic of their own worth trusting, so their inputs are widened to
float32 and each op's result is rounded back to the node's dtype, once per op. Every result is cast
to exactly the node's dtype.
"""
from __future__ import annotations

import math
from statistics import NormalDist
from typing import Callable

import ml_dtypes  # also makes np.dtype('bfloat16') resolve
import numpy as np

from superopt.core.ir import WINDOW_REDUCTIONS, Graph
from superopt.core.formats import fractal_einsum, pack_np, unpack_np
from superopt.core.dtypes import is_float

try:  # scipy is optional; math and statistics give the same functions one element at a time
    from scipy import special as _special
except ImportError:  # pragma: no cover - depends on the environment
    _special = None

_WIDEN = {np.dtype(getattr(ml_dtypes, n)) for n in ("bfloat16", "float8_e4m3fn", "float8_e5m2")}
_NATIVE = frozenset({"nextafter"})  # steps in the operand's own format, so it must not be widened


# ---- elementwise helpers where lax and numpy part ways ----

def _logistic(x):
    e = np.exp(-np.abs(x))  # never overflows, so neither branch divides inf by inf
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _round(x):
    t = np.trunc(x)  # lax.round's default rounds half away from zero, not to even
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)


def _erf_inv_scalar(y: float) -> float:
    if math.isnan(y) or abs(y) > 1:
        return math.nan
    if abs(y) == 1:
        return math.copysign(math.inf, y)
    if y == 0:
        return y
    x = NormalDist().inv_cdf((1 + y) / 2) / math.sqrt(2)
    # One Newton step on erf(x) = y restores the relative precision (1+y)/2 loses near zero.
    return x - (math.erf(x) - y) / (2 / math.sqrt(math.pi) * math.exp(-x * x))


def _by_element(fn: Callable) -> Callable:
    vec = np.vectorize(fn, otypes=[np.float64])
    return lambda x: vec(x.astype(np.float64))


_erf = _special.erf if _special else _by_element(math.erf)
_erfc = _special.erfc if _special else _by_element(math.erfc)
_erf_inv = _special.erfinv if _special else _by_element(_erf_inv_scalar)


def _int_div(x, y, rem: bool):
    x, y = np.broadcast_arrays(x, y)
    zero = y == 0
    safe = np.where(zero, np.ones_like(y), y)
    r = np.fmod(x, safe)  # C remainder: sign of the dividend
    if rem:
        return np.where(zero, x, r)
    q = (x - r) // safe  # exact division, so floor and truncation agree
    return np.where(zero, np.array(-1).astype(x.dtype), q)


def _div(x, y):
    return _int_div(x, y, False) if x.dtype.kind in "iu" else np.true_divide(x, y)


def _rem(x, y):
    return _int_div(x, y, True) if x.dtype.kind in "iu" else np.fmod(x, y)


def _shift(kind: str) -> Callable:
    def shift(x, y):
        x, y = np.broadcast_arrays(x, y)
        bits = x.dtype.itemsize * 8
        unsigned = np.dtype(f"u{x.dtype.itemsize}")
        amount = y.astype(unsigned)  # lax reads shift amounts as unsigned: negative ones are huge
        ok = amount < bits
        if kind == "arithmetic":
            return np.right_shift(x, np.where(ok, amount, bits - 1).astype(x.dtype))
        s = np.where(ok, amount, 0).astype(unsigned)
        if kind == "left":
            out = np.left_shift(x.astype(unsigned), s).astype(x.dtype)
        else:
            out = np.right_shift(x.astype(unsigned), s).astype(x.dtype)
        return np.where(ok, out, np.zeros_like(x))
    return shift


_UNARY: dict[str, Callable] = {
    "neg": np.negative, "abs": np.abs, "sign": np.sign, "floor": np.floor, "ceil": np.ceil, "round": _round, "round_even": np.rint,
    "exp": np.exp, "exp2": np.exp2, "log": np.log, "log1p": np.log1p, "expm1": np.expm1, "tanh": np.tanh,
    "logistic": _logistic, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "cbrt": np.cbrt,
    "erf": _erf, "erfc": _erfc, "erf_inv": _erf_inv, "sin": np.sin, "cos": np.cos, "tan": np.tan,
    "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh,
    "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "not": np.invert,
    "is_finite": np.isfinite, "square": lambda x: x * x, "stop_gradient": lambda x: x,
    "real": np.real, "imag": np.imag, "conj": np.conj,
}
_BINARY: dict[str, Callable] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": _div, "rem": _rem, "pow": np.power,
    "max": np.maximum, "min": np.minimum, "atan2": np.arctan2, "nextafter": np.nextafter,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
    "shift_left": _shift("left"), "shift_right_logical": _shift("logical"),
    "shift_right_arithmetic": _shift("arithmetic"),
}


# ---- reductions ----

def _lowest(dt: np.dtype, highest: bool = False):
    if dt.kind == "b":
        return not highest
    if dt.kind == "f":
        return np.inf if highest else -np.inf
    info = np.iinfo(dt)
    return info.max if highest else info.min


def _reductions() -> dict[str, Callable]:
    def with_initial(fn, highest):  # an explicit identity makes empty reductions well defined
        return lambda a, s, d, x: fn(x, axis=tuple(a[0]), initial=_lowest(x.dtype, highest))
    return {
        "reduce_sum": lambda a, s, d, x: np.sum(x, axis=tuple(a[0]), dtype=x.dtype),
        "reduce_prod": lambda a, s, d, x: np.prod(x, axis=tuple(a[0]), dtype=x.dtype),
        "reduce_max": with_initial(np.max, False), "reduce_min": with_initial(np.min, True),
        # lax's and/or reductions are bitwise on integers, logical on bool.
        "reduce_and": lambda a, s, d, x: np.bitwise_and.reduce(x, axis=tuple(a[0])),
        "reduce_or": lambda a, s, d, x: np.bitwise_or.reduce(x, axis=tuple(a[0])),
        "argmax": lambda a, s, d, x: np.argmax(x, axis=a[0]),  # first index on ties, NaN counts as the max
        "argmin": lambda a, s, d, x: np.argmin(x, axis=a[0]),
    }


def _pool(op: str, x, window, strides, low, high):
    """reduce_window: pad with the reduction's identity, take every window, keep every stride-th one."""
    identity = {"reduce_window_max": _lowest(x.dtype), "reduce_window_min": _lowest(x.dtype, True),
                "reduce_window_sum": 0}[op]
    padded = _pad(x, np.asarray(identity, dtype=x.dtype), low, high, (0,) * x.ndim)
    windows = np.lib.stride_tricks.sliding_window_view(padded, window)[tuple(slice(None, None, t) for t in strides)]
    axes = tuple(range(x.ndim, 2 * x.ndim))
    reduce = {"reduce_window_max": np.max, "reduce_window_min": np.min, "reduce_window_sum": np.sum}[op]
    return reduce(windows, axis=axes).astype(x.dtype)


# ---- structural ops ----

def _pad(x, value, low, high, interior):
    """lax.pad: interior padding, then edge padding where negative amounts crop."""
    shape = [n + max(n - 1, 0) * k for n, k in zip(x.shape, interior)]
    dilated = np.full(shape, value, dtype=x.dtype)
    dilated[tuple(slice(None, None, k + 1) for k in interior)] = x
    grown = np.pad(dilated, [(max(lo, 0), max(hi, 0)) for lo, hi in zip(low, high)], constant_values=value)
    return grown[tuple(slice(max(-lo, 0), grown.shape[d] - max(-hi, 0)) for d, (lo, hi) in enumerate(zip(low, high)))]


def _broadcast(x, shape, dims):
    order = np.argsort(dims)  # make the mapped dims increasing, so a reshape can place them
    x = np.transpose(x, order)
    expanded = [1] * len(shape)
    for axis, d in zip(range(x.ndim), sorted(dims)):
        expanded[d] = x.shape[axis]
    return np.broadcast_to(x.reshape(expanded), shape)


def _iota(shape, dimension):
    idx = [1] * len(shape)
    idx[dimension] = shape[dimension]
    return np.broadcast_to(np.arange(shape[dimension]).reshape(idx), shape)


def _convert(x, dt: np.dtype):
    if x.dtype.kind == "c" and dt.kind != "c":
        x = np.real(x)  # lax drops the imaginary part
    if x.dtype.kind == "f" and dt.kind in "iu":
        # lax saturates to the target range and sends NaN to 0, where numpy's cast is undefined.
        info = np.iinfo(dt)
        t = np.trunc(x.astype(np.float64))
        inside = np.where((t > info.min) & (t < info.max), t, 0).astype(dt)
        return np.where(t >= info.max, info.max, np.where(t <= info.min, info.min, inside)).astype(dt)
    return x.astype(dt)


def _accumulator(dt: np.dtype) -> np.dtype:
    # Float products are summed in float64 and rounded once, so the reference is as close to the
    # real-number result as the output dtype allows; integers wrap in the result dtype, like XLA.
    if dt.name == "bfloat16":          # an ml_dtypes float; numpy does not call it kind "f"
        return np.dtype(np.float64)
    return np.promote_types(dt, np.float64) if dt.kind in "fc" else dt


def _matmul(x, y, dt):
    acc = _accumulator(dt)
    return np.matmul(x.astype(acc), y.astype(acc))


def _fractal_matmul(x, y, dt):
    """The cube's contraction on fractals (superopt/core/formats.py), accumulated like `_matmul`."""
    acc = _accumulator(dt)
    return np.einsum(fractal_einsum(y.ndim > 4), x.astype(acc), y.astype(acc))


def _conv(params: dict, lhs, rhs, dt):
    """conv_general_dilated: to (N, C, *spatial) / (O, I, *window), dilate and pad, slide, contract."""
    if params["batch_group_count"] != 1:
        raise NotImplementedError("superopt: reference conv supports batch_group_count == 1 only")
    dn = params["dimension_numbers"]
    acc = _accumulator(dt)
    lhs = np.transpose(lhs, dn.lhs_spec).astype(acc)
    rhs = np.transpose(rhs, dn.rhs_spec).astype(acc)
    nsp = lhs.ndim - 2
    lo, hi = zip(*params["padding"]) if nsp else ((), ())
    lhs = _pad(lhs, acc.type(0), (0, 0) + tuple(lo), (0, 0) + tuple(hi),
               (0, 0) + tuple(d - 1 for d in params["lhs_dilation"]))
    rhs = _pad(rhs, acc.type(0), (0,) * rhs.ndim, (0,) * rhs.ndim,
               (0, 0) + tuple(d - 1 for d in params["rhs_dilation"]))
    spatial = tuple(range(2, 2 + nsp))
    windows = np.lib.stride_tricks.sliding_window_view(lhs, rhs.shape[2:], axis=spatial)
    windows = windows[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in params["window_strides"])]
    g = params["feature_group_count"]
    n, c = windows.shape[:2]
    o, i = rhs.shape[:2]
    windows = windows.reshape((n, g, c // g) + windows.shape[2:])
    rhs = rhs.reshape((g, o // g, i) + rhs.shape[2:])
    s, k = "".join(chr(ord("p") + d) for d in range(nsp)), "".join(chr(ord("A") + d) for d in range(nsp))
    out = np.einsum(f"ngi{s}{k},goi{k}->ngo{s}", windows, rhs)
    out = out.reshape((n, o) + out.shape[3:])
    return np.transpose(out, np.argsort(dn.out_spec))


def _integer_pow(x, y: int):
    """Square-and-multiply, the same product order as lax.integer_pow."""
    acc, base, n = None, x, abs(y)
    while n:
        if n & 1:
            acc = base if acc is None else acc * base
        n >>= 1
        if n:
            base = base * base
    acc = np.ones_like(x) if acc is None else acc
    return 1 / acc if y < 0 else acc


# Every entry takes (attrs, shape, dtype, *inputs); dtype is the node's np.dtype.
EVAL: dict[str, Callable] = {
    **{op: (lambda f: lambda a, s, d, x: f(x))(f) for op, f in _UNARY.items()},
    **{op: (lambda f: lambda a, s, d, x, y: f(x, y))(f) for op, f in _BINARY.items()},
    **_reductions(),
    "iota": lambda a, s, d: _iota(s, a[0]),
    "integer_pow": lambda a, s, d, x: _integer_pow(x, a[0]),
    "select": lambda a, s, d, p, f, t: np.where(p != 0, t, f),
    "matmul": lambda a, s, d, x, y: _matmul(x, y, d),
    "conv": lambda a, s, d, x, y: _conv(dict(a[0]), x, y, d),
    "transpose": lambda a, s, d, x: np.transpose(x, a[0]),
    "reshape": lambda a, s, d, x: np.reshape(x, s),
    "broadcast": lambda a, s, d, x: _broadcast(x, s, a[0]),
    "convert": lambda a, s, d, x: _convert(x, d),
    "concat": lambda a, s, d, *xs: np.concatenate(xs, axis=a[0]),
    "slice": lambda a, s, d, x: x[tuple(slice(b, e, k) for b, e, k in zip(*a))],
    "pad": lambda a, s, d, x, v: _pad(x, v, *a),
    "pack": lambda a, s, d, x: pack_np(x, a[0]),
    "unpack": lambda a, s, d, x: unpack_np(x, a[0], s),
    "fractal_matmul": lambda a, s, d, x, y: _fractal_matmul(x, y, d),
    **{op: (lambda op: lambda a, s, d, x: _pool(op, x, *a))(op) for op in WINDOW_REDUCTIONS},
}


def evaluate_node(op: str, attrs: tuple, inputs, shape: tuple, dtype) -> np.ndarray:
    """One op on numpy inputs; the result has exactly the node's shape and dtype."""
    fn = EVAL.get(op)
    if fn is None:
        raise NotImplementedError(f"superopt: no reference evaluation for op {op!r}")
    dt = np.dtype(dtype)
    ins = [np.asarray(x) for x in inputs]
    if op not in _NATIVE:
        ins = [x.astype(np.float32) if x.dtype in _WIDEN else x for x in ins]
    with np.errstate(all="ignore"):  # NaN and Inf propagate silently, as in XLA
        out = np.asarray(fn(tuple(attrs), tuple(shape), dt, *ins))
        out = out.astype(dt)
    assert out.shape == tuple(shape), f"{op}: reference gave shape {out.shape}, node says {tuple(shape)}"
    return out


def evaluate(graph: Graph, args, precise: bool = False, round_args: bool = True) -> list[np.ndarray]:
    """Evaluate the live nodes in order; returns the outputs as numpy arrays.

    With `precise=True` every floating-point value is computed and kept in float64 (inputs are first
    rounded to their declared dtype): the program's value without its rounding errors, which
    verification measures both the original and an optimized program against. A kernel's body is
    evaluated with `round_args=False`: its inputs are values of the program, not rounded again."""
    env: dict[int, np.ndarray] = {}
    opaque_results: dict[tuple, list] = {}

    def compute_dtype(dtype):
        return np.dtype(np.float64) if precise and is_float(dtype) else np.dtype(dtype)

    for i in graph.live():
        node = graph.nodes[i]
        ins = [env[j] for j in node.inputs]
        if node.op == "arg":
            value = np.asarray(args[node.attrs[0]])
            if round_args:
                value = value.astype(np.dtype(node.dtype), copy=False)
            env[i] = value.astype(compute_dtype(node.dtype), copy=False)
        elif node.op == "const":
            env[i] = np.asarray(graph.consts[node.attrs[0]]).astype(compute_dtype(node.dtype), copy=False)
        elif node.op == "lit":
            env[i] = np.asarray(node.attrs[0], dtype=compute_dtype(node.dtype))
        elif node.op == "kernel":  # one launch: its body is a small program over the kernel's inputs
            body = node.attrs[0]
            env[i] = evaluate(Graph(nodes=list(body), outputs=[len(body) - 1]), ins, precise, round_args=False)[0]
        elif node.op == "opaque":
            key = (node.attrs[0], node.inputs)  # one bind per opaque equation, however many outputs
            if key not in opaque_results:
                op = graph.opaque[node.attrs[0]]
                declared = [x.astype(np.dtype(graph.nodes[j].dtype)) for x, j in zip(ins, node.inputs)]
                out = op.primitive.bind(*declared, **op.params, **({"effects": False} if op.effectful else {}))
                opaque_results[key] = list(out) if op.primitive.multiple_results else [out]
            env[i] = np.asarray(opaque_results[key][node.attrs[1]]).astype(compute_dtype(node.dtype))
        else:
            env[i] = evaluate_node(node.op, node.attrs, ins, node.shape, compute_dtype(node.dtype))
    return [env[o] for o in graph.results]
