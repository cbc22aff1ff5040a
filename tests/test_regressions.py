"""Regression tests: each failure the fuzzer (tests/test_fuzz.py) or the reliability work found, with its
program written out. RELIABILITY.md lists them with their cause and fix."""
import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from custom_rules import RULES, straight_through_round
from fuzzing import KINDS, agrees, first_args, narrowest_float, programs, same_value
import searching
from superopt import Limits, VerificationWarning, superopt
from superopt.egraph.capture import capture
from superopt.extract import kernels
from superopt.extract.greedy import extract
from superopt.extract.target import available_targets, load_target
from superopt.lowering.jax import lower
from superopt.rewrites.schedule import Schedule
from superopt.rulesets import DEFAULT
from superopt.core.verify import compare_outputs, random_args


def _flat(tree) -> list:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def _saturated(fn, args, limits=Limits(iterations=4, nodes=8_000, seconds=3.0)):
    captured = capture(fn, tuple(args))
    enc, _, frozen = searching.saturated(captured.graph, Schedule.of(*DEFAULT), limits)
    return captured.graph, enc, frozen


def test_precise_reference_keeps_a_kernels_inputs_unrounded():
    """Fuzz-found (extracted programs vs original, float64): the reference evaluator rounded a kernel's
    inputs to their declared dtype in precise mode, so a fused bf16 program's float64 value differed
    from the unfused one's by bf16 rounding (2.9e-8 over a 1.95e-9 bound). Fixed in
    superopt/core/reference.py: a kernel body is evaluated with round_args=False."""
    def program(a0):
        v1 = 2.0 + a0
        v2 = 3.0 * v1
        v8 = jnp.tanh(v2)
        return jnp.mean(v8, axis=1, keepdims=True)

    args = random_args([((3, 16, 5), "bfloat16")], 5)
    original, enc, frozen = _saturated(program, args)
    for target in available_targets():
        chosen = extract(frozen, enc, load_target(target))
        assert any(chosen.graph.nodes[i].op == "kernel" for i in chosen.graph.live())
        assert same_value(original, chosen.graph, args) is None, target


def test_a_long_elementwise_chain_extracts_with_bounded_work(monkeypatch):
    """Found by the 5,000-op reliability test: kernel growth rebuilt each body from scratch at every step
    of every kernel, cubic in the length of an elementwise chain (a 200-op chain took 68 s to extract, a
    500-op one minutes). Fixed in extract/kernels.py: a growth budget of body nodes per expansion, shared
    out among the kernels; the extraction says how many kernels it cut. Here with a small budget, the
    target's own (`Target.kernel_growth`)."""
    monkeypatch.setattr(kernels, "KERNEL_FLOOR", 1_000)
    built = [0]
    real = kernels.build_body

    def counting(*args):
        body, loaded = real(*args)
        built[0] += len(body)
        return body, loaded

    monkeypatch.setattr(kernels, "build_body", counting)

    def program(x, w):
        h = x
        for _ in range(20):
            h = jnp.tanh(h * 1.01 + 0.5) - h * 0.5
        return h @ w

    args = random_args([((8, 16), "float32"), ((16, 4), "float32")], 0)
    original, enc, frozen = _saturated(program, args, Limits())
    chosen = extract(frozen, enc, dataclasses.replace(load_target("cpu"), kernel_growth=20_000))
    assert built[0] <= 20_000 * 1.1          # unbounded, this chain builds about 340,000 body nodes
    assert chosen.method.growth_cut > 0, chosen.method
    assert compare_outputs(_flat(jax.jit(program)(*args)), _flat(lower(chosen.graph)(*args))) is None


@pytest.mark.slow
@pytest.mark.parametrize("target", ["cpu", "npu-910b"])
@pytest.mark.parametrize("program, shapes", [
    (lambda a, b: jnp.tanh(a @ b) + 1.0, [(0, 5), (5, 3)]),   # extract/tiling.py: ZeroDivisionError
    (lambda a: jax.nn.softmax(a, axis=-1), [(3, 0)]),          # extract/cost.py (NPU): ZeroDivisionError
], ids=["empty-matmul-in-a-kernel", "empty-rows"])
def test_empty_tensors_in_kernels(program, shapes, target):
    """Found by the empty-tensor reliability test: a kernel with an empty matmul divided by its zero rows
    when tiled (extract/tiling.py) and when placed on the cube (lowering/npu/lower.py), and an NPU vector
    kernel over rows of zero bytes divided by them (extract/cost.py). Fixed: an empty matrix op has no
    tiling (Untileable), the NPU code generator declines an empty matmul (CodegenError: JAX runs it), and
    a row is at least one byte."""
    args = [np.zeros(s, np.float32) for s in shapes]
    fast = superopt(program, target=target)
    assert compare_outputs(_flat(jax.jit(program)(*args)), _flat(fast(*args))) is None


def test_a_program_without_outputs():
    """Found by the bad-input tests: encoding a program with no outputs called egglog's register with no
    commands, a TypeError. Fixed in egraph/encode.py: nothing is registered then."""
    def program(a, b):
        return None

    fast = superopt(program)
    assert fast(None, np.ones(3, np.float32)) is None


@pytest.mark.slow
def test_a_mixed_precision_matmul_is_judged_at_its_declared_precision():
    """Fuzz-found (extracted programs lowered to JAX): XLA keeps f32 where a program rounds to bf16 (it
    drops f32 -> bf16 -> f32 round trips), so the original below is more accurate than its types say,
    and the extracted bf16 x bf16 -> f32 matmul (`matmul-mixed-precision-bf16`, exact at the declared
    types) was judged less accurate than it. Not a superopt bug: the fuzzer judges such programs at their
    narrowest float type (`fuzzing.narrowest_float`, superopt.core.verify's `as_dtype`), and superopt's own
    verification, which compares at the output's type, keeps the original where it disagrees."""
    def program(a1, a20):
        v1 = jnp.square(a1)
        return v1.astype(jnp.float32) @ a20.astype(jnp.float32)

    args = random_args([((16, 5, 4, 3), "bfloat16"), ((3, 7), "bfloat16")], 5)
    original, enc, frozen = _saturated(program, args)
    expected = _flat(jax.jit(program)(*args))
    chosen = extract(frozen, enc, load_target("npu-910b"))
    assert same_value(original, chosen.graph, args) is None
    actual = _flat(lower(chosen.graph)(*args))
    assert agrees(expected, actual, original, args, False, narrowest_float(original)) is None
    fast = superopt(program, target="npu-910b", backend="jax")
    with pytest.warns(VerificationWarning, match="matmul-mixed-precision-bf16"):
        result = fast(*args)
    assert fast.report.outcome.startswith("kept original")
    assert agrees(expected, _flat(result), original, args, False) is None


@pytest.mark.slow
def test_an_f32_matmul_on_the_npu_emulator_keeps_float32s_tolerance():
    """Fuzz-found (superopt on npu-910 with the emulator): an f32 matmul runs on the cube with fp16
    operands, 1.8e-3 normwise from the f32 original. It was first accepted at the cube's fp16 tolerance;
    under the numerics contract (issue 28) an output is judged at its own dtype against the user's
    program, so on npu-910, whose cube takes no fp32 operands, the program runs on JAX with the reason,
    and on npu-910b the cube multiplies the float32 operands as they are (`precision` "fp32")."""
    w = np.random.default_rng(13).standard_normal((5, 5)).astype(np.float32)

    def program(a5, a4):
        v9 = a4 + a5
        return v9, a5 @ w

    args = random_args([((5,), "float32"), ((16, 5), "float32")], 11)
    want = _flat(jax.jit(program)(*args))
    with pytest.warns(VerificationWarning, match="differs from the original program"):
        fast = superopt(program, target="npu-910")
        spec = fast.compile(*args)
    assert spec.npu is None and "the npu-910 cube takes no fp32 operands" in fast.report.backend.fell_back
    assert compare_outputs(want, _flat(fast(*args))) is None
    fast = superopt(program, target="npu-910b")
    spec = fast.compile(*args)
    assert spec.npu is not None and "fp32 cube operands" in fast.report.backend.detail, fast.report.backend
    assert compare_outputs(want, _flat(fast(*args))) is None


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_fuzzers_programs_run_as_written(kind):
    """The generator's source round trip: a program of every kind prints as a function that runs (the form
    regressions are pasted in; the custom kind's functions come from tests/custom_rules.py, a float64
    program runs under jax.enable_x64)."""
    from hypothesis import HealthCheck, given, seed, settings

    @seed(0)
    @settings(max_examples=5, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(programs(kind, max_ops=12))
    def run(program):
        scope = {"jax": jax, "jnp": jnp, "lax": lax, "np": np, **RULES}
        exec(program.source, scope)
        with program.context():
            out = scope["program"](*first_args(program, 0))
        assert len(jax.tree_util.tree_leaves(out)) == len(program.outputs)
    run()


# ---- found by the fuzzer in the Pallas backend (lowering/pallas) ----


def test_pallas_lowers_an_operand_of_lower_rank():
    """Fuzz-found: `a - c` with shapes (4, 2) and (2,) is `sub(a, reshape(c) : (1, 2))` in the term (the IR
    broadcasts an axis of extent 1, as lax does). A block drops axes of extent 1, so the operand's block
    was (2,) against the result's (4, 2): `TypeError: sub: arrays must have the same number of dimensions,
    got {1, 2}`, and superopt ran JAX. Fixed in lowering/pallas/blocks.py (`spread`): an elementwise op's
    operand blocks are broadcast to the result's block along the axes they are tied to."""
    def program(a, c):
        return a - c

    args = [np.ones((4, 2), np.float32), np.arange(2, dtype=np.float32)]
    fast = superopt(program, target="gpu-a100", backend="pallas")
    assert compare_outputs(_flat(jax.jit(program)(*args)), _flat(fast(*args))) is None
    assert "lowering failed" not in fast.report.backend.fell_back, fast.report.backend


@pytest.mark.slow
def test_pallas_program_passes_its_own_check_on_a_bf16_program():
    """Fuzz-found: the Pallas program missed the f32 tolerance of superopt's own check against the JAX
    program (normwise 3.3e-4 over 1e-4 on output 2, exp of a bf16 sine widened to f32), so superopt ran
    JAX. The Pallas kernel rounds sin(0.1259766) = 0.1256436 to bf16 (0.1259766), as the term declares,
    and gives exp of that, 1.1342556; XLA fuses sin -> convert -> exp and keeps the sine in f32 (excess
    precision), 1.1338780. Not a wrong kernel: the check (lowering/pallas/program.py, `compare`) now
    judges an output at the tolerance of the narrowest float type it is computed through, as the fuzzer
    does (see the mixed-precision test above)."""
    def program(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12):
        v0 = jnp.sin(a0)
        v1 = v0.astype(jnp.float32)
        v3 = -v0
        v4 = jnp.maximum(a2, a3)
        v5 = a5 @ a4
        v7 = jnp.floor(v5)
        v8 = a2 - v4
        v9 = a1.astype(jnp.float32) @ a6.astype(jnp.float32)
        v16 = a9 / v9
        v19 = v8.astype(jnp.float32)
        v20 = jnp.broadcast_to(a12, (4, 16))
        v21 = jnp.exp(v1)
        v11 = -1 - a1
        v22 = 0 * v11
        v23 = lax.reduce_window(a4, jnp.array(-jnp.inf, a4.dtype), lax.max, (1, 3, 1), (2, 2, 2), 'VALID')
        v24 = v16 * np.random.default_rng(56).standard_normal((1, 5)).astype(jnp.float32)
        return v19, v20, v21, v22, v23, v24, v3, v7, a7, a8, a10, a11

    avals = [((), "bfloat16"), ((1, 1, 1, 1), "int8"), ((1, 1, 1, 8), "float16"), ((1, 8), "float16"),
             ((1, 3, 1), "float32"), ((4, 3), "float32"), ((1, 5), "int8"), ((), "bfloat16"), ((1, 2), "int8"),
             ((1,), "float32"), ((2, 8, 7, 3), "bfloat16"), ((2, 2, 3, 5), "bfloat16"), ((4, 16), "float32")]
    args = random_args(avals, 11)
    fast = superopt(program, target="gpu-a100", backend="pallas")
    fast(*args)
    assert fast.report.backend.runs == "pallas", fast.report.backend


def test_a_size_one_axis_broadcast_against_an_empty_one_is_empty():
    """(issue 33, found by tests/test_analysis.py) a row maximum kept as (3, 1) subtracted from a (3, 0)
    array: the shape analysis gave the difference the larger extent, 1, against the captured 0, and egglog
    stopped the saturation ("Illegal merge attempted for function shape"), so superopt kept the original.
    Fixed in egraph/analysis.py: an axis of 1 against one of 0 is 0."""
    fn = lambda a: jnp.exp(a - jnp.max(a, axis=1, keepdims=True, initial=-jnp.inf)) * 2.0   # noqa: E731
    a = np.zeros((3, 0), np.float32)
    _, _, frozen = _saturated(fn, (a,))
    assert frozen.shapes[frozen.outputs[0]] == (3, 0)
    fast = superopt(fn, cache=False)
    assert fast(a).shape == (3, 0)
    assert "saturation failed" not in (fast.report.reason or ""), fast.report.reason


# ---- found by the fuzzer's kinds of programs (tests/fuzzing.py, KINDS) ----


@pytest.mark.slow
def test_pallas_runs_a_sum_over_an_empty_axis_with_jax():
    """Fuzz-found (histogram programs, gpu-h100 Pallas): a histogram of one bin has no interior edges, so
    `jnp.sum(x[..., None] >= edges[1:-1], axis=-1)` sums over an empty axis. The elementwise template
    divided its tile budget by that axis's extent (ZeroDivisionError) and the report said the Pallas
    lowering failed. A kernel body with an empty array has no template (lowering/pallas/kernels.py): its
    nodes run with the JAX lowering."""
    def program(x, edges):
        return jnp.sum(x[..., None] >= edges[1:-1], axis=-1)

    args = [np.array([-1.0, -0.75, 0.0, 2.0], np.float32), np.array([-1.0, -0.75], np.float32)]
    fast = superopt(program, target="gpu-h100", backend="pallas")
    assert compare_outputs(_flat(jax.jit(program)(*args)), _flat(fast(*args))) is None
    assert fast.report.backend.runs == "pallas", fast.report.backend


@pytest.mark.slow
def test_the_npu_emulator_converts_as_xla_and_warns_the_caller_of_nothing():
    """Fuzz-found (integer programs, npu-910 emulator): an int32 matmul whose products pass int32's range
    runs on the fp16 cube, and the emulator cast its float32 results to int32 with numpy, which warned the
    caller ("invalid value encountered in cast") and made each one out of range int32's smallest value.
    The backend's check returned the original's outputs, so values were right, but the warning was
    superopt's own. The emulator converts floats to integers as XLA does (toward zero, saturating, NaN to
    0) and computes under np.errstate, as the hardware does, silently (lowering/npu/emulator.py)."""
    from superopt.lowering.npu.emulator import _saturated
    a = np.array([[46341, -46342], [46340, 3]], np.int32)
    b = np.array([[46341, 2], [-46343, 46341]], np.int32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = superopt(lambda a, b: a @ b, target="npu-910", backend="emulator")
        got = fast(a, b)
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.jit(lambda a, b: a @ b)(a, b)))
    x = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 2.7, -2.7, 2147483647.0, -0.5], np.float32)
    for dtype in (jnp.int32, jnp.int8, jnp.uint8):
        np.testing.assert_array_equal(_saturated(x, np.dtype(dtype)), jax.jit(lambda x: x.astype(dtype))(x))


# ---- found by the fuzzer's custom-derivative programs (tests/test_fuzz.py, property 3) ----


@pytest.mark.slow
def test_the_npu_emulator_keeps_custom_rules_under_a_trace():
    """Fuzz-found: on an NPU target with backend="emulator", `jax.grad` of superopt(fn) is the derivative of
    the captured program, whose custom_jvp calls are inlined primal bodies: relu'(0) = 0.5 (the gradient
    of relu(a) * 2 is 1.0 at 0 where jax.jit's is 0), and a straight-through round's gradient is 0 where
    it is 3, whether the program was changed or kept. Fixed: under a trace the extracted program is
    differentiated as the user's program where that calls custom rules (backends.with_users_derivative)."""
    a = np.array([0.0, 1.0, -1.0, 0.0, 0.5, -0.5, 2.0, 0.0], np.float32)
    for fn in (lambda a: jax.nn.relu(a) * 2.0, lambda a: straight_through_round(a * 3.0)):
        fast = superopt(fn, target="npu-910b", backend="emulator")
        fast(a)
        np.testing.assert_array_equal(jax.grad(lambda a: jnp.sum(fast(a)))(a),
                                      jax.grad(lambda a: jnp.sum(jax.jit(fn)(a)))(a))


@pytest.mark.slow
def test_a_kept_original_on_pallas_is_differentiated_as_under_jax_jit():
    """Fuzz-found: `jax.nn.relu` on gpu-a100 with backend="pallas" is kept as captured ("no cheaper program
    found") and still runs as one Pallas kernel; `jax.grad` of it raises "Linearization failed to produce
    known values for all output primals", where jax.jit's gradient is relu's rule. Fixed: a kept original
    runs as the user's program on the pallas backend too (backends.PallasBackend.lower)."""
    a = np.array([0.0, 1.0, -1.0, 0.0, 0.5, -0.5, 2.0, 0.0], np.float32)
    fast = superopt(jax.nn.relu, target="gpu-a100", backend="pallas")
    fast(a)
    assert not fast.report.optimized and fast.report.backend.fell_back.startswith("the original runs"), fast.report.backend
    np.testing.assert_array_equal(jax.grad(lambda a: jnp.sum(fast(a)))(a),
                                  jax.grad(lambda a: jnp.sum(jax.jit(jax.nn.relu)(a)))(a))


@pytest.mark.slow
def test_a_product_with_infinite_and_overflowing_terms_is_a_sum_xla_itself_adds_either_way():
    """Fuzz-found (float64 programs, gpu-h100 Pallas): one element of a product has the terms -inf (an infinite
    input) and +inf (-2034783209 * -max overflows). Added with the product rounded first they give NaN; with
    the product fused into the add (an FMA) -inf. XLA itself gives both for the user's own program: the
    batched program's first row is 0.5 under jax.jit, the same program on that one matrix NaN. So this is
    the contract's sum edge (README, "Four edges"), not a rewrite's error: the Pallas program's sum is one of
    the two, and what follows the sum (1 / x, the sigmoid) is computed from it exactly as jax.jit computes
    from its own. It had also been "kept original" and still run as Pallas kernels, unverified; a kept
    original now runs as the user's program, and a Pallas program is judged on the strict sets too."""
    def program(a, w):
        return jax.nn.sigmoid(1.0 / (jnp.swapaxes(a, -1, -2) @ w))

    with jax.enable_x64(True):
        big = np.finfo(np.float64).max
        a = np.zeros((1, 7, 7))
        a[0, :, 0] = [-967838123, -4, -2, 4, 6, -2034783209, -1878913902]
        w = np.tile(np.array([[np.inf], [-1.18], [-0.111], [-1.239], [-0.023], [-big], [0.315]]), (1, 16))
        batched, single = np.asarray(jax.jit(program)(a, w)), np.asarray(jax.jit(program)(a[0], w))[None]
        assert np.all(batched[0, 0] == 0.5) and np.all(np.isnan(single[0, 0]))       # XLA's two orders
        np.testing.assert_array_equal(batched[0, 1:], single[0, 1:])
        fast = superopt(program, target="gpu-h100", backend="pallas")
        fast(np.ones_like(a), np.ones_like(w))
        assert fast.report.backend.runs == "pallas", fast.report.backend
        got = np.asarray(fast(a, w))
        assert any(np.array_equal(got, want, equal_nan=True) for want in (batched, single)), got[0, 0]
