"""Custom derivative rules survive superopt: a `jax.custom_jvp` or `jax.custom_vjp` function's rule is what
`jax.grad`, `jax.vjp` and `jax.jvp` of the optimized program apply, never the derivative of its primal body.

Each program wraps the rule around `jnp.diagonal(a @ b)`, which superopt rewrites on a GPU target (the
diagonal of a matmul is a row sum of a product), so the program that runs is superopt's, not the original.
The inputs put the rule's argument exactly at its kinks (relu at 0, a norm at 0), where the body's own
derivative differs from the rule's."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st

from custom_rules import clip_gradient, safe_norm, straight_through_round
from superopt import superopt
from superopt import stages
from superopt.egraph.capture import capture

CHANGED = "gpu-h100"   # on cpu these small programs run as the original; a GPU target's model changes them
N = 8


def diag_of(a, b):
    return jnp.diagonal(a @ b)


def inputs(values):
    """a = I, b with `values` on its diagonal (so diagonal(a @ b) is `values`) and small integers elsewhere."""
    values = np.asarray(values, np.float32)
    b = np.asarray(np.random.default_rng(0).integers(-2, 3, (len(values), len(values))), np.float32)
    np.fill_diagonal(b, values)
    return jnp.eye(len(values), dtype=jnp.float32), jnp.asarray(b)


KINKS = inputs([0.0, 1.0, -1.0, 0.0, 0.5, -0.5, 2.0, 0.0])


def assert_same_derivatives(fn, args, forward: bool = True):
    """superopt(fn) changed the program, and its value, gradient (vjp) and, where `forward`, jvp equal fn's."""
    fast = superopt(fn, target=CHANGED)
    np.testing.assert_allclose(fast(*args), fn(*args), rtol=1e-6, atol=1e-6)
    assert fast.report.optimized, fast.report.outcome
    argnums = tuple(range(len(args)))
    got, want = jax.grad(fast, argnums)(*args), jax.grad(fn, argnums)(*args)
    for g, w in zip(got, want):
        assert np.all(np.isfinite(np.asarray(g))), g
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    if forward:
        tangents = tuple(jnp.ones_like(x) for x in args)
        np.testing.assert_allclose(jax.jvp(fast, args, tangents)[1], jax.jvp(fn, args, tangents)[1],
                                   rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_relu_derivative_at_zero_is_relus_rule():
    assert_same_derivatives(lambda a, b: jnp.sum(jax.nn.relu(diag_of(a, b))), KINKS)


@pytest.mark.slow
def test_clipping_custom_vjp_clips_the_gradient():
    assert_same_derivatives(lambda a, b: jnp.sum(clip_gradient(diag_of(a, b)) * 10.0), KINKS, forward=False)


@pytest.mark.slow
def test_straight_through_round_passes_the_gradient():
    assert_same_derivatives(lambda a, b: jnp.sum(straight_through_round(diag_of(a, b)) * 3.0), KINKS)


@pytest.mark.slow
def test_safe_norm_at_zero_has_a_finite_gradient():
    assert_same_derivatives(lambda a, b: safe_norm(diag_of(a, b)), inputs(np.zeros(N)))


STAGES = {"relu": jax.nn.relu, "clip": clip_gradient, "round": straight_through_round,
          "tanh": jnp.tanh, "double": lambda x: x * 2.0}
CUSTOM = ("relu", "clip", "round")


@pytest.mark.slow
@given(stages=st.lists(st.sampled_from(sorted(STAGES)), min_size=0, max_size=2),
       rule=st.sampled_from(CUSTOM),
       values=st.lists(st.sampled_from([0.0, 0.5, -0.5, 1.0, -1.0, 1.5]), min_size=N, max_size=N))
def test_custom_rules_survive_any_program(stages, rule, values):
    """Programs of relu, a clipping custom_vjp, a straight-through round and plain ops around the diagonal
    of a matmul, at the kinks: the optimized program's gradient is the original's."""
    chain = [rule, *stages]

    def fn(a, b):
        h = diag_of(a, b)
        for name in chain:
            h = STAGES[name](h)
        return jnp.sum(h * jnp.arange(1.0, N + 1.0))

    assert_same_derivatives(fn, inputs(values), forward="clip" not in chain)


def close(got, want):
    jax.tree_util.tree_map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5), got, want)


@pytest.mark.slow
def test_rules_hold_under_jit_vmap_and_hessian():
    def fn(a, b):
        return jnp.sum(jax.nn.relu(diag_of(a, b)) ** 2) + jnp.sum(straight_through_round(diag_of(a, b)))

    def clipped(a, b):
        return jnp.sum(clip_gradient(diag_of(a, b)) ** 2)

    (a, b), fast, fast_clipped = KINKS, superopt(fn, target=CHANGED), superopt(clipped, target=CHANGED)
    batch = jnp.stack([a, a]), jnp.stack([b, -b])
    close(jax.jit(jax.grad(fast, (0, 1)))(a, b), jax.grad(fn, (0, 1))(a, b))
    close(jax.hessian(fast, 1)(a, b), jax.hessian(fn, 1)(a, b))
    close(jax.vmap(jax.grad(fast, 1))(*batch), jax.vmap(jax.grad(fn, 1))(*batch))
    close(jax.jit(jax.vmap(jax.grad(fast_clipped, 1)))(*batch), jax.vmap(jax.grad(clipped, 1))(*batch))
    assert fast.report.optimized and fast_clipped.report.optimized


@pytest.mark.slow
def test_rules_hold_with_a_debug_print_which_runs_as_under_jit(capfd):
    def fn(a, b):
        jax.debug.print("step {}", a[0, 0])
        return jnp.sum(jax.nn.relu(diag_of(a, b)))

    def printed(run) -> tuple:
        jax.effects_barrier()
        capfd.readouterr()
        out = run()
        jax.effects_barrier()
        return out, capfd.readouterr().out.count("step 1.0")

    fast = superopt(fn, target=CHANGED)
    fast(*KINKS)
    (got, n_got), (want, n_want) = printed(lambda: jax.grad(fast, 1)(*KINKS)), printed(
        lambda: jax.grad(jax.jit(fn), 1)(*KINKS))
    close(got, want)
    assert fast.report.optimized, fast.report.outcome
    assert n_got == n_want == 1


@pytest.mark.slow   # a 90-row loop re-rolled and differentiated: 13 s, make test, not test-fast
def test_a_long_rerolled_loop_is_optimized_and_differentiated_with_its_rules(tmp_path):
    """A Python loop over 90 rows (630 ops traced, past stages.EVALUATED_REFERENCE_OPS), re-rolled
    (superopt/reroll.py), is verified against superopt's own evaluator (XLA takes seconds to compile the
    loop as traced); the program's derivative reference must still be the user's program as JAX runs it:
    tracing the evaluator raised TracerArrayConversionError."""
    rows = range(90)

    def f(a, v):
        return jnp.stack([jnp.sum(jax.nn.relu(a[i]) * v) for i in rows])
    rng = np.random.default_rng(0)
    a = rng.standard_normal((90, 200)).astype(np.float32)
    a[:, :5] = 0.0                                             # relu's kink
    v = rng.standard_normal((200,)).astype(np.float32)
    assert len(capture(f, (a, v)).graph.live()) > stages.EVALUATED_REFERENCE_OPS
    fast = superopt(f, target="cpu", cache=tmp_path)
    np.testing.assert_allclose(np.asarray(fast(a, v)), np.asarray(jax.jit(f)(a, v)), rtol=1e-5, atol=1e-5)
    assert fast.report.optimized, fast.report.outcome
    loss = lambda fn: (lambda a, v: jnp.sum(fn(a, v) ** 2))
    # the reference under jax.jit: op by op, its 630-op derivative compiled each of its ops on its own
    np.testing.assert_allclose(np.asarray(jax.grad(loss(fast))(a, v)), np.asarray(jax.jit(jax.grad(loss(f)))(a, v)),
                               rtol=1e-5, atol=1e-5)
    # relu's rule makes it the user's program's derivative in any case; the report says why in its words
    assert fast.report.derivatives.startswith("the original's"), fast.report.derivatives
