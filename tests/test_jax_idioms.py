"""JAX idioms that work with `jax.jit(f)` and so must work with `superopt(f)` (issue 53): each test runs the
same input through jax.jit and through superopt and compares what the two do."""
import dataclasses

import cloudpickle
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.debugger import core as debugger_core

from superopt import superopt

X = jnp.arange(1.0, 5.0, dtype=jnp.float32)


def same(a, b):
    jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-6), a, b)
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)


# ---- filter=True: Python bool, int, float and str leaves are static, as equinox.filter_jit keeps them ----

@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Dropoutish:
    """A module as equinox writes one: an array field and Python fields it branches on."""
    w: jax.Array
    inference: bool = dataclasses.field(default=False)
    p: float = 0.5
    n: int = 2
    act: str = "tanh"


def apply(m, x):
    h = x * m.w
    if not m.inference:           # a Python branch on a bool leaf: a tracer here raises
        h = h * (1.0 / (1.0 - m.p)) if m.p > 0 else h
    h = jnp.tile(h, m.n)          # an int leaf as a shape
    return getattr(jnp, m.act)(h)


@pytest.mark.slow
@pytest.mark.parametrize("inference,p,n,act", [(False, 0.5, 2, "tanh"), (True, 0.5, 3, "sin"), (False, 0.0, 1, "tanh")])
def test_filter_keeps_python_scalar_leaves_static(inference, p, n, act):
    m = Dropoutish(X * 0.5, inference, p, n, act)
    fast = superopt(apply, filter=True)
    expected = jax.jit(lambda w, x: apply(Dropoutish(w, inference, p, n, act), x))(m.w, X)
    same(fast(m, X), expected)
    same(fast({"m": m}["m"], X), expected)        # the same types: one specialization
    assert len(fast._cache) == 1


@pytest.mark.slow
def test_filter_specializes_per_python_scalar_value():
    fast = superopt(apply, filter=True)
    a, b = Dropoutish(X, False, 0.5), Dropoutish(X, True, 0.25)
    same(fast(a, X), apply(a, X))
    same(fast(b, X), apply(b, X))
    assert len(fast._cache) == 2
    same(fast.compile(b, X).run(b.w, X)[0], apply(b, X))   # .compile keeps them static too


@pytest.mark.slow
def test_without_filter_python_scalars_are_traced_as_jax_jit_traces_them():
    fast, ref = superopt(lambda p, x: x * p["s"]), jax.jit(lambda p, x: x * p["s"])
    same(fast({"s": 2.0}, X), ref({"s": 2.0}, X))
    same(fast({"s": 3.0}, X), ref({"s": 3.0}, X))
    assert len(fast._cache) == 1


# ---- debugging switches ----

def test_disable_jit_runs_fn_eagerly_as_jax_jit_does():
    seen = []

    def f(x):
        seen.append(isinstance(x, jax.core.Tracer))
        return jnp.sin(x) * 2.0 * 3.0

    with jax.disable_jit():
        expected = jax.jit(f)(X)
        got = superopt(f)(X)
    same(got, expected)
    assert seen == [False, False]


@pytest.mark.slow
def test_debug_nans_raises_floating_point_error_as_jax_jit_does():
    def f(x):
        return jnp.log(x - 10.0) * 2.0

    with jax.debug_nans(True):
        with pytest.raises(FloatingPointError):
            jax.jit(f)(X)
        with pytest.raises(FloatingPointError):
            superopt(f)(X)


@pytest.fixture
def recording_debugger():
    """A debugger backend that records the innermost frame's locals instead of reading stdin."""
    seen = []
    debugger_core._debugger_registry["superopt-test"] = (-100, lambda frames, thread_id, **kw: seen.append(
        {k: np.asarray(v) for k, v in frames[0].locals.items() if isinstance(v, (jax.Array, np.ndarray))}))
    yield seen
    del debugger_core._debugger_registry["superopt-test"]


def breaks(x):
    y = jnp.sin(x) * 2.0
    jax.debug.breakpoint(backend="superopt-test")
    return y * 3.0


@pytest.mark.slow
@pytest.mark.parametrize("outer", ["eager", "jit"])
def test_debug_breakpoint_is_kept_as_an_effect(recording_debugger, outer):
    wrap = (lambda f: f) if outer == "eager" else jax.jit
    expected = wrap(jax.jit(breaks))(X)
    got = wrap(superopt(breaks))(X)
    same(got, expected)
    assert len(recording_debugger) == 2      # once per call, not during superopt's own runs
    jit_frame, superopt_frame = recording_debugger
    assert set(jit_frame) == set(superopt_frame) == {"x", "y"}
    for name in jit_frame:
        same(superopt_frame[name], jit_frame[name])


# ---- outputs and signatures ----

@pytest.mark.slow
def test_python_scalars_among_the_outputs():
    f = lambda x: (x * 2.0, 3, 0.5, True)
    expected, got = jax.jit(f)(X), superopt(f)(X)
    same(got, expected)
    assert [(o.dtype, o.weak_type) for o in got] == [(o.dtype, o.weak_type) for o in expected]
    same(jax.jit(superopt(f))(X), expected)


@pytest.mark.slow
def test_zero_argument_function():
    f = lambda: jnp.ones(3).sum() * 2.0
    same(superopt(f)(), jax.jit(f)())


@pytest.mark.slow
def test_donate_argnames_donates_as_jax_jit_does():
    f = lambda x, y: x * 2.0 + y
    a, b = jnp.ones(4) + 1, jnp.ones(4) + 1
    expected = jax.jit(f, donate_argnames="x")(a, X)
    got = superopt(f, donate_argnames="x")(b, X)
    same(got, expected)
    assert b.is_deleted() == a.is_deleted()
    c, d = jnp.ones(4) + 1, jnp.ones(4) + 1
    jax.jit(f, donate_argnames=("y",))(X, c)
    superopt(f, donate_argnames=("y",))(X, d)
    assert d.is_deleted() == c.is_deleted()


# ---- shipping the function ----

@pytest.mark.slow
def test_cloudpickle_after_a_call():
    f = lambda x: jnp.tanh(x) * 2.0 * 3.0
    fast = superopt(f, static_argnums=())
    first = fast(X)
    cloudpickle.loads(cloudpickle.dumps(jax.jit(f)))     # what jax.jit allows
    again = cloudpickle.loads(cloudpickle.dumps(fast))
    same(again(X), first)
    same(again(X + 1), jax.jit(f)(X + 1))


# ---- complex values: abs, real, imag and angle are real-valued ----

Z = (X + 1j * (X[::-1] - 2.5)).astype(jnp.complex64)


@pytest.mark.slow
@pytest.mark.parametrize("name,f", [
    ("abs", lambda z: jnp.abs(z) * 2.0 + jnp.abs(z)),
    ("real", lambda z: jnp.real(z) * 2.0 + jnp.imag(z) * jnp.imag(z)),
    ("angle", lambda z: jnp.angle(z) * 2.0 - jnp.angle(z)),
    ("abs-of-product", lambda z: jnp.abs(z * z) + jnp.abs(z) * jnp.abs(z)),
])
def test_complex_to_real_ops_are_typed_real(name, f):
    fast = superopt(f)
    expected = jax.jit(f)(Z)
    got = fast(Z)
    assert got.dtype == expected.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5)
    assert "failed" not in fast.report.outcome, fast.report.outcome
    assert not fast.report.run.error, fast.report.run.error


# ---- host callbacks see only the user's values (item 4) ----

CHANGED = "gpu-h100"   # a target whose cost model changes these small programs (diagonal of a product)


def diag_program(host, out_shape=(8,)):
    def fn(a, b):
        y = jax.pure_callback(host, jax.ShapeDtypeStruct(out_shape, jnp.float32), jnp.diagonal(a @ b))
        return jnp.sum(y * 3.0 * 2.0) + jnp.sum(jnp.diagonal(a @ b))
    return fn


AB = (jnp.eye(8, dtype=jnp.float32), jnp.asarray(np.random.default_rng(0).standard_normal((8, 8)), jnp.float32))


def test_verification_never_calls_the_users_host_code():
    seen = []

    def host(x):
        seen.append(np.asarray(x).copy())
        return np.asarray(x) * 2

    fast = superopt(diag_program(host), target=CHANGED)
    same(fast(*AB), jax.jit(diag_program(host))(*AB))
    assert fast.report.optimized, fast.report.outcome
    assert len(seen) == 2                                   # one call each: superopt's and jax.jit's
    assert all(np.array_equal(s, np.diagonal(np.asarray(AB[1]))) for s in seen)


def test_a_runtime_check_in_a_callback_does_not_fire_on_superopts_inputs(capfd):
    """A library's runtime check (equinox's error_if calls back to the host and raises there) on a finite
    argument: superopt's infinities never reach it, so nothing is printed and the program is optimized."""
    def check_finite(x):
        if not np.all(np.isfinite(x)):
            raise ValueError("non-finite value")
        return np.asarray(x)

    fast = superopt(diag_program(check_finite), target=CHANGED)
    same(fast(*AB), jax.jit(diag_program(check_finite))(*AB))
    assert fast.report.optimized, fast.report.outcome
    assert "non-finite" not in capfd.readouterr().err


def test_a_callback_of_another_shape_is_still_verified_around():
    """A callback whose result has no operand's shape returns the stand-in's fixed ramp in verification; the
    user's call gets the host's value."""
    host = lambda x: np.full((3,), np.sum(x), np.float32)    # noqa: E731
    fast = superopt(diag_program(host, (3,)), target=CHANGED)
    same(fast(*AB), jax.jit(diag_program(host, (3,)))(*AB))
    assert fast.report.optimized, fast.report.outcome


# ---- shard_map bodies (item 6) ----

@pytest.mark.parametrize("target", ["cpu", CHANGED])
@pytest.mark.parametrize("body", [
    lambda x, w: (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5) @ w,
    lambda x, w: jnp.tanh(x) * 2.0 * 3.0 @ w,
    lambda x, w: jnp.sum(jnp.diagonal(x @ w.T)).reshape(1, 1) / 8.0 + jnp.zeros((1, 8)),
], ids=["layernorm", "constants", "diagonal"])
def test_a_shard_map_body_with_constants_runs_as_under_jax_jit(target, body):
    """A superopt'd function as a `jax.shard_map` body, with the default varying-axes check: an argument
    replicated over the mesh meets one that varies, and constants meet both."""
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((1,), ("d",))
    x = jax.device_put(jnp.arange(64.0, dtype=jnp.float32).reshape(8, 8) / 64, NamedSharding(mesh, P("d")))
    w = jax.device_put(jnp.ones((8, 8), jnp.float32), NamedSharding(mesh, P()))
    mapped = lambda f: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("d"), P()), out_specs=P("d")))  # noqa: E731
    np.testing.assert_allclose(np.asarray(mapped(superopt(body, target=target))(x, w)),
                               np.asarray(mapped(body)(x, w)), rtol=1e-5, atol=1e-6)


# ---- named scopes (item 8) ----

def scoped(a, b):
    with jax.named_scope("block"):
        with jax.named_scope("proj"):
            c = a @ b
        return jnp.sum(jnp.diagonal(c) * 2.0 * 3.0)


def scope_names(fn, *args) -> set:
    """The named scopes in the locations of the program jax.jit lowers `fn` to."""
    import re
    text = jax.jit(fn).lower(*args).as_text(debug_info=True)
    return {name.rsplit("/", 1)[0] for name in re.findall(r'loc\("([^"(]*/[^"(]*)"', text)}


@pytest.mark.parametrize("cache", [False, True])
def test_named_scopes_stay_on_the_ops_they_covered(cache, tmp_path):
    """The changed program's ops keep the scopes of the ops they replace (the product in block/proj, the
    rewritten diagonal sum in block), from a fresh search and from the persistent cache."""
    fast = superopt(scoped, target=CHANGED, cache=tmp_path if cache else False)
    fast(*AB)
    if cache:   # a second object: the program comes from the cache
        fast = superopt(scoped, target=CHANGED, cache=tmp_path)
        fast(*AB)
        assert fast.report.cache.status == "hit", fast.report.cache
    assert fast.report.optimized, fast.report.outcome
    names = scope_names(fast, *AB)
    assert {"block/proj", "block"} <= names, names
