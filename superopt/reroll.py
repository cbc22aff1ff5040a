"""Loop re-rolling: a Python loop over a tensor's rows, unrolled by tracing and stacked back, becomes one
computation over the whole tensor.

`jnp.stack([f(a[i], v[i], w) for i in range(n)])` traces to n copies of f's ops, each reading row i of
`a` and `v` (a unit slice and a reshape) and the whole of `w`; the copies are stacked. Here the copies are
recognised as one template (`_Shapes`: the same ops with the same attributes on the same shapes, the same
shared values, and the row read by copy k being k plus a fixed offset, along the same axis of the same
tensor), and the stack is replaced by the template batched over those axes: `jax.vmap` of the template,
captured again. What comes back is the term language's own ops on whole tensors (an elementwise op on the
matrix, a reduction over its rows), so the rest of the pipeline, the e-graph included, sees a program the
size of one copy instead of n.

Batching computes each element from the same operands with the same ops: elementwise results are equal;
a reduction over a row adds the same terms, in an order XLA chooses for the batched program as it does
for the copies (README.md, "Numerics contract"). The re-rolled program is verified against the original
like any other candidate, and it is only a candidate: the pipeline prices it against the program as traced.
"""
from __future__ import annotations

import jax

from superopt.core.ir import Graph, Node

MIN_COPIES = 4          # fewer copies than this are left as they are (nothing to gain from batching)


class _Mismatch(Exception):
    """The copies are not one template."""


class _Shapes:
    """Templates of a graph's nodes, interned: a node's template is an int naming its op, attributes, type
    and operand templates (an argument or constant: the node itself), where a row read (a unit slice of a
    tensor along one axis, `_row_axis`) stands for "a row of that tensor along that axis" whatever its
    index. Two nodes with one template and no row read compute the same value (a copy may recompute what
    does not depend on its rows). `reads[i]`: whether node i's value depends on a row read."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.table: dict = {}
        self.template: dict[int, int] = {}
        self.reads: dict[int, bool] = {}

    def of(self, root: int) -> int:
        """The template of node `root` (an explicit stack: any depth)."""
        stack = [root]
        while stack:
            i = stack[-1]
            if i in self.template:
                stack.pop()
                continue
            node = self.graph.nodes[i]
            todo = [j for j in node.inputs if j not in self.template]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            row = _row_axis(self.graph, i)
            if row is not None:
                key, reads = ("row", self.template[node.inputs[0]], row), True
            elif node.op in ("arg", "const"):
                key, reads = ("leaf", i), False
            else:
                reads = any(self.reads[j] for j in node.inputs)
                key = (node.op, node.attrs, node.shape, node.dtype, tuple(self.template[j] for j in node.inputs))
            self.template[i] = self.table.setdefault(key, len(self.table))
            self.reads[i] = reads
        return self.template[root]


def _row_axis(graph: Graph, i: int) -> int | None:
    """The axis along which node i reads one row of its operand (a unit slice, whole along every other
    axis, unstrided), or None."""
    node = graph.nodes[i]
    if node.op != "slice":
        return None
    start, limit, strides = node.attrs
    src = graph.nodes[node.inputs[0]].shape
    axes = [a for a in range(len(src)) if (start[a], limit[a]) != (0, src[a])]
    if len(axes) != 1 or any(s != 1 for s in strides) or limit[axes[0]] - start[axes[0]] != 1:
        return None
    return axes[0]


def _copies(graph: Graph, stack: int) -> list[int] | None:
    """The copies a concat stacks (each operand a reshape inserting the unit axis it joins them along), or
    None."""
    node = graph.nodes[stack]
    axis = node.attrs[0]
    copies = []
    for j in node.inputs:
        unit = graph.nodes[j]
        if unit.op != "reshape" or unit.shape[axis] != 1:
            return None
        inner = graph.nodes[unit.inputs[0]]
        if inner.shape != unit.shape[:axis] + unit.shape[axis + 1:]:
            return None
        copies.append(unit.inputs[0])
    return copies


def _paired(graph: Graph, shapes: _Shapes, first: int, other: int) -> dict[int, int]:
    """Each node of the first copy's template paired with the other copy's node in its place (the two
    have one template). Raises _Mismatch where one node of the first copy takes two places in the other."""
    pairs: dict[int, int] = {}
    stack = [(first, other)]
    while stack:
        i, j = stack.pop()
        if i in pairs:
            if pairs[i] != j:
                raise _Mismatch()
            continue
        pairs[i] = j
        if shapes.reads[i] and _row_axis(graph, i) is None:
            stack.extend(zip(graph.nodes[i].inputs, graph.nodes[j].inputs))
    return pairs


def _template(graph: Graph, shapes: _Shapes, copies: list[int]) -> tuple[list[int], dict[int, int | None]]:
    """(the first copy's nodes that depend on a row read, in program order; for each row read among them,
    the row the first copy reads where copy k reads that row plus k, or None where every copy reads the
    same row). Raises _Mismatch where the copies are not one template read at consecutive rows."""
    template = shapes.of(copies[0])
    if not shapes.reads[copies[0]] or any(shapes.of(c) != template for c in copies[1:]):
        raise _Mismatch()
    pairs = _paired(graph, shapes, copies[0], copies[0])
    rows = {i: graph.nodes[i].attrs[0][_row_axis(graph, i)] for i in pairs if _row_axis(graph, i) is not None}
    moving = {i: True for i in rows}
    fixed = {i: True for i in rows}
    for k, c in enumerate(copies[1:], 1):
        other = _paired(graph, shapes, copies[0], c)
        for i, r0 in rows.items():
            r = graph.nodes[other[i]].attrs[0][_row_axis(graph, i)]
            moving[i] = moving[i] and r == r0 + k
            fixed[i] = fixed[i] and r == r0
    if not all(moving[i] or fixed[i] for i in rows) or not any(moving[i] for i in rows) or \
            any(shapes.reads[graph.nodes[i].inputs[0]] for i in rows if moving[i]):
        raise _Mismatch()   # a row of a value each copy computes from its own rows: not one batched read
    nodes = sorted(i for i in pairs if shapes.reads[i])
    return nodes, {i: (r0 if moving[i] else None) for i, r0 in rows.items()}


def _batched(graph: Graph, shapes: _Shapes, copies: list[int], axis: int) -> tuple[Graph, list]:
    """(the copies' template batched, captured as a graph of its operands; the operands, each as (node of
    `graph`, (axis, start, count) of the slice to take of it first, or None)). A row that moves with the
    copy is an operand mapped over its axis (its tensor sliced to the copies' rows where they are not all
    of it); a shared value or a row every copy reads alike is an operand as it is."""
    from superopt.egraph.capture import capture
    from superopt.lowering.jax import evaluate
    nodes, rows = _template(graph, shapes, copies)
    n = len(copies)
    local, operands, in_axes, ids = Graph(), [], [], {}

    def operand(j: int, cut, row_axis) -> int:
        shape = graph.nodes[j].shape
        if row_axis is not None:
            shape = shape[:row_axis] + shape[row_axis + 1:]
        operands.append((j, cut))
        in_axes.append(row_axis)
        return local.add(Node("arg", (), (len(operands) - 1,), shape, graph.nodes[j].dtype))

    for i in nodes:
        node = graph.nodes[i]
        if rows.get(i) is not None:      # a row that moves with the copy
            src, row_axis = node.inputs[0], _row_axis(graph, i)
            whole = rows[i] == 0 and graph.nodes[src].shape[row_axis] == n
            a = operand(src, None if whole else (row_axis, rows[i], n), row_axis)
            ids[i] = local.add(Node("reshape", (a,), (), node.shape, node.dtype))
            continue
        if i in rows:                    # the same row in every copy: shared
            ids[i] = operand(i, None, None)
            continue
        for j in node.inputs:
            if j not in ids:
                ids[j] = operand(j, None, None)
        ids[i] = local.add(Node(node.op, tuple(ids[j] for j in node.inputs), node.attrs, node.shape, node.dtype))
    local.outputs = [ids[copies[0]]]
    local.n_args = len(operands)

    def one(*xs):
        return evaluate(local, xs)[local.outputs[0]]

    def aval(j: int, cut) -> jax.ShapeDtypeStruct:
        shape = list(graph.nodes[j].shape)
        if cut is not None:
            shape[cut[0]] = cut[2]
        return jax.ShapeDtypeStruct(tuple(shape), graph.nodes[j].dtype)

    batched = jax.vmap(one, in_axes=tuple(in_axes), out_axes=axis)
    captured = capture(batched, tuple(aval(j, cut) for j, cut in operands), keep_whole=False)
    return captured.graph, operands


def reroll(graph: Graph) -> tuple[Graph, int]:
    """`graph` with each stack of `MIN_COPIES` or more copies of one computation over consecutive rows
    replaced by the computation batched (module doc), and how many stacks were; `graph` itself where
    none is. A stack whose batched form cannot be captured as the term language's ops (an opaque op) is
    left as it is."""
    if graph.opaque or graph.hidden_outputs:
        return graph, 0
    shapes = _Shapes(graph)
    replaced: dict[int, tuple[Graph, list]] = {}
    for i in graph.live():
        node = graph.nodes[i]
        if node.op != "concat" or len(node.inputs) < MIN_COPIES:
            continue
        copies = _copies(graph, i)
        if copies is None:
            continue
        try:
            sub, operands = _batched(graph, shapes, copies, node.attrs[0])
        except _Mismatch:
            continue
        if sub.opaque or sub.hidden_outputs:
            continue
        replaced[i] = (sub, operands)
    if not replaced:
        return graph, 0
    out = Graph(consts=list(graph.consts), n_args=graph.n_args)
    ids: dict[int, int] = {}
    for i in graph.live():
        node = graph.nodes[i]
        if i not in replaced:
            ids[i] = out.add(Node(node.op, tuple(ids[j] for j in node.inputs), node.attrs, node.shape, node.dtype))
            continue
        sub, operands = replaced[i]
        ins = []
        for j, cut in operands:
            src = graph.nodes[j]
            if cut is None:
                ins.append(ids[j])
                continue
            a, start, count = cut
            lo = tuple(start if d == a else 0 for d in range(len(src.shape)))
            hi = tuple(start + count if d == a else src.shape[d] for d in range(len(src.shape)))
            shape = tuple(count if d == a else src.shape[d] for d in range(len(src.shape)))
            ins.append(out.add(Node("slice", (ids[j],), (lo, hi, (1,) * len(shape)), shape, src.dtype)))
        local: dict[int, int] = {}
        for k, inner in enumerate(sub.nodes):
            if inner.op == "arg":
                local[k] = ins[inner.attrs[0]]
            elif inner.op == "const":
                out.consts.append(sub.consts[inner.attrs[0]])
                local[k] = out.add(Node("const", (), (len(out.consts) - 1,), inner.shape, inner.dtype))
            else:
                local[k] = out.add(Node(inner.op, tuple(local[j] for j in inner.inputs), inner.attrs, inner.shape,
                                        inner.dtype))
        ids[i] = local[sub.outputs[0]]
    out.outputs = [ids[o] for o in graph.outputs]
    return out, len(replaced)


def rerolled_note(traced: Graph, rolled: Graph) -> str:
    """The report's words for what re-rolling did."""
    before, after = len(traced.live()), len(rolled.live())
    return f"loops over rows batched before the search: {before} ops as traced, {after} searched"
