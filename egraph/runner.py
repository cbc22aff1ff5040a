"""Saturation under explicit limits, ending with a typed `StopReason` and a `RunReport`.

egglog 13.2 has no node limit and cannot be interrupted from Python, so the runner takes one step at a
time (analyses to a fixpoint, then one application of every rule in the phase) and checks size and
time between steps. One step can overshoot the node limit; the report says by how much. A tripped
limit is a stop reason, not an exception: extraction still runs on what was reached.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from egglog import EGraph, bindings, ruleset

from superopt.egraph.analysis import analysis
from superopt.egraph.frozen import count
from superopt.rewrites.rule import Rule, RuleSet


@dataclass(frozen=True)
class Limits:
    iterations: int = 12
    nodes: int = 60_000     # rows in all tables: e-nodes plus their shape and dtype rows
    seconds: float = 8.0

    def __post_init__(self):
        for name in ("iterations", "nodes", "seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Limits.{name} must be positive, got {getattr(self, name)!r}")


class StopReason(enum.Enum):
    SATURATED = "saturated"
    ITERATION_LIMIT = "iteration limit"
    NODE_LIMIT = "node limit"
    TIME_LIMIT = "time limit"
    ERROR = "error"


@dataclass
class RunReport:
    stop_reason: StopReason
    iterations: int = 0
    enodes: int = 0
    eclasses: int = 0
    seconds: float = 0.0
    matches: dict[str, int] = field(default_factory=dict)       # rule name -> matches over the run
    rule_seconds: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def fired(self) -> dict[str, int]:
        return {name: n for name, n in sorted(self.matches.items()) if n}


@dataclass
class Phase:
    name: str
    rules: list[Rule]


def _rows(egraph: EGraph) -> int:
    """Rows in every table (e-nodes plus analysis rows): cheap, and what memory grows with."""
    return sum(n for _, n in egraph.all_function_sizes())


def saturate(egraph: EGraph, phases: list[Phase], limits: Limits = Limits()) -> RunReport:
    """Run each phase's rules step by step until saturation or a limit; always returns a report."""
    start = time.perf_counter()
    egraph.set_report_level(bindings.TimeOnly())
    report = RunReport(StopReason.SATURATED)
    name_of = {egg.decl: r.name for phase in phases for r in phase.rules for egg in r.egg}
    for r in name_of.values():
        report.matches.setdefault(r, 0)
        report.rule_seconds.setdefault(r, 0.0)
    try:
        egraph.run(analysis.saturate())
        for phase in phases:
            step = ruleset(*(egg for r in phase.rules for egg in r.egg), name=f"phase-{phase.name}")
            while True:
                if report.iterations >= limits.iterations:
                    report.stop_reason = StopReason.ITERATION_LIMIT
                    break
                run = egraph.run(step)
                egraph.run(analysis.saturate())
                report.iterations += 1
                for key, n in run.num_matches_per_rule.items():
                    if key in name_of:
                        report.matches[name_of[key]] += n
                for key, dt in run.search_and_apply_time_per_rule.items():
                    if key in name_of:
                        report.rule_seconds[name_of[key]] += dt.total_seconds()
                if not run.updated:
                    report.stop_reason = StopReason.SATURATED
                    break
                if _rows(egraph) > limits.nodes:
                    report.stop_reason = StopReason.NODE_LIMIT
                    break
                if time.perf_counter() - start > limits.seconds:
                    report.stop_reason = StopReason.TIME_LIMIT
                    break
    except Exception as exc:  # egglog raises EggSmolError on a type conflict: a rule broke the analyses
        report.stop_reason = StopReason.ERROR
        report.error = f"{type(exc).__name__}: {exc}"
    else:
        report.enodes, report.eclasses = count(egraph)
    report.seconds = time.perf_counter() - start
    return report
