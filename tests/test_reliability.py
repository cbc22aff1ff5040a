"""Bad input gets a clear error and loses nothing; limits hold; a crash in egglog is isolated; the same
input gives the same program and report. Figures for RELIABILITY.md come from these tests."""
import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from superopt import Limits, StopReason, VerificationWarning, available_targets, superopt
from superopt.egraph.capture import capture
from superopt.egraph.encode import encode
from superopt.egraph.runner import NODE_SLACK, Phase, _rows, saturate
from superopt.rewrites.pattern import add, mul, sub, tensors, unary
from superopt.rewrites.rule import RuleSet, rule
from superopt.rewrites.schedule import Schedule
from superopt.core.verify import compare_outputs
from superopt.report import stop_phrase

RNG = np.random.default_rng(0)


def _flat(tree) -> list:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def _same(fast, fn, *args) -> None:
    """The optimized call returns what `fn` returns, NaN and Inf in the same places."""
    expected, actual = _flat(jax.jit(fn)(*args)), _flat(fast(*args))
    assert compare_outputs(expected, actual) is None


def mlp(x, w, b, v):
    return jnp.tanh((x @ w + b) * 2.0) @ v


MLP_ARGS = tuple(RNG.standard_normal(s).astype(np.float32) for s in [(8, 32), (32, 64), (64,), (64, 4)])


# ---- clear errors ----

def test_unknown_target_lists_every_valid_target():
    with pytest.raises(ValueError) as err:
        superopt(mlp, target="tpu-v9")
    message = str(err.value)
    assert "unknown target 'tpu-v9'" in message
    assert all(t in message for t in available_targets())


def test_unknown_backend_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"backend 'emulator' is not available for target 'cpu'; valid: jax"):
        superopt(mlp, target="cpu", backend="emulator")


@pytest.mark.slow
@pytest.mark.parametrize("bad, where", [
    (("weights.npy",), r"of type <class 'str'> and was passed to the function at path a\b"),
    ((object(),), r"of type <class 'object'> and was passed to the function at path a\b"),
    (({"x": MLP_ARGS[0], "note": "cold"},), r"of type <class 'str'> .* at path a\['note'\]"),
])
def test_arguments_that_are_not_arrays_are_a_clear_error_and_lose_nothing(bad, where):
    """As jax.jit refuses them, naming the leaf and saying to make it static; filter=True makes it static."""
    fast = superopt(lambda a: jax.tree_util.tree_leaves(a)[0] * 2.0)
    with pytest.raises(TypeError, match=where + r"(.|\n)*not marked as static"):
        fast(*bad)
    _same(fast, lambda a: a * 2.0, MLP_ARGS[0])   # the callable still works afterwards
    assert len(fast._cache) == 1
    if isinstance(bad[0], dict):
        filtered = superopt(lambda a: a["x"] * 2.0, filter=True)
        np.testing.assert_array_equal(filtered(bad[0]), bad[0]["x"] * 2.0)


@pytest.mark.slow
def test_new_shapes_and_dtypes_specialize_again_as_jit_does():
    fast = superopt(mlp)
    _same(fast, mlp, *MLP_ARGS)
    first = fast.report
    small = tuple(a[..., :3] if a.ndim else a for a in MLP_ARGS[:1]) + tuple(
        RNG.standard_normal(s).astype(np.float32) for s in [(3, 5), (5,), (5, 2)])
    _same(fast, mlp, *small)
    half = tuple(a.astype(np.float16) for a in MLP_ARGS)
    _same(fast, mlp, *half)
    assert len(fast._cache) == 3 and fast.report is not first
    _same(fast, mlp, *MLP_ARGS)
    assert fast.compile(*MLP_ARGS).report is first and len(fast._cache) == 3


def _with_specials(x: np.ndarray) -> np.ndarray:
    x = x.copy()
    flat = x.reshape(-1)
    flat[[0, 7, 19]] = [np.nan, np.inf, -np.inf]
    return x


@pytest.mark.slow
@pytest.mark.parametrize("fn, shapes", [
    (lambda a, b, v: (a @ b) @ v, [(64, 64), (64, 64), (64, 2)]),                    # matmul-assoc
    (lambda x: jnp.exp(x) * 2.0 + jnp.tanh(x) * x + 1.0, [(16, 32)]),                # elementwise fusion
    (lambda x: jax.nn.softmax(x, axis=-1), [(16, 32)]),                              # a row kernel
    (lambda x, w: jax.nn.relu(x @ w + 1.0).sum(-1), [(16, 32), (32, 8)]),            # matmul with epilogue
], ids=["matmul-chain", "elementwise", "softmax", "matmul-epilogue"])
def test_nan_and_inf_propagate_exactly_as_in_the_original(fn, shapes):
    args = [_with_specials(RNG.standard_normal(s).astype(np.float32)) for s in shapes]
    # A GPU target: its model prices these fusions (on cpu XLA makes them by itself and the original runs);
    # the rewritten program runs here, through JAX.
    fast = superopt(fn, target="gpu-h100")
    with np.errstate(all="ignore"):
        expected, actual = _flat(jax.jit(fn)(*args)), _flat(fast(*args))
    assert fast.report.optimized, fast.report.outcome   # a rewritten program, not the original
    for e, a in zip(expected, actual):
        assert np.array_equal(np.isnan(e), np.isnan(a))
        assert np.array_equal(np.where(np.isinf(e), e, 0), np.where(np.isinf(a), a, 0))
        assert np.isnan(e).any() or np.isinf(e).any()   # the specials reached the output
    assert compare_outputs(expected, actual) is None


@pytest.mark.slow
@pytest.mark.parametrize("target", ["cpu", "npu-910b"])
@pytest.mark.parametrize("fn, shapes", [
    (lambda a, b: jnp.tanh(a @ b) + 1.0, [(0, 5), (5, 3)]),
    (lambda a, b: a @ b, [(4, 0), (0, 3)]),
    (lambda a: (a * 2.0 + 1.0).sum(0), [(0, 5)]),
    (lambda a: jax.nn.softmax(a, axis=-1), [(3, 0)]),
], ids=["empty-rows", "empty-contraction", "empty-reduction", "empty-softmax"])
def test_empty_tensors(fn, shapes, target):
    args = [np.zeros(s, np.float32) for s in shapes]
    fast = superopt(fn, target=target)
    expected, actual = _flat(jax.jit(fn)(*args)), _flat(fast(*args))
    assert [e.shape for e in expected] == [a.shape for a in actual]
    assert compare_outputs(expected, actual) is None


def test_a_program_without_outputs_or_with_none_arguments():
    fast = superopt(lambda a, b: None)
    assert fast(None, MLP_ARGS[0]) is None
    assert fast.report.outcome.startswith("kept original")


# ---- limits ----

def chain_program(n_ops: int):
    """An elementwise chain of `n_ops` ops, then a matmul."""
    def program(x, w):
        h = x
        for _ in range(n_ops // 5):
            h = jnp.tanh(h * 1.01 + 0.5) - h * 0.5
        return h @ w
    return program


@pytest.mark.slow
def test_a_5000_op_program_finishes_within_its_limits_and_says_why_it_stopped():
    program = chain_program(5000)
    x, w = RNG.standard_normal((8, 16)).astype(np.float32), RNG.standard_normal((16, 4)).astype(np.float32)
    limits = Limits(seconds=8.0)
    start = time.perf_counter()
    fast = superopt(program, limits=limits)
    out = fast(x, w)
    seconds = time.perf_counter() - start
    report = fast.report
    assert sum(report.ops_before.values()) >= 5000
    assert report.run.stop_reason is not StopReason.ERROR
    assert stop_phrase(report.run.stop_reason) in str(report)
    assert report.run.seconds <= limits.seconds * NODE_SLACK
    np.testing.assert_allclose(out, jax.jit(program)(x, w), rtol=1e-4, atol=1e-4)
    print(f"\n5000-op program: {seconds:.1f} s in all; {report.run.stop_reason.value}; stages "
          + ", ".join(f"{k} {v:.2f} s" for k, v in report.stage_seconds.items()))


x, y, z = tensors("x y z")
EXPLODING = RuleSet("exploding", [  # commutativity, associativity and distributivity: the e-graph explodes
    rule("add-commutes", add(x, y), add(y, x), doc="x+y = y+x"),
    rule("add-associates", add(add(x, y), z), add(x, add(y, z)), two_way=True, doc="(x+y)+z = x+(y+z)"),
    rule("mul-commutes", mul(x, y), mul(y, x), doc="x*y = y*x"),
    rule("mul-distributes", mul(x, add(y, z)), add(mul(x, y), mul(x, z)), two_way=True, doc="x(y+z) = xy+xz"),
])


def horner(*xs):
    out = xs[0]
    for v in xs[1:]:
        out = out * 1.5 + v
    return out


HORNER_ARGS = tuple(RNG.standard_normal((3,)).astype(np.float32) for _ in range(14))


@pytest.mark.parametrize("nodes", [5_000, 20_000, 100_000])
def test_the_node_limit_holds_on_an_exploding_rule_set(nodes):
    egraph = encode(capture(horner, HORNER_ARGS).graph).egraph
    report = saturate(egraph, [Phase("exploding", tuple(EXPLODING), backoff=None)],
                      Limits(iterations=100, nodes=nodes, seconds=60))
    assert report.stop_reason is StopReason.NODE_LIMIT
    assert _rows(egraph) <= nodes * NODE_SLACK
    print(f"\nnode limit {nodes}: stopped at {_rows(egraph)} rows ({_rows(egraph) / nodes:.0%}), "
          f"{report.iterations} iterations, {report.seconds:.2f} s")


@pytest.mark.slow
def test_an_exploding_rule_set_returns_a_correct_program_within_the_node_limit():
    fast = superopt(horner, rulesets=[EXPLODING], limits=Limits(iterations=100, nodes=20_000, seconds=60,
                                                                  saturation_seconds=60))
    _same(fast, horner, *HORNER_ARGS)
    assert fast.report.run.stop_reason is StopReason.NODE_LIMIT


def test_the_time_limit_holds_when_one_rule_application_overruns_it():
    limits = Limits(iterations=100, nodes=10**9, seconds=1.0)   # no node limit to stop it first
    fast = superopt(horner, rulesets=[EXPLODING], limits=limits)
    _same(fast, horner, *HORNER_ARGS)
    run = fast.report.run
    assert run.stop_reason is StopReason.TIME_LIMIT
    assert run.seconds <= limits.seconds * NODE_SLACK + 0.1   # the kill comes at 1.1x; reaping takes a moment
    assert "time limit plus 10%" in fast.report.outcome
    print(f"\ntime limit 1 s: saturation ended after {run.seconds:.3f} s "
          f"(stage {fast.report.stage_seconds['saturate']:.3f} s)")


@pytest.mark.slow
def test_the_memory_limit_holds():
    limits = Limits(iterations=100, nodes=10**9, seconds=60, memory=50 << 20)
    fast = superopt(horner, rulesets=[EXPLODING], limits=limits)
    _same(fast, horner, *HORNER_ARGS)
    assert fast.report.run.stop_reason is StopReason.MEMORY_LIMIT
    assert "memory limit" in fast.report.outcome
    print(f"\nmemory limit 50 MiB: out of memory after {fast.report.run.seconds:.2f} s")


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="Limits.memory"):
        Limits(memory=0)


# ---- crashes and panics inside egglog ----

def test_a_panic_inside_egglog_is_reported_and_the_original_returned():
    from egglog import eq, panic, rule as egg_rule, var
    from superopt.egraph import terms as T

    class PanickingRule:   # what the rule DSL cannot write: an egglog rule whose action is `panic`
        name, pairs, two_way, numerics = "panics-on-tanh", (), False, "exact"
        egg = (egg_rule(eq(var("t", T.Tensor)).to(T.unary("tanh", var("u", T.Tensor)))).then(
            panic("a rule set that panics")),)

    fast = superopt(mlp, rulesets=Schedule([Phase("panics", (PanickingRule(),))]))
    _same(fast, mlp, *MLP_ARGS)
    report = fast.report
    assert report.run.stop_reason is StopReason.ERROR
    assert "a rule set that panics" in report.run.error
    assert report.outcome.startswith("kept original: saturation failed")


class PanicException(BaseException):
    """What pyo3 raises for a Rust panic: a BaseException, so `except Exception` does not catch it."""


def _crash(how: str, original):
    parent = os.getpid()

    def run(*args, **kwargs):
        if os.getpid() == parent:   # the caller's own runs (registering rule sets in its template) work
            return original(*args, **kwargs)
        if how == "panic":
            raise PanicException("called `Option::unwrap()` on a `None` value")
        os.kill(os.getpid(), signal.SIGSEGV if how == "segfault" else signal.SIGABRT)
    return run


@pytest.mark.parametrize("how, says", [
    ("panic", "PanicException: called `Option::unwrap()`"),
    ("segfault", "egglog crashed (signal SIGSEGV)"),
    ("abort", "egglog crashed (signal SIGABRT)"),
])
def test_a_crash_inside_egglog_is_isolated(monkeypatch, how, says):
    import egglog
    from superopt.egraph import egglog_api, runner
    # egglog crashes in the child saturating, whether a run goes through the expression layer or the bindings
    monkeypatch.setattr(egglog.EGraph, "run", _crash(how, egglog.EGraph.run))
    monkeypatch.setattr(egglog_api, "run_commands", _crash(how, egglog_api.run_commands))
    primed = set(runner._RAN)
    fast = superopt(mlp)
    _same(fast, mlp, *MLP_ARGS)
    assert set(runner._RAN) == primed   # what the crashed child registered is never registered in this process
    report = fast.report
    assert report.run.stop_reason is StopReason.ERROR
    assert says in report.run.error
    assert report.outcome.startswith("kept original: saturation failed")


@pytest.mark.slow
def test_an_unsound_user_rule_is_caught_named_and_the_original_kept():
    mine = RuleSet("mine", [
        rule("sub-commutes", sub(x, y), sub(y, x), doc="wrong on purpose: x-y = y-x"),
        rule("tanh-is-identity", unary("tanh", x), x, doc="wrong on purpose: tanh(x) = x"),
    ])

    def program(a, b):
        return (a - b) * 2.0 + jnp.tanh(a @ b.T) @ a

    args = MLP_ARGS[0], MLP_ARGS[0][::-1].copy()
    fast = superopt(program, rulesets=["algebra", mine, "fusion"])
    with pytest.warns(VerificationWarning, match="tanh-is-identity"):
        out = fast(*args)
    assert compare_outputs(_flat(jax.jit(program)(*args)), _flat(out)) is None
    assert fast.report.outcome.startswith("kept original: verification failed")


# ---- determinism ----

DETERMINISM = r'''
import json, sys
import jax, jax.numpy as jnp, numpy as np
from superopt import superopt

def program(x, w1, b1, w2, v):
    h = jax.nn.relu(x @ w1 + b1)
    s = jax.nn.softmax(h @ w2, axis=-1)
    return (s @ w2.T) @ v, jnp.tanh(x * 2.0 + 1.0).sum(-1)

rng = np.random.default_rng(0)
args = [rng.standard_normal(s).astype(np.float32) for s in [(16, 32), (32, 64), (64,), (64, 48), (64, 2)]]
out = {}
for target in sys.argv[1:]:
    fast = superopt(program, target=target)
    fast(*args)
    r = fast.report
    out[target] = {"term": fast.term, "outcome": r.outcome, "stop": r.run.stop_reason.value,
                   "iterations": r.run.iterations, "enodes": r.run.enodes, "eclasses": r.run.eclasses,
                   "matches": r.run.matches, "cost": [r.cost_before, r.cost_after], "ops": [r.ops_before, r.ops_after],
                   "extraction": r.extraction, "declined": r.declined, "top": r.top_costs, "backend": r.backend,
                   "npu": r.npu_lines}
print(json.dumps(out, sort_keys=True, default=str))
'''
TARGETS = ("cpu", "gpu-h100", "npu-910b")


def _fingerprints(seeds) -> list[str]:
    """The chosen term and report (all but timings) from fresh processes, one per hash seed, run together."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    procs = [subprocess.Popen([sys.executable, "-c", DETERMINISM, *TARGETS], cwd=root, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              env={**os.environ, "PYTHONHASHSEED": str(s)}) for s in seeds]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    return outs


@pytest.mark.slow
def test_the_same_input_gives_the_same_term_and_report_across_processes_and_hash_seeds():
    first, second = _fingerprints([1, 2])
    assert first == second
    report = json.loads(first)
    assert set(report) == set(TARGETS)
    # rewritten on the GPU and NPU targets; on cpu XLA fuses this program by itself (extract/xla.py)
    assert all(report[t]["outcome"] == "optimized" for t in ("gpu-h100", "npu-910b"))


@pytest.mark.slow
def test_the_same_input_gives_the_same_term_and_report_in_one_process():
    runs = []
    for _ in range(2):
        fast = superopt(mlp, target="npu-910b")
        fast(*MLP_ARGS)
        r = fast.report
        runs.append((fast.term, r.outcome, r.run.stop_reason, r.run.iterations, r.run.enodes, r.run.matches,
                     r.cost_before, r.cost_after, r.extraction, r.top_costs, r.npu_lines))
    assert runs[0] == runs[1]
