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
from superopt.core import verify
from superopt.egraph.capture import capture
from superopt.cache import CacheWarning, Store, open_store
from superopt.report import CacheUse


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Each test sees the cache's once-per-process warnings afresh."""
    monkeypatch.setattr(cache, "_error_warned", False)
    monkeypatch.setattr(cache, "_refused", {}, raising=False)


def _cache_warnings(seen) -> list[str]:
    return [str(w.message) for w in seen if issubclass(w.category, CacheWarning)]


# ---- 3: the NPU backend never reuses outputs by the arguments' identity ----

@pytest.mark.slow
def test_npu_outputs_follow_an_argument_changed_in_place():
    def f(a, b):
        return jnp.tanh(a @ b) * 2.0

    rng = np.random.default_rng(0)
    a = rng.standard_normal((32, 48), np.float32)
    b = rng.standard_normal((48, 16), np.float32)
    fast = superopt(f, target="npu-910b", cache=False)
    fast.compile(a, b)                    # the build runs the NPU program on these very arrays
    assert fast.report.backend.runs == "npu emulator", fast.report.backend
    a *= -1                               # numpy arrays are mutable: same object, other values
    out = np.asarray(fast(a, b))
    np.testing.assert_allclose(out, np.asarray(jax.jit(f)(a, b)), rtol=2e-2, atol=2e-2)
    assert not np.allclose(out, np.asarray(jax.jit(f)(-a, b)), atol=1e-3)


# ---- 7: JAX's persistent compilation cache is the user's to turn on ----

@pytest.mark.slow
def test_a_call_leaves_jaxs_configuration_alone(tmp_path, monkeypatch):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    before = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
    fast = superopt(lambda x: x * 2.0 + 1.0, cache=str(tmp_path / "c"))
    assert np.allclose(fast(jnp.ones(8)), 3.0)
    assert (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs) == before
    assert not (tmp_path / "c" / cache.JAX_SUBDIR).exists()


def test_the_opt_in_refuses_a_directory_others_can_write(tmp_path, monkeypatch):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setattr(cache, "_jax_enabled", None)
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    try:
        (tmp_path / "c" / cache.JAX_SUBDIR).mkdir(parents=True)
        os.chmod(tmp_path / "c" / cache.JAX_SUBDIR, 0o777)
        with pytest.warns(CacheWarning, match=r"not turning on JAX's compilation cache .* writable by group"):
            assert cache.enable_jax_cache(tmp_path / "c") is False
        assert jax.config.jax_compilation_cache_dir is None
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


# ---- 6 and 7: the directory and the database are the user's own, and private ----

def test_the_cache_directory_and_database_are_private(tmp_path):
    old = os.umask(0o002)                 # a common umask: group-writable files by default
    try:
        s = Store(tmp_path / "new" / "c")
        s.put("k", "term", {"v": 1})
        assert s.get("k", "term") == {"v": 1}
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new" / "c").stat().st_mode) == 0o700
    for path in (s.path, Path(f"{s.path}-wal")):
        if path.exists():
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, (path, oct(path.stat().st_mode))
    s.close()


@pytest.mark.slow
@pytest.mark.parametrize("what", ["directory", "database"])
def test_a_group_or_world_writable_cache_is_not_used(tmp_path, fresh_warnings, what):
    directory = tmp_path / "c"
    Store(directory).put("k", "term", {"v": 1})
    os.chmod(directory if what == "directory" else directory / cache.DATABASE,
             0o770 if what == "directory" else 0o666)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert open_store(str(directory)) is None
        assert open_store(str(directory)) is None               # warned once
        fast = superopt(lambda x: x * 2.0 + 1.0, cache=str(directory))
        assert np.allclose(fast(jnp.ones(8)), 3.0)
    messages = _cache_warnings(seen)
    assert len(messages) == 1 and "writable by" in messages[0] and "without the cache" in messages[0], messages
    assert fast.report.cache.status == "unused" and "writable by" in fast.report.cache.why, fast.report.cache


def test_a_cache_owned_by_another_user_is_not_used(tmp_path, fresh_warnings, monkeypatch):
    directory = tmp_path / "c"
    Store(directory)
    me = os.geteuid()
    monkeypatch.setattr(cache.os, "geteuid", lambda: me + 1)   # as another user would find it
    with pytest.warns(CacheWarning, match=r"owned by another user"):
        assert open_store(str(directory)) is None


def _edit_program_entries(directory, edit) -> int:
    """Apply `edit` to the JSON of each `program` entry and store it with a recomputed checksum, as someone
    with write access to the database could; the number edited."""
    db = sqlite3.connect(Path(directory) / cache.DATABASE)
    n = 0
    with db:
        for key, payload in db.execute("SELECT key, payload FROM entries WHERE kind = 'program'").fetchall():
            text = edit(zlib.decompress(payload).decode())
            new = zlib.compress(text.encode())
            db.execute("UPDATE entries SET payload = ?, checksum = ? WHERE key = ?",
                       (new, hashlib.sha256(new).hexdigest(), key))
            n += 1
    db.close()
    return n


@pytest.mark.slow
def test_an_edited_entry_is_checked_again_and_dropped(tmp_path, fresh_warnings):
    def f(a, b):   # the diagonal of a product, a rewrite XLA does not make itself (XLA would CSE a repeated sum)
        return jnp.diag(a @ b) * 2.0

    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.standard_normal((200, 200)), jnp.float32) for _ in range(2))
    x = (a, b)
    directory = str(tmp_path / "c")
    first = superopt(f, cache=directory)
    want = np.asarray(jax.jit(f)(*x), np.float64)
    # the rewrite sums each row's products in another order: within the reordered-sum bound of jax.jit's values
    # (an element near 0 can differ by more than 1e-4 of itself; the bound of the same values written as row sums),
    # and far from the edited program's 2x
    (bound,) = verify.reordered_sum_bound(capture(lambda a, b: jnp.sum(a * b.T, axis=1) * 2.0, x).graph, list(x))

    def agrees(got):
        return bool(np.all(np.abs(np.asarray(got, np.float64) - want) <= bound))

    assert agrees(first(*x)) and first.report.optimized and first.report.cache.status == "miss"
    two, four = json.dumps({"f": float(2.0).hex()}), json.dumps({"f": float(4.0).hex()})
    assert _edit_program_entries(directory, lambda t: t.replace(two.replace(" ", ""), four.replace(" ", ""))) == 1
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        again = superopt(f, cache=directory)          # the same program: the edited entry is what the cache has
        got = np.asarray(again(*x))
    assert agrees(got), (got, want)   # not the edited program's 2x
    assert again.report.cache.status == "miss" and again.report.cache.dropped, again.report.cache
    assert any("differs from the program" in m for m in _cache_warnings(seen)), _cache_warnings(seen)
    third = superopt(f, cache=directory)                # the result stored again in its place is a hit
    assert agrees(third(*x)) and third.report.cache.status == "hit", third.report.cache


# ---- 9: a cache that cannot be created or written ----

@pytest.mark.slow
def test_an_uncreatable_default_directory_warns_once_and_runs(tmp_path, monkeypatch, fresh_warnings):
    (tmp_path / "home").write_text("a file, so nothing can be made under it")
    monkeypatch.delenv("SUPEROPT_CACHE", raising=False)
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path / "home" / ".cache" / "superopt"))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for k in (1.0, 2.0):
            fast = superopt(lambda x: x * k + 1.0)
            assert np.allclose(fast(jnp.ones(4)), k + 1.0)
        fast = superopt(lambda x: x * 3.0, cache=str(tmp_path / "home" / "mine"))
        assert np.allclose(fast(jnp.ones(4)), 3.0)
    messages = _cache_warnings(seen)
    assert len(messages) == 2 and all("without the cache" in m for m in messages), messages
    assert fast.report.cache.status == "unused", fast.report.cache


@pytest.mark.slow
def test_a_read_only_cache_directory_runs(tmp_path, monkeypatch, fresh_warnings):
    directory = tmp_path / "c"
    Store(directory).put("k", "term", {"v": 1})
    real_mkdir = Path.mkdir

    def read_only(self, *args, **kwargs):   # as a read-only directory answers, whoever runs the tests
        if Path(self).is_relative_to(directory):
            raise PermissionError(13, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)
    monkeypatch.setattr(Path, "mkdir", read_only)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        fast = superopt(lambda x: x * 2.0 + 1.0, cache=str(directory))
        assert np.allclose(fast(jnp.ones(8)), 3.0)


class _FullDisk:
    """A connection on a full disk: reads work, every INSERT fails as SQLite fails it there."""

    def __init__(self, conn):
        self.conn = conn

    def execute(self, sql, *args):
        if sql.lstrip().upper().startswith("INSERT"):
            raise sqlite3.OperationalError("database or disk is full")
        return self.conn.execute(sql, *args)


@pytest.mark.slow
def test_a_failed_write_says_not_stored(tmp_path, fresh_warnings, monkeypatch):
    directory = tmp_path / "c"
    real_db = Store._db
    monkeypatch.setattr(Store, "_db", lambda self: _FullDisk(real_db(self)))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fast = superopt(lambda x: jnp.sum(x * 2.0) + jnp.sum(x * 2.0), cache=str(directory))
        assert np.allclose(fast(jnp.arange(64.0, dtype=jnp.float32)), 2 * 2 * np.arange(64.0).sum())
    assert fast.report.cache == CacheUse("miss", why="database or disk is full"), fast.report.cache
    assert str(fast.report.cache) == "miss; not stored (database or disk is full)"
    assert len(_cache_warnings(seen)) == 1


# ---- 10: symbolic dimensions: decided at stand-in sizes (tests/test_sizes.py), the cache used there ----

@pytest.mark.slow
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
