"""Schedules: named phases of rule sets, run in order, each with its own limits and back-off.

    Schedule.of("algebra")                                   # one phase per rule set, in order
    Schedule([Phase("algebra", ALGEBRA, Limits(iterations=8)),
              Phase("cleanup", CLEANUP, backoff=None)])
"""
from __future__ import annotations

from dataclasses import dataclass

from superopt.egraph.runner import BackOff, Limits, Phase


@dataclass(frozen=True)
class Schedule:
    phases: tuple

    def __post_init__(self):
        object.__setattr__(self, "phases", tuple(self.phases))
        names = [p.name for p in self.phases]
        if len(set(names)) != len(names):
            raise ValueError(f"schedule phases must have distinct names, got {names}")

    @classmethod
    def of(cls, *rulesets, limits: Limits | None = None, backoff: BackOff | None = BackOff()) -> "Schedule":
        """One phase per rule set (names or RuleSet objects), in the order given."""
        from superopt.rulesets import resolve
        return cls(tuple(Phase(rs.name, tuple(rs), limits, backoff) for rs in resolve(rulesets)))

    def __add__(self, other: "Schedule") -> "Schedule":
        return Schedule(self.phases + other.phases)


__all__ = ["Schedule", "Phase", "BackOff", "Limits"]
