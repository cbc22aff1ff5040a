"""Passes over gradient memory: how often a training step's program touches its gradients in global
memory, counted on the captured program and on the chosen one alike.

Gradient memory is defined on the program alone, with no help from the user:

- a *parameter shape* is the shape of an argument that the program also returns as an elementwise
  function of it (a training step returns its parameters and optimizer moments updated), in any order
  of its axes (a gradient may be kept transposed);
- a program has parameters only if one of those shapes is the shape of a *weight*: an argument that a
  matmul or convolution takes as its right-hand operand (through views, transposes and casts). A forward
  model with a residual connection returns its input `x` as `x + f(x)`, an elementwise function of it,
  but `x` enters its matmuls on the left: it is an activation, and `f(x)` is no gradient;
- a *gradient tensor* is a computed tensor of a parameter shape that is not an elementwise function of
  an argument of that shape (a moment update `b1 * m + (1 - b1) * g` reads the moment `m`, so it is
  optimizer-state memory, not gradient memory). Weight gradients, and their unscaled, clipped or
  is-finite forms, are gradient tensors.

A *pass* is a launch (a kernel, or an op outside kernels) that reads or writes a gradient tensor;
reshapes are views and pass through. Constants computed when the program is built are not counted.
Where the backend runs sibling kernels as one launch (`egraph/siblings.py`), a group is one pass that
reads each gradient tensor once: pass the groups its lowering formed. A member of a chained group that
only other members read (a clipped gradient read by the moment updates) is computed on chip: neither
written nor read from global memory, nor counted as a gradient tensor kept there.
"""
from __future__ import annotations

from dataclasses import dataclass

from superopt.core.ir import Graph
from superopt.core.ops import ELEMENTWISE, MATRIX_OPS, flagged
from superopt.extract.memory import size_str
from superopt.egraph.siblings import internal

_ELEMENTWISE = ELEMENTWISE | {"broadcast", "transpose"}   # the same index space as the operands, permuted
_VIEWS = flagged("view")


@dataclass(frozen=True)
class Traffic:
    passes: int          # launches that read or write gradient memory
    bytes: int           # bytes of gradient tensors read and written by them
    tensors: int         # gradient tensors kept in global memory

    def __str__(self) -> str:
        return f"{self.passes} passes, {size_str(self.bytes)}"


def _through(graph: Graph, i: int) -> list[int]:
    """The inputs of node i that its result is an elementwise function of (for a kernel, the inputs
    that reach the body's result through elementwise ops, transposes and views only)."""
    node = graph.nodes[i]
    if node.op != "kernel":
        return list(node.inputs) if node.op in _ELEMENTWISE | _VIEWS else []
    body = node.attrs[0]
    flows: list[set] = []
    for b in body:
        if b.op == "arg":
            flows.append({b.attrs[0]})
        elif b.op in _ELEMENTWISE | _VIEWS:
            flows.append(set().union(*(flows[j] for j in b.inputs)))
        else:
            flows.append(set())
    return [node.inputs[k] for k in sorted(flows[-1])]


def _key(shape: tuple) -> tuple:
    return tuple(sorted(shape))


_CONTRACTIONS = MATRIX_OPS
_PASS = _VIEWS | {"transpose", "convert"}


def weight_shapes(graph: Graph) -> set:
    """Shape keys of the arguments that a matmul or convolution takes as its right-hand operand, looking
    through views, transposes and casts, in kernel bodies too."""
    def source(i: int) -> int:
        while graph.nodes[i].op in _PASS and graph.nodes[i].inputs:
            i = graph.nodes[i].inputs[0]
        return i

    out = set()
    for i in graph.live():
        node = graph.nodes[i]
        rhs = []
        if node.op in _CONTRACTIONS and len(node.inputs) > 1:
            rhs.append(node.inputs[1])
        elif node.op == "kernel":
            body = node.attrs[0]
            for b in body:
                if b.op in _CONTRACTIONS and len(b.inputs) > 1:
                    j = b.inputs[1]
                    while body[j].op in _PASS and body[j].inputs:
                        j = body[j].inputs[0]
                    if body[j].op == "arg":
                        rhs.append(node.inputs[body[j].attrs[0]])
        for j in rhs:
            j = source(j)
            if graph.nodes[j].op == "arg":
                out.add(_key(graph.nodes[j].shape))
    return out


def gradient_tensors(graph: Graph) -> set[int]:
    """Ids of the live gradient tensors (see the module docstring)."""
    live = graph.live()
    args = {i: _key(graph.nodes[i].shape) for i in live if graph.nodes[i].op == "arg"}
    # reaches[i]: shapes of the arguments node i is an elementwise function of
    reaches: dict[int, set] = {}
    for i in live:
        reaches[i] = {args[i]} if i in args else set().union(set(), *(reaches[j] for j in _through(graph, i)))
    # an update returns a parameter as an elementwise function of it (a matmul chain that happens to
    # return its argument's shape has no parameters)
    params = {_key(graph.nodes[o].shape) for o in graph.outputs
              if _key(graph.nodes[o].shape) in reaches[o] and graph.nodes[o].shape}
    if not params & weight_shapes(graph):   # no weight among them: a forward model (a residual input)
        return set()
    constant = graph.constant_nodes()
    return {i for i in live if i not in args and _key(graph.nodes[i].shape) in params
            and _key(graph.nodes[i].shape) not in reaches[i] and i not in constant
            and graph.nodes[i].op not in _VIEWS}


def gradient_traffic(graph: Graph, groups=()) -> Traffic:
    """Passes over gradient memory and their bytes; `groups` are node ids that run as one launch."""
    grads = gradient_tensors(graph)
    live = graph.live()
    view_of = {}
    for i in live:  # a reshape of a gradient tensor is that tensor
        node = graph.nodes[i]
        if node.op in _VIEWS and node.inputs:
            view_of[i] = view_of.get(node.inputs[0], node.inputs[0])
    constant = graph.constant_nodes()
    launches = {i: tuple(g) for g in groups for i in g}
    on_chip = {i for g in groups for i in internal(graph, list(g))}
    passes, moved, seen = 0, 0, set()
    for i in live:
        node = graph.nodes[i]
        if node.op in _VIEWS or node.op in ("arg", "const", "lit") or i in constant or i in seen:
            continue
        launch = launches.get(i, (i,))
        seen.update(launch)
        touched = ({view_of.get(j, j) for k in launch for j in graph.nodes[k].inputs} - set(launch)) & grads
        written = [k for k in launch if k in grads and k not in on_chip]
        nbytes = sum(graph.nodes[j].nbytes for j in touched) + sum(graph.nodes[k].nbytes for k in written)
        if nbytes:
            passes += 1
            moved += nbytes
    return Traffic(passes, moved, len(grads - on_chip))
