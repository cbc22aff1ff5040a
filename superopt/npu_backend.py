"""The NPU backend: a specialization's program run on the cycle-counting emulator (`lowering/npu`), and
never a program that disagrees with the user's.

`on_emulator` lowers the chosen term to cube and vector programs. With checking on, it runs them on
random inputs and on the first call's own arguments (random inputs have none of a real program's
scales: an optimizer's moments, small gradients) and compares their outputs with the user's original
program (the captured program run by JAX) at each output's own dtype's tolerance (`verify.py`: float32
outputs at float32's, not widened to the cube's fp16), integer and bool outputs exactly (a top_k's
indices, an argmax); a float output beyond tolerance passes only if it is as close to the program's
float64 value as the original's is, the rule verification applies to every program. Any difference,
a lowering that fails, or an emulator error on those inputs, and the JAX program runs instead, with
the reason in `report.backend`. Every later call is checked the same way against the original run on
its arguments: a call that differs warns once and returns the original's outputs.

The cube multiplies float32 operands either rounded to fp16 (`precision="fp16"`, its full rate) or as
they are (`"fp32"`, at its fp32 rate, half of that, where the chip has one: `lowering/npu/isa.py`,
`NpuSpec.cube_fp32`). Left to itself (`precision=None`) it takes fp32 where the chip has it and the program
multiplies float32 operands, since fp16 products of a float32 program are not within float32's
tolerance of it, and fp16 otherwise; fp16, bf16 and int8 operands are multiplied as they are under
either. `report.backend` names the operand types the cube ran.

At call time, an emulator error (a value that overflows fp16 on the way into the cube, and anything
else the emulator raises) does not reach the caller: the call warns once (`NumericsWarning`) and
returns the JAX program's result, the original program's when the error is numeric, as `jax.jit`
would have. So does an output that differs from the original's, with checking on.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings
from typing import Callable

import numpy as np

from superopt.core import verify as verification
from superopt.core.forked import Forked, one_blas_thread
from superopt.core.serial import digest
from superopt.core.ops import on_npu
from superopt.core.reference import evaluate
from superopt.extract.traffic import gradient_traffic
from superopt.lowering.jax import lower
from superopt.lowering.npu.codegen import CodegenError, check_precision as check
from superopt.lowering.npu.emulator import EmulatorError, NumericOverflow
from superopt.lowering.npu.isa import Mmad
from superopt.lowering.npu.lower import NpuExecutable, cube_reference
from superopt.report import BackendUse, Report

CHECK_SEEDS = (0, 1)           # random inputs (verify.random_args) the emulator is checked on
CUBE_OPS = on_npu("cube")     # matmul, conv, fractal_matmul
SHORT = {"float16": "fp16", "float32": "fp32", "bfloat16": "bf16", "int8": "int8"}


class NumericsWarning(verification.VerificationWarning):
    """The NPU program could not run, or differed from the user's program: JAX ran it instead."""


def check_precision(precision: str | None, target) -> str | None:
    """`precision` (None: chosen per program, `default_precision`) if `target` takes it, else a one-line
    ValueError naming the target (fp32 where the chip's cube has no fp32 rate). For the API to call
    when the user passes it, before anything is optimized."""
    if precision is None:
        return None
    if target.npu is None:
        raise ValueError(f"superopt: precision applies to NPU targets (npu-910, npu-910b), not {target.name!r}")
    return check(precision, target)


def cube_operand_types(graph) -> set:
    """The dtypes of every matrix product's operands in `graph` (kernel bodies included)."""
    out: set = set()

    def walk(nodes):
        for n in nodes:
            if n.op in CUBE_OPS:
                out.update(nodes[j].dtype for j in n.inputs)
            elif n.op == "kernel":
                walk(list(n.attrs[0]))
    walk(list(graph.nodes))
    return out


def default_precision(graph, target) -> str:
    """fp32 where the chip's cube takes fp32 operands and the program multiplies float32 ones (fp16
    products would differ from the float32 program beyond its tolerance); fp16 otherwise."""
    wide = cube_operand_types(graph) & {"float32", "float64"}
    return "fp32" if wide and target.npu.cube_fp32 else "fp16"


def cube_types(executable) -> list[str]:
    """The operand types the executable's cube stages multiply (empty: no cube stage)."""
    seen = {str(ins.a.dtype) for stage in executable.stages if stage.program is not None
            for ins in stage.program.instrs if isinstance(ins, Mmad)}
    return sorted(SHORT.get(t, t) for t in seen)


class EmulatorRun:
    """What a specialization on the emulator calls: flat arrays -> flat outputs from the NPU program.
    An exception from the emulator warns once (`NumericsWarning`, naming it) and returns the JAX
    program's outputs for that call: the original program's for a numeric error (NumericOverflow),
    else the JAX lowering of the same term (`jax_program`). With `check`, every call's outputs are
    compared with the original program's on the same arguments (`_differs`); a call that differs warns
    once and returns the original's. `report.backend` notes the first fallback of either kind."""

    def __init__(self, executable, jax_program: Callable, original: "_OriginalProgram", report, target_name: str,
                 check: bool = False, primed: tuple | None = None):
        self.executable, self.jax_program, self.original = executable, jax_program, original
        self.report, self.target_name, self.check = report, target_name, check
        self.primed = primed        # (copies of the arguments, outputs) the build checked; see __call__
        self.fallbacks = 0          # calls JAX ran instead
        self.last_error: str | None = None

    def __call__(self, *flat_args) -> list:
        primed, self.primed = self.primed, None
        if primed is not None and _same_values(primed[0], flat_args):
            return list(primed[1])      # the values the build ran and checked a moment ago (not merely the
                                        # same objects: a numpy argument may have been changed in place)
        try:
            outputs = self.executable(*flat_args)
        except Exception as exc:    # noqa: BLE001 -- jax.jit would not raise here, so neither may superopt
            numeric = isinstance(exc, (NumericOverflow, FloatingPointError, OverflowError))
            runs = "the original program" if numeric else "the JAX program"
            self._fall_back(f"failed on these inputs ({type(exc).__name__}: {exc}); {runs} ran instead")
            return list((self.original() if numeric else self.jax_program)(*flat_args))
        if not self.check:
            return outputs
        expected = [np.asarray(o) for o in self.original()(*flat_args)]
        problem = _differs(expected, [np.asarray(o) for o in outputs], self.original.spec.original, flat_args)
        if problem:
            self._fall_back(f"differs from the original program on these inputs ({problem}); the original's "
                            f"outputs were returned")
            return expected
        return outputs

    def _fall_back(self, what: str) -> None:
        self.fallbacks += 1
        self.last_error = what
        if self.fallbacks == 1:
            warnings.warn(f"superopt: the NPU program on the {self.target_name} emulator {what} (warned once)",
                          NumericsWarning, stacklevel=4)
            self.report.backend.note(f"a call ran on JAX: the NPU program {_short(what)}")


def on_emulator(spec, target, avals, check: bool, precision: str | None = None, example=None,
                known: dict | None = None):
    """`spec` (an `api.Specialization`) running on the NPU emulator instead of JAX; or `spec` itself,
    JAX running, with the reason in `report.backend`, where the term does not lower or (with `check`)
    the NPU program differs from the user's program on random inputs or on `example`, the flat
    arguments of the call being specialized (module doc). `precision` is the cube's type for float32
    operands: "fp16", "fp32" (a ValueError where `target` has no fp32 rate), or None
    (`default_precision`). `known`: the original's outputs on the check's random inputs, by seed, where
    this process has them already (`verify.remembered`: its verification ran the same inputs)."""
    report = spec.report
    precision = check_precision(precision, target) or default_precision(spec.term, target)
    start = time.perf_counter()
    # The original program is lowered (for its cycles) on the other core while this one lowers the term.
    aside = spec.term is not spec.original and not report.gradient_traffic and _without_jax(spec.original)
    before_cycles = Forked(_cycles, spec.original, target, precision) if aside else None
    try:
        with one_blas_thread() if aside else contextlib.nullcontext():
            executable = NpuExecutable(spec.term, target, precision=precision)
            estimate = executable.estimate()
            if before_cycles is not None:
                original, before = None, before_cycles.result()
            else:
                original = executable if spec.term is spec.original else NpuExecutable(spec.original, target,
                                                                                        precision=precision)
                before = estimate.cycles if original is executable else original.estimate().cycles
    except (CodegenError, EmulatorError) as exc:
        report.backend = BackendUse.on_jax(f"the NPU lowering failed: {exc}")
        return spec
    finally:
        if before_cycles is not None:
            before_cycles.cancel()
    report.npu_lines = executable.describe(estimate, before)
    report.npu_cycles = (estimate.cycles, before)
    report.stage_seconds["lower-npu"] = time.perf_counter() - start
    types = cube_types(executable)
    reference = _OriginalProgram(spec)
    example = _concrete(example, avals)
    primed = None
    if check:
        start = time.perf_counter()
        problem, primed = _check(executable, reference, spec, avals, precision, target, types, example, known)
        report.stage_seconds["check-npu"] = time.perf_counter() - start
        if problem:
            warnings.warn(f"superopt: {problem}; the JAX program runs instead", NumericsWarning, stacklevel=4)
            report.backend = BackendUse.on_jax(problem)
            return spec
    operands = f" with {', '.join(types)} cube operands" if types else ""
    inputs = f"{len(CHECK_SEEDS)} random inputs" + (" and the first call's" if example is not None else "")
    checked = f"; outputs within their dtype's tolerance of the original's on {inputs}, and checked on each call" \
        if check else ""
    report.backend = BackendUse("npu emulator", detail=f"npu emulator ({target.name}, numeric){operands}{checked}")
    if report.gradient_traffic:   # as the two programs run: sibling kernels grouped as the lowering grouped them
        report.gradient_traffic = _gradient_traffic(spec.original, spec.term, original.groups, executable.groups)
    run = EmulatorRun(executable, spec.run, reference, report, target.name, check, primed)
    return dataclasses.replace(spec, run=run, npu=executable)


def _cycles(graph, target, precision: str) -> int:
    """The cycles of `graph` lowered for the NPU (`Forked` runs it on the other core)."""
    return NpuExecutable(graph, target, precision=precision).estimate().cycles


def _without_jax(graph) -> bool:
    """Whether lowering `graph` for the NPU runs no JAX (`Forked`'s children must not): no constant
    values to compute beyond literals."""
    live = set(graph.live())
    return not any(graph.nodes[i].op != "lit" for i in graph.constant_nodes() if i in live)


class _OriginalProgram:
    """The user's program as JAX runs it, built when first needed: `spec.run` where the specialization
    kept the original (the jitted function itself), else the captured original graph lowered to JAX."""

    def __init__(self, spec):
        self.spec, self._program = spec, None

    def __call__(self) -> Callable:
        if self._program is None:
            if self.spec.term is self.spec.original:
                self._program = self.spec.run
            else:
                self._program = lower(self.spec.original)
        return self._program


def _concrete(example, avals) -> tuple | None:
    """The example arguments when they are arrays (not tracers) of the specialization's types, else None."""
    if example is None:
        return None
    try:
        example = tuple(example)
        arrays = [np.asarray(a) for a in example]
    except Exception:    # noqa: BLE001 -- traced arguments (superopt under jax.jit): no example to run
        return None
    if len(arrays) != len(avals) or any(tuple(a.shape) != tuple(shape) for a, (shape, _) in zip(arrays, avals)):
        return None
    return example


def _same_values(copies: list, args) -> bool:
    """Whether `args` hold, byte for byte, the values `copies` were taken of (same dtypes and shapes)."""
    if len(copies) != len(args):
        return False
    for copy, arg in zip(copies, args):
        arg = np.asarray(arg)
        if arg.dtype != copy.dtype or arg.shape != copy.shape or arg.tobytes() != copy.tobytes():
            return False
    return True


def _check(executable, reference: _OriginalProgram, spec, avals, precision: str, target, types: list,
           example: tuple | None = None, known: dict | None = None) -> tuple[str | None, tuple | None]:
    """(None, (copies of example's arrays, its outputs)) if the NPU program's outputs agree with the original
    program's on CHECK_SEEDS' random inputs and on `example` (the last this process runs, so the executable's
    `last` run is the caller's), else (the reason the JAX program runs instead, None)."""
    operands = f"{', '.join(types)} cube operands" if types else "no cube stages"
    buffers = verification.Buffers()     # a finished trial's memory goes to the next (a model's are large)
    trials = [(f"random inputs (seed {seed})", lambda seed=seed: verification.random_args(avals, seed, buffers), seed)
              for seed in CHECK_SEEDS]
    if example is not None:
        trials.append(("the first call's arguments", lambda: example, None))
    known = known or {}
    # The emulator runs the first set on the other core while this one runs the others, then takes its
    # outputs; none of it where a stage runs on the host, through JAX. The example runs here, last: the
    # executable's `last` run is the caller's.
    aside = Forked(_emulated, executable, trials[0][1]) \
        if len(trials) > 1 and not executable.host_ops and _without_jax(executable.graph) else None
    order = trials[1:] + trials[:1] if aside is not None else trials
    primed, stack = None, contextlib.ExitStack()
    try:
        if aside is not None:
            stack.enter_context(one_blas_thread())
        for where, make, seed in order:
            args = make()
            if args is example:   # as they are now: the caller may change a numpy argument in place later
                copies = [np.array(a, copy=True) for a in example]
            try:
                if make is trials[0][1] and aside is not None:
                    actual = aside.result()
                    stack.close()      # the child is done: BLAS may use both cores again
                elif args is example:    # timed: the executable's `last` run is the caller's
                    actual = [np.asarray(o) for o in executable(*args)]
                else:
                    actual = [np.asarray(o) for o in executable.outputs(*args)]
            except Exception as exc:    # noqa: BLE001
                return f"the NPU program failed on {where}: {type(exc).__name__}: {_short(str(exc))}", None
            if args is example:
                primed = (copies, actual)
            expected = known[seed] if seed in known else [np.asarray(o) for o in (spec.reference or reference())(*args)]
            problem = _differs(expected, actual, spec.original, args)
            if problem is None:
                buffers.release(args)
                continue
            problem = f"{problem}, on {where}"
            # Its own model (the term with the cube's rounding) tells a precision drift from a lowering error.
            try:
                own = verification.compare_outputs(cube_reference(spec.term, args, precision), actual,
                                                   as_dtype="float16")
            except Exception:    # noqa: BLE001
                own = None
            if own:
                return f"the NPU program ({operands}) differs from the original program: {problem}; and from " \
                       f"its own model of the cube's rounding: {own}", None
            hint = ""
            if precision == "fp16" and "fp16" in types and cube_operand_types(spec.term) & {"float32", "float64"}:
                hint = "; precision='fp32' multiplies float32 operands as they are" if target.npu.cube_fp32 else \
                    f"; the {target.name} cube takes no fp32 operands"
            return f"the NPU program ({operands}) differs from the original program beyond the output's dtype " \
                   f"tolerance: {problem}{hint}", None
    finally:
        stack.close()
        if aside is not None:
            aside.cancel()
    return None, primed


def _emulated(executable, make_args) -> list:
    """The NPU program's outputs on `make_args()` (`Forked` runs it on the other core)."""
    return [np.asarray(o) for o in executable.outputs(*make_args())]


def _differs(expected: list, actual: list, original, args) -> str | None:
    """None if the NPU program's outputs keep the numerics contract against the original's, as
    verification judges an optimized program (`verify.judge`), the float64 value of the original
    computed only when a direct comparison fails."""
    def truth():
        try:
            return evaluate(original, args, precise=True)
        except Exception:    # noqa: BLE001 -- no float64 value to judge by: the direct comparison stands
            return None
    return verification.judge(expected, actual, truth)


def _gradient_traffic(original, chosen, groups_before=(), groups_after=()) -> tuple:
    """(before, after) passes over gradient memory as the two NPU programs run (as api._gradient_traffic)."""
    before = gradient_traffic(original, groups_before)
    if not before.tensors:
        return ()
    return before, (before if chosen is original else gradient_traffic(chosen, groups_after))


def _short(text: str, width: int = 200) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


# ---- a program in segments (superopt/segments.py): each distinct segment lowered and checked once ----

class SegmentedRun:
    """What a specialization in segments calls on the NPU: the program's segments in order, each by its
    distinct segment's program (on the emulator, or JAX where that segment's NPU program was not kept),
    the values between them as the stitched program passes them."""

    def __init__(self, graph, segments: list, runs: dict):
        self.graph, self.segments, self.runs = graph, segments, runs

    def __call__(self, *flat_args) -> list:
        g = self.graph
        env = {}
        for i in g.live():
            node = g.nodes[i]
            if node.op == "arg":
                env[i] = flat_args[node.attrs[0]]
            elif node.op == "const":
                env[i] = g.consts[node.attrs[0]]
        for seg in self.segments:
            outs = self.runs[seg.key](*[env[j] for j in seg.inputs])
            env.update(zip(seg.outputs, outs))
        if any(o not in env for o in g.outputs):   # a leaf returned as it is (a literal, an iota)
            whole = evaluate(g, [np.asarray(a) for a in flat_args])
            return [env.get(o, v) for o, v in zip(g.outputs, whole)]
        return [env[o] for o in g.outputs]


@dataclasses.dataclass
class SegmentedNpu:
    """The NPU programs of a specialization in segments: per distinct segment (by key) its executable, or
    None where that segment runs on JAX; `cycles` and `cycles_before` add up every segment's estimate."""
    executables: dict
    cycles: int
    cycles_before: int


def on_emulator_in_segments(spec, target, check: bool, precision: str | None = None):
    """`spec`, made of segments (`spec.pieces`), running on the NPU emulator segment by segment: each
    distinct segment is lowered, estimated and (with `check`) checked on the emulator once, on its own
    shapes, as `on_emulator` does a whole program; a segment whose NPU program fails either runs as JAX,
    and the report says which."""
    pieces = spec.pieces
    precision = check_precision(precision, target) or default_precision(spec.term, target)
    start = time.perf_counter()
    runs, executables, after, before, failed = {}, {}, {}, {}, {}
    hits = 0
    for key, seg in pieces.distinct.items():
        term = pieces.chosen[key]
        avals = tuple((n.shape, n.dtype) for n in sorted((n for n in seg.graph.nodes if n.op == "arg"),
                                                        key=lambda n: n.attrs[0]))
        jax_program = lower(term)
        piece = dataclasses.replace(spec, run=jax_program, term=term, original=seg.graph, avals=avals, npu=None,
                                    reference=lower(seg.graph), out_tree=None, pieces=None,
                                    report=Report(target.name, spec.report.run))
        stored = _stored_npu(pieces, key, target, precision, check)
        lowered = _from_store(piece, target, precision, check, stored) if stored else None
        hits += lowered is not None
        if lowered is None:
            lowered = on_emulator(piece, target, avals, check, precision, known=verification.remembered(key))
            _store_npu(pieces, key, target, precision, check, lowered)
        runs[key] = lowered.run
        executables[key] = lowered.npu
        if lowered.npu is None:
            failed[key] = str(lowered.report.backend)
        else:
            after[key], before[key] = lowered.report.npu_cycles
    count = {key: sum(s.key == key for s in pieces.segments) for key in pieces.distinct}
    cycles = sum(after[k] * count[k] for k in after)
    cycles_before = sum(before[k] * count[k] for k in before)
    report = spec.report
    report.stage_seconds["lower-npu (segments)"] = time.perf_counter() - start
    on_npu = len(pieces.distinct) - len(failed)
    report.npu_lines = [f"  npu emulator : {cycles} cycles ({cycles / target.npu.clock_hz * 1e6:.1f} us at "
                        f"{target.npu.clock_hz / 1e9:.2g} GHz) in {len(pieces.segments)} segments, "
                        f"{on_npu} of {len(pieces.distinct)} distinct on the NPU"
                        + (f"; {pieces.before} {cycles_before} cycles "
                           f"({cycles_before / max(cycles, 1):.2f}x)" if cycles_before else "")]
    if failed:
        report.npu_lines += [f"    runs as JAX ({sum(count[k] for k in failed)} segments): {_short(why)}"
                             for why in dict.fromkeys(failed.values())]
    if not on_npu:
        report.npu_lines = report.npu_lines[1:]   # no cycles to show: every segment runs as JAX
        report.backend = BackendUse.on_jax(f"no segment's NPU program was kept: {_short(next(iter(failed.values())))}")
        return spec
    checked = "; each distinct segment checked on the emulator on its own shapes" if check else ""
    if hits:
        checked += f" ({hits} of {len(pieces.distinct)} checked in an earlier run: from the cache)"
    report.backend = BackendUse("npu emulator", detail=f"npu emulator ({target.name}, numeric), in segments{checked}")
    npu = SegmentedNpu({k: executables[k] for k in pieces.distinct}, cycles, cycles_before)
    return dataclasses.replace(spec, run=SegmentedRun(pieces.graph, pieces.segments, runs), npu=npu)


def _npu_key(pieces, key: str, target, precision: str, check: bool) -> str:
    return digest(pieces.fingerprint, key, "npu", target.name, precision, str(check))


def _stored_npu(pieces, key: str, target, precision: str, check: bool) -> dict | None:
    """What an earlier run found of this segment's NPU program (kept, with its cycles), or None."""
    if pieces.store is None:
        return None
    entry = pieces.store.get(_npu_key(pieces, key, target, precision, check), "npu")
    ok = isinstance(entry, dict) and entry.get("kept") is True and \
        all(isinstance(entry.get(k), int) and entry[k] > 0 for k in ("cycles", "cycles_before"))
    return entry if ok else None


def _store_npu(pieces, key: str, target, precision: str, check: bool, lowered) -> None:
    """Keep that this segment's NPU program lowered and (with `check`) agreed with the original on the
    emulator, with its cycles; a segment that fell back to JAX is not stored (it is tried again)."""
    if pieces.store is not None and lowered.npu is not None:
        after, before = lowered.report.npu_cycles
        pieces.store.put(_npu_key(pieces, key, target, precision, check), "npu",
                         dict(kept=True, cycles=int(after), cycles_before=int(before)))


def _from_store(piece, target, precision: str, check: bool, stored: dict):
    """The segment on the emulator as an earlier run lowered and checked it, with the stored cycles: the
    executable is built again at its first use (`StoredExecutable`; the code generator is deterministic,
    and building a d=4096 layer's takes seconds that a compile from shapes need not pay), and the check
    on random inputs is not repeated (with `check`, each call's outputs still are)."""
    executable = StoredExecutable(piece.term, target, precision, stored["cycles"])
    piece.report.npu_cycles = (stored["cycles"], stored["cycles_before"])
    run = EmulatorRun(executable, piece.run, _OriginalProgram(piece), piece.report, target.name, check)
    return dataclasses.replace(piece, run=run, npu=executable)


class StoredExecutable:
    """An `NpuExecutable` of a term an earlier run lowered and checked, built at its first use (a call,
    or any attribute); its estimate must give the cycles stored, else using it raises an EmulatorError,
    which a call turns into the JAX program's outputs and a warning (`EmulatorRun`)."""

    def __init__(self, term, target, precision: str, cycles: int):
        self.term, self.target, self.precision, self.cycles = term, target, precision, cycles
        self._executable, self._error = None, None

    def built(self) -> NpuExecutable:
        if self._error is not None:                # built once and failed: not again on every call
            raise self._error
        if self._executable is None:
            try:
                executable = NpuExecutable(self.term, self.target, precision=self.precision)
                cycles = executable.estimate().cycles
            except (CodegenError, EmulatorError) as exc:
                self._error = EmulatorError(f"the NPU program of a cache entry does not build again: {exc}")
                raise self._error from exc
            if cycles != self.cycles:
                self._error = EmulatorError(f"the NPU program built again estimates {cycles} cycles, not the "
                                            f"{self.cycles} its cache entry holds")
                raise self._error
            self._executable = executable
        return self._executable

    def __call__(self, *flat_args) -> list:
        return self.built()(*flat_args)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.built(), name)
