"""A program optimized in segments (superopt/segments.py cuts them): each distinct segment once, from the cache or
in worker processes (superopt/workers.py), stitched back into one program, then the windows around its seams
searched again; the report says how many of each.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from superopt.core.deadline import Deadline, TimeLimit
from superopt.core.ir import Graph, unfused
from superopt.core.serial import digest
from superopt.egraph.capture import Captured
from superopt.egraph.limits import RunReport, StopReason
from superopt.entries import cached, entry_of, from_entry, rechecked
from superopt.extract.extraction import Extraction, Method, program_cost
from superopt.lowering.jax import lower
from superopt.recipe import optimize_program
from superopt.report import Outcome, SeamsUse, SegmentsUse
from superopt.reporting import specialization
from superopt.reuse import combined_run, compiled_rules, prepare_rules, run_from_data, run_to_data, save_rules
from superopt.segments import seam_windows, stitch
from superopt.stages import Kept, Pieces, Search, Specialization, Stages, traced, worth_it
from superopt.workers import Failed, placed, run_all


# A segment's worker is killed this many seconds past the call's time limit (a backstop: a job stops at the
# limit by itself), and its segment runs as captured.
WORKER_MARGIN = 30.0


def _kept_for_time(captured: Captured, search: Search, timer: Stages, stage: str) -> Specialization:
    reason = f"time limit ({stage}: the call's {search.limits.seconds:g} s ran out)"
    return specialization(captured, search, timer, RunReport(StopReason.TIME_LIMIT), Outcome.TIME_LIMIT, reason,
                           None)


@dataclass
class SegmentJob:
    """One distinct segment to optimize: what a worker process gets (superopt/workers.py)."""
    graph: Graph
    search: Search
    rules: dict | None = None   # the compiled rules as data (reuse.compiled_rules), where the parent has them
    key: str = ""               # the segment's key (segments.Segment.key)


def _segment_captured(graph: Graph) -> Captured:
    """A segment (or seam window) as a captured program of its own, its kernels unfused: a window's kernels
    (the segments' fusions) are searched again."""
    graph = unfused(graph)
    args = sorted((n for n in graph.nodes if n.op == "arg"), key=lambda n: n.attrs[0])
    return Captured(graph, None, None, tuple((n.shape, n.dtype) for n in args))


def optimize_segment(job: SegmentJob) -> dict:
    """Optimize one segment (or seam window) as a program of its own: the checker draws its canonical
    arguments and compares it with the segment as given, and it must be predicted cheaper than that (a
    window: with its kernels). Its cache entry (None where it has none), and its run, outcome, reason and
    stage seconds."""
    captured = _segment_captured(job.graph)
    graph = captured.graph
    timer = Stages()
    cost_before, _ = program_cost(job.graph, job.search.target)   # what the window costs as it was chosen
    run, outcome, reason, chosen, _ = optimize_program(captured, lower(graph), job.search, timer, cost_before,
                                                        job.rules, segment=job.key)
    built = compiled_rules(job.search.schedule) if job.rules is None else None
    return dict(entry=entry_of(run, outcome, reason, chosen), run=run_to_data(run), outcome=outcome.name,
                reason=reason, seconds=timer.seconds, rules=built)


def _optimize_distinct(distinct: dict, search: Search, store, executor: str | None, timer: Stages,
                       call: Deadline, label: str) -> tuple[dict, list]:
    """Each distinct segment of `distinct` (by key) optimized once, from the cache where it has the result,
    else in worker processes, the results stored: ({key: (run, outcome, reason, chosen, program)}, the
    segments that were optimized here). `label` names them in the stage seconds ("segments", "seams")."""
    fp = search.fingerprint()
    results: dict = {}
    if store is not None:
        def look_up():
            for key, seg in distinct.items():
                entry = digest(fp, key)
                found = cached(store, entry, "segment", seg.graph)
                if found is not None and search.verify:
                    found = rechecked(found, store, entry, "segment", _segment_captured(seg.graph), search.numerics)
                if found is not None:
                    results[key] = found
        timer("cache", look_up)
    misses = [seg for key, seg in distinct.items() if key not in results]
    if not misses:
        return results, misses
    call.check("cache" if store is not None else label)
    # Limits.seconds bounds the whole call: the segments share what is left of it, and one that runs out of
    # it runs as captured, beside the others' results (the best found in the time).
    each = search.with_limits(dataclasses.replace(search.limits, seconds=max(call.left(), 1e-3)))
    rules = None
    if store is not None:   # workers get the compiled rules from here, rather than each building them
        timer("rules", prepare_rules, search.schedule, store)
        rules = compiled_rules(search.schedule)
    jobs = [SegmentJob(seg.graph, each, rules, seg.key) for seg in misses]
    # A job that fails (raises, its worker killed or out of memory, past the call's time and a margin)
    # leaves its segment as captured, with the reason; the call goes on with the others' results.
    backstop = each.limits.seconds + WORKER_MARGIN if each.limits.seconds else None
    done = timer(label, lambda: run_all(optimize_segment, jobs, executor, failures="keep", timeout=backstop))
    if store is not None:
        save_rules(search.schedule, store, next((out["rules"] for out in done
                                                  if not isinstance(out, Failed) and out["rules"]), None))
    for seg, out in zip(misses, done):
        if isinstance(out, Failed):
            results[seg.key] = (RunReport(StopReason.ERROR, error=out.reason), Outcome.WORKER_FAILED,
                                f"its worker failed ({out.reason}); it runs as captured", None, None)
            continue
        for stage, seconds in out["seconds"].items():
            timer.seconds[f"{stage} ({label})"] = timer.seconds.get(f"{stage} ({label})", 0.0) + seconds
        found = None
        if out["entry"] is not None:
            if store is not None:
                store.put(digest(fp, seg.key), "segment", out["entry"])
            found = from_entry(out["entry"], seg.graph)
        results[seg.key] = found or (run_from_data(out["run"]), Outcome[out["outcome"]], out["reason"], None, None)
    return results, misses


def _runs(distinct: dict, results: dict) -> dict:
    """The program each distinct segment runs: its chosen program where one was found, else itself."""
    return {key: results[key][3].graph if results[key][1] is Outcome.OPTIMIZED else seg.graph
            for key, seg in distinct.items()}


def segmented(captured: Captured, segments: list, search: Search, store, executor: str | None,
              timer: Stages, call: Deadline) -> Specialization:
    """Optimize each distinct segment once (from the cache, or in worker processes), stitch the chosen
    segments into one program, optimize the windows around its seams, and build its report."""
    fp = search.fingerprint()
    distinct = {s.key: s for s in segments}
    if call.expired():
        return _kept_for_time(captured, search, timer, "segment")
    try:
        results, misses = _optimize_distinct(distinct, search, store, executor, timer, call, "segments")
    except TimeLimit as exc:
        return _kept_for_time(captured, search, timer, exc.stage)
    chosen_programs = _runs(distinct, results)
    starts: list = []
    stitched = timer("stitch", stitch, captured.graph, segments, chosen_programs, starts)
    runs = [results[key][0] for key in distinct]
    outcomes = [results[key][1] for key in distinct]
    declined = [d for key in distinct if results[key][3] is not None for d in results[key][3].declined]
    pieces = Pieces(segments, distinct, chosen_programs, store, fp, captured.graph)
    seams = _seams(stitched, starts, search, store, executor, timer, call)
    if seams is not None:   # a window was changed: the program runs as the seams' pieces
        windows, found, seams_note = seams
        runs += [found[key][0] for key in windows.windows]
        outcomes.append(Outcome.OPTIMIZED)
        declined += [d for key in windows.windows if found[key][3] is not None for d in found[key][3].declined]
        chosen_pieces = {p.key: p.graph for p in windows.pieces} | _runs(windows.windows, found)
        stitched = timer("stitch", stitch, windows.graph, windows.pieces, chosen_pieces)
        pieces = Pieces(windows.pieces, {p.key: p for p in windows.pieces}, chosen_pieces, store, fp, windows.graph,
                        "the program before its seams' rewrites")
    tgt = search.target
    costs = program_cost(traced(captured), tgt)
    cost_before = costs[0]
    chosen = None
    if Outcome.OPTIMIZED in outcomes:
        cost, node_costs = program_cost(stitched, tgt)
        chosen = Extraction(stitched, cost, node_costs, Method(search.extractor, "per segment"), declined)
        try:
            worth_it(chosen, cost_before, (), None)
            outcome, reason = Outcome.OPTIMIZED, ""
        except Kept as kept:
            outcome, reason = kept.outcome, kept.reason
    else:
        first = next(results[key] for key in distinct)
        outcome, reason = first[1], f"in all {len(distinct)} distinct segments; the first: {first[2]}"
    spec = specialization(captured, search, timer, combined_run(runs), outcome, reason, chosen, costs=costs)
    if outcome is not Outcome.OPTIMIZED:   # each segment runs as captured
        pieces = Pieces(segments, distinct, {key: seg.graph for key, seg in distinct.items()}, store, fp,
                        captured.graph)
    spec.pieces = pieces
    hits = len(distinct) - len(misses)
    timed_out = sum(results[seg.key][1] is Outcome.TIME_LIMIT for seg in misses)
    failed = [results[seg.key][2] for seg in misses if results[seg.key][1] is Outcome.WORKER_FAILED]
    spec.report.segments = SegmentsUse(len(segments), len(distinct), len(misses), hits,
                                       placed(optimize_segment, len(misses), executor) if misses else "",
                                       timed_out, len(failed), failed[0] if failed else "",
                                       seams[2] if seams is not None else None)
    return spec


def _seams(stitched: Graph, starts: list, search: Search, store, executor: str | None, timer: Stages,
           call: Deadline) -> tuple | None:
    """The windows around the stitched program's seams (segments.seam_windows), each distinct one
    optimized once: (the seams, their results, what the report says of them), or None where no window
    was changed (none was cut, none gained, or the call's time ran out before them: the stitched program
    as it is, the best found in the time)."""
    seams = timer("seams", seam_windows, stitched, starts)
    if seams is None or call.expired():
        return None
    try:
        found, misses = _optimize_distinct(seams.windows, search, store, executor, timer, call, "seams")
    except TimeLimit:
        return None
    changed = [key for key in seams.windows if found[key][1] is Outcome.OPTIMIZED]
    if not changed:
        return None
    n = sum(p.key in seams.windows for p in seams.pieces)
    return seams, found, SeamsUse(n, len(seams.windows), len(misses), len(seams.windows) - len(misses), len(changed))
