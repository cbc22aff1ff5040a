"""superopt/workers.py: independent jobs in spawned local processes or as Ray tasks, results in order, a
failing job named by its position."""
import os
import sys
import warnings

import jax
import pytest
import ray

from superopt import workers
from superopt.workers import EXECUTORS, ExecutorError, JobError, executor_name, placed, run_all

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


def test_one_job_never_goes_to_ray(monkeypatch):
    """A single job (a model of one distinct segment) runs here: on Ray it would add Ray's start and a
    worker's imports to the same work (80 s against 39 s on the README's model)."""
    def no_ray(fn, items):
        raise AssertionError("one job went to Ray")
    monkeypatch.setattr(workers, "_run_ray", no_ray)
    assert run_all(pid_of, [0], executor="ray") == [os.getpid()]
    assert run_all(pid_of, [], executor="ray") == []


def test_where_jobs_run_in_words():
    """What a report says (report.segments: "2 optimized on local workers")."""
    assert placed(square, 3, "ray") == "on ray (3 jobs)"
    assert placed(square, 1, "ray") == placed(square, 2, "local", workers=1) == "in this process"
    assert placed(square, 2, "local") == "on local workers"


@pytest.fixture
def no_ray_running(monkeypatch):
    """Ray as if nothing were started, with a cluster's address: what ray.init is called with is recorded."""
    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append((kwargs, os.environ.get("RAY_AUTH_MODE"))))
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setenv("RAY_AUTH_MODE", "")   # recorded, so that the value superopt may set is removed after
    monkeypatch.delenv("RAY_AUTH_MODE")
    return calls


def test_an_unreachable_cluster_is_one_line_naming_the_token_setting(no_ray_running, monkeypatch):
    """Ray 2.60's cluster from `ray start --head` refuses a client without a token (20 lines of
    InvalidAuthToken, then ConnectionError): one line saying what to set."""
    def refused(**kwargs):
        raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")
    monkeypatch.setattr(ray, "init", refused)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    with pytest.raises(ExecutorError) as info:
        run_all(square, [1, 2], executor="ray")
    message = str(info.value)
    assert "\n" not in message and "RAY_ADDRESS=10.0.0.1:6379" in message and "RAY_AUTH_MODE=token" in message


class _Loader:
    def __init__(self, has: bool):
        self.has = has

    def instance(self):
        return self

    def has_token(self, ignore_auth_mode: bool) -> bool:
        return self.has


@pytest.mark.parametrize("has_token", [True, False])
def test_a_token_on_this_machine_is_sent_to_the_cluster(no_ray_running, monkeypatch, has_token):
    """Where $RAY_AUTH_MODE is unset and this machine has a token, the client sends it, as `ray start --head`
    requires it in that case; without a token nothing is set."""
    monkeypatch.setattr(ray._raylet, "AuthenticationTokenLoader", _Loader(has_token))
    reread = []
    monkeypatch.setattr(ray._raylet, "Config", type("Config", (), {"initialize": staticmethod(reread.append)}))
    workers._start_ray(ray)
    assert no_ray_running == [(dict(address="10.0.0.1:6379", log_to_driver=False, include_dashboard=False,
                                    configure_logging=False), "token" if has_token else None)]
    assert reread == ([""] if has_token else [])


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the module (starting one takes seconds), started by run_all itself: no
    instance is running and RAY_ADDRESS is unset, so executor="ray" starts one here."""
    if ray.is_initialized():
        ray.shutdown()
    address = os.environ.pop("RAY_ADDRESS", None)
    # Ray's workers do not have tests/ on their path: this module's functions travel by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    jax.devices()   # JAX is loaded: its at-fork hook would warn as Ray starts its processes
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert run_all(square, [2, 3], executor="ray") == [4, 9]
        assert ray.is_initialized()
        assert not [w for w in seen if "os.fork()" in str(w.message)], [str(w.message) for w in seen]
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
