"""GPU kernel cost: roofline with register pressure, occupancy, the spill cliff and uncoalesced access.

Registers per thread are estimated from the kernel body's peak number of live values; the occupancy
formula is the CUDA one (reference/hardware-and-jax-facts.md); below `HIDING_OCCUPANCY` a kernel cannot
keep enough memory requests in flight and its memory time grows in proportion (compute-bound kernels
such as GEMMs rely on instruction-level parallelism, so their compute time is not scaled); past 255
registers the compiler spills to local memory, which costs global traffic (a cliff, not a slope); a
transposed access touches a 32-byte sector per 4-byte element. A tiled matrix kernel refills its
shared-memory tiles from L2 (its re-reads, at L2 bandwidth) while DRAM sees what L2 cannot keep: its
memory time is the larger of the two.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from superopt.extract.models.base import KindModel
from superopt.extract.models.breakdown import Breakdown
from superopt.extract.target import GpuSpec, Target
from superopt.extract.tiling import nest_of, tilings

BASE_REGISTERS = 16        # thread/block indices, addresses, loop counters: an estimate for simple kernels
HIDING_OCCUPANCY = 0.5     # occupancy a memory-bound kernel needs to hide DRAM latency (estimate)
SECTOR_BYTES = 32          # DRAM transaction granule: a strided 4-byte access wastes the rest of the sector
REG_GRANULE = 256          # registers are allocated per warp in units of 256
MATMUL_REGISTERS = 96      # a 128x128 tile over 256 threads: 64 fp32 accumulators + operand fragments (estimate)
MATRIX_DTYPES = frozenset({"float16", "bfloat16"})  # what tensor cores take at their peak


@dataclass(frozen=True)
class GpuKernel:
    flops: float
    bytes: float                      # global memory traffic with coalesced access
    live_values: int = 8              # peak live scalar values per thread in the body
    value_bytes: int = 4
    threads_per_block: int = 256
    smem_per_block: int = 0
    uncoalesced_bytes: float = 0.0    # of `bytes`, the part accessed with a transposed (strided) pattern
    tensor_cores: bool = False
    work_items: int = 0               # threads launched in all (for spill traffic); 0: bytes / value_bytes
    l2_bytes: float = 0.0             # tiled kernels: bytes read from L2 into shared memory (re-reads included)


def registers_per_thread(live_values: int, value_bytes: int = 4) -> int:
    return BASE_REGISTERS + live_values * max(1, math.ceil(value_bytes / 4))


def occupancy(regs: int, threads_per_block: int, smem_per_block: int, gpu: GpuSpec) -> tuple[int, float]:
    """(resident blocks per SM, occupancy in [0, 1])."""
    warps = math.ceil(threads_per_block / 32)
    regs = min(regs, gpu.max_regs_per_thread)          # beyond this the compiler spills instead
    per_warp = math.ceil(regs * 32 / REG_GRANULE) * REG_GRANULE
    by_warps = gpu.max_warps_per_sm // warps
    by_regs = gpu.regs_per_sm // (per_warp * warps)
    by_smem = gpu.smem_per_sm // (math.ceil((smem_per_block + 1024) / 128) * 128) if smem_per_block else by_warps
    blocks = min(by_warps, by_regs, by_smem, gpu.max_blocks_per_sm)
    return blocks, blocks * warps / gpu.max_warps_per_sm


def occupancy_penalty(occ: float) -> float:
    if occ <= 0:
        return math.inf                                   # the kernel cannot launch
    return max(1.0, HIDING_OCCUPANCY / occ)


@dataclass(frozen=True)
class GpuBreakdown(Breakdown):
    registers: int = 0
    blocks_per_sm: int = 0
    occupancy: float = 1.0
    occupancy_penalty: float = 1.0
    spilled_registers: int = 0
    spill_bytes: float = 0.0
    uncoalesced_extra_bytes: float = 0.0

    def factors(self) -> list[str]:
        return [f"{self.registers} regs", f"occupancy {self.occupancy:.2f}"]

    def notes(self) -> list[str]:
        notes = []
        if self.occupancy_penalty > 1:
            notes.append(f"occupancy penalty x{self.occupancy_penalty:.2f}")
        if self.spilled_registers:
            notes.append(f"{self.spilled_registers} regs spilled")
        if self.uncoalesced_extra_bytes:
            notes.append(f"uncoalesced access +{self.uncoalesced_extra_bytes:.3g} B")
        return notes + super().notes()


def breakdown(k: GpuKernel, target: Target) -> GpuBreakdown:
    """Every factor of the kernel's time, for reports; `time` is in seconds."""
    gpu = target.gpu
    regs = registers_per_thread(k.live_values, k.value_bytes)
    blocks, occ = occupancy(regs, k.threads_per_block, k.smem_per_block, gpu)
    spilled = max(0, regs - gpu.max_regs_per_thread)
    items = k.work_items or max(1, int(k.bytes // k.value_bytes))
    spill_bytes = spilled * 4 * 2 * items                 # each spilled value stored and loaded once per thread
    wasted = k.uncoalesced_bytes * (SECTOR_BYTES / k.value_bytes - 1)
    moved = k.bytes + wasted + spill_bytes
    peak = target.matrix_flops if k.tensor_cores and target.matrix_flops else target.peak_flops
    compute, memory = k.flops / peak, max(moved / target.mem_bandwidth, k.l2_bytes / gpu.l2_bandwidth)
    penalty = occupancy_penalty(occ)
    return GpuBreakdown(max(compute, memory * penalty) + target.launch_overhead, k.flops, moved, registers=regs,
                        blocks_per_sm=blocks, occupancy=occ, occupancy_penalty=penalty, spilled_registers=spilled,
                        spill_bytes=spill_bytes, uncoalesced_extra_bytes=wasted)


def kernel_time(k: GpuKernel, target: Target) -> float:
    return breakdown(k, target).time


class GpuModel(KindModel):
    """A GPU: each kernel a roofline with register pressure, occupancy, spills and uncoalesced access; a
    matmul on tensor cores for f16/bf16 operands; a tiled kernel's re-reads served by L2."""
    kind = "gpu"
    platforms = ("gpu", "cuda", "rocm")
    backends = ("pallas",)

    def matrix_unit(self, ins):
        return bool(ins) and ins[0][1] in MATRIX_DTYPES

    def tiled_bytes(self, tiling, body, ins, out, target):
        # Shared-memory tiles are refilled from L2; global memory sees the re-reads that L2 (tiled the same
        # way, at its own capacity) cannot hold.
        outer = tilings(nest_of(body, tuple(ins), out), target.gpu.l2_bytes, self.tile_granule)
        return (outer[0].moved_bytes if outer else tiling.moved_bytes), tiling.moved_bytes

    def kernel(self, k, moved, matrix_rate, body, ins, out, target, tiling=None, l2_moved=0.0, packed=False):
        per_thread = math.ceil(k.row_elements / 256) if k.row_reduction else 1
        regs_values = k.live_values * per_thread + (MATMUL_REGISTERS if k.matrix_flops else 0)
        # A tiled transpose stages through shared memory and stays coalesced; inside a kernel that also
        # computes, the permuted side is accessed with a stride.
        strided = 0.0 if k.pure_movement or (k.matrix_flops and not k.epilogue_ops) else k.strided_bytes
        kernel = GpuKernel(k.flops, moved, live_values=regs_values, value_bytes=k.value_bytes,
                           uncoalesced_bytes=min(strided, moved),
                           tensor_cores=bool(k.matrix_flops) and matrix_rate == target.matrix_flops,
                           smem_per_block=8192 if k.pure_movement and k.strided_bytes else 0, l2_bytes=l2_moved)
        return breakdown(kernel, target)


MODEL = GpuModel()
