"""Backends: what runs a specialization's chosen program. One protocol for all of them:

    lower(spec, target, check, ...) -> Specialization   the program on this backend, or `spec` unchanged
                                                         (JAX running) with the reason in report.backend
    reference(spec) -> callable                         what the backend's program is checked against
    tolerance(expected, actual, spec, args) -> str|None  None where the outputs agree as the backend promises

jax runs the lowered JAX program itself (verified by the pipeline: `pipeline.check`); pallas runs one
Pallas kernel per kernel of the term (`lowering/pallas`), checked against the JAX program; the NPU
emulator runs cube and vector programs (`lowering/npu`), checked against the user's program.
"""
from __future__ import annotations

from typing import Callable, Protocol

from superopt.core import verify as verification


class Backend(Protocol):
    name: str

    def lower(self, spec, target, check: bool, *, precision: str | None = None, example=None): ...

    def reference(self, spec) -> Callable: ...

    def tolerance(self, expected: list, actual: list, spec, args) -> str | None: ...


class JaxBackend:
    name = "jax"

    def lower(self, spec, target, check: bool, *, precision=None, example=None):
        return spec          # the pipeline's program is the JAX program, verified there

    def reference(self, spec) -> Callable:
        return spec.reference    # the user's program from the captured jaxpr, debug prints left out

    def tolerance(self, expected, actual, spec, args) -> str | None:
        from superopt.core.reference import evaluate
        return verification.judge(expected, actual, lambda: evaluate(spec.original, args, precise=True),
                                  spec.report.numerics)


class PallasBackend:
    name = "pallas"

    def lower(self, spec, target, check: bool, *, precision=None, example=None):
        from superopt.lowering.pallas.program import on_pallas
        return on_pallas(spec, target, check)

    def reference(self, spec) -> Callable:
        return spec.run      # the verified JAX program of the same term

    def tolerance(self, expected, actual, spec, args) -> str | None:
        from superopt.lowering.pallas.program import compare
        return compare(spec.term, expected, actual)


class NpuEmulatorBackend:
    name = "emulator"

    def lower(self, spec, target, check: bool, *, precision=None, example=None):
        from superopt.npu_backend import on_emulator
        return on_emulator(spec, target, spec.avals, check, precision=precision, example=example)

    def reference(self, spec) -> Callable:
        return spec.reference    # the user's program, as for jax

    def tolerance(self, expected, actual, spec, args) -> str | None:
        from superopt.npu_backend import _differs
        return _differs(expected, actual, spec.original, args)


BACKENDS: dict[str, Backend] = {b.name: b for b in (JaxBackend(), PallasBackend(), NpuEmulatorBackend())}
