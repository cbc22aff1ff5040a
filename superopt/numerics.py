"""The numerics contract's two modes, and which rules each one lets run.

Every rule says in which sense its two sides are equal (`Rule.numerics`, rewrites/rule.py):
  "exact"    - equal in IEEE arithmetic;
  "rounding" - the same real function, differing by rounding only: finite, NaN and inf in the same places
               for every input (the checker proves it on NaN, +-inf, -0, subnormals and values near the
               dtype's largest);
  "order"    - the same products summed in another order or grouping: as "rounding", except where a
               partial sum overflows in one order and not the other (terms adding up past the dtype's
               largest value), an order XLA does not fix either;
  "reals"    - equal over the reals only: such a rewrite can overflow where the original does not (or the
               other way round), so it may turn a finite result into inf.

`numerics="strict"` (the default) runs the first three kinds only, so every program superopt returns keeps the
contract of README.md ("Numerics contract"). `numerics="fast"` also runs "reals" rules, and the report lists
each one that fired.
"""
from __future__ import annotations

from superopt.core.modes import Numerics
from superopt.egraph.signatures import CONSTRUCTORS, LIST
from superopt.rewrites.pattern import TENSOR, App, Const, Var
from superopt.rewrites.rule import speculating
from superopt.rewrites.schedule import Phase, Schedule

MODES = tuple(mode.value for mode in Numerics)   # core/modes.py declares them
LEGAL = {Numerics.STRICT: ("exact", "rounding", "order"), Numerics.FAST: ("exact", "rounding", "order", "reals")}
check_mode = Numerics.of   # the mode, or a one-line error naming the bad value and the valid ones


def legal(rule, numerics: str) -> bool:
    """May `rule` run in this mode?"""
    return rule.numerics in LEGAL[numerics]


def restrict(schedule: Schedule, numerics: str) -> Schedule:
    """`schedule` with the rules this mode forbids left out of every phase (a phase left empty stays, so the
    report still names it)."""
    return Schedule(tuple(Phase(ph.name, tuple(r for r in ph.rules if legal(r, numerics)), ph.limits, ph.backoff)
                          for ph in schedule.phases))


def left_out(schedule: Schedule, numerics: str) -> list[str]:
    """Names of the rules of `schedule` this mode does not run."""
    return [r.name for ph in schedule.phases for r in ph.rules if not legal(r, numerics)]


def overflow_rewrites(schedule: Schedule, fired: dict) -> dict[str, int]:
    """The rules of `schedule` that can change overflow ("reals") and fired: name -> matches."""
    reals = {r.name for ph in schedule.phases for r in ph.rules if r.numerics == "reals"}
    return {name: n for name, n in fired.items() if name in reals}


def speculative(schedule: Schedule) -> Schedule:
    """`schedule` with each rule that has domain conditions (`given`) replaced by its copy that assumes them
    where the analysis cannot prove them, for a guarded program's search (superopt/speculation.py, `guarded`)."""
    return Schedule(tuple(Phase(ph.name, tuple(speculating(r) for r in ph.rules), ph.limits, ph.backoff)
                          for ph in schedule.phases))


def assuming_rules(schedule: Schedule | None) -> set[str]:
    """Names of the rules of `schedule` that assume domain conditions."""
    return {r.name for ph in (schedule.phases if schedule else ()) for r in ph.rules
            if getattr(r, "speculative", False)}


def assumes(schedule: Schedule | None, graph=None) -> bool:
    """Whether `schedule` has a rule that assumes a domain condition; with `graph` (a captured program), one
    whose left-hand side matches some node of it, by ops alone (a screen before a search: a rule that only
    matches what other rules derive is not looked for)."""
    by_op: dict[str, list[int]] = {}
    for i in graph.live() if graph is not None else ():
        by_op.setdefault(graph.nodes[i].op, []).append(i)
    for ph in schedule.phases if schedule else ():
        for r in ph.rules:
            if getattr(r, "speculative", False) and (graph is None or any(
                    _matches(lhs, graph, i) for lhs, _ in r.pairs for i in by_op.get(_root_op(lhs), ()))):
                return True
    return False


def could_fire(schedule: Schedule, frozen, which) -> bool:
    """Whether a rule of `schedule` that `which` selects has a left-hand side whose ops (and op names) match an
    e-class of `frozen`, a saturated e-graph, a variable the same class wherever it appears (conditions and
    other attributes are not looked at). A search that adds those rules to the ones that saturated `frozen`
    starts from a part of it, and it grows beyond `frozen` only through them: where none matches, it ends
    where `frozen` is (`speculation.guarded`)."""
    by_fn: dict[str, list] = {}
    for cls, nodes in frozen.classes.items():
        for n in nodes:
            by_fn.setdefault(n.fn, []).append(cls)
    for ph in schedule.phases:
        for r in ph.rules:
            if which(r) and any(not isinstance(lhs, App) or lhs.fn not in CONSTRUCTORS
                                or any(next(_bindings(lhs, frozen, cls, {}), None) is not None
                                       for cls in by_fn.get(lhs.fn, ()))
                                for lhs, _ in r.pairs):
                return True
    return False


def _bindings(pattern, frozen, cls, env: dict):
    """The bindings of `pattern`'s tensor variables to e-classes (extending `env`) under which a node of
    `cls` has its ops at its root and below."""
    if isinstance(pattern, Var):
        if pattern.sort not in (TENSOR, LIST):
            yield env
        elif env.get(pattern.name, cls) == cls:
            yield {**env, pattern.name: cls}
        return
    if not isinstance(pattern, App) or pattern.fn not in CONSTRUCTORS:
        yield env
        return
    kids = [a for a in pattern.args if a.sort in (TENSOR, LIST)]
    prims = [a for a in pattern.args if a.sort not in (TENSOR, LIST)]
    for n in frozen.classes.get(cls, ()):
        if n.fn != pattern.fn or len(kids) != len(n.children):
            continue
        if any(isinstance(p, Const) and isinstance(p.value, str) and p.value != v for p, v in zip(prims, n.args)):
            continue
        yield from _children(kids, n.children, frozen, env)


def _children(kids: list, classes: tuple, frozen, env: dict):
    if not kids:
        yield env
        return
    for bound in _bindings(kids[0], frozen, classes[0], env):
        yield from _children(kids[1:], classes[1:], frozen, bound)


def assumed_operands(schedule: Schedule | None, graph) -> set[tuple[str, int]]:
    """(condition, node of `graph`) for each domain condition that a rule of `schedule` assuming one would
    put on a node where its left-hand side matches `graph` by ops (as `assumes` looks), the same node
    wherever a variable appears: what a check of such a guard reads, at the least."""
    by_op: dict[str, list[int]] = {}
    for i in graph.live():
        by_op.setdefault(graph.nodes[i].op, []).append(i)
    out = set()
    for ph in schedule.phases if schedule else ():
        for r in ph.rules:
            if not getattr(r, "speculative", False):
                continue
            for lhs, _ in r.pairs:
                for i in by_op.get(_root_op(lhs), ()):
                    env = _bound(lhs, graph, i, {})
                    if env is not None:
                        out.update((c.name, env[c.arg.name]) for c in r.given if c.arg.name in env)
    return out


def _bound(pattern, graph, i: int, env: dict) -> dict | None:
    """`_matches`, with the tensor variables bound to node ids (one node per variable), or None."""
    if getattr(pattern, "fn", None) is None:   # a variable
        if getattr(pattern, "sort", None) != TENSOR:
            return env
        return {**env, pattern.name: i} if env.get(pattern.name, i) == i else None
    node = graph.nodes[i]
    if _root_op(pattern) != node.op:
        return None
    args = pattern.args[1:] if pattern.fn in _FAMILIES else pattern.args
    tensors = [a for a in args if a.sort == TENSOR]
    if len(tensors) != len(node.inputs):
        return None
    for a, j in zip(tensors, node.inputs):
        env = _bound(a, graph, j, env)
        if env is None:
            return None
    return env


def _root_op(pattern) -> str | None:
    """The op a rule's side matches at its root: a family's op by name (`unary("log", x)`: log), or the
    constructor's (`matmul`); None for a variable op."""
    fn, args = getattr(pattern, "fn", None), getattr(pattern, "args", ())
    if fn in _FAMILIES:
        return getattr(args[0], "value", None) if args else None
    return fn


def _matches(pattern, graph, i: int) -> bool:
    """Whether node `i` of `graph` has the ops of `pattern` (a rule's side) at its root and below: a tensor
    variable matches any node; conditions, attributes and shapes are not looked at."""
    if getattr(pattern, "fn", None) is None:   # a variable
        return True
    node = graph.nodes[i]
    if _root_op(pattern) != node.op:
        return False
    args = pattern.args[1:] if pattern.fn in _FAMILIES else pattern.args   # a family's first: its op's name
    tensors = [a for a in args if a.sort == TENSOR]
    return len(tensors) == len(node.inputs) and all(_matches(a, graph, j) for a, j in zip(tensors, node.inputs))


_FAMILIES = ("unary", "binary", "reduce", "argreduce", "pool", "scan")
