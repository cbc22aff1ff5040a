"""What differs between the JAX releases superopt supports (0.10.2 to 0.12.x, pyproject.toml), as superopt uses
JAX, in one place. Read from JAX's CHANGELOG.md (0.10.0 to 0.11.0) and the source of each release.

- JAX 0.12 gives `scan` no `num_consts` and `num_carry` params: its `ft_in` (a flat tree of the operands:
  constants, carry, xs) and `ft_out` (carry, ys) say how the operands split (`scan_counts`).
- JAX 0.12 merges `ClosedJaxpr` into `Jaxpr`: `jax.extend.core.ClosedJaxpr` is `Jaxpr`, a jaxpr carries its
  constants (`.consts`), `.jaxpr` is the jaxpr itself, and `ClosedJaxpr(jaxpr, consts)` still builds one.
  A call's body (`jit`'s `jaxpr` param, the bodies of `scan`, `while`, `cond`) is such a `Jaxpr`, where
  0.10 gave a `ClosedJaxpr`; `isinstance(x, ClosedJaxpr)` holds for every jaxpr. Code that reads
  `.jaxpr` and `.consts` of a body and builds `ClosedJaxpr(jaxpr, consts)` works with both unchanged.
- JAX 0.12 adds primitives that common code emits where 0.10 emitted primitives superopt models:
  `one_minus_square` (the derivatives of tanh, asin, acos and atanh; 0.10: `sub(1, square(x))`), `log2`
  (`jnp.log2`; 0.10: `div(log(x), log(2))`) and `polynomial` (`jnp.polyval`, Horner's rule; 0.10: a scan).
  `expansion` gives each as the computation of JAX 0.12's own lowering of it in primitives superopt models,
  which capture inlines as it inlines a call (unknown primitives would stay opaque: correct, unoptimized).
- JAX 0.12 drops the `closed_call` and `call` primitives (no jaxpr of 0.12 holds them).
- JAX 0.11 removes from `jax.core` what 0.10 deprecated there (`DropVar`, `DebugInfo`, `jaxprs_in_params`,
  `new_jaxpr_eqn`, `check_jaxpr`, ...: use `jax.extend.core`, as superopt does), and drops Python 3.11.
- JAX 0.11 makes `jit`'s `inline` param a `jax.Inline` (0.10: a bool); superopt passes it through as it is.
- JAX 0.10 removed `ShapedArray.vma` (`aval.manual_axis_type.varying` instead); `jax.shard_map` is the
  place of shard_map since 0.8 (`jax.experimental.shard_map` warns); the same in 0.10 to 0.12.
- The same in 0.10.2 to 0.12: `jax.core.eval_jaxpr`, `Tracer` and `eval_context`, `jax.typeof`,
  `jax.random.key_data` and `wrap_key_data`, typed key dtypes (`jax.dtypes.extended`), `jax.export`, the
  `reduce_sum` params (`axes`, `out_sharding`), `Primitive.get_bind_params` (a dict of params),
  `jax.extend.core`'s `Literal`, `Var`, `DropVar`, `Jaxpr`, `DebugInfo`, `jaxpr_as_fun` and
  `jaxprs_in_params`.
"""
from __future__ import annotations

import re
from typing import Callable

import jax
from jax import lax


def parse_version(text: str) -> tuple[int, ...]:
    """The leading numbers of a release string: '0.12.0.1' -> (0, 12, 0, 1); '0.10.2.dev1' -> (0, 10, 2)."""
    return tuple(int(m) for m in re.findall(r"\d+", re.match(r"[\d.]*", text).group(0)))


VERSION = parse_version(jax.__version__)
SUPPORTED = ((0, 10, 2), (0, 13))      # [lowest, first unsupported): pyproject.toml declares the same range


def scan_counts(params: dict) -> tuple[int, int]:
    """(constants, carried values) among a `scan` equation's operands, from its params."""
    if "num_consts" in params:        # JAX 0.10 and 0.11
        return params["num_consts"], params["num_carry"]
    consts, carry, _ = params["ft_in"].unpack()   # JAX 0.12: a flat tree of (consts, carry, xs)
    return len(consts), len(carry)


# ---- primitives newer releases emit, as their lowering computes them ------------------------------------------

def _one_minus_square(x):
    one = lax.full_like(x, 1)
    return lax.mul(lax.add(one, x), lax.sub(one, x))      # JAX 0.12 lowers it as (1 + x)(1 - x)


def _log2(x):
    return lax.mul(lax.log(x), lax.full_like(x, 1.4426950408889634))   # JAX 0.12: log(x) times 1/ln 2


def _horner(x, *coeffs):
    acc = coeffs[-1]
    for c in reversed(coeffs[:-1]):
        acc = jax.numpy.add(jax.numpy.multiply(acc, x), c)   # JAX 0.12, up to its unroll threshold
    return acc


def expansion(name: str, params: dict, avals) -> Callable | None:
    """A function of the equation's operands computing what the primitive `name` with `params` computes, in
    primitives superopt models, as JAX's lowering of it does; None where there is none (the equation stays
    as it is). `avals`: the operands' abstract values."""
    if name == "one_minus_square" and not params:
        return _one_minus_square
    if name == "log2" and params.get("accuracy") is None and all(
            jax.numpy.issubdtype(a.dtype, jax.numpy.floating) for a in avals):
        return _log2
    threshold = 8 if params.get("unroll") is None else params["unroll"]
    if name == "polynomial" and 2 <= len(avals) - 1 <= threshold:
        return _horner                # past the threshold JAX's lowering starts a scan from zeros: not this
    return None
