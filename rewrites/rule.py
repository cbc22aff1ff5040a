"""A named rewrite rule, and the registry that collects every rule set.

A `Rule` is one row of a rule-set table: a kebab-case name, a doc line, the egglog rules it compiles to,
the rule set it belongs to, and where it was declared (file:line) so reports can point at it.
`numerics` says in which sense the two sides are equal, which decides how the checker compares them:
  "exact"   - equal in IEEE arithmetic (same value, NaN and Inf included);
  "reals"   - equal over the reals: may differ by rounding, and where an intermediate overflows.
"""
from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field

from egglog import eq, rule, union, var

from superopt.egraph.terms import Tensor

NUMERICS = ("exact", "reals")


@dataclass(frozen=True)
class Rule:
    name: str
    doc: str
    egg: tuple            # egglog rewrites / rules this rule compiles to
    numerics: str = "exact"
    ruleset: str = ""
    source: str = ""      # file:line of the declaration

    def __post_init__(self):
        if self.numerics not in NUMERICS:
            raise ValueError(f"rule {self.name!r}: numerics must be one of {NUMERICS}, not {self.numerics!r}")
        if not self.egg:
            raise ValueError(f"rule {self.name!r} compiles to no egglog rule")


def _caller_source(depth: int = 2) -> str:
    frame = inspect.stack()[depth]
    return f"{os.path.relpath(frame.filename, os.path.dirname(os.path.dirname(__file__)))}:{frame.lineno}"


def _one_way(lhs, rhs, conditions):
    # A rewrite as an egglog `rule`, whose declaration identifies it in egglog's run reports.
    root = var("__root", Tensor)
    return rule(eq(root).to(lhs), *conditions).then(union(root).with_(rhs))


def rw(name: str, lhs, rhs, *conditions, doc: str, numerics: str = "exact", two_way: bool = False) -> Rule:
    """`lhs -> rhs if conditions`; `two_way` declares `lhs <-> rhs` once."""
    egg = (_one_way(lhs, rhs, conditions),) + ((_one_way(rhs, lhs, conditions),) if two_way else ())
    return Rule(name, doc, egg, numerics, source=_caller_source())


def rules(name: str, egg_rules, *, doc: str, numerics: str = "exact") -> Rule:
    """A rule that compiles to several egglog rules (one per rank, or a multi-pattern rule)."""
    return Rule(name, doc, tuple(egg_rules), numerics, source=_caller_source())


@dataclass
class RuleSet:
    name: str
    rules: list[Rule] = field(default_factory=list)

    def __post_init__(self):
        seen = set()
        for i, r in enumerate(self.rules):
            if r.name in seen:
                raise ValueError(f"rule set {self.name!r}: rule {r.name!r} declared twice")
            seen.add(r.name)
            self.rules[i] = Rule(r.name, r.doc, r.egg, r.numerics, self.name, r.source)

    def __iter__(self):
        return iter(self.rules)

    def __len__(self):
        return len(self.rules)
