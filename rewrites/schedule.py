"""Schedules: named phases of rule sets, run in order, each with its own limits and back-off.

    Schedule.of("algebra")                                   # one phase per rule set, in order
    Schedule([Phase("algebra", ALGEBRA, Limits(iterations=8)),
              Phase("cleanup", CLEANUP, backoff=None)])
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from superopt.egraph.limits import BackOff, Limits, Phase


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
        """One phase per rule set (registered names or RuleSet objects), in the order given."""
        return cls(tuple(Phase(rs.name, tuple(rs), limits, backoff) for rs in resolve(rulesets)))

    def __add__(self, other: "Schedule") -> "Schedule":
        return Schedule(self.phases + other.phases)

    def for_target(self, kind: str) -> "Schedule":
        """This schedule without the rules written for other kinds of target (`Rule.targets`); a phase left
        empty stays, so the report still names it."""
        return Schedule(tuple(dataclasses.replace(ph, rules=tuple(r for r in ph.rules if _runs_on(r, kind)))
                              for ph in self.phases))


def _runs_on(rule, kind: str) -> bool:
    targets = getattr(rule, "targets", ())    # a foreign rule object (a test's) runs everywhere
    return not targets or kind in targets


# Rule sets by name: `rulesets/__init__.py` registers the project's (this layer cannot import them).
REGISTERED: dict = {}


def register(*rulesets) -> None:
    for rs in rulesets:
        REGISTERED[rs.name] = rs


def resolve(rulesets) -> list:
    """Rule sets from names or RuleSet objects; an unknown name is an error listing the known ones."""
    out = []
    for rs in rulesets:
        if isinstance(rs, str):
            if rs not in REGISTERED:
                raise ValueError(f"superopt: unknown rule set {rs!r}; known: {', '.join(sorted(REGISTERED))}")
            rs = REGISTERED[rs]
        out.append(rs)
    return out


__all__ = ["Schedule", "Phase", "BackOff", "Limits", "register", "resolve"]
