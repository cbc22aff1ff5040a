"""NPU cost model: capacities as hard limits, cube versus vector, TransData, and seed 001's NPU cases."""
import math

from superopt.extract.models.npu import NpuKernel, breakdown, fits, kernel_time, matmul_tiles
from superopt.extract.target import load_target
import pytest

pytestmark = pytest.mark.slow   # whole models, worker processes or long searches: make test, not test-fast

NPU_910, NPU_910B = load_target("npu-910"), load_target("npu-910b")


def test_a_matmul_on_the_vector_unit_is_at_least_10x_slower():
    flops = 2 * 4096 ** 3   # compute-bound: launch overhead does not dilute the ratio
    for target in (NPU_910, NPU_910B):
        cube = kernel_time(NpuKernel("cube", flops, 6e6, **matmul_tiles(128, 128, 64)), target)
        vector = kernel_time(NpuKernel("vector", flops, 6e6, ub_live_bytes=48 * 1024), target)
        assert vector >= 10 * cube


def test_the_cube_runs_int8_at_twice_the_fp16_rate():
    # a 16x32x16 int8 fractal per cycle against 16x16x16 fp16 (reference facts); compute-bound shapes
    flops = 2 * 4096 ** 3
    for target in (NPU_910, NPU_910B):
        fp16 = breakdown(NpuKernel("cube", flops, 6e6, **matmul_tiles(128, 128, 64)), target).time
        int8 = breakdown(NpuKernel("cube", flops, 6e6, int8=True, **matmul_tiles(128, 128, 64)), target).time
        assert math.isclose(fp16 - target.launch_overhead, 2 * (int8 - target.launch_overhead), rel_tol=1e-9)


def test_an_int8_matmul_kernel_is_costed_at_the_int8_rate():
    from superopt.core.ir import Node
    from superopt.extract.cost import kernel_breakdown

    def body(dtype, acc):
        return (Node("arg", (), (0,), (2048, 2048), dtype), Node("arg", (), (1,), (2048, 2048), dtype),
                Node("matmul", (0, 1), (), (2048, 2048), acc))
    ins8, ins16 = [((2048, 2048), "int8")] * 2, [((2048, 2048), "float16")] * 2
    t8 = kernel_breakdown(body("int8", "int32"), ins8, ((2048, 2048), "int32"), NPU_910B).time
    t16 = kernel_breakdown(body("float16", "float32"), ins16, ((2048, 2048), "float32"), NPU_910B).time
    assert t8 < 0.75 * t16


def test_capacities_are_hard_limits():
    assert fits(NpuKernel("cube", 1, 1, **matmul_tiles(128, 128, 128)), NPU_910)[0]
    ok, why = fits(NpuKernel("cube", 1, 1, **matmul_tiles(256, 256, 256)), NPU_910)  # A tile: 128 KB
    assert not ok and why.startswith("L0A")
    assert math.isinf(kernel_time(NpuKernel("vector", 1, 1, ub_live_bytes=100 * 1024), NPU_910B))  # x2 > 192 KB
    assert math.isfinite(kernel_time(NpuKernel("vector", 1, 1, ub_live_bytes=100 * 1024, double_buffer=False),
                                     NPU_910B))


def elementwise_chain(n_elements: int, fused: bool, target, tile_elements: int):
    """Add+Mul+ReLU over fp16 tensors: a + b, * c, max 0. Fused: one kernel, four live tiles (a, b, c, out);
    unfused: three kernels, each with three live tiles, each reading and writing global memory."""
    b = 2 * n_elements
    if fused:
        return kernel_time(NpuKernel("vector", 3 * n_elements, 4 * b, ub_live_bytes=4 * 2 * tile_elements), target)
    return sum(kernel_time(NpuKernel("vector", n_elements, 3 * b, ub_live_bytes=3 * 2 * tile_elements), target)
               for _ in range(3))


def test_seed_001_add_mul_relu_is_fused_on_910b_while_the_ub_fits_and_split_when_it_overflows():
    # A row of 8192 fp16 must be resident: 4 live rows x 16 KB x 2 (double buffer) = 128 KB <= 192 KB.
    assert elementwise_chain(1 << 22, fused=True, target=NPU_910B, tile_elements=8192) < \
        elementwise_chain(1 << 22, fused=False, target=NPU_910B, tile_elements=8192)
    # Rows of 14336 fp16: fused needs 4 x 28 KB x 2 = 224 KB > 192 KB, while each unfused kernel needs
    # 3 x 28 KB x 2 = 168 KB and fits: the chain is split.
    assert math.isinf(elementwise_chain(1 << 22, fused=True, target=NPU_910B, tile_elements=14336))
    assert math.isfinite(elementwise_chain(1 << 22, fused=False, target=NPU_910B, tile_elements=14336))


def test_seed_001_conv_plus_layernorm_is_not_fused_on_910b():
    """The conv's fractal (NC1HWC0) output cannot feed LayerNorm's reduction over channels: fused, a TransData
    pass converts it on chip and, on the 910B, cube and vector cores still exchange it through global
    memory; unfused, FixPipe writes ND on the way out for free and LayerNorm reads it."""
    act = 2 * 64 * 56 * 56 * 64                       # fp16 activation bytes
    conv = NpuKernel("cube", 2 * 64 * 56 * 56 * 64 * 64 * 9, 2 * act, **matmul_tiles(128, 64, 64))
    layernorm = NpuKernel("vector", 8 * act / 2, 2 * act, ub_live_bytes=3 * 2 * 64 * 16)
    fused = NpuKernel("cube", conv.flops + layernorm.flops, act + act, **matmul_tiles(128, 64, 64),
                      transdata_bytes=act, gm_exchange_bytes=act)
    split = kernel_time(conv, NPU_910B) + kernel_time(layernorm, NPU_910B)
    assert kernel_time(fused, NPU_910B) > split
    parts = breakdown(fused, NPU_910B)
    assert parts.transdata_seconds > 0 and parts.gm_exchange_seconds > 0
    assert breakdown(fused, NPU_910).gm_exchange_seconds == 0   # the 910 couples cube and vector on chip


def test_cube_tiles_fit_l0c_and_spread_over_the_cores():
    """The NPU model's GEMM tiles fit L0C as the generator allocates it, and its estimate is a typed
    breakdown: bytes, the busiest core's cube and DMA cycles, and the bound that wins."""
    from superopt.extract.models.npu import CubeEstimate, chain_estimate, chain_tiles, gemm_buffers, gemm_tiles
    for target in (NPU_910, NPU_910B):
        for est, order, tiles in gemm_tiles(1, 512, 768, 768, (2, 2, 2), "float16", target, keep=20):
            assert isinstance(est, CubeEstimate) and order == ("m", "n", "k")
            assert gemm_buffers(tiles["m"], tiles["n"], tiles["k"], 768, "float16", target)["l0c_bytes"] <= \
                target.npu.l0c_bytes
            assert est.cycles >= max(est.cube_cycles, est.dma_cycles, est.mte1_cycles) > 0
            assert est.bound in ("cube", "dma", "mte1")
        # 256 x 256 fp32 accumulators are 256 KB: twice the 910B's L0C, so never offered double-buffered
        assert gemm_buffers(256, 256, 64, 64, "float16", NPU_910B)["l0c_bytes"] <= NPU_910B.npu.l0c_bytes
        # a chain with a batch of one: tiles that move the least data (all of M in one tile) use one core;
        # the model's choice spreads the m tiles over several and is estimated faster
        whole = chain_estimate(1, 512, 64, 64, 256, {"m": 512, "l": 256, "k": 64, "n": 64}, (2,) * 4, "float16",
                               NPU_910B)
        (best, _, tiles), *_ = chain_tiles(1, 512, 64, 64, 256, (2,) * 4, "float16", target)
        assert whole.cores == 1 and best.cores > 1 and tiles["m"] < 512
        assert best.cycles < chain_estimate(1, 512, 64, 64, 256, {"m": 512, "l": 256, "k": 64, "n": 64}, (2,) * 4,
                                            "float16", target).cycles


def test_an_npu_matmul_kernel_is_priced_by_its_tiles_estimate():
    from superopt.extract.cost import op_breakdown
    ins = [((1, 128, 3072), "float16"), ((3072, 768), "float16")]
    parts = op_breakdown("matmul", (), ins, ((1, 128, 768), "float16"), NPU_910B)
    est = parts.cube_estimate
    assert parts.time >= est.cycles / NPU_910B.npu.clock_hz + NPU_910B.launch_overhead


def test_the_chain_models_price_the_thesis_conv_chains_as_the_emulator_runs_them():
    """C1 and C4 (3x3 then 1x1: a GEMM chain over the patch matrix) and C6 (1x1 then 3x3: bands with
    their halo), fp32 on the 910B: the model's best tiles are priced within 6% of the cycles the emulator
    runs them in, and so are the two GEMMs apart; so the choice between fusing and running apart, which
    the emulator makes by 3-18% for these, follows the emulator's."""
    from superopt.extract.models.npu import chain_tiles, gemm_tiles, halo_tiles
    from superopt.lowering.npu.codegen import chain_program, gemm_program, halo_chain_program
    from superopt.lowering.npu.emulator import emulate

    f32, items = "float32", (4, 4, 4, 4)

    def close(model, program):
        cycles = emulate(program, NPU_910B, symbolic=True, trace=False).cycles
        assert abs(model / cycles - 1) < 0.06, (model, cycles)
        return cycles

    for m, n, k, l in ((3136, 128, 576, 192), (784, 128, 1152, 256)):      # C1, C4: M x N x K x L
        (est, order, tiles), *_ = chain_tiles(1, m, n, k, l, items, f32, NPU_910B)
        chained = close(est.cycles, chain_program(("A", (1, m, k), f32), ("B", (k, l), f32), ("D", (l, n), f32),
                                                  ("E", (1, m, n), f32), order, tiles, NPU_910B, precision="fp32"))
        apart = 0
        for gm, gn, gk in ((m, l, k), (m, n, l)):
            (est, order, tiles), *_ = gemm_tiles(1, gm, gn, gk, items[:3], f32, NPU_910B)
            apart += close(est.cycles, gemm_program(("A", (1, gm, gk), f32), ("B", (gk, gn), f32),
                                                    ("C", (1, gm, gn), f32), order, tiles, NPU_910B, precision="fp32"))
        assert chained < apart
    pads = ((1, 1), (1, 1))                                                 # C6: 56x56x64 -> 64 -> 3x3 -> 64
    (est, order, tiles), *_ = halo_tiles(1, (56, 56, 64, 64, 56), (3, 3), pads, 64, items, f32, NPU_910B)
    close(est.cycles, halo_chain_program(("X", (1, 56, 56, 64), f32), ("W1", (64, 64), f32),
                                         ("W2", (576, 64), f32), ("Y", (1, 56, 56, 64), f32), (3, 3), pads, tiles,
                                         NPU_910B, precision="fp32"))
