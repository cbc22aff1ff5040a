"""superopt: an equality-saturation superoptimizer for tensor programs.

    fast = superopt(fn, target="cpu")
    y = fast(x, w)
    print(fast.report)
"""
from superopt.api import Optimized, superopt
from superopt.core.verify import VerificationWarning
from superopt.egraph.limits import Limits, StopReason
from superopt.extract.target import available_targets

__all__ = ["superopt", "Optimized", "Limits", "StopReason", "available_targets", "VerificationWarning"]
