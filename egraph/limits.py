"""Saturation's limits, phases, back-off and reports: plain data, kept apart from `runner.py` so that what
only names them (the API, the cache, reports; a call the cache answers) does not import egglog."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Limits:
    """Limits on one optimization. `seconds` bounds the whole call for one specialization: capture,
    encoding, saturation, extraction, lowering and verification together, on one clock
    (`superopt/core/deadline.py`). Saturation gets at most `SATURATION_SHARE` of the time left when it
    starts, and at most `saturation_seconds`, so that extraction, lowering and verification have the
    rest; where the time runs out before a program is verified, the original program runs and the report
    names the stage that ran out ("kept original: time limit (extract: ...)"). Run directly
    (`saturate`), the smaller of `seconds` and `saturation_seconds` bounds the run. `iterations` and
    `nodes` bound saturation, `memory` its child process.

    A program optimized in segments (superopt/segments.py): each segment's search, its saturation and
    its extraction's optional work, is bounded by `segment_seconds` of CPU time (of the process that
    optimizes it and of its saturating child), with saturation's share and `saturation_seconds` counted
    in CPU time too, so that a loaded machine does not change what a segment finds; a search cut short
    keeps the best program it found, which is lowered and verified as always. `seconds` still bounds
    the whole call in wall-clock time."""
    iterations: int = 16    # a reshape moves one op along an elementwise chain per iteration: a training
                            # step's Adam updates saturate the algebra phase in 13
    nodes: int = 60_000     # rows in all tables: e-nodes plus their shape and dtype rows
    seconds: float = 60.0   # the whole call; a BERT-base layer takes about 8 s on 2 cores
    saturation_seconds: float = 8.0
    segment_seconds: float = 30.0   # CPU seconds for one segment's search; a BERT-base layer's takes about 6
    memory: int = 4 << 30   # bytes saturation may allocate; enforced in a child process (egraph/isolate.py)

    def __post_init__(self):
        for name in ("iterations", "nodes", "seconds", "saturation_seconds", "segment_seconds", "memory"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Limits.{name} must be positive, got {getattr(self, name)!r}")


# Of the time a call has left when saturation starts, the most saturation takes; extraction, lowering
# and verification share the rest (extraction's optional work, kernel growth and sharing trials, stops
# at half of what it is left: extract/greedy.py).
SATURATION_SHARE = 0.5


@dataclass(frozen=True)
class BackOff:
    match_limit: int = 1_000
    ban_length: int = 2


class StopReason(enum.Enum):
    SATURATED = "saturated"
    ITERATION_LIMIT = "iteration limit"
    NODE_LIMIT = "node limit"
    TIME_LIMIT = "time limit"
    MEMORY_LIMIT = "memory limit"
    ERROR = "error"


@dataclass(frozen=True)
class Phase:
    """A named step of a schedule: its rules run together until saturation or the phase's limits."""
    name: str
    rules: tuple
    limits: Limits | None = None        # None: the run's limits
    backoff: BackOff | None = BackOff()

    def __post_init__(self):
        object.__setattr__(self, "rules", tuple(self.rules))


@dataclass
class PhaseReport:
    name: str
    stop_reason: StopReason = StopReason.SATURATED
    iterations: int = 0
    seconds: float = 0.0
    matches: dict[str, int] = field(default_factory=dict)
    rule_seconds: dict[str, float] = field(default_factory=dict)
    bans: dict[str, int] = field(default_factory=dict)


@dataclass
class RunReport:
    stop_reason: StopReason
    iterations: int = 0
    enodes: int = 0
    eclasses: int = 0
    seconds: float = 0.0
    matches: dict[str, int] = field(default_factory=dict)       # rule name -> matches over the run
    rule_seconds: dict[str, float] = field(default_factory=dict)
    phases: list[PhaseReport] = field(default_factory=list)
    error: str | None = None

    @property
    def fired(self) -> dict[str, int]:
        return {name: n for name, n in sorted(self.matches.items()) if n}
