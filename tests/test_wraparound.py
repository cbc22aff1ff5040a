"""Integer arithmetic wraps (two's complement, as XLA's does), and float64 is a dtype of its own: the range and
sign facts of egraph/analysis.py hold of integer values only where wraparound keeps them, `rules check` tests
each fact's derivation on integer extremes, verification draws integers whose squares wrap, and float64
inputs are built in float64 (issue 52, items 1 and 4)."""
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st


from superopt import superopt
from superopt.core import verify
from superopt.egraph.analysis import analysis
from superopt.egraph.capture import capture
from superopt.egraph.encode import encode
from superopt.egraph.frozen import freeze
from superopt.rewrites import checker
from superopt.rulesets import RULESETS

SIGNED = ("int8", "int16", "int32")
UNSIGNED = ("uint8", "uint16", "uint32")
WRAPS = np.array([46341, 3, -46341, 65536], np.int32)   # 46341**2 is past int32's largest value


def _same_as_jit(fn, *args, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", verify.VerificationWarning)
        got = superopt(fn, **options)(*args)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.jit(fn)(*args)))


def test_relu_of_an_integer_square_keeps_the_max_on_gpu():
    _same_as_jit(lambda x: jnp.maximum(x * x, 0), WRAPS, target="gpu-h100")


@pytest.mark.slow
def test_min_one_of_a_negated_integer_square_keeps_the_min_on_npu():
    _same_as_jit(lambda x: jnp.minimum(-(x * x), 1), WRAPS, target="npu-910b")


@pytest.mark.slow
def test_a_float_output_fed_by_a_wrapped_integer_is_unchanged():
    w = np.arange(8, dtype=np.float32).reshape(4, 2) / 8
    fn = lambda x, w: jnp.minimum(-(x * x), 1).astype(jnp.float32) @ w   # noqa: E731
    x = WRAPS.reshape(1, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", verify.VerificationWarning)
        got = superopt(fn, target="gpu-h100")(x, w)
    np.testing.assert_allclose(np.asarray(got), np.asarray(jax.jit(fn)(x, w)), rtol=1e-6)


# ---- the analysis's facts on integers ----

def _derived(fn, args) -> list[set]:
    enc = encode(capture(fn, args).graph)
    enc.egraph.run(analysis().saturate())
    frozen = freeze(enc.egraph, facts=True)
    return [frozen.facts.get(frozen.outputs[k], set()) for k in range(len(frozen.outputs))]


# programs whose every value the old analysis gave a fact that wraparound breaks
BROKEN = {
    "square": lambda a: (a * a, a ** 2, jnp.square(a)),
    "abs": lambda a: (jnp.abs(a), jnp.maximum(jnp.abs(a), 1)),
    "negated square": lambda a: (-(a * a), jnp.minimum(-(a * a), 1)),
    "less its maximum": lambda a: (a - jnp.max(a, axis=-1, keepdims=True),),
    "sum of nonneg": lambda a: (jnp.maximum(a, 0) + jnp.maximum(a, 0), jnp.sum(jnp.maximum(a, 0), axis=-1)),
}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", SIGNED + UNSIGNED)
@pytest.mark.parametrize("name", sorted(BROKEN))
def test_integer_facts_hold_on_integer_extremes(name, dtype):
    fn = BROKEN[name]
    facts = _derived(fn, (np.zeros((2, 4), dtype),))
    run = jax.jit(fn)

    @settings(max_examples=40, deadline=None, database=None, derandomize=True)
    @given(st.lists(checker.integer_elements(dtype), min_size=8, max_size=8))
    def holds(values):
        a = np.array(values, np.int64).astype(dtype).reshape(2, 4)
        for k, out in enumerate(run(a)):
            for fact in facts[k]:
                assert checker.FACT_HOLDS[fact](np.asarray(out)), (name, k, fact, a, np.asarray(out))
    holds()


def test_float_facts_are_kept():
    facts = _derived(lambda a: (a * a, jnp.abs(a), -(a * a), a - jnp.max(a, axis=-1, keepdims=True)),
                     (np.zeros((2, 4), np.float32),))
    assert [("nonneg" in f, "nonpos" in f) for f in facts] == [(True, False), (True, False), (False, True),
                                                               (False, True)]


def test_unsigned_values_and_their_minimum_stay_nonneg():
    facts = _derived(lambda a: (a, jnp.minimum(a, a + 1), -a), (np.zeros((4,), np.uint8),))
    assert "nonneg" in facts[0] and "nonneg" in facts[1]
    assert "nonpos" not in facts[2] and "at_most_one" not in facts[2]   # -1 is 255


# ---- the checker ----

@pytest.mark.slow   # about 12 s a dtype: saturating the analysis over every derivation
@pytest.mark.parametrize("dtype", checker.FACT_DTYPES)
def test_every_fact_derivation_holds_on_integer_extremes(dtype):
    result = checker.check_facts(dtype)
    assert result.cases > 0
    assert result.counterexample is None, str(result.counterexample)


@pytest.mark.slow
def test_the_fact_checker_finds_a_derivation_that_ignores_wraparound():
    from egglog import eq, rule, String
    from superopt.egraph.analysis import x, z
    from superopt.egraph.terms import binary, nonneg
    unsound = rule(eq(z).to(binary(String("mul"), x, x))).then(nonneg(z))   # the old rule, without its dtype
    result = checker.check_facts("int32", extra=(unsound,))
    assert result.counterexample is not None and "nonneg" in result.counterexample.problem


@pytest.mark.slow
@pytest.mark.parametrize("name", ["relu-of-nonneg", "abs-of-nonneg", "min-one-of-at-most-one"])
def test_fact_guarded_rules_are_checked_on_integer_extremes(name):
    rule = next(r for rs in RULESETS.values() for r in rs if r.name == name)
    result = checker.check_rule(rule, examples=120)
    assert result.sound, (result.counterexample, result.notes)
    assert set(result.dtypes) & set(checker.FACT_DTYPES), result.dtypes   # integer bindings were drawn


# ---- verification's inputs ----

@pytest.mark.slow
@settings(max_examples=30, deadline=None, database=None)
@given(st.sampled_from(SIGNED), st.integers(1, 6))
def test_verification_finds_a_dropped_relu_of_an_integer_square(dtype, n):
    reference = jax.jit(lambda x: (jnp.maximum(x * x, 0),))
    dropped = jax.jit(lambda x: (x * x,))
    graph = capture(lambda x: jnp.maximum(x * x, 0), (np.zeros((n,), dtype),)).graph
    assert verify.verify(reference, dropped, [((n,), dtype)], graph) is not None


FLOATS = ("float64", "float32", "float16", "bfloat16")


@settings(max_examples=30, deadline=None, database=None)
@given(st.sampled_from(FLOATS), st.integers(16, 64), st.integers(0, 3))
def test_each_float_dtype_gets_its_own_extremes_and_no_warning(dtype, n, seed):
    info = verify._finfo(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        zeros, = verify.special_args([((n,), dtype)], "zeros", seed)
        specials, = verify.special_args([((n,), dtype)], "specials", seed)
    assert zeros.dtype == np.dtype(dtype) and specials.dtype == np.dtype(dtype)
    z, s = zeros.astype(np.float64), specials.astype(np.float64)
    below_normal = z[(z != 0) & (np.abs(z) < float(info.tiny))]
    assert below_normal.size, f"no subnormal in {dtype}'s zeros set: {z}"
    big = float(info.max)
    assert np.any(np.abs(s) == big), f"no +-max of {dtype} in its specials set: {s}"


def test_float64_extremes_are_float64s():
    zeros, = verify.special_args([((64,), "float64")], "zeros")
    specials, = verify.special_args([((64,), "float64")], "specials")
    assert np.min(np.abs(zeros[zeros != 0])) == np.finfo(np.float64).smallest_subnormal
    assert np.finfo(np.float64).max in specials and -np.finfo(np.float64).max in specials


def test_integer_extremes_include_the_square_roots():
    for dtype in SIGNED + UNSIGNED:
        info = np.iinfo(dtype)
        root = math.isqrt(int(info.max))
        block, = verify.special_args([((16,), dtype)], "zeros")
        assert {root, root + 1, int(info.max)} <= set(block.astype(np.int64).tolist()), (dtype, block)


def test_float64_values_near_the_largest_are_compared_not_overflowed():
    """Found by fuzzing float64 programs: `mismatch` measured errors with sums that overflow float64. +max
    against -max was an error of inf within a bound of inf, and a normwise error whose norms overflow was
    inf / inf, NaN, which passes any tolerance: both pairs agreed, with overflow warnings to the caller."""
    big = float(np.finfo(np.float64).max)
    off = np.full(4, 1e200) * (1 + 5e-10)            # elementwise within 1e-9, normwise 5e-10 over 1e-10
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert verify.mismatch(np.array([big, 1.0]), np.array([-big, 1.0])) is not None
        assert "normwise" in verify.mismatch(np.full(4, 1e200), off)
        assert verify.mismatch(np.array([big, -big, 1e200]), np.array([big, -big, 1e200])) is None
        assert verify.as_accurate(np.full(4, 1e200), off, np.full(4, 1e200), factor=1.0) is not None


@pytest.mark.slow
def test_a_float64_program_warns_the_caller_of_nothing():
    """Found by fuzzing float64 programs: verifying one leaked numpy's RuntimeWarnings to the caller (an
    overflow casting float64's largest value to float32 in the scaled input sets, overflows in the norms
    of `mismatch`)."""
    def f(a, b):
        return jnp.sum(jnp.diagonal(a @ b)) * 2.0 * 3.0 + jnp.exp(a).sum()
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((8, 8)), rng.standard_normal((8, 8))
    with jax.enable_x64(True), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = superopt(f, target="gpu-h100")
        got = fast(a, b)
        want = jax.jit(f)(a, b)
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []
    assert fast.report.optimized, fast.report.outcome
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12)
