"""Why superopt chose what it chose: the rules that fired (per phase, with their source lines), the cost
model's price of every launch before and after, the fusions it declined, and the other programs the
e-graph held with their prices.

Every figure is the report's: a launch is a node the cost model prices (`program_cost`, from which the
pipeline's costs come), a guarded program's launches include its check's (`stages.guard_check`), so the
tables total the report's costs before and after, and the list of programs starts with the chosen one at
that cost.

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
from superopt.extract.candidates import candidates, program_key
from superopt.extract.cost import op_breakdown
from superopt.extract.extraction import program_cost
from superopt.extract.target import Target, load_target
from superopt.stages import Stages, guard_check, saturate, schedule_of
from superopt.report import _fmt_time, fusion_lines, plural, stop_phrase
from superopt.rulesets import DEFAULT, RULESETS


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
    check: bool = False        # a launch of the guard's check (named g%k, %k in the check's own listing)


@dataclass
class Alternative:
    """Another program the saturated e-graph held."""
    cost: float                # model seconds per call
    launches: int
    graph: Graph
    ops: str = ""              # its launches by op, e.g. "kernel x2, matmul x1"


def launches(graph: Graph, target) -> list[Launch]:
    """Every launch of `graph` as the pipeline prices it, costliest first: each node `program_cost` gives a
    price (not a constant computed once, not a view the target gets for free; on a CPU, the root of each of
    XLA's fusions), and, where `graph` is guarded, each of its check's. Their seconds add up to the report's
    cost of `graph`."""
    check = guard_check(graph)
    rows = _priced(graph, target) + (_priced(check, target, check=True) if check is not None else [])
    return sorted(rows, key=lambda launch: -launch.seconds)


def _priced(graph: Graph, target, check: bool = False) -> list[Launch]:
    _, costs = program_cost(graph, target)
    out = []
    for k, (i, cost) in enumerate(zip(graph.live(), costs)):
        if cost <= 0:
            continue
        node = graph.nodes[i]
        ins = [(graph.nodes[j].shape, graph.nodes[j].dtype) for j in node.inputs]
        parts = op_breakdown(node.op, node.attrs, ins, (node.shape, node.dtype), target)
        kernel = node.op == "kernel"
        what = f"kernel{{{body_str(node.attrs[0])}}}" if kernel else node.op
        out.append(Launch(f"g%{k}" if check else f"%{k}", f"guard check: {what}" if check else what, type_str(node),
                          cost, float(parts.flops), float(parts.bytes), parts.factors() + parts.notes(),
                          str(node.attrs[1]) if kernel and len(node.attrs) > 1 else "", check))
    return out


def priced_title(name: str, rows: list[Launch]) -> str:
    """`name (3 launches, 570.0 us)`, and how much of that is the guard's check where there is one."""
    check = [r for r in rows if r.check]
    guard = (f"; g%k: the guard's check, {plural(len(check), 'launch')}, {_fmt_time(sum(r.seconds for r in check))}"
             if check else "")
    return f"{name} ({plural(len(rows), 'launch')}, {_fmt_time(sum(r.seconds for r in rows))}{guard})"


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
        op = "guard check" if r.check else "kernel" if r.what.startswith("kernel{") else r.what
        counts[op] = counts.get(op, 0) + 1
    return ", ".join(f"{op} x{n}" for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def alternatives(fn, args, target: "Target | str", rulesets=None, limits=None, limit: int = 4,
                 numerics: str = "strict", budget: float | None = None) -> list[Alternative]:
    """Up to `limit` distinct programs of the saturated e-graph (the greedy choice first, then the ones
    obtained by forcing alternatives: `extract/candidates.py`; programs that print the same are one),
    cheapest first, each priced as the pipeline prices a program (`launches`). This saturates again, with
    the rules the numerics mode runs (a guarded program's search is not repeated); with a `budget` in
    seconds, saturation and the search for alternatives together take about that long at most (the
    greedy choice is always found). `target`: a `Target` (an `Optimized`'s `options.target`) or a name."""
    start = time.perf_counter()
    tgt = target if isinstance(target, Target) else load_target(target)
    rulesets = DEFAULT if rulesets is None else rulesets
    schedule, _ = schedule_of(rulesets, numerics, tgt.kind)
    limits = limits or Limits()
    if budget is not None:
        limits = dataclasses.replace(limits, seconds=max(min(limits.seconds, budget), 1e-3))
    # The pipeline's stages, saturating in process with the whole budget (`limits` bound saturation; the
    # encoding is not timed, so the greedy choice is always found): the isolated saturation of `superopt()`
    # gives saturation half the time left and spends some on its child process, which leaves this search
    # too little to find alternatives.
    saturated = saturate(capture(fn, args), schedule, limits, Deadline.never(), Stages(), isolated=False)
    found = candidates(saturated.frozen, saturated.encoding, tgt, limit=limit,
                       deadline=None if budget is None else start + budget)
    out = []
    for c in found:   # priced as it runs (on a CPU, in XLA's fusions), not as the extractor priced it
        rows = launches(c.graph, tgt)
        out.append(Alternative(sum(r.seconds for r in rows), len(rows), c.graph, _ops(rows)))
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


def programs(spec, alts: list[Alternative]) -> list[tuple[str, Alternative]]:
    """The list `explain` prints: the program that runs first (the chosen one, or the original where it was
    kept), priced as its table is, then the other programs of `alts` cheapest first, each with its label."""
    target = spec.options.target   # as superopt() loaded it
    rows = launches(spec.term, target)
    runs = Alternative(sum(r.seconds for r in rows), len(rows), spec.term, _ops(rows))
    label = "the original, kept" if not spec.report.optimized else \
        "chosen, guarded" if spec.term.guard is not None else "chosen"
    key = program_key(spec.term)
    return [(label, runs)] + [("", a) for a in alts if program_key(a.graph) != key]


def explain(spec, alts: list[Alternative] = ()) -> str:
    """The explanation of one specialization (`Optimized.compile(...)`'s result) as text."""
    report = spec.report
    target = spec.options.target   # as superopt() loaded it
    before, after = launches(spec.original, target), launches(spec.term, target)
    lines = [f"superopt explain (target {report.target})",
             f"  outcome     : {report.outcome}",
             f"  cost (model): {report.cost_line}; {plural(len(before), 'launch')} -> {len(after)}",
             *([f"  extracted by {report.extraction}"] if report.extraction else []),
             "", "Rules that fired, by phase (matches, time, where the rule is declared):"]
    for phase, how, fired in rules_by_phase(report.run):
        lines.append(f"  phase {phase}: {how}" + ("" if fired else "; no rule matched"))
        lines += [f"    {name:<38} {n:>6}  {_fmt_time(s):>9}  {src}" for name, n, s, src in fired]
    lines += ["", "Why this program: the cost model's price of each launch.",
              f"  {priced_title('chosen program', after)}:"]
    lines += _launch_lines(after)
    if spec.term is not spec.original:
        lines += [f"  {priced_title('original program', before)}:"]
        lines += _launch_lines(before)
    if report.declined:
        lines += ["", "Larger fusions available (why they lost):"]
        lines += [f"  {text}" for text in fusion_lines(report.declined)]
    if alts:
        listed = programs(spec, alts)
        lines += ["", "Programs in the e-graph (the one that runs first, then the others cheapest first; priced "
                      "as the tables above):"]
        runs = listed[0][1].cost or 1.0
        for k, (label, a) in enumerate(listed):
            lines.append(f"  #{k + 1}  {_fmt_time(a.cost):>10}  {a.cost / runs:5.2f}x the one that runs  "
                         f"{plural(a.launches, 'launch')}" + (f": {a.ops}" if a.ops else "")
                         + (f"  ({label})" if label else ""))
        if len(listed) == 1:
            lines.append("  (the e-graph held no other distinct program within the search budget)")
    return "\n".join(lines)
