"""The boxes a vector kernel runs in, shared by the NPU cost model and the vector code generator.

The vector code generator (`lowering/npu/vector.py`) runs a kernel body one box of the output at a time,
every body value a view of the output's index space (`axis_maps`). A row reduction needs its reduced axis
whole, so a box can be no smaller than one row; every value the body computes has a buffer of its own in
the Unified Buffer, inputs that change from box to box and the outputs two (ping-pong). Whether a body can
run at all is whether its smallest box fits the UB (`smallest_footprint`). The cost model asks exactly
that, of a vector kernel and of each vector stage of a cube kernel (a prologue that computes a matmul's
operand, an epilogue after it: `vector_stages`), so the extractor never chooses a kernel the generator
cannot place.
"""
from __future__ import annotations

import math

import numpy as np

from superopt.core.ir import Node
from superopt.core.ops import ELEMENTWISE, MATRIX_OPS, on_npu

UB_ALIGN = 32                                       # UB allocations are 32-byte aligned (lowering/npu/isa.py)
VECTOR_OPS = on_npu("vector") | {"reshape", "arg"}   # the ops the vector unit runs, views and loads
NPU_VIEWS = on_npu("view")                          # views of their operand's GM tensor


class BoxError(ValueError):
    """A body the vector unit cannot run in boxes (an op it has no lowering for, a regrouping reshape, a
    value that runs along two output axes)."""


def _squeezed_axes(shape: tuple) -> list[int]:
    return [i for i, d in enumerate(shape) if d != 1]


def nbytes(shape: tuple, dtype: str) -> int:
    return math.prod(shape) * (1 if dtype == "bool" else np.dtype(dtype).itemsize)


def aligned(n: int) -> int:
    return -(-n // UB_ALIGN) * UB_ALIGN


def axis_maps(body: tuple, roots: tuple, oshape: tuple) -> tuple[list, set]:
    """For each body node, per axis, the output axis it runs along (None: size one or reduced; the
    node list is None for a node no root needs); and the output axes a reduction needs whole. The roots
    (the outputs) span the output's index space, `oshape`: each has its shape, or size one on the axes
    it reduces (a row sum of the value another root writes)."""
    maps: list = [None] * len(body)
    whole: set = set()
    wanted: list = [[] for _ in body]      # per node, the maps its consumers (or being an output) ask for

    def ask(j: int, m: tuple):
        wanted[j].append(m)

    for r in roots:
        ask(r, tuple(a if d == oshape[a] else None for a, d in enumerate(body[r].shape)))
    for i in range(max(roots), -1, -1):
        node = body[i]
        if not wanted[i]:
            continue
        merged = list(wanted[i][0])
        for m in wanted[i][1:]:
            for ax, (a, b) in enumerate(zip(merged, m)):
                if a is None or b is None:
                    if (a if b is None else b) is not None and node.shape[ax] > 1:
                        whole.add(a if b is None else b)
                    merged[ax] = a if b is None else b
                elif a != b:
                    raise BoxError(f"vector kernel: axis {ax} of {node.op} runs along output axes {a} "
                                   f"and {b}; it needs a transpose through global memory")
        maps[i] = tuple(merged)
        m = maps[i]
        if node.op not in VECTOR_OPS:
            raise BoxError(f"vector kernel: no vector-unit lowering for op {node.op!r}")
        if node.op == "arg":
            continue
        if node.op in ELEMENTWISE:
            for j in node.inputs:   # operands broadcast numpy-style (right-aligned, size-1 axes)
                shape, lead = body[j].shape, len(node.shape) - len(body[j].shape)
                ask(j, tuple(m[lead + k] if d == node.shape[lead + k] else None for k, d in enumerate(shape)))
        elif node.op == "broadcast":
            (x,), dims = node.inputs, node.attrs[0]
            ask(x, tuple(m[d] if body[x].shape[k] == node.shape[d] else None for k, d in enumerate(dims)))
        elif node.op == "transpose":
            (x,), perm = node.inputs, node.attrs[0]
            xm = [None] * len(perm)
            for k, p in enumerate(perm):
                xm[p] = m[k]
            ask(x, tuple(xm))
        elif node.op == "reshape":
            (x,) = node.inputs
            src, dst = _squeezed_axes(body[x].shape), _squeezed_axes(node.shape)
            if [body[x].shape[a] for a in src] != [node.shape[a] for a in dst]:
                raise BoxError(f"vector kernel: reshape {body[x].shape} -> {node.shape} regroups axes; "
                               f"it runs as a view of global memory instead")
            xm = [None] * len(body[x].shape)
            for a, b in zip(src, dst):
                xm[a] = m[b]
            ask(x, tuple(xm))
        else:   # a reduction: the kept axes in order, the reduced ones need the whole axis
            (x,), axes = node.inputs, set(node.attrs[0])
            kept = iter(m)
            ask(x, tuple(None if a in axes else next(kept) for a in range(len(body[x].shape))))
    return maps, whole


def box_of(node: Node, m: tuple, box: tuple) -> tuple:
    """(start, size) per axis of `node` for a box (start, size) per output axis."""
    return tuple(box[w] if w is not None else (0, d) for w, d in zip(m, node.shape))


class Boxes:
    """The boxes of one vector body: its axis maps, and the UB bytes a box of a given extent needs."""

    def __init__(self, body: tuple, roots: tuple, oshape: tuple):
        self.body, self.roots, self.oshape = body, tuple(roots), tuple(oshape)
        self.maps, self.whole = axis_maps(body, self.roots, self.oshape)
        self.rank = len(self.oshape)
        self.live = [i for i, m in enumerate(self.maps) if m is not None]

    def extent(self, axis: int, size: int) -> tuple:
        """The box (start, size per output axis) chunked along `axis`: single indices on the axes before it
        except the ones a reduction needs whole (those are whole wherever they are), `size` indices of
        `axis`, the axes after it whole."""
        return tuple((0, d) if w > axis or (w < axis and w in self.whole) else ((0, size) if w == axis else (0, 1))
                     for w, d in enumerate(self.oshape))

    def varies(self, i: int, axis: int) -> bool:
        """Does node i's box change from one box to the next?"""
        moving = [w for w in range(min(axis, self.rank - 1) + 1) if w == axis or w not in self.whole]
        return any(w in moving and self.body[i].shape[a] > 1 for a, w in enumerate(self.maps[i]))

    def slots(self, i: int, axis: int) -> int:
        """Inputs that change per box and the outputs: ping-pong."""
        return 2 if (self.body[i].op == "arg" and self.varies(i, axis)) or i in self.roots else 1

    def sizes(self, i: int, box: tuple) -> tuple:
        """Node i's box, sizes only."""
        return tuple(n for _, n in box_of(self.body[i], self.maps[i], box))

    def footprint(self, axis: int, size: int) -> int:
        """UB bytes of the buffers for boxes of `size` indices along `axis`."""
        box, total = self.extent(axis, size), 0
        for i in self.live:
            if self.body[i].op == "reshape":
                continue
            total += self.slots(i, axis) * aligned(nbytes(self.sizes(i, box), self.body[i].dtype))
        return total

    def smallest(self) -> tuple[int, int, int]:
        """(axis, size, UB bytes) of the smallest box: one index of every axis but those kept whole."""
        if not self.rank:
            return 0, 1, self.footprint(0, 1)
        last = max((a for a in range(self.rank) if a not in self.whole), default=self.rank - 1)
        size = 1 if last not in self.whole else self.oshape[last]
        return last, size, self.footprint(last, size)


def output_shape(body: tuple, roots: tuple) -> tuple:
    """The index space the roots span: the largest root's shape."""
    return tuple(max((body[r].shape for r in roots), key=math.prod))


def smallest_footprint(body: tuple, roots: tuple | None = None) -> int:
    """UB bytes the smallest box of a vector body needs (BoxError where it cannot run in boxes)."""
    roots = (len(body) - 1,) if roots is None else tuple(roots)
    return Boxes(body, roots, output_shape(body, roots)).smallest()[2]


def vector_stages(body: tuple) -> list[tuple[tuple, tuple]]:
    """The vector programs a kernel body with matrix ops runs as (the code generator's stages, from the
    body alone): one per matmul/conv operand the body computes (a prologue), and one for the result when
    it is computed after the matrix ops (an epilogue). Each is (sub-body, roots), loads and matrix products
    as its arguments. A body without matrix ops is one stage, itself."""
    mats = [i for i, n in enumerate(body) if n.op in MATRIX_OPS]
    if not mats:
        return [(body, (len(body) - 1,))]
    def in_gm(j: int) -> bool:   # a load, a product, or a view of one: no vector stage computes it
        if body[j].op in NPU_VIEWS:
            j = body[j].inputs[0]
        return body[j].op == "arg" or body[j].op in MATRIX_OPS

    roots = [j for m in mats for j in dict.fromkeys(body[m].inputs[:2]) if not in_gm(j)]
    if not in_gm(len(body) - 1):
        roots.append(len(body) - 1)
    return [_sub_body(body, r) for r in dict.fromkeys(roots)]


def _sub_body(body: tuple, root: int) -> tuple[tuple, tuple]:
    """The cone of `root` down to loads and matrix products, which become the sub-body's arguments."""
    index, sub, args = {}, [], 0
    need, stack = set(), [root]
    while stack:
        j = stack.pop()
        if j in need:
            continue
        need.add(j)
        if body[j].op != "arg" and body[j].op not in MATRIX_OPS:
            stack.extend(body[j].inputs)
    for j in sorted(need):
        n = body[j]
        index[j] = len(sub)
        if n.op == "arg" or n.op in MATRIX_OPS:
            sub.append(Node("arg", (), (args,), n.shape, n.dtype))
            args += 1
        else:
            sub.append(Node(n.op, tuple(index[k] for k in n.inputs), n.attrs, n.shape, n.dtype))
    return tuple(sub), (index[root],)
