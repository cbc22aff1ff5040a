"""Candidate enumeration and Spearman's rank correlation."""
import jax.numpy as jnp
import pytest

from superopt.egraph.capture import capture
from superopt.egraph.encode import encode
from superopt.egraph.frozen import freeze
from superopt.core.ir import pretty
from superopt.egraph.runner import Limits, Phase, saturate
from superopt.extract.candidates import candidates, spearman
from superopt.extract.target import load_target
from superopt.rulesets import RULESETS


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2], [5, 6, 7]) == pytest.approx(0.866, abs=1e-3)   # ties share their average rank
    assert spearman([1, 2, 3], [3, 1, 2]) == pytest.approx(-0.5)


@pytest.mark.slow
def test_a_four_matrix_chain_yields_its_five_association_orders():
    shapes = [(64, 32), (32, 16), (16, 48), (48, 8)]
    args = tuple(jnp.ones(s) for s in shapes)
    enc = encode(capture(lambda a, b, c, d: a @ b @ c @ d, args).graph)
    saturate(enc.egraph, [Phase("algebra", RULESETS["algebra"])], Limits())
    found = candidates(freeze(enc.egraph), enc, load_target("cpu"), limit=10)
    assert len(found) == 5 and len({pretty(c.graph) for c in found}) == 5
    assert [c.cost for c in found] == sorted(c.cost for c in found)
    assert all(c.graph.op_counts()["matmul"] == 3 for c in found)
