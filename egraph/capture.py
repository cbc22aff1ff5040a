"""Capture: a Python function and example arguments -> a `Graph` built from its jaxpr.

Each primitive has an entry in `_HANDLERS`; `jit`, `custom_jvp_call` and `custom_vjp_call` are walked
into (their primal bodies), and any primitive without an entry becomes an `opaque` node that lowering
binds again with its original params, so every JAX program goes through unchanged in meaning.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import jax
import numpy as np
from jax.extend import core as jcore

from superopt.egraph.ir import (
    ARG_REDUCTIONS, BINARY_OPS, COMPARISONS, REDUCTIONS, UNARY_OPS, WINDOW_REDUCTIONS, Graph, Node, Opaque,
)

# Primitives whose body is walked instead of being kept whole, with the param holding the body.
_CALL_BODIES = {"jit": "jaxpr", "pjit": "jaxpr", "custom_jvp_call": "call_jaxpr",
                "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
                "closed_call": "call_jaxpr", "core_call": "call_jaxpr"}
# Primitives that return their operand unchanged.
_IDENTITIES = frozenset({"copy", "copy_p", "optimization_barrier_identity"})


@dataclass
class Captured:
    graph: Graph
    in_tree: Any
    out_tree: Any
    in_avals: tuple  # (shape, dtype) per flat argument


def dtype_name(dtype) -> str:
    return str(np.dtype(dtype))


class _Builder:
    def __init__(self) -> None:
        self.graph = Graph()
        self.const_ids: dict[int, int] = {}

    def node(self, op: str, inputs, attrs, aval_or_shape, dtype=None) -> int:
        if dtype is None:
            shape, dtype = tuple(aval_or_shape.shape), dtype_name(aval_or_shape.dtype)
        else:
            shape, dtype = tuple(aval_or_shape), dtype_name(dtype)
        return self.graph.add(Node(op, tuple(inputs), tuple(attrs), shape, dtype))

    def const(self, value, dtype=None) -> int:
        arr = np.asarray(value, dtype=dtype)
        if arr.ndim == 0 and arr.dtype.kind in "fiub":
            if arr.dtype.kind == "f" and arr == 0 and np.signbit(arr):
                # egglog's f64 holds -0.0 and 0.0 as one value, so the literal -0.0 would merge with 0.0
                # (x * -0.0 and x * 0.0 would become one term): it enters the e-graph as neg(0.0)
                return self.node("neg", (self.node("lit", (), (0.0,), (), arr.dtype),), (), (), arr.dtype)
            return self.node("lit", (), (arr.item(),), (), arr.dtype)
        key = id(value)
        if key not in self.const_ids:
            self.graph.consts.append(arr)
            self.const_ids[key] = self.node("const", (), (len(self.graph.consts) - 1,), arr.shape, arr.dtype)
        return self.const_ids[key]

    def walk(self, jaxpr, consts, in_ids: list[int]) -> list[int]:
        env: dict[Any, int] = {}

        def read(v) -> int:
            if isinstance(v, jcore.Literal):
                return self.const(v.val, v.aval.dtype)
            return env[v]

        for var, value in zip(jaxpr.constvars, consts):
            env[var] = self.const(value)
        for var, i in zip(jaxpr.invars, in_ids):
            env[var] = i
        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            outs = self.equation(eqn, ins)
            for var, i in zip(eqn.outvars, outs):
                env[var] = i
        return [read(v) for v in jaxpr.outvars]

    def equation(self, eqn, ins: list[int]) -> list[int]:
        name = eqn.primitive.name
        if name in _CALL_BODIES:
            body = eqn.params.get(_CALL_BODIES[name])
            if body is not None:
                closed = body if hasattr(body, "jaxpr") else jcore.ClosedJaxpr(body, ())
                return self.walk(closed.jaxpr, closed.consts, ins)
        if name in _IDENTITIES and len(ins) == 1:
            return ins
        handler = _HANDLERS.get(name)
        if handler is not None:
            result = handler(self, eqn, ins)
            if result is not None:
                return [result]
        return self.opaque(eqn, ins)

    def opaque(self, eqn, ins: list[int]) -> list[int]:
        self.graph.opaque.append(Opaque(eqn.primitive, dict(eqn.params), len(eqn.outvars)))
        k = len(self.graph.opaque) - 1
        return [self.node("opaque", ins, (k, j), v.aval) for j, v in enumerate(eqn.outvars)]


# ---- handlers: one per primitive family; each returns the new node id, or None to go opaque ----

def _out(eqn):
    return eqn.outvars[0].aval


def _elementwise(b, eqn, ins):
    if any(v is not None for v in eqn.params.values()):
        return None  # e.g. round's rounding_method, an accuracy request: keep the primitive whole
    return b.node(eqn.primitive.name, ins, (), _out(eqn))


def _round(b, eqn, ins):
    """lax.round: half away from zero is `round`, half to even (jnp.round's) is `round_even`."""
    method = int(eqn.params.get("rounding_method", 0))
    return b.node("round_even" if method == 1 else "round", ins, (), _out(eqn)) if method in (0, 1) else None


def _integer_pow(b, eqn, ins):
    return b.node("integer_pow", ins, (int(eqn.params["y"]),), _out(eqn))


def _select_n(b, eqn, ins):
    if len(ins) != 3:
        return None
    return b.node("select", ins, (), _out(eqn))


def _reduce(b, eqn, ins):
    return b.node(eqn.primitive.name, ins, (tuple(sorted(int(a) for a in eqn.params["axes"])),), _out(eqn))


def _arg_reduce(b, eqn, ins):
    axes = tuple(eqn.params["axes"])
    if len(axes) != 1:
        return None
    return b.node(eqn.primitive.name, ins, (int(axes[0]),), _out(eqn))


def _transpose(b, eqn, ins):
    return b.node("transpose", ins, (tuple(int(p) for p in eqn.params["permutation"]),), _out(eqn))


def _reshape(b, eqn, ins):
    if eqn.params.get("dimensions") is not None:
        return None
    return b.node("reshape", ins, (), _out(eqn))


def _squeeze(b, eqn, ins):
    return b.node("reshape", ins, (), _out(eqn))


def _broadcast(b, eqn, ins):
    if len(ins) != 1:  # dynamic shapes
        return None
    return b.node("broadcast", ins, (tuple(int(d) for d in eqn.params["broadcast_dimensions"]),), _out(eqn))


def _convert(b, eqn, ins):
    src = b.graph.nodes[ins[0]]
    if src.dtype == dtype_name(_out(eqn).dtype):
        return ins[0]  # a weak-type change only
    return b.node("convert", ins, (), _out(eqn))


def _concat(b, eqn, ins):
    return b.node("concat", ins, (int(eqn.params["dimension"]),), _out(eqn))


def _stack(b, eqn, ins):
    """stack = each operand with a unit axis inserted, concatenated along it."""
    axis, out = int(eqn.params["axis"]), _out(eqn)
    unit = [b.node("reshape", (i,), (), out.shape[:axis] + (1,) + out.shape[axis + 1:], out.dtype) for i in ins]
    return b.node("concat", unit, (axis,), out)


def _add_any(b, eqn, ins):
    """add_any (autodiff's sum of cotangents) is an elementwise add."""
    return b.node("add", ins, (), _out(eqn))


def _slice(b, eqn, ins):
    start = tuple(int(s) for s in eqn.params["start_indices"])
    strides = eqn.params.get("strides") or (1,) * len(start)
    limit = tuple(int(s) for s in eqn.params["limit_indices"])
    return b.node("slice", ins, (start, limit, tuple(int(s) for s in strides)), _out(eqn))


def _pad(b, eqn, ins):
    config = eqn.params["padding_config"]
    lo, hi, interior = (tuple(int(c[k]) for c in config) for k in range(3))
    return b.node("pad", ins, (lo, hi, interior), _out(eqn))


def _iota(b, eqn, ins):
    if ins:
        return None
    return b.node("iota", (), (int(eqn.params["dimension"]),), _out(eqn))


def _pool(b, eqn, ins):
    p = eqn.params
    if any(d != 1 for d in (*p["base_dilation"], *p["window_dilation"])):
        return None
    low, high = (tuple(int(pad[k]) for pad in p["padding"]) for k in (0, 1))
    attrs = (tuple(p["window_dimensions"]), tuple(p["window_strides"]), low, high)
    return b.node(eqn.primitive.name, ins, attrs, _out(eqn))


def _conv(b, eqn, ins):
    params = tuple(sorted(eqn.params.items()))
    try:
        hash(params)
    except TypeError:
        return None
    return b.node("conv", ins, (params,), _out(eqn))


def _dot_general(b, eqn, ins):
    """dot_general in canonical form: transposes and reshapes around one batched `matmul`."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lc, rc, lb, rb = (tuple(int(d) for d in x) for x in (lc, rc, lb, rb))
    lhs, rhs = (b.graph.nodes[i] for i in ins)
    out = _out(eqn)
    ls, rs = lhs.shape, rhs.shape
    if not lb and lc == (len(ls) - 1,) and len(ls) >= 2 and len(rs) == 2 and rc == (0,):
        return b.node("matmul", ins, (), out)  # x @ W: numpy matmul with a rank-2 rhs
    lf = tuple(d for d in range(len(ls)) if d not in lc and d not in lb)
    rf = tuple(d for d in range(len(rs)) if d not in rc and d not in rb)
    batch = tuple(ls[d] for d in lb)
    m, k, n = math.prod(ls[d] for d in lf), math.prod(ls[d] for d in lc), math.prod(rs[d] for d in rf)

    def arrange(i, shape, perm, target):
        node = b.graph.nodes[i]
        if perm != tuple(range(len(shape))):
            i = b.node("transpose", (i,), (perm,), tuple(shape[p] for p in perm), node.dtype)
        if tuple(b.graph.nodes[i].shape) != target:
            i = b.node("reshape", (i,), (), target, node.dtype)
        return i

    a = arrange(ins[0], ls, lb + lf + lc, batch + (m, k))
    c = arrange(ins[1], rs, rb + rc + rf, batch + (k, n))
    mm = b.node("matmul", (a, c), (), batch + (m, n), out.dtype)
    if batch + (m, n) != tuple(out.shape):
        mm = b.node("reshape", (mm,), (), out)
    return mm


_HANDLERS: dict[str, Callable] = {
    **{op: _elementwise for op in UNARY_OPS | BINARY_OPS | COMPARISONS},
    **{op: _reduce for op in REDUCTIONS},
    **{op: _arg_reduce for op in ARG_REDUCTIONS},
    **{op: _pool for op in WINDOW_REDUCTIONS},
    "round": _round, "integer_pow": _integer_pow, "select_n": _select_n, "transpose": _transpose, "reshape": _reshape,
    "squeeze": _squeeze, "broadcast_in_dim": _broadcast, "convert_element_type": _convert,
    "concatenate": _concat, "stack": _stack, "add_any": _add_any, "slice": _slice, "pad": _pad, "iota": _iota,
    "conv_general_dilated": _conv, "dot_general": _dot_general,
}


def _check_leaf(path, leaf) -> None:
    if isinstance(leaf, (jax.Array, np.ndarray, np.generic, int, float, bool, complex)):
        return
    raise TypeError(
        f"superopt: argument {jax.tree_util.keystr(path) or '(root)'} is a {type(leaf).__name__}, "
        "not an array; pass arrays (or pytrees of arrays) and close over everything else")


def capture(fn: Callable, args: tuple) -> Captured:
    """Trace `fn(*args)` to a jaxpr and walk it into a Graph (outputs flattened, as the jaxpr has them)."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(args)[0]:
        _check_leaf(path, leaf)
    flat, in_tree = jax.tree_util.tree_flatten(args)
    out_tree_box = []

    def flat_fn(*flat_args):
        out = fn(*jax.tree_util.tree_unflatten(in_tree, flat_args))
        leaves, tree = jax.tree_util.tree_flatten(out)
        out_tree_box.append(tree)
        return leaves

    closed = jax.make_jaxpr(flat_fn)(*flat)
    builder = _Builder()
    in_avals = tuple((tuple(v.aval.shape), dtype_name(v.aval.dtype)) for v in closed.jaxpr.invars)
    arg_ids = [builder.node("arg", (), (i,), v.aval) for i, v in enumerate(closed.jaxpr.invars)]
    builder.graph.n_args = len(arg_ids)
    builder.graph.outputs = builder.walk(closed.jaxpr, closed.consts, arg_ids)
    return Captured(builder.graph, in_tree, out_tree_box[-1], in_avals)
