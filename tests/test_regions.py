"""Loop and branch bodies searched as programs of their own (superopt/regions.py): a rewrite inside a scan,
a while loop, a cond or a loop nested in a loop is made there, the loop stays the same construct, and the
program computes jax.jit's values, derivatives, batched values and exported values."""
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from superopt import superopt
from superopt.egraph.capture import capture
from superopt.regions import optimized_bodies

RNG = np.random.default_rng(0)
H = jnp.asarray(RNG.standard_normal((16, 32)), jnp.float32)
WS = jnp.asarray(RNG.standard_normal((12, 32, 32)) / 6, jnp.float32)


def layer(h, w):
    """A step with a rewrite XLA does not make: exp(log(t)) of a positive t is t (rule exp-of-log-of-nonneg)."""
    a = h @ w
    return jnp.tanh(jnp.exp(jnp.log(jnp.abs(a) + 1.0)) - 1.0) + h


def scanned(ws, h):
    return lax.scan(lambda h, w: (layer(h, w), jnp.sum(h)), h, ws)


def while_loop(ws, h):
    def body(s):
        k, h = s
        return k + 1, layer(h, ws[k])
    return lax.while_loop(lambda s: s[0] < ws.shape[0], body, (0, h))[1]


def branches(ws, h):
    return lax.cond(jnp.sum(h) > 0, lambda h: layer(h, ws[0]), lambda h: layer(h, ws[1]) * 2.0, h)


def nested(ws, h):
    def outer(h, w):
        inner = lax.fori_loop(0, 12, lambda _, g: layer(g, w), h)   # 12 iterations: left a loop, not written out
        return inner * 0.5, None
    return lax.scan(outer, h, ws)[0]


CASES = {"scan": scanned, "while": while_loop, "cond": branches, "nested": nested}


def _equations(jaxpr):
    """Every equation of a jaxpr (closed or open), those of its calls', loops' and branches' bodies too."""
    for e in getattr(jaxpr, "jaxpr", jaxpr).eqns:
        yield e
        for value in e.params.values():
            for sub in value if isinstance(value, (tuple, list)) else [value]:
                if hasattr(getattr(sub, "jaxpr", sub), "eqns"):
                    yield from _equations(sub)


def _logs(closed) -> int:
    return sum(e.primitive.name == "log" for e in _equations(closed))


def _close(got, want, tol=2e-5):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=tol, atol=tol * np.max(np.abs(np.asarray(w))))


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_rewrite_inside_a_body_is_made_and_the_loop_computes_jax_jits_values(name):
    fn = CASES[name]
    fast = superopt(fn, target="cpu", cache=False)
    _close(fast(WS, H), jax.jit(fn)(WS, H))
    report = fast.report
    assert report.optimized, report.outcome
    kind = "scan" if name == "nested" else name
    assert f"bodies optimized: 1 {kind}" in report.loops, report.loops
    assert name == "nested" or "exp-of-log-of-nonneg" in report.loops   # a nested body's rules: its own report's
    traced = jax.make_jaxpr(fast)(WS, H)
    assert _logs(traced) == 0 < _logs(jax.make_jaxpr(fn)(WS, H))
    kinds = {e.primitive.name for e in _equations(traced)}
    assert {"scan": "scan", "while": "while", "cond": "cond", "nested": "scan"}[name] in kinds   # still the loop


@pytest.mark.slow   # grad, vmap and export each compile the program: the scan/cond cases above stay fast
def test_grad_vmap_and_export_of_a_program_whose_loop_body_changed_are_jax_jits():
    fast = superopt(scanned, target="cpu", cache=False)
    fast(WS, H)
    assert "bodies optimized" in fast.report.loops
    loss = lambda f: (lambda ws, h: jnp.sum(f(ws, h)[0] ** 2) + jnp.sum(f(ws, h)[1]))   # noqa: E731
    _close(jax.grad(loss(fast), argnums=(0, 1))(WS, H), jax.grad(loss(scanned), argnums=(0, 1))(WS, H), 1e-4)
    batch = jnp.stack([H, -H * 0.5])
    _close(jax.vmap(fast, in_axes=(None, 0))(WS, batch), jax.vmap(scanned, in_axes=(None, 0))(WS, batch))
    exported = jax.export.export(jax.jit(fast))(WS, H)
    _close(exported.call(WS, H), jax.jit(scanned)(WS, H))


def test_a_body_no_rule_improves_is_left_bound_to_the_users_primitive():
    graph = capture(lambda ws, h: lax.scan(lambda h, w: (jnp.tanh(h @ w) + h, None), h, ws)[0], (WS, H)).graph
    searched = optimized_bodies(graph, lambda closed: (None, ("a-rule",)))
    assert searched.graph is graph and searched.changed == [] and searched.searched == 1
    assert searched.note() == "bodies searched: 1, none made cheaper (rules fired in them: a-rule)"


def test_a_short_body_is_not_searched():
    graph = capture(lambda xs: lax.scan(lambda c, x: (c + x, c), jnp.zeros(32), xs)[1], (H,)).graph
    asked = []
    optimized_bodies(graph, lambda closed: asked.append(closed) or (None, ()))
    assert asked == []


def test_a_body_that_would_change_its_carrys_type_is_kept():
    from superopt.regions import retraced
    closed = jax.make_jaxpr(lambda c, x: (c + x, c))(jnp.zeros(3, jnp.float32), jnp.zeros(3, jnp.float32))
    assert retraced(lambda c, x: [(c + x).astype(jnp.float16), c], closed) is None
    assert retraced(lambda c, x: [x + c, c], closed) is not None


_PROGRAM = """
import numpy as np, jax, jax.numpy as jnp
from jax import lax

def program(ws, h):
    def layer(h, w):
        a = h @ w
        return jnp.tanh(jnp.exp(jnp.log(jnp.abs(a) + 1.0)) - 1.0) + h, None
    return lax.scan(layer, h, ws)[0]

rng = np.random.default_rng(0)
ARGS = ((rng.standard_normal((12, 32, 32)) / 6).astype(np.float32), rng.standard_normal((16, 32)).astype(np.float32))
"""


@pytest.mark.slow
def test_a_program_whose_loop_body_changed_is_answered_from_the_cache_in_another_process(tmp_path):
    script = _PROGRAM + textwrap.dedent(f"""
        from superopt import superopt
        fast = superopt(program, target="cpu", cache={str(tmp_path / "c")!r})
        np.testing.assert_allclose(np.asarray(fast(*ARGS)), np.asarray(jax.jit(program)(*ARGS)), rtol=2e-5, atol=2e-5)
        print(fast.report.optimized, "bodies optimized" in fast.report.loops, fast.report.cache)
    """)

    def run() -> str:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip().splitlines()[-1]

    assert run() == "True True miss; result stored"
    assert run() == "True True hit (the result of an earlier optimization of this program)"


def test_a_program_that_is_one_loop_with_nothing_to_search_skips_saturation():
    running = lambda xs: lax.scan(lambda c, x: (c + x, c), jnp.zeros(32), xs)[1]   # noqa: E731
    fast = superopt(running, target="cpu", cache=False)
    np.testing.assert_array_equal(np.asarray(fast(H)), np.asarray(jax.jit(running)(H)))
    assert "nothing for the search" in fast.report.outcome and "saturate" not in fast.report.stage_seconds
    changed = superopt(scanned, target="cpu", cache=False)   # one loop too, whose body changed: still chosen
    changed(WS, H)
    assert changed.report.optimized and "saturate" not in changed.report.stage_seconds
