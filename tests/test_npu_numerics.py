"""Issue 28, findings 4 and 5, on the NPU targets: superopt never raises where jax.jit returns a value,
and never returns the emulator's result where it differs from the user's program beyond the output
dtype's tolerance (integers exactly). `superopt/npu_backend.py`."""
from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from superopt import superopt
from superopt.extract.target import load_target
from superopt.lowering.npu.lower import NpuExecutable
from superopt.npu_backend import NumericsWarning, check_precision, on_emulator
from superopt.core.verify import VerificationWarning, compare_outputs, random_args

NPUS = ["npu-910", "npu-910b"]


def leaves(x) -> list:
    return [np.asarray(v) for v in jax.tree_util.tree_leaves(x)]


def same_as_jit(fn, got, args) -> None:
    """Integers and bools identical to jax.jit's, floats within their own dtype's tolerance."""
    want = leaves(jax.jit(fn)(*args))
    got = leaves(got)
    assert compare_outputs(want, got) is None, compare_outputs(want, got)


def on_npu(fn, args, target, precision, check=True):
    """`fn` optimized for `target` on JAX, then put on the emulator at `precision` (the API's backend step,
    with the call's arguments as its example)."""
    spec = superopt(fn, target=target, backend="jax").compile(*args)
    return on_emulator(spec, load_target(target), spec.avals, check, precision=precision,
                       example=jax.tree_util.tree_leaves(args))


def call(spec, *args):
    return jax.tree_util.tree_unflatten(spec.out_tree, spec.run(*jax.tree_util.tree_leaves(args)))


# ---- finding 4: values above fp16's range ----

@pytest.mark.slow
@pytest.mark.parametrize("target", NPUS)
def test_f32_inputs_above_65504_return_what_jax_jit_returns(target):
    """tanh(x @ w) and x * 2 + 1 on float32 values of 1e5: the result jax.jit gives, never an exception."""
    rng = np.random.default_rng(0)
    x = np.full((16, 32), 1e5, np.float32)
    w = (rng.standard_normal((32, 24)) * 1e-6).astype(np.float32)
    for fn, args in ((lambda x, w: jnp.tanh(x @ w), (x, w)), (lambda x: x * 2 + 1, (x,))):
        fast = superopt(fn, target=target)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", VerificationWarning)
            got = fast(*args)
        same_as_jit(fn, got, args)


@pytest.mark.slow
def test_an_emulator_overflow_at_call_time_warns_and_returns_the_original_programs_result():
    """The cube's fp16 copy-in of 1e5 raises NumericOverflow in the emulator; the call warns once and returns
    jax.jit's value (here without the build-time check, so that the fp16 program is the one that runs)."""
    fn = lambda x, w: jnp.tanh(x @ w)                                                   # noqa: E731
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((32, 24)) * 1e-6).astype(np.float32)
    fast = superopt(fn, target="npu-910", verify=False)
    small = rng.standard_normal((16, 32)).astype(np.float32)
    fast(small, w)
    assert fast.npu is not None and fast.report.backend.runs == "npu emulator", fast.report.backend
    big = np.full((16, 32), 1e5, np.float32)
    with pytest.warns(NumericsWarning, match="NumericOverflow"):
        got = fast(big, w)
    same_as_jit(fn, got, (big, w))
    with warnings.catch_warnings():
        warnings.simplefilter("error", NumericsWarning)       # once
        same_as_jit(fn, fast(big * 2, w), (big * 2, w))
    assert any("a call ran on JAX" in n and "NumericOverflow" in n for n in fast.report.backend.notes), fast.report.backend


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_a_float16_conversion_that_overflows_gives_inf_as_jax_jit_does(precision):
    """The program's own convert to float16 overflows for 1e5 (jax.jit: inf); checked and running on the
    emulator after a first call in range, the later call returns inf as jax.jit does (the vector unit's
    convert rounds to inf, as IEEE conversion does) and nothing is raised or warned."""
    fn = lambda x: (x * 2 + 1).astype(jnp.float16)                                      # noqa: E731
    x = np.random.default_rng(2).standard_normal((8, 40)).astype(np.float32)
    spec = on_npu(fn, (x,), "npu-910b", precision)
    same_as_jit(fn, call(spec, x), (x,))
    assert spec.npu is not None, spec.report.backend
    big = np.full((8, 40), 1e5, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = call(spec, big)
    assert np.isinf(np.asarray(got)).all()
    same_as_jit(fn, got, (big,))


# ---- finding 5: drift against the user's float32 program ----

def adamw_step(w, m, v, x, y):
    g = jax.grad(lambda w: jnp.mean((jnp.tanh(x @ w) - y) ** 2))(w)
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    return w - 1e-3 * (m / (jnp.sqrt(v) + 1e-8) + 0.01 * w), m, v


def adamw_args():
    rng = np.random.default_rng(3)
    w = (0.1 * rng.standard_normal((64, 32))).astype(np.float32)
    zeros = np.zeros((64, 32), np.float32)              # the first step: the moments are the gradient's
    x, y = rng.standard_normal((128, 64)).astype(np.float32), rng.standard_normal((128, 32)).astype(np.float32)
    return w, zeros, zeros, x, y


@pytest.mark.slow
def test_adam_moments_that_drift_under_fp16_cube_operands_run_on_jax_with_the_reason():
    """On npu-910 the cube multiplies fp16 operands only: the moments differ from the float32 program beyond
    float32's tolerance, so the step runs on JAX and the report says which output and why."""
    args = adamw_args()
    fast = superopt(adamw_step, target="npu-910")
    with pytest.warns(NumericsWarning):
        got = fast(*args)
    backend = fast.report.backend
    assert backend.runs == "jax", backend
    why = backend.fell_back
    assert why.startswith("the NPU program (fp16 cube operands) differs from the original program"), backend
    assert "output " in why and "dtype float32" in why and "npu-910 cube takes no fp32 operands" in why
    assert fast.npu is None
    same_as_jit(adamw_step, got, args)


@pytest.mark.slow
def test_adam_step_on_the_910b_fp16_drifts_and_fp32_runs_within_float32_tolerance():
    args = adamw_args()
    with pytest.warns(NumericsWarning):
        fp16 = on_npu(adamw_step, args, "npu-910b", "fp16")
    assert fp16.npu is None and "precision='fp32'" in fp16.report.backend.fell_back, fp16.report.backend
    same_as_jit(adamw_step, call(fp16, *args), args)

    fp32 = on_npu(adamw_step, args, "npu-910b", "fp32")
    assert fp32.npu is not None, fp32.report.backend
    assert fp32.report.backend.detail.startswith("npu emulator (npu-910b, numeric) with fp32 cube operands")
    same_as_jit(adamw_step, call(fp32, *args), args)
    # and by default: the 910B's cube takes the float32 operands as they are
    fast = superopt(adamw_step, target="npu-910b")
    same_as_jit(adamw_step, fast(*args), args)
    assert fast.npu is not None and "fp32 cube operands" in fast.report.backend.detail, fast.report.backend


def tied_scores():
    """Scores 64 * (0.5 + 2e-5 j): distinct in float32, but some 25 neighbouring columns of w round to one
    fp16 value, so fp16 cube operands tie them (and a top_k or argmax picks another index)."""
    x = np.repeat(np.arange(1, 9, dtype=np.float32)[:, None], 64, axis=1)
    w = np.repeat((0.5 + 2e-5 * np.arange(2560, dtype=np.float32))[None, :], 64, axis=0)
    w = w[:, np.random.default_rng(4).permutation(2560)]
    return x, w


@pytest.mark.slow
@pytest.mark.parametrize("target", NPUS)
@pytest.mark.parametrize("fn", [lambda x, w: jax.lax.top_k(x @ w, 16), lambda x, w: jnp.argmax(x @ w, axis=-1)],
                         ids=["top_k", "argmax"])
def test_top_k_and_argmax_indices_are_identical_to_jax_jit(target, fn):
    x, w = tied_scores()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VerificationWarning)
        fast = superopt(fn, target=target)
        got = fast(x, w)
    want = leaves(jax.jit(fn)(x, w))
    assert np.array_equal(leaves(got)[-1], want[-1])
    same_as_jit(fn, got, (x, w))
    if target == "npu-910":     # fp16 operands: other scores (top_k's values) and other indices
        assert fast.report.backend.fell_back.startswith("the NPU program (fp16 cube operands) differs from the "
                                                        "original"), fast.report.backend


@pytest.mark.slow
def test_top_k_on_fp16_operands_is_caught_on_the_910b_too():
    fn = lambda x, w: jax.lax.top_k(x @ w, 16)                                          # noqa: E731
    x, w = tied_scores()
    with pytest.warns(NumericsWarning, match="differs from the original program"):
        spec = on_npu(fn, (x, w), "npu-910b", "fp16")
    assert spec.npu is None and spec.report.backend.runs == "jax" and spec.report.backend.fell_back, spec.report.backend
    assert np.array_equal(leaves(call(spec, x, w))[1], leaves(jax.jit(fn)(x, w))[1])


@pytest.mark.slow
def test_a_later_call_that_differs_returns_the_original_programs_outputs():
    """Checked at build time on inputs where fp16 rounding changes no index, the program runs on the
    emulator; a later call whose scores fp16 ties is checked too, warns, and returns jax.jit's indices."""
    fn = lambda x, w: jnp.argmax(x @ w, axis=-1)                                        # noqa: E731
    rng = np.random.default_rng(5)
    x0, w0 = rng.standard_normal((8, 64)).astype(np.float32), rng.standard_normal((64, 2560)).astype(np.float32)
    fast = superopt(fn, target="npu-910")
    same_as_jit(fn, fast(x0, w0), (x0, w0))
    assert fast.npu is not None, fast.report.backend
    x, w = tied_scores()
    with pytest.warns(NumericsWarning, match="differs from the original program on these inputs"):
        got = fast(x, w)
    assert np.array_equal(np.asarray(got), np.asarray(jax.jit(fn)(x, w)))
    assert any("a call ran on JAX" in n for n in fast.report.backend.notes), fast.report.backend


# ---- the precision option ----

@pytest.mark.slow
def test_fp32_operands_are_refused_where_the_cube_has_no_fp32_rate():
    with pytest.raises(ValueError, match="precision 'fp32' is not available on npu-910: ") as err:
        check_precision("fp32", load_target("npu-910"))
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="npu-910"):
        NpuExecutable(superopt(lambda x: x @ x, target="npu-910", backend="jax").compile(
            np.ones((16, 16), np.float32)).term, load_target("npu-910"), precision="fp32")
    with pytest.raises(ValueError, match="unknown NPU precision 'fp8'"):
        check_precision("fp8", load_target("npu-910b"))
    assert check_precision("fp32", load_target("npu-910b")) == "fp32"
    assert check_precision(None, load_target("npu-910")) is None


@pytest.mark.slow
def test_fp32_operands_run_on_the_emulator_within_float32_tolerance_at_the_fp32_rate():
    """A 256x512x384 matmul: with fp32 operands the emulator's result is within float32's tolerance of jax.jit
    and the cube's work doubles (a 16x8x16 fractal per cycle instead of 16x16x16), so it takes more cycles."""
    fn = lambda x, w: x @ w                                                             # noqa: E731
    rng = np.random.default_rng(6)
    args = (rng.standard_normal((256, 512)).astype(np.float32),
            (rng.standard_normal((512, 384)) / 16).astype(np.float32))
    spec = on_npu(fn, args, "npu-910b", "fp32")
    assert spec.npu is not None and spec.npu.precision == "fp32", spec.report.backend
    assert "with fp32 cube operands" in spec.report.backend.detail
    same_as_jit(fn, call(spec, *args), args)
    target = load_target("npu-910b")
    fp32 = spec.npu.run(symbolic=True)
    fp16 = NpuExecutable(spec.term, target, precision="fp16").run(symbolic=True)
    assert fp32.cycles > fp16.cycles

    def mmad(run):
        return sum(end - start for _, _, name, start, end, _ in run.events() if name == "Mmad")
    assert mmad(fp32) == 2 * mmad(fp16)
    # fp16 operands: 256 x 512 products rounded, beyond float32's tolerance of the float32 program
    with pytest.warns(NumericsWarning):
        assert on_npu(fn, args, "npu-910b", "fp16").npu is None


@pytest.mark.slow
def test_random_inputs_of_every_dtype_still_check():
    """A float16 program multiplies fp16 operands under either precision and is checked at fp16's tolerance."""
    fn = lambda x, w: jax.nn.relu(x @ w)                                                # noqa: E731
    args = random_args([((32, 48), "float16"), ((48, 40), "float16")], 7)
    for precision in ("fp16", "fp32"):
        spec = on_npu(fn, tuple(args), "npu-910b", precision)
        assert spec.npu is not None and "with fp16 cube operands" in spec.report.backend.detail, spec.report.backend
        same_as_jit(fn, call(spec, *args), tuple(args))
