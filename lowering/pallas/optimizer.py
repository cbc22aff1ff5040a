"""Template: a fused optimizer update, sibling elementwise kernels as one launch with one output each.

An optimizer step updates each parameter and its moment buffers from the same gradient: in the term
these are separate elementwise kernels of one shape that read the same tensors (the gradient, the
global-norm clip factor, the step count). Run apart, each reads the gradient again; here they are one
pallas_call whose outputs are the new parameter and moments, and whose blocks are the same tiles of
each (`elementwise.py`'s plan, with the outputs' axes tied). Any such siblings are grouped, not only
an optimizer's: kernels of the same output shape sharing an operand of that shape.

A group runs where its last member stood, so it is only formed when nothing reads a member before
then (which also rules out a member reading another).
"""
from __future__ import annotations

from superopt.egraph.ir import REDUCTIONS, Graph, Node
from superopt.lowering.pallas.labels import ELEMENTWISE, MATRIX


def _elementwise(node: Node) -> bool:
    if not node.shape:
        return False
    if node.op == "kernel":
        return not any(n.op in MATRIX or n.op in REDUCTIONS for n in node.attrs[0])
    return node.op in ELEMENTWISE


def update_groups(graph: Graph, skip: set) -> list[list[int]]:
    """Groups (graph node ids, in program order) of sibling elementwise kernels to run as one launch."""
    live = graph.live()
    pos = {i: n for n, i in enumerate(live)}
    users: dict = {}
    for i in live:
        for j in graph.nodes[i].inputs:
            users.setdefault(j, []).append(i)
    candidates = [i for i in live if i not in skip and _elementwise(graph.nodes[i])]
    parent = {i: i for i in candidates}

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    readers: dict = {}
    for i in candidates:
        node = graph.nodes[i]
        for j in set(node.inputs):
            if graph.nodes[j].shape == node.shape and j not in skip:
                readers.setdefault(j, []).append(i)
    for same in readers.values():
        for i in same[1:]:
            parent[find(i)] = find(same[0])
    components: dict = {}
    for i in candidates:
        components.setdefault(find(i), []).append(i)
    groups = []
    for members in components.values():
        current: list = []
        for i in sorted(members, key=pos.get):
            trial = current + [i]
            if all(pos[u] > pos[i] for m in trial for u in users.get(m, ())):
                current = trial
            else:
                if len(current) > 1:
                    groups.append(current)
                current = [i]
        if len(current) > 1:
            groups.append(current)
    return sorted(groups, key=lambda g: pos[g[-1]])


def merged_body(graph: Graph, group: list[int], body_of) -> tuple[tuple, tuple, list[int]]:
    """(one body computing every member, its roots, the graph nodes it loads): `arg` k of the merged body
    is the k-th loaded node; `body_of(i)` is member i's own body."""
    loads: list[int] = []
    nodes: list[Node] = []
    roots = []
    for i in group:
        offset = len(nodes)
        inputs = graph.nodes[i].inputs
        for n in body_of(i):
            if n.op == "arg":
                j = inputs[n.attrs[0]]
                if j not in loads:
                    loads.append(j)
                nodes.append(Node("arg", (), (loads.index(j),), n.shape, n.dtype))
            else:
                nodes.append(Node(n.op, tuple(k + offset for k in n.inputs), n.attrs, n.shape, n.dtype))
        roots.append(len(nodes) - 1)
    return tuple(nodes), tuple(roots), loads
