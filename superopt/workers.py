"""Run independent jobs (segments of a program, rules to check) in parallel worker processes.

Saturation and extraction are single-threaded Python and Rust, so independent jobs go faster in separate
processes: on this machine ("local", a process pool) or on a Ray cluster ("ray", one task per job, on
the cluster at $RAY_ADDRESS or on a Ray instance started here). `run_all(fn, items)` is `[fn(item) for
item in items]`, in order, with `fn` a picklable top-level function.

Local workers are spawned, never forked: JAX starts threads when it loads, and forking a process that has
them can deadlock the child. A spawned worker imports superopt again (seconds), so one job, or
`workers=1`, runs in this process. Ray is an optional dependency (`pip install 'superopt[ray]'`) imported
only when asked for; its own scheduler places the tasks.
"""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

EXECUTORS = ("local", "ray")
ENV_EXECUTOR = "SUPEROPT_EXECUTOR"


class JobError(RuntimeError):
    """A job raised: names its position among the items; the job's exception is the `__cause__`."""

    def __init__(self, message: str, index: int, item):
        super().__init__(message)
        self.index = index
        self.item = item


def executor_name(executor: str | None) -> str:
    """The executor to use: `executor`, else $SUPEROPT_EXECUTOR, else "local"."""
    name = executor if executor is not None else (os.environ.get(ENV_EXECUTOR) or "local")
    if name not in EXECUTORS:
        source = "executor=" if executor is not None else f"${ENV_EXECUTOR}"
        raise ValueError(f"superopt: unknown executor {name!r} ({source}); known: {', '.join(EXECUTORS)}")
    return name


def _failed(index: int, total: int, item, exc: BaseException) -> JobError:
    shown = repr(item)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return JobError(f"superopt: job {index} of {total} ({shown}) failed: {type(exc).__name__}: {exc}", index, item)


def run_all(fn, items: list, executor: str | None = None, workers: int | None = None) -> list:
    """[fn(item) for item in items], in order, the jobs run in parallel on `executor` ("local" or "ray";
    None: $SUPEROPT_EXECUTOR, else local) with at most `workers` processes (default: one per core)."""
    name = executor_name(executor)
    items = list(items)
    if workers is not None and workers < 1:
        raise ValueError(f"superopt: workers= must be at least 1, got {workers}")
    if name == "ray":
        return _run_ray(fn, items)
    if len(items) <= 1 or workers == 1:
        return _run_here(fn, items)
    return _run_pool(fn, items, min(workers or os.cpu_count() or 1, len(items)))


def _run_here(fn, items: list) -> list:
    results = []
    for i, item in enumerate(items):
        try:
            results.append(fn(item))
        except Exception as exc:
            raise _failed(i, len(items), item, exc) from exc
    return results


def _run_pool(fn, items: list, workers: int) -> list:
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = [pool.submit(fn, item) for item in items]
        results = []
        for i, future in enumerate(futures):
            try:
                results.append(future.result())
            except BrokenProcessPool as exc:
                pool.shutdown(wait=False, cancel_futures=True)
                raise JobError(f"superopt: a worker process died running job {i} of {len(items)} (out of memory, "
                               f"or a function it cannot import: fn must be a top-level function of an "
                               f"importable module); run with workers=1", i, items[i]) from exc
            except Exception as exc:
                pool.shutdown(wait=False, cancel_futures=True)
                raise _failed(i, len(items), items[i], exc) from exc
        return results


def _run_ray(fn, items: list) -> list:
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
    for i, ref in enumerate(refs):
        try:
            results.append(ray.get(ref))
        except Exception as exc:
            for rest in refs[i + 1:]:
                ray.cancel(rest)
            cause = getattr(exc, "cause", None) or exc   # a RayTaskError carries the job's own exception
            raise _failed(i, len(items), items[i], cause) from exc
    return results
