"""Lowering to JAX: a table keyed by op; the whole graph composes into one `jax.jit` callable.

Every primitive is bound through the public lax function, or with all of its params, so JAX's JVP,
transpose and batching rules apply: jax.grad, jvp, vjp, jacrev and vmap of a lowered program work as they
do on the original. Pinned effects (debug prints) are bound in the graph's order and run once per call
(in that order where they are ordered effects; unordered ones as XLA schedules them, as under jax.jit),
unless `effects=False`; the graph's hidden outputs (their token) are not returned.

Sub-terms that depend only on constants are evaluated once, when the callable is built, and passed
to the jitted body as arguments (so packing or concatenating constant weights costs nothing per call).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from superopt.core.ir import BINARY_OPS, REDUCTIONS, UNARY_OPS, WINDOW_REDUCTIONS, Graph, Node
from superopt.core.formats import fractal_einsum, format_of

_UNARY_FN = {"not": lax.bitwise_not, "stop_gradient": lax.stop_gradient, "round": lax.round,
             "round_even": lambda x: lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN)}
_BINARY_FN = {"and": lax.bitwise_and, "or": lax.bitwise_or, "xor": lax.bitwise_xor}
# The public functions, not `primitive.bind`: they supply every param (reduce_sum's out_sharding) that the
# primitives' transpose and batching rules need, so grad and vmap of a lowered program work.
_REDUCE_FN = {"reduce_sum": lax.reduce_sum, "reduce_max": lax.reduce_max, "reduce_min": lax.reduce_min,
              "reduce_prod": lax.reduce_prod, "reduce_and": lax.reduce_and, "reduce_or": lax.reduce_or}


def _matmul(node: Node, a, b):
    ra, rb = a.ndim, b.ndim
    if rb == 2:
        dims = (((ra - 1,), (0,)), ((), ()))
    else:
        batch = tuple(range(ra - 2))
        dims = (((ra - 1,), (rb - 2,)), (batch, batch))
    return lax.dot_general(a, b, dims, preferred_element_type=np.dtype(node.dtype))


def _pool(node: Node, x):
    """A window reduction, bound with every param its primitive has (as `lax.reduce_window` binds it): the
    primitive's JVP, transpose and batching rules read them all."""
    window, strides, low, high = node.attrs
    primitive = {"reduce_window_max": lax.reduce_window_max_p, "reduce_window_min": lax.reduce_window_min_p,
                 "reduce_window_sum": lax.reduce_window_sum_p}[node.op]
    ones = (1,) * len(window)
    return primitive.bind(x, window_dimensions=window, window_strides=strides, padding=tuple(zip(low, high)),
                          base_dilation=ones, window_dilation=ones)


def _reduce(node: Node, x):
    return _REDUCE_FN[node.op](x, tuple(node.attrs[0]))


def _pack(node: Node, x):
    """pad with zeros to whole blocks, split the blocked axes, transpose (superopt/core/formats.py)."""
    f = format_of(node.attrs[0])
    padded = f.padded_shape(x.shape)
    x = lax.pad(x, np.zeros((), x.dtype), tuple((0, p - n, 0) for n, p in zip(x.shape, padded)))
    return lax.transpose(lax.reshape(x, tuple(f.split_dims(list(padded), lambda n, b: n // b))), f.full_perm(x.ndim))


def _unpack(node: Node, y):
    """The inverse transpose, merge the split axes, drop the padding."""
    f = format_of(node.attrs[0])
    perm = f.full_perm(len(node.shape))
    padded = f.padded_shape(node.shape)
    x = lax.reshape(lax.transpose(y, tuple(int(i) for i in np.argsort(perm))), padded)
    return lax.slice(x, (0,) * len(padded), node.shape)


def _fractal_matmul(node: Node, a, b):
    return jnp.einsum(fractal_einsum(b.ndim > 4), a, b, preferred_element_type=np.dtype(node.dtype))


_LOWER: dict[str, Callable] = {
    "integer_pow": lambda n, x: lax.integer_pow(x, n.attrs[0]),
    "select": lambda n, p, f, t: lax.select_n(p, f, t),
    "matmul": _matmul,
    # every param as captured (lhs/rhs shapes, precision, preferred_element_type...): grad and vmap need them
    "conv": lambda n, lhs, rhs: lax.conv_general_dilated_p.bind(lhs, rhs, **dict(n.attrs[0])),
    "transpose": lambda n, x: lax.transpose(x, n.attrs[0]),
    "reshape": lambda n, x: lax.reshape(x, n.shape),
    "broadcast": lambda n, x: lax.broadcast_in_dim(x, n.shape, n.attrs[0]),
    "convert": lambda n, x: lax.convert_element_type(x, np.dtype(n.dtype)),
    "concat": lambda n, *xs: lax.concatenate(xs, n.attrs[0]),
    "slice": lambda n, x: lax.slice(x, *n.attrs),
    "pad": lambda n, x, v: lax.pad(x, v, tuple(zip(*n.attrs))),
    "pack": _pack,
    "unpack": _unpack,
    "fractal_matmul": _fractal_matmul,
    "iota": lambda n: lax.broadcasted_iota(np.dtype(n.dtype), n.shape, n.attrs[0]),
    "argmax": lambda n, x: lax.argmax(x, n.attrs[0], np.dtype(n.dtype)),
    "argmin": lambda n, x: lax.argmin(x, n.attrs[0], np.dtype(n.dtype)),
    **{op: _reduce for op in REDUCTIONS},
    **{op: _pool for op in WINDOW_REDUCTIONS},
    **{op: (lambda fn: lambda n, x: fn(x))(_UNARY_FN.get(op) or getattr(lax, op)) for op in UNARY_OPS
       if op in _UNARY_FN or hasattr(lax, op)},
    **{op: (lambda fn: lambda n, x, y: fn(x, y))(_BINARY_FN.get(op) or getattr(lax, op)) for op in BINARY_OPS
       if op in _BINARY_FN or hasattr(lax, op)},
}


def evaluate(graph: Graph, args, values: dict[int, object] | None = None, only=None,
             effects: bool = True) -> dict[int, object]:
    """Evaluate the live nodes (or the ids in `only`) in order; `values` holds already-known nodes. With
    `effects=False` pinned effects (debug prints) do not run: superopt's own runs on its own inputs."""
    env = dict(values or {})
    opaque_results: dict[tuple, list] = {}
    for i in (only if only is not None else graph.live()):
        if i in env:
            continue
        node = graph.nodes[i]
        ins = [env[j] for j in node.inputs]
        if node.op == "arg":
            env[i] = args[node.attrs[0]]
        elif node.op == "const":
            env[i] = graph.consts[node.attrs[0]]
        elif node.op == "lit":
            env[i] = np.asarray(node.attrs[0], dtype=np.dtype(node.dtype))
        elif node.op == "kernel":  # one launch; in JAX its body is traced inline and XLA fuses it
            body = node.attrs[0]
            env[i] = evaluate(Graph(nodes=list(body), outputs=[len(body) - 1]), ins)[len(body) - 1]
        elif node.op == "opaque":
            key = (node.attrs[0], node.inputs)  # one bind per opaque equation, however many outputs
            if key not in opaque_results:
                op = graph.opaque[node.attrs[0]]
                out = op.primitive.bind(*ins, **op.params, **({"effects": effects} if op.effectful else {}))
                opaque_results[key] = list(out) if op.primitive.multiple_results else [out]
            env[i] = opaque_results[key][node.attrs[1]]
        else:
            lower = _LOWER.get(node.op)
            if lower is None:
                raise NotImplementedError(f"superopt: no JAX lowering for op {node.op!r} (target cpu)")
            env[i] = lower(node, *ins)
    return env


def lower(graph: Graph, effects: bool = True) -> Callable:
    """A jitted callable of the flat arguments returning fn's flat results (a list; hidden outputs left
    out). With `effects=False` the program's pinned effects (debug prints) do not run."""
    const_ids = graph.constant_nodes()
    # Constant nodes that feed computed nodes (or are outputs) are materialised once, here.
    needed = sorted({j for i in graph.live() if i not in const_ids for j in graph.nodes[i].inputs if j in const_ids}
                    | {o for o in graph.outputs if o in const_ids})
    heavy = [i for i in needed if graph.nodes[i].op != "lit"]
    const_order = [i for i in graph.live() if i in const_ids]
    consts_env = jax.jit(lambda: [evaluate(graph, (), only=const_order)[i] for i in heavy])() if heavy else []
    hoisted = dict(zip(heavy, consts_env))
    rest = [i for i in graph.live() if i not in const_ids or i in needed]

    @jax.jit
    def run(flat_args, hoisted_values):
        env = evaluate(graph, flat_args, dict(zip(heavy, hoisted_values)), only=rest, effects=effects)
        return [env[o] for o in graph.results]

    hoisted_values = [hoisted[i] for i in heavy]
    return lambda *flat_args: run(list(flat_args), hoisted_values)
