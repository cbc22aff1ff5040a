"""Cost model and DAG-aware extraction."""
import dataclasses

import jax.numpy as jnp
import pytest

from superopt.egraph.capture import capture
from superopt.egraph.encode import encode
from superopt.egraph.frozen import freeze
from superopt.egraph.runner import Phase, saturate
from superopt.extract import cost
from superopt.extract.cost import compute_rate, op_cost
from superopt.extract.greedy import extract, program_cost
from superopt.extract.target import available_targets, load_target
from superopt.rulesets.algebra import ALGEBRA

CPU = load_target("cpu")
F32 = "float32"


def best(fn, *args):
    captured = capture(fn, args)
    enc = encode(captured.graph)
    saturate(enc.egraph, [Phase("algebra", list(ALGEBRA))])
    return captured.graph, extract(freeze(enc.egraph), enc, CPU)


def test_a_price_is_remembered_per_target_object_never_across_targets(monkeypatch):
    """op_breakdown is memoized: the same op on the same target is priced once; a target with other figures
    (a calibration makes a new Target) is priced afresh, even under the same name; a full table starts again."""
    args = ("matmul", (), [((64, 64), F32), ((64, 64), F32)], ((64, 64), F32))
    first = cost.op_breakdown(*args, CPU)
    assert cost.op_breakdown(*args, CPU) is first
    slower = dataclasses.replace(CPU, launch_overhead=CPU.launch_overhead + 1e-3)
    assert slower.name == CPU.name and cost.op_breakdown(*args, slower).time > first.time
    monkeypatch.setattr(cost, "MEMO_ENTRIES", 1)
    again = cost.op_breakdown(*args, CPU)
    assert again == first and again is not first and cost._memo_size == 1


def test_matmul_cost_scales_with_flops():
    small = op_cost("matmul", (), [((64, 64), F32), ((64, 1), F32)], ((64, 1), F32), CPU)
    big = op_cost("matmul", (), [((64, 64), F32), ((64, 64), F32)], ((64, 64), F32), CPU)
    assert big > small > 0


def test_reshape_and_leaves_are_free_and_transcendentals_cost_more():
    assert op_cost("reshape", (), [((4, 4), F32)], ((16,), F32), CPU) == 0
    t = [((1 << 20,), F32)]
    assert op_cost("exp", (), t, t[0], CPU) > op_cost("add", (), t + t, t[0], CPU) * 0  # both positive
    assert op_cost("exp", (), t, t[0], CPU) >= op_cost("neg", (), t, t[0], CPU)


def test_unknown_target_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown target 'tpu-v9'.*cpu"):
        load_target("tpu-v9")
    assert "cpu" in available_targets()


def test_extraction_cost_is_the_cost_of_the_extracted_program():
    _, chosen = best(lambda a, b, v: jnp.tanh((a @ b) @ v) + 1.0, jnp.ones((64, 64)), jnp.ones((64, 64)), jnp.ones((64, 1)))
    assert chosen.cost == pytest.approx(program_cost(chosen.graph, CPU)[0])


@pytest.mark.slow
def test_shared_subterm_is_paid_once():
    """(A@B) is an output, so (A@B)@v reuses it: two matmuls, not A@(B@v) plus A@B (three)."""
    a, b, v = jnp.ones((128, 128)), jnp.ones((128, 128)), jnp.ones((128, 1))
    _, chosen = best(lambda a, b, v: (a @ b, (a @ b) @ v), a, b, v)
    assert chosen.graph.op_counts()["matmul"] == 2
    # Without the shared output, re-association wins.
    _, alone = best(lambda a, b, v: (a @ b) @ v, a, b, v)
    first = next(n for n in alone.graph.nodes if n.op == "matmul")
    assert first.shape == (128, 1)


@pytest.mark.slow
def test_constant_subterms_are_free():
    w = jnp.ones((32, 32))
    graph, chosen = best(lambda x: x @ (w @ w), jnp.ones((4, 32)))
    cost, per_node = program_cost(graph, CPU)
    matmul_costs = [c for c, i in zip(per_node, graph.live()) if graph.nodes[i].op == "matmul"]
    assert sorted(matmul_costs)[0] == 0.0  # w @ w is computed once, at build time


def test_matmuls_use_the_matrix_unit_where_the_target_has_one():
    big = [((4096, 4096), "bfloat16"), ((4096, 4096), "bfloat16")]
    out = ((4096, 4096), "float32")
    h100 = load_target("gpu-h100")
    assert op_cost("matmul", (), big, out, h100) < 0.2 * op_cost(
        "matmul", (), [((4096, 4096), "float32")] * 2, out, h100)      # bf16 on tensor cores, f32 not
    npu = load_target("npu-910b")
    assert compute_rate("matmul", big, npu) == npu.npu.cube_flops          # the cube
    assert compute_rate("mul", big, npu) == npu.peak_flops                 # the vector unit
    assert compute_rate("matmul", big, npu) >= 10 * compute_rate("mul", big, npu)
