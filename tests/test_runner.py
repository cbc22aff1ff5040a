"""The runner stops with a typed reason under every limit and reports what happened."""
import jax.numpy as jnp
import pytest

from superopt.egraph.capture import capture
from superopt.egraph.encode import encode
from superopt.egraph.runner import Limits, Phase, StopReason, saturate
from superopt.rulesets.algebra import ALGEBRA


def chain_egraph(n=12):
    mats = tuple(jnp.ones((4 + i % 3, 4 + (i + 1) % 3)) for i in range(n))
    def fn(*ms):
        out = ms[0]
        for m in ms[1:]:
            out = out @ m
        return out
    return encode(capture(fn, mats).graph).egraph


PHASES = [Phase("algebra", list(ALGEBRA))]


def test_saturates_small_program():
    report = saturate(encode(capture(lambda a: (a @ a) @ a[:, :1], (jnp.ones((4, 4)),)).graph).egraph, PHASES)
    assert report.stop_reason is StopReason.SATURATED
    assert report.fired.get("matmul-assoc", 0) > 0 and report.seconds > 0
    # Classes: a, a[:, :1], a@a, a@a[:, :1], and the root, which holds both associations.
    assert (report.enodes, report.eclasses) == (6, 5)


@pytest.mark.parametrize("limits, reason", [
    (Limits(iterations=2), StopReason.ITERATION_LIMIT),
    (Limits(nodes=400), StopReason.NODE_LIMIT),
    (Limits(seconds=1e-3), StopReason.TIME_LIMIT),
])
def test_each_limit_is_a_stop_reason(limits, reason):
    report = saturate(chain_egraph(), PHASES, limits)
    assert report.stop_reason is reason
    assert report.iterations >= 1 and report.error is None


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="Limits.nodes"):
        Limits(nodes=0)


def test_a_rule_that_breaks_shapes_is_an_error_not_a_wrong_program():
    from superopt.rewrites.pattern import tensors, transpose, vecs
    from superopt.rewrites.rule import rule
    (x,), (p,) = tensors("x"), vecs("p")
    bad = rule("drop-transpose", transpose(x, p), x, doc="wrong: transpose(x) -> x")
    egraph = encode(capture(lambda a: a.T * 2, (jnp.ones((3, 5)),)).graph).egraph
    report = saturate(egraph, [Phase("bad", [bad])])
    assert report.stop_reason is StopReason.ERROR
    assert "merge" in report.error.lower()
