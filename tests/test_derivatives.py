"""A changed program's derivatives are verified against the user's program's the first time JAX
differentiates it (superopt/backends.py, `with_derivatives`; superopt/core/derivatives.py), and the report
says whose derivative runs. The programs run on a GPU target, whose cost model changes these small programs
(on cpu they run as the original)."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from superopt import superopt
from superopt.core import derivatives
from superopt.core.verify import VerificationWarning

CHANGED = "gpu-h100"
X = jnp.asarray(np.array([0.0, 1.0, -2.0, 0.0, 0.5, -0.0, 3.0, 0.25], np.float32))
W = jnp.asarray(np.random.default_rng(2).standard_normal((8, 8)), jnp.float32)


def kinked(x, w=W):
    """sqrt(|x|)**2 is |x| (`square-of-sqrt-of-nonneg`), but its derivative at 0 is NaN (0 * inf) and |x|'s
    is not: the values agree everywhere, the derivatives at the kink do not. (The diagonal of a product beside
    it is a rewrite XLA does not make, so the chosen program is a different executable.)"""
    return jnp.sum(jnp.sqrt(jnp.abs(x)) ** 2 * jnp.diagonal(w @ w))


def smooth(a, b):
    return jnp.sum(jnp.tanh(jnp.diagonal(a @ b)))


def assert_nan_equal(got, want):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6, equal_nan=True)


def test_a_derivative_that_differs_at_a_kink_is_the_originals():
    fast = superopt(kinked, target=CHANGED)
    fast(X)
    assert fast.report.optimized, fast.report.outcome
    assert fast.report.derivatives.startswith("not verified yet")
    with pytest.warns(VerificationWarning, match="derivatives differ"):
        got = jax.grad(fast)(X)
    want = jax.grad(jax.jit(kinked))(X)
    assert np.isnan(np.asarray(want)[0])            # the original's derivative at 0, which superopt keeps
    assert_nan_equal(got, want)
    assert fast.report.derivatives.startswith("the original's: the optimized program's differ")
    assert "zeros inputs" in fast.report.derivatives
    assert "derivatives  : the original's" in str(fast.report)
    # decided once: a second derivative call neither checks nor warns again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_nan_equal(jax.jvp(fast, (X,), (jnp.ones_like(X),))[1],
                         jax.jvp(jax.jit(kinked), (X,), (jnp.ones_like(X),))[1])


def test_derivatives_are_verified_inside_a_jitted_gradient():
    a = jnp.asarray(np.random.default_rng(0).standard_normal((8, 8)), jnp.float32)
    b = jnp.asarray(np.random.default_rng(1).standard_normal((8, 8)), jnp.float32)
    fast = superopt(smooth, target=CHANGED)
    got = jax.jit(jax.grad(lambda a, b: fast(a, b) * 2.0, (0, 1)))(a, b)   # superopt's call inside jit, inside grad
    want = jax.grad(lambda a, b: smooth(a, b) * 2.0, (0, 1))(a, b)
    assert fast.report.optimized, fast.report.outcome
    assert fast.report.derivatives.startswith("verified: jvp and vjp equal the original's"), fast.report.derivatives
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_without_verification_the_report_says_derivatives_are_unverified():
    fast = superopt(kinked, target=CHANGED, verify=False)
    jax.grad(fast)(X)
    assert fast.report.derivatives == "the optimized program's, not verified (verify=False)"


def test_the_original_program_has_no_derivative_line():
    fast = superopt(kinked, target="cpu")
    jax.grad(fast)(X)
    assert not fast.report.optimized
    assert fast.report.derivatives == ""


def test_check_compares_both_modes_and_names_the_set():
    avals = [((4,), "float32")]
    same = derivatives.check(lambda x: [jnp.abs(x) * x], lambda x: [x * jnp.abs(x)], avals)
    assert same is None
    problem = derivatives.check(lambda x: [jnp.sqrt(jnp.abs(x)) ** 2], lambda x: [jnp.abs(x)], avals)
    assert problem is not None and "jvp" in problem and "zeros inputs" in problem
    # integer arguments and outputs have no derivative to compare; floats beside them still are
    mixed = [((3,), "int32"), ((3,), "float32")]
    assert derivatives.check(lambda i, x: [i * 2, x * i], lambda i, x: [i + i, i * x], mixed) is None
    assert derivatives.check(lambda i, x: [x * 2.0], lambda i, x: [x * 2.5], mixed) is not None


@pytest.mark.slow   # a 1,000-op program's derivative: 17 s, make test, not test-fast
def test_a_program_traced_long_takes_the_originals_derivatives_unchecked():
    """A Python loop over 200 rows traces to 1,000+ ops; checking its derivatives would compile four such
    programs, so the user's program's derivative (one compile, as under jax.jit) is what runs, and the report
    says why."""
    rows = range(200)

    def f(a, v):
        return jnp.stack([jnp.sum(jnp.tanh(a[i]) * v) for i in rows])
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((200, 200)), jnp.float32)
    v = jnp.asarray(rng.standard_normal(200), jnp.float32)
    fast = superopt(f, target="cpu", cache=False)
    fast(a, v)
    assert fast.report.optimized, fast.report.outcome
    loss = lambda fn: (lambda a, v: jnp.sum(fn(a, v) ** 2))   # noqa: E731
    # the reference under jax.jit: op by op, the 1,000-op derivative compiled each of its ops on its own
    np.testing.assert_allclose(np.asarray(jax.grad(loss(fast))(a, v)), np.asarray(jax.jit(jax.grad(loss(f)))(a, v)),
                               rtol=1e-5, atol=1e-5)
    assert "more than 500 ops" in fast.report.derivatives, fast.report.derivatives
