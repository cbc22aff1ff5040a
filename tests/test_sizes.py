"""One optimization for every size (superopt/sizes.py): a call at new argument shapes takes the decision made at
earlier ones where its program is the earlier one with its extents renamed, and is searched where it is not;
`jax.export` with a symbolic dimension exports the program chosen at stand-in sizes."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import export

from superopt import superopt
from superopt.core.ir import Graph, Node
from superopt.sizes import renaming, renamed_graph, same_program, stand_ins

RNG = np.random.default_rng(0)
V = jnp.asarray(RNG.standard_normal((64,)), jnp.float32)
W = jnp.asarray(RNG.standard_normal((64, 48)) / 8, jnp.float32)


def _x(rows: int, cols: int = 64) -> jnp.ndarray:
    return jnp.asarray(RNG.standard_normal((rows, cols)), jnp.float32)


def log_and_root(x, v):    # strict, unguarded: exp(log(y)) of a positive y is y, sqrt(x * x) is |x|
    return jnp.exp(jnp.log(x * x + 1.0)) + jnp.sqrt(x * x) * v


def gram_times(x, v):      # strict, guarded: (x^T x) v re-associated behind a check of x's and v's range
    return (x.T @ x) @ v


def tanh_norm(x, w):       # kept: nothing cheaper
    h = jnp.tanh(x @ w)
    return h / h.mean(-1, keepdims=True)


def _searched(report) -> bool:
    return "saturate" in report.stage_seconds


# ---- the renaming ----

def test_renaming_reads_the_changed_extents_and_refuses_ambiguous_ones():
    f32 = "float32"
    assert renaming((((32, 64), f32), ((64, 48), f32)), (((40, 64), f32), ((64, 48), f32))) == {32: 40}
    # an extent that changes one way here and stays elsewhere, or changes two ways, is not a size of one thing
    assert renaming((((64, 64), f32),), (((40, 64), f32),)) is None
    assert renaming((((32, 32), f32),), (((40, 48), f32),)) is None
    # small extents may be axes or ranks in attributes; other dtypes or ranks are other programs
    assert renaming((((4, 64), f32),), (((40, 64), f32),)) is None
    assert renaming((((32, 64), f32),), (((32, 64), "float16"),)) is None
    assert renaming((((32, 64), f32),), (((32, 64, 1), f32),)) is None
    assert renaming((((32, 64), f32),), (((32, 64), f32),)) is None   # nothing changed: no renaming


def test_a_renamed_program_must_equal_the_new_one_node_for_node():
    def graph(rows: int, divisor: float) -> Graph:
        g = Graph(n_args=1)
        g.add(Node("arg", (), (0,), (rows, 64), "float32"))
        g.add(Node("reduce_sum", (0,), ((0,),), (64,), "float32"))
        g.add(Node("lit", (), (divisor,), (), "float32"))
        g.add(Node("lit", (), (float("nan"),), (), "float32"))
        g.add(Node("div", (1, 2), (), (64,), "float32"))
        g.add(Node("add", (4, 3), (), (64,), "float32"))
        g.outputs = [5]
        return g
    # a mean over the rows divides by their count: the literal is renamed with the extent (NaN equals NaN)
    assert same_program(renamed_graph(graph(32, 32.0), {32: 40}), graph(40, 40.0))
    # a divisor that is not the extent (half of it) tells the renaming it does not hold
    assert not same_program(renamed_graph(graph(32, 16.0), {32: 40}), graph(40, 20.0))


def test_stand_ins_avoid_every_number_the_program_holds():
    b, = export.symbolic_shape("b")
    g = Graph(n_args=1)
    g.add(Node("arg", (), (0,), (b, 128), "float32"))
    g.outputs = [0]
    chosen = stand_ins((((b, 128), "float32"),), g)
    assert list(chosen) == [b] and chosen[b] != 128 and chosen[b] >= 9
    two, = export.symbolic_shape("2*b")
    assert stand_ins((((two, 128), "float32"),), g) is None


# ---- new sizes of one function ----

def test_a_kept_program_at_new_sizes_takes_the_decision_without_a_search():
    fast = superopt(tanh_norm, cache=False)
    fast(_x(32), W)
    assert not fast.report.optimized and _searched(fast.report)
    for rows in (40, 72):
        x = _x(rows)
        np.testing.assert_array_equal(fast(x, W), jax.jit(tanh_norm)(x, W))
        assert not _searched(fast.report) and "sizes" in fast.report.stage_seconds
        assert fast.report.sizes.startswith("the decision at argument shapes 32x64, 64x48"), fast.report.sizes
        assert fast.report.reason == "no cheaper program found"
        assert "sizes        : the decision at" in str(fast.report)


def test_a_changed_program_is_renamed_priced_and_checked_at_new_sizes():
    fast = superopt(log_and_root, cache=False)
    fast(_x(32), V)
    first = fast.report
    assert first.optimized and not first.guarded, first.outcome
    x = _x(56)
    np.testing.assert_allclose(fast(x, V), jax.jit(log_and_root)(x, V), rtol=1e-5, atol=1e-5)
    report = fast.report
    assert report.optimized and not _searched(report) and "priced again and checked" in report.sizes
    assert report.ops_after == first.ops_after   # the same program, at other sizes
    assert report.cost_before > first.cost_before   # priced at the new sizes


@pytest.mark.slow
def test_a_guarded_program_derives_its_bound_again_at_new_sizes():
    fast = superopt(gram_times, cache=False)
    fast(_x(128), V)
    assert fast.report.optimized and fast.report.guarded, fast.report.outcome
    x = _x(400)   # a sum over more rows: the bound on the arguments is lower
    np.testing.assert_allclose(fast(x, V), jax.jit(gram_times)(x, V), rtol=1e-4, atol=1e-3)
    renamed, fresh = fast.report, superopt(gram_times, cache=False, reuse_sizes=False)
    fresh(x, V)
    assert renamed.sizes and _searched(fresh.report) and not fresh.report.sizes
    assert fast._specialization().term.guard.exponent == fresh._specialization().term.guard.exponent
    assert fast._specialization().term.guard.exponent < _exponent_at(gram_times, 128)


def _exponent_at(fn, rows: int) -> int:
    fast = superopt(fn, cache=False, reuse_sizes=False)
    fast(_x(rows), V)
    return fast._specialization().term.guard.exponent


def test_a_size_that_enters_the_program_another_way_is_searched_again():
    def first_half(x, v):
        return jnp.sum(x[: x.shape[0] // 2] * v, axis=1)
    fast = superopt(first_half, cache=False)
    fast(_x(32), V)
    x = _x(48)   # the slice's bound is 24, not a renamed 16
    np.testing.assert_allclose(fast(x, V), jax.jit(first_half)(x, V), rtol=1e-5, atol=1e-5)
    assert _searched(fast.report) and not fast.report.sizes


def test_a_renamed_program_that_computes_something_else_is_not_taken():
    from superopt import pipeline, stages
    from superopt.sizes import Match
    fast = superopt(log_and_root, cache=False)
    fast(_x(32), V)
    decision = fast._sizes._decisions[-1]
    # what a rewrite's folded number, taken for an extent, could make: the program scaled by 2
    wrong = Graph(list(decision.chosen.nodes), list(decision.chosen.outputs), list(decision.chosen.consts),
                  n_args=decision.chosen.n_args)
    out = wrong.outputs[0]
    two = wrong.add(Node("lit", (), (2.0,), (), "float32"))
    wrong.outputs = [wrong.add(Node("mul", (out, two), (), wrong.nodes[out].shape, "float32"))]
    from superopt.egraph.capture import capture
    captured = capture(log_and_root, (jax.ShapeDtypeStruct((48, 64), jnp.float32), V))
    sizes = renaming(decision.avals, captured.in_avals)
    search = _search_of(fast)
    assert pipeline._at_other_sizes(captured, search, stages.Stages(),
                                    Match(decision, sizes, renamed_graph(wrong, sizes))) is None
    assert pipeline._at_other_sizes(captured, search, stages.Stages(),
                                    Match(decision, sizes, renamed_graph(decision.chosen, sizes))).report.optimized


def _search_of(fast):
    from superopt import stages
    schedule, left_out = stages.schedule_of(fast.options.rulesets, fast.options.numerics, fast.options.target.kind)
    return stages.Search(fast.options, schedule, left_out)


def test_reuse_sizes_false_searches_every_size_and_is_checked():
    fast = superopt(tanh_norm, cache=False, reuse_sizes=False)
    fast(_x(32), W)
    fast(_x(40), W)
    assert _searched(fast.report) and not fast.report.sizes
    with pytest.raises(TypeError, match="reuse_sizes must be True or False"):
        superopt(tanh_norm, reuse_sizes="yes")


@pytest.mark.slow
def test_gradients_at_new_sizes_are_jax_jits():
    fast = superopt(gram_times, cache=False)
    loss = lambda f: jax.jit(jax.grad(lambda x, v: jnp.sum(f(x, v) ** 2), argnums=(0, 1)))   # noqa: E731
    loss(fast)(_x(128), V)
    x = _x(160)
    for ours, theirs in zip(loss(fast)(x, V), loss(gram_times)(x, V)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-3, atol=1e-2)
    assert fast.report.sizes and fast.report.optimized and "verified" in fast.report.derivatives


# ---- symbolic dimensions ----

@pytest.mark.parametrize("fn, changed", [(log_and_root, True), (gram_times, False)])
def test_export_with_a_symbolic_batch_exports_the_program_chosen_at_stand_ins(fn, changed):
    fast = superopt(fn, cache=False)
    b, = export.symbolic_shape("b")
    exported = export.export(jax.jit(fast))(jax.ShapeDtypeStruct((b, 64), jnp.float32), V)
    report = fast.report
    assert report.optimized is changed, report.outcome
    assert "symbolic dimensions b" in (report.sizes if changed else report.reason)
    # a guard's bound holds for the stand-in's sums, not longer ones: never exported with a symbolic batch
    assert not report.guarded
    for rows in (5, 40, 300):
        x = _x(rows)
        np.testing.assert_allclose(exported.call(x, V), jax.jit(fn)(x, V), rtol=1e-4, atol=1e-3)


# ---- any program at any size: what a call takes from an earlier size is never wrong ----

_W = jnp.asarray(np.random.default_rng(7).standard_normal((64, 64)) / 8, jnp.float32)
_STEPS = {   # each maps x of shape (n, 64) to x of shape (n, 64), whatever n is
    "scale": lambda x: x * 1.5 + 0.25,
    "gauss": lambda x: jnp.exp(-x * x),
    "tanh": jnp.tanh,
    "matmul": lambda x: x @ _W,
    "center-rows": lambda x: x - jnp.mean(x, axis=1, keepdims=True),
    "center-batch": lambda x: x - jnp.mean(x, axis=0, keepdims=True),       # divides by n
    "batch-sum": lambda x: x + jnp.sum(x, axis=0),                          # a sum over the renamed extent
    "gram": lambda x: x @ (x.T @ x) / 64.0,                                 # a contraction over n
    "halves": lambda x: jnp.concatenate([x[:, 32:], x[:, :32]], axis=1),
    "stack-rows": lambda x: jnp.concatenate([x, x * 2.0], axis=0)[: x.shape[0]],   # 2n, then n again
    "refold": lambda x: (x.reshape(x.shape[0] * 2, 32) * 0.5).reshape(x.shape[0], 64),  # 2n as an extent
    "first-row": lambda x: x + x[:1],
    "half-batch": lambda x: x.at[: x.shape[0] // 2].multiply(0.5),          # n // 2 as a bound
}


@pytest.mark.slow
@settings(max_examples=10, deadline=None, derandomize=True)
@given(steps=st.lists(st.sampled_from(sorted(_STEPS)), min_size=1, max_size=4),
       sizes=st.lists(st.sampled_from([9, 16, 32, 33, 64, 96, 128]), min_size=2, max_size=3, unique=True))
def test_any_program_at_a_new_size_returns_what_jax_jit_returns(steps, sizes):
    def program(x):
        for name in steps:
            x = _STEPS[name](x)
        return jnp.sum(x * x, axis=1)
    fast = superopt(program, cache=False)
    for rows in sizes:
        x = jnp.asarray(np.random.default_rng(rows).standard_normal((rows, 64)), jnp.float32)
        np.testing.assert_allclose(fast(x), jax.jit(program)(x), rtol=2e-4, atol=2e-4,
                                   err_msg=f"{steps} at {rows} rows after {sizes}: {fast.report.sizes}")
