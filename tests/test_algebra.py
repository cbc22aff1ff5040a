"""Each algebra rule fires on a small program written as users write it, and the result is unchanged."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import searching
from superopt.egraph.capture import capture
from superopt.egraph.runner import Limits, Phase, StopReason
from superopt.extract.greedy import extract
from superopt.extract.target import load_target
from superopt.lowering.jax import lower
from superopt.rewrites.rule import speculating
from superopt.rulesets.algebra import ALGEBRA
from superopt.core.verify import compare_outputs

rng = np.random.default_rng(0)
A, B, C = (jnp.asarray(rng.standard_normal((8, 8)), jnp.float32) for _ in range(3))
V = jnp.asarray(rng.standard_normal((8, 1)), jnp.float32)
P, Q = jnp.abs(A) + 0.5, jnp.abs(B) + 0.5
W1, W2, W3 = (rng.standard_normal((8, 4)).astype(np.float32) for _ in range(3))
T3 = jnp.asarray(rng.standard_normal((2, 3, 4)), jnp.float32)


def _normal(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# rule name -> (program, arguments)
FIRES = {
    "transpose-of-transpose": (lambda t: jnp.transpose(jnp.transpose(t, (1, 2, 0)), (2, 0, 1)) * 2, (T3,)),
    "transpose-identity": (lambda t: jnp.transpose(jnp.transpose(t, (1, 2, 0)), (2, 0, 1)) * 2, (T3,)),
    "transpose-of-matmul": (lambda a, b: (a @ b).T, (A, B)),
    "transpose-through-unary": (lambda a: jnp.tanh(a.T).T, (A,)),
    "transpose-through-binary": (lambda a, b: (a.T + b.T).T, (A, B)),
    "transpose-through-scalar-binary": (lambda a: (a.T * 3.0).T, (A,)),
    "matmul-assoc": (lambda a, b, v: (a @ b) @ v, (A, B, V)),
    "matmul-distribute-lhs": (lambda a, b, c: a @ b + a @ c, (A, B, C)),
    "matmul-distribute-rhs": (lambda a, b, c: a @ c + b @ c, (A, B, C)),
    "matmul-merge-2-shared-lhs-inputs": (lambda x, q, k: (x @ q, x @ k), (A, B, C)),
    "matmul-merge-3-shared-lhs-inputs": (lambda x, q, k, v: (x @ q, x @ k, x @ v), (A, B, C, A.T)),
    "matmul-merge-2-shared-lhs-constants": (lambda x: (x @ W1, x @ W2), (A,)),
    "matmul-merge-3-shared-lhs-constants": (lambda x: (x @ W1, x @ W2, x @ W3), (A,)),
    "matmul-scale-lhs": (lambda a, b: (a * 0.5) @ b, (A, B)),
    "matmul-scale-rhs": (lambda a, b: a @ (b * 0.5), (A, B)),
    "reshape-of-reshape": (lambda t: t.reshape(6, 4).reshape(24) + 1, (T3,)),
    "reshape-identity": (lambda t: t.reshape(6, 4).reshape(2, 3, 4) + 1, (T3,)),
    "broadcast-as-reshape": (lambda a: jnp.expand_dims(a, 0) + 1, (A,)),
    "reshape-through-unary": (lambda t: jnp.tanh(t).reshape(6, 4) + 1, (T3,)),
    "reshape-through-scalar-binary": (lambda t: (t * 3.0).reshape(6, 4) + 1, (T3,)),
    "reshape-through-scalar-binary-left": (lambda t: jnp.maximum(-1.0, t).reshape(6, 4) + 1, (T3,)),
    "binary-of-broadcasts": (lambda v, u: jnp.exp(jnp.broadcast_to(v, (8, 8)) - jnp.broadcast_to(u, (8, 8))),
                             (V, V * 0.5)),
    "bn-scale-into-weights": (lambda x, w, g: lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")) * g,
        (_normal(1, 6, 6, 3), _normal(3, 3, 3, 4), _normal(4))),
    "conv-scale-lhs": (lambda x, w: lax.conv_general_dilated(
        x * 0.5, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")),
        (_normal(1, 6, 6, 3), _normal(3, 3, 3, 4))),
    "conv-scale-rhs": (lambda x, w: lax.conv_general_dilated(
        x, w * 0.5, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")),
        (_normal(1, 6, 6, 3), _normal(3, 3, 3, 4))),
    "bn-shift-before-scale": (lambda x, w, m, g: (lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")) - m) * g,
        (_normal(1, 6, 6, 3), _normal(3, 3, 3, 4), _normal(4), _normal(4))),
    "broadcast-of-broadcast": (lambda v: jnp.broadcast_to(jnp.broadcast_to(v, (8, 8))[None], (3, 8, 8)), (V,)),
    "mul-one": (lambda a: a * 1.0 + 2.0, (A,)),
    "mul-one-left": (lambda a: 1.0 * a + 2.0, (A,)),
    "add-zero": (lambda a: (a + 0.0) * 2.0, (A,)),
    "add-zero-left": (lambda a: (0.0 + a) * 2.0, (A,)),
    "sub-zero": (lambda a: (a - 0.0) * 2.0, (A,)),
    "div-one": (lambda a: (a / 1.0) * 2.0, (A,)),
    "neg-neg": (lambda a: -(-a) * 2.0, (A,)),
    "abs-neg": (lambda a: jnp.abs(-a), (A,)),
    "abs-abs": (lambda a: jnp.abs(jnp.abs(a)), (A,)),
    "mul-neg-neg": (lambda a, b: (-a) * (-b), (A, B)),
    "add-neg": (lambda a, b: a + (-b), (A, B)),
    "sub-neg": (lambda a, b: a - (-b), (A, B)),
    "max-self": (lambda a: jnp.maximum(a, a) + 1, (A,)),
    "min-self": (lambda a: jnp.minimum(a, a) + 1, (A,)),
    "select-same": (lambda a: jnp.where(a > 0, a, a) + 1, (A,)),
    "cummax-of-cummax": (lambda a: lax.cummax(lax.cummax(a, 1), 1) + 1, (A,)),
    "cummin-of-cummin": (lambda a: lax.cummin(lax.cummin(a, 0, reverse=True), 0, reverse=True) + 1, (A,)),
    "cumsum-of-neg": (lambda a: jnp.cumsum(-a, axis=1) * 2, (A,)),
    "integer-pow-one": (lambda a: lax.integer_pow(a, 1) + 1, (A,)),
    "integer-pow-two": (lambda a: a ** 2, (A,)),
    "exp-zero": (lambda a: a * jnp.exp(jnp.float32(0.0)), (A,)),
    "log-one": (lambda a: a + jnp.log(jnp.float32(1.0)), (A,)),
    "div-sqrt-as-rsqrt": (lambda a, b: a / jnp.sqrt(jnp.abs(b)), (A, B)),
    "recip-sqrt": (lambda a: 1.0 / jnp.sqrt(jnp.abs(a)), (A,)),
    "reduce-sum-scale": (lambda a: jnp.sum(a * 3.0, axis=1), (A,)),
    "diagonal-of-matmul": (lambda a, b: jnp.diag(a @ b.T), (A, A)),
    "trace-of-matmul": (lambda a, b: jnp.trace(a @ b.T), (A, A)),
    "sum-of-matmul": (lambda a, b: jnp.sum(a @ b), (A, B)),
    "sum-of-outer-product": (lambda u, v: jnp.sum(jnp.outer(u, v)), (V[:, 0], A[0])),
    "sum-of-outer-product-left": (lambda u, v: jnp.sum(v[None, :] * u[:, None]), (V[:, 0], A[0])),
    "row-sums-of-scaled-rows": (lambda a, v: jnp.sum(a * v[None, :], axis=1), (A, V[:, 0])),
    "column-sums-of-scaled-columns": (lambda a, v: jnp.sum(a * v[:, None], axis=0), (A, V[:, 0])),
    "row-sums-as-matvec": (lambda a: jnp.sum(a, axis=1), (A,)),
    "floor-of-integral": (lambda a: jnp.floor(a.astype(jnp.int32) * 2.0), (A,)),
    "sub-self-of-finite": (lambda a: (lambda t: t - t + a)(jnp.tanh(a.astype(jnp.int32).astype(jnp.float32))), (A,)),
    "div-self-of-finite-positive": (lambda a: (lambda c: c / c + a)(
        jnp.maximum(jnp.tanh(a.astype(jnp.int32).astype(jnp.float32)), 0.5)), (A,)),
    "min-one-of-at-most-one": (lambda a: jnp.minimum(jax.nn.sigmoid(a), 1.0), (A,)),
    "min-one-of-at-most-one-left": (lambda a: jnp.minimum(1.0, jax.nn.sigmoid(a) * jax.nn.sigmoid(-a)), (A,)),
    "ceil-of-integral": (lambda a: jnp.ceil(jnp.floor(a) - jnp.round(a)), (A,)),
    "round-of-integral": (lambda a: lax.round(jnp.abs(jnp.ceil(a)) ** 2 + 1.0), (A,)),   # away from zero
    "round-even-of-integral": (lambda a: jnp.round(jnp.arange(64.0).reshape(8, 8) * a.astype(jnp.int8)), (A,)),
    "column-sums-as-vecmat": (lambda a: jnp.sum(a, axis=0), (A,)),
    "exp-of-log-of-nonneg": (lambda a: jnp.exp(jnp.log(jnp.exp(a))), (A,)),
    "square-of-sqrt-of-nonneg": (lambda a: jnp.sqrt(jnp.abs(a)) ** 2, (A,)),
    "abs-of-nonneg": (lambda a: jnp.abs(jnp.exp(a)), (A,)),
    "relu-of-nonneg": (lambda a: jnp.maximum(a * a, 0.0), (A,)),
    "reduce-sum-all-by-rows": (lambda a: jnp.sum(a * 0.5), (A,)),
    "reduce-max-all-by-rows": (lambda a: jnp.max(jnp.abs(a)), (A,)),
    "reduce-min-all-by-rows": (lambda a: jnp.min(a + 1.0), (A,)),
    "reduce-and-all-by-rows": (lambda a: jnp.all(jnp.isfinite(a)), (A,)),
    "reduce-or-all-by-rows": (lambda a: jnp.any(a > 0.5), (A,)),
    "reduce-of-row-reductions": (lambda a: jnp.sum(jnp.sum(jnp.exp(a), axis=-1)), (A,)),
    "reduce-over-unit-axes": (lambda a: jnp.sum(jnp.sum(a, axis=0, keepdims=True), axis=0) * 2.0, (A,)),
    "fold-add": (lambda a: a * (jnp.float32(2.0) + jnp.float32(3.0)), (A,)),
    "fold-sub": (lambda a: a * (jnp.float32(2.0) - jnp.float32(3.0)), (A,)),
    "fold-mul": (lambda a: a * (jnp.float32(2.0) * jnp.float32(3.0)), (A,)),
    "fold-div": (lambda a: a * (jnp.float32(2.0) / jnp.float32(3.0)), (A,)),
    "fold-max": (lambda a: a * jnp.maximum(jnp.float32(2.0), jnp.float32(3.0)), (A,)),
    "fold-min": (lambda a: a * jnp.minimum(jnp.float32(2.0), jnp.float32(3.0)), (A,)),
    "summed-outer-product-as-matmul": (lambda a, b: jnp.sum(a[:, :, None] * b[None, :, :], axis=1), (A, B)),
    "summed-row-products-as-matmul": (lambda a, b: jnp.sum(a[:, None, :] * b[None, :, :], axis=2), (A, B)),
    # domain conditions no analysis proves here: the rule fires in a search that speculates, on arguments
    # inside its domain (P, Q positive and moderate; A, B within exp_moderate)
    "quotient-by-own-sqrt": (lambda a: a / jnp.sqrt(a), (P,)),
    "sum-of-logs": (lambda a, b: jnp.log(a) + jnp.log(b), (P, Q)),
    "difference-of-logs": (lambda a, b: jnp.log(a) - jnp.log(b), (P, Q)),
    "product-of-exps": (lambda a, b: jnp.exp(a) * jnp.exp(b), (A, B)),
    "quotient-of-exps": (lambda a, b: jnp.exp(a) / jnp.exp(b), (A, B)),
    "log-of-scaled-exp": (lambda a, b: jnp.log(jnp.exp(a) * b), (A, Q)),
    "exp-of-shifted-log": (lambda a, b: jnp.exp(a + jnp.log(b)), (A, Q)),
    "exp-of-log-moderate": (lambda a: jnp.exp(jnp.log(a)) * 2.0, (P,)),
    "exp-of-sum-of-logs": (lambda a, b: jnp.exp(jnp.log(a) + jnp.log(b)), (P, Q)),
    "exp-of-difference-of-logs": (lambda a, b: jnp.exp(jnp.log(a) - jnp.log(b)), (P, Q)),
    "product-of-sqrts": (lambda a, b: jnp.sqrt(a) * jnp.sqrt(b), (P, Q)),
    "quotient-of-sqrts": (lambda a, b: jnp.sqrt(a) / jnp.sqrt(b), (P, Q)),
    "power-one-and-a-half": (lambda a: a ** 1.5, (P,)),
    "power-two-and-a-half": (lambda a: a ** 2.5, (P,)),
    "quarter-power-as-roots": (lambda a: a ** 0.25, (P,)),
    "three-quarter-power-as-roots": (lambda a: a ** 0.75, (P,)),
}


def saturated(fn, args, rules=ALGEBRA, speculate=False):
    """(the captured program, (the frozen e-graph, its encoding): what extraction reads, the run's report) for
    `fn`'s program saturated with `rules` (tests/searching.py); with `speculate`, as a guarded program's search
    does: rules with domain conditions assume them (`speculating`) on the program's nodes (`origins`)."""
    captured = capture(fn, args)
    rules = [speculating(r) for r in rules] if speculate else list(rules)
    enc, report, frozen = searching.saturated(captured.graph, [Phase("t", rules)], Limits(), origins=speculate)
    return captured, (frozen, enc), report


def test_there_are_enough_rules_and_each_is_described():
    assert len(ALGEBRA) >= 25
    for r in ALGEBRA:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", r.name), r.name
        assert r.doc and r.category and r.ruleset == "algebra"
        assert re.fullmatch(r"rulesets/algebra\.py:\d+", r.source), r.source


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FIRES))
def test_rule_fires_and_keeps_meaning(name):
    fn, args = FIRES[name]
    captured, searched, report = saturated(fn, args, speculate=any(r.given for r in ALGEBRA if r.name == name))
    assert report.stop_reason is not StopReason.ERROR, report.error
    assert report.matches[name] > 0, f"{name} did not fire; fired: {report.fired}"
    chosen = extract(*searched, load_target("cpu"))
    got = lower(chosen.graph)(*args)
    want = jax.tree_util.tree_leaves(fn(*args))
    assert compare_outputs([np.asarray(w) for w in want], [np.asarray(g) for g in got]) is None


def test_every_rule_has_a_firing_example():
    assert set(FIRES) == {r.name for r in ALGEBRA}


@pytest.mark.slow
def test_reassociation_follows_shapes():
    """(A@B)@v goes right; u@(A@B) with a thin u goes left: the cost model decides, not the rule."""
    for fn, args, want_first in [(lambda a, b, v: (a @ b) @ v, (A, B, V), (8, 1)),
                                 (lambda u, a, b: u @ (a @ b), (V.T, A, B), (1, 8))]:
        _, searched, _ = saturated(fn, args)
        graph = extract(*searched, load_target("cpu")).graph
        first = next(n for n in graph.nodes if n.op == "matmul")
        assert first.shape == want_first


def test_inexact_cast_round_trip_is_not_removed():
    fn = lambda a: a.astype(jnp.float16).astype(jnp.float32)
    _, searched, _ = saturated(fn, (A,))
    graph = extract(*searched, load_target("cpu")).graph
    assert graph.op_counts().get("convert", 0) == 2


DOMAIN = ("exp-of-log-of-nonneg", "square-of-sqrt-of-nonneg", "abs-of-nonneg", "relu-of-nonneg")


@pytest.mark.slow
def test_domain_rules_fire_only_where_the_sign_analysis_proves_the_domain():
    # nothing says a (an argument), a - 1 or a + b is >= 0: no domain rule applies
    for fn in (lambda a: jnp.abs(a) * 2.0, lambda a: jnp.exp(jnp.log(a)), lambda a: jnp.maximum(a - 1.0, 0.0),
               lambda a: jnp.sqrt(a + A) ** 2):
        _, _, report = saturated(fn, (A,))
        assert not any(report.matches.get(name, 0) for name in DOMAIN), report.fired
    # exp(a) >= 0 and a * a >= 0, so their product, its transpose and its column sums are: |.| goes
    _, searched, report = saturated(lambda a: jnp.abs(jnp.sum(jnp.exp(a).T * (a * a), axis=0)), (A,))
    assert report.matches["abs-of-nonneg"] > 0, report.fired
    graph = extract(*searched, load_target("cpu")).graph
    assert "abs" not in graph.op_counts()


INTEGRAL = ("floor-of-integral", "ceil-of-integral", "round-of-integral", "round-even-of-integral")


@pytest.mark.slow
def test_rounding_is_dropped_only_where_the_integer_analysis_proves_every_element_an_integer():
    # an argument, its half, a quotient of integers or their square root may hold fractions: rounding stays
    for fn in (lambda a: jnp.floor(a), lambda a: jnp.round(jnp.floor(a) * 0.5),
               lambda a: jnp.ceil(a.astype(jnp.int32) / 3.0), lambda a: jnp.floor(jnp.sqrt(jnp.abs(jnp.round(a))))):
        _, _, report = saturated(fn, (A,))
        assert not any(report.matches.get(name, 0) for name in INTEGRAL), report.fired
    # an int cast, sums and products of it with integer literals, and its row maxima are integers: floor goes
    fn = lambda a: jnp.floor(jnp.max(a.astype(jnp.int32) * 3.0 - 1.0, axis=1) + jnp.ceil(a[0]))   # noqa: E731
    _, searched, report = saturated(fn, (A,))
    assert report.matches["floor-of-integral"] > 0, report.fired
    graph = extract(*searched, load_target("cpu")).graph
    assert "floor" not in graph.op_counts()
    np.testing.assert_array_equal(np.asarray(lower(graph)(A)[0]), np.asarray(fn(A)))


RANGE = ("sub-self-of-finite", "div-self-of-finite-positive", "min-one-of-at-most-one",
         "min-one-of-at-most-one-left")


@pytest.mark.slow
def test_range_rules_fire_only_where_the_range_analysis_proves_the_range():
    # an argument may hold NaN or inf; tanh of a finite value may be 0; a product of two values <= 1 may be
    # above 1 (-2 * -2); XLA's erf reaches 1.0000001; float16 holds no int32 past 65504, and a float16
    # iota counts to inf past 65504 elements
    for fn in (lambda a: a - a + 1.0, lambda a: jnp.tanh(a) - jnp.tanh(a),
               lambda a: (lambda t: t / t)(jnp.tanh(a.astype(jnp.int32).astype(jnp.float32))),
               lambda a: jnp.minimum(jnp.tanh(a) * jnp.tanh(a - 1.0) - 1.0, 1.0) * jnp.minimum(jnp.exp(a), 1.0),
               lambda a: jnp.minimum(jax.scipy.special.erf(a), 1.0),
               lambda a: (lambda h: h - h)(a.astype(jnp.int32).astype(jnp.float16)),
               lambda a: (lambda r: r - r)(jnp.arange(64, dtype=jnp.float16).reshape(8, 8)) * a):
        _, _, report = saturated(fn, (A,))
        assert not any(report.matches.get(name, 0) for name in RANGE), report.fired
    # an int cast is finite, so its tanh is, and the max of that with 0.5 is finite and positive: x / x goes,
    # and min(sigmoid, 1) goes
    fn = lambda a: (lambda c: c / c)(jnp.maximum(jnp.tanh(a.astype(jnp.int32).astype(jnp.float32)), 0.5)) \
        + jnp.minimum(jax.nn.sigmoid(a), 1.0)   # noqa: E731
    _, searched, report = saturated(fn, (A,))
    assert report.matches["div-self-of-finite-positive"] > 0 and report.matches["min-one-of-at-most-one"] > 0
    graph = extract(*searched, load_target("cpu")).graph
    assert "div" not in graph.op_counts() and "min" not in graph.op_counts(), graph.op_counts()
    np.testing.assert_allclose(np.asarray(lower(graph)(A)[0]), np.asarray(fn(A)), rtol=1e-6)


@pytest.mark.slow
def test_a_sum_of_an_outer_product_is_not_taken_for_a_matrix_vector_product():
    """sum(u[:, None] * w[None, :]) multiplies two broadcast vectors: neither is the matrix a row-sum rule
    needs (found by bench/everyday.py: the rewrite gave a dot of mismatched sizes, which verification
    refused). The rules do not fire, and the program extracted computes the same."""
    u, w = (jnp.asarray(rng.standard_normal(n), jnp.float32) for n in (8, 6))
    fn = lambda a, b: jnp.sum(jnp.outer(a, b))   # noqa: E731
    _, searched, report = saturated(fn, (u, w))
    assert not report.matches.get("row-sums-of-scaled-rows") and not report.matches.get("column-sums-of-scaled-columns")
    graph = extract(*searched, load_target("cpu")).graph
    np.testing.assert_allclose(np.asarray(lower(graph)(u, w)[0]), np.asarray(fn(u, w)), rtol=1e-5)
