"""GPU cost model: occupancy formula, penalties, the spill cliff, coalescing, and seed 001's first case."""


from superopt.extract.models.gpu import GpuKernel, breakdown, kernel_time, occupancy
from superopt.extract.target import load_target
import pytest

pytestmark = pytest.mark.slow   # whole models, worker processes or long searches: make test, not test-fast

H100 = load_target("gpu-h100")


def test_occupancy_formula():
    gpu = H100.gpu
    assert occupancy(32, 256, 0, gpu) == (8, 1.0)          # 8 blocks x 8 warps = 64 warps
    assert occupancy(64, 256, 0, gpu) == (4, 0.5)          # 65536 / (64 regs x 256 threads) = 4 blocks
    assert occupancy(128, 256, 0, gpu) == (2, 0.25)
    blocks, occ = occupancy(32, 256, 100 * 1024, gpu)      # shared memory limits to 2 blocks of 100 KB
    assert blocks == 2 and occ == 0.25
    assert occupancy(255, 1024, 0, gpu)[0] == 0            # a 1024-thread block at 255 registers cannot launch


def test_time_grows_as_occupancy_falls_and_jumps_past_255_registers():
    base = dict(flops=1e9, bytes=1e9)
    times = [kernel_time(GpuKernel(**base, live_values=v), H100) for v in (8, 48, 112, 230)]
    assert times == sorted(times) and times[-1] > times[0]
    below = breakdown(GpuKernel(**base, live_values=239), H100)   # 255 registers
    above = breakdown(GpuKernel(**base, live_values=240), H100)   # 256: one spilled
    assert below.spilled_registers == 0 and above.spilled_registers == 1
    assert above.time > 1.5 * below.time                     # a cliff, not a slope


def test_uncoalesced_access_costs_sectors():
    coalesced = kernel_time(GpuKernel(flops=0, bytes=4e8), H100)
    strided = kernel_time(GpuKernel(flops=0, bytes=4e8, uncoalesced_bytes=2e8), H100)
    assert strided > 3 * coalesced


def test_tensor_cores_use_the_matrix_peak():
    k = dict(flops=1e13, bytes=1e6)
    assert kernel_time(GpuKernel(**k, tensor_cores=True), H100) < kernel_time(GpuKernel(**k), H100) / 10


def test_seed_001_matmul_plus_transpose_is_not_fused_on_h100():
    """Fusing the transpose into the matmul's epilogue makes its stores strided; a separate tiled transpose
    reads and writes coalesced and costs one more launch and one more pass."""
    m = n = k = 4096
    out_bytes = m * n * 2
    gemm = dict(flops=2 * m * n * k, tensor_cores=True, live_values=64)
    fused = kernel_time(GpuKernel(**gemm, bytes=2 * m * k * 2 + out_bytes, uncoalesced_bytes=out_bytes,
                                  value_bytes=2), H100)
    unfused = (kernel_time(GpuKernel(**gemm, bytes=2 * m * k * 2 + out_bytes, value_bytes=2), H100)
               + kernel_time(GpuKernel(flops=0, bytes=2 * out_bytes, value_bytes=2, smem_per_block=8192), H100))
    assert fused > unfused
