"""`make demo` shows a gain under the default numerics: its function is optimized by the rule its text names."""
import jax
import numpy as np
import pytest

from superopt import superopt
from superopt import demo


@pytest.mark.slow
@pytest.mark.e2e
def test_the_demo_function_is_optimized_under_default_numerics():
    rng = np.random.default_rng(1)
    q, k = (rng.standard_normal((96, 32), dtype=np.float32) for _ in range(2))
    fast = superopt(demo.matched_similarity, target="cpu")
    got = np.asarray(fast(q, k))
    want = np.sum(q * k, 1) / np.sqrt(np.sum(q * q, 1) * np.sum(k * k, 1))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    report = fast.report
    assert report.numerics.startswith("strict") and report.optimized, report.outcome
    assert report.run.fired.get("diagonal-of-matmul", 0) >= 3, report.run.fired
    assert "f32[96,96]" not in str(jax.make_jaxpr(fast)(q, k)) and "f32[96,96]" in str(
        jax.make_jaxpr(demo.matched_similarity)(q, k))          # no N x N matrix is built any more
