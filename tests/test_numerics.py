"""The numerics contract's modes (superopt/numerics.py), written from issue 28's finding 2: in float16,
rules equal over the reals re-associated, scaled and factored matrix products into programs that overflow
where jax.jit's does not. Under the default, `numerics="strict"`, superopt must return what jax.jit returns
on the inputs that broke them; under `numerics="fast"` the rewrite runs and the report names it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from superopt import superopt
from superopt.numerics import LEGAL, MODES, check_mode, left_out, restrict
from superopt.rewrites.schedule import Schedule
from superopt.rulesets import DEFAULT, RULESETS


def _full(shape, value):
    return jnp.full(shape, value, jnp.float16)


def assoc(x, y, z):
    return x @ (y @ z)                       # fast may run (x @ y) @ z: x @ y overflows


def scale(x, y):
    return (x * jnp.float16(0.001)) @ y      # fast may run (x @ y) * 0.001: x @ y overflows


def factor(x, y, z):
    return x @ y + x @ z                     # fast may run x @ (y + z): y + z overflows


# Each program with inputs on which jax.jit's result is finite and the rewritten program's is not.
CASES = {
    "assoc": (assoc, (_full((8, 512), 16.0), _full((512, 512), 16.0), _full((512, 512), 1e-4)), "matmul-assoc"),
    "scale": (scale, (_full((512, 512), 16.0), _full((512, 1), 16.0)), "matmul-scale-lhs"),
    "factor": (factor, (_full((512, 1), 0.1), _full((1, 512), 6e4), _full((1, 512), 6e4)), "matmul-distribute-lhs"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_strict_keeps_finite_results_finite_in_float16(name):
    fn, args, _ = CASES[name]
    expected = np.asarray(jax.jit(fn)(*args), np.float32)
    assert np.isfinite(expected).all()
    got = np.asarray(superopt(fn, target="cpu")(*args), np.float32)
    assert np.isfinite(got).all(), f"{name}: superopt overflowed where jax.jit did not"
    np.testing.assert_allclose(got, expected, rtol=1e-2, atol=1e-2 * np.abs(expected).max())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_strict_never_runs_an_overflow_changing_rule(name):
    fn, args, rule = CASES[name]
    fast = superopt(fn, target="cpu")
    fast(*args)
    assert rule in fast.report.left_out
    assert rule not in fast.report.run.fired
    assert not fast.report.overflow_rewrites


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_fast_runs_the_rewrite_and_the_report_names_it(name):
    """The opt-in does what strict refuses: on these inputs its program overflows (which is why the
    strict tests above are meaningful), and the report lists the rewrite."""
    fn, args, rule = CASES[name]
    fast = superopt(fn, target="cpu", numerics="fast", verify=False)
    out = np.asarray(fast(*args), np.float32)
    assert not np.isfinite(out).all()
    assert fast.report.overflow_rewrites.get(rule, 0) > 0
    assert rule in str(fast.report) and "fast" in str(fast.report)


@pytest.mark.slow
def test_strict_on_the_pallas_backend():
    x, y, z = _full((8, 64), 40.0), _full((64, 64), 40.0), _full((64, 64), 1e-3)
    expected = np.asarray(jax.jit(assoc)(x, y, z), np.float32)
    assert np.isfinite(expected).all()
    got = np.asarray(superopt(assoc, target="gpu-h100", backend="pallas")(x, y, z), np.float32)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, rtol=1e-2)


def test_modes_and_their_rules():
    assert MODES == ("strict", "fast")
    assert set(LEGAL["strict"]) < set(LEGAL["fast"]) and "reals" not in LEGAL["strict"]
    schedule = Schedule.of(*DEFAULT)
    strict = restrict(schedule, "strict")
    assert [p.name for p in strict.phases] == [p.name for p in schedule.phases]
    assert all(r.numerics != "reals" for p in strict.phases for r in p.rules)
    reals = {r.name for rs in RULESETS.values() for r in rs if r.numerics == "reals"}
    assert set(left_out(schedule, "strict")) == reals
    assert left_out(schedule, "fast") == []


def test_an_unknown_mode_is_one_clear_error():
    with pytest.raises(ValueError, match=r"unknown numerics mode 'loose'; valid: strict, fast"):
        check_mode("loose")
    with pytest.raises(ValueError, match="unknown numerics mode"):
        superopt(assoc, numerics="loose")
