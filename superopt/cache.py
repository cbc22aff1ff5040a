"""A persistent, content-addressed store of superopt's results, shared by processes on one machine.

Optimizing a program saturates an e-graph and extracts from it, which takes seconds to minutes; the
result depends only on the program and the options, so the pipeline keys its results by a hash of those
and keeps them here across runs (`superopt(fn, cache=...)`). The store is one SQLite file,
`terms.sqlite3`, in superopt's cache directory (the one the calibration uses:
`extract/calibrate.cache_dir`).

The cache is as trusted as the code in the user's environment, and no more (RELIABILITY.md, "What the
cache trusts"): whoever can write the directory can change what superopt runs, as whoever can write
site-packages can. So the directory is created private (0700) and the database file 0600, and `open_store`
uses neither a directory nor a database (nor its journal files) that is owned by another user or writable
by group or others, as ssh and gpg treat their files: one `CacheWarning` per directory, and the call runs
without the cache. A directory that cannot be created or opened is the same: a warning, no cache.

Nothing read back is trusted beyond that. Each entry holds a zlib-compressed canonical JSON payload that
repeats its key and kind, the payload's sha256, and the entry format's `SCHEMA`; an entry whose schema
differs, whose checksum fails, whose payload does not decode, or whose payload names another key or kind is
a miss and is deleted. The checksum finds damage, not edits: whoever can write an entry can write its
checksum. What a program entry must also pass on every read, its program's types, and on its first use in
a process a run against the captured program, is the pipeline's (superopt/reuse.py). A file that is not a
SQLite database is moved aside (`terms.sqlite3.corrupt-<pid>`) with a warning and a fresh one started. A
cache must never break the program it speeds up: any SQLite error in `get` or `put` (locked past the
timeout, disk full, read-only directory) is a miss or a skipped write, with one warning per process; `put`
returns why it did not write, for the report.

Several processes may write at once (parallel workers, several programs of one user): the database runs in
WAL mode with a busy timeout, each `put` is its own short transaction, and each process opens its own
connection (a forked child opens a new one).

superopt never changes JAX's global configuration on its own: JAX's persistent compilation cache is used
where the user configured it. `enable_jax_cache` is the explicit opt-in that turns it on in <directory>/jax
(for the whole process: every jax.jit then reads and writes there, so that directory is held to the same
checks as the store's).
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import stat
import threading
import time
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import jax
from jax.experimental.compilation_cache import compilation_cache as jax_compilation_cache

from superopt.extract.calibrate import cache_dir

SCHEMA = 1                        # bump when the entry format changes; entries of another schema are misses
DATABASE = "terms.sqlite3"
JAX_SUBDIR = "jax"
JAX_MARKER = ".created-by-superopt"   # in <directory>/jax when superopt made that directory (clear may empty it)
BUSY_TIMEOUT_S = 30.0
OFF_VALUES = ("off", "0", "false")
ENV_SWITCH = "SUPEROPT_CACHE"     # "off", "0" or "false": no cache unless a directory is given
JAX_MIN_COMPILE_TIME_S = 0.2      # programs that compile faster are not worth a file in JAX's cache

_CREATE = """CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY, kind TEXT NOT NULL, schema INTEGER NOT NULL, payload BLOB NOT NULL,
    checksum TEXT NOT NULL, created REAL NOT NULL, last_used REAL NOT NULL, hits INTEGER NOT NULL DEFAULT 0)"""
_CORRUPT = ("SQLITE_NOTADB", "SQLITE_CORRUPT")


class CacheWarning(UserWarning):
    """The cache could not be used, read or written, or held a wrong entry; superopt goes on without it."""


@dataclass
class CacheStats:
    directory: Path
    file_bytes: int                                   # the database with its WAL and shared-memory files
    entries: dict[str, int] = field(default_factory=dict)   # kind -> number of entries
    hits: int = 0                                     # in this process
    misses: int = 0

    @property
    def total(self) -> int:
        return sum(self.entries.values())


_error_warned = False             # one warning per process for SQLite errors in get/put


def _warn_error(action: str, path: Path, exc: Exception) -> None:
    global _error_warned
    if not _error_warned:
        _error_warned = True
        warnings.warn(f"superopt: the cache {path} could not {action} ({type(exc).__name__}: {exc}); going on "
                      f"without it (further cache errors in this process are not reported)", CacheWarning,
                      stacklevel=3)


def _unsafe(path: Path) -> str | None:
    """Why `path` (a cache directory or file) is not to be trusted, or None: owned by another user, or
    writable by group or others. A path that does not exist is None (it is created private)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    if st.st_uid != os.geteuid():
        return f"{path} is owned by another user (uid {st.st_uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}; chmod go-w it)"
    return None


def _encode(key: str, kind: str, value: dict) -> bytes:
    text = json.dumps({"key": key, "kind": kind, "value": value}, sort_keys=True, separators=(",", ":"))
    return zlib.compress(text.encode("utf-8"))


def _decode(payload: bytes) -> dict | None:
    """The payload's document, or None when it does not decompress or decode."""
    try:
        doc = json.loads(zlib.decompress(payload).decode("utf-8"))
    except (zlib.error, UnicodeDecodeError, ValueError, TypeError):
        return None
    return doc if isinstance(doc, dict) else None


class Store:
    """The entries of one cache directory; see the module's docstring for what is checked."""

    def __init__(self, directory):
        self.directory = Path(directory).expanduser()
        if not self.directory.is_dir():   # private: the parents as the user's umask makes them
            self.directory.parent.mkdir(parents=True, exist_ok=True)
            self.directory.mkdir(mode=0o700, exist_ok=True)
        self.path = self.directory / DATABASE
        self.hits = 0
        self.misses = 0
        self._conn: sqlite3.Connection | None = None
        self._pid: int | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Store({str(self.directory)!r})"

    # ---- the connection ----

    def unsafe(self) -> str | None:
        """Why this cache is not to be used (`_unsafe`: its directory, database or journal files), or None."""
        for path in (self.directory, self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm")):
            why = _unsafe(path)
            if why is not None:
                return why
        return None

    def _open(self) -> sqlite3.Connection:
        # The file is made private before SQLite makes it with the umask's mode (its journals take its mode).
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute(_CREATE)
                return conn
            except sqlite3.OperationalError as exc:
                # processes that create the file together race to switch it to WAL; SQLite answers "locked"
                # at once there, without waiting on the busy timeout, so the switch is tried again here
                if getattr(exc, "sqlite_errorname", "").startswith("SQLITE_BUSY") and time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
                conn.close()
                raise
            except sqlite3.Error:
                conn.close()
                raise

    def _move_aside(self) -> None:
        """The file is not a SQLite database: keep it for inspection under another name, start afresh."""
        aside = self.path.with_name(f"{DATABASE}.corrupt-{os.getpid()}")
        try:
            os.replace(self.path, aside)
        except FileNotFoundError:           # another process moved it aside first
            return
        for suffix in ("-wal", "-shm"):     # the old file's journal means nothing to a fresh database
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        warnings.warn(f"superopt: the cache database {self.path} is not a SQLite database (damaged?); moved it to "
                      f"{aside.name} and started a fresh one", CacheWarning, stacklevel=5)

    def _db(self) -> sqlite3.Connection:
        """This process's connection (a forked child opens its own); a damaged file is moved aside."""
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        self._conn = None      # a parent's connection is not used (nor closed) in a child
        try:
            conn = self._open()
        except sqlite3.DatabaseError as exc:
            if getattr(exc, "sqlite_errorname", None) not in _CORRUPT or not self.path.exists():
                raise
            self._move_aside()
            conn = self._open()
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _recover(self, exc: Exception) -> bool:
        """After an error on a page of an open database: move a damaged file aside; whether it was one."""
        if getattr(exc, "sqlite_errorname", None) not in _CORRUPT:
            return False
        if self._conn is not None and self._pid == os.getpid():
            self._conn.close()
        self._conn = None
        try:
            self._move_aside()
        except OSError as err:
            _warn_error("be moved aside", self.path, err)
        return True

    # ---- entries ----

    def get(self, key: str, kind: str) -> dict | None:
        """The value stored under (key, kind), or None: absent, or an entry that does not check out (deleted)."""
        with self._lock:
            try:
                value = self._get(key, kind)
            except (sqlite3.Error, OSError) as exc:
                if not self._recover(exc):
                    _warn_error("be read", self.path, exc)
                value = None
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
        return value

    def _get(self, key: str, kind: str) -> dict | None:
        db = self._db()
        row = db.execute("SELECT schema, payload, checksum FROM entries WHERE key = ? AND kind = ?",
                         (key, kind)).fetchone()
        if row is None:
            return None
        schema, payload, checksum = row
        doc = None
        if schema == SCHEMA and isinstance(payload, bytes) and hashlib.sha256(payload).hexdigest() == checksum:
            doc = _decode(payload)
        if (doc is None or doc.get("key") != key or doc.get("kind") != kind
                or not isinstance(doc.get("value"), dict)):
            db.execute("DELETE FROM entries WHERE key = ? AND checksum = ?", (key, checksum))
            return None
        db.execute("UPDATE entries SET last_used = ?, hits = hits + 1 WHERE key = ?", (time.time(), key))
        return doc["value"]

    def drop(self, key: str, kind: str) -> None:
        """Delete the entry under (key, kind), if any: one found wrong by a check of the caller's."""
        with self._lock:
            try:
                self._db().execute("DELETE FROM entries WHERE key = ? AND kind = ?", (key, kind))
            except (sqlite3.Error, OSError) as exc:
                if not self._recover(exc):
                    _warn_error("be written", self.path, exc)

    def put(self, key: str, kind: str, value: dict) -> str | None:
        """Store `value` (a JSON-serializable dict) under (key, kind), replacing what was there; None, or why
        it was not stored (a SQLite or OS error, warned about once per process)."""
        if not isinstance(value, dict):
            raise TypeError(f"superopt: a cache value must be a dict, got {type(value).__name__} for {kind} {key}")
        payload = _encode(key, kind, value)
        now = time.time()
        row = (key, kind, SCHEMA, payload, hashlib.sha256(payload).hexdigest(), now, now)
        with self._lock:
            try:
                self._db().execute("INSERT OR REPLACE INTO entries (key, kind, schema, payload, checksum, created, "
                                   "last_used, hits) VALUES (?, ?, ?, ?, ?, ?, ?, 0)", row)
            except (sqlite3.Error, OSError) as exc:
                if not self._recover(exc):
                    _warn_error("be written", self.path, exc)
                return str(exc) or type(exc).__name__
        return None

    def stats(self) -> CacheStats:
        """The directory, the database's bytes on disk, entries per kind, and this process's hits and misses."""
        entries: dict[str, int] = {}
        with self._lock:
            try:
                entries = dict(self._db().execute(
                    "SELECT kind, COUNT(*) FROM entries GROUP BY kind ORDER BY kind").fetchall())
            except (sqlite3.Error, OSError) as exc:
                if not self._recover(exc):
                    _warn_error("be read", self.path, exc)
        size = sum(p.stat().st_size for p in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm"))
                   if p.exists())
        return CacheStats(self.directory, size, entries, self.hits, self.misses)

    def clear(self) -> int:
        """Remove every entry; the number removed. The file shrinks when no other process is using it."""
        with self._lock:
            db = self._db()
            removed = db.execute("DELETE FROM entries").rowcount
            try:
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                db.execute("VACUUM")
            except sqlite3.OperationalError:   # another process holds it: the space is reused later instead
                pass
        return removed

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None


def default_directory() -> Path:
    """superopt's cache directory: $SUPEROPT_CACHE_DIR, else $XDG_CACHE_HOME/superopt, else ~/.cache/superopt."""
    return cache_dir()


_stores: dict[str, Store] = {}
_stores_lock = threading.Lock()
_refused: dict[str, str] = {}     # directory -> why it is not used (warned once per directory per process)


def _directory(cache) -> Path | None:
    if cache is None or cache is True:
        if os.environ.get(ENV_SWITCH, "").strip().lower() in OFF_VALUES:
            return None
        return default_directory()
    if cache is False:
        return None
    if isinstance(cache, (str, os.PathLike)):
        return Path(cache)
    raise TypeError(f"superopt: cache= takes True, False, None or a directory (str or path), "
                    f"got {type(cache).__name__} {cache!r}")


def _refuse(name: str, why: str) -> None:
    with _stores_lock:
        first = name not in _refused
        _refused[name] = why
    if first:
        warnings.warn(f"superopt: not using the cache {name}: {why}; running without the cache (warned once)",
                      CacheWarning, stacklevel=4)


def open_store(cache=None) -> Store | None:
    """The store that the option `cache=` names: None or True, the default directory (no store when the
    environment variable SUPEROPT_CACHE is off, 0 or false); False, no store; a path, that directory.
    One Store per directory in a process. None too where the directory cannot be created or is not safe to
    use (`Store.unsafe`, checked on every call): one CacheWarning per directory, and `refused` says why."""
    directory = _directory(cache)
    if directory is None:
        return None
    name = str(directory.expanduser().absolute())
    with _stores_lock:
        store = _stores.get(name)
    if store is None:
        try:
            store = Store(name)
        except OSError as exc:
            _refuse(name, f"it cannot be created ({exc.strerror or exc})")
            return None
    why = store.unsafe()
    if why is not None:
        _refuse(name, why)
        return None
    with _stores_lock:
        _refused.pop(name, None)
        return _stores.setdefault(name, store)


def refused(cache=None) -> str | None:
    """Why `open_store(cache)` gave no store although one was asked for, or None."""
    try:
        directory = _directory(cache)
    except TypeError:
        return None
    return None if directory is None else _refused.get(str(directory.expanduser().absolute()))


# ---- JAX's persistent compilation cache ----

def jax_cache_configured() -> bool:
    """Whether JAX's compilation cache directory is set (by the user, or by `enable_jax_cache`)."""
    return bool(jax.config.jax_compilation_cache_dir or os.environ.get("JAX_COMPILATION_CACHE_DIR"))


_jax_enabled: str | None = None    # the directory enable_jax_cache set in this process


def enable_jax_cache(directory=None) -> bool:
    """The explicit opt-in to JAX's persistent compilation cache: turn it on in <directory>/jax (directory:
    superopt's cache directory by default) unless the user configured one (jax_compilation_cache_dir,
    JAX_COMPILATION_CACHE_DIR); whether it is on there now. It is JAX's setting for the whole process: every
    jax.jit reads its compiled programs from there, so a directory that fails the store's checks (owned by
    another user, writable by group or others) is refused with a CacheWarning. Only where it is turned on is
    jax_persistent_cache_min_compile_time_secs lowered to 0.2 s. Calling it again changes nothing. superopt
    never calls it itself."""
    global _jax_enabled
    base = Path(directory if directory is not None else default_directory()).expanduser().absolute()
    target = base / JAX_SUBDIR
    current = jax.config.jax_compilation_cache_dir
    if current:
        return current == _jax_enabled == str(target)
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return False
    if not target.exists():
        Store(base)                       # the cache directory, private
        target.mkdir(mode=0o700)
        (target / JAX_MARKER).write_text("superopt made this directory for JAX's compilation cache; "
                                         "`superopt cache clear` empties it\n")
    why = _unsafe(base) or _unsafe(target)
    if why is not None:
        warnings.warn(f"superopt: not turning on JAX's compilation cache in {target}: {why}", CacheWarning,
                      stacklevel=2)
        return False
    jax.config.update("jax_compilation_cache_dir", str(target))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", JAX_MIN_COMPILE_TIME_S)
    jax_compilation_cache.reset_cache()   # JAX decides once whether to use its cache; decide again
    _jax_enabled = str(target)
    return True


def jax_cache_files(directory) -> tuple[Path, bool, list[Path]]:
    """(<directory>/jax, whether superopt made it, the files of JAX's cache in it)."""
    target = Path(directory).expanduser() / JAX_SUBDIR
    if not target.is_dir():
        return target, False, []
    files = [p for p in target.rglob("*") if p.is_file() and p.name != JAX_MARKER]
    return target, (target / JAX_MARKER).exists(), files


def clear_jax_cache(directory) -> int | None:
    """Delete JAX's cache files under <directory>/jax when superopt made that directory; how many, or None
    when it did not make it (a directory of the user's is left alone)."""
    _, ours, files = jax_cache_files(directory)
    if not ours:
        return None
    for p in files:
        p.unlink(missing_ok=True)
    return len(files)
