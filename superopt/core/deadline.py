"""One clock for a whole `superopt` call: `Limits.seconds` bounds capture, encoding, saturation,
extraction, lowering and verification together, not saturation alone.

A `Deadline` starts when optimization of a specialization starts. Each stage asks it how much time is
left (`left()`), and stages that loop check it as they go (`check(stage)`), raising `TimeLimit` with
the stage's name once it has passed; the pipeline then returns the original program, which is always
correct, and says which stage ran out of time. A stage that cannot be interrupted from Python (tracing
the function, one egglog call, XLA compiling a program) is bounded by what is checked around it.

Stages get their deadline as an argument (`encode`, `saturate_isolated`) or, where the call passes
through code that does not take one (extraction behind `superopt.api._extract`), as the current
deadline of the call (`bind`, `current`): code called outside a call sees one that never expires.
"""
from __future__ import annotations

import contextvars
import functools
import math
import time

_CURRENT: contextvars.ContextVar = contextvars.ContextVar("superopt_deadline", default=None)


class TimeLimit(Exception):
    """The call's deadline passed during `stage`."""

    def __init__(self, stage: str, seconds: float = math.nan):
        self.stage, self.seconds = stage, seconds
        limit = "" if math.isnan(seconds) else f" of {seconds:g} s"
        super().__init__(f"the time limit{limit} passed during {stage}")


class Deadline:
    """`seconds` from now (or from `start`, a `time.perf_counter()` reading); `None` never expires."""

    def __init__(self, seconds: float | None, start: float | None = None):
        self.start = time.perf_counter() if start is None else start
        self.seconds = math.inf if seconds is None else float(seconds)
        self.at = self.start + self.seconds

    @classmethod
    def never(cls) -> "Deadline":
        return cls(None)

    def left(self) -> float:
        """Seconds left, 0 once the deadline has passed."""
        return max(0.0, self.at - time.perf_counter())

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def expired(self) -> bool:
        return time.perf_counter() >= self.at

    def check(self, stage: str) -> None:
        """Raise `TimeLimit(stage)` if the deadline has passed."""
        if time.perf_counter() >= self.at:
            raise TimeLimit(stage, self.seconds)

    def share(self, fraction: float) -> float:
        """`fraction` of the time left (seconds), for a stage that must leave the rest to later ones."""
        return self.left() * fraction

    def bind(self, fn):
        """`fn`, running with this deadline as the current one (`current()`)."""
        @functools.wraps(fn)
        def bound(*args, **kwargs):
            token = _CURRENT.set(self)
            try:
                return fn(*args, **kwargs)
            finally:
                _CURRENT.reset(token)
        return bound

    def __repr__(self) -> str:
        return f"Deadline({self.seconds:g} s, {self.left():.3g} s left)"


def current() -> Deadline:
    """The deadline of the call in progress (`Deadline.bind`), or one that never expires."""
    deadline = _CURRENT.get()
    return Deadline.never() if deadline is None else deadline
