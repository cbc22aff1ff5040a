"""The Pallas kernels under Triton's rules, checked on a CPU: the kernels are traced as Triton would
compile them (`compiled_options`: not interpret mode; tracing needs no GPU) and their bodies inspected,
and the same rules are run in interpret mode (`Options.triton_rules`) to check what they compute.

What the first GPU run found (BENCHMARKS.md, "Pallas kernels on a GPU"): Triton has no bfloat16 tanh or
division, f32 dots default to TF32, a block past the end of an array is not masked by Pallas-Triton, and
a BERT kernel's tiles asked for more shared memory than a block may have."""
from __future__ import annotations

import inspect

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from superopt.core.ir import Node
from superopt.core.ops import ELEMENTWISE, OPS, REDUCTIONS
from superopt.extract.target import load_target
from superopt.lowering.jax import lower
from superopt.lowering.pallas.blocks import (
    LEAST_DOT, NARROW, STAGES, TRITON_GAPS, Options, shared_bytes,
)
from superopt.lowering.pallas.program import PallasProgram, compiled_options
from tests.test_pallas import F32, RTOL, Body, assert_close, data, tiling

H100 = load_target("gpu-h100")
TRITON = compiled_options(H100)
FEW = settings(max_examples=4, deadline=None)
# primitives that compute on their operands' values (a narrow float operand is what Triton lacks)
ARITH = {"add", "sub", "mul", "div", "tanh", "exp", "log", "sqrt", "rsqrt", "max", "min", "neg", "abs",
         "logistic", "integer_pow", "pow", "reduce_sum", "reduce_max", "reduce_min", "exp2", "log1p",
         "expm1", "sin", "cos", "square", "sign", "rem"}


def kernel_eqns(program: PallasProgram, args) -> list:
    """Every equation inside the program's pallas_call bodies (nested jaxprs included)."""
    flat = [jnp.asarray(a) for a in args]
    outer = jax.make_jaxpr(program._evaluate)(flat, program._hoisted).jaxpr
    out = []

    def walk(jaxpr, inside):
        for eqn in jaxpr.eqns:
            if inside:
                out.append(eqn)
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub, inside or eqn.primitive.name == "pallas_call")
    walk(outer, False)
    return out


def narrow_arithmetic(eqns) -> list[str]:
    return [f"{e.primitive.name}({', '.join(str(v.aval) for v in e.invars)})" for e in eqns
            if e.primitive.name in ARITH and any(np.dtype(v.aval.dtype).name in NARROW for v in e.invars)]


def test_triton_gaps_are_the_ops_the_installed_triton_lowering_lacks():
    """TRITON_GAPS (ops a kernel under Triton refuses, so that their node runs in JAX) is exactly the set
    of ops whose float32 (or boolean) JAX lowering uses a primitive Pallas-Triton has no rule for."""
    lowering = pytest.importorskip("jax._src.pallas.triton.lowering")
    rules = lowering.triton_lowering_rules
    lacking = set()
    for name in sorted(ELEMENTWISE | REDUCTIONS):
        op = OPS[name]
        if op.jax is None or name == "convert":
            continue
        for dtype in (F32, "bool"):
            if name in REDUCTIONS:
                node, args = Node(name, (), ((1,),), (4,), dtype), [jnp.zeros((4, 16), dtype)]
            else:
                arity = len(inspect.signature(op.jax).parameters) - 1
                node = Node(name, (), (2,) if name == "integer_pow" else (), (4, 16), dtype)
                args = [jnp.zeros((4, 16), "bool" if name == "select" and k == 0 else dtype) for k in range(arity)]
            try:
                jaxpr = jax.make_jaxpr(lambda *xs: op.jax(node, *xs))(*args).jaxpr
            except Exception:      # the op does not take this type at all
                continue
            if dtype == F32 and any(e.primitive not in rules for e in jaxpr.eqns):
                lacking.add(name)
            if dtype == "bool" and name.startswith("reduce_") and any(e.primitive not in rules for e in jaxpr.eqns):
                lacking.add(name)
    assert lacking == set(TRITON_GAPS)


def test_narrow_float_ops_compute_in_float32_under_triton():
    """gelu(x @ W + b) / s and a softmax, all bf16: under Triton no arithmetic op inside a kernel takes a
    bf16 operand (Triton has no bf16 tanh, exp or division), while in interpret mode they do (the body
    is the same; the check can fail)."""
    bf = "bfloat16"
    b = Body(((40, 24), bf), ((24, 48), bf), ((1, 48), bf), ((), bf))
    y = b.op("add", b.mm(b.arg(0), b.arg(1), bf), b.arg(2))
    g = b.op("tanh", b.op("mul", y, b.lit(0.79, bf)))
    s = b.op("div", g, b.arg(3))
    e = b.op("exp", b.op("sub", s, b.row("reduce_max", s)))
    b.op("div", e, b.row("reduce_sum", e))
    graph = b.graph(tiling(m=16, n=16, k=16))
    args = data(0, *b.inputs)
    compiled = PallasProgram(graph, H100, TRITON)
    assert not compiled.in_jax, compiled.describe()
    assert narrow_arithmetic(kernel_eqns(compiled, args)) == []
    interpret = PallasProgram(graph, H100, Options(interpret=True, pow2=True))
    assert narrow_arithmetic(kernel_eqns(interpret, args))
    # rounded to bf16 where the term declares it
    converts = [e for e in kernel_eqns(compiled, args) if e.primitive.name == "convert_element_type"]
    assert any(e.params["new_dtype"] == jnp.bfloat16 for e in converts)


def test_float32_products_ask_for_full_precision():
    """Triton's f32 dot is TF32 (about 3e-4 relative error) unless asked for HIGHEST."""
    b = Body(((64, 32), F32), ((32, 64), F32))
    b.mm(b.arg(0), b.arg(1))
    program = PallasProgram(b.graph(tiling(m=32, n=32, k=16)), H100, TRITON)
    dots = [e for e in kernel_eqns(program, data(1, *b.inputs)) if e.primitive.name == "dot_general"]
    assert dots and all(e.params["precision"] == (jax.lax.Precision.HIGHEST,) * 2 for e in dots)


def test_blocks_are_powers_of_two_and_dot_operands_at_least_16():
    b = Body(((5, 7), F32), ((7, 3), F32))
    b.mm(b.arg(0), b.arg(1))
    program = PallasProgram(b.graph(tiling(m=4, n=2, k=4)), H100, TRITON)
    eqns = kernel_eqns(program, data(2, *b.inputs))
    dots = [e for e in eqns if e.primitive.name == "dot_general"]
    assert dots
    for e in dots:
        for v in e.invars:
            assert all(d >= LEAST_DOT and d & (d - 1) == 0 for d in v.aval.shape), e


def test_ragged_blocks_are_masked_under_triton():
    """Pallas-Triton masks no access: a block past the end of an array must load and store with a mask."""
    b = Body(((37, 70), F32), ((1, 70), F32))
    b.op("add", b.arg(0), b.arg(1))
    program = PallasProgram(b.graph(), H100, TRITON)
    eqns = kernel_eqns(program, data(3, *b.inputs))
    names = [e.primitive.name for e in eqns]
    assert names.count("masked_load") == 2 and names.count("masked_swap") == 1, names
    for e in eqns:
        if e.primitive.name.startswith("masked_"):
            assert any(str(v.aval).startswith("bool[") for v in e.invars), e     # with its mask
    assert "get" not in names and "swap" not in names, names       # no unmasked access


@pytest.mark.slow
@FEW
@given(m=st.integers(1, 40), n=st.integers(1, 70), k=st.integers(1, 50), tm=st.integers(1, 32),
       tn=st.integers(1, 32), tk=st.integers(1, 32), dtype=st.sampled_from([F32, "bfloat16"]))
def test_triton_rules_compute_the_declared_semantics(m, n, k, tm, tn, tk, dtype):
    """The Triton code paths (float32 compute of narrow types, masked loads and stores, NaN-propagating
    max, the product of a vector as a sum, blocks of at least 16) run in interpret mode: the results are
    the JAX lowering's, NaN included."""
    b = Body(((m, k), dtype), ((k, n), dtype), ((1, n), dtype))
    y = b.op("add", b.mm(b.arg(0), b.arg(1), dtype), b.arg(2))
    y = b.op("max", b.op("div", b.op("tanh", y), b.lit(0.5, dtype)), b.lit(0.0, dtype))
    b.op("sub", y, b.row("reduce_max", y))
    graph = b.graph(tiling(m=tm, n=tn, k=tk))
    args = data(m + n + k, *b.inputs)
    args[2] = np.asarray(args[2]).copy()
    args[2][0, 0] = np.nan         # a NaN column: max(NaN, 0) and the row maximum are NaN, as in XLA
    program = PallasProgram(graph, H100, Options(interpret=True, pow2=True, triton_rules=True,
                                                 smem_limit=H100.gpu.smem_per_block))
    assert not program.in_jax, program.in_jax
    got, = program(*args)
    want, = lower(graph)(*args)
    assert np.array_equal(np.isnan(np.asarray(got, np.float32)), np.isnan(np.asarray(want, np.float32)))
    assert_close(np.nan_to_num(got), np.nan_to_num(want), RTOL[dtype])


def test_a_wide_kernel_fits_shared_memory():
    """A BERT-sized f32 matmul whose epilogue normalises whole rows of 768 (a 1024 block), with the
    tiling's TM=256 TK=32: its operand tiles, staged three deep, would need 480 KiB; the lowering shrinks
    them to fit the 227 KiB a block may have on an H100."""
    b = Body(((128, 768), F32), ((768, 768), F32))
    y = b.mm(b.arg(0), b.arg(1))
    b.op("sub", y, b.row("reduce_max", y))
    program = PallasProgram(b.graph(tiling(m=256, n=768, k=32)), H100, TRITON)
    launch, = program.launches
    assert not program.in_jax
    stages = launch.plan.stages or STAGES
    assert shared_bytes(launch.plan, stages) <= H100.gpu.smem_per_block, launch
    assert "shared memory" in launch.note
