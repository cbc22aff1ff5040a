"""The op table: one entry per op of the term language, holding everything that is true of the op.

An `Op` says which term constructor carries it (its `family`), its attributes, its flags (elementwise,
transcendental, view, matrix, reduction, free, ...), the lax primitives it is captured from, what it
means (`numpy`: the reference semantics the soundness checker and the NPU emulator compute with),
how it runs in JAX (`jax`, which the Pallas backend shares), how much arithmetic it does (`flops`), and
where each target runs it (`npu`: the vector unit, the cube, a view, a format conversion, or the host
CPU; `pallas`: inside a kernel body, or as a JAX op between kernels). Every layer looks ops up here:
the IR's op sets, the encoder, the analyses' facts, the reference evaluator, the checker's draws, the
cost models and the lowerings. `tests/test_ops.py` fails when an op lacks an entry any of them needs.

Adding an op of an existing family (`unary`, `binary`, `reduce`, `argreduce`, `pool`, `scan`) is one
entry below. A family is a term constructor (egraph/terms.py) with its analysis rule, its encoding, its
typing (rewrites/infer.py) and its capture handler; `docs/design.md` ("The op table") walks through one.

Semantics where lax and numpy differ follow lax: integer `div`/`rem` truncate (C semantics), division by
zero gives -1 and `rem` by zero gives the dividend, float->int `convert` saturates with NaN -> 0,
out-of-range shifts give 0 (or the sign), and `max`/`min` propagate NaN.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, Callable

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from superopt.core.formats import fractal_einsum, format_of, pack_np, unpack_np

if TYPE_CHECKING:
    from superopt.core.ir import Node

# ---- numpy semantics where lax and numpy part ways ----


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


def _special(name: str, fallback: Callable) -> Callable:
    """scipy.special's `name` where scipy is installed, else `fallback` one element at a time (math and
    statistics give the same functions). scipy is imported at the first call, not with the op table: a
    process whose programs all come from the cache never needs it."""
    def fn(x):
        try:
            from scipy import special
        except ImportError:  # pragma: no cover - depends on the environment
            return _by_element(fallback)(x)
        return getattr(special, name)(x)
    return fn


_erf = _special("erf", math.erf)
_erfc = _special("erfc", math.erfc)
_erf_inv = _special("erfinv", _erf_inv_scalar)


def _lgamma_scalar(x: float) -> float:
    try:
        return math.lgamma(x)
    except ValueError:          # a pole (0, -1, -2, ...): lax gives inf
        return math.inf


_lgamma = _special("gammaln", _lgamma_scalar)


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




# ---- reductions ----

def _lowest(dt: np.dtype, highest: bool = False):
    """The dtype's lowest value (its highest, with `highest`): the identity of max (of min). A float type
    without infinities (float8_e4m3fn) has its largest finite value."""
    dt = np.dtype(dt)
    if dt.kind == "b":
        return highest
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return info.max if highest else info.min
    if np.isinf(np.array(np.inf).astype(dt)):
        return np.inf if highest else -np.inf
    info = ml_dtypes.finfo(dt)
    return info.max if highest else info.min


def _zero(dt: np.dtype):
    return np.zeros((), dt)[()]


def _one(dt: np.dtype):
    return np.ones((), dt)[()]


def _all_ones(dt: np.dtype):
    """Every bit set: the identity of a bitwise and (True for bool)."""
    dt = np.dtype(dt)
    return True if dt.kind == "b" else np.array(-1).astype(dt)[()]


def _np_pool(op: str, x, window, strides, low, high):
    """reduce_window: pad with the reduction's identity (its table entry's), take every window, keep every
    stride-th one."""
    padded = _pad(x, np.asarray(OPS[op].identity(x.dtype), dtype=x.dtype), low, high, (0,) * x.ndim)
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


def _np_iota(shape, dimension):
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

# ---- JAX lowerings of the structural ops ----

def _lax_matmul(node: Node, a, b):
    ra, rb = a.ndim, b.ndim
    if rb == 2:
        dims = (((ra - 1,), (0,)), ((), ()))
    else:
        batch = tuple(range(ra - 2))
        dims = (((ra - 1,), (rb - 2,)), (batch, batch))
    return lax.dot_general(a, b, dims, preferred_element_type=np.dtype(node.dtype))


def _lax_pack(node: Node, x):
    """pad with zeros to whole blocks, split the blocked axes, transpose (superopt/core/formats.py)."""
    f = format_of(node.attrs[0])
    padded = f.padded_shape(x.shape)
    x = lax.pad(x, np.zeros((), x.dtype), tuple((0, p - n, 0) for n, p in zip(x.shape, padded)))
    return lax.transpose(lax.reshape(x, tuple(f.split_dims(list(padded), lambda n, b: n // b))), f.full_perm(x.ndim))


def _lax_unpack(node: Node, y):
    """The inverse transpose, merge the split axes, drop the padding."""
    f = format_of(node.attrs[0])
    perm = f.full_perm(len(node.shape))
    padded = f.padded_shape(node.shape)
    x = lax.reshape(lax.transpose(y, tuple(int(i) for i in np.argsort(perm))), padded)
    return lax.slice(x, (0,) * len(padded), node.shape)


def _lax_fractal_matmul(node: Node, a, b):
    return jnp.einsum(fractal_einsum(b.ndim > 4), a, b, preferred_element_type=np.dtype(node.dtype))


# ---- the table ----

Type = tuple[tuple[int, ...], str]   # (shape, dtype)

# Where an op runs on the NPU: the vector unit, the cube, as a view of its operand's GM tensor, as a
# format conversion (TransData), on the host CPU (no generator for it: the report lists it), or handled by
# the graph walk itself (leaves, kernels, opaque primitives).
NPU_PLACES = frozenset({"vector", "cube", "view", "format", "host", "graph"})
# Where an op runs under the Pallas backend: inside a kernel body, or as a JAX op between kernels.
PALLAS_PLACES = frozenset({"body", "between", "graph"})
FLAGS = frozenset({
    "elementwise",     # one result element from the same-index operand elements
    "transcendental",  # costs `Target.transcendental_flops` per element, where other elementwise ops cost 1
    "bool_result",     # the result is bool whatever the operands' dtype
    "native",          # the reference computes it in the operand's own format (never widened to float32)
    "reduction",       # removes axes
    "matrix",          # a contraction for the matrix unit (tensor cores, the cube)
    "view",            # a bitcast of a dense array: no data moves
    "free",            # costs nothing per call (leaves and views)
    "movement",        # only moves or re-types data
    "layout",          # a packed-format conversion (core/formats.py)
    "leaf",            # no tensor operands
    "const_leaf",      # a leaf whose value is known when the program is built
    "graph",           # evaluated by the graph walks themselves (arg, const, lit, kernel, opaque)
    "step",            # a step function of its float operands: a rounding-level change to one moves the result by
                       # a whole step (comparisons, floor, float->int convert, argmax; extract/cone.py)
})
# What the analyses may assume of an op (egraph/analysis.py's sign, integer and range facts; the soundness
# checker's perturbation test). "keeps_*" is of a unary op's operand, each of a binary op's operands (both must
# hold), a reduction's operand.
FACTS = frozenset({
    "nonneg",          # every result is >= 0 or NaN, whatever the operands (exp, abs, square)
    "keeps_nonneg",    # operands >= 0 give results >= 0 (a reduction's empty result too: not reduce_max, -inf)
    "integral",        # every result is a whole number (floor, round, sign)
    "keeps_integral",  # whole-number operands give whole-number results
    "keeps_finite",    # finite operands give finite results: it never overflows
    "at_most_one",     # every result is at most 1 or NaN (as XLA computes it: not erf, 1.0000001 near saturation)
    "real_result",     # a real result of a complex operand (abs, real, imag): its dtype is the real one
    "continuous",      # moves by little where its operands move by little (no step, no cast to integers)
})


def _size(t: Type) -> int:
    return math.prod(t[0])


@dataclass(frozen=True)
class Op:
    """Everything superopt knows about one op (module doc). `numpy` takes (attrs, shape, dtype, *inputs)
    with `dtype` the node's np.dtype; `jax` takes (node, *inputs); `flops` takes (attrs, input types,
    output type) and counts an element of a transcendental op as one (the cost model scales it)."""
    name: str
    family: str
    attrs: tuple[str, ...] = ()
    flags: frozenset = frozenset()
    captures: tuple[str, ...] = ()
    capture: Callable | None = None   # (params) -> (op, attrs), or None to keep the equation opaque
    numpy: Callable | None = None
    jax: Callable | None = None
    flops: Callable | None = None
    npu: str = "host"
    pallas: str = "between"
    facts: frozenset = frozenset()    # what the analyses know of it (FACTS): egraph/analysis.py, rewrites/checker.py
    identity: Callable | None = None  # a reduction's: (np.dtype) -> the value a padded element must hold
    combine: str | None = None        # a reduction's: the binary op that joins two partial results
    named_call: str | None = None     # a composite of JAX's own (a `jit` of that name in jax's source, such as
    #                                   jnp.sinc) captured as this one op, its body not entered (egraph/capture.py)

    def has(self, flag: str) -> bool:
        return flag in self.flags


def _none(a, ins, out) -> float:
    return 0.0


def _per_element(a, ins, out) -> float:
    return float(_size(out))


def _plain_params(name):
    """The capture of an elementwise primitive: no params, or all None (an accuracy request or a rounding
    method keeps the primitive whole)."""
    return lambda params: (name, ()) if all(v is None for v in params.values()) else None


def _unary(name, fn, lax_fn=None, flags=(), npu="vector", facts=()):
    lax_fn = lax_fn or getattr(lax, name)
    return Op(name, "unary", (), frozenset({"elementwise", *flags}), (name,), _plain_params(name),
              numpy=lambda a, s, d, x: fn(x), jax=lambda n, x: lax_fn(x), flops=_per_element, npu=npu,
              pallas="body", facts=frozenset(facts))


def _binary(name, fn, lax_fn=None, flags=(), facts=()):
    lax_fn = lax_fn or getattr(lax, name)
    return Op(name, "binary", (), frozenset({"elementwise", *flags}), (name,), _plain_params(name),
              numpy=lambda a, s, d, x, y: fn(x, y), jax=lambda n, x, y: lax_fn(x, y), flops=_per_element,
              npu="vector", pallas="body", facts=frozenset(facts))


def _reduce_capture(name):
    return lambda params: (name, (tuple(sorted(int(a) for a in params["axes"])),))


def _reduce(name, fn, lax_fn, identity, combine, facts=()):
    """A reduction over the sorted axes attrs[0]; `fn(x, axes)` in numpy, `lax_fn(x, axes)` in lax (the
    public function: it supplies every param the primitive's transpose and batching rules need); `identity`
    (np.dtype -> value) and `combine` (a binary op) as `Op` says."""
    return Op(name, "reduce", ("axes",), frozenset({"reduction"}), (name,), _reduce_capture(name),
              numpy=lambda a, s, d, x: fn(x, tuple(a[0])), jax=lambda n, x: lax_fn(x, tuple(n.attrs[0])),
              flops=lambda a, ins, out: float(_size(ins[0])), npu="vector", pallas="body", facts=frozenset(facts),
              identity=identity, combine=combine)


def _argreduce_capture(name):
    def capture(params):
        axes = tuple(params["axes"])
        return (name, (int(axes[0]),)) if len(axes) == 1 else None
    return capture


def _argreduce(name, fn, lax_fn):
    return Op(name, "argreduce", ("axis",), frozenset({"reduction", "step"}), (name,), _argreduce_capture(name),
              numpy=lambda a, s, d, x: fn(x, axis=a[0]),   # first index on ties, NaN counts as the max
              jax=lambda n, x: lax_fn(x, n.attrs[0], np.dtype(n.dtype)),
              flops=lambda a, ins, out: float(_size(ins[0])))


def _pool_capture(name):
    def capture(params):
        if any(d != 1 for d in (*params["base_dilation"], *params["window_dilation"])):
            return None
        low, high = (tuple(int(pad[k]) for pad in params["padding"]) for k in (0, 1))
        return name, (tuple(params["window_dimensions"]), tuple(params["window_strides"]), low, high)
    return capture


def _pool(name, primitive, identity, combine, facts=()):
    """A window reduction (pooling) without dilation; attrs (window, strides, low padding, high padding).
    Lowered with every param its primitive has, as `lax.reduce_window` binds it: the primitive's JVP,
    transpose and batching rules read them all."""
    def lower(n, x):
        window, strides, low, high = n.attrs
        ones = (1,) * len(window)
        return primitive.bind(x, window_dimensions=window, window_strides=strides,
                              padding=tuple(zip(low, high)), base_dilation=ones, window_dilation=ones)
    return Op(name, "pool", ("window", "strides", "low", "high"), frozenset({"reduction"}), (name,),
              _pool_capture(name), numpy=lambda a, s, d, x: _np_pool(name, x, *a), jax=lower,
              flops=lambda a, ins, out: float(_size(out) * math.prod(a[0])), facts=frozenset(facts),
              identity=identity, combine=combine)


def _scan_capture(name):
    return lambda params: (name, (int(params["axis"]), int(bool(params["reverse"]))))


def _scan(name, fn, lax_fn, flags=(), facts=()):
    """A cumulative op along one axis: attrs (axis, reverse) with reverse 0 or 1; the result has the
    operand's shape and dtype. `fn` is numpy's accumulation along an axis (from the start)."""
    def reference(a, s, d, x):
        axis, reverse = a
        if not reverse:
            return fn(x, axis)
        return np.flip(fn(np.flip(x, axis), axis), axis)
    return Op(name, "scan", ("axis", "reverse"), frozenset(flags), (name,), _scan_capture(name), numpy=reference,
              jax=lambda n, x: lax_fn(x, axis=n.attrs[0], reverse=bool(n.attrs[1])), flops=_per_element,
              facts=frozenset(facts))


def _structural(name, attrs, numpy, jax, flops=_none, flags=(), npu="host", pallas="between", facts=()):
    return Op(name, "structural", attrs, frozenset(flags), (), None, numpy, jax, flops, npu, pallas, frozenset(facts))


def _graph(name, attrs, flags=()):
    """An op the graph walks evaluate themselves (a leaf, a kernel, an opaque primitive)."""
    return Op(name, "structural", attrs, frozenset({"graph", *flags}), flops=_none, npu="graph", pallas="graph")


def _matmul_flops(a, ins, out) -> float:
    return 2.0 * _size(out) * ins[0][0][-1]


def _conv_flops(a, ins, out) -> float:
    params = dict(a[0])
    rhs_shape = ins[1][0]
    out_features = rhs_shape[params["dimension_numbers"].rhs_spec[0]]
    return 2.0 * _size(out) * math.prod(rhs_shape) / out_features


def _fractal_matmul_flops(a, ins, out) -> float:
    """ZZ lhs [..., M1, K1, 16, 16]: K = K1 * 16 of the padded matrices the cube multiplies."""
    lhs = ins[0][0]
    return 2.0 * _size(out) * lhs[-3] * lhs[-1]


def _integer_pow_flops(a, ins, out) -> float:
    return float(_size(out) * max(1, abs(a[0]).bit_length()))


_TRANSCENDENTAL = ("transcendental",)
_BOOL = ("bool_result",)
_STEP = ("step",)
_COMPARE = ("bool_result", "step")

_ENTRIES = [
    # ---- leaves and graph-level nodes ----
    _graph("arg", ("index",), ("leaf", "free", "movement")),
    _graph("const", ("index",), ("leaf", "const_leaf", "free")),      # an index into Graph.consts
    _graph("lit", ("value",), ("leaf", "const_leaf", "free")),        # a rank-0 literal
    _graph("opaque", ("opaque_index", "output_index"), ("step",)),   # into Graph.opaque; may compare (a sort)
    _graph("kernel", ("body",)),   # one launch: body is a tuple of Nodes in topological order, `arg` k = input k
    _structural("iota", ("dimension",), lambda a, s, d: _np_iota(s, a[0]),
                lambda n: lax.broadcasted_iota(np.dtype(n.dtype), n.shape, n.attrs[0]),
                flags=("leaf", "const_leaf")),

    # ---- elementwise of one operand (names follow lax primitives) ----
    _unary("neg", np.negative, facts=("keeps_integral", "keeps_finite", "continuous")),
    _unary("abs", np.abs, facts=("nonneg", "keeps_integral", "keeps_finite", "real_result", "continuous")),
    _unary("sign", np.sign, flags=_STEP, facts=("keeps_nonneg", "integral", "keeps_finite")),
    _unary("floor", np.floor, flags=_STEP, facts=("keeps_nonneg", "integral", "keeps_finite")),
    _unary("ceil", np.ceil, flags=_STEP, facts=("keeps_nonneg", "integral", "keeps_finite")),
    # lax.round's two methods: half away from zero (its default) and half to even (jnp.round's)
    Op("round", "unary", (), frozenset({"elementwise", "step"}), ("round",),
       lambda params: {0: ("round", ()), 1: ("round_even", ())}.get(int(params.get("rounding_method", 0))),
       numpy=lambda a, s, d, x: _round(x), jax=lambda n, x: lax.round(x), flops=_per_element, npu="vector",
       pallas="body", facts=frozenset(("keeps_nonneg", "integral", "keeps_finite"))),
    Op("round_even", "unary", (), frozenset({"elementwise", "step"}), (), None, numpy=lambda a, s, d, x: np.rint(x),
       jax=lambda n, x: lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN), flops=_per_element, npu="vector",
       pallas="body", facts=frozenset(("integral", "keeps_finite"))),
    _unary("exp", np.exp, flags=_TRANSCENDENTAL, facts=("nonneg", "continuous")),
    _unary("exp2", np.exp2, flags=_TRANSCENDENTAL, facts=("nonneg", "continuous")),
    _unary("log", np.log, flags=_TRANSCENDENTAL, facts=("continuous",)),
    _unary("log1p", np.log1p, flags=_TRANSCENDENTAL, facts=("keeps_nonneg", "continuous")),
    _unary("expm1", np.expm1, flags=_TRANSCENDENTAL, facts=("keeps_nonneg", "continuous")),
    _unary("tanh", np.tanh, flags=_TRANSCENDENTAL,
           facts=("keeps_nonneg", "keeps_finite", "at_most_one", "continuous")),
    _unary("logistic", _logistic, flags=_TRANSCENDENTAL,
           facts=("nonneg", "keeps_finite", "at_most_one", "continuous")),
    _unary("sqrt", np.sqrt, flags=_TRANSCENDENTAL, facts=("nonneg", "continuous")),
    _unary("rsqrt", lambda x: 1 / np.sqrt(x), flags=_TRANSCENDENTAL, facts=("continuous",)),
    _unary("cbrt", np.cbrt, flags=_TRANSCENDENTAL, facts=("continuous",)),
    _unary("erf", _erf, flags=_TRANSCENDENTAL, facts=("keeps_nonneg", "keeps_finite", "continuous")),
    _unary("erfc", _erfc, flags=_TRANSCENDENTAL, facts=("continuous",)),
    _unary("erf_inv", _erf_inv, flags=_TRANSCENDENTAL), _unary("lgamma", _lgamma, flags=_TRANSCENDENTAL),
    _unary("sin", np.sin, flags=_TRANSCENDENTAL, facts=("keeps_finite", "at_most_one", "continuous")),
    _unary("cos", np.cos, flags=_TRANSCENDENTAL, facts=("keeps_finite", "at_most_one", "continuous")),
    _unary("tan", np.tan, flags=_TRANSCENDENTAL, facts=("continuous",)),
    _unary("asin", np.arcsin, flags=_TRANSCENDENTAL, facts=("continuous",)),
    _unary("acos", np.arccos, flags=_TRANSCENDENTAL, facts=("continuous",)),
    _unary("atan", np.arctan, flags=_TRANSCENDENTAL, facts=("keeps_nonneg", "keeps_finite", "continuous")),
    _unary("sinh", np.sinh, flags=_TRANSCENDENTAL, facts=("keeps_nonneg", "continuous")),
    _unary("cosh", np.cosh, flags=_TRANSCENDENTAL, facts=("nonneg", "continuous")),
    _unary("asinh", np.arcsinh, flags=_TRANSCENDENTAL, facts=("keeps_nonneg", "continuous")),
    _unary("acosh", np.arccosh, flags=_TRANSCENDENTAL, facts=("continuous",)),
    _unary("atanh", np.arctanh, flags=_TRANSCENDENTAL, facts=("continuous",)),
    # is_finite is no step: it moves only where a value crosses the dtype's largest finite value, the
    # contract's range edge (README), and the loss scale's overflow check of every gradient would pin it
    _unary("not", np.invert, lax.bitwise_not), _unary("is_finite", np.isfinite, flags=("bool_result",)),
    # jnp.sinc, one op (its named call): priced and rewritten whole; lowered as jnp.sinc, whose own
    # derivative rule (a Maclaurin series at 0) JAX applies
    Op("sinc", "unary", (), frozenset({"elementwise", "transcendental"}), (), None,
       numpy=lambda a, s, d, x: np.sinc(x), jax=lambda n, x: jnp.sinc(x), flops=_per_element, npu="vector",
       pallas="between", facts=frozenset({"continuous"}), named_call="sinc"),
    _unary("square", lambda x: x * x, facts=("nonneg", "keeps_integral", "continuous")),
    _unary("stop_gradient", lambda x: x, lax.stop_gradient, facts=("continuous",)),
    _unary("real", np.real, facts=("real_result",)),
    _unary("imag", np.imag, facts=("real_result",)),
    _unary("conj", np.conj),

    # ---- elementwise of two operands (a rank-0 operand broadcasts, as in jaxprs) ----
    _binary("add", np.add, facts=("keeps_nonneg", "keeps_integral", "continuous")),
    _binary("sub", np.subtract, facts=("keeps_integral", "continuous")),
    _binary("mul", np.multiply, facts=("keeps_nonneg", "keeps_integral", "continuous")),
    _binary("div", _div, facts=("continuous",)),
    _binary("rem", _rem, flags=_STEP),
    _binary("pow", np.power, flags=_TRANSCENDENTAL, facts=("continuous",)),
    _binary("max", np.maximum, facts=("keeps_integral", "continuous")),
    _binary("min", np.minimum, facts=("keeps_integral", "continuous")),
    _binary("atan2", np.arctan2, flags=_TRANSCENDENTAL, facts=("continuous",)),
    _binary("nextafter", np.nextafter, flags=("native",)),   # steps in the operand's own format
    _binary("eq", np.equal, flags=_COMPARE), _binary("ne", np.not_equal, flags=_COMPARE),
    _binary("lt", np.less, flags=_COMPARE), _binary("le", np.less_equal, flags=_COMPARE),
    _binary("gt", np.greater, flags=_COMPARE), _binary("ge", np.greater_equal, flags=_COMPARE),
    _binary("and", np.bitwise_and, lax.bitwise_and), _binary("or", np.bitwise_or, lax.bitwise_or),
    _binary("xor", np.bitwise_xor, lax.bitwise_xor), _binary("shift_left", _shift("left")),
    _binary("shift_right_logical", _shift("logical")), _binary("shift_right_arithmetic", _shift("arithmetic")),

    # ---- other elementwise ----
    _structural("integer_pow", ("y",), lambda a, s, d, x: _integer_pow(x, a[0]),
                lambda n, x: lax.integer_pow(x, n.attrs[0]), _integer_pow_flops, ("elementwise",), "vector", "body",
                facts=("continuous",)),
    # inputs (pred, on_false, on_true)
    # select and convert are charged by the bytes they move, not as arithmetic
    _structural("select", (), lambda a, s, d, p, f, t: np.where(p != 0, t, f),
                lambda n, p, f, t: lax.select_n(p, f, t), _none, ("elementwise",), "vector", "body"),
    # the target dtype is the node's dtype
    _structural("convert", (), lambda a, s, d, x: _convert(x, d),
                lambda n, x: lax.convert_element_type(x, np.dtype(n.dtype)), _none,
                ("elementwise", "movement", "step"), "vector", "body"),   # a step from float to int or bool only

    # ---- reductions ----
    # an explicit identity makes empty max/min reductions well defined; lax's and/or reductions are
    # bitwise on integers, logical on bool
    _reduce("reduce_sum", lambda x, axes: np.sum(x, axis=axes, dtype=x.dtype), lax.reduce_sum, _zero, "add",
            facts=("keeps_nonneg", "keeps_integral", "continuous")),
    _reduce("reduce_prod", lambda x, axes: np.prod(x, axis=axes, dtype=x.dtype), lax.reduce_prod, _one, "mul",
            facts=("keeps_nonneg", "keeps_integral", "continuous")),
    _reduce("reduce_max", lambda x, axes: np.max(x, axis=axes, initial=_lowest(x.dtype)), lax.reduce_max,
            _lowest, "max", facts=("keeps_integral", "continuous")),
    _reduce("reduce_min", lambda x, axes: np.min(x, axis=axes, initial=_lowest(x.dtype, True)), lax.reduce_min,
            lambda dt: _lowest(dt, True), "min", facts=("keeps_nonneg", "keeps_integral", "continuous")),
    _reduce("reduce_and", lambda x, axes: np.bitwise_and.reduce(x, axis=axes), lax.reduce_and, _all_ones, "and"),
    _reduce("reduce_or", lambda x, axes: np.bitwise_or.reduce(x, axis=axes), lax.reduce_or, _zero, "or"),
    _argreduce("argmax", np.argmax, lax.argmax), _argreduce("argmin", np.argmin, lax.argmin),
    _pool("reduce_window_max", lax.reduce_window_max_p, _lowest, "max", facts=("continuous",)),
    _pool("reduce_window_min", lax.reduce_window_min_p, lambda dt: _lowest(dt, True), "min", facts=("continuous",)),
    _pool("reduce_window_sum", lax.reduce_window_sum_p, _zero, "add", facts=("continuous",)),

    # ---- contractions ----
    # numpy matmul: equal batch dims, or a rank-2 rhs; accumulated in the node's dtype
    _structural("matmul", (), lambda a, s, d, x, y: _matmul(x, y, d), _lax_matmul, _matmul_flops,
                ("matrix",), "cube", "body"),
    # attrs: the sorted tuple of conv_general_dilated's params, every one as captured (lhs/rhs shapes,
    # precision, preferred_element_type...): grad and vmap need them
    _structural("conv", ("params",), lambda a, s, d, x, y: _conv(dict(a[0]), x, y, d),
                lambda n, lhs, rhs: lax.conv_general_dilated_p.bind(lhs, rhs, **dict(n.attrs[0])),
                _conv_flops, ("matrix",), "cube"),
    # ZZ-packed lhs x ZN-packed rhs -> NZ-packed result (core/formats.py)
    _structural("fractal_matmul", (), lambda a, s, d, x, y: _fractal_matmul(x, y, d), _lax_fractal_matmul,
                _fractal_matmul_flops, (), "cube"),

    # ---- data movement ----
    _structural("transpose", ("permutation",), lambda a, s, d, x: np.transpose(x, a[0]),
                lambda n, x: lax.transpose(x, n.attrs[0]), flags=("movement",), npu="vector", pallas="body"),
    # the target shape is the node's shape
    _structural("reshape", (), lambda a, s, d, x: np.reshape(x, s), lambda n, x: lax.reshape(x, n.shape),
                flags=("view", "free", "movement"), npu="view", pallas="body"),
    _structural("broadcast", ("broadcast_dimensions",), lambda a, s, d, x: _broadcast(x, s, a[0]),
                lambda n, x: lax.broadcast_in_dim(x, n.shape, n.attrs[0]), flags=("movement",), npu="vector",
                pallas="body"),
    _structural("concat", ("dimension",), lambda a, s, d, *xs: np.concatenate(xs, axis=a[0]),
                lambda n, *xs: lax.concatenate(xs, n.attrs[0])),
    _structural("slice", ("start", "limit", "strides"),
                lambda a, s, d, x: x[tuple(slice(b, e, k) for b, e, k in zip(*a))],
                lambda n, x: lax.slice(x, *n.attrs)),
    # inputs (x, padding_value)
    _structural("pad", ("low", "high", "interior"), lambda a, s, d, x, v: _pad(x, v, *a),
                lambda n, x, v: lax.pad(x, v, tuple(zip(*n.attrs)))),
    # a packed layout (core/formats.py); unpack's logical shape is the node's shape
    _structural("pack", ("format",), lambda a, s, d, x: pack_np(x, a[0]), _lax_pack,
                flags=("movement", "layout"), npu="format"),
    _structural("unpack", ("format",), lambda a, s, d, x: unpack_np(x, a[0], s), _lax_unpack,
                flags=("movement", "layout"), npu="format"),

    # ---- cumulative ops along one axis ----
    _scan("cumsum", lambda x, axis: np.cumsum(x, axis=axis, dtype=x.dtype), lax.cumsum, facts=("continuous",)),
    _scan("cumprod", lambda x, axis: np.cumprod(x, axis=axis, dtype=x.dtype), lax.cumprod, facts=("continuous",)),
    _scan("cummax", lambda x, axis: np.maximum.accumulate(x, axis=axis), lax.cummax, facts=("continuous",)),
    # NaN propagates,
    _scan("cummin", lambda x, axis: np.minimum.accumulate(x, axis=axis), lax.cummin, facts=("continuous",)),
    _scan("cumlogsumexp", lambda x, axis: np.logaddexp.accumulate(x, axis=axis), lax.cumlogsumexp,
          flags=_TRANSCENDENTAL, facts=("continuous",)),
]

OPS: dict[str, Op] = {op.name: op for op in _ENTRIES}
assert len(OPS) == len(_ENTRIES), "an op is declared twice"
assert all(op.facts <= FACTS for op in OPS.values()), "an op states a fact FACTS does not declare"
assert all(op.identity is not None and op.combine is not None for op in OPS.values()
           if op.family in ("reduce", "pool")), "a reduction without its identity and combine"


def family(name: str) -> frozenset:
    return frozenset(op.name for op in OPS.values() if op.family == name)


def knowing(fact: str, *families: str) -> tuple[str, ...]:
    """The ops (of `families`, where given) the table says `fact` of, in table order."""
    assert fact in FACTS, fact
    return tuple(op.name for op in OPS.values() if fact in op.facts and (not families or op.family in families))


def flagged(flag: str) -> frozenset:
    assert flag in FLAGS, flag
    return frozenset(op.name for op in OPS.values() if flag in op.flags)


def on_pallas(place: str) -> frozenset:
    assert place in PALLAS_PLACES, place
    return frozenset(op.name for op in OPS.values() if op.pallas == place)


def on_npu(place: str) -> frozenset:
    assert place in NPU_PLACES, place
    return frozenset(op.name for op in OPS.values() if op.npu == place)


def lookup(name: str) -> Op:
    """The op's entry, or an error naming it."""
    op = OPS.get(name)
    if op is None:
        raise NotImplementedError(f"superopt: unknown op {name!r} (not in the op table, superopt/core/ops.py)")
    return op


UNARY_OPS = family("unary")
BINARY_OPS = family("binary")
REDUCTIONS = family("reduce")
ARG_REDUCTIONS = family("argreduce")
WINDOW_REDUCTIONS = family("pool")
SCANS = family("scan")
STRUCTURAL_OPS = family("structural")
ALL_OPS = frozenset(OPS)
COMPARISONS = BINARY_OPS & flagged("bool_result")
ELEMENTWISE = flagged("elementwise")
TRANSCENDENTAL = flagged("transcendental")
MATRIX_OPS = flagged("matrix")
FREE = flagged("free")
MOVEMENT = flagged("movement")
LAYOUT_OPS = flagged("layout")
CONST_LEAVES = flagged("const_leaf")
NEVER_HOISTED = frozenset({"arg", "opaque"})
