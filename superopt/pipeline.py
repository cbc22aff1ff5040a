"""The pipeline for one specialization, as stage functions with typed results:

    capture  -> Captured     (egraph/capture.py: the jaxpr of fn at abstract values, as a Graph)
    saturate -> Saturated    (encode into egglog, then equality saturation in a child process)
    extract  -> Extraction   (extract/greedy.py or extract/ilp.py under the target's cost model)
    lower    -> a callable   (lowering/jax.py: one jitted JAX program)
    verify   -> None         (superopt/core/verify.py: the numerics contract against the original)

and then the backend (`superopt/backends.py`: jax, pallas or the NPU emulator) that runs the program.
A stage that decides the original program runs raises `Kept` with a typed `Outcome`; `optimize` builds the
report once, at the end, from what the stages returned. `api.py` is the JAX transformation over
`optimize`; `bench` and the command line go through it too (`explain.alternatives` saturates in process,
with its whole budget, to list alternatives).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import numpy as np

from superopt import numerics as numerics_mode
from superopt.backends import BACKENDS, with_users_derivative
from superopt.cache import CacheWarning
from superopt.core import lazy, verify as verification
from superopt.core.deadline import Deadline, TimeLimit
from superopt.core.ir import Graph, Guard, body_str, carry_scopes, type_str, unfused
from superopt.core.reference import evaluate as evaluate_reference
from superopt.core.serial import NotSerializable, digest, to_data
from superopt.egraph.capture import (Captured, calls_host, capture, custom_calls, graph_calls_host, with_stand_ins,
                                     without_debug_effects)
from superopt.egraph.limits import Limits, RunReport, StopReason
from superopt.extract.cost import op_breakdown
from superopt.extract import guard as guarding
from superopt.extract.errors import ExtractionError
from superopt.extract.extraction import Extraction, as_run, program_cost
from superopt.extract.memory import peak_memory
from superopt.extract.models.breakdown import Breakdown
from superopt.extract.target import Target, load_target
from superopt.extract.traffic import gradient_traffic as traffic
from superopt.lowering.hlo import executable
from superopt.lowering.jax import guard_test, inlined, lower
from superopt.report import Outcome, Report
from superopt.extract.loops import loop_notes
from superopt.loops import vectorize, vectorized_note
from superopt import regions
from superopt.reroll import reroll, rerolled_note
from superopt.sizes import Decision, Sizes, stand_ins
from superopt.reuse import (
    combined_run,
    compiled_rules,
    fingerprint,
    prepare_rules,
    program_key,
    run_from_data,
    run_to_data,
    save_rules,
    term_from_entry,
    with_consts,
)
from superopt.rewrites.schedule import Schedule
from superopt.segments import seam_windows, split, stitch
from superopt.workers import Failed, placed, run_all

# The stages that import egglog, imported where a program is saturated: a call the cache answers loads none.
encoding = lazy.module("superopt.egraph.encode")
freezing = lazy.module("superopt.egraph.frozen")
isolate = lazy.module("superopt.egraph.isolate")
runner = lazy.module("superopt.egraph.runner")
greedy = lazy.module("superopt.extract.greedy")
ilp = lazy.module("superopt.extract.ilp")

# The cost model does not resolve differences of a few percent; a program that is predicted to be
# less than this much faster is not worth swapping in for the original.
MIN_PREDICTED_GAIN = 0.03
# A guarded program's check runs on every call, and where it fails the original runs after it: a check of domain
# conditions (x > 0, |x| moderate), which ordinary data fails as often as not, may cost at most this share of the
# original's predicted time, so that such calls are at most that much slower than jax.jit's. (A check that only
# excludes overflow fails on NaN, inf or huge elements alone, which ordinary data does not hold: bench/guard.py.)
MAX_CHECK_SHARE = 0.05
# A segment's worker is killed this many seconds past the call's time limit (a backstop: a job stops at the
# limit by itself), and its segment runs as captured.
WORKER_MARGIN = 30.0
EXTRACTORS = ("greedy", "ilp")


@dataclass
class Specialization:
    """superopt's result for one set of argument types: the program that runs, and the report."""
    run: Callable          # flat arrays -> flat outputs
    report: Report
    term: Graph            # the program that runs
    original: Graph
    out_tree: Any          # pytree structure of fn's result
    avals: tuple = ()      # (shape, dtype) per flat argument
    npu: Any = None        # the NpuExecutable `run` is, when the program runs on the NPU emulator
    out_keys: dict = field(default_factory=dict)   # flat output index -> PRNG impl, for typed key results
    reference: Callable | None = None   # the user's program, debug prints left out: what backends check against
    custom_calls: frozenset = frozenset()   # the custom_jvp/custom_vjp calls the user's program makes (capture)
    differentiated: Callable | None = None  # the user's program, host callbacks calling the user's code:
    #                                         what runs in a changed program's place under differentiation
    _traced: Any = None    # the program bound under a trace, when `run` is not a JAX computation
    pieces: Any = None     # `Pieces`, where the program was optimized in segments

    @property
    def program(self) -> Callable:
        """The backend's program that `run` calls (a `PallasProgram`, an NPU emulator run, the JAX program),
        without the derivative rule that `backends.with_derivatives` puts around a changed one."""
        return getattr(self.run, "program", self.run)

    def unflatten(self, outs) -> Any:
        """fn's result from the program's flat outputs (key data of a typed key result wrapped again)."""
        outs = list(outs)
        for j, impl in self.out_keys.items():
            outs[j] = jax.random.wrap_key_data(outs[j], impl=impl)
        return jax.tree_util.tree_unflatten(self.out_tree, outs)

    def bind(self, flat: list, npu_under_trace: str = "jax") -> Any:
        """Run the program on traced arguments, in the caller's trace: a JAX program binds its equations
        there; the NPU emulator, which is not a JAX computation, is replaced by the extracted program as JAX
        or (npu_under_trace="callback") called through `jax.pure_callback`."""
        flat = [jax.random.key_data(x) if is_key(x.dtype) else x for x in flat]
        if self.npu is None:
            return self.unflatten(self.run(*flat))
        if self._traced is None:
            program = with_users_derivative(lower(self.term), self)   # the user's custom rules, as on jax
            if npu_under_trace == "callback":
                shapes = jax.eval_shape(lambda *a: program(*a), *flat)
                self._traced = lambda *a: jax.pure_callback(lambda *c: [np.asarray(o) for o in self.run(*c)],
                                                            shapes, *a, vmap_method="sequential")
                how = "calls the emulator through jax.pure_callback"
            else:
                self._traced = program
                how = "runs the extracted program as JAX (npu_under_trace='callback' calls the emulator)"
            self.report.backend += f"; under a JAX trace it {how}"
        return self.unflatten(self._traced(*flat))



@dataclass
class Pieces:
    """A specialization's segments (superopt/segments.py): in program order, the distinct ones by key, and
    the program each distinct one runs (its chosen program, or itself where that was kept)."""
    segments: list
    distinct: dict
    chosen: dict
    store: Any = None      # the persistent cache, where backends keep their per-segment results
    fingerprint: str = ""  # what decided the chosen programs besides each segment (superopt/reuse.py)
    graph: Any = None      # the program the segments are cut from: the captured one, or the stitched one
    before: str = "original program"   # what each segment's own graph is (the NPU's "before" cycles)


def is_key(dtype) -> bool:
    """Whether `dtype` is a typed PRNG key's (an extended dtype; keys are opaque to the optimizer)."""
    return jax.dtypes.issubdtype(dtype, jax.dtypes.extended)


class Kept(Exception):
    """A stage decided that the original program runs: `outcome` says which kind of reason, `reason` the words."""

    def __init__(self, outcome: Outcome, reason: str):
        super().__init__(reason)
        self.outcome, self.reason = outcome, reason


@dataclass
class Saturated:
    run: RunReport
    frozen: Any            # the saturated e-graph, read back (egraph/frozen.py); None if saturation failed
    encoding: Any          # egraph/encode.py's Encoding: e-class ids of the original's nodes


# ---- the stages ----

def schedule_of(rulesets, numerics: str, kind: str | None = None) -> tuple[Schedule, list[str]]:
    """The schedule of `rulesets` (names, RuleSets or a Schedule) with the rules the numerics mode runs (and,
    given a target `kind`, that are written for it), and the names of those the mode leaves out."""
    schedule = rulesets if isinstance(rulesets, Schedule) else Schedule.of(*rulesets)
    if kind is not None:
        schedule = schedule.for_target(kind)
    return numerics_mode.restrict(schedule, numerics), numerics_mode.left_out(schedule, numerics)


def ran_out(exc: TimeLimit, limits: Limits) -> str:
    """The report's reason for a time limit: the call's, or a segment search's CPU time."""
    if exc.cpu:
        return f"time limit ({exc.stage}: the segment's {exc.seconds:g} s of CPU time ran out)"
    return f"time limit ({exc.stage}: the call's {limits.seconds:g} s ran out)"


def saturate(captured: Captured, schedule: Schedule, limits: Limits, deadline: Deadline,
             timer: "Stages", isolated: bool = True, origins: bool = False) -> Saturated:
    """Encode the captured program and saturate it in a child process (hard time and memory limits; a crash
    in egglog cannot take the caller down). It gets at most half the time left (runner.SATURATION_SHARE).
    `isolated=False` saturates in this process with the whole of `limits` (explain's search for
    alternatives, the benchmarks' probes: they need the time more than the isolation). `origins`: each node's
    class records its id, for rules that assume a domain condition (a speculative search: `_guarded`)."""
    try:
        with encoding.scratch() as empty:   # the process's template e-graph, restored when the search is done
            enc = timer("encode", encoding.encode, captured.graph, deadline, origins, empty)
            if isolated:
                run, frozen = timer("saturate", isolate.saturate_isolated, enc.egraph, schedule, limits, deadline)
            else:
                run = timer("saturate", runner.saturate, enc.egraph, schedule, limits)
                frozen = freezing.freeze(enc.egraph)
    except TimeLimit as exc:
        raise Kept(Outcome.TIME_LIMIT, ran_out(exc, limits)) from None
    return Saturated(run, frozen, enc)


def choose(saturated: Saturated, target, extractor: str, memory_budget: int | None, deadline: Deadline,
           limits: Limits, timer: "Stages", search: Deadline | None = None, numerics: str = "strict") -> Extraction:
    """Extract the cheapest program from the saturated e-graph under `target`'s cost model: its optional
    work within `search` (default: `deadline`), the choice within `deadline`. Under strict `numerics`, what
    flows into a comparison or a rounding is computed as captured (extract/cone.py)."""
    run = saturated.run
    if saturated.frozen is None:
        if run.stop_reason is StopReason.TIME_LIMIT:
            raise Kept(Outcome.TIME_LIMIT, f"time limit (saturate: {run.error})")
        raise Kept(Outcome.SATURATION_FAILED, f"saturation failed ({run.error})")

    def pick(frozen, enc):
        keep_cone = numerics == "strict"
        if extractor == "ilp":
            return ilp.extract_ilp(frozen, enc, target, keep_cone=keep_cone)
        return greedy.extract(frozen, enc, target, memory_budget=memory_budget, keep_cone=keep_cone)
    try:
        return timer("extract", deadline.bind(pick, search=search), saturated.frozen, saturated.encoding)
    except TimeLimit as exc:
        raise Kept(Outcome.TIME_LIMIT, ran_out(exc, limits)) from None
    except ExtractionError as exc:
        raise Kept(Outcome.EXTRACTION_FAILED, str(exc)) from None


# tune=True: each program is timed in samples of about this many seconds of back-to-back calls
TUNE_SAMPLE_SECONDS = 0.005


def measured(original: Callable, candidate: Callable, captured: Captured, samples: int = 7) -> str:
    """Time `candidate` against `original` on this machine, interleaved, on superopt's random inputs (the
    per-call median of `samples` samples, each enough calls to take about TUNE_SAMPLE_SECONDS). Raise
    Kept unless the candidate is faster by MIN_PREDICTED_GAIN; else the words for the report."""
    from superopt.timing import interleaved_medians
    args = verification.random_args(captured.in_avals, 0)
    for fn in (original, candidate):
        jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    jax.block_until_ready(original(*args))
    calls = max(1, int(TUNE_SAMPLE_SECONDS / max(time.perf_counter() - start, 1e-7)))

    def repeat(fn):
        return lambda: [fn(*args) for _ in range(calls)][-1]
    times = interleaved_medians({"original": repeat(original), "candidate": repeat(candidate)}, repeats=samples)
    before, after = times["original"] / calls, times["candidate"] / calls
    words = f"measured here: {_us(after)} per call against the original's {_us(before)} (tune=True)"
    if after > before * (1 - MIN_PREDICTED_GAIN):
        raise Kept(Outcome.BELOW_THRESHOLD, words)
    return words


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} us"


def worth_it(chosen: Extraction, cost_before: float, peaks: tuple, memory_budget: int | None) -> None:
    """Raise Kept unless the chosen program is predicted cheaper by MIN_PREDICTED_GAIN, or it alone meets
    the memory budget (then it wins at any cost)."""
    fits_only_after = memory_budget is not None and peaks[1].bytes <= memory_budget < peaks[0].bytes
    if fits_only_after:
        return
    if not chosen.cost < cost_before * (1 - 1e-9):
        raise Kept(Outcome.NO_GAIN, "no cheaper program found")
    if chosen.cost > cost_before * (1 - MIN_PREDICTED_GAIN):
        gain = 1 - chosen.cost / cost_before
        raise Kept(Outcome.BELOW_THRESHOLD,
                   f"predicted gain {gain:.1%} is below the {MIN_PREDICTED_GAIN:.0%} threshold")


def runs_here(tgt) -> bool:
    """Whether this process's JAX compiles for the target's kind of device (a cpu target on a CPU, a GPU target
    on a GPU): only then is what XLA compiles here the program the target runs (`same_executable`)."""
    platform = jax.default_backend()
    return tgt.kind == {"cuda": "gpu", "rocm": "gpu"}.get(platform, platform)


def same_executable(reference: Callable, graph: Graph, captured: Captured) -> bool:
    """Whether XLA compiles `graph` (the chosen program, as superopt runs it on its own inputs) to the executable
    it compiles `reference` (the original, so run) to (`lowering/hlo.py`: the optimized HLO, names, metadata and
    the order of independent instructions aside). Then the rewrite changed nothing XLA does not change itself
    (its CSE, constant folding and algebraic simplifier), and the original runs. A guarded program, or an
    original verified by superopt's evaluator (no XLA program), is never the same."""
    if graph.guard is not None or not hasattr(reference, "lower"):
        return False
    args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in captured.in_avals]
    try:
        return executable(reference, args) == executable(inlined(graph, effects=False), args)
    except Exception:   # noqa: BLE001 - a program XLA cannot compile here is judged by verification
        return False


def check(reference: Callable, candidate: Callable, captured: Captured, numerics: str,
          fired: dict, remember: str | None = None, graph: Graph | None = None) -> None:
    """Raise Kept unless `candidate` keeps the numerics contract against `reference` (verify.verify: random
    and adversarial inputs of superopt's own, never the caller's). A candidate that fails to run (a program
    XLA cannot run here) is not returned either. Where `graph` (the candidate's program) is guarded by domain
    conditions, it is also checked on inputs moved into their domain (`verify.domain_args`), and at least one
    of them must pass its check: a rewritten side that never ran on superopt's inputs is not returned."""
    try:
        extra = _domain_sets(graph, captured)
        problem = verification.verify(reference, candidate, captured.in_avals, traced(captured), numerics,
                                      remember=remember, extra=extra)
    except TimeLimit:
        raise
    except Exception as exc:   # noqa: BLE001
        message = str(exc).splitlines()[0] if str(exc) else ""
        problem = f"the optimized program failed to run ({type(exc).__name__}: {message[:200]})"
    if problem:
        warnings.warn(f"superopt: the optimized program differs from the original ({problem}); "
                      f"returning the original. Rules involved: {', '.join(fired) or 'none'}",
                      verification.VerificationWarning, stacklevel=5)
        raise Kept(Outcome.VERIFICATION_FAILED, f"verification failed: {problem}")


def _domain_sets(graph: Graph | None, captured: Captured) -> list:
    """The domain sets (verify.domain_args) on which a program guarded by domain conditions runs its rewritten
    side; Kept where it runs it on none of them. [] for any other program."""
    if graph is None or graph.guard is None or not graph.guard.conditions:
        return []
    sets = [(f"inputs in the domain (scale {s:g}, seed {seed})", verification.domain_args(captured.in_avals, seed, s))
            for seed in range(2) for s in verification.DOMAIN_SCALES]
    passes = guard_test(graph)   # compiled once for the ten sets
    passing = [(where, args) for where, args in sets if passes(*args)]
    if not passing:
        raise Kept(Outcome.VERIFICATION_FAILED, "verification failed: the guard's check failed on every input set "
                                                "superopt drew in its domain, so the rewritten side is unverified")
    return passing


class Stages:
    """Runs stages and records each one's seconds (the report's `stage_seconds`; a stage run twice, such as
    the cache look-up of segments and of seams, adds up)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    def __call__(self, name: str, fn, *args):
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


def traced(captured: Captured) -> Graph:
    """The program as traced: what an optimized program is priced and reported against (`captured.graph` is
    what the search starts from, its loops over rows re-rolled: superopt/reroll.py)."""
    return captured.traced if captured.traced is not None else captured.graph


def reference_program(captured: Captured) -> Callable:
    """The user's program as jax.jit runs it, from the jaxpr capture traced (fn is not traced again), with
    output-less effects (debug prints) left out and host callbacks (`jax.pure_callback`) calling stand-ins
    (`capture.StandIn`): superopt runs it on its own inputs, which the user's host code must never see."""
    return _evaluated(with_stand_ins(without_debug_effects(captured.jaxpr)))


def differentiated_program(captured: Captured, reference: Callable) -> Callable:
    """The user's program as `reference` is, its host callbacks calling the user's code: what runs in place of
    a changed program under differentiation, where the user's own derivative rules must apply
    (backends.with_derivatives). `reference` itself where the program makes no host callback."""
    closed = without_debug_effects(captured.jaxpr)
    return _evaluated(closed) if calls_host(closed) else reference


def _evaluated(closed) -> Callable:
    return jax.jit(lambda *flat: jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *flat))


def on_own_inputs(graph: Graph, program: Callable) -> Callable:
    """`program` (`graph` lowered) as superopt runs it on its own inputs: its debug prints silent and its host
    callbacks calling stand-ins; `program` itself where it has neither."""
    return lower(graph, effects=False) if graph.hidden_outputs or graph_calls_host(graph) else program


# A program traced this long from a Python loop that re-rolling batched (superopt/reroll.py) takes XLA seconds
# to compile: 5.8 s for a 200-row loop of exp (1,200 ops) on the development machine, where superopt's own
# evaluator (core/reference.py) runs it in 15 ms. Verification runs it that way instead.
EVALUATED_REFERENCE_OPS = 500


def checking_reference(captured: Captured) -> Callable:
    """What verification compares a candidate with: the user's program as jax.jit runs it
    (`reference_program`), or, for a re-rolled program traced longer than EVALUATED_REFERENCE_OPS, the
    program as traced evaluated op by op in its own dtypes by superopt's reference evaluator."""
    if captured.traced is None or len(captured.traced.live()) <= EVALUATED_REFERENCE_OPS:
        return reference_program(captured)
    graph = captured.traced
    return lambda *flat: evaluate_reference(graph, flat)


def user_program(captured: Captured) -> Callable:
    """The user's program whole, effects and all: what runs when the original is kept."""
    closed = captured.jaxpr
    return jax.jit(lambda *flat: jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *flat))


# ---- the pipeline ----

def optimize(fn: Callable, args: tuple, target: "Target | str", rulesets, limits: Limits, check_results: bool,
             extractor: str = "greedy", backend: str = "jax", memory_budget: int | None = None,
             numerics: str = "strict", precision: str | None = None, example=None, store=None,
             executor: str | None = None, tune: bool = False, sizes: Sizes | None = None) -> Specialization:
    """The pipeline for one specialization; never returns a program that disagrees with `fn`. `args` may
    be abstract (`jax.ShapeDtypeStruct` leaves); `example`, the call's concrete flat arguments where
    there are some, is one more input the NPU program is checked on. `store` is the persistent cache
    (superopt/cache.py; None: none), `executor` where distinct segments are optimized (superopt/workers.py).
    `tune`: a verified program is also timed against the original on this machine (`measured`). `target`: as
    `superopt()` loaded it, or a name. `sizes`: the function's decisions at other argument sizes
    (superopt/sizes.py), which this one may take and adds to."""
    tgt = target if isinstance(target, Target) else load_target(target)
    spec = _jax_specialization(fn, args, tgt, rulesets, limits, check_results, extractor, memory_budget, numerics,
                               store, executor, tune, guard=backend == "jax", sizes=sizes)
    if backend != "jax" and (spec.original.hidden_outputs or spec.report.kind is Outcome.KEPT_WHOLE):
        # Effects run in the user's order only in the JAX program; the other backends check their program on
        # inputs of their own, which the user's callbacks must not see.
        what = "effects (debug prints or callbacks)" if spec.original.hidden_outputs else "a program kept whole"
        spec.report.backend = f"jax (the program has {what}, which run only on the jax backend)"
        return spec
    return BACKENDS[backend].lower(spec, tgt, check_results, precision=precision, example=example)


def _jax_specialization(fn: Callable, args: tuple, tgt, rulesets, limits: Limits, check_results: bool,
                        extractor: str, memory_budget: int | None, numerics: str, store=None,
                        executor: str | None = None, tune: bool = False, guard: bool = False,
                        sizes: Sizes | None = None) -> Specialization:
    """Capture, then the specialization every backend starts from: an earlier decision at other sizes
    (`sizes`), optimized whole, from the cache, or in segments (superopt/segments.py), each distinct one once.
    `guard`: under strict numerics, a guarded program may be chosen (`_guarded`; the JAX backend's only)."""
    timer = Stages()
    call = Deadline(limits.seconds)   # the whole call's, where it is in segments (each whole run keeps its own)
    captured = timer("capture", capture, fn, args)
    symbolic = sorted({str(d) for shape, _ in captured.in_avals for d in shape if not isinstance(d, int)})
    if symbolic:   # the cost model, the cache key and the checker's inputs all need sizes
        again = functools.partial(_jax_specialization, fn, tgt=tgt, rulesets=rulesets, limits=limits,
                                  check_results=check_results, extractor=extractor, memory_budget=memory_budget,
                                  numerics=numerics, store=store, executor=executor, tune=tune, guard=guard)
        return _symbolic(captured, args, again, tgt, numerics, timer, symbolic)
    if not (captured.kept_whole or captured.graph.hidden_outputs) and any(op.name == "scan"
                                                                          for op in captured.graph.opaque):
        lifted, done = timer("vectorize", vectorize, captured.graph)
        if done:
            captured = dataclasses.replace(captured, graph=lifted, traced=captured.graph,
                                           vectorized=vectorized_note(done))
    if not (captured.kept_whole or captured.graph.hidden_outputs) and any(op.name in regions.BODIES
                                                                          for op in captured.graph.opaque):
        body = _body_optimizer(tgt, rulesets, limits, check_results, extractor, numerics, store, executor, guard)
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
    schedule, left_out = schedule_of(rulesets, numerics, tgt.kind)
    # a guarded program's search adds the rules strict leaves out (the "reals" ones) and assumes the domain
    # conditions the analysis cannot prove (numerics.speculative)
    guarded = numerics_mode.speculative(schedule_of(rulesets, "fast", tgt.kind)[0]) if guard else None
    if guarded is not None and not (left_out and numerics == "strict") and not numerics_mode.assumes(guarded):
        guarded = None
    search = Search(tgt, schedule, left_out, limits, check_results, extractor, memory_budget, numerics, tune,
                    guarded, on_xla=guard and runs_here(tgt))
    reusable = sizes is not None and memory_budget is None and not (captured.kept_whole or
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
        return _segmented(captured, segments, search, store, executor, timer, call)
    dropped = ""
    if key is not None:
        found = timer("cache", _cached, store, key, "program", captured.graph, captured.graph.consts)
        if found is not None and search.check_results:
            found = timer("verify (cache)", _rechecked, found, store, key, "program", captured,
                          search.numerics)
            dropped = "" if found is not None else "; the entry failed its check and was dropped"
        if found is not None:
            spec = _specialization(captured, search, timer, *found)
            spec.report.cache = "hit (the result of an earlier optimization of this program)"
            return spec
    spec, entry = _whole(captured, search, timer, store)
    if key is not None:
        why = store.put(key, "program", entry) if entry is not None else "a time limit is not stored"
        spec.report.cache = f"miss{dropped}; " + ("result stored" if why is None else
                                                  why if entry is None else f"not stored ({why})")
    elif uncached:
        spec.report.cache = f"not stored ({uncached})"
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
        spec = _specialization(captured, search, timer, decision.run, decision.outcome, decision.reason, None)
        spec.report.sizes = f"{where} ({again})"
        return spec
    original, tgt = traced(captured), search.target
    try:
        graph, words = _guard_again(match.chosen, decision.chosen.guard, captured, original)
        program = _traced_like(graph, original)
        costs = program_cost(original, tgt)
        check = guard_check(graph)
        cost, node_costs = program_cost(match.chosen, tgt)
        extra = program_cost(check, tgt)[0] if check is not None else 0.0
        if graph.guard is not None and graph.guard.conditions and extra > MAX_CHECK_SHARE * costs[0]:
            return None
        chosen = Extraction(graph, cost + extra, node_costs, f"the program chosen at argument shapes "
                            f"{decision.sizes_text()}, renamed to these sizes" + (f"; guarded: runs where {words} "
                                                                                 "(else the original)" if words else ""))
        worth_it(chosen, costs[0], (), None)
        if search.check_results and not _holds_here(graph, check, captured, original, search.numerics):
            return None
    except Kept:
        return None   # no longer a gain at these sizes: searched at them
    except Exception:   # noqa: BLE001  - a renaming that does not hold here (its types, a malformed attribute)
        return None
    spec = _specialization(captured, search, timer, decision.run, Outcome.OPTIMIZED, "", chosen, program,
                           costs=costs)
    spec.report.sizes = f"{where}: priced again and checked on superopt's inputs at these sizes ({again})"
    return spec


def _guard_again(chosen: Graph, guard: Guard | None, captured: Captured, original: Graph) -> tuple[Graph, str]:
    """`chosen` (a renamed program, without a guard) guarded as `guard` was at the earlier sizes, its bound
    derived again at these (`_guarded`), and the guard's words; `chosen` itself where `guard` is None."""
    if guard is None:
        return chosen, ""
    program, words, exponent, args = captured.graph, [], None, ()
    if guard.exponent is not None:
        bound = _range_bound(captured, original, chosen, guarding.changed_results(program, chosen))
        if bound is None:
            raise Kept(Outcome.NO_GAIN, "the bound does not hold at these sizes")
        exponent, args, said = bound
        words.append(said)
    if guard.conditions:
        words.append(guarding.describe_conditions(program, guard.conditions))
    return dataclasses.replace(chosen, guard=Guard(exponent, args, program, guard.conditions)), "; and ".join(words)


def _range_bound(captured: Captured, original: Graph, chosen: Graph, changed) -> tuple[int, tuple, str] | None:
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


def _holds_here(graph: Graph, check: Graph | None, captured: Captured, original: Graph, numerics: str) -> bool:
    """Whether `graph` (a renamed program; `check`, its guard's check) agrees with `original` on verification's
    first random input set, both by the reference evaluator, as a cache entry is checked (`_rechecked`), and,
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


def _symbolic(captured: Captured, args: tuple, again: Callable, tgt, numerics: str, timer: Stages,
              symbols: list) -> Specialization:
    """A program with symbolic argument extents (`jax.export` with a symbolic batch): optimized at stand-in
    extents, taken at second stand-ins as a decision at other sizes is (which checks it there, so that no
    number the rewrites made is mistaken for an extent), and renamed to the symbols. Where any step does
    not hold, the program runs as captured."""
    first = stand_ins(captured.in_avals, captured.graph)
    second = first and stand_ins(captured.in_avals, captured.graph, skip=set(first.values()))
    kept = f"symbolic dimensions ({', '.join(symbols)}): "
    if not (first and second):
        return _as_captured(captured, tgt, numerics, timer, kept + "an extent is an expression of them, so the "
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
        return _as_captured(captured, tgt, numerics, timer, kept + f"at stand-in sizes it was {spec.report.outcome}")
    if spec.report.optimized:
        checked = again(at(second), sizes=decided)
        if not checked.report.sizes or not checked.report.optimized:
            return _as_captured(captured, tgt, numerics, timer, kept + "the program chosen at stand-in sizes does not "
                                "hold at other ones, so the program runs as captured")
    match = decided.find(captured.in_avals, captured.graph)
    if match is None:
        return _as_captured(captured, tgt, numerics, timer, kept + "the program is not the same at every size, "
                            "so it runs as captured")
    stand = ", ".join(f"{s}={v}" for s, v in first.items())
    if match.chosen is None:
        return _as_captured(captured, tgt, numerics, timer, f"{spec.report.reason} (decided at {stand} for the "
                            f"symbolic dimensions {', '.join(symbols)})", spec.report.kind)
    try:
        graph, _ = _guard_again(match.chosen, match.decision.chosen.guard, captured, captured.graph)
        program = _traced_like(graph, captured.graph)
    except Exception as exc:   # noqa: BLE001
        return _as_captured(captured, tgt, numerics, timer, kept + "the program chosen at stand-in sizes does not "
                            f"trace with them ({type(exc).__name__})")
    report = dataclasses.replace(spec.report, stage_seconds=timer.seconds,
                                 sizes=f"symbolic dimensions {', '.join(symbols)}: the program chosen at {stand} "
                                       "(and checked at other stand-ins), renamed to them; the cost line is at "
                                       f"{stand}")
    reference = reference_program(captured)
    return Specialization(program, report, graph, captured.graph, captured.out_tree, captured.in_avals,
                          reference=reference, custom_calls=custom_calls(captured.jaxpr),
                          differentiated=differentiated_program(captured, reference))


def _body_optimizer(tgt, rulesets, limits: Limits, check_results: bool, extractor: str, numerics: str, store,
                    executor: str | None, guard: bool) -> Callable:
    """What optimizes a loop's or branch's body (superopt/regions.py): the pipeline of the program around it,
    on the body as a program of its own (its own cache entry, its own verification), with no memory budget
    (a budget is the whole program's): the body's program traced back to a jaxpr (None where it is kept), and
    the rules that fired."""
    def optimize(closed):
        spec = _jax_specialization(regions.as_function(closed), regions.avals_of(closed), tgt, rulesets, limits,
                                   check_results, extractor, None, numerics, store, executor, guard=guard)
        fired = tuple(spec.report.run.fired)
        if spec.report.kind is not Outcome.OPTIMIZED:
            return None, fired
        return regions.retraced(spec.program, closed), fired
    return optimize


@dataclass(frozen=True)
class Search:
    """The options of one optimization that decide its result besides the program."""
    target: Any
    schedule: Schedule
    left_out: list
    limits: Limits
    check_results: bool
    extractor: str
    memory_budget: int | None
    numerics: str
    tune: bool = False
    guarded: Schedule | None = None   # strict numerics on the JAX backend: the schedule a guarded program's search runs
    on_xla: bool = False   # the program runs as XLA compiles it here (the jax backend, on the target's kind of
    #                        device): one XLA compiles to the original's executable is no gain (`same_executable`);
    #                        Pallas and the NPU emulator run programs of their own, and a GPU target's program
    #                        compiled for this CPU says nothing of what XLA compiles for the GPU

    def fingerprint(self) -> str:
        return fingerprint(self.target, self.schedule, limits=self.limits, check=self.check_results,
                           extractor=self.extractor, memory_budget=self.memory_budget, numerics=self.numerics,
                           **({"tune": True} if self.tune else {}), **({"on_xla": True} if self.on_xla else {}),
                           **({"guarded": repr(self.guarded)} if self.guarded is not None else {}))


def _whole(captured: Captured, search: Search, timer: Stages, store=None) -> tuple[Specialization, dict | None]:
    """The captured program optimized whole: the specialization, and the cache entry of its result. The
    compiled rules come from `store` where it has them, and are kept there where it had not."""
    reference = checking_reference(captured)
    costs = program_cost(traced(captured), search.target)
    run, outcome, reason, chosen, program = _optimize_program(captured, reference, search, timer, costs[0], store)
    if store is not None:
        save_rules(search.schedule, store)
        if search.guarded is not None and any((r.numerics == "reals" or getattr(r, "speculative", False))
                                               and getattr(r, "compiled", False)
                                               for ph in search.guarded.phases for r in ph.rules):   # one has run
            save_rules(search.guarded, store)
    # the specialization's reference is the user's program as JAX runs it (backends check against it and
    # differentiate it), not the evaluator verification may have used
    spec = _specialization(captured, search, timer, run, outcome, reason, chosen, program, costs=costs)
    return spec, _entry(run, outcome, reason, chosen, len(captured.graph.consts))


def _optimize_program(captured: Captured, reference: Callable, search: Search, timer: Stages,
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
                                "none: nothing for the search besides the loops' passes")
        else:
            if rules is not None:
                timer("rules", prepare_rules, search.schedule, rules)
            saturated = saturate(captured, search.schedule, limits, looking, timer)
            run = saturated.run
            chosen = as_run(choose(saturated, tgt, search.extractor, search.memory_budget, deadline, limits, timer,
                                   looking, numerics), tgt)
            if search.guarded is not None and segment is None:
                chosen = _guarded(captured, search, chosen, deadline, looking, timer, rules, saturated)
        worth_it(chosen, cost_before, (peak_memory(original), peak_memory(chosen.graph)), search.memory_budget)
        chosen.graph.scopes = carry_scopes(original, chosen.graph)   # the user's named scopes, kept
        # A changed program is returned only if it was verified before the deadline; else the original runs.
        for stage_name, step in (("extract", None), ("lower", lambda: lower(chosen.graph))):
            if deadline.expired():
                raise Kept(Outcome.TIME_LIMIT, f"time limit ({stage_name}: the call's {limits.seconds:g} s ran out)")
            if step is not None:
                program = timer(stage_name, step)
        if search.on_xla and timer("compare", same_executable, reference, chosen.graph, captured):
            raise Kept(Outcome.SAME_EXECUTABLE, "XLA compiles the chosen program to the original's executable: "
                                                "nothing to gain, nothing verified")
        if search.check_results:   # on superopt's own inputs: the program's debug prints stay silent
            timer("verify", check, reference, on_own_inputs(chosen.graph, program), captured, numerics, run.fired,
                  segment, chosen.graph)
            if deadline.expired():
                raise Kept(Outcome.TIME_LIMIT, f"time limit (verify: the call's {limits.seconds:g} s ran out)")
        if search.tune:   # both programs without their debug prints: superopt's own inputs
            chosen.method += "; " + timer("tune", measured, reference_program(captured),
                                          on_own_inputs(chosen.graph, program), captured)
        return run, Outcome.OPTIMIZED, "", chosen, program
    except Kept as kept:
        outcome, reason = kept.outcome, kept.reason
    except TimeLimit as exc:   # the original is always correct; no unverified program is returned
        outcome, reason = Outcome.TIME_LIMIT, ran_out(exc, limits)
    return run, outcome, reason, None if outcome is Outcome.KEPT_WHOLE else chosen, None


def nothing_to_search(graph: Graph) -> bool:
    """Whether every live node of `graph` is an argument, an opaque primitive or computed from constants alone:
    no rule matches an opaque node, and constants are folded as they are, so saturation (a tenth of a second
    and more of a first call) could change nothing. A program that is one loop is such a program once its
    body has been searched (superopt/regions.py)."""
    constant = graph.constant_nodes()
    return all(graph.nodes[i].op in ("arg", "opaque") or i in constant for i in graph.live())


def _guarded(captured: Captured, search: Search, strict: Extraction, deadline: Deadline, looking: Deadline,
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
    if domain and (share := timer("screen", _least_check_share, program, search)) > MAX_CHECK_SHARE:
        domain = False
        strict = dataclasses.replace(strict, method=f"{strict.method}; not looked for: a guarded program on domain "
                                     "conditions, " + (f"whose least check would add {share:.0%} of the original's "
                                                       f"time to a call where it fails (at most {MAX_CHECK_SHARE:.0%})"
                                                       if math.isfinite(share) else
                                                       "as no rule assuming one matches the program"))
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
        saturated = saturate(captured, schedule, search.limits, looking, timer, origins=domain)
    except Kept:
        return strict
    if saturated.frozen is None:   # the second search failed or ran out of time: the strict program stands
        return strict
    fired = numerics_mode.overflow_rewrites(schedule, saturated.run.fired) if search.numerics == "strict" else {}
    conditions = timer("guard", guarding.unproven, program, saturated.frozen.assumed) if domain else ()
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
    exponent, args, words, rules_used = None, (), [], []
    if fired:
        bound = _range_bound(captured, original, fast.graph, changed)
        if bound is None:
            return strict
        exponent, args, said = bound
        words.append(said)
        rules_used.append(f"with rules equal over the reals: {', '.join(sorted(fired))}")
    if conditions:
        assuming = sorted(name for name, n in saturated.run.fired.items() if n and name in
                          numerics_mode.assuming_rules(schedule))
        words.append(guarding.describe_conditions(program, conditions))
        rules_used.append(f"with rules assuming it: {', '.join(assuming)}")
    graph = dataclasses.replace(fast.graph, guard=Guard(exponent, args, program, conditions))
    check = program_cost(guard_check(graph), tgt)[0]
    if not fast.cost + check < strict.cost * (1 - MIN_PREDICTED_GAIN):
        return strict
    share = check / program_cost(program, tgt)[0]
    if conditions and share > MAX_CHECK_SHARE:
        return dataclasses.replace(strict, method=(
            f"{strict.method}; not taken: a guarded program predicted {strict.cost / (fast.cost + check):.2f}x "
            f"faster, whose check would add {share:.0%} of the original's time to a call where it fails (at most "
            f"{MAX_CHECK_SHARE:.0%})"))
    return Extraction(graph, fast.cost + check, fast.node_costs,
                      f"{fast.method}; guarded: runs where {'; and '.join(words)} (else the original), "
                      f"{'; '.join(rules_used)}",
                      fast.declined, fast.memory)


def _least_check_share(program: Graph, search: Search) -> float:
    """The share of `program`'s cost that the least check a guard on domain conditions could have would add
    (one condition on one node where a rule assuming it matches the captured program:
    `numerics.assumed_operands`). Past `MAX_CHECK_SHARE` any such guard is declined, and the search that would
    find one is not run. A rule that matches only what other rules derive is not looked for (as
    `numerics.assumes`)."""
    tgt = search.target
    least = min((program_cost(guarding.check_graph(None, (), program, conditions=(c,), base=program), tgt)[0]
                 for c in numerics_mode.assumed_operands(search.guarded, program)), default=math.inf)
    return least / program_cost(program, tgt)[0]


def guard_check(graph: Graph) -> Graph | None:
    """The check a guarded `graph` runs before it (`guard.check_graph`), a program priced like any other: a
    guarded program's cost is its own and its check's; None where `graph` has no guard."""
    return guarding.check_of(graph)


def _specialization(captured: Captured, search: Search, timer: Stages, run: RunReport, outcome: Outcome,
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
                              differentiated=differentiated_program(captured, reference))
    return Specialization(user_program(captured), report, original, original, captured.out_tree,
                          captured.in_avals, reference=reference, custom_calls=custom_calls(captured.jaxpr))


def _as_captured(captured: Captured, tgt, numerics: str, timer: Stages, reason: str,
                 kind: Outcome = Outcome.KEPT_WHOLE) -> Specialization:
    """The user's program as captured, unpriced and unsearched, with `reason` in its report."""
    ops = captured.graph.op_counts()
    report = Report(tgt.name, RunReport(StopReason.SATURATED), kind=kind, reason=reason, target_spec=tgt,
                    numerics=numerics, ops_before=ops, ops_after=ops, stage_seconds=timer.seconds)
    return Specialization(user_program(captured), report, captured.graph, captured.graph, captured.out_tree,
                          captured.in_avals, reference=reference_program(captured),
                          custom_calls=custom_calls(captured.jaxpr))


# ---- results kept between processes (superopt/cache.py, superopt/reuse.py) ----

def _entry(run: RunReport, outcome: Outcome, reason: str, chosen: Extraction | None, shared_consts: int = 0):
    """The cache entry of a result: the chosen program where it runs, and what its report is built from.
    None for a result that depends on the machine's load (a time limit) or has no data form. The first
    `shared_consts` constants of the chosen program are the original's: the key holds their hashes."""
    if outcome is Outcome.TIME_LIMIT:
        return None
    try:
        term = None
        if outcome is Outcome.OPTIMIZED:
            term = to_data(with_consts(chosen.graph, lambda consts: consts[shared_consts:]))
    except NotSerializable:
        return None
    found = {} if chosen is None else dict(cost=chosen.cost, node_costs=chosen.node_costs, method=chosen.method,
                                            declined=list(chosen.declined), memory=chosen.memory)
    return dict(term=term, run=run_to_data(run), outcome=outcome.name, reason=reason, chosen=found)


def _cached(store, key: str, kind: str, original: Graph, consts=()):
    """(run, outcome, reason, chosen, its JAX program) from the cache entry under `key`, or None: a miss, or
    an entry that is not a result for `original` (superopt/reuse.py: never trusted)."""
    entry = store.get(key, kind)
    return None if entry is None else _from_entry(entry, original, consts)


def _from_entry(entry: dict, original: Graph, consts=()):
    """(run, outcome, reason, chosen, its JAX program or None) of a cache entry for `original`, or None where
    it is not one."""
    try:
        term = term_from_entry(entry, original, consts)
        outcome = Outcome[entry["outcome"]]
        if (term is None) != (outcome is not Outcome.OPTIMIZED):
            raise NotSerializable("the entry's outcome and program disagree")
        found = entry["chosen"]
        chosen = None if not found else Extraction(term if term is not None else original, float(found["cost"]),
                                                  [float(c) for c in found["node_costs"]], str(found["method"]),
                                                  list(found["declined"]), str(found["memory"]))
        program = _traced_like(term, original) if term is not None else None
        return run_from_data(entry["run"]), outcome, str(entry["reason"]), chosen, program
    except Exception:   # noqa: BLE001  - whatever is wrong with it, the entry is recomputed
        return None


_verified_entries: set = set()   # (cache directory, key) of entries whose program this process verified


def _rechecked(found: tuple, store, key: str, kind: str, captured: Captured, numerics: str) -> tuple | None:
    """`found` (`_cached`'s) once its program, on its first use in this process, agrees with the captured
    program on the verification's first random input set, both evaluated by superopt's reference evaluator
    (no compilation; judged as verify.verify judges); else None, the entry dropped with a CacheWarning. An
    entry with the right checksum and types may still have been edited by whoever can write the cache
    (RELIABILITY.md, "What the cache trusts"). The adversarial and scaled sets ran when the entry was made
    and are not run again: this check is for a program that computes something else."""
    chosen, seen = found[3], (str(store.directory), key)
    if found[4] is None or seen in _verified_entries:
        return found
    original = traced(captured)
    try:
        args = verification.random_args(captured.in_avals, 0)
        problem = verification.judge(evaluate_reference(original, args), _side_evaluated(chosen.graph, args),
                                     lambda: evaluate_reference(original, args, precise=True), numerics)
    except Exception as exc:   # noqa: BLE001
        problem = f"it failed to run ({type(exc).__name__}: {str(exc)[:200]})"
    if problem:
        store.drop(key, kind)
        warnings.warn(f"superopt: the cache entry {key[:16]} in {store.path} differs from the program it is stored "
                      f"for ({problem}); dropped it, and the program is optimized again", CacheWarning,
                      stacklevel=2)
        return None
    _verified_entries.add(seen)
    return found


def _side_evaluated(graph: Graph, args) -> list:
    """`graph`'s outputs on `args` by the reference evaluator, a guarded graph's from the side its check picks."""
    check = guard_check(graph)
    if check is not None and evaluate_reference(check, args)[0] != 0:
        return _side_evaluated(graph.guard.fallback, args)
    return evaluate_reference(graph, args)


def _traced_like(term: Graph, original: Graph) -> Callable:
    """`term`'s JAX program, traced once at `original`'s argument types; NotSerializable where its results
    are not of `original`'s types. A term that does not trace (a malformed attribute) raises."""
    args = {n.attrs[0]: jax.ShapeDtypeStruct(n.shape, n.dtype) for n in original.nodes if n.op == "arg"}
    program = lower(term)
    outs = jax.eval_shape(lambda *flat: program(*flat), *[args[i] for i in range(original.n_args)])
    if [(tuple(o.shape), str(o.dtype)) for o in outs] != \
            [(original.nodes[o].shape, original.nodes[o].dtype) for o in original.results]:
        raise NotSerializable("the entry's program computes other types than the program's")
    return program


# ---- segments (superopt/segments.py) ----

def _kept_for_time(captured: Captured, search: Search, timer: Stages, stage: str) -> Specialization:
    reason = f"time limit ({stage}: the call's {search.limits.seconds:g} s ran out)"
    return _specialization(captured, search, timer, RunReport(StopReason.TIME_LIMIT), Outcome.TIME_LIMIT, reason,
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
    run, outcome, reason, chosen, _ = _optimize_program(captured, lower(graph), job.search, timer, cost_before,
                                                        job.rules, segment=job.key)
    built = compiled_rules(job.search.schedule) if job.rules is None else None
    return dict(entry=_entry(run, outcome, reason, chosen), run=run_to_data(run), outcome=outcome.name,
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
                found = _cached(store, entry, "segment", seg.graph)
                if found is not None and search.check_results:
                    found = _rechecked(found, store, entry, "segment", _segment_captured(seg.graph), search.numerics)
                if found is not None:
                    results[key] = found
        timer("cache", look_up)
    misses = [seg for key, seg in distinct.items() if key not in results]
    if not misses:
        return results, misses
    call.check("cache" if store is not None else label)
    # Limits.seconds bounds the whole call: the segments share what is left of it, and one that runs out of
    # it runs as captured, beside the others' results (the best found in the time).
    each = dataclasses.replace(search, limits=dataclasses.replace(search.limits, seconds=max(call.left(), 1e-3)))
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
            found = _from_entry(out["entry"], seg.graph)
        results[seg.key] = found or (run_from_data(out["run"]), Outcome[out["outcome"]], out["reason"], None, None)
    return results, misses


def _runs(distinct: dict, results: dict) -> dict:
    """The program each distinct segment runs: its chosen program where one was found, else itself."""
    return {key: results[key][3].graph if results[key][1] is Outcome.OPTIMIZED else seg.graph
            for key, seg in distinct.items()}


def _segmented(captured: Captured, segments: list, search: Search, store, executor: str | None,
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
        chosen = Extraction(stitched, cost, node_costs, f"{search.extractor}, per segment", declined)
        try:
            worth_it(chosen, cost_before, (), None)
            outcome, reason = Outcome.OPTIMIZED, ""
        except Kept as kept:
            outcome, reason = kept.outcome, kept.reason
    else:
        first = next(results[key] for key in distinct)
        outcome, reason = first[1], f"in all {len(distinct)} distinct segments; the first: {first[2]}"
    spec = _specialization(captured, search, timer, combined_run(runs), outcome, reason, chosen, costs=costs)
    if outcome is not Outcome.OPTIMIZED:   # each segment runs as captured
        pieces = Pieces(segments, distinct, {key: seg.graph for key, seg in distinct.items()}, store, fp,
                        captured.graph)
    spec.pieces = pieces
    hits = len(distinct) - len(misses)
    timed_out = sum(results[seg.key][1] is Outcome.TIME_LIMIT for seg in misses)
    failed = [results[seg.key][2] for seg in misses if results[seg.key][1] is Outcome.WORKER_FAILED]
    spec.report.segments = (f"{len(segments)} ({len(distinct)} distinct: {len(misses)} optimized"
                            f"{' ' + placed(optimize_segment, len(misses), executor) if misses else ''}, "
                            f"{hits} from the cache"
                            + (f"; {timed_out} ran out of time and run as captured" if timed_out else "")
                            + (f"; {len(failed)} whose worker failed run as captured (the first: {failed[0]})"
                               if failed else "") + ")"
                            + (f"; {seams[2]}" if seams is not None else ""))
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
    note = (f"{n} seams in {len(seams.windows)} distinct windows ({len(misses)} optimized, "
            f"{len(seams.windows) - len(misses)} from the cache), {len(changed)} changed")
    return seams, found, note


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
