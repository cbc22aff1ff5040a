"""A rewrite XLA would make itself is not a gain: where XLA compiles the chosen program to the original's
executable, superopt keeps the original, says so, and spends no verification on it (stages.same_executable,
lowering/hlo.py)."""
import jax
import jax.numpy as jnp
import numpy as np

from superopt import superopt
from superopt.lowering.hlo import executable
from superopt.report import Outcome

R = jnp.asarray(np.random.default_rng(0).standard_normal((4, 64)), jnp.float32)


def shared_negation(r):
    """The model prices the repeated -r[0] three times; XLA's CSE computes it once anyway."""
    return (-r[0]) * r[1] + (-r[0]) * r[2] + (-r[0]) * r[3]


def test_a_rewrite_xla_makes_itself_keeps_the_original_unverified():
    fast = superopt(shared_negation, target="cpu", cache=False)
    np.testing.assert_array_equal(np.asarray(fast(R)), np.asarray(jax.jit(shared_negation)(R)))
    assert fast.report.kind is Outcome.SAME_EXECUTABLE, fast.report.outcome
    assert "original's executable" in fast.report.outcome
    assert "verify" not in fast.report.stage_seconds and "compare" in fast.report.stage_seconds
    assert executable(jax.jit(fast), (R,)) == executable(jax.jit(shared_negation), (R,))


def test_a_program_xla_compiles_differently_is_still_optimized():
    a = jnp.asarray(np.random.default_rng(1).standard_normal((200, 200)), jnp.float32)
    diag = lambda a, b: jnp.diag(a @ b)   # noqa: E731 - the everyday benchmark's first kernel
    fast = superopt(diag, target="cpu", cache=False)
    np.testing.assert_allclose(np.asarray(fast(a, a)), np.asarray(jax.jit(diag)(a, a)), rtol=1e-4, atol=1e-4)
    assert fast.report.optimized, fast.report.outcome
    assert executable(jax.jit(fast), (a, a)) != executable(jax.jit(diag), (a, a))
