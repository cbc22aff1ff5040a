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
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from superopt.extract.target import Target

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


def breakdown(k: NpuKernel, target: Target) -> dict:
    npu = target.npu
    ok, why = fits(k, target)
    rate = npu.cube_flops * (2 if k.int8 else 1) if k.unit == "cube" else npu.vector_flops
    compute = max(k.flops / rate, k.vector_flops / npu.vector_flops)
    transdata = 2 * k.transdata_bytes / (target.mem_bandwidth * TRANSDATA_EFFICIENCY)
    exchange = 2 * k.gm_exchange_bytes / target.mem_bandwidth if npu.separated else 0.0
    memory = k.bytes / target.mem_bandwidth + transdata + exchange
    time = max(compute, memory) + target.launch_overhead * (1 + k.transdata_launches) if ok else math.inf
    return {"unit": k.unit, "flops": k.flops + k.vector_flops, "bytes": k.bytes, "ub_bytes": _aligned(k.ub_live_bytes)
            * (2 if k.double_buffer else 1), "fits": ok, "overflow": why, "transdata_seconds": transdata,
            "gm_exchange_seconds": exchange, "time": time}


def kernel_time(k: NpuKernel, target: Target) -> float:
    return breakdown(k, target)["time"]


def matmul_tiles(tm: int, tn: int, tk: int, itemsize: int = 2) -> dict:
    """Buffer use of one cube matmul tile step: A in L0A, B in L0B, fp32 C in L0C, A and B staged in L1."""
    return {"l0a_bytes": tm * tk * itemsize, "l0b_bytes": tk * tn * itemsize, "l0c_bytes": tm * tn * 4,
            "l1_bytes": 2 * (tm * tk + tk * tn) * itemsize}
