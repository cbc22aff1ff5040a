"""Guarded programs (extract/guard.py): under the default strict numerics, a rewrite equal over the reals only
runs where a check of the call's arguments proves that neither it nor the original overflows or falls below the
smallest normal number, and the original runs elsewhere."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from superopt import superopt
from superopt.core.ir import unfused
from superopt.core.reference import evaluate
from superopt.egraph.capture import capture
from superopt.extract.guard import MIN_EXPONENT, exponent

N = 24


def sum_of_outer(u, w):
    return jnp.sum(jnp.outer(u, w))


def sum_of_product(a, b):
    return jnp.sum(a @ b)


def matvec_chain(a, b, v):
    return (a @ b) @ v


def _graph(fn, *shapes, dtype=jnp.float32):
    return capture(fn, tuple(jax.ShapeDtypeStruct(s, dtype) for s in shapes)).graph


def test_the_bound_follows_products_sums_and_their_cancellation():
    # sum_ij u_i w_j: each product at least 2**-2e, a multiple of 2**(-2e - 46) as a fused multiply-add
    # adds it, so its sums stay normal for e <= 40; a chain of two products for e <= 19.
    assert exponent(_graph(sum_of_outer, (N,), (N,))) == 40
    assert exponent(_graph(matvec_chain, (N, N), (N, N), (N,))) == 19
    assert exponent(_graph(lambda a, v: a @ (a @ v), (N, N), (N,))) == 19
    # Not bounded: a quotient, a transcendental, an integer argument; float16 leaves no room.
    assert exponent(_graph(lambda a, b: jnp.sum(a / b), (N,), (N,))) is None
    assert exponent(_graph(lambda a: jnp.sum(a / jnp.asarray([1.0, 0.0] * (N // 2))), (N,))) is None
    # a mean divides by its count, 576 < 2**10: the least sum's 2**(-2e - 46) over 2**10 is normal for e <= 35
    assert exponent(_graph(lambda u, w: jnp.mean(jnp.outer(u, w)), (N,), (N,))) == 35
    assert exponent(_graph(lambda a: jnp.sum(jnp.exp(a)), (N,))) is None
    assert exponent(capture(lambda a, i: jnp.sum(a * i), (jax.ShapeDtypeStruct((N,), jnp.float32),
                                                         jax.ShapeDtypeStruct((N,), jnp.int32))).graph) is None
    assert exponent(_graph(matvec_chain, (N, N), (N, N), (N,), dtype=jnp.float16)) is None


PROGRAMS = {
    "sum-of-outer": (sum_of_outer, ((N,), (N,))),
    "outer-factored": (lambda u, w: jnp.sum(u) * jnp.sum(w), ((N,), (N,))),
    "matvec-chain": (matvec_chain, ((8, 8), (8, 8), (8,))),
    "matvec-reassociated": (lambda a, b, v: a @ (b @ v), ((8, 8), (8, 8), (8,))),
    "square-of-difference": (lambda a, b: jnp.sum((a - b) ** 2 * a), ((N,), (N,))),
    "mean-of-product": (lambda a, b: jnp.mean(a @ b, axis=0) / 3.0, ((8, 8), (8, 8))),
}


def _edges(e: int):
    """Elements at the edges of [2**-e, 2**e], ones that cancel against them, and zeros."""
    ulp = 2.0 ** -23
    mags = [2.0 ** -e, 2.0 ** -e * (1 + ulp), 2.0 ** e, 2.0 ** e * (1 - ulp / 2), 1.0, 1.0 + ulp, 0.0]
    return st.sampled_from([s * m for m in mags for s in (1.0, -1.0)])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PROGRAMS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_inside_the_bound_no_value_overflows_or_falls_below_the_least_normal(name, data):
    """The bound's claim, on float32 arithmetic: every value of the program, inputs drawn at the edges of the
    range and cancelling each other, is zero or normal and finite."""
    fn, shapes = PROGRAMS[name]
    graph = unfused(_graph(fn, *shapes))
    e = exponent(graph)
    assert e is not None and e >= MIN_EXPONENT
    args = [np.array(data.draw(st.lists(_edges(e), min_size=int(np.prod(s)), max_size=int(np.prod(s)))),
                     np.float32).reshape(s) for s in shapes]
    live = graph.live()
    every_value = evaluate(dataclasses.replace(graph, outputs=live), args)   # the reference walk, every node kept
    for i, value in zip(live, every_value):
        v = np.abs(value.astype(np.float64))
        assert np.isfinite(v).all(), f"{graph.nodes[i].op} overflowed"
        assert ((v == 0) | (v >= np.finfo(np.float32).tiny)).all(), f"{graph.nodes[i].op} fell below the least normal"


def _overflowing(u, w):
    """Arguments on which sum(u) overflows and no product u_i w_j does."""
    return u.at[:2].set(3e38).at[2:].set(0.0), jnp.full_like(w, 1e-30)


@pytest.mark.slow
def test_strict_runs_a_factored_sum_where_the_check_holds_and_the_original_elsewhere():
    rng = np.random.default_rng(0)
    u, w = (jnp.asarray(rng.standard_normal(1000), jnp.float32) for _ in range(2))
    fast = superopt(sum_of_outer, target="cpu", cache=False)
    got = fast(u, w)
    assert "guarded" in fast.report.extraction and "sum-of-outer-product" in fast.report.extraction
    assert "elsewhere" in fast.term
    assert "runs some of them behind a check of its arguments" in str(fast.report)
    np.testing.assert_allclose(got, jax.jit(sum_of_outer)(u, w), rtol=1e-4, atol=1e-3)
    # sum(u) overflows where every product does not: the factored form gives inf, the original 6e8.
    big, tiny = _overflowing(u, w)
    expected = jax.jit(sum_of_outer)(big, tiny)
    assert np.isfinite(expected) and not np.isfinite(jnp.sum(big) * jnp.sum(tiny))
    assert fast(big, tiny) == expected
    # NaN, inf and an element below the range: the original's value, pattern and all.
    for bad in (u.at[3].set(jnp.nan), u.at[3].set(jnp.inf), u.at[3].set(1e-30)):
        np.testing.assert_array_equal(fast(bad, w), jax.jit(sum_of_outer)(bad, w))


@pytest.mark.slow
def test_a_guarded_program_works_under_jit_grad_vmap_and_export():
    rng = np.random.default_rng(1)
    a, b = (jnp.asarray(rng.standard_normal(1000), jnp.float32) for _ in range(2))
    fast = superopt(sum_of_outer, target="cpu", cache=False)
    assert "guarded" in fast.compile(a, b).report.extraction
    ref = jax.jit(sum_of_outer)
    np.testing.assert_allclose(jax.jit(fast)(a, b), ref(a, b), rtol=1e-4)
    for g, h in zip(jax.grad(fast, argnums=(0, 1))(a, b), jax.grad(ref, argnums=(0, 1))(a, b)):
        np.testing.assert_allclose(g, h, rtol=1e-5)
    batch = jnp.stack([a, a.at[0].set(jnp.inf)])
    got, want = jax.vmap(fast, (0, None))(batch, b), jax.vmap(ref, (0, None))(batch, b)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4)
    assert np.isinf(got[1]) == np.isinf(want[1]) and np.isnan(got[1]) == np.isnan(want[1])
    restored = jax.export.deserialize(jax.export.export(jax.jit(fast))(a, b).serialize())
    big, tiny = _overflowing(a, b)
    assert restored.call(big, tiny) == ref(big, tiny)
    np.testing.assert_allclose(restored.call(a, b), ref(a, b), rtol=1e-4)


@pytest.mark.slow
def test_the_cache_keeps_the_guard_and_its_fallback(tmp_path):
    rng = np.random.default_rng(2)
    u, w = (jnp.asarray(rng.standard_normal(1000), jnp.float32) for _ in range(2))
    first = superopt(sum_of_outer, target="cpu", cache=tmp_path)
    first(u, w)
    again = superopt(sum_of_outer, target="cpu", cache=tmp_path)
    big, tiny = _overflowing(u, w)
    assert again(big, tiny) == jax.jit(sum_of_outer)(big, tiny)
    assert again.report.cache.startswith("hit") and "elsewhere" in again.term
    np.testing.assert_allclose(again(u, w), first(u, w), rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("numerics, target, backend", [("fast", "cpu", "jax"), ("strict", "gpu-h100", "pallas")])
def test_no_guard_under_fast_numerics_or_on_another_backend(numerics, target, backend):
    u = jnp.ones(1000, jnp.float32)
    fast = superopt(sum_of_outer, target=target, backend=backend, numerics=numerics, cache=False)
    fast(u, u)
    assert "guarded" not in fast.report.extraction
