"""The guarded search (speculate and check): a second search, with the rules strict numerics leaves out or that
assume a domain condition, whose program runs where a check at run time holds and the original elsewhere
(extract/guard.py builds the check; a guarded `Graph` carries it). Also the guard of a program renamed to other
argument sizes (superopt/sizes.py), derived again at them.
"""
from __future__ import annotations

import dataclasses
import math

from superopt import numerics as numerics_mode, stages
from superopt.core import verify as verification
from superopt.core.deadline import Deadline
from superopt.core.ir import Graph, Guard
from superopt.core.reference import evaluate as evaluate_reference
from superopt.egraph.capture import Captured
from superopt.egraph.limits import StopReason
from superopt.extract import guard as guarding
from superopt.extract.extraction import Extraction, as_run, program_cost
from superopt.report import Outcome
from superopt.reuse import prepare_rules
from superopt.stages import MIN_PREDICTED_GAIN, Kept, Saturated, Search, Stages, choose, guard_check, traced


# A guarded program's check runs on every call, and where it fails the original runs after it: a check of domain
# conditions (x > 0, |x| moderate), which ordinary data fails as often as not, may cost at most this share of the
# original's predicted time, so that such calls are at most that much slower than jax.jit's. (A check that only
# excludes overflow fails on NaN, inf or huge elements alone, which ordinary data does not hold: bench/guard.py.)
MAX_CHECK_SHARE = 0.05


def guarded(captured: Captured, search: Search, strict: Extraction, deadline: Deadline, looking: Deadline,
            timer: Stages, rules=None, searched: Saturated | None = None) -> Extraction:
    """`strict`, or a guarded program where one is predicted cheaper (extract/guard.py): the program a second
    search finds, run where a check at run time holds, the original elsewhere. The second search
      - adds the rules equal over the reals only (under strict numerics, for a program of polynomial ops with a
        sum or a matrix product, which they re-associate or factor): the check proves from the call's arguments
        that no intermediate of either program overflows;
      - assumes the domain conditions of rules (`given`: x >= 0, x positive, x finite) that the analysis cannot
        prove of the captured program: the check tests each assumed condition on the values of the node it was
        assumed of.
    `rules`: where the compiled rules may come from, as for the strict search. `searched`: the strict search's
    e-graph; where it saturated and no rule the second search adds matches it, that search could only end
    there, and is not run (`numerics.could_fire`)."""
    program, original, tgt = captured.graph, traced(captured), search.target
    reals = search.numerics == "strict" and guarding.worth_trying(program)
    if reals:
        args = guarding.checked_args(original)
        check = program_cost(guarding.check_graph(0, args, original), tgt)[0]
        reals = check < strict.cost * (1 - MIN_PREDICTED_GAIN)   # else no search can pay for the check
    domain = numerics_mode.assumes(search.guarded, program)
    if domain and (share := timer("screen", least_check_share, program, search)) > MAX_CHECK_SHARE:
        domain = False
        strict = dataclasses.replace(strict, method=strict.method.but(
            no_guard="not looked for: a guarded program on domain conditions, " + (
                f"whose least check would add {share:.0%} of the original's time to a call where it fails (at most "
                f"{MAX_CHECK_SHARE:.0%})" if math.isfinite(share) else "as no rule assuming one matches the program")))
    if not (reals or domain):
        return strict
    schedule = search.guarded if reals or search.numerics == "fast" else numerics_mode.restrict(search.guarded,
                                                                                               "strict")
    if searched is not None and all(ph.stop_reason is StopReason.SATURATED for ph in searched.run.phases) and \
            not timer("screen", numerics_mode.could_fire, schedule, searched.frozen,
                      lambda r: r.numerics == "reals" or getattr(r, "speculative", False)):
        return strict
    if rules is not None:
        timer("rules", prepare_rules, schedule, rules)
    try:
        saturated = stages.saturate(captured, schedule, search.limits, looking, timer, origins=domain)
    except Kept:
        return strict
    if saturated.frozen is None:   # the second search failed or ran out of time: the strict program stands
        return strict
    fired = numerics_mode.overflow_rewrites(schedule, saturated.run.fired) if search.numerics == "strict" else {}
    conditions = timer("guard", guarding.unproven, program, saturated.frozen.assumed, saturated.facts) \
        if domain else ()
    if not (fired or conditions):   # the strict search's e-graph again: its extraction would choose the same
        return strict
    try:
        fast = as_run(choose(saturated, tgt, search.extractor, search.memory_budget, deadline, search.limits, timer,
                             looking, search.numerics), tgt)   # strict: the cone stays as captured here too
    except Kept:
        return strict
    # only the results the search changed need the bound: the others (a sort, a loop beside the sum) are the
    # same ops in both programs
    changed = guarding.changed_results(program, fast.graph)
    if not (fired or conditions) or not changed:
        return strict
    exponent, args, words, assuming = None, (), [], ()
    if fired:
        bound = range_bound(captured, original, fast.graph, changed)
        if bound is None:
            return strict
        exponent, args, said = bound
        words.append(said)
    if conditions:
        assuming = tuple(sorted(name for name, n in saturated.run.fired.items() if n and name in
                                numerics_mode.assuming_rules(schedule)))
        words.append(guarding.describe_conditions(program, conditions))
    graph = dataclasses.replace(fast.graph, guard=Guard(exponent, args, program, conditions))
    check = program_cost(guard_check(graph), tgt)[0]
    if not fast.cost + check < strict.cost * (1 - MIN_PREDICTED_GAIN):
        return strict
    share = check / program_cost(program, tgt)[0]
    if conditions and share > MAX_CHECK_SHARE:
        return dataclasses.replace(strict, method=strict.method.but(no_guard=(
            f"not taken: a guarded program predicted {strict.cost / (fast.cost + check):.2f}x faster, whose check "
            f"would add {share:.0%} of the original's time to a call where it fails (at most "
            f"{MAX_CHECK_SHARE:.0%})")))
    method = fast.method.but(guard="; and ".join(words), reals_rules=tuple(sorted(fired)), assuming_rules=assuming)
    return Extraction(graph, fast.cost + check, fast.node_costs, method, fast.declined, fast.memory)


def least_check_share(program: Graph, search: Search) -> float:
    """The share of `program`'s cost that the least check a guard on domain conditions could have would add
    (one condition on one node where a rule assuming it matches the captured program:
    `numerics.assumed_operands`). Past `MAX_CHECK_SHARE` any such guard is declined, and the search that would
    find one is not run. A rule that matches only what other rules derive is not looked for (as
    `numerics.assumes`)."""
    tgt = search.target
    least = min((program_cost(guarding.check_graph(None, (), program, conditions=(c,), base=program), tgt)[0]
                 for c in numerics_mode.assumed_operands(search.guarded, program)), default=math.inf)
    return least / program_cost(program, tgt)[0]


def guard_again(chosen: Graph, guard: Guard | None, captured: Captured, original: Graph) -> tuple[Graph, str]:
    """`chosen` (a renamed program, without a guard) guarded as `guard` was at the earlier sizes, its bound
    derived again at these (`guarded`), and the guard's words; `chosen` itself where `guard` is None."""
    if guard is None:
        return chosen, ""
    program, words, exponent, args = captured.graph, [], None, ()
    if guard.exponent is not None:
        bound = range_bound(captured, original, chosen, guarding.changed_results(program, chosen))
        if bound is None:
            raise Kept(Outcome.NO_GAIN, "the bound does not hold at these sizes")
        exponent, args, said = bound
        words.append(said)
    if guard.conditions:
        words.append(guarding.describe_conditions(program, guard.conditions))
    return dataclasses.replace(chosen, guard=Guard(exponent, args, program, guard.conditions)), "; and ".join(words)


def range_bound(captured: Captured, original: Graph, chosen: Graph, changed) -> tuple[int, tuple, str] | None:
    """A guard's bound on the arguments under which no intermediate of `original` or `chosen` overflows, for the
    results `changed` (the others are the same ops in both): (the exponent of the bound, the arguments
    checked, the report's words), or None where no bound holds. The program the search started from computes
    the original's intermediates (a loop batched or written out, rows re-rolled: the same values, sums in
    another order), which the bound reads where the original's loops are opaque to it."""
    parts = [guarding.results_only(g, changed) for g in (original, captured.graph, chosen)]
    exponent = guarding.exponent(*parts[1:]) if captured.traced is not None else guarding.exponent(*parts)
    if exponent is None:
        return None
    args = guarding.checked_args(parts[0], parts[2])
    return exponent, args, (f"every element of arguments {', '.join(map(str, args))} is finite and at most "
                            f"2**{exponent} in magnitude")


def holds_here(graph: Graph, check: Graph | None, captured: Captured, original: Graph, numerics: str) -> bool:
    """Whether `graph` (a renamed program; `check`, its guard's check) agrees with `original` on verification's
    first random input set, both by the reference evaluator, as a cache entry is checked (`rechecked`), and,
    where it is guarded, on the first set its check passes (a domain set, where it has conditions): its
    rewritten side must run."""
    sets = [verification.random_args(captured.in_avals, 0)]
    if graph.guard is not None and graph.guard.conditions:
        sets += [verification.domain_args(captured.in_avals, 0, s) for s in verification.DOMAIN_SCALES]
    for args in sets:
        runs = check is None or evaluate_reference(check, args)[0] == 0
        side = dataclasses.replace(graph, guard=None) if runs else graph.guard.fallback
        if verification.judge(evaluate_reference(original, args), evaluate_reference(side, args),
                              lambda: evaluate_reference(original, args, precise=True), numerics):
            return False
        if runs:
            return True
    return False
