"""A pure-numpy reference evaluator for the IR: the checker's ground truth for rule soundness.

Each op's semantics is its op table entry's `numpy` function (core/ops.py), written to be obviously
right rather than fast, with the semantics of the lax primitive of the same name (where lax and numpy
differ, lax wins; the table's module doc lists where).

Dtypes: float16 computes natively in numpy, which rounds every op to float16. bfloat16 (and the
float8 types) have no numpy arithmetic of their own worth trusting, so their inputs are widened to
float32 and each op's result is rounded back to the node's dtype, once per op. Every result is cast
to exactly the node's dtype.
"""
from __future__ import annotations

import ml_dtypes  # also makes np.dtype('bfloat16') resolve
import numpy as np

from superopt.core.dtypes import is_float
from superopt.core.ir import Graph
from superopt.core.ops import lookup

_WIDEN = {np.dtype(getattr(ml_dtypes, n)) for n in ("bfloat16", "float8_e4m3fn", "float8_e5m2")}


def evaluate_node(op: str, attrs: tuple, inputs, shape: tuple, dtype) -> np.ndarray:
    """One op on numpy inputs; the result has exactly the node's shape and dtype."""
    with np.errstate(all="ignore"):  # NaN and Inf propagate silently, as in XLA
        return _node(op, attrs, inputs, shape, np.dtype(dtype))


def _node(op: str, attrs: tuple, inputs, shape: tuple, dt: np.dtype) -> np.ndarray:
    """`evaluate_node` under the caller's np.errstate, `dt` a numpy dtype (a graph walk sets both once)."""
    spec = lookup(op)
    fn = spec.numpy
    if fn is None:
        raise NotImplementedError(f"superopt: no reference evaluation for op {op!r} (the graph walk evaluates it)")
    ins = [np.asarray(x) for x in inputs]
    if "native" not in spec.flags:
        ins = [x.astype(np.float32) if x.dtype in _WIDEN else x for x in ins]
    out = np.asarray(fn(tuple(attrs), tuple(shape), dt, *ins)).astype(dt, copy=False)
    assert out.shape == tuple(shape), f"{op}: reference gave shape {out.shape}, node says {tuple(shape)}"
    return out


def evaluate(graph: Graph, args, precise: bool = False, round_args: bool = True) -> list[np.ndarray]:
    """Evaluate the live nodes in order; returns the outputs as numpy arrays.

    With `precise=True` every floating-point value is computed and kept in float64 (inputs are first
    rounded to their declared dtype): the program's value without its rounding errors, which
    verification measures both the original and an optimized program against. A kernel's body is
    evaluated with `round_args=False`: its inputs are values of the program, not rounded again."""
    with np.errstate(all="ignore"):  # NaN and Inf propagate silently, as in XLA
        return _walk(graph, args, precise, round_args)


def constant_values(graph: Graph, ids: list[int]) -> list[np.ndarray]:
    """The values of nodes `ids` of `graph` (a graph still being built, too) that are computed from its constants
    and literals alone, in their own dtypes."""
    probe = Graph(nodes=graph.nodes, outputs=list(ids), consts=graph.consts, opaque=graph.opaque)
    return [np.asarray(v) for v in evaluate(probe, ())]


def _walk(graph: Graph, args, precise: bool, round_args: bool) -> list[np.ndarray]:
    env: dict[int, np.ndarray] = {}
    opaque_results: dict[tuple, list] = {}
    dtypes: dict = {}

    def compute_dtype(dtype):
        if dtype not in dtypes:
            dtypes[dtype] = np.dtype(np.float64) if precise and is_float(dtype) else np.dtype(dtype)
        return dtypes[dtype]

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
            env[i] = _walk(Graph(nodes=list(body), outputs=[len(body) - 1]), ins, precise, False)[0]
        elif node.op == "opaque":
            key = (node.attrs[0], node.inputs)  # one bind per opaque equation, however many outputs
            if key not in opaque_results:
                op = graph.opaque[node.attrs[0]]
                declared = [x.astype(np.dtype(graph.nodes[j].dtype)) for x, j in zip(ins, node.inputs)]
                out = op.primitive.bind(*declared, **op.params, **({"effects": False} if op.effectful else {}))
                opaque_results[key] = list(out) if op.primitive.multiple_results else [out]
            env[i] = np.asarray(opaque_results[key][node.attrs[1]]).astype(compute_dtype(node.dtype))
        else:
            env[i] = _node(node.op, node.attrs, ins, node.shape, compute_dtype(node.dtype))
    return [env[o] for o in graph.results]
