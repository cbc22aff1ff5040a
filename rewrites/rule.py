"""Rules as data: a named pair (or group of pairs) of patterns with named legality predicates.

A rule-set module declares one table:

    ALGEBRA = RuleSet("algebra", {
        "matmul": [
            rule("matmul-assoc", matmul(matmul(x, y, d), z, d), matmul(x, matmul(y, z, d), d),
                 when("has_dtype", x, d), ..., two_way=True, numerics="reals", doc="(x@y)@z <-> x@(y@z)"),
        ],
    })

Each rule records its name, rule set, category (the table section), doc line and source file:line.
`numerics` says in which sense the sides are equal. It decides when the rule may run and how the checker
(rewrites/checker.py) compares the sides. superopt's contract in its default mode, numerics="strict": for
every input the optimized program is finite, NaN and +-inf (with the sign) exactly where the original is,
its integer results are bit-identical and its float results within the dtype's rounding tolerance; the
one allowed difference is a result within rounding tolerance of the dtype's largest finite value, which
may round to +-inf in one program and not in the other.
  "exact"    - equal in IEEE arithmetic: the same values, NaN, inf and -0 where they arise (NaN payloads
               aside). Legal by default.
  "rounding" - the same real function, and the sides differ by rounding only: for every input (NaN,
               +-inf, -0, subnormals, the dtype's largest value, values near its square root) and every
               literal constant the rule can bind, they are finite, NaN and inf at the same elements
               (the range edge above aside). Legal by default.
  "order"    - the same products, summed in another order or grouping (a contraction may also fuse a
               product into its sum): the same real function, differing by rounding, finite, NaN and
               inf at the same elements except where a partial sum overflows in one order and not in the
               other, which needs terms whose magnitudes add up past the dtype's largest finite value.
               XLA fixes no order for a sum either (jax.jit sums a row as its vectorizer and fusion
               decide), so the contract leaves that edge to the order (README.md). Legal by default; the
               checker draws every value of "rounding" but magnitudes near the range's top.
  "reals"    - equal over the reals only: may change where results overflow, underflow or are NaN
               (re-association, distribution, moving a scale across a sum). Legal only with
               numerics="fast"; in strict mode the schedule drops these rules.
"""
from __future__ import annotations

import dataclasses
import os
import re
import sys
from dataclasses import dataclass, field
from functools import cached_property

from superopt.core import kinds, lazy
from superopt.rewrites.functions import PREDICATES, Given, given, when
from superopt.rewrites.pattern import SCALAR, TENSOR, Pattern, variables

compiler = lazy.module("superopt.rewrites.compile")   # egglog: imported where a rule is first compiled

NUMERICS = ("exact", "rounding", "order", "reals")
_NAME = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True, eq=False)
class Rule:
    name: str
    pairs: tuple            # ((lhs, rhs), ...): one pair, or several matched together (multi-pattern)
    when: tuple = ()        # ((predicate name, args), ...)
    two_way: bool = False
    numerics: str = "exact"
    doc: str = ""
    category: str = ""
    ruleset: str = ""
    source: str = ""
    targets: tuple = ()     # the target kinds whose cost model the rule is written for; () for every one
    given: tuple = ()       # domain conditions (functions.Given): proven by the analysis, or assumed and checked
    speculative: bool = False   # compiled to assume its `given` conditions (a guarded search's copy: `speculating`)

    def __post_init__(self):
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"rule name {self.name!r} is not kebab-case")
        if self.numerics not in NUMERICS:
            raise ValueError(f"rule {self.name!r}: numerics must be one of {NUMERICS}, not {self.numerics!r}")
        if self.two_way and len(self.pairs) > 1:
            raise ValueError(f"rule {self.name!r}: a multi-pattern rule cannot be two-way")
        for lhs, rhs in self.pairs:
            if lhs.sort not in (TENSOR, SCALAR) or rhs.sort != lhs.sort:
                raise TypeError(f"rule {self.name!r}: both sides must be tensors, or both kernel-body scalars")
            bound = set(variables(lhs)) | {v for l, _ in self.pairs for v in variables(l)}
            free = [v for v in variables(rhs) if v not in bound]
            if free:
                raise ValueError(f"rule {self.name!r}: right-hand side uses unbound variables {free}")
            free = [v for v in variables(lhs) if v not in set(variables(rhs))] if self.two_way else []
            if free:
                raise ValueError(f"rule {self.name!r}: two-way, but its left-hand side uses {free}, which the "
                                 "right-hand side does not bind")
        unknown = [k for k in self.targets if k not in kinds.KINDS]
        if unknown:
            raise ValueError(f"rule {self.name!r}: unknown target kinds {unknown}; valid: {', '.join(kinds.KINDS)}")
        for name, _ in self.when:
            if name not in PREDICATES:
                raise KeyError(f"rule {self.name!r}: unknown predicate {name!r}")
        lhs_vars = {v for lhs, _ in self.pairs for v in variables(lhs)}
        for cond in self.given:
            if cond.arg not in lhs_vars:
                raise ValueError(f"rule {self.name!r}: domain condition {cond.name} on {cond.arg.name}, which its "
                                 "left-hand side does not bind")
        if self.given and self.two_way:
            raise ValueError(f"rule {self.name!r}: a rule with a domain condition cannot be two-way (declare each "
                             "direction with the condition it needs)")

    @property
    def conditions(self) -> tuple:
        """Every predicate that must hold for the rule: `when`, and the domain conditions (`given`) as the
        predicates they are. The soundness checker draws inputs that satisfy all of them."""
        return self.when + tuple((c.name, (c.arg,)) for c in self.given)

    @cached_property
    def _text(self) -> str:
        return f"Rule({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in dataclasses.fields(self) if f.repr)})"

    def __repr__(self) -> str:
        """The dataclass's text, built once: a search's cache key writes every rule of its schedule."""
        return self._text

    @cached_property
    def egg(self) -> tuple:
        """The egglog rules this rule compiles to (compiled once, on first use)."""
        return tuple(compiler.compile_rule(self))

    @property
    def compiled(self) -> bool:
        """Whether this rule's egglog rules are built (or adopted) in this process."""
        return "egg" in self.__dict__

    def adopt(self, egg: tuple) -> None:
        """Use `egg` as this rule's egglog rules: its compiled rules rebuilt from the cache (egraph/saved.py)."""
        if not self.compiled:
            self.__dict__["egg"] = tuple(egg)

    def __getstate__(self) -> dict:
        """A rule sent to a worker process goes without its compiled egglog rules (the worker compiles its own)."""
        return {k: v for k, v in self.__dict__.items() if k != "egg"}

    def key(self) -> tuple:
        """Everything that defines the rule except where it was declared."""
        return (self.name, self.pairs, self.when, self.two_way, self.numerics, self.doc, self.category, self.ruleset,
                self.targets, self.given, self.speculative)

    def __eq__(self, other):
        return isinstance(other, Rule) and self.key() == other.key()

    def __hash__(self):
        return hash(self.key())


def _caller() -> str:
    """file:line of the declaration: the outermost frame in the declaring module, so a rule built by a
    helper in a rule-set module points at its row in the table, not into the helper."""
    frame = sys._getframe(2)
    filename, line = frame.f_code.co_filename, frame.f_lineno
    while frame.f_back is not None and frame.f_back.f_code.co_filename == filename:
        frame = frame.f_back
        line = frame.f_lineno
    return f"{_readable(filename)}:{line}"


def _readable(filename: str) -> str:
    """A rule's file as a reader finds it: inside superopt, relative to the package (rulesets/algebra.py);
    a user's rule file relative to the working directory where it lies below it, else its absolute path."""
    path = os.path.abspath(filename)
    for root in (_ROOT, os.getcwd()):
        if path.startswith(os.path.join(root, "")):
            return os.path.relpath(path, root)
    return path


def _split(conditions) -> tuple[tuple, tuple]:
    """(predicates, domain conditions) of a rule's conditions, in the order written."""
    return (tuple(c for c in conditions if not isinstance(c, Given)),
            tuple(c for c in conditions if isinstance(c, Given)))


def rule(name: str, lhs: Pattern, rhs: Pattern, *conditions, doc: str, two_way: bool = False,
         numerics: str = "exact", targets: tuple = ()) -> Rule:
    """`lhs -> rhs` where every condition holds (`when` predicates; `given` domain conditions, which a search
    that speculates may assume and check at run time); `two_way=True` declares `lhs <-> rhs` once; `targets`:
    the target kinds it runs for (a rewrite that only pays on one kind's kernels), every kind by default."""
    preds, domain = _split(conditions)
    return Rule(name, ((lhs, rhs),), preds, two_way, numerics, doc, source=_caller(), targets=tuple(targets),
                given=domain)


def multi_rule(name: str, pairs, *conditions, doc: str, numerics: str = "exact", targets: tuple = ()) -> Rule:
    """Several patterns matched together; each lhs_i is unioned with its rhs_i (`targets` as for `rule`)."""
    preds, domain = _split(conditions)
    return Rule(name, tuple(pairs), preds, False, numerics, doc, source=_caller(), targets=tuple(targets),
                given=domain)


_SPECULATING: dict = {}   # rule -> its copy that speculates (one per definition: compiled once in a process)


def speculating(r: Rule) -> Rule:
    """The copy of `r` a guarded search runs: its domain conditions assumed where the analysis cannot prove
    them, each assumption recorded for the run-time check (rewrites/compile.py). `r` itself where it has none (a
    foreign rule object, a test's, has no `given`). The same copy for every rule equal to `r`: a copy is
    compiled to egglog rules once, and every guarded search of the process runs it."""
    if not getattr(r, "given", ()) or r.speculative:
        return r
    if r not in _SPECULATING:
        _SPECULATING[r] = dataclasses.replace(r, speculative=True)
    return _SPECULATING[r]


@dataclass
class RuleSet:
    """One table of rules, in sections named by category."""
    name: str
    sections: dict = field(default_factory=dict)   # category -> list[Rule]
    rules: list = field(init=False)

    def __post_init__(self):
        if isinstance(self.sections, (list, tuple)):
            self.sections = {"": list(self.sections)}
        self.rules, seen = [], set()
        for category, members in self.sections.items():
            for r in members:
                if r.name in seen:
                    raise ValueError(f"rule set {self.name!r}: rule {r.name!r} declared twice")
                seen.add(r.name)
                self.rules.append(dataclasses.replace(r, category=category or r.category, ruleset=self.name))

    def __iter__(self):
        return iter(self.rules)

    def __len__(self):
        return len(self.rules)

    def __getitem__(self, name: str) -> Rule:
        for r in self.rules:
            if r.name == name:
                return r
        raise KeyError(f"rule set {self.name!r} has no rule {name!r}")


__all__ = ["Rule", "RuleSet", "rule", "multi_rule", "when", "given", "speculating", "NUMERICS"]
