"""`superopt(fn, background=True)`: a first call runs jax.jit's program of fn at once, the optimization runs in a
thread, and later calls run the optimized program once it is verified and compiled; no call waits on it."""
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import superopt.api as api
from superopt import superopt

A = jnp.asarray(np.random.default_rng(0).standard_normal((256, 256)), jnp.float32)
B = jnp.asarray(np.random.default_rng(1).standard_normal((256, 256)), jnp.float32)


def program(a, b):
    return jnp.sum(a @ b)


class Counted:
    """A callable counted per call; anything else (`.lower`) is the wrapped one's."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.fn, name)


@pytest.fixture
def held(monkeypatch):
    """The optimizer, held until the test releases it (at most 120 s)."""
    release = threading.Event()
    real = api.optimize

    def optimize(*args, **kwargs):
        release.wait(120)
        return real(*args, **kwargs)
    monkeypatch.setattr(api, "optimize", optimize)
    return release


def _counted(fast):
    original = Counted(fast._tiers.original(fast))
    fast._tiers._jit_of_fn = original
    fast._jit = optimized = Counted(fast._jit)
    return original, optimized


def test_the_first_call_runs_the_original_at_once_and_a_later_call_the_optimized_program(held):
    fast = superopt(program, background=True, cache=False)
    original, optimized = _counted(fast)
    want = float(jax.jit(program)(A, B))
    got = float(fast(A, B))                     # returns while the optimizer is held: no call waits on it
    assert not held.is_set() and (original.calls, optimized.calls) == (1, 0)
    assert got == want
    with pytest.raises(RuntimeError, match="background"):
        fast.report
    fast(A, B)                                  # still held: the original again, and no second optimization
    assert (original.calls, optimized.calls) == (2, 0) and len(fast._tiers._jobs) == 1
    held.set()
    assert fast.wait(300)
    np.testing.assert_allclose(float(fast(A, B)), want, rtol=1e-5)
    assert (original.calls, optimized.calls) == (2, 1)
    assert fast.report.optimized, fast.report.outcome
    assert fast.report.tier.startswith("background: 2 calls ran jax.jit's program of fn")


def test_new_argument_types_start_their_own_optimization():
    fast = superopt(program, background=True, cache=False)
    fast(A, B)
    fast(A[:128, :128], B[:128, :128])
    assert len(fast._tiers._jobs) == 2
    assert fast.wait(300)
    for a, b in ((A, B), (A[:128, :128], B[:128, :128])):
        np.testing.assert_allclose(float(fast(a, b)), float(jax.jit(program)(a, b)), rtol=1e-5)


def test_under_a_trace_it_optimizes_where_it_is_traced():
    fast = superopt(program, background=True, cache=False)
    grad = jax.grad(fast)(A, B)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(jax.grad(program)(A, B)), rtol=1e-5, atol=1e-5)
    assert fast.report.optimized and not fast.report.tier
    assert not fast._tiers._jobs


def test_a_failed_background_optimization_warns_and_the_original_keeps_running(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no optimizer today")
    monkeypatch.setattr(api, "optimize", broken)
    fast = superopt(program, background=True, cache=False)
    want = float(jax.jit(program)(A, B))
    with warnings.catch_warnings(record=True) as caught:   # on the caller's thread, by the first call after it
        warnings.simplefilter("always")
        assert float(fast(A, B)) == want
        assert fast.wait(60)
        for _ in range(3):
            assert float(fast(A, B)) == want
    assert sum("background optimization failed" in str(w.message) for w in caught) == 1
    assert len(fast._tiers._jobs) == 1


def test_background_is_for_the_jax_and_pallas_backends():
    with pytest.raises(ValueError, match="background=True"):
        superopt(program, target="npu-910b", background=True)
    with pytest.raises(TypeError, match="background must be True or False"):
        superopt(program, background="yes")
