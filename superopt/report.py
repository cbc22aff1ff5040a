"""The optimization report: what was searched, why it stopped, what was chosen and at what cost."""
from __future__ import annotations

from dataclasses import dataclass, field

from superopt.egraph.runner import RunReport


def _fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


@dataclass
class Report:
    target: str
    run: RunReport
    cost_before: float = 0.0       # model seconds per call, original program
    cost_after: float = 0.0        # model seconds per call, chosen program
    outcome: str = ""              # "optimized", or why the original was kept
    extraction: str = ""           # which extractor chose the program, and how it ended
    ops_before: dict = field(default_factory=dict)
    ops_after: dict = field(default_factory=dict)
    stage_seconds: dict = field(default_factory=dict)
    top_costs: list = field(default_factory=list)  # (cost, description) of the chosen program's costliest ops
    declined: list = field(default_factory=list)   # larger fusions that were available, and why they lost
    backend: str = "jax"           # what runs the program
    npu_lines: list = field(default_factory=list)  # the NPU program's stages and emulated cycles
    gradient_traffic: tuple = ()   # (before, after) extract.traffic.Traffic, when the program has gradients
    peak_memory: tuple = ()        # (before, after) extract.memory.Peak
    memory_note: str = ""          # what fitting the memory budget did, when one was given

    @property
    def optimized(self) -> bool:
        return self.outcome == "optimized"

    @property
    def speedup_estimate(self) -> float:
        return self.cost_before / self.cost_after if self.cost_after > 0 else float("inf")

    def __str__(self) -> str:
        r = self.run
        lines = [
            f"superopt report (target {self.target})",
            f"  outcome      : {self.outcome}",
            f"  saturation   : stopped by {r.stop_reason.value} after {r.iterations} iterations, "
            f"{_fmt_time(r.seconds)}",
            f"  e-graph      : {r.enodes} e-nodes in {r.eclasses} e-classes",
            f"  cost (model) : {_fmt_time(self.cost_before)} -> {_fmt_time(self.cost_after)} per call "
            f"({self.speedup_estimate:.2f}x)" + (f", extracted by {self.extraction}" if self.extraction else ""),
        ]
        for ph in r.phases:
            bans = ", ".join(f"{n} x{k}" for n, k in sorted(ph.bans.items()))
            lines.append(f"  phase {ph.name:<7}: {ph.stop_reason.value} after {ph.iterations} iterations, "
                         f"{_fmt_time(ph.seconds)}" + (f"; backed off: {bans}" if bans else ""))
        if r.error:
            lines.append(f"  error        : {r.error}")
        fired = r.fired
        lines.append(f"  rules fired  : {len(fired)} of {len(r.matches)}")
        for name, n in sorted(fired.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"    {name:<34} {n:>6} matches  {_fmt_time(r.rule_seconds.get(name, 0.0)):>9}")
        changed = sorted(set(self.ops_before) | set(self.ops_after))
        diffs = [f"{op} {self.ops_before.get(op, 0)}->{self.ops_after.get(op, 0)}" for op in changed
                 if self.ops_before.get(op, 0) != self.ops_after.get(op, 0)]
        lines.append("  ops changed  : " + (", ".join(diffs) if diffs else "none"))
        if self.gradient_traffic:
            before, after = self.gradient_traffic
            lines.append(f"  gradient mem : {before} -> {after} (launches that read or write gradient "
                         f"tensors, and their bytes)")
        if self.peak_memory:
            before, after = self.peak_memory
            lines.append(f"  peak memory  : {before} -> {after} (model: program order, arguments included)")
        if self.memory_note:
            lines.append(f"  memory budget: {self.memory_note}")
        if self.declined:
            lines.append("  fusion declined (the largest fusion available where a smaller one was chosen):")
            lines += [f"    {text}" for text in self.declined]
        if self.top_costs:
            lines.append("  costliest ops of the chosen program:")
            for cost, what in self.top_costs:
                lines.append(f"    {_fmt_time(cost):>10}  {what}")
        lines.append(f"  runs on      : {self.backend}")
        lines += self.npu_lines
        lines.append("  stages       : " + ", ".join(f"{k} {_fmt_time(v)}" for k, v in self.stage_seconds.items()))
        return "\n".join(lines)
