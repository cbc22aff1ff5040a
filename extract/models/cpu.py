"""The CPU model: a roofline of the kernel XLA runs, with the bytes its fusion does not save.

On a CPU the program runs through XLA, which fuses elementwise ops with each other but not into a dot:
what a kernel computes before its matmul (a prologue) and the matmul's result that an epilogue computes on
are written out and read back (`unfused_bytes`). A dot takes and gives either orientation for free, but an
elementwise loop that reads a transposed operand walks it across cache lines (`strided_bytes`, charged by
the caller as that many bytes again). Bytes that fit the cache move at the cache's bandwidth, and a lone
dot reads them at its own (`dot_read_bandwidth`).
"""
from __future__ import annotations

from dataclasses import dataclass

from superopt.core import lazy
from superopt.extract.models.base import KindModel
from superopt.extract.models.breakdown import Breakdown
from superopt.extract.target import Target

xla = lazy.module("superopt.extract.xla")   # XLA's fusions, priced by this model's kernels (it imports them back)

STRIDED_CPU_FACTOR = 2      # a transposed f32 read inside an XLA CPU loop fusion: cache lines re-read (estimate)


@dataclass(frozen=True)
class CpuBreakdown(Breakdown):
    unfused_bytes: float = 0.0      # written out and read back around a dot (included in `bytes`)
    strided_bytes: float = 0.0      # re-read by a loop walking a transposed operand (included in `bytes`)
    cached: bool = False            # the bytes fit the cache


def breakdown(flops: float, matrix_flops: float, moved: float, unfused: float, strided: float,
              matrix_rate: float, target: Target, reduced: float = 0.0) -> CpuBreakdown:
    """`moved`: the bytes the kernel's operands and result take, before `unfused` and `strided` are added;
    `reduced`: the bytes of the largest operand a reduction of the kernel reads."""
    moved += unfused + strided
    compute = matrix_flops / matrix_rate + (flops - matrix_flops) / target.peak_flops
    if reduced > target.reduction_split_bytes:
        # XLA's CPU reduction loops take a slower path past a size: a fixed cost more, whatever the loop
        # computes, hidden like the rest of its arithmetic where the loop waits on memory.
        compute += target.reduction_split_overhead
    cached = bool(target.cache_bandwidth) and moved <= target.cache_resident_bytes
    bandwidth = target.cache_bandwidth if cached else target.mem_bandwidth
    if matrix_flops and not unfused and moved <= target.dot_read_bytes:
        # A dot with nothing fused around it only reads (its result is a small share of its bytes where it
        # is memory-bound, as a matrix-vector product is): XLA's GEMV streams a small matrix from the core's
        # cache faster than a loop that reads and writes moves its bytes.
        bandwidth = max(bandwidth, target.dot_read_bandwidth)
    return CpuBreakdown(max(compute, moved / bandwidth) + target.launch_overhead, flops, moved,
                        unfused_bytes=unfused, strided_bytes=strided, cached=cached)


def matrix_share(work: float, target: Target) -> float:
    """The share of `target.matrix_flops` a matmul of `work` FLOPs reaches: XLA's GEMM runs a small product at a
    fraction of a large one's rate ((work / matrix_full_work) ** 0.25, at least matrix_least_share)."""
    if not target.matrix_full_work or work >= target.matrix_full_work:
        return 1.0
    return max(target.matrix_least_share, (work / target.matrix_full_work) ** 0.25)


class CpuModel(KindModel):
    """A CPU running XLA's program: priced in XLA's own fusions (extract/xla.py), each a roofline kernel."""
    kind = "cpu"
    platforms = ("cpu",)
    tile_granule = 1
    fuses = True

    def kernel(self, k, moved, matrix_rate, body, ins, out, target, tiling=None, l2_moved=0.0, packed=False):
        # A prologue and an epilogue of a dot are written out and read back, and an elementwise loop reading a
        # transposed operand re-reads it `STRIDED_CPU_FACTOR` times.
        if k.matrix_flops:
            matrix_rate *= matrix_share(k.matrix_flops, target)
        unfused = 2 * (k.prologue_bytes + (k.matmul_bytes if k.epilogue_compute else 0.0)) if k.matrix_flops else 0.0
        strided = 0.0 if k.pure_movement else k.loop_strided_bytes * STRIDED_CPU_FACTOR
        return breakdown(k.flops, k.matrix_flops, moved, unfused, strided, matrix_rate, target, k.reduced_bytes)

    def program_cost(self, graph, target):
        return xla.xla_cost(graph, target)


MODEL = CpuModel()
