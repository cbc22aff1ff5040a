import os
import tempfile

import pytest
from hypothesis import HealthCheck, settings

# Compiling with XLA dominates each example; no per-example deadline, a modest default budget.
settings.register_profile("superopt", deadline=None, max_examples=int(os.environ.get("SUPEROPT_EXAMPLES", "6")),
                          suppress_health_check=[HealthCheck.too_slow], derandomize=True)
settings.load_profile("superopt")

# A developer's `superopt calibrate` must not change what the tests see: calibrations go to a fresh place.
os.environ["SUPEROPT_CACHE_DIR"] = tempfile.mkdtemp(prefix="superopt-test-cache-")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    """Each test starts from an empty persistent cache of its own: a result one test stores is never what
    another test sees (tests of the cache pass `cache=` a directory of their own)."""
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path_factory.mktemp("superopt-cache")))
