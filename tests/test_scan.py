"""Cumulative ops (cumsum, cumprod, cummax, cummin, cumlogsumexp): one op table entry each, end to end:
captured as ops, rewritten by rules the checker proves, costed, and run by every backend."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from superopt import superopt
from superopt.core.ops import OPS, SCANS
from superopt.egraph.capture import capture
from superopt.extract import cost
from superopt.extract.target import load_target
from superopt.rewrites.checker import check_rule
from superopt.rulesets import RULESETS

X = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)


def _scans(x):
    return (jnp.cumsum(x, axis=1), jnp.cumprod(x * 0.5, axis=0), lax.cummax(x, 1, reverse=True),
            lax.cummin(x, 0), lax.cumlogsumexp(x, 1))


def test_cumulative_ops_are_captured_as_ops_not_opaque():
    graph = capture(_scans, (X,)).graph
    counts = graph.op_counts()
    assert SCANS == {"cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"}
    assert all(counts.get(name) == 1 for name in SCANS), counts
    assert "opaque" not in counts
    reverse = [n.attrs for n in graph.nodes if n.op == "cummax"]
    assert reverse == [(1, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("target,backend", [("cpu", None), ("gpu-h100", "pallas"), ("npu-910b", "emulator")])
def test_every_backend_runs_them_as_jax_does(target, backend):
    fast = superopt(_scans, target=target, backend=backend)
    for got, want in zip(fast(X), jax.jit(_scans)(X)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=1e-5)


def test_the_npu_runs_them_on_the_host_and_says_so():
    fast = superopt(lambda x: jnp.cumsum(x, axis=1) * 2.0, target="npu-910b", backend="emulator")
    fast(X)
    host = [line for line in fast.report.npu_lines if "on the host" in line]
    assert host and "cumsum" in host[0], fast.report.npu_lines


def test_a_rule_on_them_fires_and_its_program_agrees():
    fn = lambda x: lax.cummax(lax.cummax(x, 1), 1) + jnp.cumsum(-x, axis=0)   # noqa: E731
    fast = superopt(fn, target="cpu")
    np.testing.assert_array_equal(np.asarray(fast(X)), np.asarray(jax.jit(fn)(X)))
    assert "cummax-of-cummax" in fast.report.run.fired
    assert fast.report.optimized and fast.report.ops_before["cummax"] == 2 and fast.report.ops_after["cummax"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cummax-of-cummax", "cummin-of-cummin", "cumsum-of-neg"])
def test_their_rules_are_proved_by_the_checker(name):
    rule = next(r for rs in RULESETS.values() for r in rs if r.name == name)
    result = check_rule(rule, examples=40)
    assert result.counterexample is None and result.cases > 0


def test_they_cost_one_operation_per_element_or_a_transcendental_one():
    t = load_target("cpu")
    ty = ((8, 16), "float32")
    assert cost.flops("cumsum", (1, 0), [ty], ty, t) == 128
    assert cost.flops("cumlogsumexp", (1, 0), [ty], ty, t) == 128 * t.transcendental_flops
    assert OPS["cumsum"].npu == "host" and OPS["cumsum"].pallas == "between"


@pytest.mark.slow
def test_grad_and_vmap_go_through_them():
    fn = lambda x: jnp.sum(jnp.cumsum(x, axis=1) ** 2)   # noqa: E731
    fast = superopt(fn, target="cpu")
    np.testing.assert_allclose(np.asarray(jax.grad(fast)(X)), np.asarray(jax.grad(fn)(X)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(jax.vmap(fast)(X[None])), np.asarray(jax.vmap(fn)(X[None])), rtol=1e-5)
