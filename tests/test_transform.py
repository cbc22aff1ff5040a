"""superopt as a JAX transformation: inside jit, grad, vmap and export; jax.jit's signature; one trace."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from superopt import superopt

RNG = np.random.default_rng(0)
PARAMS = {"w1": jnp.asarray(RNG.standard_normal((16, 32)) / 4, jnp.float32),
          "b1": jnp.asarray(RNG.standard_normal(32) / 4, jnp.float32),
          "w2": jnp.asarray(RNG.standard_normal((32, 8)) / 4, jnp.float32)}
X = jnp.asarray(RNG.standard_normal((8, 16)), jnp.float32)
# Where a test needs a program superopt changed, it names a GPU target: on cpu these small programs run as
# XLA fuses them by themselves (extract/xla.py), so the original runs; a GPU target's model prices the fusion,
# and the changed program is bound into the caller's trace and run here like any other.
CHANGED = "gpu-h100"


def layer_norm(h):
    mu = h.mean(-1, keepdims=True)
    var = ((h - mu) ** 2).mean(-1, keepdims=True)
    return (h - mu) / jnp.sqrt(var + 1e-5)


def loss(params, x):
    h = jnp.tanh(layer_norm(x @ params["w1"] + params["b1"]))
    return jnp.mean((h @ params["w2"]) ** 2)


def close(a, b, rtol=1e-5, atol=1e-6):
    jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=rtol,
                                                                   atol=atol), a, b)


@pytest.mark.slow
def test_first_call_inside_jit_optimizes_and_matches():
    fast = superopt(loss, target=CHANGED)
    close(jax.jit(fast)(PARAMS, X), loss(PARAMS, X))
    assert fast.report.optimized, fast.report.outcome
    close(fast(PARAMS, X), loss(PARAMS, X))          # the same specialization, now eagerly
    assert len(fast._cache) == 1


@pytest.mark.slow
def test_grad_and_jit_of_grad_match_the_original():
    fast = superopt(loss, target=CHANGED)
    expected = jax.grad(loss)(PARAMS, X)
    close(jax.grad(fast)(PARAMS, X), expected)
    assert fast.report.optimized, fast.report.outcome
    close(jax.jit(jax.grad(fast))(PARAMS, X), expected)
    close(jax.grad(fast, argnums=1)(PARAMS, X), jax.grad(loss, argnums=1)(PARAMS, X))


@pytest.mark.slow
def test_jvp_vjp_and_jacrev_match_the_original():
    def f(x, w):
        return jnp.tanh(layer_norm(x @ w)).sum(axis=0)
    fast = superopt(f)
    w = PARAMS["w1"]
    tangents = (jnp.ones_like(X), jnp.ones_like(w) * 0.5)
    close(jax.jvp(fast, (X, w), tangents), jax.jvp(f, (X, w), tangents))
    out, pull = jax.vjp(fast, X, w)
    out0, pull0 = jax.vjp(f, X, w)
    close(out, out0)
    close(pull(jnp.ones_like(out)), pull0(jnp.ones_like(out0)))
    close(jax.jacrev(fast, argnums=1)(X, w), jax.jacrev(f, argnums=1)(X, w))


@pytest.mark.slow
def test_vmap_and_scan():
    def f(x, w):
        return (x * 2.0) * 3.0 @ w
    fast = superopt(f)
    xs = jnp.stack([X, X + 1.0, X * 2.0])
    close(jax.vmap(fast, in_axes=(0, None))(xs, PARAMS["w1"]), jax.vmap(f, in_axes=(0, None))(xs, PARAMS["w1"]))

    def step(carry, x):
        return carry + fast(x, PARAMS["w1"]).sum(), None
    total, _ = jax.lax.scan(step, 0.0, xs)
    close(total, sum(f(x, PARAMS["w1"]).sum() for x in xs), rtol=1e-4)


@pytest.mark.slow
def test_keyword_and_static_arguments():
    def f(x, scale=1.0, *, n, mode="sum"):
        y = jnp.tile(x, (n, 1)) * scale
        return y.sum() if mode == "sum" else y.max()
    fast = superopt(f, static_argnames=("n", "mode"))
    close(fast(X, n=3), f(X, n=3))
    close(fast(X, 2.0, n=2, mode="max"), f(X, 2.0, n=2, mode="max"))
    close(fast(X, scale=0.5, n=2), f(X, scale=0.5, n=2))
    close(jax.jit(lambda x: fast(x, n=4))(X), f(X, n=4))
    assert len(fast._cache) == 4     # n and mode are part of the key; scale is traced (a weak float)


@pytest.mark.slow
def test_static_argnums_by_position_and_by_name():
    def f(x, n):
        return jnp.tile(x, (n, 1)).sum(0)
    fast = superopt(f, static_argnums=1)
    close(fast(X, 2), f(X, 2))
    close(fast(X, n=3), f(X, 3))      # static whether passed by position or by name, as in jax.jit


@pytest.mark.slow
def test_pytrees_with_none_weak_types_and_donation():
    def f(tree, s):
        return tree["a"] * s + tree["b"][0], tree["c"]
    fast = superopt(f, donate_argnums=())
    tree = {"a": X, "b": (X, None), "c": None}
    out = fast(tree, 2.0)
    close(out[0], f(tree, 2.0)[0])
    assert out[1] is None
    key = next(iter(fast._cache))
    assert any(leaf[2] for leaf in key[1] if leaf[0] != "static")   # the Python float stayed weakly typed
    donated = superopt(lambda a, b: a * 2.0 + b, donate_argnums=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # the CPU backend may decline a donation, with a warning
        close(donated(jnp.ones(4), jnp.ones(4)), jnp.full(4, 3.0))


@pytest.mark.slow
@pytest.mark.parametrize("make_key", [lambda: jax.random.key(3), lambda: jax.random.PRNGKey(3)],
                         ids=["typed", "legacy"])
def test_prng_keys(make_key):
    def f(key, x):
        k1, k2 = jax.random.split(key)
        noise = jax.random.normal(k1, x.shape)
        return x * 2.0 * 3.0 + noise, noise, jax.random.uniform(k2, (3,)), k2
    fast = superopt(f, target=CHANGED)
    for got in (fast(make_key(), X), jax.jit(fast)(make_key(), X)):
        want = f(make_key(), X)
        close(got[0], want[0])                           # x * 2 * 3 may become x * 6: a rounding rewrite
        close(got[1:3], want[1:3], rtol=0, atol=0)       # the random bits themselves are untouched
        assert got[3].dtype == want[3].dtype
        np.testing.assert_array_equal(jax.random.key_data(got[3]), jax.random.key_data(want[3]))
    assert fast.report.optimized, fast.report.outcome
    assert "prng[" in fast.term


@pytest.mark.slow
def test_the_function_is_traced_once_per_specialization():
    traces = []

    def f(x, w):
        traces.append(1)
        return jnp.tanh(layer_norm(x @ w))
    fast = superopt(f)
    close(jax.jit(fast)(X, PARAMS["w1"]), f(X, PARAMS["w1"]))
    traces.clear()
    fast = superopt(f)
    fast(X, PARAMS["w1"])
    fast(X, PARAMS["w1"])
    jax.jit(fast)(X, PARAMS["w1"])
    assert len(traces) == 1, f"fn was traced {len(traces)} times"


def test_debug_print_prints_the_users_values_once_per_call(capfd):
    def f(x):
        jax.debug.print("first {}", x.sum())
        y = (x * 2.0) * 3.0
        jax.debug.print("then {}", y[0, 0])
        return y
    fast = superopt(f)
    x = jnp.arange(4.0).reshape(2, 2)
    capfd.readouterr()
    fast(x)
    jax.effects_barrier()
    assert capfd.readouterr().out.splitlines() == ["first 6.0", "then 0.0"]
    jax.jit(fast)(x + 1.0)
    jax.effects_barrier()
    assert capfd.readouterr().out.splitlines() == ["first 10.0", "then 6.0"]


@pytest.mark.slow
def test_export_round_trip_and_aot():
    fast = superopt(loss)
    exported = jax.export.export(jax.jit(fast))(PARAMS, X)
    restored = jax.export.deserialize(exported.serialize())
    close(restored.call(PARAMS, X), loss(PARAMS, X))
    compiled = jax.jit(fast).lower(PARAMS, X).compile()
    close(compiled(PARAMS, X), loss(PARAMS, X))
    close(fast.lower(PARAMS, X).compile()(PARAMS, X), loss(PARAMS, X))


@pytest.mark.slow
def test_superopt_of_grad_is_one_program():
    fast = superopt(jax.grad(loss))
    close(fast(PARAMS, X), jax.grad(loss)(PARAMS, X))
    assert sum(fast.report.ops_before.values()) > 20     # forward and backward captured together


@pytest.mark.slow
def test_non_array_leaves_static_with_filter():
    class Module:   # a module whose activation function is a field, as equinox modules have
        def __init__(self, w, act):
            self.w, self.act = w, act

    jax.tree_util.register_pytree_node(Module, lambda m: ((m.w, m.act), None), lambda _, c: Module(*c))

    def apply(m, x):
        return m.act(x @ m.w)
    m = Module(PARAMS["w1"], jnp.tanh)
    with pytest.raises(TypeError, match="static"):
        superopt(apply)(m, X)
    fast = superopt(apply, filter=True)
    close(fast(m, X), apply(m, X))
    close(fast(Module(PARAMS["w1"], jax.nn.relu), X), apply(Module(PARAMS["w1"], jax.nn.relu), X))
    assert len(fast._cache) == 2


@pytest.mark.slow
def test_npu_target_under_a_trace_runs_jax_or_the_emulator_by_callback():
    def f(a, b):
        return jnp.tanh(a @ b) * 2.0
    a, b = jnp.ones((32, 32)) / 8, jnp.ones((32, 32)) / 8
    for mode, says in (("jax", "runs the extracted program as JAX"), ("callback", "jax.pure_callback")):
        fast = superopt(f, target="npu-910b", npu_under_trace=mode)
        close(fast(a, b), f(a, b), rtol=1e-3)           # eagerly: the emulator
        assert fast.npu is not None, fast.report.backend
        close(jax.jit(fast)(a, b), f(a, b), rtol=1e-3)
        assert any(says in n for n in fast.report.backend.notes), fast.report.backend


def test_effects_nested_in_jit_run_once_in_order_and_verification_is_silent(capfd):
    @jax.jit
    def inner(x):
        jax.debug.print("inner {}", x[0])
        return x * 4.0

    def f(x):
        jax.debug.callback(lambda v: print(f"callback {float(v):.1f}"), x[1])
        y = inner(x) * 0.5
        jax.debug.print("outer {}", y[0])
        return y, jnp.sum(jnp.diagonal(jnp.outer(x, x) @ jnp.outer(x, x)))   # a rewrite XLA does not make
    fast = superopt(f, target=CHANGED)
    x = jnp.asarray([1.0, 2.0, 3.0])
    capfd.readouterr()
    close(fast(x)[0], x * 2.0)
    jax.effects_barrier()
    assert capfd.readouterr().out.splitlines() == ["callback 2.0", "inner 1.0", "outer 2.0"]
    assert fast.report.optimized and fast.compile(x).term.hidden_outputs == 1


@pytest.mark.slow
def test_results_of_an_io_callback_keep_the_program_whole():
    seen = []

    def host(v):
        seen.append(np.asarray(v).copy())
        return np.asarray(v) * 2.0

    def f(x):
        y = jax.experimental.io_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x * 1.0)
        return y * 2.0 * 3.0
    fast = superopt(f)
    x = jnp.asarray([1.0, 2.0])
    close(fast(x), x * 12.0)
    assert fast.report.outcome.startswith("kept original: its results depend on an effect (io_callback")
    assert len(seen) == 1 and seen[0].tolist() == [1.0, 2.0]   # the user's value, once: never superopt's inputs


def test_a_print_inside_a_branch_keeps_the_program_whole(capfd):
    def f(x):
        y = jax.lax.cond(x[0] > 0, lambda v: (jax.debug.print("pos {}", v[0]), v * 2.0)[1], lambda v: v, x)
        return y * 2.0 * 3.0
    fast = superopt(f)
    capfd.readouterr()
    close(fast(jnp.ones(2)), jnp.full(2, 12.0))
    jax.effects_barrier()
    assert capfd.readouterr().out.splitlines() == ["pos 1.0"]
    assert fast.report.outcome.startswith("kept original: its results depend on an effect (cond")


@pytest.mark.slow
def test_key_flows_the_optimizer_cannot_split_and_key_constants():
    key_const = jax.random.key(7)

    def feedback(key, x):   # a key folded with a value computed from its own random bits
        k1, k2 = jax.random.split(key)
        bits = jax.random.bits(k1, (2,))
        return x + jax.random.normal(jax.random.fold_in(k2, bits[0] % 7), x.shape)

    def constant(x):        # a key closed over: a constant of the program
        return x * 2.0 * 3.0 + jax.random.normal(key_const, x.shape)
    fast = superopt(feedback)
    close(fast(jax.random.key(1), X), jax.jit(feedback)(jax.random.key(1), X), rtol=0, atol=0)
    assert "prng[" in fast.term          # the key flow, fold_in of its own bits included, is one opaque group
    fast = superopt(constant, target=CHANGED)
    close(fast(X), constant(X))
    assert fast.report.optimized, fast.report.outcome


def test_npu_target_with_a_print_runs_jax_and_says_so(capfd):
    def f(a, b):
        jax.debug.print("sum {}", a.sum())
        return jnp.tanh(a @ b)
    a = jnp.ones((16, 16)) / 16
    fast = superopt(f, target="npu-910b")
    capfd.readouterr()
    close(fast(a, a), f(a, a), rtol=1e-3)
    jax.effects_barrier()
    assert capfd.readouterr().out.count("sum 16.0") == 2     # the call and the reference call above
    assert fast.report.backend.fell_back.startswith("the program has effects"), fast.report.backend
