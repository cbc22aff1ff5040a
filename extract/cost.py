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


def op_cost(op: str, attrs: tuple, ins: list[Type], out: Type, target: Target) -> float:
    """Seconds for one op: max(compute, memory) + launch, under the target's roofline."""
    if op in FREE:
        return 0.0
    moved = nbytes(out) + sum(nbytes(t) for t in ins if t[0])  # rank-0 operands live in registers
    compute = flops(op, attrs, ins, out, target) / compute_rate(op, ins, target)
    return max(compute, moved / target.mem_bandwidth) + target.launch_overhead
