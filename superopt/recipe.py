"""The recipe for one program: saturate, choose (and, under strict numerics, a guarded program:
superopt/speculation.py), lower, compare with the original's executable, verify, and time where asked. A whole
program (`whole`) and a segment in a worker (superopt/segmented.py) are both optimized by `optimize_program`.
"""
from __future__ import annotations

from typing import Callable

from superopt import stages
from superopt.core.deadline import Deadline, TimeLimit
from superopt.core.ir import carry_scopes
from superopt.egraph.capture import Captured
from superopt.egraph.limits import RunReport, StopReason
from superopt.entries import entry_of
from superopt.extract.extraction import Extraction, Method, as_run, program_cost
from superopt.extract.memory import peak_memory
from superopt.lowering.jax import lower
from superopt.report import Outcome
from superopt.reporting import specialization
from superopt.reuse import prepare_rules, save_rules
from superopt.speculation import guarded
from superopt.stages import (Kept, Search, Specialization, Stages, check, checking_reference, choose, measured,
                             nothing_to_search, on_own_inputs, ran_out, reference_program, same_executable, traced,
                             worth_it)


def whole(captured: Captured, search: Search, timer: Stages, store=None) -> tuple[Specialization, dict | None]:
    """The captured program optimized whole: the specialization, and the cache entry of its result. The
    compiled rules come from `store` where it has them, and are kept there where it had not."""
    reference = checking_reference(captured)
    costs = program_cost(traced(captured), search.target)
    run, outcome, reason, chosen, program = optimize_program(captured, reference, search, timer, costs[0], store)
    if store is not None:
        save_rules(search.schedule, store)
        if search.guarded is not None and any((r.numerics == "reals" or getattr(r, "speculative", False))
                                               and getattr(r, "compiled", False)
                                               for ph in search.guarded.phases for r in ph.rules):   # one has run
            save_rules(search.guarded, store)
    # the specialization's reference is the user's program as JAX runs it (backends check against it and
    # differentiate it), not the evaluator verification may have used
    spec = specialization(captured, search, timer, run, outcome, reason, chosen, program, costs=costs)
    return spec, entry_of(run, outcome, reason, chosen, len(captured.graph.consts))


def optimize_program(captured: Captured, reference: Callable, search: Search, timer: Stages,
                     cost_before: float, rules=None, segment: str | None = None) -> tuple:
    """Saturate, choose, lower to JAX and check against `reference`: (run report, outcome, reason, the
    extraction (None where none was made or the program is kept whole), the lowered program or None).
    `rules`, a store or a parent's data, is where the compiled rules may come from (reuse.prepare_rules).
    A `segment`'s (its key's) search (saturation, extraction's optional work) is bounded by
    `Limits.segment_seconds` of CPU time; the best program it found is lowered and verified within the
    call's time, the original's outputs on the random sets kept under its key (`verify.remembered`)."""
    tgt, limits, numerics = search.target, search.limits, search.numerics
    deadline = Deadline(limits.seconds)   # one clock: Limits.seconds bounds every stage of the call together
    original = traced(captured)
    run, chosen, program = RunReport(StopReason.SATURATED), None, None
    try:
        if captured.kept_whole:
            raise Kept(Outcome.KEPT_WHOLE, captured.kept_whole)
        deadline.check("capture")
        looking = Deadline.cpu(limits.segment_seconds, also=deadline) if segment is not None else deadline
        if nothing_to_search(captured.graph):   # no saturation: the program as the loop passes left it
            if captured.traced is None:
                raise Kept(Outcome.NO_GAIN, "nothing for the search: the program is primitives superopt keeps as "
                                            "they are (loops, whose bodies were searched on their own, sorts) and "
                                            "constants")
            chosen = Extraction(captured.graph, *program_cost(captured.graph, tgt),
                                Method("none", "nothing for the search besides the loops' passes"))
        else:
            if rules is not None:
                timer("rules", prepare_rules, search.schedule, rules)
            saturated = stages.saturate(captured, search.schedule, limits, looking, timer)
            run = saturated.run
            chosen = as_run(choose(saturated, tgt, search.extractor, search.memory_budget, deadline, limits, timer,
                                   looking, numerics), tgt)
            if search.guarded is not None and segment is None:
                chosen = guarded(captured, search, chosen, deadline, looking, timer, rules, saturated)
        worth_it(chosen, cost_before, (peak_memory(original), peak_memory(chosen.graph)), search.memory_budget)
        chosen.graph.scopes = carry_scopes(original, chosen.graph)   # the user's named scopes, kept
        # A changed program is returned only if it was verified before the deadline; else the original runs.
        for stage_name, step in (("extract", None), ("lower", lambda: lower(chosen.graph))):
            if deadline.expired():
                raise Kept(Outcome.TIME_LIMIT, f"time limit ({stage_name}: the call's {limits.seconds:g} s ran out)")
            if step is not None:
                program = timer(stage_name, step)
        checked = on_own_inputs(chosen.graph, program)   # on superopt's own inputs: debug prints silent
        if search.on_xla and timer("compare", same_executable, reference, chosen.graph, captured, checked):
            raise Kept(Outcome.SAME_EXECUTABLE, "XLA compiles the chosen program to the original's executable: "
                                                "nothing to gain, nothing verified")
        if search.verify:
            timer("verify", check, reference, checked, captured, numerics, run.fired, segment, chosen.graph)
            if deadline.expired():
                raise Kept(Outcome.TIME_LIMIT, f"time limit (verify: the call's {limits.seconds:g} s ran out)")
        if search.tune:   # both programs without their debug prints: superopt's own inputs
            chosen.method = chosen.method.but(measured=timer("tune", measured, reference_program(captured),
                                                             on_own_inputs(chosen.graph, program), captured))
        return run, Outcome.OPTIMIZED, "", chosen, program
    except Kept as kept:
        outcome, reason = kept.outcome, kept.reason
    except TimeLimit as exc:   # the original is always correct; no unverified program is returned
        outcome, reason = Outcome.TIME_LIMIT, ran_out(exc, limits)
    return run, outcome, reason, None if outcome is Outcome.KEPT_WHOLE else chosen, None
