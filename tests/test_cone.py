"""The cone of a discontinuity (issue 52, item 5): a value that flows into a comparison, a floor, a float->int
conversion, an argmax or a `where` condition is computed under strict numerics exactly as captured. A rounding
or an order rewrite upstream of a step moves its result by a whole step: a histogram whose bin edges were the
diagonal of a matrix product, rewritten as the row sums of a * b.T ("order"), put values lying on an edge
into the neighbouring bin. Random inputs almost never land on an edge, so these tests put them there."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from superopt import superopt
from superopt.egraph.capture import capture
from superopt.extract.cone import cone

N = 48


def diag_hist(a, b, x):
    edges = jnp.diag(a @ b)                   # "order": diagonal-of-matmul sums a * b.T by rows
    return jnp.sum(x[:, None] >= edges[None, :], axis=0), edges


def rowsum_hist(a, b, x):
    edges = jnp.sum(a, axis=1)                # "order" on the cpu: row-sums-as-matvec, a @ ones
    return jnp.sum(x[:, None] >= edges[None, :], axis=0), edges


def _args(seed: int):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((N, N), np.float32), rng.standard_normal((N, N), np.float32)


def _bits(x) -> np.ndarray:
    x = np.asarray(x)
    return x.view(np.dtype(f"u{x.dtype.itemsize}")) if x.dtype.kind == "f" else x


def _on_edges(fn, a, b):
    """The data: the bin edges themselves, as jax.jit computes them."""
    return jax.jit(fn)(a, b, jnp.zeros(N, jnp.float32))[1]


@pytest.mark.slow
@pytest.mark.parametrize("extractor", ["greedy", "ilp"])
@pytest.mark.parametrize("fn", [diag_hist, rowsum_hist], ids=lambda f: f.__name__)
def test_strict_counts_values_on_the_bin_edges_as_jax_jit_does(fn, extractor):
    a, b = _args(0)
    x = _on_edges(fn, a, b)
    fast = superopt(fn, target="cpu", extractor=extractor)
    counts, edges = fast(a, b, x)
    want_counts, want_edges = jax.jit(fn)(a, b, x)
    np.testing.assert_array_equal(_bits(edges), _bits(want_edges))   # the edges, bit for bit
    np.testing.assert_array_equal(np.asarray(counts), np.asarray(want_counts))
    assert fast.report.extraction.pinned > 0, fast.report.extraction


@pytest.mark.slow
def test_fast_numerics_still_rewrites_the_edges():
    fast = superopt(diag_hist, target="cpu", numerics="fast")
    a, b = _args(1)
    fast(a, b, _on_edges(diag_hist, a, b))
    assert fast.report.ops_after.get("matmul", 0) == 0, fast.report.ops_after   # diag(a @ b) as row sums
    assert fast.report.extraction.pinned == 0, fast.report.extraction


@pytest.mark.slow
def test_a_program_without_a_step_keeps_its_rewrite_under_strict():
    fast = superopt(lambda a, b: jnp.diag(a @ b), target="cpu")
    fast(*_args(2))
    assert fast.report.outcome == "optimized"
    assert fast.report.ops_after.get("matmul", 0) == 0, fast.report.ops_after
    assert fast.report.extraction.pinned == 0, fast.report.extraction


def test_the_cone_is_what_flows_into_a_step_and_not_a_where_s_branches():
    def fn(x, y):
        t = x * 2.0                                      # feeds the condition: in the cone
        u = y + 1.0                                      # a branch only: outside
        return jnp.where(t > 0.5, u, -u), jnp.floor(y * 3.0)
    captured = capture(fn, (jnp.ones(8, jnp.float32), jnp.ones(8, jnp.float32)))
    g = captured.graph
    inside = {g.nodes[i].op for i in cone(g)}
    ops = {i: g.nodes[i].op for i in g.live()}
    assert {"mul", "arg", "lit"} <= inside and "gt" not in inside   # what a step reads, not its result
    adds = [i for i, op in ops.items() if op == "add"]
    assert adds and not set(adds) & cone(g)
    assert not {i for i, op in ops.items() if op in ("select", "floor", "neg")} & cone(g)


# ---- the property: arithmetic that non-exact rules rewrite, feeding a step ----

FEEDS = {
    "diag-of-product": lambda a, b: jnp.diag(a @ b),
    "row-sums": lambda a, b: jnp.sum(a, axis=1),
    "column-sums": lambda a, b: jnp.sum(a, axis=0),
    "row-sums-of-scaled-rows": lambda a, b: jnp.sum(a * b[0][None, :], axis=1),
    "trace": lambda a, b: jnp.trace(a @ b).reshape(1),
}
STEPS = {
    "compare": lambda v, x: jnp.sum(x[:, None] >= v[None, :], axis=0),
    "floor": lambda v, x: jnp.floor(v),
    "to-int": lambda v, x: v.astype(jnp.int32),
    "argmax": lambda v, x: jnp.argmax(v),
    "where-condition": lambda v, x: jnp.where(v > x[:v.shape[0]], 1.0, 2.0),
}


@pytest.mark.slow
@given(feed=st.sampled_from(sorted(FEEDS)), step=st.sampled_from(sorted(STEPS)), seed=st.integers(0, 2**16))
def test_strict_computes_what_feeds_a_step_bit_identically_to_jax_jit(feed, step, seed):
    def fn(a, b, x):
        v = FEEDS[feed](a, b)
        return STEPS[step](v, x), v
    a, b = _args(seed)
    x = jnp.resize(jax.jit(fn)(a, b, jnp.zeros(N, jnp.float32))[1], (N,))   # data on the decision boundary
    got, want = superopt(fn, target="cpu")(a, b, x), jax.jit(fn)(a, b, x)
    np.testing.assert_array_equal(_bits(got[1]), _bits(want[1]), err_msg=f"{feed} into {step}")
    np.testing.assert_array_equal(_bits(got[0]), _bits(want[0]), err_msg=f"{feed} into {step}")


def test_an_opaque_reading_a_steps_integers_is_extracted():
    """A sort (opaque) of an argmin's labels: the argmin is a step on the cone's floats, the sort reads only
    its integers, which no rewrite can move across a discontinuity. The extractor had excluded every e-node
    of the sort ("no well-typed term found") and the program ran as captured for no reason."""
    rng = np.random.default_rng(0)
    points, centroids = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((40, 3), (6, 3)))

    def labels_sorted(points, centroids):
        dist = jnp.sum((points[:, None, :] - centroids[None, :, :]) ** 2, axis=-1)
        return jnp.sort(jnp.argmin(dist, axis=1)), dist * 2.0 * 3.0

    for target in ("cpu", "gpu-h100"):
        fast = superopt(labels_sorted, target=target, cache=False)
        got = fast(points, centroids)
        assert "well-typed" not in fast.report.outcome, fast.report.outcome
        for g, w in zip(got, jax.jit(labels_sorted)(points, centroids)):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
