"""Peak memory (extract/memory.py) and rematerialization under `memory_budget`."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from superopt import superopt
from superopt.core.ir import Graph, Node
from superopt.extract.memory import beam_order, memory_order, parse_bytes, peak_memory, renumber, reorder_for_memory
from superopt.lowering.jax import lower

pytestmark = pytest.mark.slow   # whole models, worker processes or long searches: make test, not test-fast

F32 = "float32"


def _chain() -> Graph:
    """x -> a = exp(x) -> b = exp(a) -> c = add(a, b) (output); r = reshape(a) feeds d = neg(r) (output).
    Each f32[256] tensor is 1024 bytes."""
    g = Graph(n_args=1)
    x = g.add(Node("arg", (), (0,), (256,), F32))
    a = g.add(Node("exp", (x,), (), (256,), F32))
    b = g.add(Node("exp", (a,), (), (256,), F32))
    c = g.add(Node("add", (a, b), (), (256,), F32))
    r = g.add(Node("reshape", (a,), ((16, 16),), (16, 16), F32))
    d = g.add(Node("neg", (r,), (), (16, 16), F32))
    g.outputs = [c, d]
    return g


def test_peak_by_hand():
    # x is resident (1 KiB). a: 2 KiB live; b: 3; c: 4 (x, a, b, c), then b is freed; the reshape is a
    # view of a and allocates nothing, but keeps a alive for d: 4 KiB again (x, a, c, d).
    peak = peak_memory(_chain())
    assert peak.bytes == 4 * 1024
    assert peak.at == 3                    # first reached while c runs
    assert peak.floor == 3 * 1024          # x, c, d
    assert peak.live == (1, 2)             # a and b, the intermediates live at the peak
    assert peak.profile == (2048, 3072, 4096, 4096)


def test_peak_frees_after_last_use():
    g = Graph(n_args=1)
    x = g.add(Node("arg", (), (0,), (1024,), F32))
    a = g.add(Node("exp", (x,), (), (1024,), F32))
    b = g.add(Node("neg", (a,), (), (1024,), F32))   # a dies here
    c = g.add(Node("tanh", (b,), (), (1024,), F32))  # b dies here
    g.outputs = [c]
    peak = peak_memory(g)
    # While b runs: x, a, b live (12 KiB); while c runs: x, b, c (12 KiB), a already freed.
    assert peak.bytes == 3 * 4096
    assert peak.profile == (8192, 12288, 12288)


def _late_reader() -> Graph:
    """a = neg(x) -> b = exp(a) -> c = exp(b) -> s = sum(c) (output 0); t = sum(a) (output 1), built in
    the order the extractor writes (output 0's term first), which keeps a alive until the end."""
    g = Graph(n_args=1)
    x = g.add(Node("arg", (), (0,), (1024,), F32))
    a = g.add(Node("neg", (x,), (), (1024,), F32))
    b = g.add(Node("exp", (a,), (), (1024,), F32))
    c = g.add(Node("exp", (b,), (), (1024,), F32))
    s = g.add(Node("reduce_sum", (c,), ((0,),), (), F32))
    t = g.add(Node("reduce_sum", (a,), ((0,),), (), F32))
    g.outputs = [s, t]
    return g


def test_memory_order_reads_a_value_for_the_last_time_before_allocating_more():
    g = _late_reader()
    # In its own order, c runs while x, a, b and c are live (16 KiB).
    assert peak_memory(g).bytes == 4 * 4096
    # Reordered: t runs right after a, so b's node frees a; x, two tensors and t are live at most.
    assert memory_order(g) == [0, 1, 5, 2, 3, 4]
    fitted, ids = reorder_for_memory(g)
    assert peak_memory(fitted).bytes == 3 * 4096 + 4
    assert [fitted.nodes[ids[i]].op for i in g.live()] == [n.op for n in g.nodes]
    x = np.random.default_rng(0).normal(size=1024).astype(np.float32)
    for got, want in zip(lower(fitted)(x), lower(g)(x)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


def _equal_producers() -> Graph:
    """The shape of a jax.grad program: of producers of one size, greedily the earliest runs first,
    though only another one's reader frees what it reads. Big tensors are f32[1, 1024] (4 KiB); each
    output is one dot product of two of them (the column is a reshape, a view)."""
    g = Graph(n_args=1)

    def big(op, *ins):
        return g.add(Node(op, ins, (), (1, 1024), F32))

    def dot(a, b):
        return g.add(Node("matmul", (a, g.add(Node("reshape", (b,), (), (1024, 1), F32))), (), (1, 1), F32))

    x = g.add(Node("arg", (), (0,), (1, 1024), F32))
    a = big("exp", x)
    b = big("tanh", a)
    c = big("neg", b)
    d = big("exp", c)
    f = big("mul", d, b)
    h = big("mul", big("exp", a), d)
    g.outputs = [dot(f, a), dot(h, b), dot(big("tanh", b), c)]
    return g


def test_beam_order_holds_fewer_tensors_than_the_greedy_order():
    g = _equal_producers()
    greedy = peak_memory(renumber(g, memory_order(g))[0]).bytes
    beam = peak_memory(renumber(g, beam_order(g))[0]).bytes
    assert greedy // 4096 == 6             # x and five intermediates at once
    assert beam // 4096 == 5 and beam < greedy
    fitted, ids = reorder_for_memory(g)
    assert peak_memory(fitted).bytes == beam
    x = np.random.default_rng(0).normal(size=(1, 1024)).astype(np.float32)
    for got, want in zip(lower(fitted)(x), lower(g)(x)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


def test_reorder_keeps_its_own_order_when_that_is_no_worse():
    g = _chain()
    fitted, ids = reorder_for_memory(g)
    assert ids == {i: i for i in g.live()}
    assert peak_memory(fitted) == peak_memory(g)


@pytest.mark.parametrize("text, expected", [("64MB", 64_000_000), ("1.5GiB", 3 * 2**29), ("4096", 4096),
                                            (" 2 kib ", 2048), (1 << 20, 1 << 20)])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["lots", "12 parsecs", -5, 0, "0MB"])
def test_parse_bytes_rejects(bad):
    with pytest.raises(ValueError, match="memory_budget"):
        parse_bytes(bad)


def _mlp_grad():
    """jax.grad of a three-layer MLP's mean squared output, as bench/remat.py's `mlp_grad` with ReLU for its
    GELU: the same gradient program (the backward pass keeps every layer's intermediates), whose extraction
    takes a fraction of a second where GELU's derivative took ten (each test below extracts it once)."""
    def loss(params, x):
        h = x
        for w in params:
            h = jax.nn.relu(h @ w)
        return jnp.mean(h * h)
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    params = [jax.random.normal(keys[i], (64, 64)) * 0.05 for i in range(3)]
    return jax.grad(loss), (params, jax.random.normal(keys[3], (512, 64)))


@pytest.fixture(scope="module")
def unconstrained():
    fn, args = _mlp_grad()
    spec = superopt(fn, target="gpu-h100").compile(*args)
    return fn, args, spec


def _assert_same_gradients(got, fn, args):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(fn(*args))):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=1e-9)


def test_report_shows_peak_memory(unconstrained):
    _, _, spec = unconstrained
    before, after = spec.report.peak_memory
    assert "peak memory" in str(spec.report)
    # The backward pass of jax.grad keeps every forward intermediate; the fused program does not.
    assert after.bytes < before.bytes
    assert not spec.report.memory_note     # no budget given


def _fit_within(fn, args, budget):
    """Optimize under `budget`, run it, and check the budget was met; the gradients and the report."""
    fitted = superopt(fn, target="gpu-h100", memory_budget=budget)
    got = fitted(*args)
    report = fitted.report
    assert report.outcome == "optimized"
    assert report.peak_memory[1].bytes <= budget
    return got, report


def test_budget_first_reorders_the_program(unconstrained):
    # The extractor writes the gradient of the first layer's weight first; the other gradients keep
    # their layers' intermediates alive meanwhile. Running them as soon as they can fits the budget.
    fn, args, spec = unconstrained
    budget = spec.report.peak_memory[1].bytes - 1
    got, report = _fit_within(fn, args, budget)
    assert "within the budget" in report.memory_note and "reordered" in report.memory_note
    assert "nothing recomputed" in report.memory_note
    assert report.cost_after == spec.report.cost_after      # the same kernels, run in another order
    _assert_same_gradients(got, fn, args)


def test_budget_recomputes_until_the_peak_fits(unconstrained):
    fn, args, spec = unconstrained
    reordered = peak_memory(reorder_for_memory(spec.term)[0]).bytes
    assert reordered < spec.report.peak_memory[1].bytes
    budget = reordered - 1
    got, report = _fit_within(fn, args, budget)
    assert "within the budget" in report.memory_note and "recomputed" in report.memory_note
    assert "nothing recomputed" not in report.memory_note
    assert "memory budget" in str(report)
    assert report.cost_after > spec.report.cost_after        # recomputing costs compute
    # Recomputing in place of storing changes which tensors exist, not the result.
    _assert_same_gradients(got, fn, args)


def test_budget_below_the_floor_is_reported_not_met(unconstrained):
    fn, args, spec = unconstrained
    floor = spec.report.peak_memory[1].floor
    fitted = superopt(fn, target="gpu-h100", memory_budget=floor // 2)
    got = fitted(*args)
    assert "below" in fitted.report.memory_note
    assert fitted.report.peak_memory[1].bytes > floor // 2
    _assert_same_gradients(got, fn, args)


def test_budget_needs_the_greedy_extractor():
    with pytest.raises(ValueError, match="greedy"):
        superopt(lambda x: x + 1, target="cpu", extractor="ilp", memory_budget="1MB")
