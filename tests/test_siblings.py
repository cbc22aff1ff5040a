"""Sibling kernels (egraph/siblings.py): which launches may run as one, where the group runs, and the
count of passes over gradient memory when a backend runs them so."""
import jax.numpy as jnp
import numpy as np

from superopt.egraph.capture import capture
from superopt.core.ir import Graph, Node
from superopt.egraph.siblings import internal, merged_body, run_before, sibling_groups
from superopt.extract.traffic import gradient_tensors, gradient_traffic


def _ops(graph, group):
    return [graph.nodes[i].op for i in group]


def _elementwise(node):
    return bool(node.shape) and node.op in ("mul", "add", "sub", "is_finite", "square", "select")


def _tensor(operand, reader):
    return bool(operand.shape)


def _graph(fn, *shapes):
    return capture(fn, tuple(np.ones(s, np.float32) for s in shapes)).graph


def test_updates_reading_one_gradient_are_one_group():
    def fn(g, m, v):
        return m * 0.9 + g, v * 0.99 + g * g, g * 3.0

    graph = _graph(fn, (8, 4), (8, 4), (8, 4))
    groups = sibling_groups(graph, graph.constant_nodes(), _elementwise, _tensor)
    readers_of_g = [i for i in graph.live() if graph.nodes[i].op != "arg" and 0 in graph.nodes[i].inputs]
    grouped = {i for grp in groups for i in grp}
    assert len(readers_of_g) >= 3 and set(readers_of_g) <= grouped


def test_a_member_read_by_another_is_not_in_its_group():
    # t = g * 2 is read by u = t + g: running them as one launch would need t before it exists
    def fn(g):
        t = g * 2.0
        return t, t + g

    graph = _graph(fn, (8, 4))
    for group in sibling_groups(graph, graph.constant_nodes(), _elementwise, _tensor):
        operands = {j for i in group for j in graph.nodes[i].inputs}
        assert not operands & set(group)
    mul = next(i for i in graph.live() if graph.nodes[i].op == "mul")
    add = next(i for i in graph.live() if graph.nodes[i].op == "add")
    assert not any(mul in g and add in g for g in sibling_groups(graph, set(), _elementwise, _tensor))


def test_a_group_runs_once_its_operands_exist_before_any_reader():
    # a = g * 2 is read (by c) before b = g + 1 is computed in program order; the group {a, b} runs
    # right after g's last operand, so before c
    def fn(g, h):
        a = g * 2.0
        c = a - h
        b = g + 1.0
        return c, b

    graph = _graph(fn, (8, 4), (8, 4))
    groups = sibling_groups(graph, graph.constant_nodes(), _elementwise, _tensor)
    live = graph.live()
    pos = {i: n for n, i in enumerate(live)}
    group = next(g for g in groups if "mul" in _ops(graph, g))
    assert "add" in _ops(graph, group)
    constant = graph.constant_nodes()
    [first] = [i for i, gs in run_before(graph, groups, constant).items() if group in gs]
    readers = [i for i in live if set(graph.nodes[i].inputs) & set(group)]
    assert all(pos[first] <= pos[r] for r in readers)
    assert all(pos[j] < pos[first] for i in group for j in graph.nodes[i].inputs if j not in constant)


def test_merged_bodies_compute_a_shared_value_once():
    # kernels m + g*g and v - g*g both compute g*g; merged with `share` it is computed once
    t = ((8, 4), "float32")

    def kernel(op, inputs):
        body = (Node("arg", (), (0,), *t), Node("arg", (), (1,), *t), Node("mul", (0, 0), (), *t),
                Node(op, (1, 2), (), *t))
        return Node("kernel", inputs, (body,), *t)

    graph = Graph(n_args=3)
    g, m, v = (graph.add(Node("arg", (), (k,), *t)) for k in range(3))
    a = graph.add(kernel("add", (g, m)))
    b = graph.add(kernel("sub", (g, v)))
    graph.outputs = [a, b]
    assert sibling_groups(graph, set(), lambda n: n.op == "kernel", _tensor) == [[a, b]]
    shared, roots, loads = merged_body(graph, [a, b], lambda i: graph.nodes[i].attrs[0], share=True)
    apart, _, _ = merged_body(graph, [a, b], lambda i: graph.nodes[i].attrs[0])
    assert sum(n.op == "mul" for n in shared) == 1 and sum(n.op == "mul" for n in apart) == 2
    assert loads == [g, m, v] and [shared[r].op for r in roots] == ["add", "sub"]


def test_a_group_is_one_pass_over_gradient_memory():
    # a step on one weight: its gradient g is read by the is-finite check, the squared norm and the three
    # updates; run as two groups (the reductions, then the updates) it is read twice
    def fn(w, m, v, x):
        g = x.T @ jnp.tanh(x @ w)
        finite = jnp.all(jnp.isfinite(g))
        norm = jnp.sum(g * g)
        clip = jnp.minimum(1.0, 1.0 / (norm + 1e-6))
        new_m = 0.9 * m + 0.1 * g * clip
        new_v = 0.99 * v + 0.01 * g * g * clip
        new_w = w - 0.01 * g * clip
        return jnp.where(finite, new_w, w), jnp.where(finite, new_m, m), jnp.where(finite, new_v, v)

    graph = _graph(fn, (8, 8), (8, 8), (8, 8), (4, 8))
    constant = graph.constant_nodes()
    alone = gradient_traffic(graph)
    siblings = sibling_groups(graph, constant, _elementwise, _tensor)
    grouped = gradient_traffic(graph, siblings)
    assert siblings and alone.tensors == grouped.tensors and alone.tensors >= 1
    assert grouped.passes < alone.passes and grouped.bytes < alone.bytes

    # chained, the clipped gradient and the moments are computed on chip by the update that reads them:
    # fewer passes, and those tensors are no longer kept in global memory
    chained = sibling_groups(graph, constant, _elementwise, _tensor, chained=True)
    on_chip = {i for g in chained for i in internal(graph, g)}
    fused = gradient_traffic(graph, chained)
    assert on_chip and fused.passes < grouped.passes and fused.bytes < grouped.bytes
    assert fused.tensors == alone.tensors - len(on_chip & gradient_tensors(graph))
    users = graph.users()
    assert all(set(users[i]) <= set(g) for g in chained for i in internal(graph, g))


def test_a_chained_group_never_waits_on_itself():
    # t = g * 2 is read by u = sin(t) outside the group's ops and v = u + t: t and v cannot be one launch
    # (u would have to run inside it); t and w = t - g can
    def fn(g):
        t = g * 2.0
        u = jnp.sin(t)
        return u + t, t - g

    graph = _graph(fn, (8, 4))
    ops = {graph.nodes[i].op: i for i in graph.live()}
    chained = sibling_groups(graph, graph.constant_nodes(), lambda n: _elementwise(n) and n.op != "add",
                             _tensor, chained=True)
    assert [sorted(g) for g in chained] == [sorted([ops["mul"], ops["sub"]])]
    chained = sibling_groups(graph, graph.constant_nodes(), _elementwise, _tensor, chained=True)
    assert not any(ops["mul"] in g and ops["add"] in g for g in chained)


def test_plain_groups_are_kept_where_a_chain_spans_the_whole_cell():
    # a recurrent cell: each step's two products read the state and their sum is the next state. Chained,
    # every step links into one component whose only written output is the last state, so no chained
    # group has two outputs; the plain groups (the two products of each step) must still form
    def fn(x, w1, w2):
        h = x
        for _ in range(3):
            h = h * w1 + h * w2
        return h

    graph = _graph(fn, (8, 4), (8, 4), (8, 4))
    constant = graph.constant_nodes()
    plain = sibling_groups(graph, constant, _elementwise, _tensor)
    assert len(plain) == 3 and all(_ops(graph, g) == ["mul", "mul"] for g in plain)
    assert sibling_groups(graph, constant, _elementwise, _tensor, chained=True) == plain


def test_a_group_that_reads_another_groups_member_runs_after_that_group():
    # {b1, b2} read x, {a2, a1} read y, and a1 reads b1. b2 waits for w, so {b1, b2} runs after w; the
    # other group must wait for it, though its own operands (y, b1's position) come earlier
    def fn(x, y, z):
        b1 = x * 2.0
        a2 = y * 3.0
        w = jnp.sin(z)
        b2 = x * w
        a1 = y + b1
        return a2, b2, a1

    args = tuple(np.full((8, 32), k + 1.0, np.float32) for k in range(3))
    graph = capture(fn, args).graph
    constant = graph.constant_nodes()
    groups = sibling_groups(graph, constant, _elementwise, _tensor)
    assert len(groups) == 2
    order = [grp for grps in run_before(graph, groups, constant).values() for grp in grps]
    done: set = set()
    for grp in order:
        members_read = {j for i in grp for j in graph.nodes[i].inputs} & {i for g in groups for i in g}
        assert members_read <= done
        done |= set(grp)
    assert len(order) == 2

    from superopt.extract.target import load_target
    from superopt.lowering.npu.lower import NpuExecutable
    npu = NpuExecutable(graph, load_target("npu-910b"))
    for got, want in zip(npu(*args), fn(*args)):
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-6)


def test_groups_that_wait_on_each_other_are_not_both_formed():
    # a1 reads b1 and b2 reads a2: each group would wait on the other; one runs apart, and the other
    # runs after the first's operand and before its readers
    t = ((8, 4), "float32")
    graph = Graph(n_args=2)
    x, y = (graph.add(Node("arg", (), (k,), *t)) for k in range(2))
    b1 = graph.add(Node("neg", (x,), (), *t))
    a2 = graph.add(Node("exp", (y,), (), *t))
    a1 = graph.add(Node("add", (y, b1), (), *t))
    b2 = graph.add(Node("mul", (x, a2), (), *t))
    graph.outputs = [a1, b2]
    before = run_before(graph, [[b1, b2], [a2, a1]], set())
    formed = [grp for grps in before.values() for grp in grps]
    assert len(formed) == 1
    [(at, [grp])] = before.items()
    pos = {i: n for n, i in enumerate(graph.live())}
    assert all(pos[j] < pos[at] for i in grp for j in graph.nodes[i].inputs)
    assert all(pos[u] >= pos[at] for u in graph.live() for i in grp if i in graph.nodes[u].inputs)
