"""The numerics contract of rule labels (rewrites/rule.py): the checker draws the values that break rules
(NaN, +-inf, -0, subnormals, the dtype's largest value and its square root, in tensors and in literal
constants), catches rules labelled "rounding" that change where a result is finite, and the integer
range predicates admit their bound and refuse one past it."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from superopt import numerics, superopt
from superopt.egraph.capture import capture
from superopt.egraph.encode import encode
from superopt.egraph.frozen import freeze
from superopt.egraph.runner import Limits, Phase, saturate
from superopt.extract.greedy import extract
from superopt.extract.target import load_target
from superopt.lowering.jax import lower
from superopt.rewrites import functions
from superopt.rewrites.checker import check_rule, evaluate
from superopt.rewrites.functions import INT8_TERMS, PREDICATES, AttributeFn
from superopt.rewrites.pattern import ATTRIBUTE_FNS, FLOAT, Var, app, binary, dtypes, floats, lit, matmul, tensors
from superopt.rewrites.rule import rule, when
from superopt.rewrites.schedule import Schedule
from superopt.rulesets import RULESETS
from superopt.rulesets.algebra import ALGEBRA

x, y, z = tensors("x y z")
(d,) = dtypes("d")
c1, c2 = floats("c1 c2")
f32 = jnp.float32


# ---- the checker catches what the contract forbids ----

@pytest.mark.slow
def test_a_fold_max_that_ignores_nan_is_caught(monkeypatch):
    """Python's max(nan, 1.0) is nan but max(1.0, nan) is 1.0; lax.max gives NaN both ways."""
    monkeypatch.setitem(ATTRIBUTE_FNS, "fmax_drops_nan", ((FLOAT, FLOAT), FLOAT))
    monkeypatch.setitem(functions.ATTRIBUTES, "fmax_drops_nan",
                        AttributeFn("fmax_drops_nan", lambda c, a, b: c.expr(a).max(c.expr(b)), max))
    bad = rule("fold-max-drops-nan", binary("max", lit(c1, d), lit(c2, d)), lit(app("fmax_drops_nan", c1, c2), d),
               when("float_dtype", d), numerics="rounding", doc="wrong: a max that drops NaN")
    result = check_rule(bad, examples=200, shrink=False)
    assert result.counterexample is not None, result
    cex = result.counterexample
    assert math.isnan(cex.bindings["?c1"]) or math.isnan(cex.bindings["?c2"]), cex
    assert "NaN" in cex.problem


def test_the_registered_folds_keep_nan():
    for name in ("fold-max", "fold-min"):
        r = ALGEBRA[name]
        lhs, rhs = r.pairs[0]
        for a, b in [(math.nan, 1.0), (1.0, math.nan), (math.nan, -math.inf)]:
            env = {c1: a, c2: b, d: "float32"}
            assert np.isnan(evaluate(lhs, env)) and np.isnan(evaluate(rhs, env)), (name, a, b)


def _assoc(numerics: str):
    h = "float16"
    return rule(f"matmul-assoc-f16-{numerics}", matmul(matmul(x, y, h), z, h), matmul(x, matmul(y, z, h), h),
                when("has_dtype", x, h), when("has_dtype", y, h), when("has_dtype", z, h), when("matmul_ok", y, z),
                numerics=numerics, doc="(x@y)@z -> x@(y@z) in float16")


def test_an_overflow_changing_rule_labelled_rounding_is_caught():
    result = check_rule(_assoc("rounding"), examples=200, shrink=False)
    assert result.counterexample is not None, result
    assert "NaN" in result.counterexample.problem or "Inf" in result.counterexample.problem, result.counterexample


@pytest.mark.slow
def test_the_same_rule_labelled_reals_is_sound_over_the_reals():
    assert check_rule(_assoc("reals"), examples=60).sound


@pytest.mark.slow
def test_a_regrouped_sum_differs_only_where_its_terms_add_up_past_the_range():
    """Why the regrouping rules are "order", not "rounding": the sum of [[max, max], [-max, -max]] is inf
    taken in order and NaN taken by rows (inf + -inf), a partial sum overflowing in one order only: the
    contract's edge for "order" rules. The order check, which draws every value but the magnitudes whose
    sums can overflow, finds nothing else."""
    big = np.finfo(np.float32).max
    r = ALGEBRA["reduce-sum-all-by-rows"]
    lhs, rhs = r.pairs[0]
    env = {Var("x", "tensor"): np.array([[big, big], [-big, -big]], np.float32), Var("p", "vec"): (0, 1)}
    with np.errstate(all="ignore"):
        left, right = np.asarray(evaluate(lhs, env)), np.asarray(evaluate(rhs, env))
    assert np.isposinf(left) and np.isnan(right)
    assert r.numerics == "order"
    for name in ("reduce-sum-all-by-rows", "diagonal-of-matmul", "trace-of-matmul"):
        assert check_rule(ALGEBRA[name], examples=60).sound, name


def test_strict_mode_runs_exact_rounding_and_order_rules_and_never_reals():
    labels = {r.numerics for rs in RULESETS.values() for r in rs}
    assert labels <= {"exact", "rounding", "order", "reals"}
    fast_only = {r.name for rs in RULESETS.values() for r in rs if not numerics.legal(r, "strict")}
    assert fast_only == {r.name for rs in RULESETS.values() for r in rs if r.numerics == "reals"}
    assert {"matmul-assoc", "matmul-scale-lhs", "conv-scale-lhs", "reduce-sum-scale"} <= fast_only
    assert not {"fold-add", "fold-max", "matmul-int8", "conv-int8", "div-sqrt-as-rsqrt",
                "diagonal-of-matmul", "reduce-sum-all-by-rows"} & fast_only


# ---- the range predicates: the bound admitted, one past it refused ----

def _shaped(*shape):
    return np.broadcast_to(np.int8(0), shape)   # a view: only the shape matters


def test_the_int8_term_bound_is_exact():
    assert INT8_TERMS == 131071
    assert INT8_TERMS * (-128) * (-128) <= 2**31 - 1 < (INT8_TERMS + 1) * (-128) * (-128)
    assert INT8_TERMS * (-128) * 127 >= -2**31          # the negative side holds further


@pytest.mark.parametrize("name, inside, outside", [
    ("int32_accumulates", (_shaped(1, INT8_TERMS),), (_shaped(1, INT8_TERMS + 1),)),
    ("int32_accumulates", (_shaped(4, 3, INT8_TERMS),), (_shaped(4, 3, INT8_TERMS + 1),)),
    ("int32_accumulates_conv", (_shaped(1, 1, INT8_TERMS, 8),), (_shaped(1, 1, INT8_TERMS + 1, 8),)),
    ("int32_accumulates_conv", (_shaped(3, 3, 14563, 1),), (_shaped(3, 3, 14564, 1),)),   # 131067 / 131076
    ("int32_accumulates", (_shaped(3, 2),), (_shaped(3, 1),)),               # one product keeps -0.0
    ("int32_accumulates_conv", (_shaped(1, 1, 2, 4),), (_shaped(1, 1, 1, 4),)),
    ("long_last_axis", (_shaped(3, 2),), (_shaped(3, 1),)),
    ("less", (4, 5), (5, 5)),
    ("nonzero", (5e-324,), (0.0,)),
    ("fold_in_range", (65504.0, "float16"), (np.nextafter(65504.0, math.inf), "float16")),
    ("fold_in_range", (-65504.0, "float16"), (np.nextafter(-65504.0, -math.inf), "float16")),
    ("fold_in_range", (2.0**-14, "float16"), (np.nextafter(2.0**-14, 0.0), "float16")),
    ("fold_in_range", (float(np.finfo(np.float32).max), "float32"), (math.inf, "float32")),
    ("fold_in_range", (1.0, "bfloat16"), (math.nan, "bfloat16")),
    ("fold_in_range", (2.0**-126, "float32"), (0.0, "float32")),               # a zero's sign is lost in egglog
    ("int8_scale", (2.0**48,), (np.nextafter(2.0**48, math.inf),)),
    ("int8_scale", (-(2.0**-60),), (-np.nextafter(2.0**-60, 0.0),)),
    ("int8_scale", (0.0,), (math.nan,)),
])
def test_a_range_predicate_admits_its_bound_and_refuses_one_past(name, inside, outside):
    assert PREDICATES[name].py(*inside)
    assert not PREDICATES[name].py(*outside)


def _int8_conv(a, b):
    return lax.conv_general_dilated(a.astype(f32), b.astype(f32), (1, 1), "VALID",
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"))


@pytest.mark.parametrize("channels, int8", [(INT8_TERMS, True), (INT8_TERMS + 1, False)])
def test_a_1x1_conv_at_the_bound_takes_int32_and_one_past_does_not(channels, int8):
    xq, wq = np.zeros((1, 1, 1, channels), np.int8), np.zeros((1, 1, channels, 1), np.int8)
    enc = encode(capture(_int8_conv, (xq, wq)).graph)
    saturate(enc.egraph, Schedule.of("quant"))
    convs = [n for nodes in freeze(enc.egraph).classes.values() for n in nodes if n.fn == "conv"]
    assert len(convs) == (2 if int8 else 1)


# ---- regressions written from the findings ----

@pytest.mark.slow
def test_finding_1_an_int8_matmul_one_past_the_bound_stays_in_f32():
    """131072 products of -128 * -128 sum to 2**31: exact in f32, -2**31 if accumulated in int32."""
    k = INT8_TERMS + 1
    xq, wq = np.full((1, k), -128, np.int8), np.full((k, 1), -128, np.int8)
    out = np.asarray(superopt(lambda a, b: a.astype(f32) @ b.astype(f32), target="cpu")(xq, wq))
    assert out.dtype == np.float32 and out.shape == (1, 1)
    assert out[0, 0] == 2147483648.0


@pytest.mark.slow
def test_finding_1_an_int8_conv_one_past_the_bound_stays_in_f32():
    k = INT8_TERMS + 1
    xq, wq = np.full((1, 1, 1, k), -128, np.int8), np.full((1, 1, k, 1), -128, np.int8)
    out = np.asarray(superopt(_int8_conv, target="cpu")(xq, wq))
    assert out.shape == (1, 1, 1, 1) and out.reshape(()) == 2147483648.0


@pytest.mark.slow
def test_an_int8_matmul_of_one_term_keeps_the_sign_of_zero():
    """-3 * 0 is -0.0 in float32 (XLA's dot of one term is that product) and +0 in int32: the one-term
    contraction stays in float32, so 1 / x is -inf as under jax.jit (found by the fuzzer)."""
    xq, wq = np.full((2, 1), -3, np.int8), np.zeros((1, 2), np.int8)
    fn = lambda a, b: 1.0 / (a.astype(f32) @ b.astype(f32))                     # noqa: E731
    want = np.asarray(jax.jit(fn)(xq, wq))
    assert np.all(want == -np.inf)
    np.testing.assert_array_equal(np.asarray(superopt(fn, target="cpu")(xq, wq)), want)


@pytest.mark.slow
def test_a_negative_zero_literal_stays_apart_from_zero():
    """egglog's f64 holds -0.0 and 0.0 as one value: x * -0.0 and x * 0.0 once became one term."""
    fn = lambda a: (1.0 / (a * f32(-0.0)), 1.0 / (a * f32(0.0)), a + f32(-0.0))   # noqa: E731
    x = np.array([1.0, 2.0, -0.0], np.float32)
    for got, want in zip(superopt(fn, target="cpu")(x), jax.jit(fn)(x)):
        np.testing.assert_array_equal(np.signbit(np.asarray(got)), np.signbit(np.asarray(want)))
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def _optimized(fn, args):
    enc = encode(capture(fn, args).graph)
    report = saturate(enc.egraph, [Phase("t", list(ALGEBRA))], Limits())
    graph = extract(freeze(enc.egraph), enc, load_target("cpu")).graph
    return report, np.asarray(lower(graph)(*args)[0])


@pytest.mark.parametrize("fold, fn", [
    ("fold-max", lambda a: a * jnp.maximum(f32(math.nan), f32(3.0))),
    ("fold-max", lambda a: a * jnp.maximum(f32(3.0), f32(math.nan))),
    ("fold-min", lambda a: a * jnp.minimum(f32(math.nan), f32(3.0))),
    ("fold-min", lambda a: a * jnp.minimum(f32(3.0), f32(math.nan))),
])
def test_finding_3_folding_keeps_nan(fold, fn):
    a = np.ones((4, 4), np.float32)
    _, out = _optimized(fn, (a,))
    assert np.isnan(out).all() and np.isnan(np.asarray(jax.jit(fn)(a))).all()


@pytest.mark.slow
@pytest.mark.parametrize("fn", [
    lambda a: a * (jnp.float16(300.0) * jnp.float16(300.0)),
    # folded twice in f64 this would be 90000 - 60000 = 30000, finite; in float16 it is inf - 60000
    lambda a: a * ((jnp.float16(300.0) * jnp.float16(300.0)) - jnp.float16(60000.0)),
])
def test_finding_3_a_fold_that_overflows_float16_is_not_folded(fn):
    """300 * 300 is 90000 in f64 and inf in float16: a folded 90000 would hide the inf from XLA."""
    a = np.ones((4, 4), np.float16)
    report, out = _optimized(fn, (a,))
    assert report.matches.get("fold-mul", 0) == 0
    assert np.isposinf(out).all() and np.isposinf(np.asarray(jax.jit(fn)(a))).all()


def test_a_fold_in_range_still_fires():
    fn = lambda a: a * (jnp.float16(3.0) * jnp.float16(7.0))  # noqa: E731
    a = np.ones((4, 4), np.float16)
    report, out = _optimized(fn, (a,))
    assert report.matches["fold-mul"] > 0 and (out == 21.0).all()
