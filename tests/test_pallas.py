"""Pallas lowering (`lowering/pallas`): every template in interpret mode on random shapes and random tiles,
ragged edges included, with blocks as the term gives them and rounded up to powers of two (Triton's
rule; the padding is NaN in interpret mode, so a mask that misses shows); whole programs through
`superopt(..., backend="pallas")`; and the BERT-base encoder layer entirely in Pallas kernels.

With SUPEROPT_PALLAS_MODE=gpu (what `.ci/gpu-run` sets on a GPU machine) the same tests compile the
kernels with Triton instead: blocks are then always powers of two, as Triton requires."""
from __future__ import annotations

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from superopt import superopt
from superopt.core.ir import Graph, Node
from superopt.extract.target import load_target
from superopt.extract.tiling import Tiling
from superopt.lowering.jax import lower
from superopt.lowering.pallas.blocks import Options, plural
from superopt.lowering.pallas.program import PallasProgram, compare, narrowest_floats
from superopt.core.reference import evaluate as reference
from superopt.lowering.pallas.program import default_options

pytestmark = pytest.mark.slow   # whole models, worker processes or long searches: make test, not test-fast

ON_GPU = os.environ.get("SUPEROPT_PALLAS_MODE", "interpret") == "gpu"
if ON_GPU and jax.default_backend() != "gpu":
    raise RuntimeError("SUPEROPT_PALLAS_MODE=gpu, but JAX sees no GPU")
MODE = "compiled with Triton" if ON_GPU else "interpret mode"


def mode(pow2: bool) -> Options:
    """The kernels' options: interpret mode here, Triton (power-of-two blocks) on a GPU."""
    return default_options() if ON_GPU else Options(interpret=True, pow2=pow2)

H100 = load_target("gpu-h100")
FEW = settings(max_examples=5, deadline=None)
F32 = "float32"
DTYPES = [F32, "bfloat16", "float16"]
RTOL = {F32: 2e-5, "bfloat16": 2e-2, "float16": 2e-3}   # summation order, in the dtype's own rounding


class Body:
    """A kernel body built as extraction builds one (`extract/kernels.py`): loads, broadcasts to the
    kernel's shape before a binary op, row reductions kept as a size-1 axis."""

    def __init__(self, *inputs):
        self.inputs = [(tuple(s), d) for s, d in inputs]
        self.nodes: list[Node] = []

    def add(self, op, ins=(), attrs=(), shape=None, dtype=None) -> int:
        first = self.nodes[ins[0]] if ins else None
        self.nodes.append(Node(op, tuple(ins), tuple(attrs), tuple(first.shape if shape is None else shape),
                               dtype or first.dtype))
        return len(self.nodes) - 1

    def arg(self, k: int) -> int:
        shape, dtype = self.inputs[k]
        return self.add("arg", (), (k,), shape, dtype)

    def lit(self, value, dtype=F32) -> int:
        return self.add("lit", (), (value,), (), dtype)

    def bcast(self, i: int, shape) -> int:
        src = self.nodes[i].shape
        if src == tuple(shape):
            return i
        return self.add("broadcast", (i,), (tuple(range(len(src))),), shape)

    def op(self, op: str, *ins, dtype=None) -> int:
        shape = np.broadcast_shapes(*(self.nodes[i].shape for i in ins))
        return self.add(op, [self.bcast(i, shape) for i in ins], dtype=dtype)

    def row(self, op: str, i: int) -> int:
        x = self.nodes[i]
        r = self.add(op, (i,), ((len(x.shape) - 1,),), x.shape[:-1])
        return self.add("reshape", (r,), (), x.shape[:-1] + (1,))

    def mm(self, a: int, b: int, dtype=F32) -> int:
        sa, sb = self.nodes[a].shape, self.nodes[b].shape
        shape = sa[:-1] + sb[-1:] if len(sb) == 2 else sa[:-1] + sb[-1:]
        return self.add("matmul", (a, b), (), shape, dtype)

    def t(self, i: int, perm) -> int:
        return self.add("transpose", (i,), (tuple(perm),), tuple(self.nodes[i].shape[p] for p in perm))

    def graph(self, tiling=None) -> Graph:
        args = [Node("arg", (), (k,), s, d) for k, (s, d) in enumerate(self.inputs)]
        out = self.nodes[-1]
        attrs = (tuple(self.nodes),) + ((tiling,) if tiling is not None else ())
        kernel = Node("kernel", tuple(range(len(args))), attrs, out.shape, out.dtype)
        return Graph(nodes=args + [kernel], outputs=[len(args)], n_args=len(args))


def tiling(online=False, **tiles) -> Tiling:
    order = ("m", "l", "k", "n") if "l" in tiles else ("m", "n", "k")
    return Tiling(order, tuple(tiles.items()), online, moved_bytes=0.0, tile_bytes=0)


def data(seed: int, *specs):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s).astype(np.float32)).astype(d) for s, d in specs]


def assert_close(got, want, rtol):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    scale = float(np.max(np.abs(want))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


def check(graph: Graph, args, pow2=False, rtol=2e-5) -> PallasProgram:
    """Run `graph` on Pallas and with the JAX lowering; they must agree."""
    program = PallasProgram(graph, H100, mode(pow2))
    for got, want in zip(program(*args), lower(graph)(*args)):
        assert_close(got, want, rtol)
    assert not program.in_jax
    return program


def only_launch(program: PallasProgram, kind: str):
    assert [launch.kind for launch in program.launches] == [kind], program.describe()
    launch = program.launches[0]
    assert not launch.detail.startswith("one program"), launch   # its own template ran, not the fallback
    return launch


# ---- elementwise and row kernels ----

@FEW
@given(rows=st.integers(1, 70), cols=st.integers(1, 1200), pow2=st.booleans(), dtype=st.sampled_from(DTYPES))
def test_elementwise_chain(rows, cols, pow2, dtype):
    b = Body(((rows, cols), dtype), ((1, cols), dtype), ((), dtype))
    x, bias, s = b.arg(0), b.arg(1), b.arg(2)
    y = b.op("mul", b.op("add", x, bias), s)
    b.op("sub", b.op("tanh", y), b.op("max", x, b.lit(0.0, dtype)))
    program = check(b.graph(), data(rows * cols, *b.inputs), pow2, RTOL[dtype])
    only_launch(program, "elementwise")


@FEW
@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 40), st.integers(2, 6), st.integers(1, 70)),
       pow2=st.booleans())
def test_elementwise_transposed_load_and_store(shape, pow2):
    """A transpose inside the body: the operand's BlockSpec permutes the program ids."""
    b = Body((shape, F32), ((shape[0], shape[2], shape[1], shape[3]), F32))
    x, y = b.arg(0), b.arg(1)
    b.op("add", b.t(b.op("exp", x), (0, 2, 1, 3)), y)
    program = check(b.graph(), data(sum(shape), *b.inputs), pow2)
    only_launch(program, "elementwise")


def layer_norm(b: Body, x: int, n: int, g: int) -> int:
    dt = b.nodes[x].dtype
    mean = b.op("div", b.row("reduce_sum", x), b.lit(float(n), dt))
    d = b.op("sub", x, mean)
    var = b.op("div", b.row("reduce_sum", b.op("square", d)), b.lit(float(n), dt))
    return b.op("mul", b.op("div", d, b.op("sqrt", b.op("add", var, b.lit(1e-5, dt)))), g)


def softmax(b: Body, x: int) -> int:
    top = b.op("max", b.lit(-np.inf, b.nodes[x].dtype), b.row("reduce_max", x))
    e = b.op("exp", b.op("sub", x, b.add("stop_gradient", (top,))))
    return b.op("div", e, b.row("reduce_sum", e))


def rms_norm(b: Body, x: int, n: int, g: int) -> int:
    dt = b.nodes[x].dtype
    ms = b.op("div", b.row("reduce_sum", b.op("square", x)), b.lit(float(n), dt))
    return b.op("mul", b.op("mul", x, b.op("rsqrt", b.op("add", ms, b.lit(1e-6, dt)))), g)


@FEW
@given(lead=st.integers(1, 3), rows=st.integers(1, 45), cols=st.integers(2, 900),
       which=st.sampled_from(["softmax", "layernorm", "rmsnorm"]), pow2=st.booleans(),
       dtype=st.sampled_from(DTYPES))
def test_row_kernels(lead, rows, cols, which, pow2, dtype):
    b = Body(((lead, rows, cols), dtype), ((1, 1, cols), dtype))
    x, g = b.arg(0), b.arg(1)
    {"softmax": lambda: softmax(b, x), "layernorm": lambda: layer_norm(b, x, cols, g),
     "rmsnorm": lambda: rms_norm(b, x, cols, g)}[which]()
    program = check(b.graph(), data(rows + cols, *b.inputs), pow2, RTOL[dtype])
    only_launch(program, "row kernel")


@FEW
@given(lead=st.integers(1, 3), rows=st.integers(1, 45), cols=st.integers(1, 700), pow2=st.booleans())
@example(lead=1, rows=4, cols=2, pow2=False)      # the fuzz-found (4, 2) - (1, 2)
def test_operands_broadcast_along_axes_of_extent_one(lead, rows, cols, pow2):
    """Binary ops whose operands have extent 1 where the result does not ((1, 1, n), (1, m, 1) against
    (b, m, n)), with no broadcast node in the body (the IR broadcasts them, as lax does): the operand's
    block lacks those axes and is broadcast to the result's block."""
    b = Body(((lead, rows, cols), F32), ((1, 1, cols), F32), ((1, rows, 1), F32), ((lead, 1, 1), F32))
    x, bias, scale, shift = b.arg(0), b.arg(1), b.arg(2), b.arg(3)
    y = b.add("sub", (x, bias))
    z = b.add("mul", (y, scale))
    b.add("max", (z, shift))
    program = check(b.graph(), data(lead + rows + cols, *b.inputs), pow2)
    only_launch(program, "elementwise")


@FEW
@given(m=st.integers(1, 50), n=st.integers(1, 70), k=st.integers(1, 40), tm=st.integers(1, 32),
       tn=st.integers(1, 32), tk=st.integers(1, 16), pow2=st.booleans())
def test_matmul_epilogue_with_an_operand_of_extent_one(m, n, k, tm, tn, tk, pow2):
    """x @ W + bias with bias (1, n) and no broadcast node, then a row scale (m, 1): in the epilogue."""
    b = Body(((m, k), F32), ((k, n), F32), ((1, n), F32), ((m, 1), F32))
    y = b.add("add", (b.mm(b.arg(0), b.arg(1)), b.arg(2)))
    b.add("mul", (y, b.arg(3)))
    program = check(b.graph(tiling(m=tm, n=tn, k=tk)), data(m + n + k, *b.inputs), pow2)
    only_launch(program, "matmul")


@FEW
@given(rows=st.integers(2, 50), cols=st.integers(1, 130), pow2=st.booleans())
def test_column_reduction(rows, cols, pow2):
    """A reduction over a leading axis (a bias gradient): that axis is whole, the columns are tiled."""
    b = Body(((rows, cols), F32))
    b.add("reduce_sum", (b.op("square", b.arg(0)),), ((0,),), (cols,))
    check(b.graph(), data(rows, *b.inputs), pow2)


# ---- matmul with prologue, epilogue and a K loop ----

@FEW
@given(m=st.integers(1, 70), n=st.integers(1, 90), k=st.integers(1, 100), tm=st.integers(1, 48),
       tn=st.integers(1, 48), tk=st.integers(1, 40), pow2=st.booleans(), dtype=st.sampled_from([F32, "bfloat16"]))
def test_matmul_epilogue_k_loop(m, n, k, tm, tn, tk, pow2, dtype):
    """gelu(x + b1) @ W + b2, relu: a prologue on A per K step, the epilogue once on the accumulator."""
    b = Body(((2, m, k), dtype), ((1, 1, k), dtype), ((k, n), dtype), ((1, 1, n), F32))
    a = b.op("tanh", b.op("add", b.arg(0), b.arg(1)))
    y = b.op("add", b.mm(a, b.arg(2), F32), b.arg(3))
    b.op("max", y, b.lit(0.0))
    t = tiling(m=tm, n=tn, k=tk)
    program = check(b.graph(t), data(m + n + k, *b.inputs), pow2, RTOL[dtype])
    launch = only_launch(program, "matmul")
    if not pow2:   # the grid and tiles are the term's (an axis of extent 1 has no grid axis)
        grid = [2] + [math.ceil(e / min(t, e)) for e, t in ((m, tm), (n, tn)) if e > 1]
        assert launch.detail.startswith(f"grid {'x'.join(map(str, grid))}"), launch.detail
        if k > 1:
            assert f"TK={min(tk, k)} ({plural(math.ceil(k / min(tk, k)), 'step')})" in launch.detail


@FEW
@given(m=st.integers(1, 40), n=st.integers(2, 60), k=st.integers(2, 50), tm=st.integers(1, 32),
       tk=st.integers(1, 32), pow2=st.booleans())
def test_matmul_transposed_operand_and_row_epilogue(m, n, k, tm, tk, pow2):
    """x @ W.T with W stored transposed, then a layer norm over the output's rows (N whole)."""
    b = Body(((m, k), F32), ((n, k), F32), ((1, n), F32))
    y = b.mm(b.arg(0), b.t(b.arg(1), (1, 0)))
    layer_norm(b, y, n, b.arg(2))
    program = check(b.graph(tiling(m=tm, n=max(1, n // 3), k=tk)), data(m * n + k, *b.inputs), pow2)
    launch = only_launch(program, "matmul")
    assert "(whole)" in launch.detail or n // 3 >= n


# ---- GEMM chain and attention ----

@FEW
@given(batch=st.integers(1, 3), m=st.integers(1, 40), k=st.integers(1, 40), l_=st.integers(1, 70),
       n=st.integers(1, 30), tm=st.integers(1, 32), tk=st.integers(1, 24), tl=st.integers(1, 40),
       relu=st.booleans(), pow2=st.booleans())
def test_gemm_chain(batch, m, k, l_, n, tm, tk, tl, relu, pow2):
    """(A @ B) @ D or relu(A @ B) @ D, batched: L walked by TL, K by TK inside each L step; C never
    leaves the kernel."""
    b = Body(((batch, m, k), F32), ((batch, k, l_), F32), ((batch, l_, n), F32))
    c = b.mm(b.arg(0), b.arg(1))
    b.mm(b.op("max", c, b.lit(0.0)) if relu else c, b.arg(2))
    program = check(b.graph(tiling(m=tm, n=n, k=tk, l=tl)), data(m + k + l_ + n, *b.inputs), pow2)
    launch = only_launch(program, "GEMM chain")
    if not pow2 and l_ > 1:
        assert f"TL={min(tl, l_)} ({plural(math.ceil(l_ / min(tl, l_)), 'step')})" in launch.detail


@FEW
@given(batch=st.integers(1, 3), m=st.integers(1, 40), k=st.integers(1, 30), l_=st.integers(1, 50),
       n=st.integers(1, 20), tm=st.integers(1, 24), tk=st.integers(1, 16), tl=st.integers(1, 32),
       pow2=st.booleans(), dtype=st.sampled_from([F32, "bfloat16"]), rows=st.booleans())
@example(batch=1, m=12, k=9, l_=20, n=7, tm=8, tk=8, tl=8, pow2=False, dtype=F32, rows=False)
@example(batch=1, m=9, k=7, l_=10, n=3, tm=4, tk=4, tl=4, pow2=False, dtype="bfloat16", rows=True)
def test_transposed_gemm_chain(batch, m, k, l_, n, tm, tk, tl, pow2, dtype, rows):
    """tanh(A @ B)^T @ D + bias, batched: the second GEMM contracts C's rows, so the grid runs over L by
    TL and M is walked by TM inside (ragged M masked in the second GEMM), K by TK in each M step. With
    `rows`, softmax over C's rows instead of tanh: L is reduced, so whole (one program per batch entry)."""
    b = Body(((batch, m, k), dtype), ((batch, k, l_), dtype), ((batch, m, n), dtype), ((1, 1, n), F32))
    c = b.mm(b.arg(0), b.arg(1), dtype)
    e = b.mm(b.t(softmax(b, c) if rows else b.op("tanh", c), (0, 2, 1)), b.arg(2), dtype)
    b.op("add", b.add("convert", (e,), dtype=F32), b.arg(3))
    program = check(b.graph(tiling(m=tm, n=n, k=tk, l=tl)), data(m + k + l_ + n, *b.inputs), pow2, RTOL[dtype])
    launch = only_launch(program, "GEMM chain")
    if not pow2 and not rows:
        grid = [batch] * (batch > 1) + [math.ceil(l_ / min(tl, l_))] * (l_ > 1)
        assert launch.detail.startswith(f"grid {'x'.join(map(str, grid)) or '1'}"), launch.detail
        if m > 1:
            assert f"TM={min(tm, m)} ({plural(math.ceil(m / min(tm, m)), 'step')})" in launch.detail


def attention_body(heads, sq, skv, d, masked_kv=0, loaded_sum=False):
    """softmax(Q K^T / sqrt(d) + mask) V, Q stored [s, h, d] and read transposed, as BERT's layer has it;
    with `loaded_sum` the softmax divides by a per-row value it loads (a sum computed by another kernel)."""
    b = Body(((sq, heads, d), F32), ((heads, d, skv), F32), ((1, 1, skv), F32), ((heads, skv, d), F32),
             ((heads, sq, 1), F32))
    q = b.t(b.arg(0), (1, 0, 2))
    s = b.op("add", b.op("div", b.mm(q, b.arg(1)), b.lit(math.sqrt(d))), b.arg(2))
    if loaded_sum:
        top = b.op("max", b.lit(-np.inf), b.row("reduce_max", s))
        p = b.op("div", b.op("exp", b.op("sub", s, b.add("stop_gradient", (top,)))), b.arg(4))
    else:
        p = softmax(b, s)
    b.t(b.mm(p, b.arg(3)), (1, 0, 2))
    args = data(sq + skv + d, *b.inputs)
    args[2][..., :masked_kv] = -np.inf          # keys that no query may attend to (padding of a batch)
    args[4] = np.abs(args[4]) + 0.5
    return b, args


@FEW
@given(heads=st.integers(1, 3), sq=st.integers(1, 40), skv=st.integers(2, 90), d=st.integers(1, 20),
       tm=st.integers(1, 32), tl=st.integers(1, 40), masked=st.integers(0, 30), loaded_sum=st.booleans(),
       pow2=st.booleans())
@example(heads=1, sq=5, skv=40, d=3, tm=4, tl=8, masked=20, loaded_sum=False, pow2=False)  # 2 tiles all -inf
def test_flash_attention_online_softmax(heads, sq, skv, d, tm, tl, masked, loaded_sum, pow2):
    """The tiling says online softmax: L walked by TL < L with a running max and sum. Masked keys (-inf)
    may fill whole tiles, the first ones included."""
    tl = min(tl, skv - 1)
    b, args = attention_body(heads, sq, skv, d, masked_kv=min(masked, skv - 1), loaded_sum=loaded_sum)
    program = check(b.graph(tiling(online=True, m=tm, n=d, k=16, l=tl)), args, pow2)
    launch = only_launch(program, "flash attention")
    if not pow2:
        assert f"TL={tl} ({plural(math.ceil(skv / tl), 'step')})" in launch.detail


def test_attention_with_whole_rows_is_a_chain():
    """Without online softmax the same body runs the chain template, the key axis in one step."""
    b, args = attention_body(2, 20, 33, 8, masked_kv=3)
    program = check(b.graph(tiling(m=16, n=8, k=8, l=33)), args)
    assert "TL=33 (whole)" in only_launch(program, "attention").detail


# ---- fused optimizer update ----

def adam_graph(shape):
    """p, m, v, g and the step's scalars (lr, b1, b2, bias corrections) as three sibling kernels."""
    specs = [(shape, F32)] * 4 + [((), F32)] * 2
    args = [Node("arg", (), (k,), s, d) for k, (s, d) in enumerate(specs)]

    def kernel(build):
        b = Body(*specs)
        build(b, *[b.arg(k) for k in range(len(specs))])
        return b.nodes

    def m_new(b, p, m, v, g, c1, c2):
        return b.op("add", b.op("mul", b.lit(0.9), m), b.op("mul", b.lit(0.1), g))

    def v_new(b, p, m, v, g, c1, c2):
        return b.op("add", b.op("mul", b.lit(0.999), v), b.op("mul", b.lit(0.001), b.op("square", g)))

    def p_new(b, p, m, v, g, c1, c2):
        mh = b.op("div", m_new(b, p, m, v, g, c1, c2), c1)
        vh = b.op("div", v_new(b, p, m, v, g, c1, c2), c2)
        return b.op("sub", p, b.op("mul", b.lit(1e-3), b.op("div", mh, b.op("add", b.op("sqrt", vh), b.lit(1e-8)))))

    nodes = list(args)
    for build in (p_new, m_new, v_new):
        body = tuple(kernel(build))
        nodes.append(Node("kernel", tuple(range(len(args))), (body,), shape, F32))
    return Graph(nodes=nodes, outputs=[6, 7, 8], n_args=6), specs


@FEW
@given(rows=st.integers(1, 300), cols=st.integers(1, 600), pow2=st.booleans())
def test_fused_optimizer_update(rows, cols, pow2):
    graph, specs = adam_graph((rows, cols))
    args = data(rows + cols, *specs)
    args[5] = np.abs(args[5]) + 0.5
    args[4] = np.abs(args[4]) + 0.5
    args[2] = np.abs(args[2])
    program = check(graph, args, pow2)
    launch = only_launch(program, "fused update")
    assert launch.nodes == (6, 7, 8)


# ---- fallbacks, said out loud ----

def test_body_without_template_runs_as_one_program():
    """Three matmuls in one body fit no template."""
    b = Body(((12, 9), F32), ((9, 20), F32), ((20, 7), F32), ((7, 5), F32))
    b.mm(b.mm(b.op("tanh", b.mm(b.arg(0), b.arg(1))), b.arg(2)), b.arg(3))
    program = check(b.graph(), data(1, *b.inputs))
    (launch,) = program.launches
    assert launch.detail == "one program over whole arrays" and "3 matrix ops" in launch.note


def test_convolution_is_reported_in_jax():
    def fn(x, w):
        return jax.nn.relu(jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                                        dimension_numbers=("NHWC", "HWIO", "NHWC")))
    args = data(3, ((1, 6, 6, 4), F32), ((3, 3, 4, 5), F32))
    fast = superopt(fn, target="gpu-h100", backend="pallas")
    assert_close(fast(*args), fn(*args), 2e-5)
    program = fast.compile(*args).run
    assert any("conv" in what for what in program.in_jax), program.in_jax
    assert fast.report.backend.runs == "pallas" and "ops in JAX" in fast.report.backend.detail


# ---- whole programs ----

@pytest.mark.parametrize("target", ["gpu-h100", "gpu-a100"])
def test_superopt_backend_pallas(target):
    def mlp(x, w1, b1, w2):
        h = jax.nn.gelu(x @ w1 + b1)
        return jax.nn.softmax(h @ w2, axis=-1), jnp.sum(h * h, axis=-1)
    args = data(5, ((33, 48), F32), ((48, 80), F32), ((80,), F32), ((80, 17), F32))
    fast = superopt(mlp, target=target, backend="pallas")
    for got, want in zip(fast(*args), mlp(*args)):
        assert_close(got, want, 2e-5)
    assert fast.report.backend.detail.startswith(f"pallas ({MODE})"), fast.report.backend
    program = fast.compile(*args).program
    assert isinstance(program, PallasProgram) and program.launches and not program.in_jax


@FEW
@given(m=st.integers(1, 30), n=st.integers(1, 40), k=st.integers(1, 60), tk=st.integers(1, 16), pow2=st.booleans())
def test_a_bf16_value_rounds_at_its_type_inside_a_kernel(m, n, k, tk, pow2):
    """bf16(A @ W) * s, a bf16 product, then f32 + bias, on small integers and bf16 scales: every value
    is exact in f32, so the only rounding is the one the term declares, of the bf16 product. In interpret
    mode XLA computes a bf16 multiply in f32 and, fused with the convert after it, keeps the f32 value;
    the kernel must round it (`blocks.typed`) as the reference at declared types does."""
    b = Body(((m, k), F32), ((k, n), F32), ((1, n), "bfloat16"), ((1, n), F32))
    y = b.add("convert", (b.mm(b.arg(0), b.arg(1)),), dtype="bfloat16")
    z = b.add("convert", (b.add("mul", (y, b.arg(2))),), dtype=F32)
    b.add("add", (z, b.arg(3)))
    graph = b.graph(tiling(m=16, n=16, k=tk))
    rng = np.random.default_rng(m * n * k)
    args = [rng.integers(-3, 4, (m, k)).astype(F32), rng.integers(-3, 4, (k, n)).astype(F32),
            (1 + rng.integers(1, 128, (1, n)) / 128).astype(jnp.bfloat16), np.full((1, n), 0.5, F32)]
    program = PallasProgram(graph, H100, mode(pow2))
    only_launch(program, "matmul")
    np.testing.assert_array_equal(np.asarray(program(*args)[0]), reference(graph, args)[0])


def test_check_judges_an_output_at_the_narrowest_type_it_is_computed_through():
    """A Pallas kernel writes a bf16 intermediate at bf16; XLA keeps it in f32 inside a fusion. The
    backend's check allows the bf16 rounding on outputs computed through a bf16 value, only there."""
    def fn(a, x):
        return jnp.exp(jnp.sin(a).astype(jnp.float32)), jnp.exp(x) * 2.0
    args = [np.linspace(0.1, 0.9, 24, dtype=np.float32).reshape(4, 6).astype(jnp.bfloat16),
            np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)]
    fast = superopt(fn, target="gpu-h100", backend="pallas")
    got = fast(*args)
    assert fast.report.backend.detail.startswith(f"pallas ({MODE})"), fast.report.backend
    rounded = np.exp(np.asarray(jnp.sin(args[0]), np.float32))      # sin rounded to bf16, as declared
    assert_close(got[0], rounded, 1e-6)
    graph = fast.compile(*args).term
    assert narrowest_floats(graph) == ["bfloat16", None]
    want = [np.exp(np.sin(args[0].astype(np.float32))), np.exp(args[1]) * 2]
    off = [want[0], want[1] * np.float32(1 + 3e-4)]                  # 3e-4 off on the f32-only output
    assert compare(graph, want, [rounded, want[1]]) is None
    assert "output 1" in compare(graph, want, off)


def test_pallas_backend_needs_a_gpu_target():
    with pytest.raises(ValueError, match="pallas"):
        superopt(lambda x: x + 1, target="cpu", backend="pallas")


def _primitives(jaxpr) -> list:
    """Primitive names of the equations of a jaxpr, looking inside nested jits but not pallas_call."""
    names = []
    for eqn in jaxpr.eqns:
        inner = eqn.params.get("jaxpr")
        if eqn.primitive.name != "pallas_call" and inner is not None:
            names += _primitives(getattr(inner, "jaxpr", inner))
        else:
            names.append(eqn.primitive.name)
    return names


def test_bert_encoder_layer_entirely_in_pallas():
    """The BERT-base layer (full size, seq 128) for gpu-h100: every kernel node and every op that computes
    runs inside a pallas_call on its kind's template; outside the kernels only reshapes (views) remain.
    The result equals the original function's."""
    from superopt.workloads import bert_encoder_layer
    wl = bert_encoder_layer(128)
    fast = superopt(wl.fn, target="gpu-h100", backend="pallas")
    got = fast(*wl.args)
    assert_close(got, wl.fn(*wl.args), 1e-4)
    spec = fast.compile(*wl.args)
    program = spec.program
    assert isinstance(program, PallasProgram) and not program.in_jax
    assert all(not launch.detail.startswith("one program") for launch in program.launches), program.describe()
    covered = {i for launch in program.launches for i in launch.nodes}
    term = spec.term
    for i in term.live():
        if term.nodes[i].op not in ("arg", "lit", "const", "reshape"):
            assert i in covered, f"%{i} {term.nodes[i].op} is not in a Pallas kernel"
    kinds = program.kinds()
    assert kinds.get("matmul", 0) >= 4 and kinds.get("attention", 0) + kinds.get("flash attention", 0) == 1
    flat = jax.tree_util.tree_leaves(wl.args)
    outside = set(_primitives(jax.make_jaxpr(program._evaluate)(flat, program._hoisted).jaxpr))
    assert "pallas_call" in outside and outside <= {"pallas_call", "reshape"}, outside


# ---- make bench-gpu ----

def test_bench_gpu_refuses_without_a_gpu(tmp_path, capsys):
    from bench import gpu
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# Benchmarks\n\n## Other\n\nkept\n")
    assert gpu.main(["--output", str(out)]) == 2
    assert "no GPU" in capsys.readouterr().err
    assert out.read_text() == "# Benchmarks\n\n## Other\n\nkept\n"


def test_bench_gpu_section_replaces_its_own_only(tmp_path):
    from bench.gpu import SECTION, write_section
    out = tmp_path / "BENCHMARKS.md"
    out.write_text(f"# B\n\n## One\n\nx\n\n{SECTION}\n\nold\n\n## Two\n\ny\n")
    write_section(out, f"{SECTION}\n\nnew\n")
    assert out.read_text() == f"# B\n\n## One\n\nx\n\n{SECTION}\n\nnew\n\n## Two\n\ny\n"
