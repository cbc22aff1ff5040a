import os
import tempfile

from hypothesis import HealthCheck, settings

# Compiling with XLA dominates each example; no per-example deadline, a modest default budget.
settings.register_profile("superopt", deadline=None, max_examples=int(os.environ.get("SUPEROPT_EXAMPLES", "6")),
                          suppress_health_check=[HealthCheck.too_slow], derandomize=True)
settings.load_profile("superopt")

# A developer's `superopt calibrate` must not change what the tests see: calibrations go to a fresh place.
os.environ["SUPEROPT_CACHE_DIR"] = tempfile.mkdtemp(prefix="superopt-test-cache-")
