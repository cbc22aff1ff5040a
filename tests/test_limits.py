"""Limits bound the whole call (issue 28, finding 6): one deadline for capture, encode, saturate,
extract, lower and verify; encoding linear in the program's size; a program is returned only if it was
verified before the deadline, else the original runs and the report names the stage that ran out.
Speed itself is shown by `bench/limits.py`, not asserted here."""
import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from egglog import EGraph, String, set_

from bench.limits import chain
from superopt import Limits, StopReason, superopt
from superopt.core.deadline import Deadline, TimeLimit, current
from superopt.egraph import egglog_api
from superopt.egraph import encode as encode_module
from superopt.egraph import terms as T
from superopt.egraph.analysis import axes_facts, facts
from superopt.egraph.capture import capture
from superopt.egraph.encode import encode
from superopt.egraph.frozen import freeze
from superopt.core.ops import ARG_REDUCTIONS, BINARY_OPS, REDUCTIONS, UNARY_OPS, WINDOW_REDUCTIONS
from superopt.egraph.isolate import portable, saturate_isolated
from superopt.extract.greedy import extract
from superopt.extract.target import load_target
from superopt.rulesets import RULESETS

STAGES = "capture|segment|segments|encode|saturate|extract|lower|verify"


X = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
W = (np.random.default_rng(1).standard_normal((16, 16)) * 0.25).astype(np.float32)


# ---- the finding: a 20,000-op chain under Limits(seconds=2) ----

@pytest.mark.slow
def test_a_20000_op_chain_under_a_2_second_limit_returns_the_right_result_and_names_the_stage():
    program = chain(20_000)
    fast = superopt(program, limits=Limits(seconds=2))
    out = fast(X, W)
    np.testing.assert_allclose(out, jax.jit(program)(X, W), rtol=1e-5, atol=1e-5)
    report = fast.report
    assert sum(report.ops_before.values()) > 20_000
    # 2 s is not enough to saturate, extract and verify 33,000 nodes: the original runs, and says why
    named = re.match(rf"kept original: time limit \(({STAGES}): ", report.outcome)
    assert named, report.outcome
    assert report.run.stop_reason is StopReason.TIME_LIMIT
    assert "stopped at the time limit" in str(report)
    assert named.group(1) in report.stage_seconds   # the stage named is one that ran (on a loaded machine,
    assert list(report.stage_seconds)[-1] == named.group(1)   # capture alone can take the 2 s)


# ---- encoding is linear: the work it hands egglog grows with the program, not with its square ----

def _encoded_work(n_ops: int, monkeypatch) -> tuple[int, int, int]:
    """(actions, query atoms, egglog tables) of encoding `chain(n_ops)`."""
    actions = atoms = 0
    run_rule = encode_module._Writer.run_rule

    def counting(self, acts, query, tag):
        nonlocal actions, atoms
        actions += len(acts)
        atoms += len(query)
        return run_rule(self, acts, query, tag)

    monkeypatch.setattr(encode_module._Writer, "run_rule", counting)
    enc = encode(capture(chain(n_ops), (X, W)).graph)
    return actions, atoms, len(egglog_api.frozen_tables(enc.egraph))


@pytest.mark.slow
def test_encoding_does_work_linear_in_the_program(monkeypatch):
    small, large = _encoded_work(600, monkeypatch), _encoded_work(2400, monkeypatch)
    nodes_small = len(capture(chain(600), (X, W)).graph.live())
    nodes_large = len(capture(chain(2400), (X, W)).graph.live())
    # At most a let, a shape row, a dtype row and one shape per node (and the helper rows), a lookup
    # per node read across rules; and no table per node (egglog's global lets were one table each,
    # which made every later command slower: the quadratic part of the finding).
    for (actions, atoms, _), nodes in ((small, nodes_small), (large, nodes_large)):
        assert actions <= 5 * nodes + 8 and atoms <= nodes
    assert small[2] == large[2]     # the same tables, whatever the size


# ---- the encoded terms are those of the expression layer, one global let per node ----

def _reference_encode(graph) -> EGraph:
    """The encoder before issue 28: egglog's expression layer, one global `let` per node."""
    enc = encode_module.Encoding(EGraph(), graph)
    eg = enc.egraph
    eg.register(*facts(), *axes_facts(graph))
    exprs, pending = {}, []
    for i in graph.live():
        node, a = graph.nodes[i], graph.nodes[i].attrs
        ins = [exprs[j] for j in node.inputs]
        op = node.op
        if op in UNARY_OPS:
            e = T.unary(op, ins[0])
        elif op in BINARY_OPS:
            e = T.binary(op, ins[0], ins[1])
        elif op in REDUCTIONS:
            e = T.reduce(op, ins[0], T.ints(a[0]))
        elif op in ARG_REDUCTIONS:
            e = T.argreduce(op, ins[0], a[0], node.dtype)
        elif op in WINDOW_REDUCTIONS:
            e = T.pool(op, ins[0], *(T.ints(v) for v in a))
        else:
            e = {"arg": lambda: T.arg(a[0]), "lit": lambda: T.lit(float(a[0]), node.dtype),
                 "iota": lambda: T.iota(a[0], T.ints(node.shape), node.dtype),
                 "integer_pow": lambda: T.integer_pow(ins[0], a[0]), "select": lambda: T.select(*ins),
                 "convert": lambda: T.convert(ins[0], node.dtype),
                 "matmul": lambda: T.matmul(ins[0], ins[1], node.dtype),
                 "transpose": lambda: T.transpose(ins[0], T.ints(a[0])),
                 "reshape": lambda: T.reshape(ins[0], T.ints(node.shape)),
                 "broadcast": lambda: T.broadcast(ins[0], T.ints(node.shape), T.ints(a[0])),
                 "concat": lambda: T.concat(T.tlist(ins), a[0]),
                 "slice": lambda: T.slice_(ins[0], *(T.ints(v) for v in a))}[op]()
        exprs[i] = eg.let(f"n{i}", e)
        pending += [set_(T.shape(exprs[i])).to(T.ints(node.shape)), set_(T.dtype(exprs[i])).to(String(node.dtype))]
        if len(pending) >= 256:
            eg.register(*pending)
            pending = []
    pending += [T.output(k, exprs[o]) for k, o in enumerate(graph.outputs)]
    if pending:
        eg.register(*pending)
    return eg


def _view(eg: EGraph):
    fz = portable(freeze(eg))
    tables = [name for name, fn in egglog_api.frozen_tables(eg).items()
              if not fn.is_let_binding and fn.rows]
    return repr((list(fz.classes.items()), list(fz.shapes.items()), list(fz.dtypes.items()),
                 list(fz.outputs.items()), tables))     # repr: NaN literals compare equal


def _mixed(x, w):
    h = jnp.where(x > 0, x, -jnp.inf) * jnp.nan + jnp.arange(16, dtype=jnp.float32)
    y = jnp.concatenate([x, h], 0).T.reshape(16, 16)[:8] @ w
    return jax.nn.softmax(y, axis=-1), y.sum(0), jnp.argmax(y, 1), (y.astype(jnp.int32) ** 3)[:, 1:5]


@pytest.mark.slow
@pytest.mark.parametrize("fn, n", [(_mixed, 0), (chain(300), 300), (chain(1400), 1400)],
                         ids=["mixed-ops", "chain-300", "chain-1400"])
def test_the_encoded_e_graph_is_the_one_the_expression_layer_builds(fn, n):
    graph = capture(fn, (X, W)).graph
    assert _view(encode(graph).egraph) == _view(_reference_encode(graph))


# ---- one deadline, every stage ----

def test_a_deadline_names_the_stage_it_passed_in():
    deadline = Deadline(0.0)
    with pytest.raises(TimeLimit, match="during encode") as exc:
        deadline.check("encode")
    assert exc.value.stage == "encode"
    assert Deadline(None).left() == float("inf") and current().left() == float("inf")
    assert Deadline(60).bind(current)().seconds == 60


def test_encode_saturate_and_extract_stop_at_the_deadline():
    graph = capture(chain(30), (X, W)).graph
    with pytest.raises(TimeLimit) as exc:
        encode(graph, Deadline(0.0))
    assert exc.value.stage == "encode"
    enc = encode(graph)
    with pytest.raises(TimeLimit) as exc:
        saturate_isolated(enc.egraph, [], Limits(), Deadline(0.0))
    assert exc.value.stage == "saturate"
    from superopt.egraph.runner import Phase
    run, frozen = saturate_isolated(enc.egraph, [Phase("algebra", RULESETS["algebra"])], Limits(), Deadline(60))
    assert frozen is not None and run.seconds < 30    # half of the time left at most
    with pytest.raises(TimeLimit) as exc:
        Deadline(0.0).bind(extract)(frozen, enc, load_target("cpu"))
    assert exc.value.stage == "extract"


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_a_cpu_deadline_counts_cpu_time_not_waiting_and_has_its_backstop():
    """A segment's search is bounded in CPU time (Deadline.cpu): waiting (a loaded machine) does not spend
    it, computing does; the call's wall-clock deadline behind it (`also`) still stops it, and names itself."""
    deadline = Deadline.cpu(0.2)
    time.sleep(0.3)
    assert not deadline.expired() and deadline.left() > 0.1
    _spin(0.25)
    assert deadline.expired()
    with pytest.raises(TimeLimit, match="CPU-time limit") as exc:
        deadline.check("saturate")
    assert exc.value.cpu and exc.value.stage == "saturate"
    behind = Deadline.cpu(100, also=Deadline(0.0))
    assert behind.expired() and behind.left() == 0.0
    with pytest.raises(TimeLimit) as exc:
        behind.check("extract")
    assert not exc.value.cpu                     # the wall-clock backstop passed, not the CPU budget
    part = Deadline.cpu(100).part(0.5)
    assert part.counts_cpu and 49 < part.seconds < 50 + 1e-9    # half of what is left (a float's rounding)
    assert Deadline.never().part(0.5).left() == float("inf")


def test_saturation_under_a_cpu_deadline_stops_in_cpu_time_with_its_e_graph():
    """The child counts its own CPU time: a saturation limit in CPU seconds stops the run where it is,
    and the e-graph reached comes back for extraction (the best found so far)."""
    graph = capture(chain(300), (X, W)).graph
    enc = encode(graph)
    from superopt.egraph.runner import Phase
    run, frozen = saturate_isolated(enc.egraph, [Phase("algebra", RULESETS["algebra"])],
                                    Limits(saturation_seconds=0.05), Deadline.cpu(60))
    assert run.stop_reason is StopReason.TIME_LIMIT and frozen is not None, run
    extract(frozen, enc, load_target("cpu"))     # a program from what was reached


@pytest.mark.slow
def test_the_kernel_stops_a_saturating_child_at_its_cpu_limit():
    """Where one egglog call overruns, RLIMIT_CPU stops the child (SIGXCPU) once its CPU time is spent."""
    import signal

    from superopt.egraph.isolate import _cap_cpu
    pid = os.fork()
    if pid == 0:   # pragma: no cover - the child
        try:
            _cap_cpu(0.5)
            _spin(30)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU


@pytest.mark.slow
def test_a_tiny_limit_keeps_the_original_and_says_so():
    fn = lambda a, b: jnp.tanh(a @ b) + 1.0   # noqa: E731
    fast = superopt(fn, limits=Limits(seconds=1e-3))
    np.testing.assert_allclose(fast(X, W), jax.jit(fn)(X, W), rtol=1e-6)
    assert re.match(rf"kept original: time limit \(({STAGES}): the call's 0.001 s ran out\)", fast.report.outcome)
    assert fast.report.run.stop_reason is StopReason.TIME_LIMIT


@pytest.mark.slow
def test_a_program_verified_after_the_deadline_is_not_returned(monkeypatch):
    from superopt import stages

    def fn(a, b):
        return jnp.diag(a @ b)   # the diagonal of a product, without the product: a cheaper program

    X, W = (np.random.default_rng(k).standard_normal((128, 128)).astype(np.float32) for k in (2, 3))
    warm = superopt(fn)
    warm(X, W)
    assert warm.report.optimized, warm.report.outcome   # the rule cache and JAX are warm from here on
    calls = []

    seconds = 5.0   # room to saturate and extract on a loaded machine; the verification overruns it

    def slow_verify(*args, **kwargs):   # a verification that passes, but only after the deadline
        calls.append(time.perf_counter())
        time.sleep(max(0.0, start + seconds + 0.1 - time.perf_counter()))
        return None

    monkeypatch.setattr(stages.verification, "verify", slow_verify)
    fast = superopt(fn, limits=Limits(seconds=seconds))
    start = time.perf_counter()
    fast.compile(X, W)
    np.testing.assert_allclose(fast(X, W), jax.jit(fn)(X, W), rtol=1e-5, atol=1e-5)
    assert calls, fast.report.outcome
    assert fast.report.outcome == "kept original: time limit (verify: the call's 5 s ran out)"
    assert fast.report.run.stop_reason is StopReason.TIME_LIMIT
    spec = fast._specialization()
    assert spec.term is spec.original    # the original runs
