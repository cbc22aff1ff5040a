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

One job runs in this process whatever the executor: a worker would only add its start (a Ray task: seconds to
start Ray or connect to it, then a worker importing superopt) to the same work. `placement` says where
`run_all` runs a list of jobs, and `placed` says it in words for a report.

A job that raises, a worker that dies (killed, out of memory) and a job that outruns `timeout` are failures
of that job alone: with `failures="raise"` (the default) `run_all` raises `JobError` naming it; with
`failures="keep"` its result is a `Failed` holding the reason, and the other jobs' results stand (the
pipeline runs such a segment as captured and says why in the report). Ray is an optional dependency (`pip
install 'superopt[ray]'`) imported only when asked for; its own scheduler places the tasks. Where Ray cannot
be started or reached, `run_all` raises `ExecutorError`, one line saying what to do.
"""
from __future__ import annotations

import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import warnings
from dataclasses import dataclass

EXECUTORS = ("local", "ray")
ENV_EXECUTOR = "SUPEROPT_EXECUTOR"


class JobError(RuntimeError):
    """A job raised: names its position among the items; the job's exception is the `__cause__`."""

    def __init__(self, message: str, index: int, item):
        super().__init__(message)
        self.index = index
        self.item = item


class ExecutorError(RuntimeError):
    """The executor could not run the jobs at all (Ray missing, its cluster unreachable): one line saying why."""


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


def placement(fn, jobs: int, executor: str | None = None, workers: int | None = None) -> str:
    """Where `run_all(fn, items, executor, workers)` runs `jobs` items: "ray", "local" (worker processes on
    this machine) or "here" (this process: one job, one worker, or on local workers a function of the
    caller's `__main__`, which a worker cannot import)."""
    name = executor_name(executor)
    if jobs <= 1 or (name == "local" and (workers == 1 or getattr(fn, "__module__", None) == "__main__")):
        return "here"
    return name


PLACED = {"ray": "on ray ({jobs} jobs)", "local": "on local workers", "here": "in this process"}


def placed(fn, jobs: int, executor: str | None = None, workers: int | None = None) -> str:
    """`placement` in words, as a report says where its jobs ran: "on ray (3 jobs)", "on local workers", "in
    this process"."""
    return PLACED[placement(fn, jobs, executor, workers)].format(jobs=jobs)


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
    items = list(items)
    if workers is not None and workers < 1:
        raise ValueError(f"superopt: workers= must be at least 1, got {workers}")
    if failures not in ("raise", "keep"):
        raise ValueError(f"superopt: failures= is 'raise' or 'keep', got {failures!r}")
    where = placement(fn, len(items), executor, workers)
    if where == "ray":
        results = _run_ray(fn, items)
    elif where == "here":
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
        raise ExecutorError("superopt: executor='ray' needs Ray: pip install 'superopt[ray]'") from None
    if not ray.is_initialized():
        _start_ray(ray)
    task = ray.remote(num_cpus=1)(fn)
    refs = [task.remote(item) for item in items]
    results = []
    for ref in refs:
        try:
            results.append((ray.get(ref), None))
        except Exception as exc:   # a RayTaskError carries the job's own exception; a lost worker, its words
            results.append((None, getattr(exc, "cause", None) or exc))
    return results


AUTH_MODE = "RAY_AUTH_MODE"


def _start_ray(ray) -> None:
    """Connect to the cluster at $RAY_ADDRESS, else start a Ray instance here."""
    address = os.environ.get("RAY_ADDRESS")
    if address:
        _token_if_available(ray)
    with warnings.catch_warnings():
        # Ray starts its own processes (GCS, raylet) through subprocess with a preexec_fn, so Python runs
        # the at-fork hooks, and JAX's warns that forking a process with JAX's threads can deadlock. The
        # child only sets its parent-death signal and execs Ray's binaries: no JAX runs in it.
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        try:
            ray.init(address=address, log_to_driver=False, include_dashboard=False, configure_logging=False)
        except ConnectionError as exc:
            raise ExecutorError(
                f"superopt: cannot connect to the Ray cluster at RAY_ADDRESS={address} ({exc}): is it running? "
                f"One started by `ray start --head` may require a token: set {AUTH_MODE}=token, with the head's "
                f"token in ~/.ray/auth_token or RAY_AUTH_TOKEN") from None


def _token_if_available(ray) -> None:
    """Send a token to the cluster where one is on this machine and $RAY_AUTH_MODE is unset. Ray's `ray start
    --head` turns token authentication on in that case (Ray 2.60: a local `ray.init` writes the token,
    ~/.ray/auth_token), but `ray.init(address=...)` does not, and fails after 20 s of InvalidAuthToken lines.
    A client that sends a token connects to a cluster without authentication all the same."""
    if AUTH_MODE in os.environ:
        return
    raylet = getattr(ray, "_raylet", None)
    loader, config = getattr(raylet, "AuthenticationTokenLoader", None), getattr(raylet, "Config", None)
    if loader is None or config is None:   # a Ray without token authentication
        return
    if loader.instance().has_token(ignore_auth_mode=True):
        os.environ[AUTH_MODE] = "token"
        config.initialize("")   # Ray reads its configuration from the environment once; read it again
