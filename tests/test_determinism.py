"""What superopt returns does not depend on how busy the machine is (issue 52, item 11): the budgets that
decide the program count deterministic units (saturation's iterations, rows and work; kernel growth's body
nodes; sharing trials and their e-nodes), and time limits are backstops several times what the defaults
take. Load is simulated deterministically: `slowed(k)` makes every clock of a time limit run k times as
fast, as on a machine k times slower or as busy; the machine's real load is not relied on."""
import time

import jax.numpy as jnp
import numpy as np
import pytest

from superopt import Limits, StopReason, superopt
from superopt.core.deadline import Deadline, slowed
from superopt.egraph.limits import SATURATION_SHARE
from superopt.extract import greedy
from superopt.workloads import qlinear_args, qlinear_fn

# Backstops no run here comes near: the search stops only at its budgets.
GENEROUS = dict(seconds=10_000, saturation_seconds=10_000, segment_seconds=10_000)


def _optimized(fn, args, limits: Limits, **kw):
    fast = superopt(fn, target="gpu-h100", cache=False, limits=limits, **kw)
    fast.compile(*args)
    return fast


def _slowdown(idle) -> float:
    """How many times slower to simulate, from a run with generous backstops at this machine's present speed:
    its saturation then takes 8 s on the clocks of time limits (the old time limit; the backstop is 30 s) and
    the whole call at most 12 s (its backstop is 120 s, optional extraction work stops at half what is left).
    The margin below each backstop is several times over, since the machine's real load can change between
    the two runs as much again (a fresh-clone `make test` beside another 2-worker job: the 30 s target left
    too little, and the optional-work backstop fired)."""
    report = idle.report
    return max(1.0, min(8 / max(report.run.seconds, 1e-3), 12 / max(sum(report.stage_seconds.values()), 1e-3)))


def _no_backstop_fired(fast) -> None:
    report = fast.report
    assert report.run.stop_reason is not StopReason.TIME_LIMIT, report.run
    assert "time limit" not in report.outcome, report.outcome
    assert not report.extraction.trials_stopped, report.extraction


@pytest.mark.slow
def test_a_machine_many_times_slower_gets_the_same_int8_kernel():
    # test_quant's int8 linear layer: its saturation takes about 0.5 s, so 20 times slower it ran into the
    # old 8 s limit (and a program chosen from the cut e-graph failed verification); now 30 s is a
    # backstop and the budgets decide.
    args = qlinear_args(64, 256, 128)
    idle = _optimized(qlinear_fn, args, Limits(**GENEROUS), numerics="fast")
    with slowed(_slowdown(idle)):
        busy = _optimized(qlinear_fn, args, Limits(), numerics="fast")
    _no_backstop_fired(busy)
    assert idle.report.optimized and busy.report.optimized, (idle.report.outcome, busy.report.outcome)
    assert busy.term == idle.term
    assert busy.report.run.iterations == idle.report.run.iterations
    assert busy.report.run.work == idle.report.run.work > 0


def _chain(x, w):
    h = x
    for _ in range(6):
        h = jnp.tanh(h @ w) * 1.5 + 0.25
    return h


CHAIN_ARGS = (np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32),
              (np.random.default_rng(1).standard_normal((128, 128)) * 0.1).astype(np.float32))


@pytest.mark.slow
def test_the_work_budget_stops_saturation_at_the_same_point_at_any_speed():
    limits = Limits(work=10_000, **GENEROUS)
    idle = _optimized(_chain, CHAIN_ARGS, limits)
    assert idle.report.run.stop_reason is StopReason.WORK_LIMIT, idle.report.run
    assert "stopped at the work limit" in str(idle.report)
    with slowed(_slowdown(idle)):
        busy = _optimized(_chain, CHAIN_ARGS, Limits(work=10_000))
    _no_backstop_fired(busy)
    assert busy.report.run.stop_reason is StopReason.WORK_LIMIT
    assert (busy.report.run.iterations, busy.report.run.work) == (idle.report.run.iterations, idle.report.run.work)
    assert busy.term == idle.term
    # less work, fewer rewrites found: the budget is what decides
    full = _optimized(_chain, CHAIN_ARGS, Limits(**GENEROUS))
    assert full.report.run.work > idle.report.run.work


def weight_gradient_consumers(x, g, p, h, q):
    """test_fusion's shared producer, twice: each consumer alone is cheapest recomputing its matmul."""
    out = []
    for d, w in ((x.T @ g, p), (x.T @ h, q)):
        out += [jnp.sum(d * d), jnp.all(jnp.isfinite(d.T)), w - 0.1 * d, 0.9 * w + 0.1 * d]
    return tuple(out)


GRAD_ARGS = tuple(np.random.default_rng(k).standard_normal(shape).astype(np.float32)
                  for k, shape in enumerate([(128, 256), (128, 512), (256, 512), (128, 384), (256, 384)]))


@pytest.mark.slow
def test_sharing_trials_stop_at_their_count_not_at_the_clock(monkeypatch):
    trials = []
    share = greedy.share_producers

    def counting(fz, choose, cost, stop=None):
        def counted(**kw):
            trials[-1] += bool(kw)   # the first call, without arguments, is the plain choice
            return choose(**kw)
        trials.append(0)
        return share(fz, counted, cost, stop)

    monkeypatch.setattr(greedy, "share_producers", counting)
    idle = _optimized(weight_gradient_consumers, GRAD_ARGS, Limits(**GENEROUS))
    with slowed(_slowdown(idle)):
        busy = _optimized(weight_gradient_consumers, GRAD_ARGS, Limits())
    _no_backstop_fired(busy)
    assert trials[0] >= 2 and trials[1] == trials[0], trials
    assert busy.term == idle.term and idle.report.optimized
    # an e-node budget of less than one trial's e-graph: one trial, however fast the machine
    monkeypatch.setattr(greedy, "SHARING_NODES", 1)
    trials.clear()
    _optimized(weight_gradient_consumers, GRAD_ARGS, Limits(**GENEROUS))
    assert trials == [1]


@pytest.mark.slow
def test_a_backstop_still_fires_on_a_machine_far_slower_and_the_report_names_it():
    args = qlinear_args(64, 256, 128)
    with slowed(1e5):
        fast = _optimized(qlinear_fn, args, Limits(), numerics="fast")
    assert not fast.report.optimized
    assert "time limit" in fast.report.outcome, fast.report.outcome
    np.testing.assert_array_equal(np.asarray(fast(*args)), np.asarray(qlinear_fn(*args)))


def test_slowed_scales_every_clock_of_a_time_limit():
    with slowed(1e6):
        wall, cpu = Deadline(1.0), Deadline.cpu(1.0)
        start = time.process_time()
        while time.process_time() - start < 0.05:   # 50 ms of CPU time: 50,000 s on these clocks
            pass
        assert wall.expired() and cpu.expired()
        assert Deadline(1.0).share(SATURATION_SHARE) <= 0.5
    assert not Deadline(1.0).expired()
