"""Capture and lowering of JAX features beyond plain array math: JAX transformations of a lowered program
(grad, jvp, vjp, jacrev, vmap), PRNG keys (typed and legacy), abstract arguments, and effects (debug prints
and callbacks), pinned in order and run once per call."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend import core as jcore

import searching
from superopt.egraph.capture import EffectfulResults, KeepWhole, capture, without_debug_effects
from superopt.egraph.encode import encode
from superopt.egraph.frozen import freeze
from superopt.core.ir import pretty
from superopt.egraph.runner import Limits, saturate
from superopt.extract.greedy import extract
from superopt.extract.memory import peak_memory, reorder_for_memory
from superopt.extract.target import load_target
from superopt.lowering.jax import lower
from superopt.rewrites.schedule import Schedule

RNG = np.random.default_rng(0)


def rand(*shape):
    return jnp.asarray(RNG.standard_normal(shape), jnp.float32)


def as_function(graph, out_tree):
    """The lowered graph as a function of fn's (pytree) arguments returning fn's pytree result."""
    program = lower(graph)
    return lambda *args: jax.tree_util.tree_unflatten(out_tree, program(*jax.tree_util.tree_leaves(args)))


def lowered(fn, args):
    captured = capture(fn, args)
    return as_function(captured.graph, captured.out_tree)


def optimized_graph(fn, args, target="cpu", rulesets=("algebra", "fusion")):
    """fn captured, saturated with `rulesets`, extracted for `target`: the graph the pipeline would lower."""
    captured = capture(fn, args)
    enc, _, fz = searching.saturated(captured.graph, Schedule.of(*rulesets), Limits(iterations=8, seconds=30))
    return extract(fz, enc, load_target(target)).graph, captured, fz


def close(a, b, rtol=1e-5, atol=1e-5):
    jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=rtol,
                                                                   atol=atol), a, b)


def identical(a, b):
    jax.tree_util.tree_map(lambda u, v: np.testing.assert_array_equal(np.asarray(u), np.asarray(v)), a, b)


# ---- 1. JAX transformations of a lowered program ----

def layer_norm(h):
    mu = h.mean(-1, keepdims=True)
    var = ((h - mu) ** 2).mean(-1, keepdims=True)
    return (h - mu) * lax.rsqrt(var + 1e-5)


IMG = rand(2, 8, 8, 3)
KERNEL = rand(3, 3, 3, 4) / 3
X, W = rand(4, 16), rand(16, 8) / 4
TRANSFORMED = {
    "mean": (lambda x: jnp.mean(x ** 2, axis=(1, 2)), (IMG,)),
    "sum": (lambda x: jnp.sum(jnp.sin(x), axis=-1), (IMG,)),
    "max": (lambda x: jnp.max(x, axis=(1, 3)), (IMG,)),
    "min_prod": (lambda x: jnp.min(x, axis=0) * jnp.prod(x[:, :2], axis=1).sum(0), (IMG,)),
    "max_pool": (lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"), (IMG,)),
    "avg_pool": (lambda x: lax.reduce_window(x, 0.0, lax.add, (1, 3, 3, 1), (1, 2, 2, 1), "SAME") / 9.0, (IMG,)),
    "conv": (lambda x, k: jnp.tanh(lax.conv_general_dilated(x, k, (1, 1), "SAME",
                                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))),
             (IMG, KERNEL)),
    "matmul": (lambda x, w: jnp.tanh(x @ w) @ w.T, (X, W)),
    "layer_norm": (lambda x, w: layer_norm(x @ w) * 2.0 + 1.0, (X, W)),
    "softmax": (lambda x, w: jax.nn.softmax(x @ w, axis=-1), (X, W)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TRANSFORMED))
def test_grad_jvp_vjp_jacrev_of_the_lowered_program_match_the_original(name):
    fn, args = TRANSFORMED[name]
    low = lowered(fn, args)
    weights = rand(*jax.eval_shape(fn, *args).shape)

    def loss(f):
        return lambda *a: jnp.sum(f(*a) * weights)
    argnums = tuple(range(len(args)))
    close(jax.grad(loss(low), argnums)(*args), jax.grad(loss(fn), argnums)(*args))
    tangents = tuple(rand(*a.shape) for a in args)
    close(jax.jvp(low, args, tangents), jax.jvp(fn, args, tangents))
    out, pull = jax.vjp(low, *args)
    want, pull_want = jax.vjp(fn, *args)
    close(out, want)
    close(pull(weights), pull_want(weights))
    close(jax.jacrev(low, argnums)(*args), jax.jacrev(fn, argnums)(*args))


@pytest.mark.slow
def test_vmap_and_jit_of_grad_of_the_lowered_program():
    fn, args = TRANSFORMED["layer_norm"]
    low = lowered(fn, args)
    batch = jnp.stack([X, X * 2.0, -X])
    close(jax.vmap(low, (0, None))(batch, W), jax.vmap(fn, (0, None))(batch, W))
    grad = jax.jit(jax.grad(lambda x, w: jnp.sum(low(x, w) ** 2), argnums=(0, 1)))
    close(grad(X, W), jax.grad(lambda x, w: jnp.sum(fn(x, w) ** 2), argnums=(0, 1))(X, W))


@pytest.mark.slow
@pytest.mark.parametrize("target", ["cpu", "npu-910b"])
def test_grad_of_an_optimized_program(target):
    """Extraction's programs (fused kernels, packed NPU layouts) differentiate like the original."""
    def fn(x, w):
        return jnp.sum(jnp.tanh(layer_norm(x @ w)) ** 2, axis=-1)
    graph, captured, _ = optimized_graph(fn, (X, W), target=target, rulesets=("algebra", "layout", "fusion"))
    low = as_function(graph, captured.out_tree)
    close(low(X, W), fn(X, W))
    close(jax.grad(lambda x, w: low(x, w).sum(), (0, 1))(X, W), jax.grad(lambda x, w: fn(x, w).sum(), (0, 1))(X, W),
          rtol=1e-4, atol=1e-5)


# ---- 2. abstract arguments and PRNG keys ----

def test_abstract_arguments_capture_as_concrete_ones():
    def fn(x, s, n):
        return jnp.tanh(x * s) + n
    concrete = capture(fn, (X, 2.0, 3))
    abstract = capture(fn, (jax.ShapeDtypeStruct(X.shape, X.dtype),
                            jax.ShapeDtypeStruct((), jnp.float32, weak_type=True),
                            jax.ShapeDtypeStruct((), jnp.int32, weak_type=True)))
    assert abstract.in_avals == concrete.in_avals == (((4, 16), "float32"), ((), "float32"), ((), "int32"))
    assert abstract.graph.nodes == concrete.graph.nodes
    assert [v.aval.weak_type for v in abstract.jaxpr.jaxpr.invars] == [False, True, True]
    identical(lower(abstract.graph)(X, 2.0, 3), [fn(X, 2.0, 3)])


def test_the_function_is_traced_once_and_the_jaxpr_is_kept():
    traces = []

    def fn(x):
        traces.append(1)
        return x * 2.0
    captured = capture(fn, (jax.ShapeDtypeStruct((3,), jnp.float32),))
    assert len(traces) == 1
    assert isinstance(captured.jaxpr, jcore.ClosedJaxpr)
    identical(jax.core.eval_jaxpr(captured.jaxpr.jaxpr, captured.jaxpr.consts, jnp.ones(3)), [jnp.full(3, 2.0)])


def typed(fn):
    """fn of a typed key, as superopt() hands it to capture: a function of the key's data."""
    return lambda data, *rest: fn(jax.random.wrap_key_data(data), *rest)


KEY_DATA = jax.random.key_data(jax.random.key(42))
V = rand(3, 5)


def sampler(key, x):
    k1, k2, k3 = jax.random.split(key, 3)
    n = jax.random.normal(k1, x.shape)
    u = jax.random.uniform(k2, (4,), minval=x[0, 0], maxval=2.0)
    b = jax.random.bits(jax.random.fold_in(k3, 7), (2, 2))
    drop = jax.random.bernoulli(k3, 0.3, x.shape)
    return x * 2.0 * 3.0 + n, u, b, jnp.where(drop, x, 0.0), jax.random.key_data(jax.random.fold_in(k2, 3))


def legacy(key, x):
    k1, k2 = jax.random.split(key)
    return x + jax.random.normal(k1, x.shape), jax.random.randint(k2, (3,), 0, 10), k2, jax.random.fold_in(k1, 5)


@pytest.mark.slow
@pytest.mark.parametrize("fn,key", [(typed(sampler), KEY_DATA), (legacy, jax.random.PRNGKey(3))],
                         ids=["typed", "legacy"])
def test_random_programs_capture_and_lower_bit_identically(fn, key):
    captured = capture(fn, (key, V))
    assert not captured.kept_whole
    groups = [captured.graph.opaque[k] for k in {n.attrs[0] for n in captured.graph.nodes if n.op == "opaque"}]
    assert groups and all(op.name.startswith("prng[") for op in groups), groups
    for op in groups:   # small programs on ordinary arrays
        jcore.check_jaxpr(op.primitive.closed.jaxpr)
        assert not any(jax.dtypes.issubdtype(v.aval.dtype, jax.dtypes.extended)
                       for v in (*op.primitive.closed.jaxpr.invars, *op.primitive.closed.jaxpr.outvars))
    identical(lower(captured.graph)(key, V), jax.tree_util.tree_leaves(jax.jit(fn)(key, V)))
    # abstract arguments: the same program
    abstract = capture(fn, (jax.ShapeDtypeStruct(key.shape, key.dtype), jax.ShapeDtypeStruct(V.shape, V.dtype)))
    identical(lower(abstract.graph)(key, V), jax.tree_util.tree_leaves(jax.jit(fn)(key, V)))


@pytest.mark.slow
def test_random_values_survive_optimization_bit_identically():
    graph, captured, _ = optimized_graph(typed(sampler), (KEY_DATA, V))
    got = lower(graph)(KEY_DATA, V)
    want = jax.tree_util.tree_leaves(jax.jit(typed(sampler))(KEY_DATA, V))
    close(got[0], want[0])
    identical(got[1:], want[1:])


@pytest.mark.slow
def test_a_key_folded_with_its_own_random_bits_merges_the_cycle_into_the_group():
    def feedback(key, x):
        k1, k2 = jax.random.split(key)
        bits = jax.random.bits(k1, (2,))
        return jnp.tanh(x) * 2.0 + jax.random.normal(jax.random.fold_in(k2, bits[0] % 7), x.shape)
    captured = capture(typed(feedback), (KEY_DATA, V))
    assert not captured.kept_whole
    counts = captured.graph.op_counts()
    assert counts["tanh"] == 1 and counts["opaque"] == 1     # the rest stays visible to the optimizer
    identical(lower(captured.graph)(KEY_DATA, V), [jax.jit(typed(feedback))(KEY_DATA, V)])


@pytest.mark.slow
def test_two_key_groups_feeding_each_other_become_one():
    def crossed(d1, d2, x):
        k1, k2 = jax.random.wrap_key_data(d1), jax.random.wrap_key_data(d2)
        b1, b2 = jax.random.bits(k1, (2,)), jax.random.bits(k2, (2,))
        n1 = jax.random.normal(jax.random.fold_in(k1, b2[0] + 1), x.shape)    # group 1 reads group 2's bits
        n2 = jax.random.normal(jax.random.fold_in(k2, b1[1] * 3), x.shape)    # and group 2 reads group 1's
        return jnp.exp(x) + n1 * n2
    d2 = jax.random.key_data(jax.random.key(5))
    captured = capture(crossed, (KEY_DATA, d2, V))
    assert len(captured.graph.opaque) == 1 and "exp" in captured.graph.op_counts()   # one group, one node
    identical(lower(captured.graph)(KEY_DATA, d2, V), [jax.jit(crossed)(KEY_DATA, d2, V)])


@pytest.mark.slow
def test_a_group_reading_a_value_computed_later_is_emitted_after_it():
    def late(key, x):
        k1, k2 = jax.random.split(key)
        a = jax.random.normal(k1, x.shape) * 2.0         # read before the value below is computed
        step = (x.sum() > 0).astype(jnp.uint32)
        return a + x, jax.random.normal(jax.random.fold_in(k2, step), (2,))
    captured = capture(typed(late), (KEY_DATA, V))
    assert not captured.kept_whole and "reduce_sum" in captured.graph.op_counts()
    identical(lower(captured.graph)(KEY_DATA, V), list(jax.jit(typed(late))(KEY_DATA, V)))


@pytest.mark.slow
def test_key_constants_and_keys_made_inside():
    const = jax.random.key(7)

    def fn(x):
        made = jax.random.key(11)
        return x * 2.0 + jax.random.normal(const, x.shape) + jax.random.uniform(made, x.shape)
    identical(lowered(fn, (V,))(V), jax.jit(fn)(V))


@pytest.mark.slow
def test_a_jitted_function_taking_a_key_is_inlined_not_kept_opaque():
    @jax.jit
    def layer(w, x, key):
        h = jnp.tanh(x @ w)
        return jnp.where(jax.random.bernoulli(key, 0.5, h.shape), h / 0.5, 0.0)
    fn = typed(lambda key, w, x: layer(w, x, key))
    captured = capture(fn, (KEY_DATA, W, X))
    assert {"matmul", "tanh", "select"} <= set(captured.graph.op_counts())
    identical(lower(captured.graph)(KEY_DATA, W, X), [jax.jit(fn)(KEY_DATA, W, X)])


def test_typed_keys_as_arguments_or_results_are_refused():
    with pytest.raises(TypeError, match="PRNG key"):
        capture(lambda k: jax.random.normal(k, (2,)), (jax.random.key(0),))
    with pytest.raises(TypeError, match="PRNG key"):
        capture(lambda k: jax.random.key(0), (KEY_DATA,))


# ---- 3. effects ----

def printed(capfd) -> list[str]:
    jax.effects_barrier()
    return capfd.readouterr().out.splitlines()


def test_debug_prints_run_once_per_call_in_order(capfd):
    def fn(x):
        jax.debug.print("first {}", x.sum(), ordered=True)
        y = (x * 2.0) * 3.0
        jax.debug.print("then {}", y[0, 0], ordered=True)
        return y
    x = jnp.arange(4.0).reshape(2, 2)
    captured = capture(fn, (x,))
    assert captured.graph.hidden_outputs == 1 and len(captured.graph.results) == 1
    program = lower(captured.graph)
    capfd.readouterr()
    identical(program(x), [x * 6.0])
    assert printed(capfd) == ["first 6.0", "then 0.0"]
    program(x + 1.0)
    assert printed(capfd) == ["first 10.0", "then 6.0"]
    identical(lower(captured.graph, effects=False)(x), [x * 6.0])
    assert printed(capfd) == []


def test_effects_inside_a_jitted_function_and_callbacks(capfd):
    @jax.jit
    def inner(x):
        jax.debug.print("inner {}", x[0], ordered=True)
        return x * 4.0

    def fn(x):
        jax.debug.callback(lambda v: print(f"callback {float(v):.1f}"), x[1], ordered=True)
        y = inner(x) * 0.5
        jax.debug.print("outer {}", y[0], ordered=True)
        return y
    x = jnp.asarray([1.0, 2.0, 3.0])
    captured = capture(fn, (x,))
    pinned = [op for op in captured.graph.opaque if op.effectful]
    assert len(pinned) == 3 and captured.graph.op_counts()["mul"] == 2
    capfd.readouterr()
    close(lower(captured.graph)(x), [x * 2.0])
    assert printed(capfd) == ["callback 2.0", "inner 1.0", "outer 2.0"]


def test_unordered_prints_each_run_once(capfd):
    def fn(x):
        jax.debug.print("a {}", x[0])
        jax.debug.print("b {}", x[1] * 2.0)
        return x + 1.0
    x = jnp.asarray([1.0, 2.0])
    program = lowered(fn, (x,))
    capfd.readouterr()
    program(x)
    assert sorted(printed(capfd)) == ["a 1.0", "b 4.0"]   # unordered effects: any order, as under jax.jit


@pytest.mark.slow
def test_a_printed_intermediate_that_rewrites_simplify(capfd):
    def fn(x, w):
        t = (x @ w) * 1.0 + 0.0                   # algebra folds this to x @ w
        jax.debug.print("t {}", t.sum(), ordered=True)
        return jnp.tanh(t) * 2.0, jnp.exp(-t)
    graph, _, fz = optimized_graph(fn, (X, W))
    # no rule puts anything else in an opaque node's class: extraction can only choose it, once
    opaque_classes = [nodes for nodes in fz.classes.values() if any(n.fn == "opaque" for n in nodes)]
    assert len(opaque_classes) == 1 and len(opaque_classes[0]) == 1
    assert graph.hidden_outputs == 1 and len(graph.results) == 2
    assert "add(" not in pretty(graph) and "1.0" not in pretty(graph)      # the rewrites fired
    assert sum(graph.opaque[graph.nodes[i].attrs[0]].effectful for i in graph.live()
               if graph.nodes[i].op == "opaque") == 1
    want = fn(X, W)
    capfd.readouterr()
    close(lower(graph)(X, W), list(want))
    lines = printed(capfd)
    assert len(lines) == 1 and lines[0].startswith("t ")
    np.testing.assert_allclose(float(lines[0][2:]), float(jnp.sum(X @ W)), rtol=1e-5)


@pytest.mark.slow
def test_rematerialization_never_duplicates_an_effect(capfd):
    def loss(params, x):
        h = x
        for k, w in enumerate(params):
            h = jax.nn.gelu(h @ w)
            jax.debug.print("layer {k} {v}", k=k, v=w[0, 0], ordered=True)
        return jnp.mean(h * h)
    params = [rand(64, 64) * 0.1 for _ in range(2)]
    args = (params, rand(512, 64))
    fn = jax.grad(loss)
    captured = capture(fn, args)
    enc = encode(captured.graph)
    saturate(enc.egraph, Schedule.of("algebra", "casts", "quant", "layout", "fusion"), Limits())
    fz, target = freeze(enc.egraph), load_target("gpu-h100")
    free = extract(fz, enc, target).graph
    budget = peak_memory(reorder_for_memory(free)[0]).bytes - 1
    fitted = extract(fz, enc, target, memory_budget=budget)
    assert "within the budget" in fitted.memory and "recomputed 1" in fitted.memory, fitted.memory
    graph = fitted.graph
    assert graph.hidden_outputs == 1
    effects = [i for i in graph.live()
               if graph.nodes[i].op == "opaque" and graph.opaque[graph.nodes[i].attrs[0]].effectful]
    assert len(effects) == len({graph.nodes[i].attrs[0] for i in effects}) == 2
    flat = jax.tree_util.tree_leaves(args)
    capfd.readouterr()
    got = lower(graph)(*flat)
    lines = printed(capfd)
    assert lines == [f"layer {k} {np.asarray(w[0, 0])}" for k, w in enumerate(params)]
    close(got, jax.tree_util.tree_leaves(fn(*args)), rtol=2e-5, atol=1e-8)


@pytest.mark.slow
def test_a_print_of_a_key_takes_its_data_and_wraps_it_again(capfd):
    def fn(key, x):
        k1, k2 = jax.random.split(key)
        jax.debug.print("k1 {}", k1, ordered=True)
        return x + jax.random.normal(k2, x.shape)
    captured = capture(typed(fn), (KEY_DATA, V))
    capfd.readouterr()
    jax.jit(typed(fn))(KEY_DATA, V)
    want = printed(capfd)
    identical(lower(captured.graph)(KEY_DATA, V), [jax.jit(typed(fn))(KEY_DATA, V)])
    assert printed(capfd) == want * 2 and len(want) == 1


def test_effects_with_results_keep_the_program_whole():
    calls = []

    def host(v):
        calls.append(np.asarray(v).copy())
        return np.asarray(v) * 2.0

    def with_io(x):
        return jax.experimental.io_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x * 1.0) * 3.0

    def with_branch(x):
        return lax.cond(x[0] > 0, lambda v: (jax.debug.print("pos {}", v[0]), v * 2.0)[1], lambda v: v, x)
    x = jnp.asarray([1.0, 2.0])
    for fn, primitive in ((with_io, "io_callback"), (with_branch, "cond")):
        with pytest.raises(EffectfulResults) as info:
            capture(fn, (x,), keep_whole=False)
        assert info.value.primitive == primitive and isinstance(info.value, KeepWhole)
        captured = capture(fn, (x,))
        assert captured.kept_whole == f"its results depend on an effect ({primitive} has effects and results)"
        assert captured.graph.op_counts() == {"arg": 1, "opaque": 1}
    calls.clear()
    close(lower(capture(with_io, (x,)).graph)(x), [x * 6.0])
    assert len(calls) == 1


def count_effects(jaxpr) -> int:
    """Equations with debug effects at every depth."""
    n = 0
    for eqn in jaxpr.eqns:
        n += bool(eqn.effects) and not eqn.outvars
        for sub in jcore.jaxprs_in_params(eqn.params):
            n += count_effects(sub)
    return n


@pytest.mark.slow
def test_without_debug_effects_strips_every_depth(capfd):
    @jax.custom_jvp
    def smooth(v):
        jax.debug.print("custom_jvp {}", v[0])
        return jnp.tanh(v)
    smooth.defjvp(lambda p, t: (smooth(p[0]), t[0] * (1 - jnp.tanh(p[0]) ** 2)))

    @jax.custom_vjp
    def clip(v):
        jax.debug.print("custom_vjp {}", v[0])
        return jnp.clip(v, -1.0, 1.0)
    clip.defvjp(lambda v: (clip(v), v), lambda v, g: (g,))

    @jax.jit
    def inner(v):
        jax.debug.print("jit {}", v[0])
        return v * 2.0

    def fn(x):
        jax.debug.print("top {}", x[0])
        y = lax.cond(x[0] > 0, lambda v: (jax.debug.print("cond {}", v[0]), v + 1.0)[1], lambda v: v, x)

        def body(carry):
            jax.debug.callback(lambda v: print("while", v), carry[0])
            return carry * 0.5
        z = lax.while_loop(lambda c: (jax.debug.print("test {}", c[0]), c[0] > 0.1)[1], body, y)

        def step(c, v):
            jax.debug.print("scan {}", v)
            return c + v, c * v
        c, s = lax.scan(step, 0.0, z)
        return inner(smooth(clip(s))) + c
    x = jnp.asarray([1.5, 0.5, -0.5])
    closed = jax.make_jaxpr(fn)(x)
    assert count_effects(closed.jaxpr) >= 8
    silent = without_debug_effects(closed)
    assert count_effects(silent.jaxpr) == 0 and not silent.jaxpr.effects
    for eqn in silent.jaxpr.eqns:
        assert not eqn.effects, eqn.primitive
    jcore.check_jaxpr(silent.jaxpr)
    capfd.readouterr()
    got = jax.jit(lambda v: jax.core.eval_jaxpr(silent.jaxpr, silent.consts, v))(x)
    assert printed(capfd) == []
    close(got, [fn(x)])
    assert printed(capfd)                    # the original prints; the copy did not
    pure = jax.make_jaxpr(lambda v: v * 2.0)(x)
    assert without_debug_effects(pure) is pure
