import atexit
import os
import shutil
import tempfile

import jax
import pytest
from hypothesis import HealthCheck, settings

# Compiling with XLA dominates each example; no per-example deadline, a modest default budget.
settings.register_profile("superopt", deadline=None, max_examples=int(os.environ.get("SUPEROPT_EXAMPLES", "6")),
                          suppress_health_check=[HealthCheck.too_slow], derandomize=True)
settings.load_profile("superopt")

# A developer's `superopt calibrate` must not change what the tests see: calibrations go to a fresh place.
os.environ["SUPEROPT_CACHE_DIR"] = tempfile.mkdtemp(prefix="superopt-test-cache-")
atexit.register(shutil.rmtree, os.environ["SUPEROPT_CACHE_DIR"], ignore_errors=True)   # left behind: one per run

# XLA compiles the same small programs in many tests (a test's function, jax.jit's program of it, superopt's
# candidates); a run shares one persistent compilation cache between its tests and workers (a fresh one per
# run, so a run never reads a previous run's executables), which cuts about a tenth of the suite's time.
# Tests of superopt's own opt-in (superopt/cache.py: enable_jax_cache) set the configuration they need.
if "SUPEROPT_TEST_XLA_CACHE" not in os.environ:   # the first process of the run (workers inherit it)
    os.environ["SUPEROPT_TEST_XLA_CACHE"] = tempfile.mkdtemp(prefix="superopt-test-xla-")
    atexit.register(shutil.rmtree, os.environ["SUPEROPT_TEST_XLA_CACHE"], ignore_errors=True)
jax.config.update("jax_compilation_cache_dir", os.environ["SUPEROPT_TEST_XLA_CACHE"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    """Each test starts from an empty persistent cache of its own: a result one test stores is never what
    another test sees (tests of the cache pass `cache=` a directory of their own)."""
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path_factory.mktemp("superopt-cache")))


# SUPEROPT_TEST_TIMES=FILE appends each test's seconds (setup, call and teardown) to FILE as it finishes, one
# "seconds<TAB>node id" line per test, from every worker: what decides which tests are marked slow.
_TIMES = os.environ.get("SUPEROPT_TEST_TIMES")


def pytest_runtest_logreport(report):
    if _TIMES and report.when == "teardown":
        spent = sum(getattr(report, "_spent", {}).values())
        with open(_TIMES, "a", encoding="utf-8") as f:
            f.write(f"{spent:.2f}\t{report.nodeid}\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if _TIMES:
        spent = item.__dict__.setdefault("_superopt_spent", {})
        spent[call.when] = call.duration
        outcome.get_result()._spent = dict(spent)
