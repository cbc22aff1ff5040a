"""A specialization and its report, built once from what the stages returned (or what the cache kept): the costs
before and after, the chosen program's costliest kernels with the cost model's breakdown, its memory and
gradient traffic, the loop passes' notes.
"""
from __future__ import annotations

from typing import Callable

from superopt import numerics as numerics_mode
from superopt.core.ir import Graph, body_str, carry_scopes, type_str
from superopt.egraph.capture import Captured, custom_calls
from superopt.egraph.limits import RunReport, StopReason
from superopt.extract.cost import op_breakdown
from superopt.extract.extraction import Extraction, program_cost
from superopt.extract.loops import loop_notes
from superopt.extract.memory import peak_memory
from superopt.extract.models.breakdown import Breakdown
from superopt.extract.traffic import gradient_traffic as traffic
from superopt.lowering.jax import lower
from superopt.options import Options
from superopt.report import Outcome, Report
from superopt.rewrites.schedule import Schedule
from superopt.stages import (Search, Specialization, Stages, differentiated_program, guard_check, reference_program,
                             traced, user_program)


def specialization(captured: Captured, search: Search, timer: Stages, run: RunReport, outcome: Outcome,
                   reason: str, chosen: Extraction | None, program: Callable | None = None,
                   reference: Callable | None = None, costs: tuple | None = None) -> Specialization:
    """The specialization and its report, from what optimizing (or the cache) gave; `costs` is the
    original's `program_cost` where the caller has it."""
    original = traced(captured)
    cost_before, original_costs = costs or program_cost(original, search.target)
    report = build_report(search.target, captured, run, outcome, reason, chosen, cost_before, original_costs,
                          search.numerics, search.left_out, search.schedule, timer.seconds)
    reference = reference or reference_program(captured)
    if outcome is Outcome.OPTIMIZED:
        if not chosen.graph.scopes:   # a program from the cache: its named scopes are not stored
            chosen.graph.scopes = carry_scopes(original, chosen.graph)
            program = None if chosen.graph.scopes else program   # lowered again, in them
        program = program or timer("lower", lower, chosen.graph)
        return Specialization(program, report, chosen.graph, original, captured.out_tree, captured.in_avals,
                              reference=reference, custom_calls=custom_calls(captured.jaxpr),
                              differentiated=differentiated_program(captured, reference), options=search.options)
    return Specialization(user_program(captured), report, original, original, captured.out_tree,
                          captured.in_avals, reference=reference, custom_calls=custom_calls(captured.jaxpr),
                          options=search.options)


def as_captured(captured: Captured, options: Options, timer: Stages, reason: str,
                kind: Outcome = Outcome.KEPT_WHOLE) -> Specialization:
    """The user's program as captured, unpriced and unsearched, with `reason` in its report."""
    ops = captured.graph.op_counts()
    tgt = options.target
    report = Report(tgt.name, RunReport(StopReason.SATURATED), kind=kind, reason=reason, target_spec=tgt,
                    numerics=options.numerics, ops_before=ops, ops_after=ops, stage_seconds=timer.seconds)
    return Specialization(user_program(captured), report, captured.graph, captured.graph, captured.out_tree,
                          captured.in_avals, reference=reference_program(captured),
                          custom_calls=custom_calls(captured.jaxpr), options=options)


def build_report(tgt, captured: Captured, run: RunReport, outcome: Outcome, reason: str, chosen: Extraction | None,
                 cost_before: float, original_costs: list, numerics: str, left_out: list, schedule: Schedule,
                 stage_seconds: dict) -> Report:
    """The report, once, from the stages' results: of the chosen program where it runs, else of the original
    (with what extraction found, where it got that far)."""
    original = traced(captured)
    if outcome is Outcome.TIME_LIMIT:
        run.stop_reason = StopReason.TIME_LIMIT
    report = Report(tgt.name, run, cost_before=cost_before, cost_after=cost_before, kind=outcome, reason=reason,
                    target_spec=tgt,
                    ops_before=original.op_counts(), numerics=numerics, left_out=left_out,
                    overflow_rewrites=numerics_mode.overflow_rewrites(schedule, run.fired),
                    stage_seconds=stage_seconds)
    report.loops = "; ".join(filter(None, [captured.vectorized, *loop_notes(original)]))
    report.rerolled = captured.rerolled
    if chosen is not None:
        report.extraction, report.declined, report.memory_note = chosen.method, chosen.declined, chosen.memory
    runs = chosen.graph if chosen is not None and outcome is Outcome.OPTIMIZED else original
    report.ops_after = runs.op_counts()
    report.gradient_traffic = gradient_traffic(original, runs)
    report.peak_memory = (peak_memory(original), peak_memory(runs))
    if runs is original:
        if report.memory_note:
            report.memory_note += f"; the original runs instead (peak {report.peak_memory[0]})"
        report.top_costs = describe(original, original_costs, tgt)
    else:
        report.cost_after = chosen.cost
        report.top_costs = describe(chosen.graph, chosen.node_costs, tgt)
        check = guard_check(chosen.graph)
        if check is not None:   # its launches are the chosen program's too
            top = report.top_costs + describe(check, program_cost(check, tgt)[1], tgt, "guard check: ")
            report.top_costs = sorted(top, key=lambda cost_what: -cost_what[0])[:5]
        report.guarded = chosen.graph.guard is not None
    return report


def gradient_traffic(original: Graph, chosen: Graph, groups_before=(), groups_after=()) -> tuple:
    """(before, after) passes over gradient memory, or () when the program has no gradient tensors;
    the groups are the sibling launches of the backend that runs each program (none: one op a launch)."""
    before = traffic(original, groups_before)
    if not before.tensors:
        return ()
    return before, (before if chosen is original else traffic(chosen, groups_after))


def describe(graph: Graph, costs: list[float], target, label: str = "", k: int = 5) -> list[tuple[float, str]]:
    """The k costliest kernels with the cost model's breakdown of each, `label` before each."""
    live = graph.live()
    out = []
    for c, i in sorted(zip(costs, live), key=lambda cn: -cn[0])[:k]:
        if c <= 0:
            continue
        node = graph.nodes[i]
        ins = [(graph.nodes[j].shape, graph.nodes[j].dtype) for j in node.inputs]
        parts = op_breakdown(node.op, node.attrs, ins, (node.shape, node.dtype), target)
        what = f"kernel{{{_short(body_str(node.attrs[0]))}}}" if node.op == "kernel" else node.op
        tiled = f"\n         tiles: {node.attrs[1]}" if node.op == "kernel" and len(node.attrs) > 1 else ""
        out.append((c, f"{label}{what} -> {type_str(node)}  [{_factors(parts)}]{tiled}"))
    return out


def _short(text: str, width: int = 72) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _factors(parts: Breakdown) -> str:
    return ", ".join([f"{parts.flops:.3g} flop", f"{parts.bytes:.3g} B"] + parts.factors() + parts.notes())
