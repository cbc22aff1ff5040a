"""Quantization: an int8 linear layer or convolution (dequantize -> matmul or conv -> requantize) becomes
one int8 kernel with int32 accumulation and the requantize epilogue fused, and stays as accurate as the
original."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from superopt.workloads import qlinear_args as _args   # the benchmark's int8 layer, any shape
from superopt.workloads import qconv_args, qconv_fn, qconv_per_channel_args, qconv_per_channel_fn, qlinear_fn as qlinear
from superopt import superopt
from superopt.core.reference import evaluate

f32 = jnp.float32


def _kernels(graph):
    return [graph.nodes[i] for i in graph.live() if graph.nodes[i].op == "kernel"]


@pytest.mark.slow
@pytest.mark.parametrize("target", ["cpu", "gpu-h100", "npu-910b"])
def test_an_int8_linear_layer_runs_as_one_int8_kernel(target):
    # fast: the weight scale is a runtime per-column tensor of any magnitude, so moving it out of the matmul
    # (matmul-scale-columns) could overflow where the original does not; strict keeps it (test below)
    args = _args(64, 256, 128)
    fn = superopt(qlinear, target=target, numerics="fast")
    out = np.asarray(fn(*args))
    spec = fn.compile(*args)
    (kernel,) = _kernels(spec.term)
    assert spec.term.op_counts()["kernel"] == 1 and not {"matmul", "div", "round_even"} & set(spec.term.op_counts())
    body = kernel.attrs[0]
    (mm,) = [n for n in body if n.op == "matmul"]
    assert mm.dtype == "int32" and all(body[j].dtype == "int8" for j in mm.inputs)   # int8 x int8 -> int32
    assert body[-1].op == "convert" and body[-1].dtype == "int8" and kernel.dtype == "int8"
    assert {"round_even", "max", "min", "div"} <= {n.op for n in body}                 # requantize fused
    # Inputs read by the kernel: int8 operands, no widened copy of them in global memory.
    assert sorted(spec.term.nodes[i].dtype for i in kernel.inputs if spec.term.nodes[i].size > 1024) == ["int8", "int8"]
    if target.startswith("npu"):
        assert fn.report.backend.runs == "npu emulator", fn.report.backend
    _assert_as_accurate(out, args)


@pytest.mark.slow
def test_strict_keeps_a_runtime_weight_scale_inside_the_matmul():
    args = _args(64, 256, 128)
    fn = superopt(qlinear, target="cpu")
    out = np.asarray(fn(*args))
    assert "matmul-scale-columns" in fn.report.left_out and not fn.report.overflow_rewrites
    _assert_as_accurate(out, args)


def _assert_as_accurate(out, args):
    """The int32 accumulation is exact, so the result may round differently from jax.jit's f32 sum at a
    tie, but it is at least as close to the exact (float64) requantized value."""
    from superopt.egraph.capture import capture
    original = np.asarray(jax.jit(qlinear)(*args)).astype(np.int64)
    truth = np.asarray(evaluate(capture(qlinear, args).graph, list(args), precise=True)[0]).astype(np.int64)
    got = out.astype(np.int64)
    assert np.abs(got - original).max() <= 1
    assert np.abs(got - truth).sum() <= 2 * np.abs(original - truth).sum()


@pytest.mark.slow
@settings(max_examples=6, deadline=None, derandomize=True)
@given(m=st.integers(1, 40), k=st.integers(1, 300), n=st.integers(1, 40), seed=st.integers(0, 5))
def test_the_int8_kernel_is_as_accurate_on_ragged_shapes(m, k, n, seed):
    args = _args(m, k, n, seed)
    fn = superopt(qlinear, target="cpu")
    out = np.asarray(fn(*args))
    assert out.dtype == np.int8
    _assert_as_accurate(out, args)


@pytest.mark.parametrize("k,int8", [(131071, True), (131072, False)])
def test_a_contraction_too_long_for_int32_stays_in_f32(k, int8):
    # (2**31 - 1) // 2**14 int8 products always fit the int32 accumulator; one more might not
    # (131072 products of -128 * -128 sum to 2**31).
    from superopt.egraph.capture import capture
    from superopt.egraph.encode import encode
    from superopt.egraph.frozen import freeze
    from superopt.egraph.runner import saturate
    from superopt.rewrites.schedule import Schedule
    xq, wq = np.zeros((1, k), np.int8), np.zeros((k, 1), np.int8)
    enc = encode(capture(lambda a, b: a.astype(f32) @ b.astype(f32), (xq, wq)).graph)
    saturate(enc.egraph, Schedule.of("quant"))
    frozen = freeze(enc.egraph)
    int32_matmuls = [n for nodes in frozen.classes.values() for n in nodes if n.fn == "matmul" and "int32" in n.args]
    assert bool(int32_matmuls) == int8


@pytest.mark.slow
@pytest.mark.parametrize("target", ["cpu", "npu-910b", "npu-910"])
@pytest.mark.parametrize("scales", ["per-tensor", "per-channel"])
def test_an_int8_convolution_runs_as_one_int8_kernel(target, scales):
    # per-channel: a weight scale per output channel, which must leave the conv as a per-tensor one does.
    # Moving a scale rounds the rescaled value differently, and it feeds a round: an int8 output may move by
    # one (asserted below), which strict numerics does not allow (the cone of a discontinuity is computed as
    # captured: tests/test_cone.py), so the fusion runs under numerics="fast"
    program, args = (qconv_fn, qconv_args(2, 9, 16, 32, seed=1)) if scales == "per-tensor" else \
        (qconv_per_channel_fn, qconv_per_channel_args(2, 9, 16, 32, seed=2))
    fn = superopt(program, target=target, numerics="fast")
    out = np.asarray(fn(*args))
    spec = fn.compile(*args)
    (kernel,) = _kernels(spec.term)
    assert "conv" not in spec.term.op_counts() and "div" not in spec.term.op_counts()
    body = kernel.attrs[0]
    (cv,) = [n for n in body if n.op == "conv"]
    assert cv.dtype == "int32" and all(body[j].dtype == "int8" for j in cv.inputs)      # int8 x int8 -> int32
    assert dict(cv.attrs[0])["preferred_element_type"] == np.int32
    assert body[-1].op == "convert" and body[-1].dtype == "int8"
    assert {"round_even", "max", "min", "div"} <= {n.op for n in body}                  # requantize fused
    if target.startswith("npu"):
        assert fn.report.backend.runs == "npu emulator", fn.report.backend
        patches = [s for s in spec.npu.stages if "img2col" in s.label]
        assert patches and all(dt == "int8" for _, _, dt in patches[0].program.outputs)   # the int8 cube
    from superopt.egraph.capture import capture
    truth = np.asarray(evaluate(capture(program, args).graph, list(args), precise=True)[0]).astype(np.int64)
    original = np.asarray(jax.jit(program)(*args)).astype(np.int64)
    assert np.abs(out.astype(np.int64) - original).max() <= 1
    assert np.abs(out.astype(np.int64) - truth).sum() <= np.abs(original - truth).sum() + 2


@pytest.mark.parametrize("channels,int8", [(14563, True), (14564, False)])
def test_a_conv_window_too_long_for_int32_stays_in_f32(channels, int8):
    # 3 * 3 * 14563 = 131067 int8 products fit the int32 accumulator; 3 * 3 * 14564 = 131076 might not.
    from jax import lax
    from superopt.egraph.capture import capture
    from superopt.egraph.encode import encode
    from superopt.egraph.frozen import freeze
    from superopt.egraph.runner import saturate
    from superopt.rewrites.schedule import Schedule
    xq, wq = np.zeros((1, 3, 3, channels), np.int8), np.zeros((3, 3, channels, 1), np.int8)
    fn = lambda a, b: lax.conv_general_dilated(a.astype(f32), b.astype(f32), (1, 1), "VALID",  # noqa: E731
                                               dimension_numbers=("NHWC", "HWIO", "NHWC"))
    enc = encode(capture(fn, (xq, wq)).graph)
    saturate(enc.egraph, Schedule.of("quant"))
    frozen = freeze(enc.egraph)
    convs = [n for nodes in frozen.classes.values() for n in nodes if n.fn == "conv"]
    assert len(convs) == (2 if int8 else 1)


def test_under_strict_an_int8_convolution_keeps_its_integer_outputs_bit_identical():
    """The rescaled conv feeds round then an int8 cast: under strict its cone is computed as captured, so
    the int8 outputs equal jax.jit's exactly (the fused kernel may move one by one: numerics="fast")."""
    args = qconv_args(2, 9, 16, 32, seed=1)
    fn = superopt(qconv_fn, target="cpu")
    np.testing.assert_array_equal(np.asarray(fn(*args)), np.asarray(jax.jit(qconv_fn)(*args)))
    assert not fn.report.optimized or fn.report.extraction.pinned > 0, fn.report.extraction
