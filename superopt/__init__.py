"""superopt: an equality-saturation superoptimizer for tensor programs.

    fast = superopt(fn, target="cpu")
    y = fast(x, w)
    print(fast.report)
"""
from superopt.api import Optimized, superopt
from superopt.egraph.runner import Limits, StopReason
from superopt.extract.target import available_targets
from superopt.core.verify import VerificationWarning

__all__ = ["superopt", "Optimized", "Limits", "StopReason", "available_targets", "VerificationWarning"]
