"""`superopt(fn, target)`: capture, encode, saturate, extract, lower, verify."""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax

from superopt import numerics as numerics_mode
from superopt import verify as verification
from superopt.egraph.capture import capture
from superopt.egraph.encode import encode
from superopt.egraph.isolate import saturate_isolated
from superopt.egraph.ir import Graph, pretty
from superopt.egraph.runner import Limits, RunReport, StopReason
from superopt.extract.greedy import ExtractionError, extract, program_cost
from superopt.extract.memory import parse_bytes, peak_memory
from superopt.extract.target import load_target
from superopt.lowering.jax import lower
from superopt.npu_backend import check_precision, on_emulator  # the NPU backend; here for `optimize`
from superopt.report import Report
from superopt.rewrites.schedule import Schedule
from superopt.rulesets import DEFAULT

# The cost model does not resolve differences of a few percent; a program that is predicted to be
# less than this much faster is not worth swapping in for the original.
MIN_PREDICTED_GAIN = 0.03


@dataclass
class Specialization:
    """superopt's result for one set of argument shapes and dtypes."""
    run: Callable          # flat arrays -> flat outputs
    report: Report
    term: Graph            # the program that runs
    original: Graph
    out_tree: Any          # pytree structure of fn's result
    avals: tuple = ()      # (shape, dtype) per flat argument
    npu: Any = None        # the NpuExecutable `run` is, when the program runs on the NPU emulator


class _Stages:
    def __init__(self):
        self.seconds: dict[str, float] = {}

    def __call__(self, name: str, fn, *args):
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds[name] = time.perf_counter() - start


def _describe(graph: Graph, costs: list[float], target, k: int = 5) -> list[tuple[float, str]]:
    """The k costliest kernels with the cost model's breakdown of each."""
    from superopt.egraph.ir import body_str, type_str
    from superopt.extract.cost import op_breakdown
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
        out.append((c, f"{what} -> {type_str(node)}  [{_factors(parts)}]{tiled}"))
    return out


def _short(text: str, width: int = 72) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _factors(parts: dict) -> str:
    from superopt.extract.cost import penalty_notes
    shown = [f"{parts['flops']:.3g} flop", f"{parts['bytes']:.3g} B"]
    if "occupancy" in parts:
        shown += [f"{parts['registers']} regs", f"occupancy {parts['occupancy']:.2f}"]
    if "unit" in parts:
        shown += [parts["unit"], f"UB {parts['ub_bytes']} B"]
    return ", ".join(shown + penalty_notes(parts))


EXTRACTORS = ("greedy", "ilp")
BACKENDS = ("jax",)          # plus "emulator" on an NPU target (its default there), "pallas" on a GPU target


def _extract(frozen, enc, tgt, extractor: str, memory_budget: int | None = None):
    if extractor == "ilp":
        from superopt.extract.ilp import extract_ilp
        return extract_ilp(frozen, enc, tgt)
    return extract(frozen, enc, tgt, memory_budget=memory_budget)


def optimize(fn: Callable, args: tuple, target: str, rulesets, limits: Limits, check: bool,
             extractor: str = "greedy", backend: str = "jax", memory_budget: int | None = None,
             numerics: str = "strict", precision: str | None = None) -> Specialization:
    """The pipeline for one specialization; never returns a program that disagrees with `fn`."""
    spec = _optimize(fn, args, target, rulesets, limits, check, extractor, memory_budget, numerics)
    if backend == "emulator":
        spec = on_emulator(spec, load_target(target), spec.avals, check, precision=precision,
                           example=jax.tree_util.tree_leaves(args))
    elif backend == "pallas":
        from superopt.lowering.pallas.program import on_pallas
        spec = on_pallas(spec, load_target(target), check)
    return spec


def _optimize(fn: Callable, args: tuple, target: str, rulesets, limits: Limits, check: bool,
              extractor: str, memory_budget: int | None = None, numerics: str = "strict") -> Specialization:
    from superopt.deadline import Deadline, TimeLimit
    deadline = Deadline(limits.seconds)   # one clock: Limits.seconds bounds every stage of the call together
    tgt = load_target(target)
    stage = _Stages()
    captured = stage("capture", capture, fn, args)
    original = captured.graph
    schedule = rulesets if isinstance(rulesets, Schedule) else Schedule.of(*rulesets)
    left_out = numerics_mode.left_out(schedule, numerics)
    schedule = numerics_mode.restrict(schedule, numerics)
    cost_before, original_costs = program_cost(original, tgt)
    report = Report(target, RunReport(StopReason.SATURATED), cost_before=cost_before, cost_after=cost_before,
                    ops_before=original.op_counts(), numerics=numerics, left_out=left_out)
    jitted_original = jax.jit(lambda *flat: jax.tree_util.tree_leaves(
        fn(*jax.tree_util.tree_unflatten(captured.in_tree, flat))))

    def keep_original(why: str) -> Specialization:
        report.outcome = f"kept original: {why}"
        report.ops_after = report.ops_before
        report.gradient_traffic = _gradient_traffic(original, original)
        report.peak_memory = (peak_memory(original),) * 2
        if report.memory_note:
            report.memory_note += f"; the original runs instead (peak {report.peak_memory[0]})"
        report.cost_after = cost_before
        report.top_costs = _describe(original, original_costs, tgt)
        report.stage_seconds = stage.seconds
        return Specialization(jitted_original, report, original, original, captured.out_tree, captured.in_avals)

    def out_of_time(where: str) -> Specialization:   # the original is always correct; no unverified program
        report.run.stop_reason = StopReason.TIME_LIMIT
        return keep_original(f"time limit ({where})")

    try:
        deadline.check("capture")
        enc = stage("encode", encode, original, deadline)
        # In a child process: hard time and memory limits, and a crash in egglog cannot take the caller down.
        # It gets at most half of the time left (runner.SATURATION_SHARE); the later stages share the rest.
        run, frozen = stage("saturate", saturate_isolated, enc.egraph, schedule, limits, deadline)
    except TimeLimit as exc:
        return out_of_time(f"{exc.stage}: the call's {limits.seconds:g} s ran out")
    report.run = run
    report.overflow_rewrites = numerics_mode.overflow_rewrites(schedule, run.fired)
    if frozen is None:
        if run.stop_reason is StopReason.TIME_LIMIT:
            return out_of_time(f"saturate: {run.error}")
        return keep_original(f"saturation failed ({run.error})")
    try:
        chosen = stage("extract", deadline.bind(_extract), frozen, enc, tgt, extractor, memory_budget)
    except TimeLimit as exc:
        return out_of_time(f"{exc.stage}: the call's {limits.seconds:g} s ran out")
    except ExtractionError as exc:
        return keep_original(str(exc))
    report.cost_after = chosen.cost
    report.extraction = chosen.method
    report.declined = chosen.declined
    report.ops_after = chosen.graph.op_counts()
    report.gradient_traffic = _gradient_traffic(original, chosen.graph)
    report.peak_memory = (peak_memory(original), peak_memory(chosen.graph))
    report.memory_note = chosen.memory
    report.top_costs = _describe(chosen.graph, chosen.node_costs, tgt)
    # Under a memory budget the original does not meet, a program that meets it wins at any cost.
    fits_only_after = memory_budget is not None and \
        report.peak_memory[1].bytes <= memory_budget < report.peak_memory[0].bytes
    if not fits_only_after and not chosen.cost < cost_before * (1 - 1e-9):
        return keep_original("no cheaper program found")
    if not fits_only_after and chosen.cost > cost_before * (1 - MIN_PREDICTED_GAIN):
        gain = 1 - chosen.cost / cost_before
        return keep_original(f"predicted gain {gain:.1%} is below the {MIN_PREDICTED_GAIN:.0%} threshold")
    # A changed program is returned only if it was verified before the deadline; else the original runs.
    if deadline.expired():
        return out_of_time(f"extract: the call's {limits.seconds:g} s ran out")
    program = stage("lower", lower, chosen.graph)
    if deadline.expired():
        return out_of_time(f"lower: the call's {limits.seconds:g} s ran out")
    if check:
        try:
            problem = stage("verify", _verify, jitted_original, program, captured.in_avals, original, numerics)
        except TimeLimit:
            raise
        except Exception as exc:   # noqa: BLE001 -- a program XLA cannot run here is not returned either
            message = str(exc).splitlines()[0] if str(exc) else ""
            problem = f"the optimized program failed to run ({type(exc).__name__}: {message[:200]})"
        if problem:
            warnings.warn(f"superopt: the optimized program differs from the original ({problem}); "
                          f"returning the original. Rules involved: {', '.join(run.fired) or 'none'}",
                          verification.VerificationWarning, stacklevel=3)
            return keep_original(f"verification failed: {problem}")
        if deadline.expired():
            return out_of_time(f"verify: the call's {limits.seconds:g} s ran out")
    report.outcome = "optimized"
    report.stage_seconds = stage.seconds
    return Specialization(program, report, chosen.graph, original, captured.out_tree, captured.in_avals)


def _verify(reference: Callable, candidate: Callable, avals, original: Graph, numerics: str = "strict",
            trials: int = 2) -> str | None:
    """None if `candidate` keeps the numerics contract of `numerics` against `reference` (the original as
    jax.jit runs it) on random inputs and on adversarial ones (near overflow, zeros, NaN, inf, integer
    extremes; `superopt.verify.verify`), else what differed and on which inputs. Where finite values
    differ beyond tolerance, the candidate passes if it is as accurate as the original against the
    float64 value of the original program."""
    return verification.verify(reference, candidate, avals, original, numerics, trials)


def _gradient_traffic(original: Graph, chosen: Graph, groups_before=(), groups_after=()) -> tuple:
    """(before, after) passes over gradient memory, or () when the program has no gradient tensors;
    the groups are the sibling launches of the backend that runs each program (none: one op a launch)."""
    from superopt.extract.traffic import gradient_traffic
    before = gradient_traffic(original, groups_before)
    if not before.tensors:
        return ()
    return before, (before if chosen is original else gradient_traffic(chosen, groups_after))


def _leaf_type(x) -> tuple:
    try:
        return x.shape, x.dtype
    except AttributeError:  # a Python scalar
        return (), type(x)


class Optimized:
    """A callable with `fn`'s signature, specialized and cached per argument shapes and dtypes."""

    def __init__(self, fn: Callable, target: str, rulesets, limits: Limits, verify: bool, extractor: str = "greedy",
                 backend: str | None = None, memory_budget: int | str | None = None, numerics: str = "strict",
                 precision: str | None = None):
        # Every misuse is one line naming the bad value and the valid ones, raised here, before any work.
        if not callable(fn):
            raise TypeError(f"superopt: fn must be callable, got {type(fn).__name__}")
        if not isinstance(target, str):
            raise TypeError(f"superopt: target must be a string such as 'cpu', got {type(target).__name__}")
        tgt = load_target(target)  # an unknown target fails here, listing the valid ones
        self.numerics = numerics_mode.check_mode(numerics)
        self.precision = check_precision(precision, tgt)
        if extractor not in EXTRACTORS:
            raise ValueError(f"superopt: unknown extractor {extractor!r}; valid: {', '.join(EXTRACTORS)}")
        backends = BACKENDS + (("emulator",) if tgt.npu is not None else ()) \
            + (("pallas",) if tgt.kind == "gpu" else ())
        backend = backend or ("emulator" if tgt.npu is not None else "jax")
        if backend not in backends:
            raise ValueError(f"superopt: backend {backend!r} is not available for target {target!r}; "
                             f"valid: {', '.join(backends)}")
        self.extractor, self.backend = extractor, backend
        self.memory_budget = None if memory_budget is None else parse_bytes(memory_budget)
        if self.memory_budget is not None and extractor != "greedy":
            raise ValueError(f"superopt: memory_budget works with the greedy extractor, not {extractor!r}")
        if not isinstance(rulesets, Schedule):
            from superopt.rewrites.rule import RuleSet
            from superopt.rulesets import RULESETS
            if isinstance(rulesets, (str, RuleSet)):     # one rule set: rulesets="algebra"
                rulesets = (rulesets,)
            try:
                rulesets = tuple(rulesets)
            except TypeError:
                raise TypeError(f"superopt: rulesets must be rule set names, RuleSet objects or a Schedule, "
                                f"got {type(rulesets).__name__}; known rule sets: {', '.join(sorted(RULESETS))}") \
                    from None
            bad = [rs for rs in rulesets if not isinstance(rs, (str, RuleSet))]
            if bad:
                raise TypeError(f"superopt: rulesets must be rule set names or RuleSet objects, got "
                                f"{bad[0]!r} ({type(bad[0]).__name__}); known rule sets: "
                                f"{', '.join(sorted(RULESETS))}")
            rulesets = Schedule.of(*rulesets)
        if isinstance(limits, dict):                      # limits={"seconds": 1}
            import dataclasses
            valid = [f.name for f in dataclasses.fields(Limits)]
            unknown = sorted(set(limits) - set(valid), key=str)
            if unknown:
                raise ValueError(f"superopt: unknown limit {unknown[0]!r}; valid: {', '.join(valid)}")
            limits = Limits(**limits)
        elif not isinstance(limits, Limits):
            raise TypeError(f"superopt: limits must be a Limits or a dict of its fields, got {type(limits).__name__}")
        self.fn, self.target, self.rulesets, self.limits, self.verify = fn, target, rulesets, limits, verify
        self._cache: dict[tuple, Specialization] = {}
        self._last: Specialization | None = None
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", "optimized")
        self.__doc__ = getattr(fn, "__doc__", None)

    def _lookup(self, args) -> tuple[Specialization, list]:
        leaves, tree = jax.tree_util.tree_flatten(args)
        key = (tree, tuple(_leaf_type(x) for x in leaves))
        spec = self._cache.get(key)
        if spec is None:
            spec = self._cache[key] = optimize(self.fn, args, self.target, self.rulesets, self.limits, self.verify,
                                               self.extractor, self.backend, self.memory_budget, self.numerics,
                                               self.precision)
        self._last = spec
        return spec, leaves

    def compile(self, *args) -> Specialization:
        """Optimize for these argument shapes and dtypes (once; later calls hit the cache)."""
        return self._lookup(args)[0]

    def __call__(self, *args):
        spec, leaves = self._lookup(args)
        return jax.tree_util.tree_unflatten(spec.out_tree, spec.run(*leaves))

    def _specialization(self) -> Specialization:
        if self._last is None:
            raise RuntimeError("superopt: nothing compiled yet; call the function (or .compile(*args)) first")
        return self._last

    @property
    def report(self) -> Report:
        return self._specialization().report

    @property
    def term(self) -> str:
        return pretty(self._specialization().term)

    @property
    def npu(self):
        """The NPU program (`lowering.npu.lower.NpuExecutable`) when this runs on the emulator, else None;
        `.last` is the latest call's emulation (cycles, utilisation, timeline)."""
        return self._specialization().npu


def superopt(fn: Callable | None = None, target: str = "cpu", *, rulesets: Sequence[Any] | Schedule = DEFAULT,
             limits: Limits | None = None, verify: bool = True, extractor: str = "greedy",
             backend: str | None = None, memory_budget: int | str | None = None, numerics: str = "strict",
             precision: str | None = None):
    """Optimize `fn` for `target`; usable as `superopt(fn, ...)` or as a decorator `@superopt(target=...)`.

    `rulesets` names rule sets (or gives RuleSet objects), run as one phase each in order, or is a
    `Schedule` of phases with their own limits and back-off. `extractor` is "greedy" (DAG-aware, the
    default) or "ilp" (HiGHS; optimal on small graphs, never worse than greedy). `backend` is what runs
    the chosen program: "jax" (the default on CPU and GPU targets) or, on an NPU target, "emulator" (the
    default there: cube and vector programs on the cycle-counting emulator, `lowering/npu`) or, on a GPU
    target, "pallas" (one Pallas kernel per kernel of the term, `lowering/pallas`; interpret mode on a CPU).
    `memory_budget` (bytes, or a size such as "64MB") bounds the chosen program's peak memory under the
    model of `extract/memory.py`: intermediates are recomputed in their consumers instead of stored until
    the peak fits, and the report says whether it did. `numerics` is "strict" (the default: only rewrites
    that keep the numerics contract of README.md, finite and NaN results exactly where the original has
    them) or "fast" (also rewrites that are equal over the reals but may overflow where the original does
    not, such as re-associating a matrix product; the report lists each one that fired). `precision`, on
    an NPU target, is the type the cube multiplies float32 operands in: "fp16" (its full rate) or "fp32"
    (where the chip has an fp32 rate); None chooses per program (`npu_backend.default_precision`)."""
    options = dict(rulesets=rulesets, limits=limits, verify=verify, extractor=extractor, backend=backend,
                   memory_budget=memory_budget, numerics=numerics, precision=precision)
    if fn is None:   # the decorator form: check the options now, not at the first call
        Optimized(lambda *args: None, target, rulesets, Limits() if limits is None else limits, verify, extractor,
                  backend, memory_budget, numerics, precision)
        return lambda f: superopt(f, target, **options)
    if not callable(fn):
        raise TypeError(f"superopt: fn must be callable, got {type(fn).__name__}")
    return Optimized(fn, target, rulesets, Limits() if limits is None else limits, verify, extractor, backend,
                     memory_budget, numerics, precision)
