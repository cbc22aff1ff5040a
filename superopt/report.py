"""The optimization report: what was searched, why it stopped, what was chosen and at what cost."""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any

from superopt.egraph.limits import RunReport, StopReason
from superopt.extract.extraction import Method

# A larger fusion is a real candidate (listed as declined) when its price is within this factor of the
# kernels chosen instead; one further off is listed as not chosen, with how much slower it is.
DECLINED_WITHIN = 2.0

_STOPS = {
    StopReason.SATURATED: "saturated",
    StopReason.ITERATION_LIMIT: "stopped at the iteration limit",
    StopReason.NODE_LIMIT: "stopped at the e-node limit",
    StopReason.WORK_LIMIT: "stopped at the work limit",
    StopReason.TIME_LIMIT: "stopped at the time limit",
    StopReason.MEMORY_LIMIT: "stopped at the memory limit",
    StopReason.ERROR: "stopped by an error",
}


class Outcome(enum.Enum):
    """What a specialization runs: the optimized program, or the original for one kind of reason
    (`Report.reason` has the words)."""
    OPTIMIZED = "optimized"
    NO_GAIN = "no cheaper program found"
    SAME_EXECUTABLE = "same executable"   # XLA compiles the chosen program to the original's executable
    BELOW_THRESHOLD = "predicted gain below the threshold"
    TIME_LIMIT = "time limit"
    SATURATION_FAILED = "saturation failed"
    EXTRACTION_FAILED = "extraction failed"
    VERIFICATION_FAILED = "verification failed"
    KEPT_WHOLE = "kept whole"       # a program superopt does not rewrite (callbacks whose results it uses)
    WORKER_FAILED = "worker failed"  # a segment's worker process raised, died or outran the call's time


def plural(n: int, word: str) -> str:
    """`1 iteration`, `2 iterations`, `1 launch`, `3 launches`."""
    if n == 1:
        return f"1 {word}"
    return f"{n} {word}es" if word.endswith(("s", "sh", "ch", "x")) else f"{n} {word}s"


def stop_phrase(reason: StopReason) -> str:
    """How a run or phase ended, as a phrase: "saturated", "stopped at the iteration limit", ..."""
    return _STOPS.get(reason, f"stopped: {getattr(reason, 'value', reason)}")


_FUSION = re.compile(r"^(?P<head>.*): (?P<fused>[0-9.]+|inf) us fused vs (?P<chosen>[0-9.]+) us for the "
                     r"(?P<n>\d+) kernel\(s\) chosen(?P<rest>.*)$")


def fusion_lines(declined: list[str]) -> list[str]:
    """The larger fusions extraction passed over (`extract/greedy.py`'s `declined`), as sentences: a
    fusion within DECLINED_WITHIN of the kernels chosen was declined; one further off was not a real
    candidate and says how much slower it is; one that cannot be one kernel (it does not fit on chip,
    or the target has no such kernel) says why."""
    out = []
    for text in declined:
        m = _FUSION.match(text)
        if not m:
            out.append(f"cannot be one kernel: {text}")
            continue
        fused, chosen, n = float(m["fused"]), float(m["chosen"]), int(m["n"])
        ratio = fused / chosen if chosen > 0 else float("inf")
        what = f"{m['head']}: {m['fused']} us fused vs {m['chosen']} us for the {plural(n, 'kernel')} chosen{m['rest']}"
        if ratio <= DECLINED_WITHIN:
            out.append(f"declined ({ratio:.2f}x the time of the kernels chosen): {what}")
        else:
            out.append(f"not chosen ({ratio:.0f}x slower than the kernels chosen): {what}")
    return out


def _fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


@dataclass
class BackendUse:
    """What runs a specialization's program (superopt/backends.py); `str()` is the report's line."""
    runs: str = "jax"        # "jax", "pallas" or "npu emulator"
    fell_back: str = ""      # why JAX runs the program instead of the backend asked for ("" where it did not)
    detail: str = ""         # the backend's own words: a Pallas program's kernels, what the emulator checked
    notes: list = field(default_factory=list)   # what happened since: under a trace, a call that ran on JAX

    @classmethod
    def on_jax(cls, why: str) -> "BackendUse":
        """JAX runs the program, the backend asked for having declined it for `why`."""
        return cls("jax", fell_back=why)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def __str__(self) -> str:
        head = f"{self.runs} ({self.fell_back})" if self.fell_back else (self.detail or self.runs)
        return head + "".join(f"; {n}" for n in self.notes)


@dataclass(frozen=True)
class CacheUse:
    """How the persistent cache (superopt/cache.py) served one specialization; `str()` is the report's line."""
    status: str            # "hit", "miss", "unstorable" (the program has no data form) or "unused" (no store)
    stored: bool = False   # a miss whose result was stored
    dropped: bool = False  # a miss after an entry failed its check against the program and was dropped
    why: str = ""          # why a result was not stored, or the cache not used

    def __str__(self) -> str:
        if self.status == "hit":
            return "hit (the result of an earlier optimization of this program)"
        if self.status == "unused":
            return f"not used ({self.why})"
        if self.status == "unstorable":
            return f"not stored ({self.why})"
        dropped = "; the entry failed its check and was dropped" if self.dropped else ""
        return f"miss{dropped}; " + ("result stored" if self.stored else f"not stored ({self.why})")


@dataclass(frozen=True)
class SeamsUse:
    """The windows around a segmented program's seams that were searched again (superopt/segmented.py)."""
    seams: int             # seams inside a window
    windows: int           # distinct windows
    optimized: int         # windows optimized in this call
    from_cache: int        # windows whose result came from the cache
    changed: int           # windows whose program was changed

    def __str__(self) -> str:
        return (f"{self.seams} seams in {self.windows} distinct windows ({self.optimized} optimized, "
                f"{self.from_cache} from the cache), {self.changed} changed")


@dataclass(frozen=True)
class SegmentsUse:
    """How a program was optimized in segments (superopt/segments.py cuts them); `str()` is the report's line."""
    count: int             # segments in the program
    distinct: int          # distinct ones: each optimized once
    optimized: int         # distinct segments optimized in this call
    from_cache: int        # distinct segments whose result came from the cache
    where: str = ""        # where the optimized ones ran ("on local workers", "in this process")
    timed_out: int = 0     # of the optimized, those that ran out of time and run as captured
    failed: int = 0        # of the optimized, those whose worker failed and run as captured
    first_failure: str = ""
    seams: SeamsUse | None = None   # the seams' windows, where one was changed

    def __str__(self) -> str:
        text = (f"{self.count} ({self.distinct} distinct: {self.optimized} optimized"
                f"{' ' + self.where if self.optimized and self.where else ''}, {self.from_cache} from the cache")
        if self.timed_out:
            text += f"; {self.timed_out} ran out of time and run as captured"
        if self.failed:
            text += f"; {self.failed} whose worker failed run as captured (the first: {self.first_failure})"
        return text + ")" + (f"; {self.seams}" if self.seams is not None else "")


@dataclass
class Report:
    target: str                    # the target's name
    run: RunReport
    cost_before: float = 0.0       # model seconds per call, original program
    cost_after: float = 0.0        # model seconds per call, chosen program
    kind: Outcome | None = None    # what runs: the optimized program, or the original and the kind of reason
    reason: str = ""               # why the original was kept, in words
    extraction: Method | None = None   # which extractor chose the program, and how it ended (None: none ran)
    ops_before: dict = field(default_factory=dict)
    ops_after: dict = field(default_factory=dict)
    stage_seconds: dict = field(default_factory=dict)
    top_costs: list = field(default_factory=list)  # (cost, description) of the chosen program's costliest ops
    declined: list = field(default_factory=list)   # larger fusions that were available, and why they lost
    backend: BackendUse = field(default_factory=BackendUse)   # what runs the program
    target_spec: Any = None        # the Target the program was chosen for (extract/target.py), as the call loaded
                                   # it: explain and html read its cost model without loading the target again
    npu_lines: list = field(default_factory=list)  # the NPU program's stages and emulated cycles
    npu_cycles: tuple = ()         # (cycles, the original program's cycles) of the NPU program's estimate
    gradient_traffic: tuple = ()   # (before, after) extract.traffic.Traffic, when the program has gradients
    peak_memory: tuple = ()        # (before, after) extract.memory.Peak
    memory_note: str = ""          # what fitting the memory budget did, when one was given
    numerics: str = "strict"       # the numerics mode (superopt.numerics)
    guarded: bool = False          # the program runs behind a run-time check, the original where it fails
    #                                (extract/guard.py: "reals" rewrites under strict, assumed domain conditions)
    left_out: list = field(default_factory=list)            # rules the mode did not run
    overflow_rewrites: dict = field(default_factory=dict)   # "reals" rules that fired (fast mode): name -> matches
    segments: SegmentsUse | None = None   # how the program was split, where each distinct segment's result came from
    cache: CacheUse | None = None         # how the persistent cache served it (None: no cache was asked)
    rerolled: str = ""             # the loops over rows re-rolled before the search (superopt/reroll.py)
    loops: str = ""                # what the loop passes did (superopt/loops.py, superopt/regions.py)
    tier: str = ""                 # background=True: what ran while this specialization was made
    sizes: str = ""                # where the decision was made at other argument sizes (superopt/sizes.py)
    derivatives: str = ""          # whose derivative a changed program takes, and whether it was verified

    @property
    def optimized(self) -> bool:
        return self.kind is Outcome.OPTIMIZED

    @property
    def outcome(self) -> str:
        """The outcome as the report prints it: "optimized", or "kept original: <reason>"."""
        if self.kind is None:
            return ""
        return "optimized" if self.optimized else f"kept original: {self.reason}"

    def _numerics_line(self) -> str:
        guarded = ("; the program runs behind a run-time check, the original where it fails (the cost line says "
                   "what it checks)") if self.guarded and self.optimized else ""
        if self.numerics == "fast":
            if not self.overflow_rewrites:
                return "fast; no rewrite that can change overflow fired" + guarded
            shown = ", ".join(f"{n} x{k}" for n, k in sorted(self.overflow_rewrites.items()))
            return f"fast; rewrites that can change overflow fired: {shown}" + guarded
        if not self.left_out:
            return "strict" + guarded
        return (f"strict; {len(self.left_out)} rules that can change overflow left out (numerics=\"fast\" runs "
                f"them)" + guarded)

    def _ops_changed(self, diffs: list[str]) -> str:
        if diffs:
            return ", ".join(diffs)
        if not self.optimized:
            return "none (the original runs)"
        # a cheaper program with the same op counts: the ops were re-associated, re-ordered or reshaped
        return "same op counts; the program changed (operands re-associated or re-arranged)"

    @property
    def speedup_estimate(self) -> float:
        return self.cost_before / self.cost_after if self.cost_after > 0 else float("inf")

    @property
    def cost_line(self) -> str:
        """The model's cost before and after, as every view of the result prints it."""
        return f"{_fmt_time(self.cost_before)} -> {_fmt_time(self.cost_after)} per call ({self.speedup_estimate:.2f}x)"

    def __str__(self) -> str:
        r = self.run
        phases = sum(ph.seconds for ph in r.phases)
        stage = self.stage_seconds.get("saturate")
        timing = f"{_fmt_time(phases)} in its phases" + (
            f" (the saturate stage, {_fmt_time(stage)}, adds its child process and the e-graph's transfer)"
            if stage is not None else "")
        lines = [
            f"superopt report (target {self.target})",
            f"  outcome      : {self.outcome}",
            f"  saturation   : {stop_phrase(r.stop_reason)} after {plural(r.iterations, 'iteration')}, {timing}",
            f"  e-graph      : {r.enodes} e-nodes in {r.eclasses} e-classes",
            f"  cost (model) : {self.cost_line}" + (f", extracted by {self.extraction}" if self.extraction else ""),
        ]
        for ph in r.phases:
            bans = ", ".join(f"{n} x{k}" for n, k in sorted(ph.bans.items()))
            lines.append(f"  phase {ph.name:<7}: {stop_phrase(ph.stop_reason)} after "
                         f"{plural(ph.iterations, 'iteration')}, {_fmt_time(ph.seconds)}"
                         + (f"; backed off: {bans}" if bans else ""))
        if r.error:
            lines.append(f"  error        : {r.error}")
        fired = r.fired
        lines.append(f"  rules fired  : {len(fired)} of {len(r.matches)}")
        for name, n in sorted(fired.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"    {name:<34} {n:>6} {'match' if n == 1 else 'matches':<7}  "
                         f"{_fmt_time(r.rule_seconds.get(name, 0.0)):>9}")
        changed = sorted(set(self.ops_before) | set(self.ops_after))
        diffs = [f"{op} {self.ops_before.get(op, 0)}->{self.ops_after.get(op, 0)}" for op in changed
                 if self.ops_before.get(op, 0) != self.ops_after.get(op, 0)]
        if self.loops:
            lines.append(f"  loops        : {self.loops}")
        if self.rerolled:
            lines.append(f"  re-rolled    : {self.rerolled}")
        lines.append("  numerics     : " + self._numerics_line())
        lines.append("  ops changed  : " + self._ops_changed(diffs))
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
            lines.append("  larger fusions (the largest available where smaller kernels were chosen):")
            lines += [f"    {text}" for text in fusion_lines(self.declined)]
        if self.top_costs:
            lines.append("  costliest ops of the chosen program:")
            for cost, what in self.top_costs:
                lines.append(f"    {_fmt_time(cost):>10}  {what}")
        lines.append(f"  runs on      : {self.backend}")
        if self.derivatives:
            lines.append(f"  derivatives  : {self.derivatives}")
        if self.segments:
            lines.append(f"  segments     : {self.segments}")
        if self.cache:
            lines.append(f"  cache        : {self.cache}")
        if self.tier:
            lines.append(f"  tier         : {self.tier}")
        if self.sizes:
            lines.append(f"  sizes        : {self.sizes}")
        lines += self.npu_lines
        lines.append("  stages       : " + ", ".join(f"{k} {_fmt_time(v)}" for k, v in self.stage_seconds.items()))
        return "\n".join(lines)
