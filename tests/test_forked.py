"""superopt/core/forked.py: a computation in a forked child, and the NPU backend that uses it."""
import os

import jax.numpy as jnp
import numpy as np
import pytest

from superopt.core.forked import Forked, ForkedError, enabled


class _Odd(Exception):
    def __init__(self, a, b):          # does not unpickle from its args
        super().__init__(f"{a}/{b}")


def _raise_odd():
    raise _Odd(1, 2)


def test_the_child_computes_in_another_process():
    child = Forked(os.getpid)
    assert enabled() and child.result() != os.getpid()
    big = Forked(lambda n: np.arange(n, dtype=np.float32), 3_000_000)   # more than a pipe holds
    assert np.array_equal(big.result(), np.arange(3_000_000, dtype=np.float32))


def test_what_the_child_raises_is_raised_here():
    with pytest.raises(ZeroDivisionError):
        Forked(lambda: 1 / 0).result()
    with pytest.raises(ForkedError, match="_Odd: 1/2"):
        Forked(_raise_odd).result()


def test_cancel_kills_the_child(tmp_path):
    mark = tmp_path / "done"
    child = Forked(lambda: (__import__("time").sleep(5), mark.write_text("x")))
    child.cancel()
    assert not mark.exists()


def test_without_fork_it_runs_here(monkeypatch):
    monkeypatch.setenv("SUPEROPT_FORK", "0")
    assert Forked(os.getpid).result() == os.getpid()


def test_the_npu_check_on_two_cores_says_what_one_core_says(monkeypatch):
    """The NPU backend lowers the original and runs one check on the other core: the report (backend,
    cycles) and the outputs are the same as in one process."""
    from superopt import superopt

    def f(a, b, c):
        return jnp.tanh((a @ b) * 0.5 + c)

    rng = np.random.default_rng(0)
    args = (rng.standard_normal((64, 96), np.float32), rng.standard_normal((96, 48), np.float32),
            rng.standard_normal((64, 48), np.float32))
    found = []
    for fork in ("1", "0"):
        monkeypatch.setenv("SUPEROPT_FORK", fork)
        fast = superopt(f, target="npu-910b", cache=False)
        out = np.asarray(fast(*args))
        found.append((fast.report.backend, fast.report.npu_cycles, out))
    (b1, c1, o1), (b0, c0, o0) = found
    assert b1 == b0 and "npu emulator" in b1 and c1 == c0 and c1[0] > 0
    assert np.array_equal(o1, o0)
