"""Cost of one op on a target: a roofline (FLOPs over peak, bytes over bandwidth) plus launch overhead.

A plain function of (op, attrs, input types, output type, target), testable without an e-graph. Costs
are in seconds and monotonic: a term never costs less than any of its sub-terms.
"""
from __future__ import annotations

import math

import numpy as np

from superopt.egraph.ir import ARG_REDUCTIONS, BINARY_OPS, REDUCTIONS, UNARY_OPS
from superopt.extract.target import Target

Type = tuple[tuple[int, ...], str]  # (shape, dtype)

TRANSCENDENTAL = frozenset({"exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "erf", "erfc", "erf_inv",
                            "sin", "cos", "tan", "pow", "atan2", "sqrt", "rsqrt", "cbrt"})
FREE = frozenset({"arg", "const", "lit", "reshape"})  # leaves, and reshape (a bitcast of a dense array)


def nbytes(t: Type) -> int:
    shape, dtype = t
    return math.prod(shape) * (1 if dtype == "bool" else np.dtype(dtype).itemsize)


def size(t: Type) -> int:
    return math.prod(t[0])


def flops(op: str, attrs: tuple, ins: list[Type], out: Type, target: Target) -> float:
    if op == "matmul":
        (a_shape, _), (b_shape, _) = ins
        return 2.0 * size(out) * a_shape[-1]
    if op == "conv":
        params = dict(attrs[0])
        rhs_shape = ins[1][0]
        out_features = rhs_shape[params["dimension_numbers"].rhs_spec[0]]
        return 2.0 * size(out) * math.prod(rhs_shape) / out_features
    if op in UNARY_OPS or op in BINARY_OPS:
        return size(out) * (target.transcendental_flops if op in TRANSCENDENTAL else 1)
    if op in REDUCTIONS or op in ARG_REDUCTIONS:
        return float(size(ins[0]))
    if op.startswith("reduce_window"):
        return float(size(out) * math.prod(attrs[0]))
    if op == "integer_pow":
        return size(out) * max(1, abs(attrs[0]).bit_length())
    return 0.0


MATRIX_OPS = frozenset({"matmul", "conv"})
MATRIX_DTYPES = frozenset({"float16", "bfloat16"})  # what tensor cores and the cube take at their peak


def compute_rate(op: str, ins: list[Type], target: Target) -> float:
    """FLOP/s this op gets: the matrix unit for matmul/conv where the target has one (on a GPU only for
    f16/bf16 operands; the NPU's cube is the only place a matmul runs well), the general units otherwise."""
    if op in MATRIX_OPS and target.matrix_flops:
        if target.kind == "npu" or (target.kind == "gpu" and ins and ins[0][1] in MATRIX_DTYPES):
            return target.matrix_flops
        if target.kind == "cpu":
            return target.matrix_flops
    return target.peak_flops


# An unfused op is one kernel. Vector kernels on an NPU stream tiles of this many bytes per operand.
NPU_VECTOR_TILE = 16 * 1024
NPU_CUBE_TILE = (128, 128, 64)


def op_breakdown(op: str, attrs: tuple, ins: list[Type], out: Type, target: Target) -> dict:
    """The op as one kernel on `target`: FLOPs, bytes and time, plus the target model's own factors
    (GPU: registers, occupancy, penalties; NPU: unit, UB bytes, whether the tiles fit)."""
    if op in FREE:
        return {"flops": 0.0, "bytes": 0, "time": 0.0}
    moved = nbytes(out) + sum(nbytes(t) for t in ins if t[0])  # rank-0 operands live in registers
    work = flops(op, attrs, ins, out, target)
    if target.kind == "gpu":
        from superopt.extract.models.gpu import GpuKernel, breakdown
        itemsize = max(1, nbytes(((1,), out[1])))
        return breakdown(GpuKernel(work, moved, live_values=len(ins) + 2, value_bytes=itemsize,
                                   tensor_cores=compute_rate(op, ins, target) == target.matrix_flops), target)
    if target.kind == "npu":
        from superopt.extract.models.npu import NpuKernel, breakdown, matmul_tiles
        if op in MATRIX_OPS:
            kernel = NpuKernel("cube", work, moved, **matmul_tiles(*NPU_CUBE_TILE))
        else:
            kernel = NpuKernel("vector", work, moved, ub_live_bytes=(len(ins) + 1) * min(NPU_VECTOR_TILE, nbytes(out)))
        return breakdown(kernel, target)
    compute = work / compute_rate(op, ins, target)
    return {"flops": work, "bytes": moved, "time": max(compute, moved / target.mem_bandwidth) + target.launch_overhead}


def op_cost(op: str, attrs: tuple, ins: list[Type], out: Type, target: Target) -> float:
    """Seconds for one op run as one kernel on `target` (see `op_breakdown`)."""
    return op_breakdown(op, attrs, ins, out, target)["time"]
