"""Axis labels of a kernel body: which axes of its values run over the same loop.

A Pallas kernel computes one block of its output per program. To know which block of every operand
and every intermediate a program needs, each axis of each body value gets a label: two axes have the
same label when the body's ops tie them together (an elementwise op ties its operands' axes to its
result's, a transpose permutes them, a matmul ties the left operand's rows to the result's rows and
the contracted axes to each other). Axes of extent 1 get no label (None): they are never tiled.
Labels are found by union-find over the body, one walk.

A matrix op's operands are loaded once per step of its reduction loop, the rest of the body once per
program, so before labelling each matrix operand's producers are copied into a region of their own
(`split_regions`): a value that feeds both the left operand and the epilogue (x in `x @ W + x`) is
computed in both places, and its two copies may run over different loops.
"""
from __future__ import annotations

from dataclasses import dataclass

from superopt.core.ir import Node, postorder

from superopt.core.ops import ELEMENTWISE, MATRIX_OPS, REDUCTIONS

MATRIX = MATRIX_OPS
LEAVES = frozenset({"arg", "lit"})
MAIN = None                      # the region of everything that is no matrix operand's producer
MAT = "matrix"                   # the key of a matrix op itself (never copied)


class NoTemplate(ValueError):
    """A kernel body no template can run (the reason names what is missing)."""


@dataclass(frozen=True)
class Labelled:
    body: tuple                  # IR nodes in topological order; the roots are the kernel's outputs
    roots: tuple                 # body indices of the outputs
    region: tuple                # per node: MAIN, MAT, or (matrix node index, operand index)
    axes: tuple                  # per node: a label (int) per axis, None for an axis of extent 1
    extent: dict                 # label -> extent
    reduced: dict                # region -> labels reduced by a reduction in it
    diagonal: frozenset          # labels that occur at two axes of one value

    def labels(self) -> set:
        return set(self.extent)

    def contracted(self, m: int):
        """The label a matrix op sums over (None when the contracted axis has extent 1)."""
        return self.axes[self.body[m].inputs[0]][-1] if self.body[self.body[m].inputs[0]].shape else None

    def in_region(self, key) -> list[int]:
        return [i for i, r in enumerate(self.region) if r == key]


def split_regions(body: tuple, roots: tuple) -> tuple[tuple, tuple, tuple]:
    """(body, roots, region per node): every matrix operand's producers copied into region (matrix op,
    operand); matrix ops themselves are never copied."""
    mats = {i for i, n in enumerate(body) if n.op in MATRIX}

    def key(i: int, region):
        return (i, MAT) if i in mats else (i, region)

    def children(item):
        i, region = item
        node = body[i]
        if region == MAT:
            return [key(j, (i, k)) for k, j in enumerate(node.inputs)]
        return [key(j, region) for j in node.inputs]

    order = postorder([key(r, MAIN) for r in roots], children)
    index = {item: n for n, item in enumerate(order)}
    nodes = []
    for item in order:
        node = body[item[0]]
        nodes.append(Node(node.op, tuple(index[c] for c in children(item)), node.attrs, node.shape, node.dtype))
    regions = tuple((index[(r[0], MAT)], r[1]) if isinstance(r, tuple) else r for _, r in order)
    return tuple(nodes), tuple(index[key(r, MAIN)] for r in roots), regions


class _Sets:
    def __init__(self):
        self.parent: dict = {}

    def find(self, x):
        while self.parent.setdefault(x, x) != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a, b):
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


def _ties(node: Node, ins: list[Node]) -> list[tuple]:
    """((input k, input axis), output axis) pairs the op ties together."""
    op, rank = node.op, len(node.shape)
    if op in ELEMENTWISE:
        return [((k, a), a) for k, x in enumerate(ins) if len(x.shape) == rank for a in range(rank)]
    if op == "broadcast":
        return [((0, a), d) for a, d in enumerate(node.attrs[0])]
    if op == "transpose":
        return [((0, p), o) for o, p in enumerate(node.attrs[0])]
    if op in REDUCTIONS:
        kept = [a for a in range(len(ins[0].shape)) if a not in node.attrs[0]]
        return [((0, a), o) for o, a in enumerate(kept)]
    if op == "reshape":
        src = [a for a, n in enumerate(ins[0].shape) if n != 1]
        dst = [a for a, n in enumerate(node.shape) if n != 1]
        if [ins[0].shape[a] for a in src] != [node.shape[a] for a in dst]:
            raise NoTemplate(f"a reshape {ins[0].shape} -> {node.shape} that moves data between axes")
        return [((0, a), o) for a, o in zip(src, dst)]
    if op == "matmul":
        a, b = ins
        ra, rb = len(a.shape), len(b.shape)
        if ra == 0 or rb == 0 or rb == 1:
            raise NoTemplate("a matmul with a vector or scalar right operand")
        ties = [((0, ra - 1), None)]                       # contracted: tied to the right operand below
        if rb == 2:
            ties += [((0, x), x) for x in range(ra - 1)] + [((1, 1), rank - 1)]
        else:
            ties += [((0, x), x) for x in range(ra - 1)] + [((1, x), x) for x in range(rb - 2)]
            ties += [((1, rb - 1), rank - 1)]
        return ties
    raise NoTemplate(f"no template runs {op!r} inside a kernel")


def label(body: tuple, roots: tuple | None = None, tie_roots: bool = False) -> Labelled:
    """Labels for `body` after `split_regions`. With `tie_roots`, outputs of one shape share labels
    axis by axis (a multi-output kernel computes the same block of each)."""
    roots = tuple(roots) if roots is not None else (len(body) - 1,)
    nodes, roots, region = split_regions(body, roots)
    sets = _Sets()
    for i, node in enumerate(nodes):
        if node.op in LEAVES:
            continue
        ins = [nodes[j] for j in node.inputs]
        for (k, a), o in _ties(node, ins):
            src = (node.inputs[k], a)
            if o is None:                                   # matmul contraction
                b = ins[1]
                sets.union(src, (node.inputs[1], 0 if len(b.shape) == 2 else len(b.shape) - 2))
            elif ins[k].shape[a] == node.shape[o] != 1:
                sets.union(src, (i, o))
    if tie_roots:
        for r in roots[1:]:
            if nodes[r].shape == nodes[roots[0]].shape:
                for a in range(len(nodes[r].shape)):
                    sets.union((r, a), (roots[0], a))
    names: dict = {}
    extent: dict = {}
    axes = []
    for i, node in enumerate(nodes):
        row = []
        for a, n in enumerate(node.shape):
            if n == 1:
                row.append(None)
                continue
            lab = names.setdefault(sets.find((i, a)), len(names))
            if extent.setdefault(lab, n) != n:
                raise NoTemplate(f"axes of extents {extent[lab]} and {n} tied together")
            row.append(lab)
        axes.append(tuple(row))
    reduced: dict = {}
    diagonal = set()
    for i, node in enumerate(nodes):
        seen = [x for x in axes[i] if x is not None]
        diagonal |= {x for x in seen if seen.count(x) > 1}
        if node.op in REDUCTIONS:
            src = axes[node.inputs[0]]
            reduced.setdefault(region[i], set()).update(src[a] for a in node.attrs[0] if src[a] is not None)
    return Labelled(nodes, roots, region, tuple(axes), extent, reduced, frozenset(diagonal))
