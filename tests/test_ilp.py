"""ILP extraction: optimal on small graphs, never worse than greedy, strictly better where greedy double-counts."""
import jax.numpy as jnp
import numpy as np
import pytest
from egglog import EGraph, String, set_, union

from corpus import CORPUS, make_args
import searching
from superopt import superopt
from superopt.egraph import terms as T
from superopt.egraph.analysis import analysis, facts
from superopt.egraph.capture import capture
from superopt.egraph.encode import Encoding
from superopt.egraph.frozen import freeze
from superopt.core.ir import Graph
from superopt.egraph.runner import Limits, Phase
from superopt.extract.extraction import Method
from superopt.extract.greedy import extract, program_cost
from superopt.extract.ilp import extract_ilp
from superopt.extract.target import Target, load_target
from superopt.rulesets import RULESETS

# A target where a 64^3 matmul costs 525 us and two chained exps on 64x64 cost about 395 us.
SYNTHETIC = Target("synthetic", "cpu", peak_flops=1e9, mem_bandwidth=1e15, launch_overhead=1e-6,
                   transcendental_flops=48)


def shared_product_egraph():
    """add(P, Q) where P = neg(S) = exp(exp(A)) and Q = abs(S) = tanh(tanh(A)), S = A @ B.

    Alone, each of P and Q is cheaper through its own exp/tanh chain (395 us) than through S (530 us),
    which is what greedy sees; together they are cheapest sharing S (540 us in all, against 795 us)."""
    eg = EGraph()
    eg.register(*facts())
    a, b = T.arg(0), T.arg(1)
    eg.register(*(set_(T.shape(v)).to(T.ints((64, 64))) for v in (a, b)),
                *(set_(T.dtype(v)).to(String("float32")) for v in (a, b)))
    s = T.matmul(a, b, "float32")
    p, q = T.unary("neg", s), T.unary("abs", s)
    eg.register(T.output(0, T.binary("add", p, q)))
    eg.register(union(p).with_(T.unary("exp", T.unary("exp", a))), union(q).with_(T.unary("tanh", T.unary("tanh", a))))
    eg.run(analysis().saturate())
    return eg, Encoding(eg, Graph(n_args=2))


def test_ilp_is_strictly_better_where_greedy_double_counts():
    eg, enc = shared_product_egraph()
    fz = freeze(eg)
    greedy, ilp = extract(fz, enc, SYNTHETIC), extract_ilp(fz, enc, SYNTHETIC)
    assert greedy.graph.op_counts().get("matmul", 0) == 0           # greedy: two private chains
    assert ilp.graph.op_counts()["matmul"] == 1                      # ILP: one shared product
    assert ilp.cost < greedy.cost * 0.75
    assert (ilp.method.extractor, ilp.method.detail) == ("ilp", "optimal")


@pytest.mark.slow
def test_ilp_result_evaluates_like_the_greedy_one():
    a, b, v = jnp.ones((64, 64)), jnp.ones((64, 64)), jnp.ones((64, 1))
    fast = superopt(lambda a, b, v: (a @ b, (a @ b) @ v), extractor="ilp")
    outs = fast(a, b, v)
    np.testing.assert_allclose(outs[1], (a @ b) @ v)
    assert "extracted by ilp (optimal)" in str(fast.report) or fast.report.outcome.startswith("kept original")


@pytest.mark.slow
@pytest.mark.parametrize("prog", CORPUS, ids=[p.name for p in CORPUS])
def test_ilp_is_never_worse_than_greedy_and_proves_small_graphs(prog):
    captured = capture(prog.fn, make_args(prog, 0))
    enc, _, fz = searching.saturated(captured.graph, [Phase("algebra", RULESETS["algebra"])], Limits())
    cpu = load_target("cpu")
    greedy, ilp = extract(fz, enc, cpu), extract_ilp(fz, enc, cpu)
    assert ilp.cost <= greedy.cost * (1 + 1e-12)
    assert ilp.cost == pytest.approx(program_cost(ilp.graph, cpu)[0])
    assert ilp.method.detail == "optimal" or ilp.method.detail.startswith("cheaper than the ILP")


def test_unknown_extractor_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown extractor 'magic'; valid: greedy, ilp"):
        superopt(lambda a: a, extractor="magic")


def test_ilp_orders_only_the_classes_on_a_cycle():
    """Order variables (and their weak big-M constraints) only where a choice could be cyclic: b <-> c here."""
    from collections import namedtuple
    from superopt.extract.ilp import _cycle_components
    Node = namedtuple("Node", "eclass children")
    members = {"a": [Node("a", ("b",))], "b": [Node("b", ("c",)), Node("b", ())], "c": [Node("c", ("b", "e"))],
               "d": [Node("d", ("a", "a"))], "e": [Node("e", ("e",))]}
    components = _cycle_components(members)
    assert set(components) == {"b", "c"} and components["b"] == components["c"]


def test_ilp_choice_does_not_depend_on_the_machines_speed():
    """HiGHS runs on one thread to a node budget; on a machine 50 times slower (simulated) the same e-graph
    gives the same program, proven the same way."""
    from superopt.core.deadline import slowed
    eg, enc = shared_product_egraph()
    fz = freeze(eg)
    idle = extract_ilp(fz, enc, SYNTHETIC)
    with slowed(50):
        busy = extract_ilp(fz, enc, SYNTHETIC)
    assert busy.method == idle.method == Method("ilp", "optimal")
    assert busy.graph.op_counts() == idle.graph.op_counts() and busy.cost == idle.cost


def test_the_ilp_says_which_limit_stopped_it():
    from superopt.extract.ilp import NODE_BUDGET, _proof
    assert _proof("Optimal", 20.0) == "optimal"
    assert _proof("Solution limit reached", 20.0) == f"best within {NODE_BUDGET} nodes"
    assert _proof("Time limit reached", 20.0) == "stopped by the time backstop, 20 s"
