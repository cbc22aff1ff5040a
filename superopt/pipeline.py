"""The pipeline for one specialization, the recipe on top:

    capture -> the loop passes (superopt/loops.py, superopt/regions.py, superopt/reroll.py)
            -> an earlier decision at other sizes (superopt/sizes.py), or symbolic extents at stand-ins
            -> the search: in segments (superopt/segmented.py), from the cache (superopt/entries.py), or whole
               (superopt/recipe.py, over the stages of superopt/stages.py)
            -> the backend (superopt/backends.py: jax, pallas or the NPU emulator) that runs the program.

`optimize` is the entry; `api.py` is the JAX transformation over it; `bench` and the command line go through it
too (`explain.alternatives` saturates in process, with its whole budget, to list alternatives).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax

from superopt import numerics as numerics_mode, regions, speculation
from superopt.backends import BACKENDS
from superopt.core.deadline import Deadline
from superopt.core.modes import Numerics
from superopt.core.serial import NotSerializable
from superopt.egraph.capture import Captured, capture, custom_calls
from superopt.entries import cached, rechecked, traced_like
from superopt.extract.extraction import Extraction, Method, program_cost
from superopt.loops import vectorize, vectorized_note
from superopt.options import Options
from superopt.recipe import whole
from superopt.report import BackendUse, CacheUse, Outcome
from superopt.reporting import as_captured, specialization
from superopt.reroll import reroll, rerolled_note
from superopt.reuse import program_key
from superopt.segmented import segmented
from superopt.segments import split
from superopt.sizes import Decision, Sizes, stand_ins
from superopt.stages import (Kept, Search, Specialization, Stages, differentiated_program, guard_check,
                             reference_program, runs_here, schedule_of, traced, worth_it)


EXTRACTORS = ("greedy", "ilp")


# ---- the pipeline ----

def optimize(fn: Callable, args: tuple, options: Options, example=None, store=None, executor: str | None = None,
             sizes: Sizes | None = None) -> Specialization:
    """The pipeline for one specialization under `options` (superopt/options.py, as `superopt()` validated
    them); never returns a program that disagrees with `fn`. `args` may be abstract (`jax.ShapeDtypeStruct`
    leaves); `example`, the call's concrete flat arguments where there are some, is one more input the NPU
    program is checked on. `store` is the persistent cache (superopt/cache.py; None: none), `executor` where
    distinct segments are optimized (superopt/workers.py). `sizes`: the function's decisions at other argument
    sizes (superopt/sizes.py), which this one may take and adds to."""
    backend = options.backend
    spec = _jax_specialization(fn, args, options, store, executor, guard=backend == "jax", sizes=sizes)
    if backend != "jax" and (spec.original.hidden_outputs or spec.report.kind is Outcome.KEPT_WHOLE):
        # Effects run in the user's order only in the JAX program; the other backends check their program on
        # inputs of their own, which the user's callbacks must not see.
        what = "effects (debug prints or callbacks)" if spec.original.hidden_outputs else "a program kept whole"
        spec.report.backend = BackendUse.on_jax(f"the program has {what}, which run only on the jax backend")
        return spec
    return BACKENDS[backend].lower(spec, options, example=example)


def _jax_specialization(fn: Callable, args: tuple, options: Options, store=None, executor: str | None = None,
                        guard: bool = False, sizes: Sizes | None = None) -> Specialization:
    """Capture, then the specialization every backend starts from: an earlier decision at other sizes
    (`sizes`), optimized whole, from the cache, or in segments (superopt/segments.py), each distinct one once.
    `guard`: under strict numerics, a guarded program may be chosen (`guarded`; the JAX backend's only)."""
    tgt, numerics = options.target, options.numerics
    timer = Stages()
    call = Deadline(options.limits.seconds)   # the whole call's, in segments (each whole run keeps its own)
    captured = timer("capture", capture, fn, args)
    symbolic = sorted({str(d) for shape, _ in captured.in_avals for d in shape if not isinstance(d, int)})
    if symbolic:   # the cost model, the cache key and the checker's inputs all need sizes
        again = functools.partial(_jax_specialization, fn, options=options, store=store, executor=executor,
                                  guard=guard)
        return _symbolic(captured, args, again, options, timer, symbolic)
    if not (captured.kept_whole or captured.graph.hidden_outputs) and any(op.name == "scan"
                                                                          for op in captured.graph.opaque):
        lifted, done = timer("vectorize", vectorize, captured.graph)
        if done:
            captured = dataclasses.replace(captured, graph=lifted, traced=captured.graph,
                                           vectorized=vectorized_note(done))
    if not (captured.kept_whole or captured.graph.hidden_outputs) and any(op.name in regions.BODIES
                                                                          for op in captured.graph.opaque):
        body = _body_optimizer(options, store, executor, guard)
        searched = timer("bodies", regions.optimized_bodies, captured.graph, body)
        note = "; ".join(filter(None, [captured.vectorized, searched.note()]))
        if searched.changed:
            captured = dataclasses.replace(captured, graph=searched.graph, traced=traced(captured), vectorized=note)
        else:
            captured = dataclasses.replace(captured, vectorized=note)
    if not (captured.kept_whole or captured.graph.opaque or captured.graph.hidden_outputs):
        rolled, loops = timer("reroll", reroll, captured.graph)
        if loops:
            captured = dataclasses.replace(captured, graph=rolled, traced=traced(captured),
                                           rerolled=rerolled_note(captured.graph, rolled))
    schedule, left_out = schedule_of(options.rulesets, numerics, tgt.kind)
    # a guarded program's search adds the rules strict leaves out (the "reals" ones) and assumes the domain
    # conditions the analysis cannot prove (numerics.speculative)
    guarded = numerics_mode.speculative(schedule_of(options.rulesets, Numerics.FAST, tgt.kind)[0]) if guard else None
    if guarded is not None and not (left_out and numerics == Numerics.STRICT) and not numerics_mode.assumes(guarded):
        guarded = None
    search = Search(options, schedule, left_out, guarded, on_xla=guard and runs_here(tgt))
    reusable = sizes is not None and options.memory_budget is None and not (captured.kept_whole or
                                                                            captured.graph.hidden_outputs)
    fingerprint = search.fingerprint() if reusable else None
    if reusable:
        match = sizes.find(captured.in_avals, captured.graph, fingerprint)
        spec = match and timer("sizes", _at_other_sizes, captured, search, timer, match)
        if spec:
            return spec
    spec = _searched(captured, search, store, executor, timer, call)
    if reusable and spec.report.kind in REUSED_OUTCOMES:
        sizes.remember(Decision(captured.in_avals, captured.graph, fingerprint, spec.report.kind,
                                spec.report.reason, spec.term if spec.report.optimized else None, spec.report.run))
    return spec


def _searched(captured: Captured, search: Search, store, executor: str | None, timer: Stages,
              call: Deadline) -> Specialization:
    """The captured program's specialization, searched: in segments, from the cache, or whole."""
    segments = key = None
    uncached = ""   # why a program is not stored, where it has no data form
    if not (captured.kept_whole or captured.graph.hidden_outputs):
        try:
            # a budget is for the whole program's peak, not a segment's; segments cut no opaque primitive
            if search.memory_budget is None and not captured.graph.opaque:
                segments = timer("segment", split, captured.graph)
            if store is not None and not segments:
                key = program_key(captured.graph, search.fingerprint())
        except NotSerializable as exc:
            segments = key = None
            uncached = str(exc)
    if segments:
        return segmented(captured, segments, search, store, executor, timer, call)
    dropped = False
    if key is not None:
        found = timer("cache", cached, store, key, "program", captured.graph, captured.graph.consts)
        if found is not None and search.verify:
            found = timer("verify (cache)", rechecked, found, store, key, "program", captured,
                          search.numerics)
            dropped = found is None
        if found is not None:
            spec = specialization(captured, search, timer, *found)
            spec.report.cache = CacheUse("hit")
            return spec
    spec, entry = whole(captured, search, timer, store)
    if key is not None:
        why = store.put(key, "program", entry) if entry is not None else "a time limit depends on the machine's load"
        spec.report.cache = CacheUse("miss", stored=why is None, dropped=dropped, why=why or "")
    elif uncached:
        spec.report.cache = CacheUse("unstorable", why=uncached)
    return spec


# ---- other sizes (superopt/sizes.py) ----

# The decisions another call at other sizes may take: not one that depends on the machine's load or failed.
REUSED_OUTCOMES = (Outcome.OPTIMIZED, Outcome.NO_GAIN, Outcome.SAME_EXECUTABLE, Outcome.BELOW_THRESHOLD,
                   Outcome.VERIFICATION_FAILED)


def _at_other_sizes(captured: Captured, search: Search, timer: Stages, match) -> Specialization | None:
    """The specialization an earlier decision at other sizes gives the captured program (superopt/sizes.py),
    or None where its program, renamed to these sizes, does not hold here: it is searched instead."""
    decision = match.decision
    where = f"the decision at argument shapes {decision.sizes_text()}, renamed to these sizes"
    again = "superopt(..., reuse_sizes=False) searches every size"
    if decision.outcome is not Outcome.OPTIMIZED:
        spec = specialization(captured, search, timer, decision.run, decision.outcome, decision.reason, None)
        spec.report.sizes = f"{where} ({again})"
        return spec
    original, tgt = traced(captured), search.target
    try:
        graph, words = speculation.guard_again(match.chosen, decision.chosen.guard, captured, original)
        program = traced_like(graph, original)
        costs = program_cost(original, tgt)
        check = guard_check(graph)
        cost, node_costs = program_cost(match.chosen, tgt)
        extra = program_cost(check, tgt)[0] if check is not None else 0.0
        if graph.guard is not None and graph.guard.conditions and extra > speculation.MAX_CHECK_SHARE * costs[0]:
            return None
        chosen = Extraction(graph, cost + extra, node_costs, Method(
            "reused", f"the program chosen at argument shapes {decision.sizes_text()}, renamed to these sizes",
            guard=words or ""))
        worth_it(chosen, costs[0], (), None)
        if search.verify and not speculation.holds_here(graph, check, captured, original, search.numerics):
            return None
    except Kept:
        return None   # no longer a gain at these sizes: searched at them
    except Exception:   # noqa: BLE001  - a renaming that does not hold here (its types, a malformed attribute)
        return None
    spec = specialization(captured, search, timer, decision.run, Outcome.OPTIMIZED, "", chosen, program,
                           costs=costs)
    spec.report.sizes = f"{where}: priced again and checked on superopt's inputs at these sizes ({again})"
    return spec


def _symbolic(captured: Captured, args: tuple, again: Callable, options: Options, timer: Stages,
              symbols: list) -> Specialization:
    """A program with symbolic argument extents (`jax.export` with a symbolic batch): optimized at stand-in
    extents, taken at second stand-ins as a decision at other sizes is (which checks it there, so that no
    number the rewrites made is mistaken for an extent), and renamed to the symbols. Where any step does
    not hold, the program runs as captured."""
    first = stand_ins(captured.in_avals, captured.graph)
    second = first and stand_ins(captured.in_avals, captured.graph, skip=set(first.values()))
    kept = f"symbolic dimensions ({', '.join(symbols)}): "
    if not (first and second):
        return as_captured(captured, options, timer, kept + "an extent is an expression of them, so the "
                           "program runs as captured")

    def at(stand):
        return tuple(jax.ShapeDtypeStruct(tuple(stand.get(d, d) for d in a.shape), a.dtype,
                                          weak_type=getattr(a, "weak_type", False)) for a in args)
    decided = Sizes()
    spec = again(at(first), sizes=decided)
    if spec.report.optimized and spec.term.guard is not None and spec.term.guard.exponent is not None:
        # a guard's bound on the arguments holds for the stand-in's sums, not for longer ones: the program
        # strict numerics chooses without one
        decided = Sizes()
        spec = again(at(first), sizes=decided, guard=False)
    if spec.report.kind not in REUSED_OUTCOMES:
        return as_captured(captured, options, timer, kept + f"at stand-in sizes it was {spec.report.outcome}")
    if spec.report.optimized:
        checked = again(at(second), sizes=decided)
        if not checked.report.sizes or not checked.report.optimized:
            return as_captured(captured, options, timer, kept + "the program chosen at stand-in sizes does not "
                               "hold at other ones, so the program runs as captured")
    match = decided.find(captured.in_avals, captured.graph)
    if match is None:
        return as_captured(captured, options, timer, kept + "the program is not the same at every size, "
                           "so it runs as captured")
    stand = ", ".join(f"{s}={v}" for s, v in first.items())
    if match.chosen is None:
        return as_captured(captured, options, timer, f"{spec.report.reason} (decided at {stand} for the "
                           f"symbolic dimensions {', '.join(symbols)})", spec.report.kind)
    try:
        graph, _ = speculation.guard_again(match.chosen, match.decision.chosen.guard, captured, captured.graph)
        program = traced_like(graph, captured.graph)
    except Exception as exc:   # noqa: BLE001
        return as_captured(captured, options, timer, kept + "the program chosen at stand-in sizes does not "
                           f"trace with them ({type(exc).__name__})")
    report = dataclasses.replace(spec.report, stage_seconds=timer.seconds,
                                 sizes=f"symbolic dimensions {', '.join(symbols)}: the program chosen at {stand} "
                                       "(and checked at other stand-ins), renamed to them; the cost line is at "
                                       f"{stand}")
    reference = reference_program(captured)
    return Specialization(program, report, graph, captured.graph, captured.out_tree, captured.in_avals,
                          reference=reference, custom_calls=custom_calls(captured.jaxpr),
                          differentiated=differentiated_program(captured, reference), options=options)


def _body_optimizer(options: Options, store, executor: str | None, guard: bool) -> Callable:
    """What optimizes a loop's or branch's body (superopt/regions.py): the pipeline of the program around it,
    on the body as a program of its own (its own cache entry, its own verification), with no memory budget
    (a budget is the whole program's): the body's program traced back to a jaxpr (None where it is kept), and
    the rules that fired."""
    whole_program_only = dataclasses.replace(options, memory_budget=None)

    def optimize(closed):
        spec = _jax_specialization(regions.as_function(closed), regions.avals_of(closed), whole_program_only, store,
                                   executor, guard=guard)
        fired = tuple(spec.report.run.fired)
        if spec.report.kind is not Outcome.OPTIMIZED:
            return None, fired
        return regions.retraced(spec.program, closed), fired
    return optimize
