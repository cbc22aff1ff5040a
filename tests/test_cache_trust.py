"""What superopt trusts of its cache directory and of the process it runs in (RELIABILITY.md, "What the
cache trusts"): a private directory and database, an edited entry checked again and dropped, JAX's global
configuration left as the user set it, a cache that cannot be written warned about once and run without,
and outputs never reused by the identity of mutable arguments."""
import hashlib
import json
import os
import sqlite3
import stat
import warnings
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from superopt import cache, superopt
from superopt.cache import CacheWarning, Store, open_store


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Each test sees the cache's once-per-process warnings afresh."""
    monkeypatch.setattr(cache, "_error_warned", False)
    monkeypatch.setattr(cache, "_refused", {}, raising=False)


def _cache_warnings(seen) -> list[str]:
    return [str(w.message) for w in seen if issubclass(w.category, CacheWarning)]


# ---- 3: the NPU backend never reuses outputs by the arguments' identity ----

def test_npu_outputs_follow_an_argument_changed_in_place():
    def f(a, b):
        return jnp.tanh(a @ b) * 2.0

    rng = np.random.default_rng(0)
    a = rng.standard_normal((32, 48), np.float32)
    b = rng.standard_normal((48, 16), np.float32)
    fast = superopt(f, target="npu-910b", cache=False)
    fast.compile(a, b)                    # the build runs the NPU program on these very arrays
    assert "npu emulator" in fast.report.backend
    a *= -1                               # numpy arrays are mutable: same object, other values
    out = np.asarray(fast(a, b))
    np.testing.assert_allclose(out, np.asarray(jax.jit(f)(a, b)), rtol=2e-2, atol=2e-2)
    assert not np.allclose(out, np.asarray(jax.jit(f)(-a, b)), atol=1e-3)


# ---- 10: symbolic dimensions run as captured ----

@pytest.mark.parametrize("cached", [True, False])
def test_export_with_a_symbolic_dimension(tmp_path, cached):
    def f(x):
        return jnp.tanh(x * 2.0) + 1.0

    fast = superopt(f, cache=str(tmp_path / "c") if cached else False)
    spec = jax.ShapeDtypeStruct(jax.export.symbolic_shape("b, 128"), jnp.float32)
    exported = jax.export.export(jax.jit(fast))(spec)
    assert "symbolic" in fast.report.reason and not fast.report.optimized, fast.report.reason
    for rows in (3, 5):
        x = jnp.linspace(-2, 2, rows * 128, dtype=jnp.float32).reshape(rows, 128)
        np.testing.assert_allclose(exported.call(x), jax.jit(f)(x), rtol=1e-6)
