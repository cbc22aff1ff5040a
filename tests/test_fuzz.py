"""Fuzzing: random well-typed programs (tests/fuzzing.py) through superopt, for every target and backend.

Three properties:

1. `superopt(program)` returns what the program returns, for every target and every backend that target
   offers (as superopt lists them: JAX everywhere, the NPU emulator on NPU targets, Pallas on GPU targets),
   under the numerics contract of numerics="strict" as superopt.core.verify judges it (`verify.judge`: NaN and
   +-inf where the original has them, finite values within the dtype's tolerance or as accurate as the
   original against its float64 value), exact for integer programs, on the NPU emulator as on JAX (its
   outputs are checked against the user's program at their own dtype's tolerance). On random inputs
   and on one drawn input set (`fuzzing.draw_inputs`: zeros and integer extremes, NaN and inf, or float
   arguments scaled to just below where the original overflows), never the inputs superopt verified
   with. Saturation ends without an error, and no backend fails to lower a term with an error or
   produces a program its own check rejects.
2. The program extracted for each target from one saturation computes the original's values in exact
   (float64) arithmetic, whether or not superopt would choose it over the original, and one of them
   lowered to JAX returns what the program returns: under the strict contract, on random and drawn
   inputs, where no rule that can change overflow fired; else under the fast one, on random inputs.
   Rules, extraction and kernel bodies are tested on every program, not only where the cost model says
   a rewrite pays.
3. For programs that call functions with custom derivative rules (the generator's "custom" kind: relu,
   gradient clipping, straight-through rounding, ... at their kinks), the float outputs of
   `superopt(program)`, their `jax.vjp` on a random cotangent and, where the program has no custom_vjp,
   their `jax.jvp` on a random tangent equal `jax.jit(program)`'s (at the outputs' tolerance), whether
   superopt's program is called first, differentiated first, or differentiated under `jax.jit`.

Properties 1 and 2 run on the generator's mixed programs and on each of its kinds (`fuzzing.KINDS`): integer
programs whose products wrap, histogram-like programs with values on their bin edges, float64 programs
(under `jax.enable_x64`) and programs with loops and branches (scan, fori_loop, while_loop, cond, nested), each on its own inputs (`fuzzing.first_args`, `draw_inputs`), with a target and
backend drawn per program; property 3 on the loops kind too, on finite inputs. For every kind, no warning of superopt's own (a numpy RuntimeWarning) reaches
the caller.

CI runs a bounded budget with fixed seeds (the same programs every run): 6 mixed programs per target and
backend through superopt and 45 extracted for every target; 3 of each kind through superopt and 5
extracted; 5 differentiated, and 3 loop programs differentiated. `make fuzz` sets SUPEROPT_FUZZ=long for a longer randomized run. Programs are
small and limits are tight (`FUZZ_LIMITS`) so the budget fits in CI: what is fuzzed is meaning, not search
depth. A failing example prints as source; its regression test goes to tests/test_regressions.py.
"""
import json
import os
import warnings
import zlib
from collections import Counter

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, assume, given, seed, settings
from hypothesis import strategies as st

from fuzzing import KINDS, agrees, draw_inputs, first_args, narrowest_float, programs, same_value
from searching import saturated
from superopt import numerics as numerics_mode
from superopt import Limits, StopReason, VerificationWarning, available_targets, superopt
from superopt.egraph.capture import capture
from superopt.extract.greedy import extract
from superopt.extract.target import load_target
from superopt.lowering.jax import lower
from superopt.rewrites.schedule import Schedule
from superopt.rulesets import DEFAULT
from superopt.core.dtypes import is_float
from superopt.core.verify import compare_outputs

pytestmark = pytest.mark.slow   # whole models, worker processes or long searches: make test, not test-fast

LONG = os.environ.get("SUPEROPT_FUZZ") == "long"
FUZZ_LIMITS = Limits(iterations=4, nodes=8_000, seconds=3.0)
TARGETS = tuple(available_targets())
PER_COMBO = int(os.environ.get("SUPEROPT_FUZZ_PER_COMBO", "200" if LONG else "6"))
EXTRACTED = int(os.environ.get("SUPEROPT_FUZZ_EXTRACTED", "1500" if LONG else "45"))
PER_KIND = int(os.environ.get("SUPEROPT_FUZZ_PER_KIND", "100" if LONG else "3"))
EXTRACTED_PER_KIND = int(os.environ.get("SUPEROPT_FUZZ_EXTRACTED_PER_KIND", "100" if LONG else "5"))
DIFFERENTIATED = int(os.environ.get("SUPEROPT_FUZZ_DIFFERENTIATED", "150" if LONG else "5"))
NEW_KINDS = tuple(kind for kind in KINDS if kind not in ("mixed", "custom"))
STATS: dict = {"superopt": Counter(), "extracted": Counter(), "outcomes": Counter(), "stop": Counter(),
               "ops": Counter(), "backend": Counter(), "inputs": Counter(), "lowered": Counter(),
               "kinds": Counter(), "differentiated": Counter()}


def _backends(target: str) -> list[str]:
    """The backends superopt accepts for `target`, as its error for an unknown one lists them (so a new
    backend is fuzzed as soon as it lands)."""
    with pytest.raises(ValueError, match="valid: ") as err:
        superopt(lambda x: x, target=target, backend="no-such-backend")
    return str(err.value).split("valid: ", 1)[1].split(", ")


COMBOS = [(t, b) for t in TARGETS for b in _backends(t)]


def _settings(examples: int, salt: str):
    """CI: a fixed seed per test (reproducible); `make fuzz`: fresh programs every run. With
    SUPEROPT_FUZZ_SHRINK=0 a failing example is reported as drawn, not shrunk (shrinking a fuzzed program
    can take minutes)."""
    phases = [p for p in Phase if p is not Phase.shrink or os.environ.get("SUPEROPT_FUZZ_SHRINK", "1") != "0"]
    chosen = settings(max_examples=examples, deadline=None, derandomize=False, database=None,
                      suppress_health_check=list(HealthCheck), print_blob=True, phases=phases)
    return chosen if LONG else (lambda f: seed(zlib.crc32(salt.encode()))(chosen(f)))


def _flat(tree) -> list:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


@pytest.fixture(scope="module", autouse=True)
def _write_stats():
    """With SUPEROPT_FUZZ_STATS=path, the counts behind RELIABILITY.md are written there."""
    yield
    path = os.environ.get("SUPEROPT_FUZZ_STATS")
    if path:
        with open(path, "w") as f:
            json.dump({k: {" / ".join(map(str, key)) if isinstance(key, tuple) else str(key): n
                           for key, n in v.items()} for k, v in STATS.items()}, f, indent=1, sort_keys=True)


def leaked(caught) -> list[str]:
    """The numpy RuntimeWarnings among `caught` (an overflow in a cast, in a norm): superopt's own, which
    must not reach the caller (the programs' own arithmetic runs in XLA, which warns of nothing)."""
    return [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if issubclass(w.category, RuntimeWarning)]


def check_superopt(program, target: str, backend: str, draw) -> None:
    """Property 1 on its kind's first inputs (seed 11: random, near the integer square roots, or on the grid
    of bin edges) and on a drawn input set (`draw_inputs`: random, zeros and integer extremes, NaN and inf,
    scaled to just below where the original overflows, or the kind's own), none of them the inputs
    superopt verifies on."""
    fn = program.function()
    args = first_args(program, 11)   # not the inputs superopt verifies on (seeds 0 and 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = superopt(fn, target=target, backend=backend, limits=FUZZ_LIMITS)
        spec = fast.compile(*args)
        actual = _flat(fast(*args))
    report = fast.report
    verification = any(issubclass(w.category, VerificationWarning) for w in caught)
    STATS["superopt"][(target, backend)] += 1
    STATS["kinds"][(program.kind, "through superopt")] += 1
    STATS["stop"][report.run.stop_reason.value] += 1
    STATS["outcomes"][report.outcome.split(":")[0] + (": verification" if verification else "")] += 1
    STATS["backend"][report.backend.runs] += 1
    assert report.run.stop_reason is not StopReason.ERROR, report.run.error
    # A backend may decline a term it cannot lower (then JAX runs it), but it must not produce a program
    # that its own check rejects, nor fail with an error.
    assert "failed verification" not in report.backend.fell_back and "failed on random" not in report.backend.fell_back, \
        report.backend
    assert "Pallas lowering failed" not in report.backend.fell_back, report.backend
    # Drawn whatever the outcome, so that Hypothesis replays the same draws when the outcome differs
    # (an optimization under a time limit can end differently on a busier machine).
    reference = jax.jit(lambda *a: jax.tree_util.tree_leaves(fn(*a)))
    where, drawn = draw_inputs(draw, program.args, reference, KINDS[program.kind].inputs)
    if program.kind != "mixed":
        assert not leaked(caught), leaked(caught)
    if spec.term is spec.original and backend == "jax":
        return                  # the original program runs under jax.jit: nothing was changed
    STATS["inputs"][where.split(" (")[0]] += 1
    # What the caller gets against the original under the contract, on every backend: the NPU emulator's
    # outputs are checked against the user's program at each output's own dtype (`npu_backend.py`), and a
    # call that differs returns the original's, so no fp16 widening here.
    problem = agrees(_flat(reference(*args)), actual, spec.original, args, program.exact)
    assert problem is None, f"{problem}, on {KINDS[program.kind].first} inputs (seed 11)\n{report}"
    problem = agrees(_flat(reference(*drawn)), _flat(fast(*drawn)), spec.original, drawn, program.exact)
    assert problem is None, f"{problem}, on {where}\n{report}"


@pytest.mark.parametrize("target, backend", COMBOS, ids=[f"{t}-{b}" for t, b in COMBOS])
def test_superopt_returns_what_the_program_returns(target, backend):
    @_settings(PER_COMBO, f"{target}/{backend}")
    @given(program=programs(), data=st.data())
    def run(program, data):
        check_superopt(program, target, backend, data.draw)
    run()


@pytest.mark.parametrize("kind", NEW_KINDS)
def test_superopt_returns_what_each_kind_of_program_returns(kind):
    """Property 1 on integer programs whose products wrap, histogram-like programs with values on their
    edges and float64 programs, each on a target and backend drawn per program."""
    @_settings(PER_KIND, f"superopt/{kind}")
    @given(program=programs(kind), combo=st.sampled_from(COMBOS), data=st.data())
    def run(program, combo, data):
        with program.context():
            check_superopt(program, *combo, data.draw)
    run()


def check_extracted(program, draw) -> None:
    """Property 2. The values in float64 on random inputs; the lowered program against jax.jit under the
    numerics contract: of numerics="strict" (random inputs and a drawn set, `draw_inputs`) where no rule
    that can change overflow fired (the schedule is DEFAULT's, "reals" rules included), else of "fast"
    on the random inputs."""
    fn = program.function()
    args = first_args(program, 5)
    captured = capture(fn, tuple(args))
    schedule = Schedule.of(*DEFAULT)
    enc, run, frozen = saturated(captured.graph, schedule, FUZZ_LIMITS)
    assert run.stop_reason is not StopReason.ERROR, run.error
    mode = "fast" if numerics_mode.overflow_rewrites(schedule, run.fired) else "strict"
    STATS["ops"][min(program.n_ops // 10 * 10, 60)] += 1
    STATS["kinds"][(program.kind, "extracted")] += 1
    lowered = TARGETS[zlib.crc32(program.source.encode()) % len(TARGETS)]
    for target in TARGETS:
        chosen = extract(frozen, enc, load_target(target))
        STATS["extracted"][target] += 1
        problem = same_value(captured.graph, chosen.graph, args)
        assert problem is None, f"extracted for {target}: {problem}"
        if target == lowered:
            program_fn, reference = lower(chosen.graph), jax.jit(lambda *a: jax.tree_util.tree_leaves(fn(*a)))
            trials = [(f"{KINDS[program.kind].first} inputs (seed 5)", args)]
            if mode == "strict":
                trials.append(draw_inputs(draw, program.args, reference, KINDS[program.kind].inputs))
                STATS["inputs"][trials[-1][0].split(" (")[0]] += 1
            STATS["lowered"][mode] += 1
            for where, inputs in trials:
                problem = agrees(_flat(reference(*inputs)), _flat(program_fn(*inputs)), captured.graph, inputs,
                                 program.exact, narrowest_float(captured.graph), mode)
                assert problem is None, f"extracted for {target}, lowered to JAX ({mode}): {problem}, on {where}"


@_settings(EXTRACTED, "extracted")
@given(program=programs(), data=st.data())
def test_extracted_programs_compute_the_original_values(program, data):
    check_extracted(program, data.draw)


@pytest.mark.parametrize("kind", NEW_KINDS)
def test_extracted_programs_of_each_kind_compute_the_original_values(kind):
    @_settings(EXTRACTED_PER_KIND, f"extracted/{kind}")
    @given(program=programs(kind), data=st.data())
    def run(program, data):
        with program.context():
            check_extracted(program, data.draw)
    run()


# ---- property 3: derivatives ----

def derivatives(fn, args, wrt: list, shapes: list, seed: int, forward: bool, under_jit: bool) -> list:
    """fn's float outputs, their vjp on a random cotangent and (where `forward`) their jvp on a random
    tangent, with respect to the float arguments `wrt`; `shapes` are the float outputs' (from the
    original, so that nothing traces `fn` before it is differentiated)."""
    def of_floats(*xs):
        full = list(args)
        for i, x in zip(wrt, xs):
            full[i] = x
        return [o for o in jax.tree_util.tree_leaves(fn(*full)) if is_float(o.dtype)]

    rng = np.random.default_rng(seed)
    cotangents = [rng.standard_normal(s.shape).astype(s.dtype) for s in shapes]
    primals = [np.asarray(args[i]) for i in wrt]
    tangents = [rng.standard_normal(p.shape).astype(p.dtype) for p in primals]

    def both(*primals):
        out, pullback = jax.vjp(of_floats, *primals)
        found = list(out) + list(pullback(cotangents))
        return found + (list(jax.jvp(of_floats, tuple(primals), tuple(tangents))[1]) if forward else [])
    return _flat((jax.jit(both) if under_jit else both)(*primals))


def check_derivatives(program, target: str, backend: str, draw, inputs: tuple | None = None) -> None:
    """Property 3 on the kind's first inputs (seed 11: the grid that holds the kinks) and a drawn set (of the
    kind's input sets, or of `inputs`)."""
    fn = program.function()
    args = first_args(program, 11)
    wrt = [i for i, (_, dtype) in enumerate(program.args) if is_float(dtype)]
    original = jax.jit(fn)
    shapes = [s for s in jax.tree_util.tree_leaves(jax.eval_shape(original, *args)) if is_float(s.dtype)]
    order = draw(st.sampled_from(("called first", "differentiated first", "differentiated under jit")))
    where, drawn = draw_inputs(draw, program.args, None, inputs or KINDS[program.kind].inputs)
    seed_ = draw(st.integers(0, 2**16))
    fast = superopt(fn, target=target, backend=backend, limits=FUZZ_LIMITS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if order == "called first":
            fast.compile(*args)
        for inputs, label in ((args, f"{KINDS[program.kind].first} inputs (seed 11)"), (drawn, where)):
            # the original differentiated as superopt's program is: under an outer jit, XLA compiles the
            # derivative whole, and where an output is NaN it may give another NaN or 0 than op by op
            # (RELIABILITY.md, the loops kind's runs with loop fission)
            under_jit = order.endswith("jit")
            want = derivatives(original, inputs, wrt, shapes, seed_, program.forward_mode, under_jit)
            got = derivatives(fast, inputs, wrt, shapes, seed_, program.forward_mode, under_jit)
            problem = compare_outputs(want, got)
            assert problem is None, f"{problem}, on {label}, {order} ({len(shapes)} float outputs first, " \
                                    f"then the vjp, then the jvp)\n{fast.report}"
    assert not leaked(caught), leaked(caught)
    STATS["kinds"][(program.kind, "differentiated")] += 1
    STATS["differentiated"][(order, fast.report.outcome.split(":")[0],
                             "no float argument" if not wrt else "forward and reverse" if program.forward_mode
                             else "reverse")] += 1


# Every target on every backend: the NPU emulator's program carries the user's rules under a trace
# (`test_the_npu_emulator_keeps_custom_rules_under_a_trace`) and a kept original on Pallas runs as the user's
# program (`test_a_kept_original_on_pallas_*`), the two faults that had kept this property on the JAX backend.
DIFFERENTIABLE = list(COMBOS)


def test_derivatives_of_programs_with_custom_rules_are_the_originals():
    @_settings(DIFFERENTIATED, "differentiated")
    @given(program=programs("custom"), combo=st.sampled_from(DIFFERENTIABLE), data=st.data())
    def run(program, combo, data):
        check_derivatives(program, *combo, data.draw)
    run()


def test_derivatives_of_programs_with_loops_are_the_originals():
    """Property 3 on the loops kind: a scan, fori_loop or cond whose body superopt searched, batched, wrote out
    or moved work out of, differentiated as jax.jit's, on the finite input sets the contract speaks of
    (README.md: derivatives keep the same terms on random values, +-0, subnormals and +-1; at NaN and inf an
    optimized program's derivative may take another NaN or inf). A while loop has no reverse-mode derivative
    in JAX, so programs with one are drawn again."""
    @_settings(PER_KIND, "differentiated/loops")
    @given(program=programs("loops"), combo=st.sampled_from(DIFFERENTIABLE), data=st.data())
    def run(program, combo, data):
        assume("lax.while_loop" not in program.source)
        check_derivatives(program, *combo, data.draw, inputs=("random", "zeros"))
    run()
