"""A pure-Python computation in a forked child, beside the caller's own: the machine's other core.

The NPU emulator is Python over numpy, one core's work: lowering a d=4096 decoder layer and running it
on two input sets takes tens of seconds. `Forked(fn, *args)` starts `fn(*args)` in a child forked from
this process (it sees the caller's objects as they are at the fork, copy-on-write) and `result()` waits
for its value, pickled back through a pipe, or raises what it raised. The child must not use JAX (JAX's
threads do not survive a fork): the emulator and the code generator do not. Where `os.fork` is missing
(or `SUPEROPT_FORK=0`), `fn` runs in `result()` itself, in this process: the same result, one after the other.

numpy's BLAS runs one thread in the child, and should in the parent while the child runs
(`one_blas_thread`): two processes each spinning two BLAS threads on two cores slowed the emulator
thirteenfold (119 s against 8.8 s for a d=4096 layer).
"""
from __future__ import annotations

import contextlib
import gc
import os
import pickle
import select
import signal
import struct
import time
import warnings

_HEADER = struct.Struct("<Q")


def enabled() -> bool:
    return hasattr(os, "fork") and os.environ.get("SUPEROPT_FORK", "1") != "0"


@contextlib.contextmanager
def one_blas_thread():
    """numpy's BLAS limited to one thread in this process (module doc), while a `Forked` child runs."""
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def fork() -> int:
    """`os.fork()`, where the child never collects the garbage it inherits. An egglog e-graph that the parent
    no longer reaches, but has not collected yet, waits on egglog's worker threads when it is dropped, and a
    forked child has none of the parent's threads: a collection in the child that reached one hung it for
    good (an NPU emulation child in the test suite). So collection is held off across the fork, and the child
    freezes what it inherited (`gc.freeze`: never collected there) before it collects again."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # JAX warns that fork and threads do not mix: the child runs no JAX
            pid = os.fork()
    except BaseException:
        if collecting:
            gc.enable()
        raise
    if pid == 0:
        gc.freeze()
    if collecting:
        gc.enable()
    return pid


class ForkedError(RuntimeError):
    """The child failed in a way that could not be sent back as its own exception."""


class Forked:
    """`fn(*args)` computed in a forked child (module doc); `result()` once, or `cancel()`."""

    def __init__(self, fn, *args):
        self._fn, self._args, self._pid, self._fd = fn, args, None, None
        if not enabled():
            return
        read_fd, write_fd = os.pipe()
        pid = fork()
        if pid == 0:  # pragma: no cover - the child; coverage is not collected there
            os.close(read_fd)
            _child(fn, args, write_fd)
        os.close(write_fd)
        self._pid, self._fd = pid, read_fd

    def result(self):
        """fn's value; or what fn raised, raised here."""
        if self._pid is None:
            return self._fn(*self._args)
        try:
            header = read_exactly(self._fd, _HEADER.size)
            body = read_exactly(self._fd, _HEADER.unpack(header)[0]) if header else None
        finally:
            self._close()
        if body is None:
            raise ForkedError("the child process computing it exited without a result")
        kind, value = pickle.loads(body)
        if kind == "raise":
            raise value
        return value

    def cancel(self) -> None:
        if self._pid is not None:
            os.kill(self._pid, signal.SIGKILL)
            self._close()

    def _close(self) -> None:
        os.close(self._fd)
        os.waitpid(self._pid, 0)
        self._pid = None


def _child(fn, args, fd: int) -> None:  # pragma: no cover - runs in the child
    """Compute, send (value or exception), and exit without the parent's exit handlers."""
    try:
        try:
            from threadpoolctl import threadpool_limits
            threadpool_limits(limits=1, user_api="blas")
            message = ("value", fn(*args))
        except BaseException as exc:  # noqa: BLE001 -- sent back and raised in the parent
            message = ("raise", exc)
        try:
            payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
            pickle.loads(payload)             # an exception whose constructor takes other arguments does not
        except Exception as exc:  # noqa: BLE001 -- an exception or value that does not pickle
            text = f"{type(message[1]).__name__}: {message[1]}" if message[0] == "raise" else repr(exc)
            payload = pickle.dumps(("raise", ForkedError(text)), protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(_HEADER.pack(len(payload)) + payload)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os._exit(0)   # not sys.exit: the parent's exit handlers and unflushed output are its own


def read_exactly(fd: int, n: int, deadline: float | None = None) -> bytes | None:
    """n bytes from the pipe `fd`; None where it closes first or (with `deadline`, a `time.perf_counter`
    value) where they have not come by then."""
    chunks, left = [], n
    while left:
        if deadline is not None:
            wait = deadline - time.perf_counter()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                return None
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
