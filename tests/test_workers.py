"""superopt/workers.py: independent jobs in spawned local processes or as Ray tasks, results in order, a
failing job named by its position."""
import os
import sys

import pytest
import ray

from superopt.workers import EXECUTORS, JobError, executor_name, run_all

pytestmark = pytest.mark.slow   # whole models, worker processes or long searches: make test, not test-fast


def square(x):
    return x * x


def pid_of(_):
    return os.getpid()


def fails_on_two(x):
    if x == 2:
        raise ValueError(f"two is not allowed (got {x})")
    return x


def test_executor_name(monkeypatch):
    monkeypatch.delenv("SUPEROPT_EXECUTOR", raising=False)
    assert executor_name(None) == "local" and executor_name("ray") == "ray"
    monkeypatch.setenv("SUPEROPT_EXECUTOR", "ray")
    assert executor_name(None) == "ray" and executor_name("local") == "local"
    with pytest.raises(ValueError, match=r"unknown executor 'dask' \(executor=\); known: local, ray"):
        executor_name("dask")
    monkeypatch.setenv("SUPEROPT_EXECUTOR", "threads")
    with pytest.raises(ValueError, match=r"unknown executor 'threads' \(\$SUPEROPT_EXECUTOR\); known: local, ray"):
        executor_name(None)
    assert EXECUTORS == ("local", "ray")


def test_one_item_runs_here():
    assert run_all(square, [7], executor="local") == [49]
    assert run_all(pid_of, [0], executor="local") == [os.getpid()]
    assert run_all(square, [], executor="local") == []
    assert run_all(pid_of, [0, 1], executor="local", workers=1) == [os.getpid()] * 2


def test_local_pool_keeps_the_order():
    assert run_all(square, [3, 1, 2], executor="local", workers=3) == [9, 1, 4]


def test_local_pool_runs_in_other_processes():
    pids = run_all(pid_of, [0, 1, 2], executor="local", workers=2)
    assert os.getpid() not in pids


@pytest.mark.parametrize("workers", [1, 3])
def test_a_failing_job_is_named(workers):
    with pytest.raises(JobError, match=r"job 2 of 3 \(2\) failed: ValueError: two is not allowed") as info:
        run_all(fails_on_two, [0, 1, 2], executor="local", workers=workers)
    assert info.value.index == 2 and info.value.item == 2


def test_bad_workers():
    with pytest.raises(ValueError, match="workers= must be at least 1, got 0"):
        run_all(square, [1, 2], workers=0)


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the module (starting one takes seconds), started by run_all itself: no
    instance is running and RAY_ADDRESS is unset, so executor="ray" starts one here."""
    if ray.is_initialized():
        ray.shutdown()
    address = os.environ.pop("RAY_ADDRESS", None)
    # Ray's workers do not have tests/ on their path: this module's functions travel by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        assert run_all(square, [2, 3], executor="ray") == [4, 9]
        assert ray.is_initialized()
        yield
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        if address is not None:
            os.environ["RAY_ADDRESS"] = address


@pytest.mark.ray
def test_ray_matches_local(local_ray):
    items = [5, 3, 8, 1]
    assert run_all(square, items, executor="ray") == run_all(square, items, executor="local") == [25, 9, 64, 1]


@pytest.mark.ray
def test_ray_from_the_environment(local_ray, monkeypatch):
    monkeypatch.setenv("SUPEROPT_EXECUTOR", "ray")
    assert os.getpid() not in run_all(pid_of, [0, 1])


@pytest.mark.ray
def test_ray_failing_job_is_named(local_ray):
    with pytest.raises(JobError, match=r"job 2 of 3 \(2\) failed: ValueError: two is not allowed") as info:
        run_all(fails_on_two, [0, 1, 2], executor="ray")
    assert info.value.index == 2
