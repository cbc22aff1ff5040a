"""Derivatives verified: the derivative of a changed program against the derivative of the user's program.

A rewrite that keeps a program's values can change its derivative where the two programs differentiate
different expressions of the same function: at a kink (`sqrt(x * x)` and `abs(x)` agree at 0, their
derivatives there do not: NaN and a sign), at a tie of `max` (JAX splits the tangent), or where a factored
sum differentiates into different roundings. `check` compares forward-mode (`jax.jvp`, random tangents)
and reverse-mode (`jax.vjp`, random cotangents) derivatives of both programs on the random input sets and
the zeros set of verification (+-0, subnormals and +-1, where kinks are: `verify.input_sets` under "fast"),
judged as outputs are (`verify.judge`: NaN and inf exactly where the original's are, finite values within
the dtype's tolerance). Input sets with NaN or inf arguments are not used: there a derivative's NaNs come
from the chain rule multiplying inf by zero in whichever order each program differentiates, and the
contract says nothing about them (README.md, "Numerics contract").
"""
from __future__ import annotations

from typing import Callable

import jax
import numpy as np

from superopt.core.dtypes import is_float
from superopt.core.verify import input_sets, judge, random_args

TRIALS = 2   # random input sets, as verification draws them (seeds 0 and 1), then the zeros set


def _perturbations(shapes: list, seed: int) -> list[np.ndarray]:
    """Random tangents (or cotangents) for values of these (shape, dtype)s: standard normal for floats, and
    float0 zeros for integers and bools, which have no tangent."""
    drawn = random_args([(s, d) if is_float(str(np.dtype(d))) else (s, "float32") for s, d in shapes], seed)
    return [x if is_float(str(np.dtype(d))) else np.zeros(s, jax.dtypes.float0)
            for x, (s, d) in zip(drawn, shapes)]


def _floats(values) -> list[np.ndarray]:
    """The float derivatives among `values` (an integer's is float0: nothing to compare)."""
    return [np.asarray(v) for v in values if np.asarray(v).dtype != jax.dtypes.float0]


def check(reference: Callable, candidate: Callable, avals, numerics: str = "strict",
          trials: int = TRIALS) -> str | None:
    """None if `candidate`'s jvp and vjp equal `reference`'s (both: flat arrays -> list of outputs) on
    every input set, else a description naming the set and the mode."""
    for n, (where, args) in enumerate(input_sets(avals, "fast", trials)):
        tangents = _perturbations(list(avals), 1000 + n)
        _, want = jax.jvp(reference, args, tangents)
        _, got = jax.jvp(candidate, args, tangents)
        problem = judge(_floats(want), _floats(got), None, numerics)
        if problem:
            return f"forward mode (jvp): {problem}, on {where}"
        outs, pull_want = jax.vjp(reference, *args)
        _, pull_got = jax.vjp(candidate, *args)
        cotangents = _perturbations([(np.shape(o), np.asarray(o).dtype) for o in outs], 2000 + n)
        problem = judge(_floats(pull_want(cotangents)), _floats(pull_got(cotangents)), None, numerics)
        if problem:
            return f"reverse mode (vjp): {problem}, on {where}"
    return None
