"""Every registered rule is sound, and deliberately unsound rules are caught with a counterexample."""
import numpy as np
import pytest

from superopt.rewrites.checker import check_rule
from superopt.rewrites.pattern import (
    broadcast, compose, convert, dtypes, lit, mul, shape_of, tensors, transpose, vecs,
)
from superopt.rewrites.rule import rule, when
from superopt.rulesets import RULESETS

ALL_RULES = [r for rs in RULESETS.values() for r in rs]
x, = tensors("x")
p, q = vecs("p q")
d, = dtypes("d")


@pytest.mark.parametrize("r", ALL_RULES, ids=[f"{r.ruleset}/{r.name}" for r in ALL_RULES])
def test_registered_rule_is_sound(r):
    result = check_rule(r, examples=50)
    assert result.counterexample is None, f"{r.name} ({r.source}) is unsound:\n{result.counterexample}"
    assert result.cases > 0, f"{r.name}: no binding satisfied its left-hand side: {result.notes}"


def _caught(bad_rule):
    result = check_rule(bad_rule, examples=200)
    assert not result.sound and result.counterexample is not None
    return result.counterexample


def test_times_zero_is_not_zero_under_nan_and_inf():
    # labelled "rounding", so that the sign of -1 * 0 does not count: only a NaN or an Inf can break it
    bad = rule("mul-zero", mul(x, lit(0.0, d)), broadcast(lit(0.0, d), shape_of(x), ()), numerics="rounding",
               doc="wrong: x*0 -> 0")
    cex = _caught(bad)
    x_value = cex.bindings["?x"].astype(np.float32)
    assert not np.all(np.isfinite(x_value)), cex   # the shrunk counterexample is a NaN or an Inf
    assert "NaN" in cex.problem


def test_times_zero_labelled_exact_is_caught_on_the_sign_of_zero_too():
    bad = rule("mul-zero", mul(x, lit(0.0, d)), broadcast(lit(0.0, d), shape_of(x), ()), doc="wrong: x*0 -> 0")
    assert _caught(bad).problem


def test_inexact_cast_round_trip_is_caught():
    bad = rule("drop-f32-f16-f32", convert(convert(x, "float16"), "float32"), x, when("has_dtype", x, "float32"),
               doc="wrong: f32 -> f16 -> f32 is not the identity")
    cex = _caught(bad)
    x_value = cex.bindings["?x"]
    assert x_value.dtype == np.float32
    with np.errstate(over="ignore"):
        assert not np.array_equal(x_value.astype(np.float16).astype(np.float32), x_value, equal_nan=True), cex


def test_wrong_permutation_composition_is_caught():
    bad = rule("transpose-compose-backwards", transpose(transpose(x, p), q), transpose(x, compose(q, p)),
               doc="wrong: composes the permutations in the wrong order")
    cex = _caught(bad)
    perm_p, perm_q = cex.bindings["?p"], cex.bindings["?q"]
    assert tuple(perm_p[i] for i in perm_q) != tuple(perm_q[i] for i in perm_p), cex   # p and q do not commute


def test_rules_without_bindings_are_not_called_sound():
    impossible = rule("never", transpose(x, p), x, when("identity_perm", p), when("scalar", x), when("rank", x, 2),
                      doc="its predicates contradict each other")
    result = check_rule(impossible, examples=20)
    assert not result.sound and result.cases == 0


def test_a_reals_rule_that_cancels_differently_is_judged_against_the_float64_value():
    """x@y + x@z and x@(y+z) round differently in float16 where the products cancel; the rewritten side
    is as close to the float64 value as the original, so the rule is sound over the reals. A rule that is
    wrong over the reals is still caught."""
    from superopt.rewrites.pattern import add, dtypes, matmul, mul, tensors
    from superopt.rewrites.rule import rule
    x, y, z = tensors("x y z")
    d, = dtypes("d")
    distribute = rule("distribute", add(matmul(x, y, d), matmul(x, z, d)), matmul(x, add(y, z), d),
                      when("same_shape", y, z), when("has_dtype", y, d), numerics="reals", doc="x@y + x@z -> x@(y+z)")
    assert check_rule(distribute, examples=300).sound
    drop = rule("drop-a-term", add(matmul(x, y, d), matmul(x, z, d)), matmul(x, y, d),
                when("same_shape", y, z), when("has_dtype", y, d), numerics="reals", doc="wrong on purpose")
    assert not check_rule(drop, examples=100).sound


def test_a_conv_weight_scale_on_a_spatial_axis_is_caught():
    # conv(x, w * s) = conv(x, w) * s holds for a scale per output channel (the kernel's last axis); a
    # scale along another kernel axis does not leave the conv
    from superopt.rewrites.pattern import conv, ints
    y, z = tensors("y z")
    (k,) = ints("k")
    bad = rule("conv-scale-any-axis", conv(x, mul(y, broadcast(z, p, q)), k),
               mul(conv(x, y, k), broadcast(z, shape_of(conv(x, y, k)), q)), when("rank", z, 1),
               when("conv_channels_last", k), numerics="reals", doc="wrong: any kernel axis")
    cex = _caught(bad)
    assert cex.bindings["?q"] != (len(np.shape(cex.bindings["?y"])) - 1,), cex
