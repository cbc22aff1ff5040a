"""The persistent store (superopt/cache.py) and `superopt cache stats|clear`: entries read back only when
they check out, a damaged file is set aside, several processes write at once, and a cache error is never
the caller's exception."""
import hashlib
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import jax
import pytest

from superopt import cache
from superopt.cache import SCHEMA, CacheWarning, Store, enable_jax_cache, open_store
from superopt.cli import main


def _rows(directory) -> dict:
    with sqlite3.connect(Path(directory) / cache.DATABASE) as db:
        return {k: (kind, schema, payload, checksum) for k, kind, schema, payload, checksum
                in db.execute("SELECT key, kind, schema, payload, checksum FROM entries")}


def _sql(directory, statement: str, params=()) -> None:
    db = sqlite3.connect(Path(directory) / cache.DATABASE)
    with db:
        db.execute(statement, params)
    db.close()


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "c")
    yield s
    s.close()


def test_hit_after_put_and_misses(store):
    value = {"term": "(Add x y)", "cost": 1.5, "shape": [2, 3], "inf": float("inf")}
    store.put("k1", "term", value)
    assert store.get("k1", "term") == value
    assert store.get("unknown", "term") is None
    assert store.get("k1", "extraction") is None          # the kind is part of what is asked
    assert store.get("k1", "term") == value               # ... and that miss did not remove the entry
    assert (store.hits, store.misses) == (2, 2)
    assert store.path == store.directory / "terms.sqlite3" and store.path.exists()


def test_put_replaces(store):
    store.put("k", "term", {"v": 1})
    store.put("k", "term", {"v": 2})
    assert store.get("k", "term") == {"v": 2}


def test_a_value_must_be_a_dict(store):
    with pytest.raises(TypeError, match="must be a dict, got list for term k"):
        store.put("k", "term", [1, 2])


@pytest.mark.parametrize("damage", ["garbage payload", "garbage with its checksum", "other schema"])
def test_a_damaged_entry_is_a_miss_and_is_removed(store, damage):
    store.put("k", "term", {"v": 1})
    store.put("other", "term", {"v": 2})
    if damage == "garbage payload":
        _sql(store.directory, "UPDATE entries SET payload = ? WHERE key = 'k'", (b"\x00garbage\xff",))
    elif damage == "garbage with its checksum":    # the checksum holds, the payload does not decompress
        _sql(store.directory, "UPDATE entries SET payload = ?, checksum = ? WHERE key = 'k'",
             (b"not zlib", hashlib.sha256(b"not zlib").hexdigest()))
    else:
        _sql(store.directory, "UPDATE entries SET schema = ? WHERE key = 'k'", (SCHEMA + 1,))
    assert store.get("k", "term") is None
    assert "k" not in _rows(store.directory)
    assert store.get("other", "term") == {"v": 2}       # the others stay


def test_a_foreign_entry_is_a_miss(store):
    store.put("a", "term", {"v": "a"})
    store.put("b", "term", {"v": "b"})
    _, _, payload, checksum = _rows(store.directory)["a"]
    _sql(store.directory, "UPDATE entries SET payload = ?, checksum = ? WHERE key = 'b'", (payload, checksum))
    assert store.get("b", "term") is None                # a's payload, valid, under b's key
    assert "b" not in _rows(store.directory)
    assert store.get("a", "term") == {"v": "a"}


def test_a_garbage_database_is_moved_aside(tmp_path):
    directory = tmp_path / "c"
    directory.mkdir()
    (directory / cache.DATABASE).write_bytes(b"this is not a database" * 200)
    s = Store(directory)
    with pytest.warns(CacheWarning, match=r"terms\.sqlite3 is not a SQLite database.*corrupt-"):
        assert s.get("k", "term") is None
    assert (directory / f"{cache.DATABASE}.corrupt-{os.getpid()}").read_bytes().startswith(b"this is not")
    s.put("k", "term", {"v": 1})
    assert s.get("k", "term") == {"v": 1}
    s.close()


def test_a_truncated_database_is_moved_aside(tmp_path):
    s = Store(tmp_path / "c")
    for i in range(200):
        s.put(f"k{i}", "term", {"v": "x" * 200, "i": i})
    s.close()                                      # the last connection writes the WAL back into the file
    data = s.path.read_bytes()
    s.path.write_bytes(data[:len(data) // 3])
    for suffix in ("-wal", "-shm"):
        Path(f"{s.path}{suffix}").unlink(missing_ok=True)
    fresh = Store(tmp_path / "c")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for i in range(200):                         # a miss or a hit, never an exception
            got = fresh.get(f"k{i}", "term")
            assert got is None or got == {"v": "x" * 200, "i": i}
        fresh.put("new", "term", {"v": 1})
        assert fresh.get("new", "term") == {"v": 1}
    assert all(issubclass(w.category, CacheWarning) for w in seen)
    fresh.close()


def test_sqlite_errors_are_misses_with_one_warning(store, monkeypatch):
    store.put("k", "term", {"v": 1})
    monkeypatch.setattr(cache, "_error_warned", False)

    def locked(self):
        raise sqlite3.OperationalError("database is locked")
    monkeypatch.setattr(Store, "_db", locked)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert store.get("k", "term") is None
        store.put("k2", "term", {"v": 2})
        assert store.get("k", "term") is None
    assert len(seen) == 1 and "could not be read" in str(seen[0].message) and "database is locked" in str(
        seen[0].message)


def _writer(directory: str, n: int, barrier) -> None:
    """One of the concurrent writers: 50 entries of its own and 10 that every writer puts, interleaved."""
    warnings.simplefilter("error", CacheWarning)      # a skipped write fails the test
    s = Store(directory)
    barrier.wait()
    for i in range(50):
        s.put(f"p{n}-{i}", "term", {"writer": n, "i": i, "pad": "x" * (i * 10)})
        if i % 5 == 0:
            s.put(f"shared-{i // 5}", "term", {"j": i // 5, "writer": n})
            s.get(f"shared-{i // 5}", "term")


@pytest.mark.slow
def test_concurrent_writers(tmp_path):
    directory = str(tmp_path / "c")
    Store(directory)                                  # the directory, not the file: they race to create it
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_writer, args=(directory, n, barrier)) for n in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    s = Store(directory)
    for n in range(4):
        for i in range(50):
            assert s.get(f"p{n}-{i}", "term") == {"writer": n, "i": i, "pad": "x" * (i * 10)}
    for j in range(10):
        got = s.get(f"shared-{j}", "term")
        assert got is not None and got["j"] == j and got["writer"] in range(4)
    assert s.stats().entries == {"term": 210}
    s.close()


def test_a_forked_child_opens_its_own_connection(store):
    store.put("k", "term", {"v": 1})
    parent = store._db()
    store._pid = -1                                   # as if this process were a child forked after the open
    assert store.get("k", "term") == {"v": 1}
    assert store._conn is not parent and store._pid == os.getpid()
    parent.close()


def test_stats_and_clear(store):
    for i in range(3):
        store.put(f"t{i}", "term", {"i": i})
    store.put("e", "extraction", {"cost": 2.0})
    store.get("t0", "term")
    store.get("nope", "term")
    stats = store.stats()
    assert stats.directory == store.directory and stats.file_bytes > 0
    assert stats.entries == {"extraction": 1, "term": 3} and stats.total == 4
    assert (stats.hits, stats.misses) == (1, 1)
    assert store.clear() == 4
    assert store.stats().entries == {} and store.get("t0", "term") is None


def test_open_store_options(tmp_path, monkeypatch):
    monkeypatch.delenv("SUPEROPT_CACHE", raising=False)
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path / "default"))
    assert cache.default_directory() == tmp_path / "default"
    default = open_store()
    assert default.directory == tmp_path / "default" and open_store(True) is default
    assert open_store(False) is None
    mine = open_store(str(tmp_path / "mine"))
    assert mine.directory == tmp_path / "mine" and open_store(tmp_path / "mine") is mine   # memoized
    for value in ("off", "0", "false", "OFF"):
        monkeypatch.setenv("SUPEROPT_CACHE", value)
        assert open_store() is None and open_store(True) is None
        assert open_store(str(tmp_path / "mine")) is mine          # a directory given is still used
    for bad in (3, 1.5, ["dir"], b"dir"):
        with pytest.raises(TypeError, match=r"cache= takes True, False, None or a directory"):
            open_store(bad)


def test_default_directory_is_the_calibration_rule(monkeypatch, tmp_path):
    from superopt.extract import calibrate
    monkeypatch.delenv("SUPEROPT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.default_directory() == tmp_path / "xdg" / "superopt" == calibrate.cache_path().parent


@pytest.fixture
def jax_cache_config(monkeypatch):
    """Put JAX's compilation cache settings back as they were after the test."""
    before = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setattr(cache, "_jax_enabled", None)
    yield
    jax.config.update("jax_compilation_cache_dir", before[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])
    cache.jax_compilation_cache.reset_cache()


def test_enable_jax_cache_leaves_the_users_cache_alone(tmp_path, monkeypatch, jax_cache_config):
    mine = str(tmp_path / "users-jax-cache")
    jax.config.update("jax_compilation_cache_dir", mine)
    min_time = jax.config.jax_persistent_cache_min_compile_time_secs
    assert enable_jax_cache(tmp_path / "c") is False
    assert jax.config.jax_compilation_cache_dir == mine
    assert jax.config.jax_persistent_cache_min_compile_time_secs == min_time
    assert not (tmp_path / "c" / "jax").exists()
    jax.config.update("jax_compilation_cache_dir", None)
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", mine)
    assert enable_jax_cache(tmp_path / "c") is False and jax.config.jax_compilation_cache_dir is None


def test_enable_jax_cache_once(tmp_path, jax_cache_config):
    jax.config.update("jax_compilation_cache_dir", None)
    assert enable_jax_cache(tmp_path / "c") is True
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "c" / "jax")
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.2
    assert (tmp_path / "c" / "jax" / cache.JAX_MARKER).exists()
    assert enable_jax_cache(tmp_path / "c") is True                       # idempotent
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "c" / "jax")
    assert enable_jax_cache(tmp_path / "elsewhere") is False               # one directory per process


# ---- superopt cache stats|clear ----

def test_cli_cache_stats_and_clear(tmp_path, capsys):
    s = Store(tmp_path)
    for i in range(3):
        s.put(f"t{i}", "term", {"i": i})
    s.put("e", "extraction", {"cost": 1.0})
    jax_dir = tmp_path / "jax"
    jax_dir.mkdir()
    (jax_dir / cache.JAX_MARKER).write_text("")
    (jax_dir / "jit_f-abc-cache").write_bytes(b"x" * 100)
    assert main(["cache", "stats", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"cache directory: {tmp_path}" in out and "terms.sqlite3:" in out and "4 entries" in out
    assert [line.split() for line in out.splitlines() if line.split()[:1] in (["term"], ["extraction"])] == \
        [["extraction", "1"], ["term", "3"]]
    assert "1 files" in out
    assert main(["cache", "clear", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "removed 4 entries from" in out and f"removed 1 JAX compilation cache files from {jax_dir}" in out
    assert not (jax_dir / "jit_f-abc-cache").exists() and (jax_dir / cache.JAX_MARKER).exists()
    assert s.get("t0", "term") is None
    s.close()


def test_cli_cache_clear_leaves_a_jax_cache_superopt_did_not_make(tmp_path, capsys):
    (tmp_path / "jax").mkdir()
    (tmp_path / "jax" / "jit_g-cache").write_bytes(b"y")
    assert main(["cache", "clear", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no term store at" in out and "left" in out and "superopt did not create it" in out
    assert (tmp_path / "jax" / "jit_g-cache").exists()


def test_cli_cache_stats_of_an_empty_directory(tmp_path, capsys):
    assert main(["cache", "stats", "--dir", str(tmp_path / "none")]) == 0
    assert "no term store" in capsys.readouterr().out
    assert not (tmp_path / "none").exists()        # looking does not create it


_LOADED = ("egglog", "superopt.egraph.terms", "superopt.npu_backend", "superopt.lowering.pallas.program")


@pytest.mark.slow
def test_a_call_the_cache_answers_loads_no_egglog(tmp_path):
    """The first call in a new process whose cache holds the program imports neither egglog nor a backend's
    lowering (superopt/core/lazy.py): importing them was most of that call's time. The process that filled
    the cache did import egglog, so the check can fail."""
    script = textwrap.dedent(f"""
        import sys
        import jax.numpy as jnp
        from superopt import superopt
        f = superopt(lambda x: x * 2 + 1, cache={str(tmp_path / "c")!r})
        assert float(f(jnp.ones((4, 4)))[0, 0]) == 3.0
        print(f.report.cache.status == "hit", [m for m in {_LOADED!r} if m in sys.modules])
    """)

    def run() -> str:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip().splitlines()[-1]

    assert run() == "False ['egglog', 'superopt.egraph.terms']"
    assert run() == "True []"
