"""Loop vectorization (superopt/loops.py): a scan or fori_loop whose iterations are independent becomes its
body batched, with the loop's values; a loop whose iterations depend on each other is left as it is."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax import lax

from superopt.egraph.capture import capture
from superopt.loops import vectorize
from superopt.lowering.jax import lower

RNG = np.random.default_rng(0)
X = jnp.asarray(RNG.standard_normal((24, 8)), jnp.float32)
W = jnp.asarray(RNG.standard_normal((8,)), jnp.float32)
M = jnp.asarray(RNG.standard_normal((8, 8)), jnp.float32)


def vectorized(fn, *args):
    """(how many loops were batched, the loops left, the batched program's outputs, jax.jit's)."""
    graph, done = vectorize(capture(fn, args).graph)
    n = done.count("batched")
    left = sum(op.name in ("scan", "while") for op in graph.opaque)
    return n, left, [np.asarray(o) for o in lower(graph)(*args)], [np.asarray(o) for o in
                                                                   jax.tree_util.tree_leaves(jax.jit(fn)(*args))]


def row_map(x):
    return lax.fori_loop(0, x.shape[0], lambda i, x: x.at[i].set(jnp.tanh(x[i]) * 2.0), x)


def row_norm(x):
    return lax.fori_loop(0, x.shape[0], lambda i, x: x.at[i].set((x[i] - x[i].mean()) / jnp.sqrt(x[i].var() + 1e-5)), x)


def into_other(x):   # rows 2..9 of a fresh array, from the rows of an invariant one
    return lax.fori_loop(2, 10, lambda i, y: y.at[i].set(x[i] * 3.0 + y[i]), jnp.ones_like(x))


def scan_map(x):
    return lax.scan(lambda c, r: (c, jnp.sin(r) @ M), 0.0, x)[1]


def reversed_map(x):
    return lax.scan(lambda c, r: (c, r * 2.0 + 1.0), 0.0, x, reverse=True)[1]


def backwards(x):   # the rows from the last to the first: still one row each
    return lax.fori_loop(0, 20, lambda i, x: x.at[21 - i].set(x[21 - i] * 2.0 + W[0]), x)


EXACT = {"backwards": backwards, "row-map": row_map, "row-norm": row_norm, "into-other": into_other, "scan-map": scan_map,
         "reversed": reversed_map}


@pytest.mark.parametrize("name", sorted(EXACT))
def test_independent_iterations_are_batched_with_the_loops_values(name):
    n, left, got, want = vectorized(EXACT[name], X)
    assert (n, left) == (1, 0)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_an_accumulation_is_a_sum_of_the_batched_terms():
    def acc(x, w):
        return lax.fori_loop(0, x.shape[0], lambda i, c: c + jnp.sum(jnp.tanh(x[i]) * w), 0.0)

    def scan_acc(x):
        return lax.scan(lambda c, r: (c + r * r, None), jnp.zeros(8), x)[0]
    for fn, args in ((acc, (X, W)), (scan_acc, (X,))):
        n, left, got, want = vectorized(fn, *args)
        assert (n, left) == (1, 0)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)


@given(st.lists(st.integers(-2**31, 2**31 - 1), min_size=6, max_size=6))
@settings(max_examples=25, deadline=None)
def test_an_integer_accumulation_wraps_as_the_loop_does(values):
    """Integer addition wraps (two's complement) and is associative: the batched sum is bit-identical."""
    x = jnp.asarray(np.array(values, np.int32).reshape(6, 1) * np.ones((1, 3), np.int32))
    fn = lambda x: lax.fori_loop(0, 6, lambda i, c: c + x[i] * 7, jnp.zeros(3, jnp.int32))   # noqa: E731
    n, _, got, want = vectorized(fn, x)
    assert n == 1
    np.testing.assert_array_equal(got[0], want[0])


DEPENDENT = {
    "running-sum": lambda x: lax.scan(lambda c, r: (c + r, c + r), jnp.zeros(8), x)[1],
    "reads-next-row": lambda x: lax.fori_loop(0, 23, lambda i, x: x.at[i].set(x[i + 1] * 2.0), x),
    "reads-whole": lambda x: lax.fori_loop(0, 24, lambda i, x: x.at[i].set(jnp.sum(x) * x[i]), x),
    "carry-through": lambda x: lax.scan(lambda c, r: (jnp.tanh(c * r), None), jnp.ones(8), x)[0],
    "same-row-twice": lambda x: lax.fori_loop(0, 24, lambda i, x: x.at[i // 2].set(x[i // 2] + 1.0), x),
}


@pytest.mark.parametrize("name", sorted(DEPENDENT))
def test_dependent_iterations_stay_a_loop(name):
    n, left, got, want = vectorized(DEPENDENT[name], X)
    assert (n, left) == (0, 1)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_a_counter_that_starts_at_an_argument_is_not_known_and_stays_a_loop():
    def fn(x, start):
        return lax.fori_loop(start, start + 4, lambda i, x: x.at[i].set(x[i] * 2.0), x)
    n, left, got, want = vectorized(fn, X, jnp.int32(3))
    assert (n, left) == (0, 1)
    np.testing.assert_array_equal(got[0], want[0])


def test_a_loop_with_a_print_stays_a_loop():
    def fn(x):
        def body(i, x):
            jax.debug.print("{}", i)
            return x.at[i].set(x[i] * 2.0)
        return lax.fori_loop(0, 4, body, x)
    graph, done = vectorize(capture(fn, (X,)).graph)
    assert done == []


def test_a_short_dependent_loop_is_written_out_with_the_loops_values():
    coeffs = jnp.asarray(RNG.standard_normal(6), jnp.float32)
    horner = lambda c, x: lax.fori_loop(0, c.shape[0], lambda i, acc: acc * x + c[i], jnp.zeros_like(x))  # noqa: E731
    power = lambda a: lax.fori_loop(0, 5, lambda _, p: p @ a, jnp.eye(8, dtype=a.dtype))                    # noqa: E731
    emitted = lambda x: lax.scan(lambda c, r: (jnp.tanh(c + r), c * r), jnp.zeros(8), x[:6], reverse=True)  # noqa: E731
    for fn, args in ((horner, (coeffs, X)), (power, (M,)), (emitted, (X,))):
        graph, done = vectorize(capture(fn, args).graph)
        assert done == ["unrolled"] and not graph.opaque
        for g, w in zip(lower(graph)(*args), jax.tree_util.tree_leaves(jax.jit(fn)(*args)), strict=True):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_masked_sums_by_the_counter_are_one_segment_sum():
    """A row loop that sums, per row r, the entries whose row id is r (a sparse matrix-vector product, a
    histogram, a k-means centroid update) is one segment sum: the values the loop computes, without the
    rows x entries mask."""
    rows, nnz = 16, 200
    row_ids = jnp.asarray(np.sort(RNG.integers(0, rows + 3, nnz)), jnp.int32)   # some ids past the loop's rows
    cols = jnp.asarray(RNG.integers(0, rows, nnz), jnp.int32)
    vals = jnp.asarray(RNG.standard_normal(nnz), jnp.float32)
    v = jnp.asarray(RNG.standard_normal(rows), jnp.float32)

    def csr(vals, cols, row_ids, x):
        body = lambda r, y: y.at[r].set(jnp.sum(jnp.where(row_ids == r, vals * x[cols], 0.0)))   # noqa: E731
        return lax.fori_loop(0, x.shape[0], body, jnp.zeros_like(x))

    def centroids(points, labels, c):
        def body(k, c):
            mask = labels == k
            return c.at[k].set(jnp.sum(jnp.where(mask[:, None], points, 0.0), axis=0) / jnp.maximum(jnp.sum(mask), 1))
        return lax.fori_loop(0, c.shape[0], body, c)

    labels = jnp.asarray(RNG.integers(0, 5, 40), jnp.int32)
    points = jnp.asarray(RNG.standard_normal((40, 3)), jnp.float32)
    for fn, args in ((csr, (vals, cols, row_ids, v)), (centroids, (points, labels, jnp.zeros((6, 3))))):
        graph, done = vectorize(capture(fn, args).graph)
        assert done == ["batched"]
        assert any(op.name == "scatter-add" for op in graph.opaque), [op.name for op in graph.opaque]
        assert not any(graph.nodes[i].op == "select" and len(graph.nodes[i].shape) == 2 and
                       graph.nodes[i].shape[0] == args[-1].shape[0] for i in graph.live())   # no rows x entries mask
        np.testing.assert_allclose(np.asarray(lower(graph)(*args)[0]), np.asarray(jax.jit(fn)(*args)),
                                   rtol=1e-5, atol=1e-5)


def split(fn, *args):
    """(what the loop pass did, the program after it, its outputs, jax.jit's)."""
    graph, done = vectorize(capture(fn, args).graph)
    return done, graph, [np.asarray(o) for o in lower(graph)(*args)], [np.asarray(o) for o in
                                                                        jax.tree_util.tree_leaves(jax.jit(fn)(*args))]


def loop_body_ops(graph) -> list[str]:
    (loop,) = [op for op in graph.opaque if op.name == "scan"]
    return [e.primitive.name for e in loop.params["jaxpr"].jaxpr.eqns]


def test_an_rnns_input_projection_is_one_product_before_the_loop():
    def rnn(h, xs, wx, wh):   # x_t @ wx reads no carry; h @ wh does
        return lax.scan(lambda h, x: (jnp.tanh(x @ wx + h @ wh), h), h, xs)
    done, graph, got, want = split(rnn, W, X, M / 3, M / 3)
    assert done == ["split"]
    assert loop_body_ops(graph).count("dot_general") == 1
    assert any(graph.nodes[i].op == "matmul" and graph.nodes[i].shape == (24, 8) for i in graph.live())
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


SPLIT = {   # each keeps a carry read by the next iteration, beside work that reads none
    "running-sum-of-terms": lambda x: lax.scan(lambda c, r: (c + jnp.tanh(r) * 0.5, c), jnp.zeros(8), x),
    "reversed": lambda x: lax.scan(lambda c, r: (c * 0.5 + jnp.exp(r), c), jnp.ones(8), x, reverse=True),
    "ys-ahead": lambda x: lax.scan(lambda c, r: (jnp.maximum(c, jnp.sin(r)), jnp.cos(r) * 2.0), jnp.zeros(8), x),
    "rows-of-an-invariant": lambda x: lax.fori_loop(3, 20, lambda i, c: c * 0.9 + jnp.log1p(x[i] ** 2), jnp.zeros(8)),
}


@pytest.mark.parametrize("name", sorted(SPLIT))
def test_work_that_reads_no_carry_is_done_ahead_with_the_loops_values(name):
    done, graph, got, want = split(SPLIT[name], X)
    assert done == ["split"]
    body = loop_body_ops(graph)
    assert not {"tanh", "exp", "sin", "cos", "log1p"} & set(body), body   # the costly work left the loop
    assert not any(graph.nodes[i].op == "gather" for i in graph.live())   # rows of an invariant are a slice
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_a_loop_whose_free_work_is_cheap_or_too_large_is_not_split(monkeypatch):
    import superopt.loops as loops
    cheap = lambda x: lax.scan(lambda c, r: (c + r, c), jnp.zeros(8), x)   # noqa: E731 - nothing costly ahead
    assert split(cheap, X)[0] == []
    monkeypatch.setattr(loops, "MAX_SPLIT_BYTES", 24 * 8 * 4 - 1)          # tanh(r) * 0.5 for all rows: 768 B
    assert split(SPLIT["running-sum-of-terms"], X)[0] == []


# ---- through superopt ----

from superopt import superopt   # noqa: E402

A = jnp.asarray(RNG.standard_normal((512, 32)), jnp.float32)   # enough rows for the loop to cost more


@pytest.mark.slow   # grad, vmap and export each compile the program; the batching's own tests stay fast
def test_a_batched_row_loop_is_chosen_and_matches_jax_jit_under_grad_vmap_and_export():
    fast = superopt(row_norm, target="cpu", cache=False)
    np.testing.assert_allclose(np.asarray(fast(A)), np.asarray(jax.jit(row_norm)(A)), rtol=1e-6, atol=1e-6)
    assert fast.report.optimized, fast.report.outcome
    assert "1 with independent iterations batched" in fast.report.loops
    matches_under_grad_vmap_and_export(fast, row_norm)


def matches_under_grad_vmap_and_export(fast, fn):
    loss = lambda f: (lambda x: jnp.sum(f(x) ** 2 * jnp.arange(32.0)))   # noqa: E731
    np.testing.assert_allclose(np.asarray(jax.grad(loss(fast))(A)), np.asarray(jax.grad(loss(fn))(A)),
                               rtol=1e-4, atol=1e-4)
    batch = jnp.stack([A, -A * 2.0])
    np.testing.assert_allclose(np.asarray(jax.vmap(fast)(batch)), np.asarray(jax.vmap(fn)(batch)),
                               rtol=1e-5, atol=1e-5)
    exported = jax.export.export(jax.jit(fast))(A)
    np.testing.assert_allclose(np.asarray(exported.call(A)), np.asarray(jax.jit(fn)(A)), rtol=1e-6, atol=1e-6)


@pytest.mark.slow   # two optimizations, then grad, vmap and export: the full suite's (the split itself: above)
def test_a_split_rnn_is_chosen_under_fast_and_matches_jax_jit_under_grad_vmap_and_export():
    wx = jnp.asarray(RNG.standard_normal((32, 32)) / 6, jnp.float32)
    wh = jnp.asarray(RNG.standard_normal((32, 32)) / 6, jnp.float32)

    def rnn(xs):
        return lax.scan(lambda h, x: (jnp.tanh(x @ wx + h @ wh), h), jnp.zeros(32), xs)[1]
    # Under strict, verification decides: near overflow the batched product's sums may overflow where the
    # rows' did not, and the tanh after them hides that from the contract's sum edge (BENCHMARKS.md, loops).
    strict = superopt(rnn, target="cpu", cache=False)
    np.testing.assert_allclose(np.asarray(strict(A)), np.asarray(jax.jit(rnn)(A)), rtol=1e-5, atol=1e-6)
    fast = superopt(rnn, target="cpu", cache=False, numerics="fast")
    np.testing.assert_allclose(np.asarray(fast(A)), np.asarray(jax.jit(rnn)(A)), rtol=1e-5, atol=1e-6)
    assert fast.report.optimized, fast.report.outcome
    assert "1 with the work independent of their carries done ahead, batched" in fast.report.loops
    matches_under_grad_vmap_and_export(fast, rnn)


def test_a_short_matrix_power_loop_is_re_associated_behind_the_guard_under_strict():
    a = jnp.asarray(RNG.standard_normal((128, 128)) / 12, jnp.float32)
    power = lambda a: lax.fori_loop(0, 8, lambda _, p: p @ a, jnp.eye(128, dtype=a.dtype))   # noqa: E731
    fast = superopt(power, target="cpu", cache=False)
    np.testing.assert_allclose(np.asarray(fast(a)), np.asarray(jax.jit(power)(a)), rtol=1e-4, atol=1e-5)
    assert fast.report.optimized and fast.report.guarded, fast.report.outcome
    assert "written out" in fast.report.loops
    big = a.at[0, 0].set(1e30)   # past the guard's bound: the original runs, bit for bit
    np.testing.assert_array_equal(np.asarray(fast(big)), np.asarray(jax.jit(power)(big)))


def test_loop_invariant_work_is_moved_out_with_the_loops_values():
    def gram(h, w, b):   # w @ w.T and exp(b) read only loop invariants; h is carried
        return lax.fori_loop(0, 12, lambda _, h: jnp.tanh(h @ (w @ w.T) + jnp.exp(b)), h)
    args = (X[:4], M / 4, W)
    graph, done = vectorize(capture(gram, args).graph)
    assert done == ["hoisted"]
    (loop,) = [op for op in graph.opaque if op.name == "scan"]
    assert not any(e.primitive.name == "exp" for e in loop.params["jaxpr"].jaxpr.eqns)
    assert sum(graph.nodes[i].op in ("matmul", "exp") for i in graph.live()) == 2   # outside the loop now
    for g, w in zip(lower(graph)(*args), jax.tree_util.tree_leaves(jax.jit(gram)(*args)), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_a_loop_with_only_cheap_invariant_work_stays_as_it_is():
    fn = lambda h, b: lax.fori_loop(0, 12, lambda _, h: jnp.tanh(h + b.reshape(1, -1)), h)   # noqa: E731
    graph, done = vectorize(capture(fn, (X[:4], W)).graph)
    assert done == []


def test_two_scans_over_one_range_are_fused_with_the_loops_values():
    def stats(xs):
        total = lax.scan(lambda c, x: (c + x, c), jnp.zeros(8), xs)[1]
        peak = lax.scan(lambda c, x: (jnp.maximum(c, x), c * 2.0), jnp.full(8, -jnp.inf), xs)
        return total, peak
    graph, done = vectorize(capture(stats, (X,)).graph)
    assert done == ["fused"] and [op.name for op in graph.opaque] == ["scan"]
    for g, w in zip(lower(graph)(X), jax.tree_util.tree_leaves(jax.jit(stats)(X)), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_a_loop_reading_another_loops_rows_takes_each_row_as_it_is_computed():
    def chained(xs):   # a map loop, then a reduction over its rows; its rows are a result too
        rows = lax.scan(lambda c, x: (c + x, jnp.tanh(c + x)), jnp.zeros(8), xs)[1]
        return rows, lax.scan(lambda c, r: (jnp.maximum(c, r), c), jnp.zeros(8), rows)[1]
    graph, done = vectorize(capture(chained, (X,)).graph)
    assert done == ["fused"] and [op.name for op in graph.opaque] == ["scan"]
    for g, w in zip(lower(graph)(X), jax.tree_util.tree_leaves(jax.jit(chained)(X)), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_scans_that_read_each_other_or_differ_in_range_stay_apart():
    def chained(xs):   # the second reads the first's final carry: all of the first must run before it
        total = lax.scan(lambda c, x: (c + x, c), jnp.zeros(8), xs)[0]
        return lax.scan(lambda c, x: (jnp.maximum(c, x * total), c), jnp.zeros(8), xs)[1]

    def ranges(xs):
        return (lax.scan(lambda c, x: (c + x, c), jnp.zeros(8), xs)[1],
                lax.scan(lambda c, x: (c * x, c), jnp.ones(8), xs[:10])[1],
                lax.scan(lambda c, x: (c - x, c), jnp.zeros(8), xs, reverse=True)[1])
    for fn in (chained, ranges):
        graph, done = vectorize(capture(fn, (X,)).graph)
        assert "fused" not in done and sum(op.name == "scan" for op in graph.opaque) >= 2
