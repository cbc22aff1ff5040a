"""Vector kernels: a kernel body (no matrix op) run op by op on the Unified Buffer, one box of the
output at a time.

Every body value is a view of the output's index space: an elementwise op keeps its operands' axes, a
broadcast adds axes of size one, a transpose permutes them, a row reduction removes the last one (and
needs it whole). `_axis_maps` follows these from the output back to the loads, so for any box of the
output (a range on one axis, single indices before it, whole axes after it) each value's box, and each
input's GM window, is known. The box is as large as fits the UB: inputs and the output get two slots
each (the next box's copy-in overlaps this box's compute), intermediates one. Boxes are dealt to the
cores in turn; inputs that do not depend on the box (a bias row, a scalar) are copied in once per core.
"""
from __future__ import annotations

import math
from itertools import product

import numpy as np

from superopt.egraph.ir import REDUCTIONS, Node
from superopt.extract.target import Target
from superopt.lowering.npu.codegen import Allocator, CodegenError, _view, insert_flags, vector_cores
from superopt.lowering.npu.emulator import ELEMENTWISE
from superopt.lowering.npu.isa import ALIGNMENT, CopyIn, CopyOut, Gm, Program, ScalarOp, VecOp

VECTOR_OPS = ELEMENTWISE | REDUCTIONS | {"broadcast", "transpose", "reshape", "arg"}


def _squeezed_axes(shape: tuple) -> list[int]:
    return [i for i, d in enumerate(shape) if d != 1]


def _axis_maps(body: tuple) -> tuple[list, set]:
    """For each body node, per axis, the output axis it runs along (None: size one or reduced); and the
    output axes a reduction needs whole."""
    out = len(body) - 1
    maps: list = [None] * len(body)
    maps[out] = tuple(range(len(body[out].shape)))
    whole: set = set()
    wanted: list = [[] for _ in body]      # per node, the maps its consumers ask for

    def ask(j: int, m: tuple):
        wanted[j].append(m)

    for i in range(out, -1, -1):
        node = body[i]
        if i != out:
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
                        raise CodegenError(f"vector kernel: axis {ax} of {node.op} runs along output axes {a} "
                                           f"and {b}; it needs a transpose through global memory")
            maps[i] = tuple(merged)
        m = maps[i]
        if node.op not in VECTOR_OPS:
            raise CodegenError(f"vector kernel: no vector-unit lowering for op {node.op!r}")
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
                raise CodegenError(f"vector kernel: reshape {body[x].shape} -> {node.shape} regroups axes; "
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


def _box(node: Node, m: tuple, box: tuple) -> tuple:
    """(start, size) per axis of `node` for a box (start, size) per output axis."""
    return tuple(box[w] if w is not None else (0, d) for w, d in zip(m, node.shape))


def _bytes(shape: tuple, dtype: str) -> int:
    return math.prod(shape) * (1 if dtype == "bool" else np.dtype(dtype).itemsize)


def vector_program(body: tuple, ins: list[tuple], out: tuple, target: Target, cores: list[str] | None = None,
                   budget: int | None = None) -> Program:
    """A program computing `body` (IR nodes, `arg` k = input k, no matrix op) on the vector unit. `ins` and
    `out` are (name, shape, dtype) of GM tensors; `cores` the cores the boxes are dealt to (default: one
    per cube core, or the AIVs of a separated chip); `budget` the UB bytes to use (default: all of it)."""
    maps, whole = _axis_maps(body)
    oname, oshape, odt = out
    if tuple(body[-1].shape) != tuple(oshape):
        raise CodegenError(f"vector kernel: body gives {body[-1].shape}, output is {oshape}")
    npu = target.npu
    cores = vector_cores(target) if cores is None else cores
    budget = budget or npu.ub_bytes
    live = [i for i, m in enumerate(maps) if m is not None]
    rank = len(oshape)

    def varies(i: int, upto: int) -> bool:    # does node i's box change when axes 0..upto move?
        return any(w is not None and w <= upto and body[i].shape[a] > 1 for a, w in enumerate(maps[i]))

    def slots(i: int, axis: int) -> int:      # inputs that change per box and the output: ping-pong
        return 2 if (body[i].op == "arg" and varies(i, axis)) or i == len(body) - 1 else 1

    def sizes(i: int, box: tuple) -> tuple:   # node i's box, sizes only
        return tuple(n for _, n in _box(body[i], maps[i], box))

    def footprint(axis: int, size: int) -> int:
        box = tuple((0, 1) if w < axis else ((0, size) if w == axis else (0, d)) for w, d in enumerate(oshape))
        total = 0
        for i in live:
            if body[i].op == "reshape":
                continue
            total += slots(i, axis) * (-(-_bytes(sizes(i, box), body[i].dtype) // ALIGNMENT["UB"]) * ALIGNMENT["UB"])
        return total

    # The largest box that fits: the outermost axis that can be chunked, as many of its indices as fit.
    axis, size = rank, 1
    for a in range(rank):
        if any(w < a and oshape[w] > 1 for w in whole):
            break
        fit = oshape[a] if footprint(a, oshape[a]) <= budget else 0
        if not fit and a not in whole:
            lo, hi = 0, oshape[a]
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if footprint(a, mid) <= budget else (lo, mid - 1)
            fit = lo
        if fit:
            axis, size = a, fit
            break
    if rank and axis == rank:
        need = footprint(rank - 1, 1)
        raise CodegenError(f"vector kernel: one row of the output needs {need} bytes of UB, capacity {budget} "
                           f"({target.name}); the row is too long to keep whole")
    if not rank and footprint(0, 1) > budget:
        raise CodegenError(f"vector kernel: a full reduction needs {footprint(0, 1)} bytes of UB, capacity "
                           f"{budget} ({target.name}); reduce it by rows first")

    program = Program(inputs=list(ins), outputs=[out])
    alloc = Allocator(program)
    boxes = [tuple((i, 1) for i in idx) + ((c0, min(size, oshape[axis] - c0)),) + tuple((0, d) for d in
             oshape[axis + 1:]) for idx in product(*(range(d) for d in oshape[:axis]))
             for c0 in range(0, oshape[axis], size)] if rank else [()]
    full = boxes[0] if rank == 0 else (tuple((0, 1) for _ in oshape[:axis]) + ((0, size),) +
                                       tuple((0, d) for d in oshape[axis + 1:]))
    bufs: dict = {}
    for i in live:   # a reshape that only adds or drops unit axes is a view of its operand's buffer
        if body[i].op == "reshape":
            bufs[i] = [_as(b, sizes(i, full)) for b in bufs[body[i].inputs[0]]]
        else:
            bufs[i] = [alloc(f"v{i}_{s}", "UB", sizes(i, full), body[i].dtype) for s in range(slots(i, axis))]

    instrs: list = []
    loaded: set = set()
    for t, box in enumerate(boxes):
        core = cores[t % len(cores)]
        instrs.append(ScalarOp(core, "scalar", cycles=8, note="vector box"))
        step = t // len(cores)
        def buf(j: int):   # body value j's buffer for this box
            return _as(bufs[j][step % len(bufs[j])], sizes(j, box))
        for i in live:
            node = body[i]
            if node.op == "arg":
                if not varies(i, axis) and (core, i) in loaded:
                    continue
                loaded.add((core, i))
                start = tuple(s for s, _ in _box(node, maps[i], box))
                instrs.append(CopyIn(core, "MTE2", src=Gm(ins[node.attrs[0]][0], start, sizes(i, box)), dst=buf(i)))
            elif node.op != "reshape":
                instrs.append(VecOp(core, "vector", op=node.op, dst=buf(i), srcs=tuple(buf(j) for j in node.inputs),
                                    attrs=node.attrs))
        dst = Gm(oname, tuple(s for s, _ in box), tuple(n for _, n in box))
        instrs.append(CopyOut(core, "MTE3", src=buf(len(body) - 1), dst=dst))
    program.instrs = insert_flags(instrs)
    program.cores = tuple(c for c in cores if any(i.core == c for i in program.instrs))
    return program


def _as(buf, shape: tuple):
    """`buf` seen with `shape` (the same place; a box at a ragged edge is smaller than the buffer)."""
    return buf if tuple(buf.shape) == tuple(shape) else _view(buf, shape)


def img2col_program(lhs: tuple, patches: tuple, window: tuple, strides: tuple, padding: tuple, out_hw: tuple,
                    target: Target) -> Program:
    """The patch matrix of a 2-D convolution, [N * Ho * Wo, KH * KW * C] in (kh, kw, c) order, from an
    NHWC input: per box of output rows the input rows it needs are copied in, the vector unit lays out
    the patches (zero padding included) and MTE3 writes them to GM, in the patch matrix's dtype (the
    cube's fp16). The hardware's MTE1 does this between L1 and L0A (load3d) without the GM round trip,
    so this stage is an upper bound on its cost."""
    (xname, (n, h, w, c), xdt), (pname, _, pdt) = lhs, patches
    (kh, kw), (sh, sw), ((pt, _), (pl, pr)), (ho, wo) = window, strides, padding, out_hw
    npu = target.npu
    cores = vector_cores(target)
    item, pitem = np.dtype(xdt).itemsize, np.dtype(pdt).itemsize

    def need(rows: int, cols: int) -> int:      # UB bytes for a box of output rows x columns, two slots
        in_rows = (rows - 1) * sh + kh
        return 2 * (in_rows * w * c * item + rows * cols * kh * kw * c * pitem) + 4 * ALIGNMENT["UB"]
    rows = max((r for r in range(1, ho + 1) if need(r, wo) <= npu.ub_bytes), default=0)
    cols = wo if rows else max((q for q in range(1, wo + 1) if need(1, q) <= npu.ub_bytes), default=0)
    if not cols:
        raise CodegenError(f"img2col: one patch needs {need(1, 1)} bytes of UB, capacity {npu.ub_bytes} "
                           f"({target.name})")
    rows = max(rows, 1)
    program = Program(inputs=[lhs], outputs=[patches])
    alloc = Allocator(program)
    in_rows = (rows - 1) * sh + kh
    xin = [alloc(f"x{s}", "UB", (1, in_rows, w, c), xdt) for s in range(2)]
    pat = [alloc(f"p{s}", "UB", (rows * cols, kh * kw * c), pdt) for s in range(2)]
    instrs = []
    boxes = [(b, r0, c0) for b in range(n) for r0 in range(0, ho, rows) for c0 in range(0, wo, cols)]
    for t, (b, r0, c0) in enumerate(boxes):
        core, slot = cores[t % len(cores)], (t // len(cores)) % 2
        here, span = min(rows, ho - r0), min(cols, wo - c0)
        first = r0 * sh - pt                                  # the box's first input row (may be padding)
        lo, hi = max(first, 0), min(first + (here - 1) * sh + kh, h)
        instrs.append(ScalarOp(core, "scalar", cycles=8, note="img2col box"))
        block = _view(xin[slot], (1, hi - lo, w, c))
        instrs.append(CopyIn(core, "MTE2", src=Gm(xname, (b, lo, 0, 0), (1, hi - lo, w, c)), dst=block))
        out = _view(pat[slot], (here * span, kh * kw * c))
        geometry = (kh, kw, sh, sw, lo - first, pl, pr, here, c0, span)
        instrs.append(VecOp(core, "vector", op="img2col", dst=out, srcs=(block,), attrs=geometry))
        start = (b * ho + r0) * wo + c0
        # a box is whole output rows, or part of one row: its patches are consecutive rows of the matrix
        instrs.append(CopyOut(core, "MTE3", src=out, dst=Gm(pname, (start, 0), (here * span, kh * kw * c))))
    program.instrs = insert_flags(instrs)
    program.cores = tuple(c_ for c_ in cores if any(i.core == c_ for i in program.instrs))
    return program


def img2col(block: np.ndarray, kh: int, kw: int, sh: int, sw: int, top: int, pl: int, pr: int, rows: int,
            c0: int, cols: int) -> np.ndarray:
    """The patches of output columns c0 .. c0 + cols of `rows` output rows, from an input block
    [1, r, W, C] whose first row is `top` rows below the box's first (padded) input row."""
    _, r, w, c = block.shape
    padded = np.zeros(((rows - 1) * sh + kh, w + pl + pr, c), block.dtype)
    padded[top:top + r, pl:pl + w] = block[0]
    win = np.lib.stride_tricks.sliding_window_view(padded, (kh, kw), axis=(0, 1))   # [R', W', C, kh, kw]
    win = win[::sh, ::sw][:rows, c0:c0 + cols]
    return win.transpose(0, 1, 3, 4, 2).reshape(rows * cols, kh * kw * c)
