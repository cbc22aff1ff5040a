"""Worker processes cannot break a call (issue: workers re-ran the user's script, a killed worker raised).

Workers are fresh interpreters that never import the caller's `__main__`; a job whose worker raises, dies or
outruns its time is a failure of that job alone: its segment runs as captured, with the reason in the report.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

from superopt import superopt
from superopt import segmented
from superopt.workers import Failed, JobError, run_all

pytestmark = pytest.mark.slow   # worker processes import JAX and superopt: seconds each


def dies_on_one(x):
    if x == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return x * 10


def sleeps_on_one(x):
    if x == 1:
        time.sleep(60)
    return x * 10


def raises_on_one(x):
    if x == 1:
        raise ValueError("one is not allowed")
    return x * 10


def prints(x):
    print("chatter on standard output")
    return x + 1


def test_a_killed_worker_fails_its_job_alone():
    out = run_all(dies_on_one, [0, 1, 2, 3], executor="local", workers=2, failures="keep")
    assert out[0] == 0 and out[2] == 20 and out[3] == 30, out
    assert isinstance(out[1], Failed) and "killed by SIGKILL" in out[1].reason, out
    with pytest.raises(JobError, match=r"job 1 of 3 \(1\) failed: the worker process was killed by SIGKILL"):
        run_all(dies_on_one, [0, 1, 2], executor="local", workers=2)


def test_a_job_past_its_time_is_killed_and_fails_alone():
    start = time.monotonic()
    out = run_all(sleeps_on_one, [0, 1, 2], executor="local", workers=2, failures="keep", timeout=5)
    assert time.monotonic() - start < 50
    assert out[0] == 0 and out[2] == 20 and out[1] == Failed("timed out after 5 s"), out


def test_a_raising_job_is_kept_as_a_failure_and_what_jobs_print_is_not_an_answer():
    out = run_all(raises_on_one, [0, 1, 2], executor="local", workers=2, failures="keep")
    assert out[0] == 0 and out[2] == 20 and out[1] == Failed("ValueError: one is not allowed"), out
    assert run_all(prints, [1, 2, 3], executor="local", workers=2) == [2, 3, 4]


# Two kinds of layer, two of each: two distinct segments, so they are optimized in worker processes.
SCRIPT = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np
    from superopt import superopt
    print("top level ran")

    def chain(ws, x):
        for i, w in enumerate(ws):
            x = x @ w
            for _ in range(14):
                x = (jnp.tanh(x) if i >= 2 else jnp.sin(x)) * 0.5 + x
        return x

    rng = np.random.default_rng(0)
    ws = [rng.standard_normal((16, 16), dtype=np.float32) / 4 for _ in range(4)]
    x = rng.standard_normal((16, 16), dtype=np.float32)
    fast = superopt(chain, "gpu-h100", cache=False)
    got = np.asarray(fast(ws, x))
    np.testing.assert_allclose(got, np.asarray(jax.jit(chain)(ws, x)), rtol=1e-5, atol=1e-5)
    print("segments:", fast.report.segments)
''')


def chain(ws, x):
    for i, w in enumerate(ws):
        x = x @ w
        for _ in range(14):
            x = (jax.numpy.tanh(x) if i >= 2 else jax.numpy.sin(x)) * 0.5 + x
    return x


def chain_args(n=4):
    rng = np.random.default_rng(0)
    return ([rng.standard_normal((16, 16), dtype=np.float32) / 4 for _ in range(n)],
            rng.standard_normal((16, 16), dtype=np.float32))


def test_a_script_without_a_main_guard_is_not_run_again_by_the_workers(tmp_path):
    """A plain script (no `if __name__ == "__main__":`) whose program has distinct segments, optimized in
    worker processes: its top level runs once, and the call returns jax.jit's values."""
    script = tmp_path / "plain_script.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "SUPEROPT_EXECUTOR"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("top level ran") == 1, done.stdout
    assert "on local workers" in done.stdout, done.stdout


def killed(job):
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_segment_whose_worker_dies_runs_as_captured(monkeypatch):
    """Every segment's worker is killed (as the OOM killer would): the call still returns jax.jit's values,
    and the report says why the segments run as captured."""
    monkeypatch.setattr(segmented, "optimize_segment", killed)
    ws, x = chain_args()
    fast = superopt(chain, "gpu-h100", cache=False)
    got = np.asarray(fast(ws, x))
    np.testing.assert_array_equal(got, np.asarray(jax.jit(chain)(ws, x)))
    segments = fast.report.segments
    assert segments.failed == 2 and "killed by SIGKILL" in segments.first_failure, segments
    assert "2 whose worker failed run as captured" in str(segments)
