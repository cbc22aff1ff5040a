"""Saturation under a schedule of named phases, each with limits and back-off, ending with typed stop
reasons and a report per phase.

egglog 13.2 has no node limit and cannot be interrupted from Python, so each phase takes one step at a
time (analyses to a fixpoint, then one application of each active rule, timed) and checks size and time
between steps; one step can overshoot the node limit. A tripped limit is a stop reason, not an
exception: extraction still runs on what was reached.

Back-off works as egg's BackoffScheduler does, between steps: a rule that matched more than its limit
in one step sits out the next `ban_length` steps, and each ban doubles both numbers for that rule. This
keeps associativity and commutativity from crowding out every other rule.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from egglog import EGraph, bindings, ruleset

from superopt.egraph.analysis import analysis
from superopt.egraph.frozen import count


@dataclass(frozen=True)
class Limits:
    iterations: int = 12
    nodes: int = 60_000     # rows in all tables: e-nodes plus their shape and dtype rows
    seconds: float = 8.0

    def __post_init__(self):
        for name in ("iterations", "nodes", "seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Limits.{name} must be positive, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class BackOff:
    match_limit: int = 1_000
    ban_length: int = 2


class StopReason(enum.Enum):
    SATURATED = "saturated"
    ITERATION_LIMIT = "iteration limit"
    NODE_LIMIT = "node limit"
    TIME_LIMIT = "time limit"
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


def _rows(egraph: EGraph) -> int:
    """Rows in every table (e-nodes plus analysis rows): cheap, and what memory grows with."""
    return sum(n for _, n in egraph.all_function_sizes())


class _PhaseRunner:
    def __init__(self, egraph: EGraph, phase: Phase, limits: Limits, run_start: float, run_limits: Limits):
        self.egraph, self.phase, self.limits = egraph, phase, limits
        self.run_start, self.run_limits = run_start, run_limits
        self.report = PhaseReport(phase.name, matches={r.name: 0 for r in phase.rules},
                                  rule_seconds={r.name: 0.0 for r in phase.rules})
        self.name_of = {egg.decl: r.name for r in phase.rules for egg in r.egg}
        self.banned_until: dict[str, int] = {}
        self._rulesets: dict[str, object] = {}

    def ruleset_of(self, rule) -> object:
        if rule.name not in self._rulesets:  # egglog compiles a rule set once; keep one per rule
            self._rulesets[rule.name] = ruleset(*rule.egg, name=f"{self.phase.name}-{len(self._rulesets)}")
        return self._rulesets[rule.name]

    def step(self, active: list) -> tuple[bool, dict[str, int]]:
        """Apply each active rule once, timing each (egglog 13.2 reports no per-rule times)."""
        updated, matches = False, {}
        for rule in active:
            start = time.perf_counter()
            result = self.egraph.run(self.ruleset_of(rule))
            self.report.rule_seconds[rule.name] += time.perf_counter() - start
            updated |= result.updated
            matches[rule.name] = sum(n for key, n in result.num_matches_per_rule.items() if key in self.name_of)
        return updated, matches

    def run(self) -> PhaseReport:
        start, report, backoff = time.perf_counter(), self.report, self.phase.backoff
        while True:
            if report.iterations >= self.limits.iterations:
                report.stop_reason = StopReason.ITERATION_LIMIT
                break
            it = report.iterations
            active = [r for r in self.phase.rules if self.banned_until.get(r.name, -1) < it]
            banned = len(active) < len(self.phase.rules)
            updated, step_matches = self.step(active)
            self.egraph.run(analysis.saturate())
            report.iterations += 1
            for name, n in step_matches.items():
                report.matches[name] += n
                if backoff is not None:
                    times = report.bans.get(name, 0)
                    if n > backoff.match_limit << times:
                        report.bans[name] = times + 1
                        self.banned_until[name] = it + (backoff.ban_length << times)
            if not updated and not banned:
                report.stop_reason = StopReason.SATURATED
                break
            if _rows(self.egraph) > min(self.limits.nodes, self.run_limits.nodes):
                report.stop_reason = StopReason.NODE_LIMIT
                break
            now = time.perf_counter()
            if now - start > self.limits.seconds or now - self.run_start > self.run_limits.seconds:
                report.stop_reason = StopReason.TIME_LIMIT
                break
        report.seconds = time.perf_counter() - start
        return report


def saturate(egraph: EGraph, schedule, limits: Limits = Limits()) -> RunReport:
    """Run the phases of `schedule` (a Schedule or a list of Phases) in order; always returns a report.

    A node or time limit of the whole run stops every later phase; a phase's own limit ends that phase."""
    phases = list(getattr(schedule, "phases", schedule))
    start = time.perf_counter()
    egraph.set_report_level(bindings.TimeOnly())
    report = RunReport(StopReason.SATURATED)
    try:
        egraph.run(analysis.saturate())
        for phase in phases:
            phase_report = _PhaseRunner(egraph, phase, phase.limits or limits, start, limits).run()
            report.phases.append(phase_report)
            report.iterations += phase_report.iterations
            for name, n in phase_report.matches.items():
                report.matches[name] = report.matches.get(name, 0) + n
            for name, s in phase_report.rule_seconds.items():
                report.rule_seconds[name] = report.rule_seconds.get(name, 0.0) + s
            if phase_report.stop_reason is not StopReason.SATURATED:
                report.stop_reason = phase_report.stop_reason
            if phase_report.stop_reason in (StopReason.NODE_LIMIT, StopReason.TIME_LIMIT):
                break
    except Exception as exc:  # egglog raises EggSmolError on a type conflict: a rule broke the analyses
        report.stop_reason = StopReason.ERROR
        report.error = f"{type(exc).__name__}: {exc}"
    else:
        report.enodes, report.eclasses = count(egraph)
    report.seconds = time.perf_counter() - start
    return report
