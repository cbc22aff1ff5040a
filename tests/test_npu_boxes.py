"""The NPU cost model and the vector code generator agree on what fits the Unified Buffer
(extract/models/boxes.py): a kernel the model prices is one the generator places, and one the generator
cannot place costs infinity, so the extractor never chooses a kernel the NPU lowering then refuses."""
import math

import jax
import jax.numpy as jnp
import pytest

from superopt.core.ir import Node
from superopt.egraph.capture import capture
from superopt.extract.cost import kernel_breakdown
from superopt.extract.target import load_target
from superopt.lowering.npu.codegen import CodegenError
from superopt.lowering.npu.lower import KernelLowering


def body_of(fn, *shapes):
    """`fn` captured as one kernel body: its arguments and literals are the kernel's inputs."""
    graph = capture(fn, tuple(jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes)).graph
    body, ins, index = [], [], {}
    for i, n in enumerate(graph.nodes):
        index[i] = len(body)
        if n.op in ("arg", "lit", "const"):
            body.append(Node("arg", (), (len(ins),), n.shape, n.dtype))
            ins.append((n.shape, n.dtype))
        else:
            body.append(Node(n.op, tuple(index[j] for j in n.inputs), n.attrs, n.shape, n.dtype))
    return tuple(body), ins, (body[-1].shape, body[-1].dtype)


def placed(body, ins, out, target) -> str | None:
    """None where the code generator lowers the kernel, else its error."""
    try:
        KernelLowering(body, [(f"in{k}", s, d) for k, (s, d) in enumerate(ins)], ("out", out[0], out[1]), None,
                       target, 0, "k", lambda name, shape, dtype: name).stages()
        return None
    except CodegenError as exc:
        return str(exc)


def residual_rms_norm_matmul(x, r, g, w):
    t = x + r
    return (t * jax.lax.rsqrt(jnp.mean(t * t, -1, keepdims=True) + 1e-6) * g) @ w


CASES = [(f"rms-norm prologue, d={d}", residual_rms_norm_matmul, ((1, 16, d), (1, 16, d), (d,), (d, 64)))
         for d in (1024, 4096, 8192)] + \
        [(f"elementwise row of {w}", lambda x, y: x * y + 1, ((8, w), (8, w))) for w in (1000, 11008, 50000)] + \
        [(f"softmax row of {w}", lambda x: jax.nn.softmax(x, -1), ((8, w),)) for w in (1000, 11008)] + \
        [("layer norm epilogue", lambda x, w: jax.nn.standardize(x @ w, axis=-1), ((16, 256), (256, 6000)))]


@pytest.mark.parametrize("target", ["npu-910b", "npu-910"])
@pytest.mark.parametrize("name, fn, shapes", CASES, ids=[c[0] for c in CASES])
def test_the_model_prices_exactly_the_kernels_the_generator_places(name, fn, shapes, target):
    tgt = load_target(target)
    body, ins, out = body_of(fn, *shapes)
    model = kernel_breakdown(body, ins, out, tgt)
    error = placed(body, ins, out, tgt)
    assert math.isfinite(model.time) == (error is None), (model.overflow, error)
    if error is not None:   # the same bytes, counted the same way
        assert model.overflow.split()[2] in error, (model.overflow, error)


def test_a_long_elementwise_row_is_cut_into_chunks_not_refused():
    """A row of 11008 float32 values (44 KB) times another: the model priced it at infinity, as if a box
    had to hold whole rows, and so priced a whole Llama-style layer at infinity on the NPU."""
    body, ins, out = body_of(lambda x, y: x * y, (1, 128, 11008), (1, 128, 11008))
    assert math.isfinite(kernel_breakdown(body, ins, out, load_target("npu-910b")).time)


@pytest.mark.parametrize("target", ["npu-910b", "npu-910"])
@pytest.mark.parametrize("op, axes, shape", [("reduce_sum", (0, 1), (512, 1024)),
                                             ("reduce_and", (0, 1), (512, 1024)),
                                             ("reduce_max", (0, 2), (8, 64, 2048)),
                                             ("reduce_sum", (1, 2), (4, 96, 4096))])
def test_a_reduction_over_several_axes_is_priced_as_the_two_stages_it_runs(target, op, axes, shape):
    """A one-op reduction over several axes, the last among them, runs as a row stage and a stage over the
    rest (`row_stages`): the model prices those, finite, where one stage's box would hold every reduced
    axis (a training step's gradient norm was priced at infinity, and so was every program holding it)."""
    from superopt.core.ir import Graph
    from superopt.extract.cost import op_breakdown, reduces_by_rows, row_stages
    from superopt.lowering.npu.lower import NpuExecutable
    t = load_target(target)
    dtype = "bool" if op == "reduce_and" else "float32"
    out = (tuple(d for k, d in enumerate(shape) if k not in axes), dtype)
    assert reduces_by_rows(op, (axes,), shape)
    b = op_breakdown(op, (axes,), [(shape, dtype)], out, t)
    assert math.isfinite(b.time) and not b.overflow
    stages = row_stages(op, (axes,), (shape, dtype), out)
    assert sum(kernel_breakdown(body, [x], y, t).time for body, x, y in stages) == pytest.approx(b.time)
    graph = Graph(nodes=[Node("arg", (), (0,), shape, dtype), Node(op, (0,), (axes,), out[0], dtype)], outputs=[1])
    executable = NpuExecutable(graph, t, precision="fp16")
    assert not executable.host_ops and len([s for s in executable.stages if s.program is not None]) == 2
