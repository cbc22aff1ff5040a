"""The loop benchmark (bench/loops.py): its kernels are loops, each runs under jax.jit and under superopt
(reduced sizes) and agrees, and the executable comparison tells a changed program from an unchanged one."""
import jax
import jax.numpy as jnp
import pytest

from bench import loops
from superopt.lowering.hlo import executable
from superopt import superopt


def test_the_suite_has_the_loops_the_issue_names():
    suite = loops.kernels(small=True)
    names = [name for name, _, _ in suite]
    assert len(names) >= 22 and len(set(names)) == len(names)
    shapes = {name: loops.loop_shape(fn, args) for name, fn, args in suite}
    assert all(shape != "none" for shape in shapes.values()), shapes
    assert {"while"} <= set(shapes.values()) and shapes["clipped-descent-cond"].endswith("(cond)")
    assert shapes["pairwise-nested"].startswith("scan×") and "(scan×" in shapes["pairwise-nested"]
    assert shapes["discounted-returns"].endswith("reversed")


def test_the_executable_digest_ignores_names_and_sees_programs():
    x = jnp.ones((8, 8), jnp.float32)
    digest = executable(jax.jit(lambda a: jnp.exp(a) * 2.0), (x,))
    assert digest == executable(jax.jit(lambda b: jnp.exp(b) * 2.0), (x,))
    assert digest != executable(jax.jit(lambda a: jnp.exp(a) * 3.0), (x,))


@pytest.mark.slow      # about 30 s: 27 optimizations
def test_every_kernel_runs_under_jit_and_superopt_and_agrees():
    for name, fn, args in loops.kernels(small=True):
        want = jax.jit(fn)(*args)
        got = superopt(fn, cache=False)(*args)
        assert loops.deviation(got, want) <= loops.RTOL, name
