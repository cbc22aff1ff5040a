"""Run independent jobs (segments of a program, rules to check) in parallel worker processes.

Saturation and extraction are single-threaded Python and Rust, so independent jobs go faster in separate
processes: on this machine ("local", worker processes) or on a Ray cluster ("ray", one task per job, on
the cluster at $RAY_ADDRESS or on a Ray instance started here). `run_all(fn, items)` is `[fn(item) for
item in items]`, in order, with `fn` a picklable top-level function.

Local workers are fresh interpreters that import superopt and nothing of the caller's: `python -c` with
`serve`, jobs and results pickled over their standard input and output. They are never forked (JAX starts
threads when it loads, and forking a process that has them can deadlock the child) and never started
through multiprocessing, whose spawned children run the caller's `__main__` again: a user's script without
an `if __name__ == "__main__":` guard would run once more in every worker. A function of the caller's
`__main__` cannot be imported by a worker, so its jobs run in this process, as one job does.

A job that raises, a worker that dies (killed, out of memory) and a job that outruns `timeout` are failures
of that job alone: with `failures="raise"` (the default) `run_all` raises `JobError` naming it; with
`failures="keep"` its result is a `Failed` holding the reason, and the other jobs' results stand (the
pipeline runs such a segment as captured and says why in the report). Ray is an optional dependency (`pip
install 'superopt[ray]'`) imported only when asked for; its own scheduler places the tasks.
"""
from __future__ import annotations

import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass

EXECUTORS = ("local", "ray")
ENV_EXECUTOR = "SUPEROPT_EXECUTOR"


class JobError(RuntimeError):
    """A job raised: names its position among the items; the job's exception is the `__cause__`."""

    def __init__(self, message: str, index: int, item):
        super().__init__(message)
        self.index = index
        self.item = item


@dataclass(frozen=True)
class Failed:
    """The result of a job that did not finish, under `failures="keep"`: why, in words."""
    reason: str


def executor_name(executor: str | None) -> str:
    """The executor to use: `executor`, else $SUPEROPT_EXECUTOR, else "local"."""
    name = executor if executor is not None else (os.environ.get(ENV_EXECUTOR) or "local")
    if name not in EXECUTORS:
        source = "executor=" if executor is not None else f"${ENV_EXECUTOR}"
        raise ValueError(f"superopt: unknown executor {name!r} ({source}); known: {', '.join(EXECUTORS)}")
    return name


def _failed(index: int, total: int, item, what: str) -> JobError:
    shown = repr(item)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return JobError(f"superopt: job {index} of {total} ({shown}) failed: {what}", index, item)


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def run_all(fn, items: list, executor: str | None = None, workers: int | None = None, *,
            failures: str = "raise", timeout: float | None = None) -> list:
    """[fn(item) for item in items], in order, the jobs run in parallel on `executor` ("local" or "ray";
    None: $SUPEROPT_EXECUTOR, else local) with at most `workers` processes (default: one per core).
    `failures="keep"` puts a `Failed` where a job failed instead of raising; `timeout` (seconds) bounds
    each job in a worker process (the worker is killed past it)."""
    name = executor_name(executor)
    items = list(items)
    if workers is not None and workers < 1:
        raise ValueError(f"superopt: workers= must be at least 1, got {workers}")
    if failures not in ("raise", "keep"):
        raise ValueError(f"superopt: failures= is 'raise' or 'keep', got {failures!r}")
    if name == "ray":
        results = _run_ray(fn, items)
    elif len(items) <= 1 or workers == 1 or getattr(fn, "__module__", None) == "__main__":
        results = _run_here(fn, items)
    else:
        results = _run_pool(fn, items, min(workers or os.cpu_count() or 1, len(items)), timeout)
    if failures == "raise":
        for i, (result, exc) in enumerate(results):
            if exc is not None:
                raise _failed(i, len(items), items[i], exc if isinstance(exc, str) else _said(exc)) from (
                    exc if isinstance(exc, BaseException) else None)
    return [Failed(exc if isinstance(exc, str) else _said(exc)) if exc is not None else result
            for result, exc in results]


def _run_here(fn, items: list) -> list:
    """[(result, None) or (None, exception)] for each item, run in this process."""
    results = []
    for item in items:
        try:
            results.append((fn(item), None))
        except Exception as exc:
            results.append((None, exc))
    return results


# ---- local worker processes ----

_SERVE = "from superopt.workers import serve; serve()"


def serve() -> None:
    """A worker's loop: read (fn, item) pickles from standard input until it closes, answer each with
    ("started", None) once it is loaded, then ("ok", result) or ("raised", exception or its words). Whatever the jobs print goes to standard error,
    so standard output carries the answers alone."""
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    requests = sys.stdin.buffer
    while True:
        try:
            fn, item = pickle.load(requests)   # imports fn's module: the job's clock starts after this
        except EOFError:
            return
        answers.write(pickle.dumps(("started", None)))
        answers.flush()
        try:
            answer = ("ok", fn(item))
        except Exception as exc:
            answer = ("raised", exc)
        try:
            data = pickle.dumps(answer)
        except Exception:   # an exception (or a result) that does not pickle is sent as words
            data = pickle.dumps(("raised", _said(answer[1]) if answer[0] == "raised" else
                                 f"the result does not pickle: {type(answer[1]).__name__}"))
        answers.write(data)
        answers.flush()


def _worker_env() -> dict:
    """The caller's environment, with its module search path: a worker imports what this process can."""
    env = dict(os.environ)
    path = [os.path.abspath(p) for p in sys.path if p] + [os.path.abspath(os.curdir)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
    return env


def _death(proc: subprocess.Popen) -> str:
    code = proc.wait()
    if code < 0:
        try:
            return f"the worker process was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"the worker process was killed by signal {-code}"
    return f"the worker process exited with status {code}"


def _run_pool(fn, items: list, workers: int, timeout: float | None) -> list:
    """Jobs shared among `workers` worker processes; a worker that dies or times out fails its job and is
    replaced for the next one."""
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for i in range(len(items)):
        todo.put(i)
    results: list = [(None, "not run")] * len(items)
    env = _worker_env()

    def slot() -> None:
        proc = None
        try:
            while True:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                if proc is None:
                    proc = subprocess.Popen([sys.executable, "-c", _SERVE], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, env=env)
                timer = threading.Timer(timeout, proc.kill) if timeout else None
                try:
                    pickle.dump((fn, items[i]), proc.stdin)
                    proc.stdin.flush()
                    pickle.load(proc.stdout)   # "started": the worker has loaded the job
                    if timer:
                        timer.start()
                    kind, value = pickle.load(proc.stdout)
                except (EOFError, OSError, pickle.UnpicklingError):
                    timed_out = timer is not None and timer.finished.is_set()
                    why = _death(proc)
                    results[i] = (None, f"timed out after {timeout:g} s" if timed_out else why)
                    proc = None
                    continue
                finally:
                    if timer:
                        timer.cancel()
                results[i] = (value, None) if kind == "ok" else (None, value)
        finally:
            if proc is not None:
                proc.stdin.close()
                proc.wait()

    threads = [threading.Thread(target=slot, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _run_ray(fn, items: list) -> list:
    """[(result, None) or (None, exception)] for each item, as Ray tasks."""
    try:
        import ray   # optional and heavy: only for executor="ray"
    except ImportError:
        raise ImportError("superopt: executor='ray' needs Ray: pip install 'superopt[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=False, include_dashboard=False,
                 configure_logging=False)
    task = ray.remote(num_cpus=1)(fn)
    refs = [task.remote(item) for item in items]
    results = []
    for ref in refs:
        try:
            results.append((ray.get(ref), None))
        except Exception as exc:   # a RayTaskError carries the job's own exception; a lost worker, its words
            results.append((None, getattr(exc, "cause", None) or exc))
    return results
