"""Vector kernels: a kernel body (no matrix op) run op by op on the Unified Buffer, one box of the
output at a time.

Every body value is a view of the output's index space: an elementwise op keeps its operands' axes, a
broadcast adds axes of size one, a transpose permutes them, a row reduction removes the last one (and
needs it whole). `_axis_maps` follows these from the output back to the loads, so for any box of the
output (a range on one axis, single indices before it except the axes a reduction needs whole, whole
axes after it) each value's box, and each input's GM window, is known. The box is as large as fits the
UB: inputs and the output get two slots each (the next box's copy-in overlaps this box's compute),
intermediates one. Boxes are dealt to the cores in turn; inputs that do not depend on the box (a bias
row, a scalar) are copied in once per core. When that leaves cores idle, smaller boxes over more cores
run instead if the emulator finds them faster.
"""
from __future__ import annotations

import math
from itertools import product

import numpy as np

from superopt.extract.models.boxes import UB_ALIGN, VECTOR_OPS, BoxError, Boxes, box_of as _box
from superopt.extract.target import Target
from superopt.lowering.npu.codegen import Allocator, CodegenError, _up, _view, insert_flags, vector_cores
from superopt.lowering.npu.emulator import emulate
from superopt.lowering.npu.isa import ALIGNMENT, CopyIn, CopyOut, Gm, Program, ScalarOp, VecOp

assert ALIGNMENT["UB"] == UB_ALIGN, "the cost model's boxes (extract/models/boxes.py) align as the UB does"
__all__ = ["VECTOR_OPS", "vector_program", "img2col_program"]


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def vector_program(body: tuple, ins: list[tuple], out, target: Target, cores: list[str] | None = None,
                   budget: int | None = None, roots: tuple | None = None) -> Program:
    """A program computing `body` (IR nodes, `arg` k = input k, no matrix op) on the vector unit. `ins` and
    `out` are (name, shape, dtype) of GM tensors; `cores` the cores the boxes are dealt to (default: one
    per cube core, or the AIVs of a separated chip); `budget` the UB bytes to use (default: all of it).
    With `roots`, `out` is a list, one GM tensor per root: sibling kernels (`egraph/siblings.py`) as one
    program that loads their shared operands once per box. The roots share a shape, except that one may
    have size one where the largest has more (a row reduction of a value another root writes: it is
    computed from the rows in the UB)."""
    roots = (len(body) - 1,) if roots is None else tuple(roots)
    outs = [out] if len(roots) == 1 and not isinstance(out, list) else list(out)
    oshape = tuple(max(outs, key=lambda o: math.prod(o[1]))[1])
    for r, (_, shape, _) in zip(roots, outs):
        if tuple(body[r].shape) != tuple(shape) or len(shape) != len(oshape) or any(
                d not in (o, 1) for d, o in zip(shape, oshape)):
            raise CodegenError(f"vector kernel: body gives {body[r].shape}, output is {shape}"
                               + (f" (outputs of one program share a shape, {oshape}, or reduce it to size "
                                  "one)" if len(outs) > 1 else ""))
    try:
        boxes_of = Boxes(body, roots, oshape)
    except BoxError as exc:
        raise CodegenError(str(exc)) from None
    maps, whole, live = boxes_of.maps, boxes_of.whole, boxes_of.live
    extent, varies, slots, sizes, footprint = (boxes_of.extent, boxes_of.varies, boxes_of.slots, boxes_of.sizes,
                                               boxes_of.footprint)
    # the last axis is chunked in runs aligned for the narrowest output
    odt = min((dt for _, _, dt in outs), key=lambda dt: 1 if dt == "bool" else np.dtype(dt).itemsize)
    npu = target.npu
    cores = vector_cores(target) if cores is None else cores
    budget = budget or npu.ub_bytes
    rank = len(oshape)

    # The largest box that fits: the outermost axis that can be chunked, as many of its indices as fit
    # (an axis a reduction needs whole is kept whole, before the chunked axis as well as after it).
    axis, size = rank, 1
    for a in range(rank):
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
        last = max((a for a in range(rank) if a not in whole), default=rank - 1)
        need = footprint(last, 1 if last not in whole else oshape[last])
        axes = ", ".join(str(w) for w in sorted(whole)) or "none"
        raise CodegenError(f"vector kernel: the smallest box of the output needs {need} bytes of UB (output axes "
                           f"kept whole for a reduction: {axes}), capacity {budget} ({target.name}); the reduced "
                           f"axis is too long to keep whole")
    if not rank and footprint(0, 1) > budget:
        raise CodegenError(f"vector kernel: a full reduction needs {footprint(0, 1)} bytes of UB, capacity "
                           f"{budget} ({target.name}); reduce it by rows first")

    def outer(axis: int) -> list:            # the axes before the chunked one that step by one
        return [w for w in range(axis) if w not in whole]

    def build(axis: int, size: int) -> Program:
        """The program for boxes chunked along `axis`, `size` indices each (`extent`)."""
        program = Program(inputs=list(ins), outputs=list(outs))
        alloc = Allocator(program)
        boxes = []
        for idx in product(*(range(oshape[w]) for w in outer(axis))):
            at = dict(zip(outer(axis), idx))
            for c0 in range(0, oshape[axis], size) if rank else ():
                boxes.append(tuple((at[w], 1) if w in at else ((c0, min(size, oshape[axis] - c0)) if w == axis else
                                                               (0, d)) for w, d in enumerate(oshape)))
        if not rank:
            boxes = [()]
        full = boxes[0] if rank == 0 else extent(axis, size)
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
            for r, (oname, _, _) in zip(roots, outs):
                part = _box(body[r], maps[r], box)
                dst = Gm(oname, tuple(s for s, _ in part), tuple(n for _, n in part))
                instrs.append(CopyOut(core, "MTE3", src=buf(r), dst=dst))
        program.instrs = insert_flags(instrs)
        program.cores = tuple(c for c in cores if any(i.core == c for i in program.instrs))
        return program

    def spread(axis: int, size: int, want: int) -> tuple:
        """(axis, size) of boxes within those of `size` indices along `axis` that number about `want`: the
        outermost axis from `axis` on that has as many indices (a last-axis chunk in 32-byte runs)."""
        chunkable = [a for a in range(axis, rank) if a not in whole]
        for a in chunkable:
            steps = math.prod(oshape[w] for w in outer(a))
            if steps * oshape[a] >= want or a == chunkable[-1]:
                part = _ceil(oshape[a], _ceil(want, steps))
                if a == rank - 1:
                    run = max(1, ALIGNMENT["UB"] // (1 if odt == "bool" else np.dtype(odt).itemsize))
                    part = min(oshape[a], _ceil(part, run) * run)
                part = max(1, part)
                return (a, min(part, size) if a == axis else part)
        return (axis, size)

    program = build(axis, size)
    count = math.prod(oshape[w] for w in outer(axis)) * _ceil(oshape[axis], size) if rank else 1
    if rank and 0 < count < len(cores):   # an empty output has no boxes to spread
        # Few boxes leave cores idle, and a core moves only its share of the chip's bandwidth: boxes
        # spread over more cores, when the emulator finds them faster (each box pays the DMA latency).
        options, seen = [program], {(axis, size)}
        for want in sorted({len(cores) >> s for s in range(4)} - {0}):
            plan = spread(axis, size, want)
            if plan not in seen and footprint(*plan) <= budget:
                seen.add(plan)
                options.append(build(*plan))
        program = min(options, key=lambda p: emulate(p, target, symbolic=True, trace=False).cycles)
    return program


def _as(buf, shape: tuple):
    """`buf` seen with `shape` (the same place; a box at a ragged edge is smaller than the buffer)."""
    return buf if tuple(buf.shape) == tuple(shape) else _view(buf, shape)


def img2col_program(lhs: tuple, patches: tuple, window: tuple, strides: tuple, padding: tuple, out_hw: tuple,
                    target: Target) -> Program:
    """The patch matrix of a 2-D convolution, [N * Ho * Wo, KH * KW * C] in (kh, kw, c) order, from an
    NHWC input: per box of output rows (or of columns of one row) and of input channels, the input window
    it needs (rows, columns and channels) is copied in, the vector unit lays out the patches (zero
    padding included) and MTE3 writes them to GM, in the patch matrix's dtype (the cube's fp16, or int8). A box of
    all channels is one run of whole patch rows; a block of channels is KH * KW runs of columns, one per
    kernel tap, each a strided read of the UB. Boxes are as large as fit the UB with two slots each side;
    when no box of all channels fits, the fastest of the boxes that fit (emulated) runs. The hardware's
    MTE1 does this between L1 and L0A (load3d) without the GM round trip, so this stage is an upper bound
    on its cost."""
    (xname, (n, h, w, c), xdt), (pname, _, pdt) = lhs, patches
    (kh, kw), (sh, sw), ((pt, _), (pl, _)), (ho, wo) = window, strides, padding, out_hw
    npu = target.npu
    item, pitem = np.dtype(xdt).itemsize, np.dtype(pdt).itemsize

    def aligned(nbytes: int) -> int:
        return _up(nbytes, ALIGNMENT["UB"])

    def need(rows: int, cols: int, depth: int) -> int:   # UB bytes for a box, two slots of input and patches
        in_rows, in_cols = min((rows - 1) * sh + kh, h), min((cols - 1) * sw + kw, w)
        return 2 * (aligned(in_rows * in_cols * depth * item) + aligned(rows * cols * kh * kw * depth * pitem))

    def most(fits, hi: int) -> int:                      # the largest x in 1..hi with fits(x) (monotone), or 0
        lo = 0
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        return lo

    def fit(rows: int, cols: int, depth: int) -> bool:
        return need(rows, cols, depth) <= npu.ub_bytes

    def even(most_: int, extent: int) -> int:             # boxes of even size, no more of them than `most_` gives
        return _ceil(extent, _ceil(extent, most_))

    # Whole output rows of all channels; else columns of one row of all channels, or channel blocks (of 16,
    # the cube's C0) of one output row or of its columns, whichever the emulator finds faster.
    rows = most(lambda r: fit(r, wo, c), ho)
    if rows:
        candidates = [(even(rows, ho), wo, c)]
    else:
        candidates = []
        cols = most(lambda q: fit(1, q, c), wo)
        if cols:
            candidates.append((1, even(cols, wo), c))
        unit = 16
        if c > unit:
            cols = wo if fit(1, wo, unit) else even(most(lambda q: fit(1, q, unit), wo), wo)
            if cols:
                blocks = _ceil(c, unit * most(lambda u: fit(1, cols, unit * u), _ceil(c, unit) - 1))
                candidates.append((1, cols, _ceil(_ceil(c, blocks), unit) * unit))   # blocks of even size
        if not candidates:
            raise CodegenError(f"img2col: one patch of {min(c, unit)} channels needs {need(1, 1, min(c, unit))} "
                               f"bytes of UB, capacity {npu.ub_bytes} ({target.name})")
    programs = [_img2col_boxes(lhs, patches, window, strides, padding, out_hw, box, target) for box in candidates]
    if len(programs) == 1:
        return programs[0]
    return min(programs, key=lambda prog: emulate(prog, target, symbolic=True, trace=False).cycles)


def _img2col_boxes(lhs: tuple, patches: tuple, window: tuple, strides: tuple, padding: tuple, out_hw: tuple,
                   box: tuple, target: Target) -> Program:
    """`img2col_program` with boxes of `rows` output rows x `cols` output columns x `depth` channels."""
    (xname, (n, h, w, c), xdt), (pname, _, pdt) = lhs, patches
    (kh, kw), (sh, sw), ((pt, _), (pl, _)), (ho, wo) = window, strides, padding, out_hw
    rows, cols, depth = box
    cores = vector_cores(target)
    program = Program(inputs=[lhs], outputs=[patches])
    alloc = Allocator(program)
    in_rows, in_cols = min((rows - 1) * sh + kh, h), min((cols - 1) * sw + kw, w)
    xin = [alloc(f"x{s}", "UB", (1, in_rows, in_cols, depth), xdt) for s in range(2)]
    pat = [alloc(f"p{s}", "UB", (rows * cols, kh * kw * depth), pdt) for s in range(2)]
    instrs = []
    boxes = [(b, r0, c0, ch0) for b in range(n) for r0 in range(0, ho, rows) for c0 in range(0, wo, cols)
             for ch0 in range(0, c, depth)]
    for t, (b, r0, c0, ch0) in enumerate(boxes):
        core, slot = cores[t % len(cores)], (t // len(cores)) % 2
        here, span, chans = min(rows, ho - r0), min(cols, wo - c0), min(depth, c - ch0)
        top, left = r0 * sh - pt, c0 * sw - pl              # the box's first (padded) input row and column
        lo, hi = max(top, 0), max(min(top + (here - 1) * sh + kh, h), max(top, 0))
        first, last = max(left, 0), max(min(left + (span - 1) * sw + kw, w), max(left, 0))
        instrs.append(ScalarOp(core, "scalar", cycles=8, note="img2col box"))
        block = _view(xin[slot], (1, hi - lo, last - first, chans))
        instrs.append(CopyIn(core, "MTE2", src=Gm(xname, (b, lo, first, ch0), (1, hi - lo, last - first, chans)),
                             dst=block))
        out = _view(pat[slot], (here * span, kh * kw * chans))
        geometry = (kh, kw, sh, sw, lo - top, first - left, here, span)
        instrs.append(VecOp(core, "vector", op="img2col", dst=out, srcs=(block,), attrs=geometry))
        start = (b * ho + r0) * wo + c0
        # a box is whole output rows, or part of one row: its patches are consecutive rows of the matrix
        if chans == c:
            instrs.append(CopyOut(core, "MTE3", src=out, dst=Gm(pname, (start, 0), (here * span, kh * kw * c))))
        else:   # a channel block: one run of columns per kernel tap
            for tap in range(kh * kw):
                instrs.append(CopyOut(core, "MTE3", src=out, at=(0, tap * chans),
                                      dst=Gm(pname, (start, tap * c + ch0), (here * span, chans))))
    program.instrs = insert_flags(instrs)
    program.cores = tuple(c_ for c_ in cores if any(i.core == c_ for i in program.instrs))
    return program
