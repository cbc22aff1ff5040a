"""Backends: what runs a specialization's chosen program. One protocol for all of them:

    lower(spec, options, example=None) -> Specialization   the program on this backend under the call's
                                                         `Options` (its target, verify, precision), or `spec`
                                                         unchanged (JAX running), the reason in report.backend
    reference(spec) -> callable                         what the backend's program is checked against
    tolerance(expected, actual, spec, args) -> str|None  None where the outputs agree as the backend promises

jax runs the lowered JAX program itself (verified by the pipeline: `stages.check`); pallas runs one
Pallas kernel per kernel of the term (`lowering/pallas`), checked against the JAX program; the NPU
emulator runs cube and vector programs (`lowering/npu`), checked against the user's program.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import replace
from typing import Callable, Protocol

import jax
import numpy as np

from superopt.core import derivatives, lazy, verify as verification
from superopt.core.reference import evaluate
from superopt.egraph.capture import CUSTOM_VJP
from superopt.egraph.siblings import run_before
from superopt.extract.traffic import gradient_traffic
from superopt.report import BackendUse, Outcome

# Each backend's modules are imported where it first runs: a program that runs on JAX loads neither.
pallas_optimizer = lazy.module("superopt.lowering.pallas.optimizer")
pallas_program = lazy.module("superopt.lowering.pallas.program")
npu = lazy.module("superopt.npu_backend")


class Backend(Protocol):
    name: str

    def lower(self, spec, options, *, example=None): ...

    def reference(self, spec) -> Callable: ...

    def tolerance(self, expected: list, actual: list, spec, args) -> str | None: ...


class JaxBackend:
    name = "jax"

    def lower(self, spec, options, *, example=None):
        return with_derivatives(spec, options.verify)   # the pipeline's program is the JAX program, verified there

    def reference(self, spec) -> Callable:
        return spec.reference    # the user's program from the captured jaxpr, debug prints left out

    def tolerance(self, expected, actual, spec, args) -> str | None:
        return verification.judge(expected, actual, lambda: evaluate(spec.original, args, precise=True),
                                  spec.options.numerics)


class PallasBackend:
    name = "pallas"

    def lower(self, spec, options, *, example=None):
        if spec.report.kind is not Outcome.OPTIMIZED:
            # the original runs as the user wrote it: its own kernels would be a change nothing priced or verified
            spec.report.backend = BackendUse.on_jax("the original runs: Pallas runs only a program superopt changed")
            return spec
        return with_derivatives(_on_pallas(spec, options.target, options.verify), options.verify,
                                differentiable=spec.run)

    def reference(self, spec) -> Callable:
        return spec.run      # the verified JAX program of the same term

    def tolerance(self, expected, actual, spec, args) -> str | None:
        return pallas_program.compare(spec.term, expected, actual)


class NpuEmulatorBackend:
    name = "emulator"

    def lower(self, spec, options, *, example=None):
        target, check, precision = options.target, options.verify, options.precision
        if spec.pieces is not None:   # each distinct segment lowered and checked once, on its own shapes
            return npu.on_emulator_in_segments(spec, target, check, precision=precision)
        return npu.on_emulator(spec, target, spec.avals, check, precision=precision, example=example)

    def reference(self, spec) -> Callable:
        return spec.reference    # the user's program, as for jax

    def tolerance(self, expected, actual, spec, args) -> str | None:
        return npu._differs(expected, actual, spec.original, args)


def with_derivatives(spec, check: bool, differentiable: Callable | None = None):
    """`spec` whose changed program is differentiated by a derivative superopt stands behind. The program is
    a custom_jvp (a custom_vjp where the user's program calls a custom_vjp function, which has no forward
    mode) whose rule is chosen the first time JAX differentiates it, under `jax.grad`, `vjp` or `jvp` at any
    depth (inside a jitted function that is differentiated too), and said in `report.derivatives`:

    - where the user's program calls `jax.custom_jvp` or `jax.custom_vjp` functions, JAX's derivative of the
      user's program (`spec.differentiated`, every rule in it applied): capture inlined those calls' primal bodies,
      whose own derivative ignores the rule (relu'(0) = 0.5, a clipping or straight-through rule lost);
    - else, with `check`, the derivative of `differentiable` (the program of the chosen term as JAX runs it;
      `spec.run` by default) where it equals the user's program's on verification's finite input sets
      (`core/derivatives.py`), and the user's program's where it does not;
    - without `check`, the derivative of `differentiable`, unverified, as its values are.

    Undifferentiated, the optimized program runs; where the rule is the user's program's, under
    differentiation the user's program runs in its place (or beside it, for the effects of a program that
    has them)."""
    report = spec.report
    if spec.reference is None or report.kind is not Outcome.OPTIMIZED:
        return spec
    differentiable = differentiable or spec.run
    if spec.custom_calls:
        report.derivatives = ("the original's: the program calls custom_jvp/custom_vjp functions, whose rules "
                              "JAX applies to the user's program")
        rule = _Rule(lambda: _users(spec))
    elif not check:
        report.derivatives = "the optimized program's, not verified (verify=False)"
        rule = _Rule(lambda: differentiable)
    else:
        report.derivatives = "not verified yet (they are the first time the program is differentiated)"
        rule = _Rule(lambda: _checked(spec, differentiable))
    return replace(spec, run=_Ruled(spec.run, _ruled(spec.run, rule, spec)))


# A program traced longer than this (a Python loop over rows, unrolled by tracing) takes XLA seconds to compile,
# and checking derivatives compiles four programs (jvp and vjp of both): its derivatives are the user's program's,
# which need no check, and cost one compile, as under jax.jit.
CHECKED_DERIVATIVE_OPS = 500


def with_users_derivative(program: Callable, spec) -> Callable:
    """`program` (flat arrays -> outputs) differentiated as the user's program is, where that program calls
    custom_jvp/custom_vjp functions (whose rules capture's inlined bodies lost) or where `program` is a changed
    one (no check compared its derivative with the user's, and the NPU's program rounds cube operands to the
    cube's types: its derivative of a float32 program was seen 20% past float32's tolerance); `program`
    itself where it is the user's program as captured. For the NPU target's extracted program under a trace,
    changed or kept."""
    if spec.reference is None or (not spec.custom_calls and spec.term is spec.original):
        return program
    return _ruled(program, _Rule(lambda: _users(spec)), spec)


def _checked(spec, differentiable: Callable) -> Callable:
    """The program whose derivative the changed program takes: `differentiable` where its derivatives equal
    the user's program's (`core/derivatives.py`), else the user's program; `report.derivatives` says which."""
    report, start = spec.report, time.perf_counter()
    if len(spec.original.live()) > CHECKED_DERIVATIVE_OPS:
        report.derivatives = (f"the original's: the program as traced has more than {CHECKED_DERIVATIVE_OPS} ops, "
                               "whose derivatives take longer to check than to use")
        return _users(spec)
    try:
        with jax.core.eval_context():   # superopt's own arrays stay concrete under the caller's trace
            problem = derivatives.check(_listed(spec.reference), _listed(differentiable), spec.avals,
                                        spec.options.numerics)
    except Exception as exc:  # a derivative superopt cannot compute is one it does not stand behind
        problem = f"they could not be compared ({type(exc).__name__}: {exc})"
    report.stage_seconds["verify-derivatives"] = time.perf_counter() - start
    if problem is None:
        report.derivatives = (f"verified: jvp and vjp equal the original's on {derivatives.TRIALS + 1} "
                              "finite input sets")
        return differentiable
    warnings.warn(f"superopt: the optimized program's derivatives differ from the original's ({problem}); "
                  "differentiating the original", verification.VerificationWarning, stacklevel=2)
    report.derivatives = f"the original's: the optimized program's differ ({problem})"
    return _users(spec)


def _listed(fn: Callable) -> Callable:
    return lambda *flat: list(fn(*flat))


class _Rule:
    """Which program a changed program is differentiated as, decided once, when first needed."""

    def __init__(self, decide: Callable[[], Callable]):
        self._decide, self._program = decide, None

    def program(self) -> Callable:
        if self._program is None:
            self._program = self._decide()
        return self._program


class _Ruled:
    """A backend's program (a Pallas program's kernels and summary stay readable) called with its rule."""

    def __init__(self, program, ruled: Callable):
        self.program, self.ruled = program, ruled

    def __call__(self, *flat):
        return self.ruled(*flat)

    def __getattr__(self, name):
        return getattr(self.program, name)


def _users(spec) -> Callable:
    """The user's program as it runs in a changed program's place under differentiation: its custom rules
    applied, its host callbacks calling the user's code."""
    return spec.differentiated or spec.reference


def _ruled(run: Callable, rule: _Rule, spec) -> Callable:
    """`run` (flat arrays -> list of outputs) differentiated as `rule.program()`: a custom_vjp where the user's
    program calls a custom_vjp function (which has no forward mode), else a custom_jvp. Under differentiation
    the values are that program's, or `run`'s where the program has effects to run."""
    effects = bool(spec.original.hidden_outputs)
    if spec.custom_calls & CUSTOM_VJP:
        @jax.custom_vjp
        def ruled(*flat):
            return list(run(*flat))

        def forward(*flat):
            out, pullback = jax.vjp(_listed(rule.program()), *flat)
            return (list(run(*flat)) if effects else out), pullback

        ruled.defvjp(forward, lambda pullback, cotangents: tuple(pullback(list(cotangents))))
        return ruled

    @jax.custom_jvp
    def ruled(*flat):
        return list(run(*flat))

    @ruled.defjvp
    def _(primals, tangents):
        out, out_tangents = jax.jvp(_listed(rule.program()), primals, tangents)
        return (list(run(*primals)) if effects else list(out)), list(out_tangents)
    return ruled


def _on_pallas(spec, target, check: bool):
    """`spec` (api.Specialization) running on Pallas kernels instead of one jitted JAX program, checked
    against the JAX program on random inputs (`compare`: at each output's type, or at the narrowest float
    type it is computed through). Where the check fails the JAX program runs instead and the report says
    why."""
    report = spec.report
    start = time.perf_counter()
    try:
        program = pallas_program.PallasProgram(spec.term, target)
    except Exception as exc:  # a bug here must not take the user's program down: say so and run JAX
        warnings.warn(f"superopt: the Pallas lowering failed ({type(exc).__name__}: {exc}); running JAX",
                      RuntimeWarning, stacklevel=3)
        report.backend = BackendUse.on_jax(f"the Pallas lowering failed: {type(exc).__name__}: {exc}")
        return spec
    if check:
        problem = _pallas_problem(spec, program)
        if problem:
            warnings.warn(f"superopt: the Pallas program differs from the JAX program ({problem}); running JAX",
                          verification.VerificationWarning, stacklevel=3)
            report.backend = BackendUse.on_jax(f"the Pallas program failed verification: {problem}")
            return spec
    report.backend = BackendUse("pallas", detail="\n".join([program.summary()] + program.describe()))
    if report.gradient_traffic:   # as the two programs run here: sibling kernels one launch a group
        original, constant = spec.original, spec.original.constant_nodes()
        groups = pallas_optimizer.update_groups(original, constant)
        formed = [grp for grps in run_before(original, groups, constant).values() for grp in grps]
        report.gradient_traffic = (gradient_traffic(original, formed), gradient_traffic(spec.term, program.groups))
    report.stage_seconds["lower-pallas"] = time.perf_counter() - start
    return replace(spec, run=program)


def _pallas_problem(spec, program) -> str | None:
    """None where the Pallas program keeps the contract against the JAX program on verification's input sets
    (random, then the strict sets' zeros and specials: infinities, NaN, values near overflow), else what
    differs and where. Random inputs are judged at the narrowest float type each output is computed through
    (`pallas_program.compare`); the strict sets as verification judges the JAX program, the sum edge
    included (`verify.judge` against the program's float64 value): a kernel adds a product's terms in its
    own order, and where they pass the range a NaN must not reach an output as a number."""
    reference = BACKENDS["pallas"].reference(spec)
    for where, args in verification.input_sets(spec.avals, spec.options.numerics, trials=1):
        expected = [np.asarray(o) for o in reference(*args)]
        actual = [np.asarray(o) for o in program(*args)]
        if where.startswith("random"):
            problem = pallas_program.compare(spec.term, expected, actual)
        else:
            narrow = pallas_program.narrowest_floats(spec.term)
            truth = evaluate(spec.original, args, precise=True)
            problem = next((f"output {k}{p.removeprefix('output 0')}" for k, (e, a, n, t)
                            in enumerate(zip(expected, actual, narrow, truth))
                            for p in [verification.judge([e], [a], [t], spec.options.numerics, as_dtype=n)] if p),
                           None)
        if problem:
            return f"{problem}, on {where}"
    return None


BACKENDS: dict[str, Backend] = {b.name: b for b in (JaxBackend(), PallasBackend(), NpuEmulatorBackend())}
