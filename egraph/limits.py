"""Saturation's limits, phases, back-off and reports: plain data, kept apart from `runner.py` so that what
only names them (the API, the cache, reports; a call the cache answers) does not import egglog."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Limits:
    """Limits on one optimization, of two kinds. Budgets decide the program and are counted in
    deterministic units, so the same program, options and version give the same optimized program on an
    idle and on a busy machine: `iterations` (per phase), `nodes` (rows in the e-graph's tables) and
    `work` (rows searched plus matches applied, over the run: `egraph/runner.py`) bound saturation;
    kernel growth and sharing trials have counted budgets of their own (`extract/kernels.py`
    GROWTH_BUDGET, `extract/greedy.py` MAX_SHARING_TRIALS and SHARING_NODES), and so has the ILP extractor
    (`extract/ilp.py` NODE_BUDGET). `memory` bounds
    saturation's child process.

    Time limits are backstops, several times what the defaults take on an idle 2-core machine: where one
    fires, the program depends on the machine's speed, and the report says so (a run's stop reason "time
    limit", an outcome "kept original: time limit (stage: ...)", an extraction "stopped at 50% of the time
    left"). `seconds` bounds the whole call for one specialization in wall-clock time: capture, encoding,
    saturation, extraction, lowering and verification together (`superopt/core/deadline.py`); saturation
    gets at most `SATURATION_SHARE` of the time left when it starts, and at most `saturation_seconds`, so
    that the later stages have the rest. Run directly (`saturate`), the smaller of `seconds` and
    `saturation_seconds` bounds the run. A segment's search (superopt/segments.py), its saturation and its
    extraction's optional work, is bounded by `segment_seconds` of CPU time, with saturation's share and
    `saturation_seconds` counted in CPU time too; a search cut short keeps the best program it found,
    which is lowered and verified as always."""
    iterations: int = 16    # a reshape moves one op along an elementwise chain per iteration: a training
                            # step's Adam updates saturate the algebra phase in 13
    nodes: int = 60_000     # rows in all tables: e-nodes plus their shape and dtype rows
    seconds: float = 120.0  # backstop for the whole call; a BERT-base layer takes about 8 s on 2 cores, a
                            # training step about 30 s
    saturation_seconds: float = 30.0   # backstop; `work` stops saturation at about 8 s of one idle core
    segment_seconds: float = 60.0      # backstop, CPU seconds for one segment's search; a BERT-base layer's: 6
    memory: int = 4 << 30   # bytes saturation may allocate; enforced in a child process (egraph/isolate.py)
    work: int = 16_000_000  # saturation: rows searched plus matches applied; about 2 million a CPU second

    def __post_init__(self):
        for name in ("iterations", "nodes", "seconds", "saturation_seconds", "segment_seconds", "memory", "work"):
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
    WORK_LIMIT = "work limit"
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
    work: int = 0   # rows searched plus matches applied (`Limits.work`)


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
    work: int = 0   # rows searched plus matches applied over the run (`Limits.work`)

    @property
    def fired(self) -> dict[str, int]:
        return {name: n for name, n in sorted(self.matches.items()) if n}
