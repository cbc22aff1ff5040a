"""Targets as data: hardware figures read from `extract/targets/<name>.toml`, each with its source.

The `cpu` target is overridden by the figures `superopt calibrate` measured on this machine, when a
calibration is cached (see `superopt.extract.calibrate`).
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from superopt.core.kinds import check_kind
from superopt.extract.calibrate import cached_calibration

_DIR = Path(__file__).parent / "targets"


@dataclass(frozen=True)
class GpuSpec:
    sms: int
    regs_per_sm: int
    max_regs_per_thread: int
    max_warps_per_sm: int
    max_blocks_per_sm: int
    smem_per_sm: int
    l2_bytes: int
    l2_bandwidth: float       # bytes/s from L2 to the SMs: where a tiled kernel's re-reads come from
    smem_per_block: int = 0   # shared memory one block may have (opt-in maximum); 0: not given


@dataclass(frozen=True)
class NpuSpec:
    cores: int
    clock_hz: float
    cube_flops: float
    vector_flops: float
    ub_bytes: int
    l1_bytes: int
    l0a_bytes: int
    l0b_bytes: int
    l0c_bytes: int
    separated: bool           # cube and vector cores exchange data through global memory (910B)
    # Data paths inside one core, for the emulator (lowering/npu); sources in the target files.
    mte1_bytes_per_cycle: int = 256       # L1 -> L0A/L0B
    fixpipe_bytes_per_cycle: int = 128    # L0C -> GM/L1/UB
    vector_bytes_per_cycle: int = 256     # one 256-byte repeat per cycle
    dma_latency_cycles: int = 200         # fixed start-up of one MTE2/MTE3 transfer
    vector_cores_per_cube: int = 1        # separated cores: AIVs per AIC
    nd_on_copy: bool = True               # the copy into L1 converts an ND matrix to the cube's fractals
                                          # (and FixPipe the product back to ND); else operands go packed
    cube_fp32: bool = False               # the cube multiplies fp32 operands (accumulating in fp32)


@dataclass(frozen=True)
class Target:
    name: str
    kind: str                 # one of core/kinds.py's KINDS: the cost model that prices it (extract/models)
    peak_flops: float         # FLOP/s of the general (vector / non-tensor) units, f32
    mem_bandwidth: float      # bytes/s between global memory and the compute units
    launch_overhead: float    # seconds per kernel
    transcendental_flops: float = 20.0
    pow_flops: float = 0.0            # flops an element of pow costs; 0: transcendental_flops (XLA CPU: several)
    reduction_flops: float = 1.0      # flops an element of a reduction costs (XLA's CPU reductions: several)
    integer_reduction_flops: float = 0.0   # ... of a max or min of integers; 0: reduction_flops
    matrix_flops: float = 0.0  # FLOP/s of the matrix unit (tensor core, cube) in f16/bf16; 0: none
    gpu: GpuSpec | None = None
    npu: NpuSpec | None = None
    calibrated: bool = False
    cache_bytes: int = 0       # cpu: the cache a tiled matmul keeps its tiles in
    cache_bandwidth: float = 0.0     # cpu: bytes/s of a kernel whose traffic stays in the caches
    cache_resident_bytes: int = 0    # cpu: the most bytes (read plus written) a kernel moves at that rate
    dot_read_bandwidth: float = 0.0  # cpu: bytes/s at which a lone dot reads ...
    dot_read_bytes: int = 0          # cpu: ... operands of up to this many bytes
    reduction_split_bytes: int = 0   # cpu: past this many bytes read, a reduction loop costs ...
    reduction_split_overhead: float = 0.0   # cpu: ... this many seconds more
    reduction_split_flops: float = 0.0      # cpu: ... and an element costs this many flops
    matrix_full_work: float = 0.0    # cpu: the FLOPs of a matmul from which XLA's GEMM reaches matrix_flops; 0: any
    matrix_least_share: float = 1.0  # cpu: the share of matrix_flops the smallest matmuls reach
    # Loops (extract/loops.py); None: one `launch_overhead`, as a loop run by the host launching its body.
    loop_iteration_overhead: float | None = None   # seconds a scan (fori_loop) spends per iteration on itself
    while_iteration_overhead: float | None = None  # the same for a while loop (its condition read back), a cond
    loop_launch_overhead: float | None = None      # seconds per kernel of a loop body (instead of launch_overhead)
    kernel_growth: int = 0   # body nodes kernel growth may build in one extraction (extract/kernels.py); 0: GROWTH_BUDGET

    @property
    def tile_bytes(self) -> int:
        """On-chip bytes that hold the tiles of a matrix kernel (and a GEMM chain's intermediate tile):
        shared memory of one SM on a GPU, L1 on an NPU, a core's cache on a CPU."""
        if self.gpu:
            return self.gpu.smem_per_sm
        if self.npu:
            return self.npu.l1_bytes
        return self.cache_bytes


def available_targets() -> list[str]:
    return sorted(p.stem for p in _DIR.glob("*.toml"))


def load_target(name: str) -> Target:
    """The target named `name` (`extract/targets/<name>.toml`), or the one a TOML file of that form at the path
    `name` describes (a chip of one's own, of a registered kind)."""
    path = Path(name) if name.endswith(".toml") else _DIR / f"{name}.toml"
    if not path.exists():
        raise ValueError(f"superopt: unknown target {name!r}; valid targets: {', '.join(available_targets())} "
                         "(or the path of a target's .toml file)")
    with path.open("rb") as f:
        data = tomllib.load(f)
    check_kind(data.get("kind", ""), f"target {name!r}")
    gpu, npu = data.pop("gpu", None), data.pop("npu", None)
    target = Target(**data, gpu=GpuSpec(**gpu) if gpu else None, npu=NpuSpec(**npu) if npu else None)
    if name == "cpu":
        measured = cached_calibration()
        if measured:
            target = replace(target, calibrated=True, **measured)
    return target
