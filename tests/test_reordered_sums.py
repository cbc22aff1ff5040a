"""One definition of what a sum added in another order may differ by (README's numerics contract): at most
2 [((1 + u)^K - 1) sum|terms| + (1 + u)^K ((1 + l)^N - 1) W] per element, K = n - 1 + m, N = n + 2m
(`verify.reordered_sum_bound`; about 2 (n + m - 1) u sum|terms| plus an underflow term), for an "order" rewrite
and for a guarded "reals" rewrite alike, and `verify.judge` accepts exactly that. Where the terms cancel, the
relative error can be large: the case below is 700 in jax.jit's order and 0 in the factored one, both within
the bound."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from superopt import superopt
from superopt.core import verify
from superopt.egraph.capture import capture


def sum_of_product(a, b):
    return jnp.sum(a @ b)


def cancelling():
    a = np.zeros((200, 200), np.float32)
    a[0, :] = 1
    b = np.zeros((200, 200), np.float32)
    b[:100, 0], b[:100, 1], b[100:, 0] = 2.0 ** 27, 7, -2.0 ** 27
    return a, b


@pytest.mark.slow
def test_an_exact_cancellation_lost_by_a_guarded_rewrite_is_within_the_stated_bound():
    a, b = cancelling()
    fast = superopt(sum_of_product, target="cpu")
    got, want = float(fast(a, b)), float(jax.jit(sum_of_product)(a, b))
    assert want == 700.0
    assert fast.report.extraction.guarded, fast.report.extraction
    graph = capture(sum_of_product, (a, b)).graph
    (bound,) = verify.reordered_sum_bound(graph, [a, b])
    assert abs(got - want) <= bound, (got, want, bound)
    truth = verify.evaluate(graph, [a, b], precise=True)
    assert verify.judge([np.float32(want)], [np.float32(got)], truth, reordering=[bound]) is None
    # and no more than that: beyond the bound the judge refuses, with or without it
    beyond = np.float32(want + 2 * bound + 1e3)
    assert verify.judge([np.float32(want)], [beyond], truth, reordering=[bound]) is not None
    assert verify.judge([np.float32(want)], [np.float32(0.0)], truth) is not None   # the old, stricter reading


def test_the_bound_is_none_where_the_program_is_not_polynomial():
    graph = capture(lambda a: jnp.sum(jnp.exp(a)), (np.ones((3, 3), np.float32),)).graph
    assert verify.reordered_sum_bound(graph, [np.ones((3, 3), np.float32)]) is None
    graph = capture(lambda a, b: jnp.mean(a - 2.0 * b), (np.ones((3,), np.float32),) * 2).graph
    (bound,) = verify.reordered_sum_bound(graph, [np.full(3, 4.0, np.float32), np.ones(3, np.float32)])
    u, l = 2.0 ** -24, 2.0 ** -126
    # 6 terms (a_i / 3 and 2 b_i / 3), sum|terms| 18 / 3; at most a product and a quotient in one (m = 2), so
    # K = 6 - 1 + 2 and N = 6 + 4; raised to 1, a_i / 3 is 4 and 2 b_i / 3 is 2 (the divisor 1/3 raised to 1): W = 18
    relative = (1 + u) ** 7 - 1
    assert bound == pytest.approx(2 * (relative * 18 / 3 + (1 + relative) * ((1 + l) ** 10 - 1) * 18), rel=1e-12)
    assert bound == pytest.approx(2 * (6 + 1) * u * 18 / 3, rel=1e-6)   # the standard bound, to first order


def test_the_underflow_term_bounds_what_flushing_small_values_does():
    """An element far below the rest flushed to zero (XLA's CPU kernels flush subnormals) moves a sum by less
    than the bound's second term allows, and where every term underflows that term is all of the bound."""
    graph = capture(lambda a, b: jnp.sum(a @ b), (np.ones((4, 4), np.float32),) * 2).graph
    tiny = np.full((4, 4), 1e-39, np.float32)            # subnormal: each one may be read as 0
    (bound,) = verify.reordered_sum_bound(graph, [tiny, np.ones((4, 4), np.float32)])
    truth = 64 * float(np.float32(1e-39))
    assert bound >= truth                                   # a result of 0 (all flushed) is within it
    assert bound == pytest.approx(2 * 66 * 2.0 ** -126 * 64, rel=1e-3)   # and still tiny: 2 (n + 2m) l W, W = 64
    (ordinary,) = verify.reordered_sum_bound(graph, [np.ones((4, 4), np.float32)] * 2)
    assert ordinary == pytest.approx(2 * (((1 + 2.0 ** -24) ** 64 - 1) * 64
                                          + (1 + 2.0 ** -24) ** 64 * ((1 + 2.0 ** -126) ** 66 - 1) * 64), rel=1e-12)


EDGES = st.sampled_from([2.0 ** 27, -2.0 ** 27, 7.0, -7.0, 1.0, 0.0, 3.0 ** 10, -(3.0 ** 10)])


@pytest.mark.slow
@settings(max_examples=8, deadline=None)
@given(st.lists(EDGES, min_size=64, max_size=64), st.lists(EDGES, min_size=64, max_size=64))
def test_sums_of_products_with_cancellations_stay_within_the_bound(xs, ys):
    """Arguments whose products cancel exactly in one order and not another: superopt's value, whatever
    order it adds in, is within the stated bound of jax.jit's, and the judge agrees."""
    a = np.array(xs, np.float32).reshape(8, 8)
    b = np.array(ys, np.float32).reshape(8, 8)
    fast = superopt(sum_of_product, target="cpu")
    got, want = np.float32(fast(a, b)), np.float32(jax.jit(sum_of_product)(a, b))
    graph = capture(sum_of_product, (a, b)).graph
    bound = verify.reordered_sum_bound(graph, [a, b])
    assert abs(float(got) - float(want)) <= bound[0]
    assert verify.judge([want], [got], verify.evaluate(graph, [a, b], precise=True), reordering=bound) is None
