"""Template: a fused optimizer update, sibling elementwise kernels as one launch with one output each.

An optimizer step updates each parameter and its moment buffers from the same gradient: in the term
these are separate elementwise kernels of one shape that read the same tensors (the gradient, the
global-norm clip factor, the step count). Run apart, each reads the gradient again; here they are one
pallas_call whose outputs are the new parameter and moments, and whose blocks are the same tiles of
each (`elementwise.py`'s plan, with the outputs' axes tied). Any such siblings are grouped, not only
an optimizer's: kernels of the same output shape sharing an operand of that shape.

The grouping itself (`egraph/siblings.py`) is shared with the NPU lowering.
"""
from __future__ import annotations

from superopt.core.ir import Graph, Node

from superopt.core.ops import REDUCTIONS
from superopt.egraph.siblings import sibling_groups
from superopt.lowering.pallas.labels import ELEMENTWISE, MATRIX


def _elementwise(node: Node) -> bool:
    if not node.shape:
        return False
    if node.op == "kernel":
        return not any(n.op in MATRIX or n.op in REDUCTIONS for n in node.attrs[0])
    return node.op in ELEMENTWISE


def update_groups(graph: Graph, skip: set) -> list[list[int]]:
    """Groups (graph node ids, in program order) of sibling elementwise kernels to run as one launch:
    linked by an operand of their own shape."""
    return sibling_groups(graph, skip, _elementwise, lambda operand, reader: operand.shape == reader.shape)
