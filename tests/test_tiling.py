"""Tiling: loop nests of kernel bodies, tile and order alternatives per target, GEMM-chain and attention
kernels chosen by extraction, and their data volume against the Chimera optimum."""
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from superopt.workloads import GEMM_CHAIN_SHAPES
from superopt import superopt
from superopt.core.ir import Node
from superopt.extract.cost import op_breakdown, op_cost
from superopt.extract.models.chimera import gemm_chain_mlkn, optimal_dv_clamped, optimal_dv_mlkn, optimal_dv_tiles
from superopt.extract.models.registry import model_of
from superopt.extract.target import load_target
from superopt.extract.tiling import Nest, Untileable, legal_orders, nest_of, tilings

rng = np.random.default_rng(0)
F16 = "float16"


def normal(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def chain_body(b, m, n, k, l, between=()):
    """A, B, D loaded; C = A@B; optional elementwise ops on C; E = C@D."""
    nodes = [Node("arg", (), (0,), (b, m, k), F16), Node("arg", (), (1,), (b, k, l), F16),
             Node("matmul", (0, 1), (F16,), (b, m, l), F16)]
    for op in between:
        nodes.append(Node(op, (len(nodes) - 1,), (), (b, m, l), F16))
    nodes.append(Node("arg", (), (2,), (b, l, n), F16))
    nodes.append(Node("matmul", (len(nodes) - 2, len(nodes) - 1), (F16,), (b, m, n), F16))
    ins = (((b, m, k), F16), ((b, k, l), F16), ((b, l, n), F16))
    return tuple(nodes), ins, ((b, m, n), F16)


def kernels(graph):
    return [graph.nodes[i] for i in graph.live() if graph.nodes[i].op == "kernel"]


# ---- the loop nest and the alternatives ----

def test_a_chain_body_is_one_nest_whose_intermediate_stays_on_chip():
    body, ins, out = chain_body(2, 512, 64, 64, 512, between=("tanh",))
    nest = nest_of(body, ins, out)
    assert nest.kind == "chain" and nest.batch == 2
    assert dict(nest.extents) == {"m": 512, "n": 64, "k": 64, "l": 512}
    (best, *_) = tilings(nest, 1 << 20, 16)
    t = dict(best.tiles)
    dv, mu = gemm_chain_mlkn(512, 64, 64, 512, t["m"], t["n"], t["k"], t["l"])
    assert best.moved_bytes == 2 * dv * 2 and best.tile_bytes == mu * 2 <= 1 << 20   # 2 batches, 2 bytes


def test_chain_orders_keep_the_private_loops_inside_the_shared_ones():
    orders = legal_orders("chain", list("mnkl"))
    assert len(orders) == 4 and all(set(o[:2]) == {"m", "l"} for o in orders)
    assert len(legal_orders("gemm", list("mnk"))) == 6


def test_every_alternative_fits_and_the_first_moves_least():
    body, ins, out = chain_body(12, 512, 64, 64, 512)
    options = tilings(nest_of(body, ins, out), 167936, 16)
    assert 1 < len(options) <= 4
    assert all(t.tile_bytes <= 167936 for t in options)
    assert [t.moved_bytes for t in options] == sorted(t.moved_bytes for t in options)


def test_three_matmuls_are_not_one_nest_and_cost_infinity():
    nodes = [Node("arg", (), (0,), (8, 8), F16), Node("matmul", (0, 0), (F16,), (8, 8), F16),
             Node("matmul", (1, 0), (F16,), (8, 8), F16), Node("matmul", (2, 0), (F16,), (8, 8), F16)]
    with pytest.raises(Untileable):
        nest_of(tuple(nodes), (((8, 8), F16),), ((8, 8), F16))
    parts = op_breakdown("kernel", (tuple(nodes),), [((8, 8), F16)], ((8, 8), F16), load_target("gpu-a100"))
    assert math.isinf(parts.time) and "not one chain" in parts.overflow


def test_a_row_reduction_after_a_matmul_needs_whole_rows():
    """LayerNorm-like: the reduced loop n is whole in every alternative, and none fits when a whole row
    of tiles cannot."""
    x = Node("arg", (), (0,), (128, 64), F16)
    w = Node("arg", (), (1,), (64, 4096), F16)
    mm = Node("matmul", (0, 1), (F16,), (128, 4096), F16)
    red = Node("reduce_sum", (2,), ((1,),), (128,), F16)
    body = (x, w, mm, red)
    ins, out = (((128, 64), F16), ((64, 4096), F16)), ((128,), F16)
    nest = nest_of(body, ins, out)
    assert nest.whole == {"n"}
    assert all(dict(t.tiles)["n"] == 4096 for t in tilings(nest, 1 << 20, 16))
    assert tilings(nest, 32 * 1024, 16) == ()


def test_a_target_without_tile_memory_prices_matmuls_untiled():
    from superopt.extract.target import Target
    flat = Target("flat", "cpu", peak_flops=1e15, mem_bandwidth=1e9, launch_overhead=0.0)
    ins = [((64, 64), "float32")] * 2
    assert op_cost("matmul", (), ins, ((64, 64), "float32"), flat) == pytest.approx(3 * 64 * 64 * 4 / 1e9)


# ---- the thesis's GEMM chains: chosen tiles against the analytic optimum ----

@pytest.mark.parametrize("target_name", ["npu-910", "gpu-a100"])
@pytest.mark.parametrize("chain", sorted(GEMM_CHAIN_SHAPES, key=lambda g: int(g[1:])))
def test_chain_tiles_fit_and_come_within_ten_percent_of_the_optimum(target_name, chain):
    """The best alternative offered for every G1-G12 chain fits and moves no more than 1.1x the attainable
    optimum (integer tile counts); where a whole extent does not fit, also no more than 1.1x the
    real-valued optimum (the closed form, clamped to the extents)."""
    b, m, n, k, l = GEMM_CHAIN_SHAPES[chain]
    target = load_target(target_name)
    body, ins, out = chain_body(b, m, n, k, l)
    granule = model_of(target).tile_granule
    best = tilings(nest_of(body, ins, out), target.tile_bytes, granule)[0]
    mc, a = target.tile_bytes // 2, granule
    assert best.tile_bytes <= target.tile_bytes
    dv = best.moved_bytes / 2
    assert dv <= 1.1 * b * optimal_dv_tiles(m, n, k, l, mc, a)[0]
    real = optimal_dv_clamped(m, n, k, l, mc, a)
    if -a + math.sqrt(a * a + mc) < min(m, l):          # the unclamped optimum lies inside the extents
        assert real == pytest.approx(optimal_dv_mlkn(m, n, k, l, mc, a), rel=1e-3)
        assert dv <= 1.1 * b * real


def test_the_attainable_optimum_matches_a_brute_force_search():
    m, n, k, l, mc, a = 96, 32, 32, 80, 3000, 16
    brute = min(gemm_chain_mlkn(m, n, k, l, tm, a, a, tl)[0]
                for tm, tl in itertools.product([*range(a, m + 1, a), m], [*range(a, l + 1, a), l])
                if gemm_chain_mlkn(m, n, k, l, tm, a, a, tl)[1] <= mc)
    assert optimal_dv_tiles(m, n, k, l, mc, a)[0] == brute


@pytest.mark.slow
@pytest.mark.parametrize("target_name", ["npu-910", "gpu-a100"])
def test_extraction_makes_a_gemm_chain_one_tiled_kernel(target_name):
    b, m, n, k, l = 2, 256, 64, 64, 256
    args = (normal(b, m, k, dtype=np.float16), normal(b, k, l, dtype=np.float16), normal(b, l, n, dtype=np.float16))

    def fn(a, bb, d):
        return jnp.tanh(a @ bb) @ d

    fast = superopt(fn, target=target_name)
    (kernel,) = kernels(fast.compile(*args).term)
    assert [n_.op for n_ in kernel.attrs[0]].count("matmul") == 2
    assert kernel.attrs[1].tile_bytes <= load_target(target_name).tile_bytes
    np.testing.assert_allclose(np.asarray(fast(*args), np.float32), np.asarray(fn(*args), np.float32),
                               rtol=2e-2, atol=2e-2)


# ---- attention ----

def attention(q, kt, v):
    return jax.nn.softmax(q @ kt * 0.125, axis=-1) @ v


@pytest.mark.slow
def test_attention_on_a_gpu_is_one_kernel_with_online_softmax():
    """softmax(Q K^T s) V with rows of 1024 keys: the whole row does not fit beside the tiles, so the
    chosen kernel runs the softmax over tiles of the row (flash attention); it computes the same values."""
    b, s, d = 2, 1024, 64
    args = (normal(b, s, d, dtype=np.float16), normal(b, d, s, dtype=np.float16), normal(b, s, d, dtype=np.float16))
    fast = superopt(attention, target="gpu-a100")
    (kernel,) = kernels(fast.compile(*args).term)
    tiling = kernel.attrs[1]
    assert tiling.online and dict(tiling.tiles)["l"] < s
    assert "online softmax" in str(fast.report)
    np.testing.assert_allclose(np.asarray(fast(*args), np.float32), np.asarray(attention(*args), np.float32),
                               rtol=2e-2, atol=2e-2)


def test_online_softmax_is_offered_only_for_a_softmax():
    """Dividing by a row sum of something other than the exponentials is not a softmax: the row loop
    stays whole."""
    def not_softmax(q, kt, v):
        s = q @ kt
        e = jnp.exp(s - s.max(-1, keepdims=True))
        return (e / jnp.abs(s).sum(-1, keepdims=True)) @ v

    from superopt.egraph.capture import capture
    from superopt.extract.tiling import _online_softmax
    for fn, expect in ((attention, True), (not_softmax, False)):
        args = (normal(1, 32, 16), normal(1, 16, 32), normal(1, 32, 16))
        graph = capture(fn, args).graph
        live = graph.live()
        body = tuple(graph.nodes[i] for i in live)
        index = {i: j for j, i in enumerate(live)}
        body = tuple(Node(n.op, tuple(index[x] for x in n.inputs), n.attrs, n.shape, n.dtype) for n in body)
        second = max(j for j, n in enumerate(body) if n.op == "matmul")
        assert _online_softmax(body, second) is expect


def test_nest_is_hashable_for_the_cache():
    body, ins, out = chain_body(1, 64, 16, 16, 64)
    assert isinstance(hash(nest_of(body, ins, out)), int) and isinstance(nest_of(body, ins, out), Nest)
