"""Ascend-style NPU kernel cost: cube versus vector placement, buffer capacities as hard limits,
format conversions, and the 910B's cube-to-vector exchange through global memory.

A kernel that does not fit its buffers costs infinity (it cannot run as tiled). Vector kernels keep
every live tile in the Unified Buffer, twice over when double-buffered (ping-pong). Cube kernels hold
their A, B and C tiles in L0A, L0B and L0C (fp32 accumulation) and stage them in L1. The cube reads its
operands in fractal layouts (ZZ, ZN) and writes its result in one (NZ / NC1HWC0). On the 910B the copy
into L1 converts an ND operand and FixPipe converts the result to ND on the way out, for free; the 910
converts on no copy, so an ND operand or result costs a TransData pass (`NpuSpec.nd_on_copy`). A vector
op fused behind the cube that needs ND along the fractal axis (a reduction such as LayerNorm) needs a
TransData pass, which is slow (strided 16-element fractal rows). On the 910B the cube and vector cores
are separate and exchange data through global memory, so a cube->vector fusion saves no traffic there.
The cube multiplies int8 operands at twice its fp16 rate (a 16x32x16 fractal per cycle, as the emulator
runs it).

The tiles of a cube kernel (a GEMM, a convolution's implicit GEMM, a GEMM chain) are this model's choice,
made once: `gemm_tiles` and `chain_tiles` rank tilings by a `CubeEstimate` of the program the code
generator (`lowering/npu/codegen.py`) writes for them: the busiest core's queues (copies into L1 with
their start-up latency at one core's share of the bandwidth, L1 -> L0 loads, the cube's fractal products
and the drains of L0C), run in the order the generator's flags allow, with the output tiles (a chain's
(m, l) tiles) dealt to `npu.cores` in turn, and only tiles whose L1, L0A/L0B and L0C use fits. The extractor
offers the best of them (`extract/tiling.py:npu_tilings`) and prices a kernel by its estimate; the
lowering runs the tiles it is given.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from superopt.core import lazy
from superopt.core.formats import CUBE_K_PER_CYCLE, CUBE_L0_BLOCK, FRACTAL
from superopt.core.serial import register
from superopt.extract.models.base import KindModel
from superopt.extract.models.boxes import BoxError, smallest_footprint, vector_stages
from superopt.extract.models.breakdown import Breakdown
from superopt.extract.target import Target

tiling_module = lazy.module("superopt.extract.tiling")   # which ranks tilings by this model's estimates

# Vector kernels stream tiles of about this many bytes per buffer, whole rows at least.
VECTOR_TILE = 16 * 1024
CUBE_TILE = (128, 128, 64)

TRANSDATA_EFFICIENCY = 0.25   # fraction of bandwidth a fractal<->ND conversion reaches (strided 32 B rows; estimate)
ALIGN = 32                    # UB allocations are 32-byte aligned (reference facts)


@dataclass(frozen=True)
class NpuKernel:
    unit: str                         # "cube" or "vector"
    flops: float
    bytes: float                      # global memory traffic
    ub_live_bytes: int = 0            # vector: bytes of the tiles live in the UB at once
    double_buffer: bool = True
    l0a_bytes: int = 0                # cube: tile bytes in L0A / L0B / L0C and L1
    l0b_bytes: int = 0
    l0c_bytes: int = 0
    l1_bytes: int = 0
    transdata_bytes: float = 0.0      # bytes converted between fractal and ND inside the kernel
    transdata_launches: int = 0       # TransData passes that run as kernels of their own (each one launch)
    gm_exchange_bytes: float = 0.0    # bytes passed from cube to vector cores through global memory (910B)
    vector_flops: float = 0.0         # cube kernels: the epilogue's work on the vector unit
    int8: bool = False                # cube kernels: int8 operands, a 16x32x16 fractal per cycle (fp16: 16x16x16)
    estimate: object = None           # cube kernels: the tiles' CubeEstimate (cycles of the busiest core), if tiled
    side_bytes: float = 0.0           # cube kernels: operands beside the matrix ones (bias, scale, residual), read once


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def fits(k: NpuKernel, target: Target) -> tuple[bool, str]:
    """Whether the kernel's tiles fit its buffers, and if not, which and by how much."""
    npu = target.npu
    ub = _aligned(k.ub_live_bytes) * (2 if k.double_buffer else 1)
    for name, need, have in (("UB", ub, npu.ub_bytes), ("L0A", k.l0a_bytes, npu.l0a_bytes),
                             ("L0B", k.l0b_bytes, npu.l0b_bytes), ("L0C", k.l0c_bytes, npu.l0c_bytes),
                             ("L1", k.l1_bytes, npu.l1_bytes)):
        if need > have:
            return False, f"{name} needs {need} bytes, has {have}"
    return True, ""


@dataclass(frozen=True)
class NpuBreakdown(Breakdown):
    unit: str = "vector"                   # the cube or the vector unit
    ub_bytes: int = 0                      # Unified Buffer bytes the kernel's tiles hold
    fits: bool = True
    transdata_seconds: float = 0.0         # format conversions on the vector unit
    gm_exchange_seconds: float = 0.0       # cube -> vector through global memory (a separated chip)
    cube_estimate: object = None           # the tiles' CubeEstimate, for a tiled cube kernel

    def factors(self) -> list[str]:
        return [self.unit, f"UB {self.ub_bytes} B"]

    def notes(self) -> list[str]:
        notes = super().notes()
        if self.transdata_seconds:
            notes.append(f"TransData {self.transdata_seconds * 1e6:.1f} us")
        if self.gm_exchange_seconds:
            notes.append(f"cube->vector via GM {self.gm_exchange_seconds * 1e6:.1f} us")
        return notes


def breakdown(k: NpuKernel, target: Target) -> NpuBreakdown:
    npu = target.npu
    ok, why = fits(k, target)
    rate = npu.cube_flops * (2 if k.int8 else 1) if k.unit == "cube" else npu.vector_flops
    compute = max(k.flops / rate, k.vector_flops / npu.vector_flops)
    transdata = 2 * k.transdata_bytes / (target.mem_bandwidth * TRANSDATA_EFFICIENCY)
    exchange = 2 * k.gm_exchange_bytes / target.mem_bandwidth if npu.separated else 0.0
    memory = k.bytes / target.mem_bandwidth + transdata + exchange
    if k.estimate is not None:
        # The tiles on the busiest core (the cores they leave idle, each transfer's start-up, the drains)
        # stand for the cube's compute and its own transfers; the epilogue's vector work, conversions and
        # exchanges come after it, as the lowering runs them (stages in sequence).
        cube = k.estimate.cycles / npu.clock_hz
        compute = max(k.flops / rate, cube) + k.vector_flops / npu.vector_flops
        memory = cube + k.side_bytes / target.mem_bandwidth + transdata + exchange
    time = max(compute, memory) + target.launch_overhead * (1 + k.transdata_launches) if ok else math.inf
    return NpuBreakdown(time, k.flops + k.vector_flops, k.bytes, why, unit=k.unit,
                        ub_bytes=_aligned(k.ub_live_bytes) * (2 if k.double_buffer else 1), fits=ok,
                        transdata_seconds=transdata, gm_exchange_seconds=exchange, cube_estimate=k.estimate)


def kernel_time(k: NpuKernel, target: Target) -> float:
    return breakdown(k, target).time


def matmul_tiles(tm: int, tn: int, tk: int, itemsize: int = 2) -> dict:
    """Buffer use of one cube matmul tile step: A in L0A, B in L0B, fp32 C in L0C, A and B staged in L1."""
    return {"l0a_bytes": tm * tk * itemsize, "l0b_bytes": tk * tn * itemsize, "l0c_bytes": tm * tn * 4,
            "l1_bytes": 2 * (tm * tk + tk * tn) * itemsize}


# ---- cube programs: tiles, buffers and cycles of a tiled GEMM or GEMM chain ----
# The cube's figures as `lowering/npu/codegen.py` and the emulator run them: 16x16 fractals, L0 blocks of
# 128x128 (fp16; the K edge holds the same bytes in other types), fp32 (int32) accumulation in L0C, and
# the operand types the cube multiplies.
GEMM_EDGES = (16, 32, 64, 128, 256, 512)              # M and N tile edges a GEMM may take (and the extents)
DEPTHS = (16, 32, 64, 128, 256, 512, 1024)            # K tile edges
CHAIN_EDGES = (16, 32, 64, 128, 256, 512)             # M and L tile edges of a chain


def _item(dtype: str) -> int:
    return {"int8": 1, "bool": 1, "float32": 4, "int32": 4, "float64": 8, "int64": 8}.get(dtype, 2)


def _up(n: float, m: int = FRACTAL) -> int:
    return -(-int(n) // m) * m


def _cdiv(a: float, b: float) -> int:
    return -(-int(a) // int(b))


def cube_type(dtype: str, target: Target, other: str | None = None) -> str:
    """The type the cube multiplies a matmul of `dtype` (and `other`) operands in: int8 and bf16 as they
    are, float32 as fp32 where the chip's cube takes it (the emulator's default precision there) and as
    fp16 elsewhere."""
    if dtype == "int8":
        return "int8"
    if {dtype, other or dtype} & {"float32", "float64"}:
        return "float32" if target.npu.cube_fp32 else "float16"
    return "bfloat16" if dtype == "bfloat16" else "float16"


def _depth_block(cube_dt: str) -> int:
    return CUBE_L0_BLOCK * 2 // max(2, _item(cube_dt))


@register   # a Tiling's estimate: cached with the kernel that carries it
@dataclass(frozen=True)
class CubeEstimate:
    """The NPU model's estimate of one tiled cube program (`gemm_estimate`, `chain_estimate`): each core
    runs its queues in parallel, so the busiest core's busiest queue bounds the program."""
    bytes_moved: float        # GM bytes the tiles move (the Chimera model's DV for these tiles)
    cube_cycles: int          # the busiest core's cube queue: fractal products and the drains of L0C
    dma_cycles: int           # the busiest core's MTE2: each transfer's start-up plus its bytes at one core's
                              # share of the chip's bandwidth
    mte1_cycles: int          # the busiest core's L1 -> L0A/L0B loads
    cores: int                # cores that get tiles (output tiles dealt to `npu.cores` in turn)
    cycles: int               # the estimate: the bound below, plus what cannot overlap it

    @property
    def bound(self) -> str:
        """The queue that bounds the program: "cube", "dma" or "mte1"."""
        return max((self.cube_cycles, "cube"), (self.dma_cycles, "dma"), (self.mte1_cycles, "mte1"))[1]


def gemm_buffers(tm: int, tn: int, tk: int, k: int, cube_dt: str, target: Target) -> dict | None:
    """Bytes per on-chip space of a GEMM on tiles TM x TN x TK as the generator allocates them: two slots
    of the A and B tiles in L1 and of the L0 blocks, the output tile in L0C (twice where it fits; an
    output tile larger than L0C gathers its rows over the whole K in L1 and drains block by block).
    None where they do not fit the target's buffers."""
    npu, ci = target.npu, _item(cube_dt)
    tm, tn, tk = _up(tm), _up(tn), _up(tk)
    acc = tm * tn * 4
    whole_k = acc > npu.l0c_bytes
    kk = _up(k) if whole_k else tk
    bm, bn, bk = min(tm, CUBE_L0_BLOCK), min(tn, CUBE_L0_BLOCK), min(kk, _depth_block(cube_dt))
    use = {"l1_bytes": (1 if whole_k else 2) * (tm * kk + kk * tn) * ci,
           "l0a_bytes": 2 * bm * bk * ci, "l0b_bytes": 2 * bk * bn * ci,
           "l0c_bytes": 2 * bm * bn * 4 if whole_k else (2 if 2 * acc <= npu.l0c_bytes else 1) * acc}
    return use if all(v <= getattr(npu, name) for name, v in use.items()) else None


def gemm_estimate(batch: int, m: int, n: int, k: int, tiles: dict, items: tuple, cube_dt: str,
                  target: Target) -> CubeEstimate:
    """C = A @ B (batch x M x N x K) on tiles {m, n, k} with the reduction innermost: each output tile's
    K steps copy an A and a B tile in (two transfers), multiply them block by block and drain the tile
    from L0C to GM; output tiles are dealt to the cube cores in turn. `items`: bytes per element of A, B
    and C in GM; `cube_dt`: the type the cube multiplies in."""
    npu, ci = target.npu, _item(cube_dt)
    ia, ib, ic = items
    t = {x: max(1, min(int(tiles[x]), e)) for x, e in (("m", m), ("n", n), ("k", k))}
    steps = {x: _cdiv(e, t[x]) for x, e in (("m", m), ("n", n), ("k", k))}
    tm, tn, tk = _up(t["m"]), _up(t["n"]), _up(t["k"])
    whole_k = tm * tn * 4 > npu.l0c_bytes
    depth = _up(k) if whole_k else tk
    bm, bn, bk = min(tm, CUBE_L0_BLOCK), min(tn, CUBE_L0_BLOCK), min(depth, _depth_block(cube_dt))
    bpc = target.mem_bandwidth / npu.cores / npu.clock_hz
    tiles_out = batch * steps["m"] * steps["n"]
    per_core = _cdiv(tiles_out, npu.cores)
    rows, cols = t["m"], t["n"]      # one output tile: the busiest core runs a whole one (edge tiles are smaller)
    moved_tile = rows * k * ia + k * cols * ib
    dma = 2 * steps["k"] * npu.dma_latency_cycles + moved_tile / bpc
    blocks = _cdiv(tm, bm) * _cdiv(tn, bn)
    passes = steps["k"] * _cdiv(tk, bk) if not whole_k else _cdiv(depth, bk)
    load = _cdiv(bm * bk * ci, npu.mte1_bytes_per_cycle) + _cdiv(bk * bn * ci, npu.mte1_bytes_per_cycle)
    product = (bm // FRACTAL) * (bn // FRACTAL) * _cdiv(bk, CUBE_K_PER_CYCLE.get(cube_dt, FRACTAL))
    mte1, mmad = blocks * passes * load, blocks * passes * product
    out_block = min(bm, rows) * min(bn, cols) * ic
    drain = blocks * max(_cdiv(bm * bn * 4, npu.fixpipe_bytes_per_cycle), npu.dma_latency_cycles + out_block / bpc)
    cube = mmad + drain
    moved = batch * (m * k * ia * steps["n"] + k * n * ib * steps["m"] + m * n * ic)
    # The busiest core's tiles step by step, as the generator's flags order them: a queue that waits for
    # another waits for everything that queue was given before, and a flag already raised covers the
    # next slot too (`codegen.insert_flags`). So a K step's copies wait for the loads before them every
    # other step (their L1 slot's last reader is two steps back), the loads wait for the copies, and
    # for the cube (the L0 slots' last reader) every other block, and a tile's drain holds the cube.
    # Four tiles are run and the rest extrapolated from the last two (every tile is alike).
    copy = 2 * npu.dma_latency_cycles + (rows * t["k"] * ia + t["k"] * cols * ib) / bpc
    step_mte1, step_mmad = mte1 / steps["k"], mmad / steps["k"]
    per_step = blocks * (passes // steps["k"] if not whole_k else passes)     # L0 slot uses per K step
    q2 = q1 = qc = 0.0
    ends, n_step, n_pass = [], 0, 0
    for _ in range(min(per_core, 4)):
        if whole_k:      # the K steps gather in L1; the tile is multiplied and drained block by block after
            q2 = (q2 if n_step < 1 else max(q2, q1)) + steps["k"] * copy
            start = max(q2, qc)
            q1 = start + mte1
            qc = start + max(load + mmad + drain, mte1 + product + drain / blocks)
            n_step += 1
            ends.append(qc)
            continue
        for _ in range(steps["k"]):
            q2 = (max(q2, q1) if n_step >= 2 and n_step % 2 == 0 else q2) + copy
            start = max(q2, qc) if per_step >= 2 or n_pass % 2 == 0 else q2
            q1 = start + step_mte1
            qc = max(qc, start + load) + step_mmad
            qc = max(qc, start + step_mte1 + product)
            n_step += 1
            n_pass += per_step
        qc += drain
        ends.append(qc)
    period = (ends[-1] - ends[-3]) / 2 if len(ends) > 3 else 0.0
    cycles = ends[-1] + (per_core - len(ends)) * period
    return CubeEstimate(moved, int(per_core * cube), int(per_core * dma), int(per_core * mte1),
                        min(npu.cores, tiles_out), int(cycles))


def streams(tm: int, tl: int, tk: int, k: int) -> bool:
    """Whether a GEMM chain on tiles TM x TL x TK streams K: where the C tile is one L0C block, it
    accumulates there over K tiles copied into two L1 slots in turn, so L1 holds one K tile of A and B,
    not their whole K (the generator's choice, `codegen.chain_program`)."""
    return tk < k and _up(tm) <= CUBE_L0_BLOCK and _up(tl) <= CUBE_L0_BLOCK


def chain_buffers(tm: int, tl: int, tn: int, k: int, cube_dt: str, target: Target,
                  tk: int | None = None) -> dict | None:
    """Bytes per on-chip space of a GEMM chain on tiles TM x TL (TN of the second GEMM's N, TK of K) as
    the generator allocates them: the A rows and B columns over the whole K (two slots of one K tile of
    each where K streams, `streams`), the C tile and two D tiles in L1, two L0 blocks and two
    accumulator blocks. None where they do not fit."""
    npu, ci = target.npu, _item(cube_dt)
    tk = k if tk is None else tk
    ab = 2 * (_up(tm) * _up(tk) + _up(tk) * _up(tl)) if streams(tm, tl, tk, k) else (_up(tm) + _up(tl)) * _up(k)
    tm, tl, tn = _up(tm), _up(tl), _up(tn)
    db = _depth_block(cube_dt)
    use = {"l1_bytes": (ab + tm * tl + 2 * tl * tn) * ci, "l0a_bytes": 2 * CUBE_L0_BLOCK * db * ci,
           "l0b_bytes": 2 * db * CUBE_L0_BLOCK * ci, "l0c_bytes": 2 * CUBE_L0_BLOCK * CUBE_L0_BLOCK * 4}
    return use if all(v <= getattr(npu, name) for name, v in use.items()) else None


def chain_estimate(batch: int, m: int, n: int, k: int, l: int, tiles: dict, items: tuple, cube_dt: str,
                   target: Target) -> CubeEstimate:
    """E = (A @ B) @ D (batch x M x N x K x L) on tiles {m, l, k, n}: per (m, l) tile the chip copies the A
    rows and B columns in K tiles, computes the C tile block by block into L1 (or, where K streams, one
    block accumulated over the K tiles as they arrive), then streams D tiles over n and adds each E tile
    into GM. The batch entries' (m, l) tiles are dealt to the cube cores in turn (the l tiles of one m
    tile to neighbouring cores, which add into the same E tile: GM's atomic add). Where one l tile covers
    L in a chain of one batch entry, every m tile multiplies the same B (and, with one n tile, the same
    D): each core copies them once and keeps them in L1 (`resident`). `items`: bytes per element of A, B,
    D and E in GM."""
    npu, ci = target.npu, _item(cube_dt)
    ia, ib, id_, ie = items
    ext = {"m": m, "n": n, "k": k, "l": l}
    t = {x: max(1, min(int(tiles[x]), e)) for x, e in ext.items()}
    steps = {x: _cdiv(e, t[x]) for x, e in ext.items()}
    tm, tl, tn, kk = _up(t["m"]), _up(t["l"]), _up(t["n"]), _up(k)
    blk, dblk = CUBE_L0_BLOCK, _depth_block(cube_dt)
    kstep = CUBE_K_PER_CYCLE.get(cube_dt, FRACTAL)
    bpc = target.mem_bandwidth / npu.cores / npu.clock_hz
    mtiles = batch * steps["m"]
    per_core = _cdiv(mtiles * steps["l"], npu.cores)      # (m, l) tiles dealt to the cores in turn
    lat, w1 = npu.dma_latency_cycles, npu.mte1_bytes_per_cycle
    stream = streams(t["m"], t["l"], t["k"], k)
    keep_b, keep_d = resident(batch, steps, stream)
    # C = A @ B: one L0C block at a time over the whole K, drained into L1
    cblocks = _cdiv(tm, blk) * _cdiv(tl, blk)
    bm, bl = min(tm, blk), min(tl, blk)
    cdepth = _cdiv(kk, dblk)
    c_mte1 = cblocks * cdepth * (_cdiv(bm * min(dblk, kk) * ci, w1) + _cdiv(min(dblk, kk) * bl * ci, w1))
    c_fix = cblocks * _cdiv(bm * bl * 4, npu.fixpipe_bytes_per_cycle)
    c_cube = cblocks * cdepth * (bm // FRACTAL) * (bl // FRACTAL) * _cdiv(min(dblk, kk), kstep) + c_fix
    # E += C @ D over n tiles: E blocks over the whole L depth, each added into GM
    eblocks = steps["n"] * _cdiv(tm, blk) * _cdiv(tn, blk)
    bn = min(tn, blk)
    edepth = _cdiv(tl, dblk)
    e_mte1 = eblocks * edepth * (_cdiv(bm * min(dblk, tl) * ci, w1) + _cdiv(min(dblk, tl) * bn * ci, w1))
    e_mmad = eblocks * edepth * (bm // FRACTAL) * (bn // FRACTAL) * _cdiv(min(dblk, tl), kstep)

    def drains(rows: int) -> float:
        """Adding a tile's E blocks (of `rows` rows) into GM, over all n tiles."""
        e_out = min(bm, rows) * min(bn, n / steps["n"]) * ie
        return eblocks * max(_cdiv(bm * bn * 4, npu.fixpipe_bytes_per_cycle), lat + e_out / bpc)

    # A core's tiles in turn, phase by phase, as the generator's flags order them: a queue that waits
    # for another waits for everything that queue was given before (`codegen.insert_flags`). A, B and C
    # have one L1 slot each, so a tile's A and B copies wait for the previous tile's loads, and each D
    # copy but the second of a tile waits for the loads before it (its slot's last reader). The cube
    # runs every tile's whole fractals; the copies and the adds into GM are an edge tile's own size.
    c_lead = _cdiv((bm + bl) * min(dblk, kk) * ci, w1)
    e_tile_mte1, e_tile_mmad = e_mte1 / steps["n"], e_mmad / steps["n"]
    e_lead = _cdiv((bm + bn) * min(dblk, tl) * ci, w1)
    # where K streams, each K tile's depth (the last may be short) and its L0 loads and products
    ksteps = [(d, c_mte1 / cdepth * _cdiv(_up(d), dblk), (c_cube - c_fix) / cdepth * _cdiv(_up(d), dblk))
              for d in (min(t["k"], k - i * t["k"]) for i in range(steps["k"]))]

    def core_cycles(sequence: tuple) -> float:
        mte2 = mte1 = cube = 0.0
        copied, covered = 0, -1     # where K streams: K tiles copied so far, the last a flag waited for
        for i, (rows, cols) in enumerate(sequence):
            d_one = lat + cols * (n / steps["n"]) * id_ / bpc
            e_tile_cube = e_tile_mmad + drains(rows) / steps["n"]
            if stream:
                # The K tiles alternate between two L1 slots: a copy waits for the loads two back, and the
                # flag that makes it wait fires after every load issued before it, the previous tile's too;
                # that flag then also covers the next copy, which runs without waiting.
                for depth, k_mte1, k_cube in ksteps:
                    if copied - 2 > covered:
                        mte2, covered = max(mte2, mte1), copied - 1
                    mte2 += 2 * lat + (rows * ia + cols * ib) * depth / bpc    # one K tile of A and of B
                    start = max(mte2, cube)
                    mte1 = start + k_mte1
                    cube = max(mte1, start + c_lead + k_cube)
                    copied += 1
                cube += c_fix
            else:
                copy_a = steps["k"] * lat + rows * k * ia / bpc
                copy_b = steps["k"] * lat + k * cols * ib / bpc if i == 0 or not keep_b else 0.0
                mte2 = max(mte2, mte1) + copy_a + copy_b
                start = max(mte2, cube)
                mte1 = start + c_mte1
                cube = max(mte1, start + c_lead + c_cube)
            for j in range(steps["n"]):
                if i == 0 or not keep_d:
                    mte2 = (mte2 if j == 1 or (i == 0 and j < 2) else max(mte2, mte1)) + d_one
                start = max(mte2, cube)
                mte1 = start + e_lead + e_tile_mte1
                cube = max(mte1, start + e_lead + e_tile_cube)
        return cube

    edge = (m - (steps["m"] - 1) * t["m"], l - (steps["l"] - 1) * t["l"])
    cube = max(core_cycles(tuple((edge[0] if m_edge else t["m"], edge[1] if l_edge else t["l"])
                                 for m_edge, l_edge in sequence))
               for sequence in _dealt(batch, steps["m"], steps["l"], npu.cores))
    if steps["l"] > 1:
        # The l parts of one E tile run on neighbouring cores at about the same time, and atomic adds into
        # one GM window take turns (as the emulator runs them): the last part waits for the others'.
        cube += (min(steps["l"], npu.cores) - 1) * drains(t["m"])
    used = min(npu.cores, mtiles * steps["l"])
    b_reads, d_reads = (used if keep_b else steps["m"]), (used if keep_d else steps["m"])
    moved = batch * (m * k * ia * steps["l"] + k * l * ib * b_reads + l * n * id_ * d_reads + m * n * ie * steps["l"])
    copy_a, copy_b = steps["k"] * lat + t["m"] * k * ia / bpc, steps["k"] * lat + k * t["l"] * ib / bpc
    copy_d = steps["n"] * lat + t["l"] * n * id_ / bpc
    copies = per_core * copy_a + (copy_b if keep_b else per_core * copy_b) + (copy_d if keep_d else per_core * copy_d)
    e_cube = e_mmad + drains(t["m"])
    return CubeEstimate(moved, int(per_core * (c_cube + e_cube)), int(copies), int(per_core * (c_mte1 + e_mte1)),
                        used, int(cube))


@lru_cache(maxsize=1024)
def _dealt(batch: int, steps_m: int, steps_l: int, cores: int) -> frozenset:
    """The distinct sequences of tiles the cube cores run when a chain's (batch, m, l) tiles are dealt to
    them in turn (`codegen.chain_program`), each tile as (on the m edge, on the l edge)."""
    count = batch * steps_m * steps_l
    return frozenset(tuple(((i // steps_l) % steps_m == steps_m - 1, i % steps_l == steps_l - 1)
                           for i in range(core, count, cores)) for core in range(min(cores, count)))


def resident(batch: int, steps: dict, stream: bool) -> tuple[bool, bool]:
    """(B, D) of a GEMM chain that each core copies into L1 once and keeps for all its m tiles: B where
    one l tile covers L in a chain of one batch entry and K does not stream, D where one l tile and one
    n tile cover L and N in a chain of one batch entry."""
    once = batch == 1 and steps["l"] == 1
    return once and not stream, once and steps["n"] == 1


def _edges(extent: int, edges: tuple) -> list:
    """Tile edges for a loop: the listed ones (multiples of the fractal) below the extent, the extent
    rounded up to the fractal, and the extent split into 2..4 equal fractal-rounded parts."""
    whole = _up(extent)
    splits = {_up(_cdiv(extent, c)) for c in range(2, 5)}
    return sorted({min(whole, e) for e in edges} | {s for s in splits if s < whole} | {whole})


def gemm_tiles(batch: int, m: int, n: int, k: int, items: tuple, cube_dt: str, target: Target,
               keep: int = 4) -> list:
    """The best tilings of a GEMM on the NPU by `gemm_estimate`, fastest first, as (estimate, order, tiles):
    loop order m, n, k; tiles whose buffers fit (`gemm_buffers`, L0C included). Ties go to the fewer
    bytes moved, then the larger output tile. Remembered: extraction ranks the same GEMM for every kernel
    that holds it, and the lowering ranks it again (the tiles dicts are shared: read them only)."""
    return list(_gemm_tiles(batch, m, n, k, tuple(items), cube_dt, target, keep))


@lru_cache(maxsize=4096)
def _gemm_tiles(batch: int, m: int, n: int, k: int, items: tuple, cube_dt: str, target: Target,
                keep: int) -> tuple:
    ranked = []
    for tm in _edges(m, GEMM_EDGES):
        for tn in _edges(n, GEMM_EDGES):
            for tk in sorted({min(_up(k), d) for d in DEPTHS}):
                if gemm_buffers(tm, tn, tk, k, cube_dt, target) is None:
                    continue
                tiles = {"m": min(tm, m), "n": min(tn, n), "k": min(tk, k)}
                est = gemm_estimate(batch, m, n, k, tiles, items, cube_dt, target)
                ranked.append(((est.cycles, est.bytes_moved, -tm * tn, -tk), est, ("m", "n", "k"), tiles))
    ranked.sort(key=lambda r: r[0])
    return tuple(r[1:] for r in ranked[:keep])


def chain_tiles(batch: int, m: int, n: int, k: int, l: int, items: tuple, cube_dt: str, target: Target,
                keep: int = 4) -> list:
    """The best tilings of a GEMM chain on the NPU by `chain_estimate`, fastest first, as (estimate, order,
    tiles): loop order m, l, k, n with K whole (the generator copies the A rows and B columns over the
    whole K anyway) or, where the C tile is one L0C block, K streamed in tiles (`streams`), and N whole
    where it fits; tiles whose buffers fit (`chain_buffers`). Remembered, as
    `gemm_tiles` is."""
    return list(_chain_tiles(batch, m, n, k, l, tuple(items), cube_dt, target, keep))


@lru_cache(maxsize=4096)
def _chain_tiles(batch: int, m: int, n: int, k: int, l: int, items: tuple, cube_dt: str, target: Target,
                 keep: int) -> tuple:
    ranked = []
    for tm in _edges(m, CHAIN_EDGES):
        for tl in _edges(l, CHAIN_EDGES):
            for tk in [k] + [d for d in DEPTHS if streams(tm, tl, d, k)]:    # whole, or streamed in K tiles
                for tn in sorted({_up(n)} | {e for e in (16, 32, 64, 128) if e < n}, reverse=True):
                    if chain_buffers(tm, tl, tn, k, cube_dt, target, tk) is None:
                        continue
                    tiles = {"m": min(tm, m), "l": min(tl, l), "k": tk, "n": min(tn, n)}
                    est = chain_estimate(batch, m, n, k, l, tiles, items, cube_dt, target)
                    ranked.append(((est.cycles, est.bytes_moved, -tm * tl, -tk), est, ("m", "l", "k", "n"), tiles))
                    break      # the widest N that fits: narrower ones only add transfers
    ranked.sort(key=lambda r: r[0])
    return tuple(r[1:] for r in ranked[:keep])


def halo_buffers(band: int, tn: int, image: tuple, kernel: tuple, cube_dt: str, target: Target) -> dict | None:
    """Bytes per on-chip space of a 1x1-then-KHxKW convolution chain (`halo_estimate`) on bands of
    `band` output rows and TN output channels, as `codegen.halo_chain_program` allocates them: two
    input windows, T over the band's padded grid, W1, W2's n tile; two L0 blocks and two accumulator
    blocks. `image` is (H, W, C, L, Wo). None where they do not fit."""
    npu, ci = target.npu, _item(cube_dt)
    _, _, c, l, wo = image
    kh, kw = kernel
    grid = (band + kh - 1) * (wo + kw - 1)
    db = _depth_block(cube_dt)
    use = {"l1_bytes": (2 * grid * c + _up(grid + kw - 1) * l + c * l + kh * kw * l * tn) * ci,
           "l0a_bytes": 2 * CUBE_L0_BLOCK * db * ci, "l0b_bytes": 2 * db * CUBE_L0_BLOCK * ci,
           "l0c_bytes": 2 * CUBE_L0_BLOCK * CUBE_L0_BLOCK * 4}
    return use if all(v <= getattr(npu, name) for name, v in use.items()) else None


def halo_estimate(batch: int, image: tuple, kernel: tuple, padding: tuple, n: int, tiles: dict, items: tuple,
                  cube_dt: str, target: Target) -> CubeEstimate:
    """Y = conv(conv1x1(X, W1), W2) with T on chip (`codegen.halo_chain_program`) on tiles {h: output rows
    per band, n: output channels}: per (batch, band, n) tile a core copies the band's input rows and
    halo as one window, computes T over the band's padded grid (Ho rows of Wp = Wo + KW - 1) into L1,
    then the KH x KW taps' shifted GEMMs block by block and writes each block into GM; W1 and W2 (its n
    tile) are copied once per core. `image` is (H, W, C, L, Wo), `items` the bytes per element of X,
    W1, W2 and Y in GM. The busiest core's tiles in turn, as the generator's flags order them (`chain_estimate`)."""
    npu, ci = target.npu, _item(cube_dt)
    h, w, c, l, wo = image
    kh, kw = kernel
    (pt, pb), _ = padding
    ix, iw1, iw2, iy = items
    ho = h + pt + pb - kh + 1
    th, tn = max(1, min(int(tiles["h"]), ho)), max(1, min(int(tiles["n"]), n))
    steps_h, steps_n = _cdiv(ho, th), _cdiv(n, tn)
    wp, rb = wo + kw - 1, th + kh - 1
    blk, dblk = CUBE_L0_BLOCK, _depth_block(cube_dt)
    kstep = CUBE_K_PER_CYCLE.get(cube_dt, FRACTAL)
    bpc = target.mem_bandwidth / npu.cores / npu.clock_hz
    lat, w1, fix = npu.dma_latency_cycles, npu.mte1_bytes_per_cycle, npu.fixpipe_bytes_per_cycle

    def mmad(rows, cols, depth):
        return _cdiv(rows, FRACTAL) * _cdiv(cols, FRACTAL) * _cdiv(depth, kstep)

    def loads(rows, cols, depth):
        return _cdiv(rows * depth * ci, w1) + _cdiv(depth * cols * ci, w1)

    # T = X @ W1 over the band's grid: (cube, MTE1) cycles, fixpipes into L1 on the cube's queue
    g1 = [(min(blk, rb * wp - i), min(blk, l - j), min(dblk, c - z))
          for i in range(0, rb * wp, blk) for j in range(0, l, blk) for z in range(0, c, dblk)]
    g1_cube = sum(mmad(*b) for b in g1) + sum(_cdiv(min(blk, rb * wp - i) * min(blk, l - j) * 4, fix)
                                                for i in range(0, rb * wp, blk) for j in range(0, l, blk))
    g1_mte1 = sum(loads(*b) for b in g1)
    # A load into an L0 slot waits for the product two back, and the flag that makes it wait fires after
    # the product one back (`codegen.insert_flags`); the next load is covered by it: so every other
    # product waits for its loads.
    g1_cube += g1_mte1 / 2
    per_block = max(1, blk // wp)
    blocks = [(min(per_block, th - r) * wp, min(wp, wo)) for r in range(0, th, per_block)] if wp <= blk else \
        [(min(blk, wp - c0), min(blk, wo - c0)) for _ in range(th) for c0 in range(0, wp, blk)]

    @lru_cache(maxsize=None)
    def second(cols_n: int) -> tuple:
        """The taps' GEMMs of one tile of `cols_n` output channels: (cube, MTE1) cycles."""
        cube = mte1 = 0.0
        for rows, out_cols in blocks:
            for j in range(0, cols_n, blk):
                cols = min(blk, cols_n - j)
                for z in range(0, l, dblk):
                    cube += kh * kw * (mmad(rows, cols, min(dblk, l - z)) + loads(rows, cols, min(dblk, l - z)) / 2)
                    mte1 += kh * kw * loads(rows, cols, min(dblk, l - z))
                out = rows // wp * out_cols if wp <= blk else out_cols
                cube += max(_cdiv(rows * cols * 4, fix), lat + out * cols * iy / bpc)
        return cube, mte1

    def x_copy(band: int) -> float:
        first = band * th - pt
        inside = max(0, min(h, first + rb) - max(0, first))
        return lat + inside * w * c * ix / bpc

    deal = [(bt, band, ni) for bt in range(batch) for band in range(steps_h) for ni in range(steps_n)]
    cores = min(npu.cores, len(deal))
    worst = 0.0
    for core in range(cores):
        mte2 = mte1 = cube = 0.0
        held, copied, covered = None, 0, -1
        for i, (bt, band, ni) in enumerate(deal[core::npu.cores]):
            if i == 0:
                mte2 += lat + c * l * iw1 / bpc
            if held != ni:
                mte2 = max(mte2, mte1) + lat + kh * kw * l * min(tn, n - ni * tn) * iw2 / bpc
                held = ni
            if copied - 2 > covered:    # the window two back's slot: the flag covers every load before it
                mte2, covered = max(mte2, mte1), copied - 1
            mte2 += x_copy(band)
            copied += 1
            start = max(mte2, cube)
            mte1 = start + g1_mte1
            cube = max(mte1, start + g1_cube)
            c2, m2 = second(min(tn, n - ni * tn))
            start = cube
            mte1 = max(mte1, start) + m2
            cube = max(mte1, start + c2)
        worst = max(worst, cube)
    moved = batch * (steps_h * rb * w * c * ix * steps_n + min(npu.cores, len(deal)) * (c * l * iw1 + kh * kw * l * n
                     * iw2) + ho * wo * n * iy)
    g2_cube, g2_mte1 = second(min(tn, n))
    per_core = _cdiv(len(deal), npu.cores)
    return CubeEstimate(int(moved), int(per_core * (g1_cube + g2_cube)), int(per_core * x_copy(0)),
                        int(per_core * (g1_mte1 + g2_mte1)), cores, int(worst))


def halo_tiles(batch: int, image: tuple, kernel: tuple, padding: tuple, n: int, items: tuple, cube_dt: str,
               target: Target, keep: int = 4) -> list:
    """The best tilings of a 1x1-then-KHxKW convolution chain by `halo_estimate`, fastest first, as
    (estimate, order, tiles): bands of 1 to 16 output rows (and the output split into up to 4 equal
    bands more), N whole or in tiles of 64 and 128 channels; tiles whose buffers fit (`halo_buffers`).
    Remembered, as `gemm_tiles` is."""
    return list(_halo_tiles(batch, tuple(image), tuple(kernel), tuple(map(tuple, padding)), n, tuple(items), cube_dt,
                            target, keep))


@lru_cache(maxsize=1024)
def _halo_tiles(batch, image, kernel, padding, n, items, cube_dt, target, keep) -> tuple:
    h, _, _, _, _ = image
    (pt, pb), _ = padding
    ho = h + pt + pb - kernel[0] + 1
    bands = sorted({b for b in range(1, 17) if b <= ho} | {_cdiv(ho, s) for s in range(1, 5)})
    ranked = []
    for band in bands:
        for tn in sorted({n} | {e for e in (64, 128) if e < n}, reverse=True):
            if halo_buffers(band, tn, image, kernel, cube_dt, target) is None:
                continue
            tiles = {"h": band, "n": tn}
            est = halo_estimate(batch, image, kernel, padding, n, tiles, items, cube_dt, target)
            ranked.append(((est.cycles, est.bytes_moved, -band), est, ("h", "n"), tiles))
            break       # the widest N that fits: narrower ones only recompute T
    ranked.sort(key=lambda r: r[0])
    return tuple(r[1:] for r in ranked[:keep])


def apart(first: CubeEstimate, second: CubeEstimate, product_bytes: float, target: Target) -> CubeEstimate:
    """A chain's two GEMMs as cube programs one after the other, the product (`product_bytes`) through
    GM; on a chip that converts no ND matrix on copy (the 910) it is also unpacked after the first and
    packed before the second (two TransData passes)."""
    convert = 0.0 if target.npu.nd_on_copy else \
        2 * 2 * product_bytes / (target.mem_bandwidth * TRANSDATA_EFFICIENCY) * target.npu.clock_hz
    return CubeEstimate(first.bytes_moved + second.bytes_moved, first.cube_cycles + second.cube_cycles,
                        first.dma_cycles + second.dma_cycles, first.mte1_cycles + second.mte1_cycles,
                        max(first.cores, second.cores), int(first.cycles + second.cycles + convert))


def smallest_box_bytes(body: tuple) -> int | None:
    """UB bytes the vector code generator needs for the smallest boxes of `body`'s vector work (the largest
    over its vector stages: a prologue or epilogue of a cube kernel; 0 where it has none), or None where
    the body's vector work does not run in boxes as such (the lowering places it otherwise)."""
    try:
        return max((smallest_footprint(sub, roots) for sub, roots in vector_stages(body)), default=0)
    except BoxError:
        return None


class NpuModel(KindModel):
    """An Ascend-style NPU (module doc): a kernel on the cube or the vector unit, its buffers hard limits, its
    format conversions priced; programs run on the emulator by default."""
    kind = "npu"
    backends = ("emulator",)
    default_backend = "emulator"
    rows_first = True

    def kernel(self, k, moved, matrix_rate, body, ins, out, target, tiling=None, l2_moved=0.0, packed=False):
        row_bytes = (out[0][-1] if out[0] else 1) * k.value_bytes
        if k.row_reduction:
            row_bytes = max(row_bytes, k.row_elements * k.value_bytes)
        row_bytes = max(row_bytes, 1)   # the rows of an empty tensor hold no bytes
        tile = max(row_bytes, (VECTOR_TILE // row_bytes) * row_bytes)
        # A tile per computed value and per operand the vector unit reads; an operand smaller than a
        # tile (a per-channel scale) needs only its own bytes. Matmul operands live in L1/L0, not the UB.
        ub = max(1, k.live_intermediates) * tile + sum(min(tile, b) for b in k.staged_bytes)
        # Where the code generator can run the body's vector work in boxes, what must fit is its smallest
        # box, counted as the generator allocates it (extract/models/boxes.py): the model then never
        # chooses a kernel the generator cannot place, nor refuses one it can (a long elementwise row is
        # cut into chunks).
        boxed = smallest_box_bytes(body)
        buffers = dict(ub_live_bytes=ub) if boxed is None else dict(ub_live_bytes=boxed, double_buffer=False)
        if not k.matrix_flops:
            return breakdown(NpuKernel("vector", k.flops, moved, **buffers, transdata_bytes=k.strided_bytes), target)
        # A reduction behind the cube needs its fractal output in ND, and a permuted write is a format
        # conversion too: both are TransData passes on the vector unit. A target that converts no ND matrix on
        # copy (the 910) packs the cube's operands and unpacks its result with TransData too, on every call.
        if not packed and not target.npu.nd_on_copy:
            converted, launches = k.cube_gm_bytes, k.cube_gm_tensors
        else:
            converted, launches = (k.matmul_bytes if k.reduce_after_matmul else 0.0), 0
        extra = dict(transdata_bytes=converted + k.strided_bytes, transdata_launches=launches,
                     gm_exchange_bytes=k.matmul_bytes if k.epilogue_ops else 0.0)
        if boxed is None and not k.epilogue_ops:
            buffers = {}
        tiles = {**matmul_tiles(*CUBE_TILE), **({"l1_bytes": tiling.tile_bytes} if tiling else {})}
        side = tiling_module.nest_of(body, tuple(ins), out).extra_bytes if tiling is not None else 0.0
        kernel = NpuKernel("cube", k.matrix_flops, moved, vector_flops=k.flops - k.matrix_flops, int8=k.int8_matrix,
                           **buffers, **tiles, **extra, estimate=tiling.estimate if tiling is not None else None,
                           side_bytes=side)
        return breakdown(kernel, target)


MODEL = NpuModel()
