"""The public API: the callable, its report and term, specialization, errors, and the verification net."""

import jax.numpy as jnp
import numpy as np
import pytest

from superopt import Limits, StopReason, VerificationWarning, superopt
from superopt.rewrites.pattern import exp
from superopt.rewrites.rule import RuleSet, rule
from superopt.rulesets import DEFAULT
from superopt.rulesets.algebra import x

A = jnp.asarray(np.random.default_rng(0).standard_normal((256, 256)), jnp.float32)
V = jnp.asarray(np.random.default_rng(1).standard_normal((256, 1)), jnp.float32)


def chain(a, b, v):
    return (a @ b) @ v


@pytest.mark.slow
def test_optimizes_and_reports():
    fast = superopt(chain, numerics="fast")    # re-association may overflow: an opt-in (tests/test_numerics.py)
    np.testing.assert_allclose(fast(A, A, V), chain(A, A, V), rtol=1e-4, atol=1e-3)
    report = fast.report
    assert report.optimized and report.cost_after < report.cost_before
    text = str(report)
    for needle in ("outcome      : optimized", "saturation   : saturated after", "e-nodes", "matmul-assoc",
                   "cost (model)"):
        assert needle in text
    assert "matmul(%0, %3)" in fast.term or "matmul(%1, %2)" in fast.term


@pytest.mark.slow
def test_specializes_per_shape_like_jit():
    fast = superopt(chain)
    fast(A, A, V)
    first = fast.report
    small = jnp.ones((8, 8))
    np.testing.assert_allclose(fast(small, small, small[:, :1]), chain(small, small, small[:, :1]))
    assert fast.report is not first and len(fast._cache) == 2
    fast(A, A, V)          # jax.jit's cache: no new specialization, and `report` stays the latest one made
    assert len(fast._cache) == 2
    assert fast.compile(A, A, V).report is first and fast.report is first


@pytest.mark.slow
def test_decorator_form_and_report_before_compile():
    @superopt(target="cpu")
    def f(a):
        return a * 1.0
    with pytest.raises(RuntimeError, match="nothing compiled yet"):
        f.report
    np.testing.assert_allclose(f(A), A)


def test_unknown_target_and_ruleset_are_clear_errors():
    with pytest.raises(ValueError, match=r"unknown target 'npu-9000'; valid targets: .*cpu"):
        superopt(chain, target="npu-9000")
    with pytest.raises(ValueError, match=r"unknown rule set 'nope'; known: algebra"):
        superopt(chain, rulesets=["nope"])


@pytest.mark.slow
def test_unsound_user_rule_is_caught_and_named():
    bogus = RuleSet("mine", [rule("exp-is-identity", exp(x), x, doc="wrong on purpose")])
    fast = superopt(lambda a: jnp.exp(a) * 2.0 + jnp.exp(a) @ a, rulesets=["algebra", bogus])
    with pytest.warns(VerificationWarning, match="exp-is-identity"):
        out = fast(A)
    np.testing.assert_allclose(out, jnp.exp(A) * 2.0 + jnp.exp(A) @ A, rtol=1e-4)
    assert fast.report.outcome.startswith("kept original: verification failed")


@pytest.mark.slow
def test_kept_original_when_nothing_is_cheaper():
    fast = superopt(lambda a: jnp.tanh(a))  # one op: nothing to fuse, nothing to rewrite
    fast(A)
    assert fast.report.outcome == "kept original: no cheaper program found"


@pytest.mark.slow
def test_limits_reach_the_report():
    fast = superopt(chain, limits=Limits(iterations=1))
    fast(A, A, V)
    assert fast.report.run.stop_reason in (StopReason.ITERATION_LIMIT, StopReason.SATURATED)
    assert [ph.iterations for ph in fast.report.run.phases] == [1] * len(DEFAULT)  # the limit is per phase


@pytest.mark.slow
def test_a_rounding_difference_amplified_by_tanh_is_judged_against_the_float64_value():
    """Re-associating a bf16 chain rounds differently; tanh near zero amplifies that into large elementwise
    differences between the two programs. Both err at bf16's rounding level against the float64 value, so
    the optimized one is kept; a rule that changes the value is still refused (test_unsound_user_rule...)."""
    rng = np.random.default_rng(3)
    a, b, v = (jnp.asarray(rng.standard_normal(s), jnp.bfloat16) for s in [(256, 256), (256, 256), (256, 4)])
    fast = superopt(lambda a, b, v: jnp.tanh((a @ b) @ v), numerics="fast")
    fast(a, b, v)
    assert fast.report.optimized, fast.report.outcome


def test_accuracy_check_refuses_a_program_that_is_wrong_by_a_few_percent():
    from superopt.core.verify import as_accurate
    rng = np.random.default_rng(0)
    truth = rng.standard_normal(4096)
    original = (truth + rng.standard_normal(4096) * 1e-3).astype(np.float32)   # rounding-level error
    close = (truth + rng.standard_normal(4096) * 1.5e-3).astype(np.float32)
    wrong = (truth * 1.05).astype(np.float32)                                   # 5% off everywhere
    assert as_accurate(original, close, truth) is None
    assert "exceeds" in as_accurate(original, wrong, truth)


@pytest.mark.slow
def test_size_one_axes_broadcast_in_binary_ops():
    """lax broadcasts size-1 axes of equal-rank operands (x * x.mean(-1, keepdims=True)); the shape analysis
    must agree with the captured shapes instead of failing the run with an illegal merge."""
    def scaled(x):
        return x.mean(-1, keepdims=True) * x + 1.0

    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    fast = superopt(scaled)
    np.testing.assert_allclose(fast(x), scaled(x), rtol=1e-5, atol=1e-6)
    assert fast.report.run.error is None and fast.report.run.stop_reason is not StopReason.ERROR
