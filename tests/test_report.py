"""The report reads as English: plurals, how saturation stopped, what changed, which fusions were real
candidates, one labelled saturation time, and gradient traffic only for programs that compute gradients."""
import jax
import jax.numpy as jnp
import pytest

from superopt import StopReason, superopt
from superopt.egraph.capture import capture
from superopt.egraph.runner import PhaseReport, RunReport
from superopt.explain import rules_by_phase
from superopt.extract.candidates import program_key
from superopt.core.ir import pretty
from superopt.report import Outcome, Report, fusion_lines, plural, stop_phrase


def _report(stop=StopReason.SATURATED, iterations=(1,), **kw) -> Report:
    phases = [PhaseReport(f"p{k}", stop, n, 0.25, {"r": 2}) for k, n in enumerate(iterations)]
    run = RunReport(stop, sum(iterations), 10, 5, 0.75, {"r": 2 * len(phases)}, {}, phases)
    fields = dict(kind=Outcome.OPTIMIZED, ops_before={"matmul": 2}, ops_after={"matmul": 2},
                  stage_seconds={"capture": 0.1, "saturate": 1.5}, cost_before=2.0, cost_after=1.0)
    fields.update(kw)
    return Report("cpu", run, **fields)


def test_plurals():
    assert [plural(n, "iteration") for n in (0, 1, 2)] == ["0 iterations", "1 iteration", "2 iterations"]
    assert [plural(n, "launch") for n in (1, 3)] == ["1 launch", "3 launches"]
    report = _report(iterations=(1,))
    report.run.matches = {"once": 1, "twice": 2}
    text = str(report)
    assert "after 1 iteration," in text and "1 iterations" not in text
    assert "once" in text and " 1 match " in text and "1 matches" not in text and " 2 matches " in text


def test_the_stop_reason_is_a_phrase():
    assert stop_phrase(StopReason.SATURATED) == "saturated"
    assert stop_phrase(StopReason.ITERATION_LIMIT) == "stopped at the iteration limit"
    assert stop_phrase(StopReason.NODE_LIMIT) == "stopped at the e-node limit"
    assert stop_phrase(StopReason.TIME_LIMIT) == "stopped at the time limit"
    text = str(_report(StopReason.ITERATION_LIMIT, iterations=(16, 3)))
    assert "saturation   : stopped at the iteration limit after 19 iterations" in text
    assert "phase p0     : stopped at the iteration limit after 16 iterations" in text
    assert "stopped by" not in text
    assert rules_by_phase(_report(iterations=(1,)).run)[0][1] == "saturated after 1 iteration"


def test_one_labelled_saturation_time():
    text = str(_report(iterations=(1, 2)))      # phases 0.25 s each; the stage took 1.5 s
    line = next(x for x in text.splitlines() if x.startswith("  saturation"))
    assert "500.00 ms in its phases" in line and "the saturate stage, 1.50 s, adds its child process" in line
    assert "750.00 ms" not in line                # the run's own clock is not shown as a third figure


def test_ops_changed_says_when_the_program_changed_with_equal_counts():
    assert "ops changed  : same op counts; the program changed (operands re-associated or re-arranged)" \
        in str(_report())
    assert "ops changed  : none (the original runs)" in str(_report(kind=Outcome.NO_GAIN, reason="no cheaper program found"))
    assert "ops changed  : kernel 0->1, matmul 2->1" in str(_report(ops_after={"matmul": 1, "kernel": 1}))


def test_only_close_fusions_are_declined():
    close = "kernel{add(in0, in1)} -> f32[8,8]: 1.3 us fused vs 1.1 us for the 2 kernel(s) chosen"
    far = "kernel{tanh(matmul(in0, in1))} -> f32[8,8]: 27.0 us fused vs 1.0 us for the 1 kernel(s) chosen, spills"
    too_big = "kernel{exp(in0)} -> f32[4096,4096]: needs 1.0 MB of Unified Buffer, has 192.0 KB"
    lines = fusion_lines([close, far, too_big])
    assert lines[0].startswith("declined (1.18x the time of the kernels chosen): kernel{add(in0, in1)}")
    assert "for the 2 kernels chosen" in lines[0]
    assert lines[1].startswith("not chosen (27x slower than the kernels chosen): kernel{tanh(")
    assert lines[1].endswith("for the 1 kernel chosen, spills")
    assert lines[2] == f"cannot be one kernel: {too_big}"
    text = str(_report(declined=[far]))
    assert "not chosen (27x slower" in text and "fusion declined" not in text


@pytest.mark.slow
def test_no_gradient_line_for_a_forward_model_with_a_residual_input():
    def block(x, w1, w2):
        return x + jax.nn.relu(x @ w1) @ w2     # returns x as an elementwise function of x: not a parameter
    args = (jnp.ones((16, 32)), jnp.ones((32, 64)), jnp.ones((64, 32)))
    from superopt.reporting import gradient_traffic as _gradient_traffic
    graph = capture(block, args).graph
    assert _gradient_traffic(graph, graph) == ()
    fast = superopt(block)
    fast.compile(*args)
    assert "gradient mem" not in str(fast.report)


def test_gradient_traffic_still_counts_a_training_step():
    def sgd(w, x, y):
        g = jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        return w - 0.1 * g
    args = (jnp.ones((32, 8)), jnp.ones((16, 32)), jnp.ones((16, 8)))
    from superopt.reporting import gradient_traffic as _gradient_traffic
    graph = capture(sgd, args).graph
    before, _ = _gradient_traffic(graph, graph)
    assert before.tensors >= 1 and before.passes >= 2


def test_programs_that_list_the_same_computation_in_another_order_are_one():
    def first(a, b):
        s = a + b
        m = a @ b
        return m, s

    def second(a, b):
        m = a @ b
        s = a + b
        return m, s
    args = (jnp.ones((4, 4)), jnp.ones((4, 4)))
    g1, g2 = capture(first, args).graph, capture(second, args).graph
    assert pretty(g1) != pretty(g2) and program_key(g1) == program_key(g2)
    g3 = capture(lambda a, b: (a @ b, a - b), args).graph
    assert program_key(g3) != program_key(g1)


def test_alternatives_within_a_budget_are_distinct_and_include_the_greedy_choice():
    from superopt.explain import alternatives
    shapes = [(64, 32), (32, 16), (16, 48), (48, 8)]
    args = tuple(jnp.ones(s) for s in shapes)
    found = alternatives(lambda a, b, c, d: a @ b @ c @ d, args, "cpu", rulesets=["algebra"], limit=3,
                         numerics="fast", budget=30.0)
    assert 1 <= len(found) <= 3 and len({program_key(a.graph) for a in found}) == len(found)
    assert [a.cost for a in found] == sorted(a.cost for a in found)
    assert all(a.ops == "matmul x3" for a in found)
    tiny = alternatives(lambda a, b, c, d: a @ b @ c @ d, args, "cpu", limit=3, numerics="fast", budget=1e-6)
    assert len(tiny) >= 1                       # the greedy choice is found whatever the budget
