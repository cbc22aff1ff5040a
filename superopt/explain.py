"""Why superopt chose what it chose: the rules that fired (per phase, with their source lines), the cost
model's price of every launch before and after, the fusions it declined, and the other programs the
e-graph held with their prices.

    spec = superopt(fn, target="npu-910b").compile(*args)
    print(explain(spec, alternatives(fn, args, "npu-910b")))
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from superopt.core.deadline import Deadline
from superopt.core.ir import Graph, body_str, type_str
from superopt.egraph.capture import capture
from superopt.egraph.limits import Limits
from superopt.extract.candidates import candidates
from superopt.extract.cost import op_breakdown
from superopt.extract.extraction import program_cost
from superopt.extract.target import load_target
from superopt.pipeline import Stages, saturate, schedule_of
from superopt.report import _fmt_time, fusion_lines, plural, stop_phrase
from superopt.rulesets import DEFAULT, RULESETS

_FREE = frozenset({"arg", "const", "lit", "reshape", "broadcast", "iota"})


@dataclass
class Launch:
    """One launch of a program as the cost model prices it."""
    node: str                  # the node's name in `pretty` (%k)
    what: str                  # the op, or a kernel's body over its inputs in0, in1, ...
    type: str                  # result type, e.g. f32[128,768]
    seconds: float
    flops: float
    bytes: float
    factors: list = field(default_factory=list)   # the target model's own factors and penalties
    tiles: str = ""            # a tiled kernel's loop order and tiles


@dataclass
class Alternative:
    """Another program the saturated e-graph held."""
    cost: float                # model seconds per call
    launches: int
    graph: Graph
    ops: str = ""              # its launches by op, e.g. "kernel x2, matmul x1"


def launches(graph: Graph, target) -> list[Launch]:
    """Every launch of `graph` (live, not a constant computed once, not a free view), costliest first."""
    _, costs = program_cost(graph, target)
    constant = graph.constant_nodes()
    out = []
    for k, (i, cost) in enumerate(zip(graph.live(), costs)):
        node = graph.nodes[i]
        if i in constant or node.op in _FREE:
            continue
        ins = [(graph.nodes[j].shape, graph.nodes[j].dtype) for j in node.inputs]
        parts = op_breakdown(node.op, node.attrs, ins, (node.shape, node.dtype), target)
        kernel = node.op == "kernel"
        out.append(Launch(f"%{k}", f"kernel{{{body_str(node.attrs[0])}}}" if kernel else node.op, type_str(node),
                          cost, float(parts.flops), float(parts.bytes), parts.factors() + parts.notes(),
                          str(node.attrs[1]) if kernel and len(node.attrs) > 1 else ""))
    return sorted(out, key=lambda launch: -launch.seconds)


def rules_by_phase(run) -> list[tuple[str, str, list[tuple[str, int, float, str]]]]:
    """(phase, how it stopped, [(rule, matches, seconds, source file:line)]) for each phase of a run."""
    source = {r.name: r.source for rs in RULESETS.values() for r in rs}
    out = []
    for ph in run.phases:
        fired = sorted(((n, m, ph.rule_seconds.get(n, 0.0), source.get(n, "")) for n, m in ph.matches.items() if m),
                       key=lambda t: (-t[1], t[0]))
        out.append((ph.name, f"{stop_phrase(ph.stop_reason)} after {plural(ph.iterations, 'iteration')}", fired))
    return out


def _ops(rows: list[Launch]) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        op = "kernel" if r.what.startswith("kernel{") else r.what
        counts[op] = counts.get(op, 0) + 1
    return ", ".join(f"{op} x{n}" for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def alternatives(fn, args, target: str, rulesets=None, limits=None, limit: int = 4,
                 numerics: str = "strict", budget: float | None = None) -> list[Alternative]:
    """Up to `limit` distinct programs of the saturated e-graph (the greedy choice first, then the ones
    obtained by forcing alternatives: `extract/candidates.py`; programs that print the same are one),
    cheapest first. This saturates again, with the rules the numerics mode runs; with a `budget` in
    seconds, saturation and the search for alternatives together take about that long at most (the
    greedy choice is always found)."""
    start = time.perf_counter()
    rulesets = DEFAULT if rulesets is None else rulesets
    schedule, _ = schedule_of(rulesets, numerics, load_target(target).kind)
    limits = limits or Limits()
    if budget is not None:
        limits = dataclasses.replace(limits, seconds=max(min(limits.seconds, budget), 1e-3))
    # The pipeline's stages, saturating in process with the whole budget (`limits` bound saturation; the
    # encoding is not timed, so the greedy choice is always found): the isolated saturation of `superopt()`
    # gives saturation half the time left and spends some on its child process, which leaves this search
    # too little to find alternatives.
    saturated = saturate(capture(fn, args), schedule, limits, Deadline.never(), Stages(), isolated=False)
    tgt = load_target(target)
    found = candidates(saturated.frozen, saturated.encoding, tgt, limit=limit,
                       deadline=None if budget is None else start + budget)
    out = []
    for c in found:
        rows = launches(c.graph, tgt)
        out.append(Alternative(c.cost, len(rows), c.graph, _ops(rows)))
    return sorted(out, key=lambda a: a.cost)


def _launch_lines(rows: list[Launch], width: int = 90) -> list[str]:
    total = sum(r.seconds for r in rows) or 1.0
    lines = [f"    {'time':>10} {'share':>6}  {'node':<5} launch"]
    for r in rows:
        what = r.what if len(r.what) <= width else r.what[:width - 3] + "..."
        detail = ", ".join([f"{r.flops:.3g} flop", f"{r.bytes:.3g} B"] + r.factors)
        lines.append(f"    {_fmt_time(r.seconds):>10} {r.seconds / total:>6.1%}  {r.node:<5} {what} -> {r.type}")
        lines.append(f"    {'':>10} {'':>6}  {'':<5}   [{detail}]" + (f" tiles: {r.tiles}" if r.tiles else ""))
    return lines


def explain(spec, alts: list[Alternative] = ()) -> str:
    """The explanation of one specialization (`Optimized.compile(...)`'s result) as text."""
    report = spec.report
    target = load_target(report.target)
    before, after = launches(spec.original, target), launches(spec.term, target)
    lines = [f"superopt explain (target {report.target})",
             f"  outcome : {report.outcome}",
             f"  cost    : {_fmt_time(report.cost_before)} -> {_fmt_time(report.cost_after)} per call "
             f"({report.speedup_estimate:.2f}x, model); {plural(len(before), 'launch')} -> {len(after)}",
             "", "Rules that fired, by phase (matches, time, where the rule is declared):"]
    for phase, how, fired in rules_by_phase(report.run):
        lines.append(f"  phase {phase}: {how}" + ("" if fired else "; no rule matched"))
        lines += [f"    {name:<38} {n:>6}  {_fmt_time(s):>9}  {src}" for name, n, s, src in fired]
    lines += ["", "Why this program: the cost model's price of each launch.",
              f"  chosen program ({plural(len(after), 'launch')}, {_fmt_time(sum(r.seconds for r in after))}):"]
    lines += _launch_lines(after)
    if spec.term is not spec.original:
        lines += [f"  original program ({plural(len(before), 'launch')}, "
                  f"{_fmt_time(sum(r.seconds for r in before))}):"]
        lines += _launch_lines(before)
    if report.declined:
        lines += ["", "Larger fusions available (why they lost):"]
        lines += [f"  {text}" for text in fusion_lines(report.declined)]
    if alts:
        lines += ["", "Programs in the e-graph (cheapest first; the chosen one is the first unless the original "
                      "was kept):"]
        best = alts[0].cost or 1.0
        for k, a in enumerate(alts):
            lines.append(f"  #{k + 1}  {_fmt_time(a.cost):>10}  {a.cost / best:5.2f}x the cheapest  "
                         f"{plural(a.launches, 'launch')}" + (f": {a.ops}" if a.ops else ""))
        if len(alts) == 1:
            lines.append("  (the e-graph held no other distinct program within the search budget)")
    return "\n".join(lines)
