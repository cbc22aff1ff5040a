"""The stages of a search for one program, as functions with typed results:

    capture  -> Captured     (egraph/capture.py: the jaxpr of fn at abstract values, as a Graph)
    saturate -> Saturated    (encode into egglog, then equality saturation in a child process)
    choose   -> Extraction   (extract/greedy.py or extract/ilp.py under the target's cost model)
    lower    -> a callable   (lowering/jax.py: one jitted JAX program)
    check    -> None         (superopt/core/verify.py: the numerics contract against the original)

and the types they pass on: `Search` (the options that decide a search's result), `Specialization` (the program
that runs and its report), `Stages` (each stage's seconds). A stage that decides the original program runs raises
`Kept` with a typed `Outcome`; the report is built once, at the end (superopt/reporting.py). The recipe that runs
these stages for one program is superopt/recipe.py; superopt/pipeline.py runs it for one specialization.
"""
from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import numpy as np

from superopt import numerics as numerics_mode
from superopt.backends import with_users_derivative
from superopt.core import lazy, verify as verification
from superopt.core.deadline import Deadline, TimeLimit
from superopt.core.ir import Graph
from superopt.core.reference import evaluate as evaluate_reference
from superopt.egraph.capture import Captured, calls_host, graph_calls_host, with_stand_ins, without_debug_effects
from superopt.egraph.limits import Limits, RunReport, StopReason
from superopt.extract import guard as guarding
from superopt.extract.errors import ExtractionError
from superopt.extract.extraction import Extraction
from superopt.extract.models.registry import model_of
from superopt.lowering.hlo import compiled_digest, executable
from superopt.lowering.jax import guard_test, inlined, lower
from superopt.options import Options
from superopt.report import Outcome, Report
from superopt.reuse import fingerprint
from superopt.rewrites.schedule import Schedule

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
    options: Any = None    # the call's `Options` (superopt/options.py): what the backends judge by

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
            self.report.backend.note(f"under a JAX trace it {how}")
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
    facts: dict | None = None   # with `origins`: the analysis's facts of each captured node, before any rule ran


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
    class records its id, for rules that assume a domain condition (a speculative search: `guarded`), and
    `Saturated.facts` holds the analysis's facts of the captured nodes where the child read them."""
    prime = lambda template: timer("rules", runner.prime, template)   # noqa: E731 - earlier searches' rule sets
    try:
        if isolated:   # encoded in the child that saturates: this process's template is left as it is
            with encoding.template(prime) as template:
                if template is not None:
                    start, seconds = time.perf_counter(), 0.0
                    try:
                        run, frozen, convs, seconds, facts = isolate.encode_and_saturate(
                            captured.graph, template, schedule, limits, deadline, origins)
                    finally:
                        timer.record("encode", seconds)
                        timer.record("saturate", time.perf_counter() - start - seconds)
                    return Saturated(run, frozen, encoding.Encoding(template, captured.graph, convs), facts)
        # the process's template e-graph, restored when the search is done (or a new one, on another thread)
        with encoding.scratch(prime) as empty:
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
    return jax.default_backend() in model_of(tgt).platforms


def same_executable(reference: Callable, graph: Graph, captured: Captured, candidate: Callable | None = None) -> bool:
    """Whether XLA compiles `graph` (the chosen program, as superopt runs it on its own inputs) to the executable
    it compiles `reference` (the original, so run) to (`lowering/hlo.py`: the optimized HLO, names, metadata and
    the order of independent instructions aside). Then the rewrite changed nothing XLA does not change itself
    (its CSE, constant folding and algebraic simplifier), and the original runs. A guarded program, or an
    original verified by superopt's evaluator (no XLA program), is never the same. `candidate`, the program
    verification runs (`on_own_inputs`), is compiled in the form compared where it has one (`lowering/jax.py`
    `lower`, where it hoisted no constant): verification's calls then run that compile, not a second one."""
    if graph.guard is not None or not hasattr(reference, "lower"):
        return False
    args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in captured.in_avals]
    lower_inline = getattr(candidate, "lower_inline", None) or inlined(graph, effects=False).lower
    try:
        return executable(reference, args) == compiled_digest(lower_inline(*args))
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
            self.record(name, time.perf_counter() - start)

    def record(self, name: str, seconds: float) -> None:
        """Add `seconds` to stage `name` (a stage timed where it ran: encoding in saturation's child)."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds


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


@dataclass(frozen=True)
class Search:
    """What decides one optimization's result besides the program: the call's options, and the schedules
    they give for the program's target (the rules its numerics mode runs, and those it leaves out)."""
    options: Options
    schedule: Schedule
    left_out: list
    guarded: Schedule | None = None   # strict numerics on the JAX backend: the schedule a guarded program's search runs
    on_xla: bool = False   # the program runs as XLA compiles it here (the jax backend, on the target's kind of
    #                        device): one XLA compiles to the original's executable is no gain (`same_executable`);
    #                        Pallas and the NPU emulator run programs of their own, and a GPU target's program
    #                        compiled for this CPU says nothing of what XLA compiles for the GPU

    target = property(lambda self: self.options.target)
    limits = property(lambda self: self.options.limits)
    verify = property(lambda self: self.options.verify)
    extractor = property(lambda self: self.options.extractor)
    memory_budget = property(lambda self: self.options.memory_budget)
    numerics = property(lambda self: self.options.numerics)
    tune = property(lambda self: self.options.tune)

    def with_limits(self, limits: Limits) -> "Search":
        return dataclasses.replace(self, options=dataclasses.replace(self.options, limits=limits))

    def fingerprint(self) -> str:
        return fingerprint(self.target, self.schedule, limits=self.limits, verify=self.verify,
                           extractor=self.extractor, memory_budget=self.memory_budget, numerics=self.numerics,
                           **({"tune": True} if self.tune else {}), **({"on_xla": True} if self.on_xla else {}),
                           **({"guarded": repr(self.guarded)} if self.guarded is not None else {}))


def nothing_to_search(graph: Graph) -> bool:
    """Whether every live node of `graph` is an argument, an opaque primitive or computed from constants alone:
    no rule matches an opaque node, and constants are folded as they are, so saturation (a tenth of a second
    and more of a first call) could change nothing. A program that is one loop is such a program once its
    body has been searched (superopt/regions.py)."""
    constant = graph.constant_nodes()
    return all(graph.nodes[i].op in ("arg", "opaque") or i in constant for i in graph.live())


def guard_check(graph: Graph) -> Graph | None:
    """The check a guarded `graph` runs before it (`guard.check_graph`), a program priced like any other: a
    guarded program's cost is its own and its check's; None where `graph` has no guard."""
    return guarding.check_of(graph)
