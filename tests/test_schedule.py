"""Schedules: phases in order with their own limits, back-off, and a report per phase and per rule."""
import jax.numpy as jnp
import pytest

from superopt import superopt
from superopt.egraph.capture import capture
from superopt.egraph.encode import encode
from superopt.egraph.limits import BackOff, Limits, Phase, StopReason
from superopt.egraph.runner import saturate
from superopt.rewrites.pattern import add, mul, tensors
from superopt.rewrites.rule import RuleSet, rule
from superopt.rewrites.schedule import Schedule
from superopt.rulesets.algebra import ALGEBRA

x, y, z = tensors("x y z")
AC = RuleSet("ac", [
    rule("add-comm", add(x, y), add(y, x), doc="x+y -> y+x", numerics="exact"),
    rule("add-assoc", add(add(x, y), z), add(x, add(y, z)), two_way=True, numerics="reals", doc="+ associates"),
    rule("mul-comm", mul(x, y), mul(y, x), doc="x*y -> y*x"),
])


def sum_chain(n=9):
    args = tuple(jnp.full((2,), float(i)) for i in range(n))
    return encode(capture(lambda *a: sum(a[1:], a[0]), args).graph).egraph


def test_phases_run_in_order_with_their_own_limits():
    schedule = Schedule([Phase("ac", tuple(AC), Limits(iterations=2)), Phase("algebra", tuple(ALGEBRA))])
    report = saturate(sum_chain(), schedule, Limits(iterations=20, seconds=30))
    assert [p.name for p in report.phases] == ["ac", "algebra"]
    assert report.phases[0].stop_reason is StopReason.ITERATION_LIMIT and report.phases[0].iterations == 2
    assert report.phases[1].stop_reason is StopReason.SATURATED
    assert report.iterations == sum(p.iterations for p in report.phases)
    assert report.phases[0].matches["add-comm"] > 0 and report.matches["add-comm"] == report.phases[0].matches["add-comm"]
    assert set(report.rule_seconds) >= {"add-comm", "add-assoc"}


@pytest.mark.slow
def test_backoff_bans_explosive_rules_and_keeps_the_egraph_smaller():
    limits = Limits(iterations=6, nodes=10**7, seconds=60)
    free = saturate(sum_chain(), [Phase("ac", tuple(AC), backoff=None)], limits)
    backed = saturate(sum_chain(), [Phase("ac", tuple(AC), backoff=BackOff(match_limit=20, ban_length=2))], limits)
    assert backed.phases[0].bans, "associativity and commutativity should have been banned"
    assert not free.phases[0].bans
    assert backed.enodes < free.enodes


def test_a_global_limit_stops_later_phases():
    schedule = Schedule.of(AC, "algebra", backoff=None)
    report = saturate(sum_chain(12), schedule, Limits(iterations=50, nodes=3_000, seconds=60))
    assert report.stop_reason is StopReason.NODE_LIMIT
    assert [p.name for p in report.phases] == ["ac"]


def test_schedule_validation_and_composition():
    with pytest.raises(ValueError, match="distinct names"):
        Schedule.of("algebra") + Schedule.of("algebra")
    assert [p.name for p in (Schedule.of(AC) + Schedule.of("algebra")).phases] == ["ac", "algebra"]


def test_superopt_takes_a_schedule_and_reports_phases():
    fast = superopt(lambda a, b, v: (a @ b) @ v, rulesets=Schedule.of("algebra"), numerics="fast")
    fast(jnp.ones((64, 64)), jnp.ones((64, 64)), jnp.ones((64, 1)))
    text = str(fast.report)
    assert "phase algebra: saturated" in text and "matmul-assoc" in text
