"""A training step with dynamic loss scaling, global-norm clipping and Adam: the optimized program makes
the same skip decisions as the original, keeps the parameters within tolerance, touches gradient memory
fewer times, and says so in its report."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench.programs import train_step, train_step_fn
from superopt import superopt
from superopt.egraph.runner import StopReason
from superopt.extract.target import load_target
from superopt.extract.traffic import gradient_tensors, gradient_traffic
from superopt.lowering.npu.lower import NpuExecutable


@pytest.fixture(scope="module")
def step():
    w = train_step(batch=32, features=64, hidden=128, classes=16)
    fn = superopt(train_step_fn, target="cpu")
    fn.compile(*w.args)
    return w, fn


def _run(fn, args, schedule):
    """One step per entry of `schedule`: (loss scale or None to keep the state's, corrupt the batch)."""
    params, m, v, x, labels, scale, count = args
    bad_x = np.asarray(x).copy()
    bad_x[3, 5] = np.inf                                  # one overflowed activation in the batch
    history = []
    for forced, corrupt in schedule:
        if forced is not None:
            scale = jnp.float32(forced)
        params, m, v, scale, count, loss = fn(params, m, v, bad_x if corrupt else x, labels, scale, count)
        history.append((jax.tree_util.tree_map(np.asarray, params), float(scale), float(count)))
    return history


def test_the_optimized_step_makes_the_same_skip_decisions(step):
    w, fn = step
    # Steps whose gradients are not finite (an Inf or NaN loss scale, an overflowed batch) are skipped
    # and halve the scale; the others are applied.
    schedule = [(2.0 ** 15, False), (float("inf"), False), (2.0 ** 12, True), (None, False), (None, True),
                (float("nan"), False), (2.0 ** 10, False), (None, False)]
    want = _run(jax.jit(train_step_fn), w.args, schedule)
    got = _run(fn, w.args, schedule)
    applied = [b[2] > a[2] for a, b in zip([(None, None, 0.0)] + want, want)]
    assert applied == [True, False, False, True, False, False, True, True]   # both paths are exercised
    for (p_want, s_want, c_want), (p_got, s_got, c_got) in zip(want, got):
        assert c_got == c_want and (s_got == s_want or (np.isnan(s_got) and np.isnan(s_want)))
        for a, b in zip(jax.tree_util.tree_leaves(p_want), jax.tree_util.tree_leaves(p_got)):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


def test_the_report_counts_passes_over_gradient_memory(step):
    w, fn = step
    report = fn.report
    before, after = report.gradient_traffic
    assert after.passes < before.passes and after.bytes < before.bytes
    assert "gradient mem" in str(report) and f"{before.passes} passes" in str(report)


def test_the_step_saturates_under_the_default_limits(step):
    # every rewrite of the step is found, not cut off: a reshape takes one iteration per op to move
    # along the optimizer's elementwise chains, and the default iteration limit leaves room for them
    _, fn = step
    run = fn.report.run
    assert run.stop_reason is StopReason.SATURATED, [(p.name, p.stop_reason.value, p.iterations) for p in run.phases]


def test_gradient_tensors_are_the_gradients_not_the_moments():
    # W and its moment m have the same shape; the gradient and its unscaled form are gradient tensors,
    # the moment update (elementwise in m) is not.
    def fn(w, m, x):
        g = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
        g = g * 0.5
        new_m = 0.9 * m + 0.1 * g
        return w - 0.01 * new_m, new_m

    from superopt.egraph.capture import capture
    args = (np.ones((8, 4), np.float32), np.zeros((8, 4), np.float32), np.ones((2, 8), np.float32))
    graph = capture(fn, args).graph
    grads = gradient_tensors(graph)
    ops = sorted(graph.nodes[i].op for i in grads)
    assert "matmul" in ops or "transpose" in ops        # the weight gradient x^T @ dy
    assert all(graph.nodes[i].shape in ((8, 4), (4, 8)) for i in grads)
    moment = [i for i in graph.live() if graph.nodes[i].op == "add" and graph.nodes[i].shape == (8, 4)]
    assert moment and not set(moment) & grads
    assert gradient_traffic(graph).passes >= 2


def test_a_matmul_chain_that_returns_its_arguments_shape_has_no_gradients():
    # (a @ b) @ c has the shape of a, but nothing updates a: no parameters, so no gradient memory and no
    # "gradient mem" line in the report
    x = np.ones((16, 16), np.float32)
    fast = superopt(lambda a, b, c: (a @ b) @ c, target="cpu")
    fast(x, x, x)
    assert fast.report.gradient_traffic == () and "gradient mem" not in str(fast.report)


@pytest.fixture(scope="module")
def npu_step():
    w = train_step(batch=32, features=64, hidden=128, classes=16)
    fn = superopt(train_step_fn, target="npu-910b")
    return fn, fn.compile(*w.args)


def test_on_the_npu_sibling_launches_count_as_one_pass(npu_step):
    # The NPU lowering runs the is-finite check and the norm of a gradient as one launch, and a weight's
    # p, m and v updates as another: the report counts passes as the program runs
    fn, spec = npu_step
    assert spec.npu is not None and spec.npu.groups, fn.report.backend
    before, after = fn.report.gradient_traffic
    assert after == gradient_traffic(spec.term, spec.npu.groups)
    assert after.passes < gradient_traffic(spec.term).passes and after.passes < before.passes
    assert before == gradient_traffic(spec.original, NpuExecutable(spec.original, load_target("npu-910b")).groups)


def test_no_gradient_is_copied_into_a_full_size_mask_or_square(npu_step):
    # The is-finite check and the squared norm of each gradient reduce it by rows as they read it; a
    # full-size is_finite or square tensor of a gradient would be written and read again (a weight
    # gradient a matmul computes kept transposed once made the extractor miss the row kernels)
    _, spec = npu_step
    g = spec.term
    grads = gradient_tensors(g)
    for i in g.live():
        node = g.nodes[i]
        last = node.attrs[0][-1].op if node.op == "kernel" else node.op
        if last in ("is_finite", "square"):
            assert not any(j in grads and g.nodes[j].shape == node.shape for j in node.inputs), (i, node.op)
