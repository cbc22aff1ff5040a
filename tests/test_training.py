"""A training step with dynamic loss scaling, global-norm clipping and Adam (or SGD with momentum): the
optimized program makes the same skip decisions as the original, keeps the parameters within tolerance,
touches gradient memory fewer times, and says so in its report."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from superopt.workloads import sgd_step, sgd_step_fn, train_step, train_step_fn
from superopt import superopt
from superopt.core.ir import body_str
from superopt.egraph.runner import StopReason
from superopt.extract.target import load_target
from superopt.extract.tiling import cone
from superopt.extract.traffic import gradient_tensors, gradient_traffic
from superopt.lowering.npu.lower import NpuExecutable

pytestmark = pytest.mark.slow   # whole models, worker processes or long searches: make test, not test-fast


@pytest.fixture(scope="module")
def step():
    w = train_step(batch=32, features=64, hidden=128, classes=16)
    # gpu-h100: its model prices the fusions that save passes over gradient memory; on cpu XLA makes the
    # same fusions by itself (extract/xla.py) and the original runs. The step runs here through JAX.
    fn = superopt(train_step_fn, target="gpu-h100")
    fn.compile(*w.args)
    return w, fn


def _run(fn, args, schedule):
    """One step per entry of `schedule`: (loss scale or None to keep the state's, corrupt the batch).

    `args` is (params, optimizer state..., x, labels, loss scale, count) and `fn` returns (params,
    optimizer state..., loss scale, count, loss), as the steps of superopt/workloads.py do."""
    *state, x, labels, scale, count = args
    bad_x = np.asarray(x).copy()
    bad_x[3, 5] = np.inf                                  # one overflowed activation in the batch
    history = []
    for forced, corrupt in schedule:
        if forced is not None:
            scale = jnp.float32(forced)
        *state, scale, count, loss = fn(*state, bad_x if corrupt else x, labels, scale, count)
        history.append((jax.tree_util.tree_map(np.asarray, state), float(scale), float(count)))
    return history


# Steps whose gradients are not finite (an Inf or NaN loss scale, an overflowed batch) are skipped and
# halve the scale; the others are applied.
SCHEDULE = [(2.0 ** 15, False), (float("inf"), False), (2.0 ** 12, True), (None, False), (None, True),
            (float("nan"), False), (2.0 ** 10, False), (None, False)]
APPLIED = [True, False, False, True, False, False, True, True]


def _assert_same_steps(step_fn, args, fast):
    want = _run(jax.jit(step_fn), args, SCHEDULE)
    got = _run(fast, args, SCHEDULE)
    applied = [b[2] > a[2] for a, b in zip([(None, None, 0.0)] + want, want)]
    assert applied == APPLIED   # both paths are exercised
    for (s_want, scale_want, c_want), (s_got, scale_got, c_got) in zip(want, got):
        assert c_got == c_want
        assert scale_got == scale_want or (np.isnan(scale_got) and np.isnan(scale_want))
        for a, b in zip(jax.tree_util.tree_leaves(s_want), jax.tree_util.tree_leaves(s_got)):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)   # parameters and optimizer state


def test_the_optimized_step_makes_the_same_skip_decisions(step):
    w, fn = step
    _assert_same_steps(train_step_fn, w.args, fn)


@pytest.fixture(scope="module")
def sgd():
    w = sgd_step(batch=32, features=64, hidden=128, classes=16)
    fn = superopt(sgd_step_fn, target="gpu-h100")   # as `step`
    return w, fn, fn.compile(*w.args)


def test_sgd_with_momentum_makes_the_same_skip_decisions_in_fewer_passes(sgd):
    # The same loss scaling, unscale, is-finite check and clipping in front of SGD with momentum: the
    # unscale and the clip fold into the momentum and parameter updates as they do into Adam's
    w, fn, spec = sgd
    assert spec.report.outcome == "optimized", spec.report.outcome
    _assert_same_steps(sgd_step_fn, w.args, fn)
    before, after = spec.report.gradient_traffic
    assert after.passes < before.passes and after.bytes < before.bytes
    param_shapes = {p.shape for p in jax.tree_util.tree_leaves(w.args[0])}
    for i in spec.term.live():          # no launch only unscales or only clips a gradient
        node = spec.term.nodes[i]
        assert not (node.op == "mul" and node.shape in param_shapes)


def test_the_cross_entropy_sums_its_rows_in_the_kernel_that_computes_them(sgd):
    # -mean(sum(labels * log_softmax(logits))) * loss_scale: the per-example losses are row sums taken
    # as the row kernel computes them, not a [batch, classes] tensor written and summed by another launch
    w, _, spec = sgd
    g = spec.term
    batch, classes = w.args[3].shape
    bodies = {i: body_str(g.nodes[i].attrs[0]) for i in g.live() if g.nodes[i].op == "kernel"}
    loss_rows = [i for i, body in bodies.items() if "log(" in body and g.nodes[i].shape == (batch, 1)]
    assert loss_rows and all(bodies[i].split("; ")[-1].startswith("row_sum(") for i in loss_rows), bodies
    for i in g.live():
        node = g.nodes[i]
        if node.op == "reduce_sum":
            assert not any(g.nodes[j].shape == (batch, classes) and "log(" in bodies.get(j, "")
                           for j in node.inputs), "the cross-entropy's rows are summed by a separate launch"


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
    # fast: a full sum of a gradient's row sums regroups the terms (reduce-sum-all-by-rows), which can
    # overflow where the original sum does not, so the row kernels below are an opt-in (tests/test_numerics.py)
    w = train_step(batch=32, features=64, hidden=128, classes=16)
    fn = superopt(train_step_fn, target="npu-910b", numerics="fast")
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


def test_on_the_npu_the_loss_scale_seed_runs_in_the_launch_of_the_softmax_row_sums(npu_step):
    # d(loss * scale)/d logits starts from labels * (-scale / batch): that product is computed in the
    # launch that computes the logits' softmax row sums, not in a launch of its own
    _, spec = npu_step
    g = spec.term
    labels, scale = 13, 14                 # params, m and v (4 leaves each), x, labels, loss_scale, count

    def args_of(nodes):
        return {g.nodes[j].attrs[0] for j in nodes if g.nodes[j].op == "arg"}

    seeds = [i for i in g.live() if g.nodes[i].op == "mul" and labels in args_of(g.nodes[i].inputs)
             and scale in args_of(cone(g.nodes, i, stop=lambda j: False))]
    assert seeds, "no labels * scale product in the program"
    for seed in seeds:
        group = next((grp for grp in spec.npu.groups if seed in grp), ())
        bodies = [body_str(g.nodes[i].attrs[0]) for i in group if g.nodes[i].op == "kernel"]
        assert any("row_sum(exp(" in body for body in bodies), (seed, spec.npu.groups)
