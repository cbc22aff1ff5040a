"""Encode a `Graph` into an egglog e-graph (one `let` per op, so depth never recurses), and decode
chosen e-nodes back into IR nodes. The two tables below mirror each other, keyed by op and by egglog
function name; a missing entry is an error naming the op.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from egglog import EGraph, String, i64, set_

from superopt.egraph import terms as T
from superopt.egraph.analysis import facts
from superopt.egraph.ir import ARG_REDUCTIONS, BINARY_OPS, REDUCTIONS, UNARY_OPS, WINDOW_REDUCTIONS, Graph, Node

_BATCH = 256  # actions registered per call: fewer FFI round trips, no deep expressions


@dataclass
class Encoding:
    egraph: EGraph
    graph: Graph
    conv_params: list = field(default_factory=list)

    def intern_conv(self, params) -> int:
        if params not in self.conv_params:
            self.conv_params.append(params)
            index = len(self.conv_params) - 1
            if channels_last(params):
                self.egraph.register(T.conv_channels_last(i64(index)))
            twin = int32_twin(params)
            if twin is not None:     # the same conv accumulating in int32, for quantization's int8 conv
                self.egraph.register(set_(T.conv_int32(i64(index))).to(i64(self.intern_conv(twin))))
        return self.conv_params.index(params)


def int32_twin(params) -> tuple | None:
    """`params` with preferred_element_type int32, for params that give the operands' dtype (none, or
    float32: the f32 conv of widened int8 operands); else None."""
    p = dict(params)
    if "preferred_element_type" not in p or \
            p["preferred_element_type"] is not None and np.dtype(p["preferred_element_type"]) != np.float32:
        return None
    return tuple((k, np.dtype("int32") if k == "preferred_element_type" else v) for k, v in params)


def channels_last(params) -> bool:
    """Whether a conv's output feature axis and its kernel's output feature axis are both the last one."""
    spec = dict(params)["dimension_numbers"]
    return spec.out_spec[1] == len(spec.out_spec) - 1 and spec.rhs_spec[0] == len(spec.rhs_spec) - 1


def _to_expr(enc: Encoding, node: Node, ins: list):
    op, a = node.op, node.attrs
    if op in UNARY_OPS:
        return T.unary(op, ins[0])
    if op in BINARY_OPS:
        return T.binary(op, ins[0], ins[1])
    if op in REDUCTIONS:
        return T.reduce(op, ins[0], T.ints(a[0]))
    if op in ARG_REDUCTIONS:
        return T.argreduce(op, ins[0], a[0], node.dtype)
    if op in WINDOW_REDUCTIONS:
        return T.pool(op, ins[0], *(T.ints(v) for v in a))
    build = {
        "arg": lambda: T.arg(a[0]),
        "const": lambda: T.const(a[0]),
        "lit": lambda: T.lit(float(a[0]), node.dtype),
        "iota": lambda: T.iota(a[0], T.ints(node.shape), node.dtype),
        "integer_pow": lambda: T.integer_pow(ins[0], a[0]),
        "select": lambda: T.select(*ins),
        "convert": lambda: T.convert(ins[0], node.dtype),
        "matmul": lambda: T.matmul(ins[0], ins[1], node.dtype),
        "conv": lambda: T.conv(ins[0], ins[1], enc.intern_conv(a[0])),
        "transpose": lambda: T.transpose(ins[0], T.ints(a[0])),
        "reshape": lambda: T.reshape(ins[0], T.ints(node.shape)),
        "broadcast": lambda: T.broadcast(ins[0], T.ints(node.shape), T.ints(a[0])),
        "concat": lambda: T.concat(T.tlist(ins), a[0]),
        "slice": lambda: T.slice_(ins[0], *(T.ints(v) for v in a)),
        "pad": lambda: T.pad(ins[0], ins[1], *(T.ints(v) for v in a)),
        "pack": lambda: T.pack(ins[0], a[0]),
        "unpack": lambda: T.unpack(ins[0], a[0], T.ints(node.shape)),
        "fractal_matmul": lambda: T.fractal_matmul(ins[0], ins[1], node.dtype),
        "opaque": lambda: T.opaque(a[0], a[1], T.tlist(ins)),
    }.get(op)
    if build is None:
        raise NotImplementedError(f"superopt: no egglog encoding for op {op!r}")
    return build()


def encode(graph: Graph) -> Encoding:
    """Insert every live node of `graph` into a fresh e-graph with its shape and dtype."""
    enc = Encoding(EGraph(), graph)
    eg = enc.egraph
    eg.register(*facts())
    exprs: dict[int, Any] = {}
    pending = []
    for i in graph.live():
        node = graph.nodes[i]
        exprs[i] = eg.let(f"n{i}", _to_expr(enc, node, [exprs[j] for j in node.inputs]))
        pending += [set_(T.shape(exprs[i])).to(T.ints(node.shape)), set_(T.dtype(exprs[i])).to(String(node.dtype))]
        if len(pending) >= _BATCH:
            eg.register(*pending)
            pending = []
    pending += [T.output(k, exprs[o]) for k, o in enumerate(graph.outputs)]
    if pending:  # a program with no outputs has nothing to register
        eg.register(*pending)
    return enc


# ---- decoding: egglog function name + decoded arguments -> (op, attrs) of an IR node ----

def _lit_value(value: float, dtype: str):
    if dtype == "bool":
        return bool(value)
    if dtype.startswith(("int", "uint")):
        return int(value)
    return float(value)


def decode(fn: str, args: tuple, children: tuple, enc: Encoding) -> tuple[str, tuple]:
    """(op, attrs) for an e-node; `args` are its decoded primitive arguments in order."""
    if fn in ("unary", "binary"):
        return args[0], ()
    table = {
        "arg": lambda: ("arg", (args[0],)),
        "const": lambda: ("const", (args[0],)),
        "lit": lambda: ("lit", (_lit_value(args[0], args[1]),)),
        "iota": lambda: ("iota", (args[0],)),
        "integer_pow": lambda: ("integer_pow", (args[0],)),
        "select": lambda: ("select", ()),
        "convert": lambda: ("convert", ()),
        "matmul": lambda: ("matmul", ()),
        "conv": lambda: ("conv", (enc.conv_params[args[0]],)),
        "reduce": lambda: (args[0], (tuple(args[1]),)),
        "argreduce": lambda: (args[0], (args[1],)),
        "pool": lambda: (args[0], tuple(tuple(v) for v in args[1:])),
        "transpose": lambda: ("transpose", (tuple(args[0]),)),
        "reshape": lambda: ("reshape", ()),
        "broadcast": lambda: ("broadcast", (tuple(args[1]),)),
        "concat": lambda: ("concat", (args[0],)),
        "slice": lambda: ("slice", tuple(tuple(v) for v in args)),
        "pad": lambda: ("pad", tuple(tuple(v) for v in args)),
        "pack": lambda: ("pack", (args[0],)),
        "unpack": lambda: ("unpack", (args[0],)),
        "fractal_matmul": lambda: ("fractal_matmul", ()),
        "opaque": lambda: ("opaque", (args[0], args[1])),
        "kernel": lambda: ("kernel", args),  # a concrete body chosen by extract/kernels.py
    }
    if fn not in table:
        raise NotImplementedError(f"superopt: no decoding for egglog function {fn!r}")
    return table[fn]()
