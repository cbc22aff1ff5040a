"""Whole-program equivalence: for every corpus program, superopt(fn) equals fn on random inputs.

Several programs are checked per corpus entry: the optimized callable superopt returns, the extracted
term lowered even when superopt would keep the original (so the rewrite-and-lower path is tested on
every program, not only where it pays), the captured program lowered unchanged (capture + lowering
round trip), and the kernels extracted after fusion for a CPU, a GPU and an NPU target.
"""
import jax
import numpy as np
import pytest
from hypothesis import given, strategies as st

from corpus import CORPUS, make_args
from superopt import superopt
from superopt.core.ir import pretty
from superopt.egraph.capture import capture
from superopt.egraph import encode as encoding
from superopt.egraph import runner
from superopt.egraph.frozen import freeze
from superopt.egraph.runner import Limits, Phase, saturate
from superopt.extract.greedy import extract
from superopt.extract.target import load_target
from superopt.lowering.jax import lower
from superopt.rulesets import RULESETS
from superopt.core.verify import compare_outputs

pytestmark = pytest.mark.slow   # whole models, worker processes or long searches: make test, not test-fast

_built: dict[str, tuple] = {}


def _programs(prog):
    """(optimized callable, forced extraction, captured round trip, the fused programs per target, the forced
    extraction's graph), built once per program."""
    if prog.name not in _built:
        args = make_args(prog, 0)
        optimized = superopt(prog.fn)
        optimized.compile(*args)
        captured = capture(prog.fn, args)
        with encoding.scratch(runner.prime) as empty:   # as superopt's search saturates (tests/searching.py)
            enc = encoding.encode(captured.graph, egraph=empty)
            saturate(enc.egraph, [Phase("algebra", list(RULESETS["algebra"]))], Limits())
            forced = extract(freeze(enc.egraph), enc, load_target("cpu"))
            # With fusion too, extracted for each kind of target: kernels differ, meaning must not.
            saturate(enc.egraph, [Phase("fusion", list(RULESETS["fusion"]))], Limits())
            frozen = freeze(enc.egraph)
        kernels = [lower(extract(frozen, enc, load_target(t)).graph) for t in FUSION_TARGETS]
        _built[prog.name] = (optimized, lower(forced.graph), lower(captured.graph), kernels, forced.graph)
    return _built[prog.name]


FUSION_TARGETS = ("cpu", "gpu-h100", "npu-910b")


def _flat(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


@pytest.mark.parametrize("prog", CORPUS, ids=[p.name for p in CORPUS])
@given(seed=st.integers(0, 2**31 - 1))
def test_superopt_equals_original(prog, seed):
    args = make_args(prog, seed)
    expected = _flat(prog.fn(*args))
    optimized, forced, roundtrip, kernels, _ = _programs(prog)
    flat_args = jax.tree_util.tree_leaves(args)
    assert compare_outputs(expected, _flat(optimized(*args))) is None
    assert compare_outputs(expected, _flat(forced(*flat_args))) is None
    assert compare_outputs(expected, _flat(roundtrip(*flat_args))) is None
    for target, fused in zip(FUSION_TARGETS, kernels):
        assert compare_outputs(expected, _flat(fused(*flat_args))) is None, f"fused for {target}"


def test_corpus_is_large_and_varied():
    assert len(CORPUS) >= 10
    dtypes = {dtype for prog in CORPUS for _, dtype in prog.arg_specs}
    assert {"float32", "bfloat16", "float16"} <= dtypes


def test_some_corpus_programs_are_rewritten():
    """The corpus exercises the rules: extracted with the algebra rules, most programs come out different
    from how they went in. On cpu, where most run as XLA fuses and simplifies them by itself
    (extract/xla.py), superopt returns a changed program only where that gains: the fp16 softmax, one
    kernel with the matmul before it; not the identities of transpose_identity_noise (x.T.T * 1 + 0,
    cancelling transposes), which XLA's simplifier removes from the original too (tests/test_xla_cost.py)."""
    rewritten = [p.name for p in CORPUS if pretty(_programs(p)[4]) != pretty(capture(p.fn, make_args(p, 0)).graph)]
    assert len(rewritten) >= len(CORPUS) // 2, rewritten
    assert "transpose_identity_noise" in rewritten
    changed = [p.name for p in CORPUS if _programs(p)[0].report.optimized]
    assert "fp16_upcast_softmax" in changed and "transpose_identity_noise" not in changed, changed
