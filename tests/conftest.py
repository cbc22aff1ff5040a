import atexit
import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings

# Compiling with XLA dominates each example; no per-example deadline, a modest default budget.
settings.register_profile("superopt", deadline=None, max_examples=int(os.environ.get("SUPEROPT_EXAMPLES", "6")),
                          suppress_health_check=[HealthCheck.too_slow], derandomize=True)
settings.load_profile("superopt")

# A developer's `superopt calibrate` must not change what the tests see: calibrations go to a fresh place.
os.environ["SUPEROPT_CACHE_DIR"] = tempfile.mkdtemp(prefix="superopt-test-cache-")
atexit.register(shutil.rmtree, os.environ["SUPEROPT_CACHE_DIR"], ignore_errors=True)   # left behind: one per run


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
