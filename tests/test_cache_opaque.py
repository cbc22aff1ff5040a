"""Programs with opaque primitives (loops superopt does not rewrite, sorts) in the persistent cache: stored
with each primitive as its fingerprint, answered in another process by binding that process's own
primitives (core/serial.py); a primitive whose params are not data (a host callback) is not stored."""
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from superopt import superopt
from superopt.core.serial import NotSerializable, from_data, opaque_fingerprint, to_data
from superopt.egraph.capture import capture
from superopt.reuse import opaque_by_fingerprint, program_key

_PROGRAM = """
import numpy as np, jax, jax.numpy as jnp
from jax import lax

def program(x, w, a, b):
    def cond(s):
        return s[0] < 20
    def body(s):
        return s[0] + 1, s[1] * 0.5 + jnp.tanh(s[1] @ w)
    return lax.while_loop(cond, body, (0, x))[1], jnp.sort(x, axis=0), jnp.diagonal(a @ b)

rng = np.random.default_rng(0)
ARGS = (rng.standard_normal((16, 8)).astype(np.float32), 0.1 * rng.standard_normal((8, 8)).astype(np.float32),
        rng.standard_normal((128, 128)).astype(np.float32), rng.standard_normal((128, 128)).astype(np.float32))
"""


def _loop(x, w, steps=20, scale=0.5):
    def body(s):
        return s[0] + 1, s[1] * scale + jnp.tanh(s[1] @ w)
    return lax.while_loop(lambda s: s[0] < steps, body, (0, x))[1]


_X, _W = np.zeros((4, 8), np.float32), np.zeros((8, 8), np.float32)


def _fingerprint(fn, *args):
    (opaque,) = capture(fn, args).graph.opaque
    return opaque_fingerprint(opaque)


def test_a_fingerprint_is_the_primitives_data():
    same = _fingerprint(_loop, _X, _W)
    assert same == _fingerprint(lambda x, w: _loop(x, w), _X, _W)                    # another function object
    assert same != _fingerprint(lambda x, w: _loop(x, w, steps=21), _X, _W)          # another trip count
    assert same != _fingerprint(lambda x, w: _loop(x, w, scale=0.25), _X, _W)        # another literal
    assert same != _fingerprint(_loop, np.zeros((5, 8), np.float32), _W)             # another carry shape


def test_a_loop_that_closes_over_an_array_is_told_apart_by_its_values():
    """The array is the loop's operand (a constant of the program), not a param: one fingerprint, and the
    program's key (which hashes its constants' bytes) tells the two apart."""
    def closing(c):
        return lambda x, w: lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] @ w + c), (0, x))[1]
    one, other = np.ones((4, 8), np.float32), np.full((4, 8), 2.0, np.float32)
    assert _fingerprint(closing(one), _X, _W) == _fingerprint(closing(other), _X, _W)
    keys = {program_key(capture(closing(c), (_X, _W)).graph, "options") for c in (one, one.copy(), other)}
    assert len(keys) == 2


def test_a_host_callback_has_no_fingerprint_and_its_program_is_not_stored(tmp_path):
    def program(a):
        return jax.pure_callback(lambda v: np.asarray(v) * 2, jax.ShapeDtypeStruct(a.shape, a.dtype), a) + 1.0
    (opaque,) = capture(program, (np.ones(4, np.float32),)).graph.opaque
    with pytest.raises(NotSerializable, match="pure_callback"):
        opaque_fingerprint(opaque)
    fast = superopt(program, cache=tmp_path)
    np.testing.assert_array_equal(fast(np.ones(4, np.float32)), np.full(4, 3.0, np.float32))
    assert fast.report.cache.status == "unstorable", fast.report.cache
    assert fast.report.cache.why.startswith("the opaque primitive pure_callback"), fast.report.cache


def test_a_stored_program_binds_only_the_callers_primitives():
    graph = capture(_loop, (_X, _W)).graph
    data = to_data(graph)
    assert from_data(data, opaque_by_fingerprint(graph)).opaque == graph.opaque
    with pytest.raises(NotSerializable, match="not the caller's"):
        from_data(data)
    other = capture(lambda x, w: _loop(x, w, steps=5), (_X, _W)).graph
    with pytest.raises(NotSerializable, match="not the caller's"):
        from_data(data, opaque_by_fingerprint(other))


@pytest.mark.slow
def test_a_program_with_a_loop_is_answered_from_the_cache_in_another_process(tmp_path):
    script = _PROGRAM + textwrap.dedent(f"""
        from superopt import superopt
        fast = superopt(program, target="cpu", cache={str(tmp_path / "c")!r})
        got, want = fast(*ARGS), jax.jit(program)(*ARGS)
        for g, r in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-4)
        print(fast.report.optimized, fast.report.cache)
    """)

    def run() -> str:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip().splitlines()[-1]

    assert run() == "True miss; result stored"
    assert run() == "True hit (the result of an earlier optimization of this program)"
