import os

from hypothesis import HealthCheck, settings

# Compiling with XLA dominates each example; no per-example deadline, a modest default budget.
settings.register_profile("superopt", deadline=None, max_examples=int(os.environ.get("SUPEROPT_EXAMPLES", "6")),
                          suppress_health_check=[HealthCheck.too_slow], derandomize=True)
settings.load_profile("superopt")
