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

Two clocks. A whole call is bounded in wall-clock seconds. A segment's search (its saturation and the
optional work of its extraction) is bounded in CPU seconds (`Deadline.cpu`: this process's and its
finished children's; the saturating child counts its own), so that a loaded machine does not change the
program a segment gets, with the call's wall-clock deadline behind it (`also`). The search's deadline is
bound beside the call's (`bind(fn, search=...)`, `current_search`): extraction's optional work stops at
it, the choice itself only at the call's, so that a search cut short still yields the best program it found.

Every time limit is a backstop. What decides the program is counted in deterministic units (saturation's
iterations, rows and work, kernel growth's body nodes, sharing trials' e-nodes: `Limits`), so the same
program and options give the same program on an idle and on a busy machine; a time limit fires only where
the machine is several times slower than the defaults were sized on, and the report names it. `slowed(k)`
makes every clock here (and saturation's, `egraph/runner.py`) run k times as fast, as on a machine k times
slower: tests use it to check that a busy machine gets the same program.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import os
import time

_CURRENT: contextvars.ContextVar = contextvars.ContextVar("superopt_deadline", default=None)
_SEARCH: contextvars.ContextVar = contextvars.ContextVar("superopt_search_deadline", default=None)
_SLOWDOWN = 1.0   # `slowed`: how many times as fast the clocks of time limits run


def wall_seconds() -> float:
    """Wall-clock seconds (`time.perf_counter`), as time limits count them (`slowed`)."""
    return time.perf_counter() * _SLOWDOWN


def process_seconds() -> float:
    """This process's CPU seconds (`time.process_time`), as time limits count them (`slowed`)."""
    return time.process_time() * _SLOWDOWN


def cpu_seconds() -> float:
    """CPU seconds (user and system) of this process and of its children that have been waited for."""
    t = os.times()
    return (t.user + t.system + t.children_user + t.children_system) * _SLOWDOWN


@contextlib.contextmanager
def slowed(factor: float):
    """Within it, time limits see `factor` times the time that passes (wall-clock and CPU), as on a machine
    `factor` times slower or as busy: a deterministic stand-in for load in tests. Child processes forked
    within it (saturation's) inherit it. Deadlines made before it must not be used within it."""
    global _SLOWDOWN
    before, _SLOWDOWN = _SLOWDOWN, float(factor)
    try:
        yield
    finally:
        _SLOWDOWN = before


class TimeLimit(Exception):
    """The call's deadline (or, with `cpu`, a segment search's CPU-time budget) passed during `stage`."""

    def __init__(self, stage: str, seconds: float = math.nan, cpu: bool = False):
        self.stage, self.seconds, self.cpu = stage, seconds, cpu
        limit = "" if math.isnan(seconds) else f" of {seconds:g} s"
        super().__init__(f"the {'CPU-' if cpu else ''}time limit{limit} passed during {stage}")


class Deadline:
    """`seconds` from now (or from `start`, a reading of `clock`) on `clock` (wall-clock seconds by
    default); `None` never expires. With `also`, it expires when that one does too (a backstop)."""

    def __init__(self, seconds: float | None, start: float | None = None, clock=None,
                 also: "Deadline | None" = None):
        self.clock, self.also = clock or wall_seconds, also
        self.start = self.clock() if start is None else start
        self.seconds = math.inf if seconds is None else float(seconds)
        self.at = self.start + self.seconds

    @classmethod
    def never(cls) -> "Deadline":
        return cls(None)

    @classmethod
    def cpu(cls, seconds: float | None, also: "Deadline | None" = None) -> "Deadline":
        """`seconds` of CPU time (`cpu_seconds`) from now, and `also` behind it."""
        return cls(seconds, clock=cpu_seconds, also=also)

    @property
    def counts_cpu(self) -> bool:
        return self.clock is cpu_seconds

    def left(self) -> float:
        """Seconds left, 0 once the deadline has passed."""
        own = max(0.0, self.at - self.clock())
        return own if self.also is None else min(own, self.also.left())

    def elapsed(self) -> float:
        return self.clock() - self.start

    def expired(self) -> bool:
        return self.clock() >= self.at or (self.also is not None and self.also.expired())

    def check(self, stage: str) -> None:
        """Raise `TimeLimit(stage)` if the deadline (or its backstop, which the exception then names) has
        passed."""
        if self.clock() >= self.at:
            raise TimeLimit(stage, self.seconds, self.counts_cpu)
        if self.also is not None:
            self.also.check(stage)

    def share(self, fraction: float) -> float:
        """`fraction` of the time left (seconds), for a stage that must leave the rest to later ones."""
        return self.left() * fraction

    def part(self, fraction: float) -> "Deadline":
        """A deadline `fraction` of the time left from now, on this one's clock and with its backstop: where
        optional work stops (kernel growth, sharing trials) so that what must follow has the rest."""
        if self.seconds == math.inf and self.also is None:
            return Deadline.never()
        return Deadline(self.share(fraction), clock=self.clock, also=self.also)

    def bind(self, fn, search: "Deadline | None" = None):
        """`fn`, running with this deadline as the current one (`current()`) and `search` (default: this
        one) as the search's (`current_search()`)."""
        @functools.wraps(fn)
        def bound(*args, **kwargs):
            token = _CURRENT.set(self)
            token_search = _SEARCH.set(search or self)
            try:
                return fn(*args, **kwargs)
            finally:
                _SEARCH.reset(token_search)
                _CURRENT.reset(token)
        return bound

    def __repr__(self) -> str:
        clock = ", cpu" if self.counts_cpu else ""
        return f"Deadline({self.seconds:g} s{clock}, {self.left():.3g} s left)"


def current() -> Deadline:
    """The deadline of the call in progress (`Deadline.bind`), or one that never expires."""
    deadline = _CURRENT.get()
    return Deadline.never() if deadline is None else deadline


def current_search() -> Deadline:
    """The deadline of the search in progress (`Deadline.bind`'s `search`): where optional work stops."""
    deadline = _SEARCH.get()
    return current() if deadline is None else deadline
