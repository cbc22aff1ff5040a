"""Loops are priced as trip count x body plus the target's overhead per iteration (extract/loops.py)."""
import jax.numpy as jnp
import pytest
from jax import lax

from superopt.egraph.capture import capture
from superopt.extract import loops
from superopt.extract.extraction import program_cost
from superopt.extract.target import load_target

TARGETS = ("cpu", "gpu-h100", "npu-910b")
W = jnp.ones((256, 256), jnp.float32) / 256
X = jnp.ones((256, 256), jnp.float32)


def cost(fn, *args, target) -> float:
    return program_cost(capture(fn, args).graph, load_target(target))[0]


def step(c, w):
    return jnp.tanh(c @ w)


def scanned(n):
    return lambda c, w: lax.scan(lambda c, _: (step(c, w), None), c, None, length=n)[0]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("n", [10, 1000])
def test_scan_is_trips_times_body(target, n):
    body = cost(step, X, W, target=target)
    ratio = cost(scanned(n), X, W, target=target) / (n * body)
    assert 0.5 < ratio < 2.0, ratio


@pytest.mark.parametrize("target", TARGETS)
def test_nested_scans_multiply(target):
    inner = cost(scanned(10), X, W, target=target)
    nested = cost(lambda c, w: lax.scan(lambda c, _: (scanned(10)(c, w), None), c, None, length=7)[0], X, W,
                  target=target)
    assert 7 * inner <= nested < 1.2 * 7 * inner
    assert 0.5 < nested / (70 * cost(step, X, W, target=target)) < 2.0


def test_a_scan_pays_its_overhead_per_iteration():
    tgt = load_target("gpu-h100")
    trivial = cost(lambda c: lax.scan(lambda c, _: (c * 2.0 + 1.0, None), c, None, length=1000)[0],
                   jnp.float32(1.0), target="gpu-h100")
    assert trivial >= 1000 * tgt.loop_iteration_overhead


def whiled(c, w):
    return lax.while_loop(lambda s: s[1] < 5, lambda s: (step(s[0], w), s[1] + 1), (c, 0))[0]


@pytest.mark.parametrize("target", TARGETS)
def test_while_uses_the_declared_trip_count(target, monkeypatch):
    graph = capture(whiled, (X, W)).graph
    tgt = load_target(target)
    price = loops.loop_price(next(o for o in graph.opaque if o.name == "while"), tgt)
    assert (price.trips, price.estimated) == (loops.WHILE_TRIPS, True)
    full = program_cost(graph, tgt)[0]
    assert 0.5 < full / cost(scanned(loops.WHILE_TRIPS), X, W, target=target) < 2.0
    monkeypatch.setattr(loops, "WHILE_TRIPS", loops.WHILE_TRIPS // 10)
    assert 0.05 < program_cost(graph, tgt)[0] / full < 0.2
    notes = loops.loop_notes(graph)
    assert len(notes) == 1 and "trip count unknown" in notes[0] and f"{loops.WHILE_TRIPS} iterations" in notes[0]


def test_loop_notes_name_nested_whiles_and_skip_scans():
    assert loops.loop_notes(capture(scanned(10), (X, W)).graph) == []
    nested = capture(lambda c, w: lax.scan(lambda c, _: (whiled(c, w), None), c, None, length=3)[0], (X, W)).graph
    (note,) = loops.loop_notes(nested)
    assert "inside a scan loop" in note


@pytest.mark.parametrize("target", TARGETS)
def test_a_loop_costs_more_than_the_program_without_it(target):
    with_loop = cost(lambda c, w: jnp.tanh(c) @ w + scanned(20)(c, w), X, W, target=target)
    without = cost(lambda c, w: jnp.tanh(c) @ w + c, X, W, target=target)
    assert with_loop > without + 10 * cost(step, X, W, target=target)


def test_row_loop_costs_about_the_whole_array_op_plus_overheads():
    """A fori_loop over rows, updating its carry in place (extract/loops.py: a row read or write moves the row)
    costs about the same op on the whole array plus an overhead per row (measured on the development
    machine: 208 us against 78 us for the whole array at 1000x128)."""
    tgt = load_target("cpu")
    for n, d in ((1000, 128), (200, 512)):
        x = jnp.ones((n, d), jnp.float32)
        rows = cost(lambda x: lax.fori_loop(0, x.shape[0], lambda i, x: x.at[i].set(jnp.tanh(x[i]) * 2.0), x), x,
                    target="cpu")
        whole = cost(lambda x: jnp.tanh(x) * 2.0, x, target="cpu")
        per_row = tgt.loop_iteration_overhead + 4 * tgt.loop_launch_overhead   # slice, op, update, counter
        assert 0.5 < rows / (whole + n * per_row) < 4, (n, d, rows, whole)


def test_bodies_are_captured_once():
    graph = capture(scanned(10), (X, W)).graph
    tgt = load_target("cpu")
    first = program_cost(graph, tgt)[0]
    (closed,) = [o.params["jaxpr"] for o in graph.opaque if o.name == "scan"]
    assert loops._graphs[id(closed)][0] is closed
    assert program_cost(graph, tgt)[0] == first


@pytest.mark.parametrize("target", TARGETS)
def test_cond_is_its_costliest_branch(target):
    heavy = cost(step, X, W, target=target)
    chosen = cost(lambda p, c, w: lax.cond(p > 0, lambda c: step(c, w), lambda c: c * 2.0, c), 1.0, X, W,
                  target=target)
    tgt = load_target(target)
    # the cond, and the predicate's comparison and conversion to a branch index outside it
    assert 0.9 * heavy <= chosen < 1.5 * heavy + tgt.while_iteration_overhead + 2 * tgt.launch_overhead
    looped = cost(lambda c, w: lax.scan(lambda c, _: (lax.cond(jnp.sum(c) > 0, lambda c: step(c, w), lambda c: c,
                                                                c), None), c, None, length=10)[0], X, W, target=target)
    # each iteration: the cond, its predicate (a sum, a comparison, a conversion) and the loop's own overhead
    per_iteration = (1.5 * heavy + tgt.while_iteration_overhead + tgt.loop_iteration_overhead
                     + 4 * tgt.loop_launch_overhead)
    assert 0.9 * 10 * heavy <= looped < 10 * per_iteration


@pytest.mark.parametrize("target", TARGETS)
def test_loop_invariant_work_is_priced_once(target):
    """XLA moves work that reads only loop invariants out of the loop: w @ w.T costs once, not per trip."""
    once = cost(lambda c, w: lax.fori_loop(0, 50, lambda _, c: jnp.tanh(c @ (w @ w.T)), c), X[:8], W,
                target=target)
    hoisted = cost(lambda c, w: lax.fori_loop(0, 50, lambda _, c, g=None: jnp.tanh(c @ w), c), X[:8], W,
                   target=target) + cost(lambda w: w @ w.T, W, target=target)
    assert 0.8 < once / hoisted < 1.25, once / hoisted
