"""Saturation under a schedule of named phases, each with limits and back-off, ending with typed stop
reasons and a report per phase.

egglog 13.2 has no node limit and cannot be interrupted from Python, so each phase takes one step at a
time (analyses to a fixpoint, then one application of each active rule, timed) and checks size and time
after each rule application. Once the e-graph holds 1/8 of its node limit, applications are bounded so
that none takes it more than 10% past the limit: each egglog rule runs under egglog's back-off
scheduler with a match limit of the matches it had before (applied already, they add nothing) plus the
new ones that fit at the rows one match can add (the nodes its right-hand side builds, with their
analysis rows). A rule held back that way ends the run with the node limit: the bound is a worst case,
so a run that explodes stops below its limit (RELIABILITY.md gives figures). Below 1/8 of the limit an
application is not bounded: one that grows the e-graph more than eightfold could overshoot, and the
memory limit of `egraph/isolate.py` is what bounds that. A tripped limit is a stop reason, not an
exception: extraction still runs on what was reached. Hard limits (time that one rule application
overruns, memory, a crash in egglog) need a child process: `egraph/isolate.py`.

A rule whose left-hand side needs a constructor of which the e-graph holds no e-node (a quantization rule
in a float program, a layout rule where nothing is packed) cannot match: it is passed over, neither
compiled nor run, until a constructor it needs appears (`needs`). egglog compiles each rule set on its
first run, so this is most of a phase's cost on a small program. Each rule has one rule set per process
(`ruleset_of`), and the process's template e-graph (`egraph/encode.py:scratch`) registers the rule sets of
every rule an earlier search ran (`prime`): a search forked from it registers only the rules no earlier
search reached (registering took about 150 ms of a small program's 250 ms saturation).

Back-off works as egg's BackoffScheduler does, between steps: a rule that matched more than its limit
in one step sits out the next `ban_length` steps, and each ban doubles both numbers for that rule. This
keeps associativity and commutativity from crowding out every other rule.

`Limits.work` is saturation's deterministic budget: each rule application adds the rows the e-graph had when
it ran (what egglog searches grows with them) and the matches it applied; the run stops with the work limit
once the sum reaches it, at the same point on any machine. Time limits are backstops (`superopt/core/deadline.py`).
Time is wall-clock time, or this process's CPU time where `use_cpu_time()` was called: the child that
saturates a segment's e-graph (`egraph/isolate.py`) counts what it computes, not what a loaded machine
takes from it, so its limits give the same e-graph at any load.
"""
from __future__ import annotations

import itertools
from dataclasses import replace

from egglog import EGraph, back_off, ruleset
from egglog import run as egg_run

from superopt.core import progress
from superopt.core.deadline import process_seconds, wall_seconds
from superopt.egraph import egglog_api as api
from superopt.egraph.analysis import analysis
from superopt.egraph.frozen import count, saturate_registered, table_sizes
from superopt.egraph.limits import SATURATION_SHARE, BackOff, Limits, Phase, PhaseReport, RunReport, StopReason
from superopt.egraph.signatures import CONSTRUCTORS

# The schedule's data lives in limits.py (no egglog); named here too, where saturation's callers import it.
__all__ = ["saturate", "rows_per_match", "NODE_SLACK", "SATURATION_SHARE", "BackOff", "Limits", "Phase",
           "PhaseReport", "RunReport", "StopReason"]


def _rows(egraph: EGraph) -> int:
    """Rows in every table (e-nodes plus analysis rows): cheap, and what memory grows with."""
    return sum(table_sizes(egraph).values())


def saturate_analysis(egraph: EGraph) -> None:
    """Run the analysis rule set to its fixpoint (before the first step and after every one)."""
    saturate_registered(egraph, analysis())


def _census(egraph: EGraph) -> tuple[int, frozenset]:
    """(`_rows`, the constructors the e-graph holds e-nodes of, by name), from one walk of its tables."""
    sizes = table_sizes(egraph)
    return sum(sizes.values()), frozenset(name for name in CONSTRUCTORS if sizes.get(name))


def needs(rule) -> tuple[frozenset, ...]:
    """For each direction egglog applies `rule` in (two for a two-way rule), the constructors its
    left-hand sides name: it can match only where the e-graph holds all of one direction's."""
    return _shape(rule)[0]


def _shape(rule) -> tuple:
    """(`needs`, every constructor the rule names, `rows_per_match`): read off its patterns once per rule object
    (each search asks for every rule of its schedule)."""
    held = _SHAPES.get(id(rule))
    if held is None or held[0] is not rule:
        if len(_SHAPES) > 4096:   # rules built for one call (a guarded search's copies) do not pile up
            _SHAPES.clear()
        sides = [[left for left, _ in rule.pairs]] + ([[right for _, right in rule.pairs]] if rule.two_way else [])
        wants = tuple(frozenset(t.fn for p in side for t in _terms(p, set())) for side in sides)
        names = frozenset(t.fn for pair in rule.pairs for p in pair for t in _terms(p, set()))
        held = _SHAPES[id(rule)] = (rule, (wants, names, _rows_per_match(rule)))
    return held[1]


_SHAPES: dict = {}   # id(rule) -> (the rule, its `_shape`): the rule is kept, so its id is not reused


def reachable(egraph: EGraph, schedule) -> list:
    """The rules of `schedule` that can ever match in `egraph`: those whose needs the constructors it
    holds meet, or those that such rules' other sides build (a fixpoint over every phase at once). The
    others are never compiled (`egraph/isolate.py` compiles these before it forks)."""
    return reachable_from(_census(egraph)[1], schedule)


def reachable_from(constructors, schedule) -> list:
    """`reachable` for an e-graph that holds e-nodes of `constructors` (names) and of no others."""
    waiting = [(r, needs(r)) for phase in getattr(schedule, "phases", schedule) for r in phase.rules]
    held, out = set(constructors), []
    while True:
        fired = [r for r, wants in waiting if any(need <= held for need in wants)]
        if not fired:
            return out
        out += fired
        gone = {id(r) for r in fired}   # by identity: a rule compares by its whole definition
        waiting = [(r, wants) for r, wants in waiting if id(r) not in gone]
        held |= {fn for r in fired for fn in _shape(r)[1]}


# rule -> (the rule, its rule set): equal rules (superopt's `Rule` compares by definition) share one, so a rule
# rebuilt for each call, or a guarded search's copy of one, is not compiled and registered again; an object
# that does not hash is keyed by its id (and kept here, so that the id is not reused)
_RULESETS: dict = {}
_RAN: set[str] = set()   # names of the rule sets a saturation registered, and then ended without an error
_names = itertools.count()


def ruleset_of(rule) -> object:
    """The egglog rule set of `rule` alone: one per rule in a process, so that an e-graph that registered it
    once (`prime`) runs it without registering it again."""
    try:
        key = rule
        held = _RULESETS.get(key)
    except TypeError:
        key = id(rule)
        held = _RULESETS.get(key)
        held = held if held is not None and held[0] is rule else None
    if held is None:
        held = _RULESETS[key] = (rule, ruleset(*rule.egg, name=f"superopt-rule-{next(_names)}"))
    elif held[0] is not rule and hasattr(rule, "adopt"):
        rule.adopt(held[0].egg)   # an equal rule's egglog rules: this one is not compiled again
    return held[1]


def registered(egraph: EGraph, rules: list) -> list[int]:
    """The positions in `rules` of those whose rule set `egraph` registered (a saturation ran it)."""
    return [i for i, r in enumerate(rules) if api.is_registered(egraph, ruleset_of(r))]


def ran(rules) -> None:
    """Note that a saturation (here, or in a child process: `egraph/isolate.py`) registered the rule sets of
    `rules` and ended without an error: `prime` may register them in this process's template."""
    _mark(ruleset_of(r) for r in rules)


def _mark(rulesets) -> None:
    _RAN.update(api.ruleset_name(rs) for rs in rulesets)


def prime(egraph: EGraph) -> None:
    """Register in `egraph` (the template e-graph a search starts from) the rule set of every rule that a search
    of this process ran (`ran`) and that `egraph` does not hold, by a run of zero iterations: nothing is
    applied, nothing in the e-graph changes. Only rule sets that a saturation registered without a crash are
    registered here, in the caller's process (egglog's crashes are the child's alone: `egraph/isolate.py`)."""
    for _, rules in list(_RULESETS.values()):
        if api.ruleset_name(rules) in _RAN and not api.is_registered(egraph, rules):
            egraph.run(rules * 0)


_clock = wall_seconds   # wall-clock time; `use_cpu_time` makes it the process's CPU time


def use_cpu_time() -> None:
    """Count the time limits of later runs in this process in CPU time (`time.process_time`)."""
    global _clock
    _clock = process_seconds


def _now() -> float:
    return _clock()


NODE_SLACK = 1.1          # one rule application may take the e-graph at most this far past the node limit
GUARD_FROM = 8            # applications are bounded once the e-graph has 1/GUARD_FROM of its node limit
ROWS_PER_NEW_NODE = 4     # an e-node and its analysis rows (shape, dtype, and one more at most)


def _terms(pattern, into: set) -> set:
    """The constructor applications in a pattern, each sub-term once (attribute functions compute values)."""
    args = getattr(pattern, "args", None)
    if args is not None:
        if pattern.fn in CONSTRUCTORS:
            into.add(pattern)
        for a in args:
            _terms(a, into)
    return into


def rows_per_match(rule) -> int:
    """`_rows_per_match`, once per rule object."""
    return _shape(rule)[2]


def _rows_per_match(rule) -> int:
    """An upper bound on the rows one match of `rule` adds: the distinct terms one side builds that the
    other does not already hold (either way for a two-way rule), each with its analysis rows."""
    lhs, rhs = set(), set()
    for left, right in rule.pairs:
        _terms(left, lhs)
        _terms(right, rhs)
    built = max(len(rhs - lhs), len(lhs - rhs) if rule.two_way else 0)
    return ROWS_PER_NEW_NODE * max(built, 1)


class _PhaseRunner:
    def __init__(self, egraph: EGraph, phase: Phase, limits: Limits, run_start: float, run_limits: Limits,
                 run_work: int = 0):
        self.egraph, self.phase, self.limits = egraph, phase, limits
        self.run_start, self.run_limits = run_start, run_limits
        self.run_work = run_work   # the work of the run's earlier phases (`Limits.work`)
        self.report = PhaseReport(phase.name, matches={r.name: 0 for r in phase.rules},
                                  rule_seconds={r.name: 0.0 for r in phase.rules})
        self.banned_until: dict[str, int] = {}
        self.on_step = None   # called with the iteration count after each step (progress bars)
        self.node_limit = min(limits.nodes, run_limits.nodes)
        self.rows_per_match = {r.name: rows_per_match(r) for r in phase.rules}
        self.seen: dict = {}   # (rule name, position of an egglog rule in its `egg`) -> matches at its latest run
        self._positions: dict = {}   # (rule name, egglog rule name) -> that position (`position`)
        self._single: dict = {}  # egglog rule -> a rule set of it alone, for bounded applications
        self.needs = {r.name: needs(r) for r in phase.rules}
        self.work_limit = min(limits.work, run_limits.work)

    def step(self, active: list, phase_start: float) -> tuple[bool, dict[str, int], StopReason | None]:
        """Apply each active rule once, timing each (egglog 13.2 reports no per-rule times); stop early,
        with the reason, where a node or time limit is reached (module doc)."""
        updated, matches = False, {}
        rows, present = _census(self.egraph)
        step_start = rows
        for rule in active:
            if not any(need <= present for need in self.needs[rule.name]):
                matches[rule.name] = 0          # a constructor it needs is not in the e-graph (module doc)
                continue
            self.report.work += rows   # what egglog searches grows with the e-graph (`Limits.work`)
            start = _now()
            if rows * GUARD_FROM > self.node_limit:
                changed, per_egg, held = self.bounded(rule, step_start)
            else:
                changed, by_name = api.run_once(self.egraph, ruleset_of(rule))
                held, per_egg = False, {}
                for name, n in by_name.items():
                    if (at := self.position(rule, name)) is not None:
                        per_egg[rule.name, at] = n
            self.report.rule_seconds[rule.name] += _now() - start
            if held:  # at worst its matches would take the e-graph past the node limit
                return updated, matches, StopReason.NODE_LIMIT
            self.seen.update(per_egg)
            matches[rule.name] = sum(per_egg.values())
            self.report.work += matches[rule.name]
            updated |= changed
            if changed:   # a run that changed nothing left every table as it was
                rows, present = _census(self.egraph)
            if rows > self.node_limit:
                return updated, matches, StopReason.NODE_LIMIT
            if self.run_work + self.report.work >= self.work_limit:
                return updated, matches, StopReason.WORK_LIMIT
            now = _now()
            if now - phase_start > self.limits.seconds or now - self.run_start > self.run_limits.seconds:
                return updated, matches, StopReason.TIME_LIMIT
        return updated, matches, None

    def bounded(self, rule, step_start: int) -> tuple[bool, dict, bool]:
        """Apply `rule` one egglog rule at a time, each under a back-off scheduler whose match limit is
        the matches it had before plus the new ones that fit below `NODE_SLACK` times the node limit
        (the analyses of this step's new nodes, which come after the step, counted as there already).
        Returns (updated, matches per egglog rule, held back): an egglog rule with more matches than
        its limit applies none, which egglog reports with no matches (`egglog_api.held_back`)."""
        updated, per_egg = False, {}
        for at, egg in enumerate(rule.egg):
            rows = _rows(self.egraph)
            room = int(self.node_limit * NODE_SLACK) - rows - (ROWS_PER_NEW_NODE - 1) * (rows - step_start)
            cap = self.seen.get((rule.name, at), 0) + max(room, 0) // self.rows_per_match[rule.name]
            scheduler = back_off(match_limit=cap)
            if egg.decl not in self._single:
                self._single[egg.decl] = ruleset(egg, name=f"{self.phase.name}-d{len(self._single)}")
            result = self.egraph.run(scheduler.scope(egg_run(self._single[egg.decl], scheduler=scheduler)))
            n = sum(v for key, v in result.num_matches_per_rule.items() if key == egg.decl)
            if api.held_back(result, n):
                return updated, per_egg, True
            per_egg[rule.name, at] = n
            updated |= result.updated
        return updated, per_egg, False

    def position(self, rule, name: str) -> int | None:
        """The position in `rule.egg` of the egglog rule that `name` names in this e-graph (None: not one of
        `rule`'s). The declaration is found by identity, else by equality (which hashes the whole rule), once
        per saturation."""
        key = (rule.name, name)
        if key not in self._positions:
            decl = api.rule_declaration(self.egraph, name)
            at = next((i for i, e in enumerate(rule.egg) if e.decl is decl), None)
            self._positions[key] = at if at is not None else \
                next((i for i, e in enumerate(rule.egg) if e.decl == decl), None)
        return self._positions[key]

    def run(self) -> PhaseReport:
        start, report, backoff = _now(), self.report, self.phase.backoff
        while True:
            if report.iterations >= self.limits.iterations:
                report.stop_reason = StopReason.ITERATION_LIMIT
                break
            it = report.iterations
            active = [r for r in self.phase.rules if self.banned_until.get(r.name, -1) < it]
            banned = len(active) < len(self.phase.rules)
            updated, step_matches, stopped = self.step(active, start)
            saturate_analysis(self.egraph)
            report.iterations += 1
            if self.on_step is not None:
                self.on_step(report.iterations)
            for name, n in step_matches.items():
                report.matches[name] += n
                if backoff is not None:
                    times = report.bans.get(name, 0)
                    if n > backoff.match_limit << times:
                        report.bans[name] = times + 1
                        self.banned_until[name] = it + (backoff.ban_length << times)
            if stopped is not None:
                report.stop_reason = stopped
                break
            if not updated and not banned:
                report.stop_reason = StopReason.SATURATED
                break
            if _rows(self.egraph) > self.node_limit:
                report.stop_reason = StopReason.NODE_LIMIT
                break
            now = _now()
            if now - start > self.limits.seconds or now - self.run_start > self.run_limits.seconds:
                report.stop_reason = StopReason.TIME_LIMIT
                break
        report.seconds = _now() - start
        return report


def saturate(egraph: EGraph, schedule, limits: Limits = Limits(), on_step=None) -> RunReport:
    """Run the phases of `schedule` (a Schedule or a list of Phases) in order; always returns a report.

    A node or time limit of the whole run stops every later phase; a phase's own limit ends that phase.
    `on_step(phase name, iteration, iteration limit)` is called after each step."""
    phases = list(getattr(schedule, "phases", schedule))
    limits = replace(limits, seconds=min(limits.seconds, limits.saturation_seconds))
    start = _now()
    api.time_only_reports(egraph)
    report = RunReport(StopReason.SATURATED)
    bar = progress.task("saturate", transient=True)   # a no-op unless the caller shows progress bars
    try:
        saturate_analysis(egraph)
        for phase in phases:
            runner = _PhaseRunner(egraph, phase, phase.limits or limits, start, limits, report.work)
            cap = (phase.limits or limits).iterations
            runner.on_step = lambda it, name=phase.name, cap=cap: (bar.update(
                f"saturate: phase {name}, iteration {it}", completed=it, total=cap),
                on_step is not None and on_step(name, it, cap))
            phase_report = runner.run()
            report.phases.append(phase_report)
            report.iterations += phase_report.iterations
            for name, n in phase_report.matches.items():
                report.matches[name] = report.matches.get(name, 0) + n
            for name, s in phase_report.rule_seconds.items():
                report.rule_seconds[name] = report.rule_seconds.get(name, 0.0) + s
            if phase_report.stop_reason is not StopReason.SATURATED:
                report.stop_reason = phase_report.stop_reason
            report.work += phase_report.work
            if phase_report.stop_reason in (StopReason.NODE_LIMIT, StopReason.WORK_LIMIT, StopReason.TIME_LIMIT):
                break
    except Exception as exc:  # egglog raises EggSmolError on a type conflict: a rule broke the analyses
        report.stop_reason = StopReason.ERROR
        report.error = f"{type(exc).__name__}: {exc}"
    else:
        report.enodes, report.eclasses = count(egraph)
        _mark(rs for _, rs in _RULESETS.values() if api.is_registered(egraph, rs))
    finally:
        bar.close()
    report.seconds = _now() - start
    return report
