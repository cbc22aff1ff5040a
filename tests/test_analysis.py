"""The e-graph's range and sign analysis (egraph/analysis.py) on the programs that are its sources, softmax
and normalizations among them: each fact it derives holds on every element that XLA computes, for inputs
full of NaN, +-inf, -0, subnormals and values near overflow, and the facts these programs should have are
derived, while look-alikes that break them (a maximum along the wrong axis, a logaddexp of two unknowns)
get none."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from superopt.egraph.analysis import analysis
from superopt.egraph.capture import capture
from superopt.egraph.encode import encode
from superopt.egraph.frozen import FACTS, freeze
from superopt.rewrites.functions import PREDICATES

HOLDS = {name: PREDICATES[name].py for name in ("nonneg", "integral", "finite", "positive", "at_most_one")}
HOLDS["nonpos"] = lambda t: not np.any(np.asarray(t, dtype=np.float64) > 0)
HOLDS["at_least_one"] = lambda t: not np.any(np.asarray(t, dtype=np.float64) < 1)
assert set(HOLDS) == set(FACTS)

SPECIAL = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -1e-45, 1.1754944e-38, 3.4e38, -3.4e38, 1.0, -1.0,
                    0.5, 88.7, -88.7, 103.0, -104.0, 1e-20, 65504.0, -65504.0, 1e4, -1e4], dtype=np.float64)


def _softmax_parts(a):
    d = a - jnp.max(a, axis=-1, keepdims=True)
    e = jnp.exp(d)
    s = jnp.sum(e, axis=-1, keepdims=True)
    return d, e, s, e / s


def _layer_norm_parts(a):
    eps = 1e-5 if a.dtype == jnp.float32 else 1e-3   # float16's smallest normal number is 2**-14
    m = jnp.mean(a, axis=-1, keepdims=True)
    v = jnp.mean(jnp.square(a - m), axis=-1, keepdims=True)
    return v, v + eps, jnp.sqrt(v + eps), jax.lax.rsqrt(v + eps), (a - m) / jnp.sqrt(v + eps)


def _cross_entropy(a):
    labels = jnp.argmax(a, axis=-1)
    onehot = jax.nn.one_hot(labels, a.shape[-1], dtype=a.dtype)
    return onehot, -jnp.sum(onehot * jax.nn.log_softmax(a, axis=-1), axis=-1)


# name -> (program returning its values to check, input shape, the facts each value must have)
SOURCES = {
    "softmax by hand": (_softmax_parts, (4, 6), [{"nonpos"}, {"nonneg", "at_most_one"}, {"at_least_one"},
                                                  {"nonneg", "at_most_one"}]),
    "jax.nn.softmax": (lambda a: (jax.nn.softmax(a, axis=-1), jax.nn.softmax(a, axis=0)), (4, 6),
                       [{"nonneg", "at_most_one"}] * 2),
    "softmax over two axes": (lambda a: jax.nn.softmax(a, axis=(0, 2)), (3, 2, 4), [{"nonneg", "at_most_one"}]),
    "log_softmax": (lambda a: (jax.nn.log_softmax(a), jnp.exp(jax.nn.log_softmax(a))), (4, 6),
                    [{"nonpos"}, {"nonneg", "at_most_one"}]),
    "logsumexp": (lambda a: jax.nn.logsumexp(a, axis=-1) - jnp.max(a, axis=-1), (4, 6), [set()]),
    "layer norm": (_layer_norm_parts, (4, 6), [{"nonneg"}, {"positive"}, {"positive"}, {"nonneg"}, set()]),
    "jnp.var and std": (lambda a: (jnp.var(a, axis=-1), jnp.std(a, axis=0)), (4, 6), [{"nonneg"}] * 2),
    "standardize": (lambda a: jax.nn.standardize(a, axis=-1), (4, 6), [set()]),
    "softplus": (lambda a: (jax.nn.softplus(a), jnp.logaddexp(a, 2.0)), (4, 6), [{"nonneg"}, set()]),
    "sigmoid and tanh": (lambda a: (jax.nn.sigmoid(a), jnp.tanh(a)), (4, 6), [{"nonneg", "at_most_one"},
                                                                                {"at_most_one"}]),
    "cross entropy": (_cross_entropy, (4, 6), [{"nonneg", "integral"}, {"nonneg"}]),
    "exp of a square": (lambda a: jnp.exp(a * a), (4, 6), [{"at_least_one", "positive", "nonneg"}]),
}

# programs that look like the sources but break their facts -> the facts that must not be derived of them
LOOK_ALIKES = {
    "maximum broadcast along the other axis": (lambda a: a - jnp.max(a, axis=1)[None, :], {"nonpos", "at_most_one"}),
    "its exponential": (lambda a: jnp.exp(a - jnp.max(a, axis=1)[None, :]), {"at_most_one"}),
    "sum along the other axis": (lambda a: jnp.sum(jnp.exp(a - jnp.max(a, axis=1, keepdims=True)), axis=0),
                                 {"at_least_one", "positive"}),
    "quotient by another sum": (lambda a: jnp.exp(a) / jnp.sum(jnp.exp(a.T), axis=1, keepdims=True),
                                {"at_most_one"}),
    "logaddexp of two unknowns": (lambda a: jnp.logaddexp(a, a.T), {"nonneg"}),
}


def _facts(fn, args) -> list[set]:
    """The analysis's facts of each value `fn` returns."""
    enc = encode(capture(fn, args).graph)
    enc.egraph.run(analysis().saturate())
    frozen = freeze(enc.egraph, facts=True)
    return [frozen.facts.get(frozen.outputs[k], set()) for k in range(len(frozen.outputs))]


def _inputs(shape, dtype, count=60, seed=0):
    """Arrays whose every element is a special value or a normal number of some scale, each row of some
    arrays alike (all -inf, all NaN, all one overflowing value)."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        normal = rng.standard_normal(shape) * rng.choice([1.0, 30.0, 1e4])
        special = rng.choice(SPECIAL, shape)
        values = np.where(rng.random(shape) < rng.choice([0.0, 0.2, 0.6]), special, normal)
        if i % 6 == 5:
            values[0] = SPECIAL[i % len(SPECIAL)]
        with np.errstate(over="ignore"):   # to float16: 3.4e38 is inf
            yield np.asarray(values, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_each_fact_the_analysis_derives_holds_on_every_value_xla_computes(name, dtype):
    fn, shape, expected = SOURCES[name]
    facts = _facts(fn, (np.zeros(shape, dtype),))
    assert len(facts) == len(expected)
    for k, (got, want) in enumerate(zip(facts, expected)):
        assert want <= got, f"{name}, value {k}: derives {sorted(got)}, should derive {sorted(want)}"
    run = jax.jit(lambda a: jax.tree_util.tree_leaves(fn(a)))
    for values in _inputs(shape, dtype):
        for k, out in enumerate(run(values)):
            for fact in facts[k]:
                assert HOLDS[fact](out), f"{name}, value {k} is not {fact}: {np.asarray(out)} from {values}"


@pytest.mark.parametrize("name", sorted(LOOK_ALIKES))
def test_look_alikes_of_the_sources_do_not_get_their_facts(name):
    fn, wrong = LOOK_ALIKES[name]
    shape = (6, 6)
    facts = _facts(fn, (np.zeros(shape, np.float32),))
    assert not facts[0] & wrong, facts[0]
    # and rightly: some input breaks each
    run = jax.jit(fn)
    for fact in wrong:
        assert any(not HOLDS[fact](run(values)) for values in _inputs(shape, np.float32)), fact


def test_an_empty_axis_has_no_maximum_so_its_softmax_sum_is_not_at_least_one():
    fn = lambda a: jnp.sum(jnp.exp(a - jnp.max(a, axis=1, keepdims=True, initial=-jnp.inf)), axis=1)  # noqa: E731
    facts = _facts(fn, (np.zeros((3, 0), np.float32),))
    assert "at_least_one" not in facts[0] and "positive" not in facts[0], facts[0]
    assert np.all(np.asarray(jax.jit(fn)(np.zeros((3, 0), np.float32))) == 0)
