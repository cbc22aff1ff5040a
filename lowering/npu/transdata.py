"""Format conversions (TransData) on the vector unit: pack or unpack a GM tensor (superopt/core/formats.py).

The logical tensor is cut into boxes: a range of its first axis and of its last axis, each in whole
blocks of the format, every other axis whole. A box is one contiguous range of the packed tensor's
axes that hold those two axes' outer parts, so it moves as one GM window each way: MTE2 copies the box
in (zeros past the tensor's edge are the padding), the vector unit repacks it in the UB, MTE3 copies it
out. Boxes are as large as fit the UB with two slots each side (the next box's copy-in overlaps this
box's repack) and are dealt to the vector cores in turn. The repack counts as one vector pass over the
box, as a transpose does; the GM traffic is exact, its strided access is not modelled (the cost model's
TRANSDATA_EFFICIENCY is where that is charged).
"""
from __future__ import annotations

import math

import numpy as np

from superopt.core.formats import format_of
from superopt.extract.target import Target
from superopt.lowering.npu.codegen import Allocator, CodegenError, _view, insert_flags, vector_cores
from superopt.lowering.npu.isa import ALIGNMENT, CopyIn, CopyOut, Gm, Program, ScalarOp, VecOp


def _aligned(shape: tuple, dtype: str) -> int:
    n = math.prod(shape) * np.dtype(dtype).itemsize
    return -(-n // ALIGNMENT["UB"]) * ALIGNMENT["UB"]


def layout_program(src: tuple, dst: tuple, fmt: str, pack: bool, target: Target) -> Program:
    """`dst` = pack(`src`, fmt) (or unpack, with `pack=False`); both are (name, shape, dtype) GM tensors."""
    f = format_of(fmt)
    logical = src if pack else dst
    (name, shape, dtype), rank = logical, len(logical[1])
    f.check(shape)
    if not f.blocks:
        raise CodegenError("layout: ND is a view, not a conversion")
    last = rank - 1
    step0, step1 = f.blocks[0] if f.batch(rank) == 0 else 1, f.blocks[-1]
    padded = f.padded_shape(shape)

    def box_shape(rows: int, cols: int) -> tuple:
        return (rows,) + tuple(shape[1:last]) + (cols,)

    def footprint(rows: int, cols: int) -> int:
        box = box_shape(rows, cols)
        return 2 * (_aligned(box, dtype) + _aligned(f.packed_shape(box), dtype))

    npu = target.npu
    cores = vector_cores(target)
    # At most an even share of the rows of blocks per core, so that every vector core has a box.
    share = -(-padded[0] // step0 // len(cores)) * step0 if padded[0] >= step0 else padded[0]
    rows, cols = 0, padded[last]
    for r in range(max(share, step0), 0, -step0):   # as many whole rows of blocks as fit, all columns
        if footprint(r, cols) <= npu.ub_bytes:
            rows = r
            break
    if not rows:                               # one row of blocks, as many columns as fit
        rows = step0
        cols = next((c for c in range(padded[last], 0, -step1) if footprint(rows, c) <= npu.ub_bytes), 0)
    if not cols:
        raise CodegenError(f"layout: one {fmt} block row of {tuple(shape)} needs {footprint(step0, step1)} bytes "
                           f"of UB, capacity {npu.ub_bytes} ({target.name})")
    row_boxes = -(-padded[0] // rows)
    if row_boxes < len(cores) and cols == padded[last]:   # few rows: the columns shared out too
        per = -(-padded[last] // step1 // -(-len(cores) // row_boxes)) * step1
        cols = max(step1, min(cols, per))
    program = Program(inputs=[src], outputs=[dst])
    alloc = Allocator(program)
    full, packed_full = box_shape(rows, cols), f.packed_shape(box_shape(rows, cols))
    nd = [alloc(f"nd{s}", "UB", full, dtype) for s in range(2)]
    fractal = [alloc(f"packed{s}", "UB", packed_full, dtype) for s in range(2)]
    at0, at1 = f.outer_axis(rank, 0), f.outer_axis(rank, last)
    instrs: list = []
    boxes = [(r0, c0) for r0 in range(0, padded[0], rows) for c0 in range(0, padded[last], cols)]
    for t, (r0, c0) in enumerate(boxes):
        core, slot = cores[t % len(cores)], (t // len(cores)) % 2
        box = box_shape(min(rows, padded[0] - r0), min(cols, padded[last] - c0))
        packed_box = f.packed_shape(box)
        start = [0] * len(packed_box)
        start[at0], start[at1] = r0 // step0, c0 // step1
        flat = Gm(logical[0], (r0,) + (0,) * (rank - 2) + (c0,), box)
        blocks = Gm(dst[0] if pack else src[0], tuple(start), packed_box)
        here, there = _view(nd[slot], box), _view(fractal[slot], packed_box)
        instrs.append(ScalarOp(core, "scalar", cycles=8, note=f"{fmt} box"))
        if pack:
            instrs.append(CopyIn(core, "MTE2", src=flat, dst=here))
            instrs.append(VecOp(core, "vector", op="pack", dst=there, srcs=(here,), attrs=(fmt,)))
            instrs.append(CopyOut(core, "MTE3", src=there, dst=blocks))
        else:
            instrs.append(CopyIn(core, "MTE2", src=blocks, dst=there))
            instrs.append(VecOp(core, "vector", op="unpack", dst=here, srcs=(there,), attrs=(fmt,)))
            instrs.append(CopyOut(core, "MTE3", src=here, dst=flat))
    program.instrs = insert_flags(instrs)
    program.cores = tuple(c for c in cores if any(i.core == c for i in program.instrs))
    return program
