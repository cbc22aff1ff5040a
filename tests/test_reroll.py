"""Loop re-rolling (superopt/reroll.py): copies of one computation over consecutive rows, stacked, become the
computation batched over the whole tensor; anything else stays as traced."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from superopt import superopt
from superopt.egraph.capture import capture
from superopt.lowering.jax import lower
from superopt.report import Outcome
from superopt.reroll import MIN_COPIES, reroll

rng = np.random.default_rng(0)
A = jnp.asarray(rng.standard_normal((24, 16)), jnp.float32)
V = jnp.asarray(rng.standard_normal(16), jnp.float32)
W = jnp.asarray(rng.standard_normal(24), jnp.float32)


def rerolled(fn, *args):
    graph = capture(fn, args).graph
    rolled, loops = reroll(graph)
    got = lower(rolled)(*args)[0]
    return graph, rolled, loops, np.asarray(got), np.asarray(jax.jit(fn)(*args))


@pytest.mark.slow
def test_a_loop_over_rows_becomes_one_computation_with_the_same_values():
    # Row i of A times the whole of V, summed; every op of the copies is batched: no slice is left.
    graph, rolled, loops, got, want = rerolled(lambda a, v: jnp.stack([jnp.sum(a[i] * v) for i in range(24)]), A, V)
    assert loops == 1
    assert len(graph.live()) > 24 * 4 and len(rolled.live()) < 10
    assert not any(rolled.nodes[i].op in ("slice", "concat") for i in rolled.live())
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # Elementwise copies are bit for bit the batched op.
    _, _, loops, got, want = rerolled(lambda a: jnp.stack([jnp.exp(a[i]) * 2.0 for i in range(24)]), A)
    assert loops == 1
    np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_columns_offsets_and_a_row_every_copy_shares():
    # Column i of A scaled by element i of W[:16]: two tensors read along different axes, stacked on axis 1.
    _, rolled, loops, got, want = rerolled(
        lambda a, w: jnp.stack([a[:, i] * w[i] for i in range(16)], axis=1), A, W)
    assert loops == 1
    np.testing.assert_array_equal(got, want)
    # Rows 3..12 of A, each times row 0 (the same in every copy): the rows are sliced out first.
    _, rolled, loops, got, want = rerolled(lambda a: jnp.stack([a[i + 3] * a[0] for i in range(10)]), A)
    assert loops == 1 and got.shape == (10, 16)
    np.testing.assert_array_equal(got, want)
    # A shared value computed once, outside the loop, is read by every copy as it is.
    _, rolled, loops, got, want = rerolled(
        lambda a, v: jnp.stack([a[i] - jnp.mean(v) for i in range(24)]), A, V)
    assert loops == 1
    assert sum(rolled.nodes[i].op == "reduce_sum" for i in rolled.live()) == 1
    np.testing.assert_array_equal(got, want)


def test_copies_that_are_not_one_loop_stay_as_traced():
    cases = [
        lambda a: jnp.stack([jnp.exp(a[i]) if i % 2 else jnp.sin(a[i]) for i in range(8)]),   # two templates
        lambda a: jnp.stack([a[2 * i] * 2.0 for i in range(8)]),                              # every other row
        lambda a: jnp.stack([a[0] * float(i) for i in range(8)]),                             # one row, scaled
        lambda a: jnp.stack([a[i] * 2.0 for i in range(MIN_COPIES - 1)]),                     # too few copies
        lambda a: jnp.stack([a[7 - i] * 2.0 for i in range(8)]),                              # rows backwards
    ]
    for fn in cases:
        graph = capture(fn, (A,)).graph
        rolled, loops = reroll(graph)
        assert loops == 0 and rolled is graph


@pytest.mark.slow
def test_superopt_searches_the_rerolled_loop_and_reports_it():
    fn = lambda a, v: jnp.stack([jnp.sum(a[i] * v) for i in range(24)])   # noqa: E731
    fast = superopt(fn, cache=False)
    got = fast(A, V)
    np.testing.assert_allclose(np.asarray(got), np.asarray(jax.jit(fn)(A, V)), rtol=1e-6, atol=1e-6)
    report = fast.report
    assert report.kind is Outcome.OPTIMIZED
    assert "loops over rows batched" in str(report)
    assert report.ops_before["slice"] == 24        # the report compares with the program as traced
    assert report.cost_after < report.cost_before


def test_a_long_unrolled_loop_is_verified_against_the_evaluated_original(monkeypatch):
    """A program traced past EVALUATED_REFERENCE_OPS is checked against superopt's own evaluation of it, not
    jax.jit's compile of it (seconds of XLA for a long loop); a wrong candidate is still refused."""
    from superopt import stages
    fn = lambda a: jnp.stack([jnp.exp(a[i]) * 2.0 for i in range(24)])   # noqa: E731   (24 * 6 ops)
    monkeypatch.setattr(stages, "EVALUATED_REFERENCE_OPS", 50)
    compiled, real = [], stages.reference_program

    def counting(captured):   # the JAX reference, run on arrays (not traced) only where it is compiled
        program = real(captured)

        def run(*args):
            if not any(isinstance(a, jax.core.Tracer) for a in args):
                compiled.append(1)
            return program(*args)
        return run
    monkeypatch.setattr(stages, "reference_program", counting)
    fast = superopt(fn, cache=False)
    np.testing.assert_array_equal(np.asarray(fast(A)), np.asarray(jax.jit(fn)(A)))
    assert fast.report.kind is Outcome.OPTIMIZED and not compiled
    # the same reference refuses a candidate that is wrong
    captured = capture(fn, (A,))
    rolled, _ = reroll(captured.graph)
    import dataclasses
    checking = stages.checking_reference(dataclasses.replace(captured, graph=rolled, traced=captured.graph))
    wrong = lambda a: [jnp.exp(a) * 2.0 + 1e-2]   # noqa: E731
    problem = stages.verification.verify(checking, wrong, captured.in_avals, captured.graph)
    assert problem is not None
