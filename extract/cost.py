"""Cost of one op on a target: a roofline (FLOPs over peak, bytes over bandwidth) plus launch overhead.

A plain function of (op, attrs, input types, output type, target), testable without an e-graph. Costs
are in seconds and monotonic: a term never costs less than any of its sub-terms.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from superopt.core.formats import as_matmul
from superopt.core.ir import Node
from superopt.core.ops import FREE, LAYOUT_OPS, MATRIX_OPS, MOVEMENT, REDUCTIONS, lookup
from superopt.extract.models.breakdown import FREE as NOTHING_RUNS, Breakdown
from superopt.extract.models.registry import model_of
from superopt.extract.target import Target
from superopt.extract.tiling import Tiling, Untileable, nest_of, npu_tilings, tilings

Type = tuple[tuple[int, ...], str]  # (shape, dtype)

def nbytes(t: Type) -> int:
    shape, dtype = t
    return math.prod(shape) * (1 if dtype == "bool" else np.dtype(dtype).itemsize)


def size(t: Type) -> int:
    return math.prod(t[0])


def flops(op: str, attrs: tuple, ins: list[Type], out: Type, target: Target) -> float:
    """The op's arithmetic (its op table entry's `flops`), an element of a transcendental op counted as
    `target.transcendental_flops` (of pow, as `target.pow_flops` where the target sets it), an element of a
    reduction as `target.reduction_flops` (on a CPU past `reduction_split_bytes`, as `reduction_split_flops`;
    a max or min of integers, as `target.integer_reduction_flops` where the target sets it). An op not in the
    table is an error naming it."""
    spec = lookup(op)
    work = spec.flops(attrs, ins, out)
    if op == "pow" and target.pow_flops:
        return work * target.pow_flops
    if spec.has("transcendental"):
        return work * target.transcendental_flops
    if op in REDUCTIONS and target.integer_reduction_flops and op in ("reduce_max", "reduce_min") and ins \
            and np.dtype(ins[0][1]).kind in "iub":
        return work * target.integer_reduction_flops   # exact in any order: XLA vectorises it
    if op in REDUCTIONS:
        slow = target.reduction_split_bytes and ins and nbytes(ins[0]) > target.reduction_split_bytes
        return work * (target.reduction_split_flops if slow else target.reduction_flops)
    return work


def compute_rate(op: str, ins: list[Type], target: Target) -> float:
    """FLOP/s this op gets: the matrix unit for matmul/conv where the target has one and its model runs these
    operands there (a GPU's tensor cores only f16/bf16; the NPU's cube is the only place a matmul runs well),
    the general units otherwise."""
    if op in MATRIX_OPS and target.matrix_flops and model_of(target).matrix_unit(ins):
        return target.matrix_flops
    return target.peak_flops


def one_op_body(op: str, attrs: tuple, ins: list[Type], out: Type) -> tuple:
    """The body of the kernel that runs one op: load each operand, apply the op."""
    body = tuple(Node("arg", (), (k,), shape, dtype) for k, (shape, dtype) in enumerate(ins))
    return body + (Node(op, tuple(range(len(ins))), attrs, out[0], out[1]),)


@dataclass
class KernelShape:
    """What a cost model needs to know about a kernel body (see `describe`)."""
    flops: float = 0.0
    matrix_flops: float = 0.0        # of which matmul / conv
    bytes_in: float = 0.0
    bytes_out: float = 0.0
    live_values: int = 1             # peak values live at once, loads included (registers per element)
    live_intermediates: int = 1      # peak computed values live at once (on-chip buffers)
    staged_bytes: tuple = ()         # bytes of each rank>0 operand an on-chip vector op reads (not a matmul's)
    matmul_bytes: float = 0.0        # bytes of matmul/conv results that the body computes on
    epilogue_ops: int = 0            # vector ops applied after a matmul/conv
    reduce_after_matmul: bool = False
    row_reduction: bool = False
    row_elements: int = 1            # length of the longest reduced row
    reduced_bytes: int = 0           # the bytes of the largest operand a reduction reads
    strided_bytes: float = 0.0       # bytes accessed with a permuted (transposed) pattern, where it costs
    prologue_bytes: float = 0.0      # bytes of matmul/conv operands the body computes (not plain loads)
    epilogue_compute: int = 0        # of the epilogue ops, those that compute (not transposes or views)
    loop_strided_bytes: float = 0.0  # transposed bytes an elementwise loop walks (not a matmul's operand or result)
    int8_matrix: bool = False        # a matmul / conv of int8 operands (the NPU cube runs them at twice the rate)
    # The matrices the cube reads from and writes to GM: operands (a conv's patch matrix) other than a
    # product fed straight to the next matmul (it stays on chip), and products not fed so.
    cube_gm_bytes: float = 0.0
    cube_gm_tensors: int = 0
    pure_movement: bool = False      # only loads, transposes, broadcasts, reshapes and casts
    value_bytes: int = 4


def describe(body: tuple, ins: list[Type], out: Type, target: Target) -> KernelShape:
    """Walk a kernel body (IR nodes in topological order; `arg` k is operand k) once."""
    k = KernelShape(bytes_out=nbytes(out))
    k.bytes_in = sum(nbytes(t) for t in ins if t[0])    # rank-0 operands live in registers
    after_matmul = [False] * len(body)
    last_use, users = {}, {}
    for i, node in enumerate(body):
        for j in node.inputs:
            last_use[j] = i
            users.setdefault(j, set()).add(node.op)
    users_of = [users.get(i, {"output"}) for i in range(len(body))]
    live = live_ops = 0
    buffered = [False] * len(body)
    for i, node in enumerate(body):
        node_ins = [(body[j].shape, body[j].dtype) for j in node.inputs]
        work = flops(node.op, node.attrs, node_ins, (node.shape, node.dtype), target) if node.op != "arg" else 0.0
        k.flops += work
        feeds = any(after_matmul[j] for j in node.inputs)
        if node.op in MATRIX_OPS:
            k.matrix_flops += work
            k.int8_matrix = k.int8_matrix or body[node.inputs[0]].dtype == "int8"
            k.matmul_bytes += nbytes((node.shape, node.dtype))
            after_matmul[i] = True
            k.prologue_bytes += sum(nbytes((body[j].shape, body[j].dtype)) for j in set(node.inputs)
                                    if not _loaded(body, j))
            lhs, rhs = (body[j] for j in node.inputs[:2])
            patches = math.prod(node.shape[:-1]) * math.prod(rhs.shape[:-1]) * (1 if lhs.dtype == "int8" else 2) \
                if node.op == "conv" else None
            for j, size in ((node.inputs[0], patches or nbytes((lhs.shape, lhs.dtype))),
                            (node.inputs[1], nbytes((rhs.shape, rhs.dtype)))):
                if _product_of(body, j) is None:
                    k.cube_gm_bytes += size
                    k.cube_gm_tensors += 1
        elif feeds:
            after_matmul[i] = True
            if node.op not in ("reshape",):
                k.epilogue_ops += 1
            if node.op not in ("reshape", "transpose", "broadcast"):
                k.epilogue_compute += 1
            if node.op in REDUCTIONS:
                k.reduce_after_matmul = True
        if node.op in REDUCTIONS:
            k.row_reduction = True
            k.row_elements = max(k.row_elements, node_ins[0][0][-1] if node_ins[0][0] else 1)
            k.reduced_bytes = max(k.reduced_bytes, nbytes(node_ins[0]))
        if node.op == "transpose" or node.op in LAYOUT_OPS and node.attrs[0] != "ND":
            k.strided_bytes += nbytes((node.shape, node.dtype))
            if node.op == "transpose" and body[node.inputs[0]].op not in MATRIX_OPS \
                    and not users_of[i] <= MATRIX_OPS:
                k.loop_strided_bytes += nbytes((node.shape, node.dtype))
        # Loads, reshapes and broadcasts of a rank-0 value (a register operand) need no buffer of their own.
        on_chip = node.op not in ("arg", "reshape") and not (node.op == "broadcast" and not body[node.inputs[0]].shape)
        buffered[i] = on_chip
        live += 1
        live_ops += on_chip
        k.live_values = max(k.live_values, live)
        k.live_intermediates = max(k.live_intermediates, live_ops)
        for j in set(node.inputs):
            if last_use.get(j) == i:
                live -= 1
                live_ops -= buffered[j]
    k.pure_movement = all(n.op in MOVEMENT for n in body)
    fed = {_product_of(body, j) for n in body if n.op in MATRIX_OPS for j in n.inputs[:2]}
    for i, node in enumerate(body):
        if node.op in MATRIX_OPS and i not in fed:
            k.cube_gm_bytes += nbytes((node.shape, node.dtype))
            k.cube_gm_tensors += 1
    k.staged_bytes = tuple(nbytes((n.shape, n.dtype)) for i, n in enumerate(body)
                           if n.op == "arg" and n.shape and not users.get(i, set()) <= MATRIX_OPS)
    k.value_bytes = max(1, max((nbytes(((1,), n.dtype)) for n in body), default=4))
    return k


def _product_of(body: tuple, j: int) -> int | None:
    """The matmul / conv whose product body value j is (through casts), or None."""
    while body[j].op == "convert":
        j = body[j].inputs[0]
    return j if body[j].op in MATRIX_OPS else None


def _loaded(body: tuple, j: int) -> bool:
    """Whether body value j is an operand as loaded: an `arg`, seen through views and transposes (a
    matmul takes either orientation of its operands as they are stored)."""
    while body[j].op in ("reshape", "transpose", "broadcast") and body[j].inputs:
        j = body[j].inputs[0]
    return body[j].op == "arg"


def tiling_options(body: tuple, ins: list[Type], out: Type, target: Target) -> tuple[tuple, str]:
    """(the tilings offered for a body with matrix ops, fewest bytes moved first; why there are none).
    No matrix op, or a target that declares no tile memory: ((), "") and the kernel is priced untiled;
    matrix ops that cannot share one loop nest, or no tiling that fits: ((), the reason)."""
    try:
        nest = nest_of(body, tuple(ins), out)
    except Untileable as exc:
        return (), str(exc)
    if nest is None or not target.tile_bytes:
        return (), ""
    if (nest.patches or nest.kind == "halo") and target.npu is None:
        return (), (f"a convolution chain runs as one kernel on an NPU target only; {target.name} runs its "
                    "convolutions apart (no Pallas template for convolutions)")
    if target.npu is not None:      # the NPU model's own choice: cycles of the busiest core (models/npu.py)
        options = npu_tilings(nest, target)
        return options, "" if options else f"no tiling of the {nest.kind} fits the buffers of {target.name}"
    options = tilings(nest, target.tile_bytes, model_of(target).tile_granule)
    return options, "" if options else f"no tiling of the {nest.kind} fits {target.tile_bytes} bytes on chip"


def kernel_breakdown(body: tuple, ins: list[Type], out: Type, target: Target, tiling: Tiling | None = None,
                     packed: bool = False) -> Breakdown:
    """One kernel on `target`: FLOPs, bytes and time, plus the target model's own factors (GPU:
    registers, occupancy, penalties; NPU: unit, UB bytes, whether the tiles fit, TransData). A kernel
    with matrix ops moves what its `tiling` moves (the best one when not given; `extract/tiling.py`).
    `packed`: the matrix operands and result are in the cube's own formats already (a fractal_matmul).
    The kernel is described here once (`describe`); the target kind's model (extract/models) prices it."""
    if all(n.op in FREE for n in body):
        return NOTHING_RUNS
    model = model_of(target)
    k = describe(body, ins, out, target)
    moved = k.bytes_in + k.bytes_out
    l2_moved = 0.0
    if k.matrix_flops and tiling is None:
        options, why = tiling_options(body, ins, out, target)
        if why:
            return Breakdown(math.inf, k.flops, moved, why)
        tiling = options[0] if options else None
    if tiling is not None:
        k.flops += tiling.extra_flops
        moved, l2_moved = model.tiled_bytes(tiling, body, ins, out, target)
    matrix_rate = compute_rate("matmul", [ins[0]] if ins else [], target) if k.matrix_flops else 1.0
    return model.kernel(k, moved, matrix_rate, body, ins, out, target, tiling=tiling, l2_moved=l2_moved,
                        packed=packed)


def reduces_by_rows(op: str, attrs: tuple, shape: tuple) -> bool:
    """Whether a target whose model runs reductions `rows_first` (the NPU) runs this one-op reduction as two
    stages (`row_stages`): it reduces several axes, the last among them, and one stage would need every
    reduced axis in the UB at once."""
    return op in REDUCTIONS and len(attrs[0]) > 1 and len(shape) - 1 in attrs[0]


def row_stages(op: str, attrs: tuple, x: Type, out: Type) -> list[tuple[tuple, Type, Type]]:
    """(body, input, output) of the two stages of a reduction `reduces_by_rows`: over the last axis (its
    rows stream through the UB a box at a time), then over the other reduced axes of the row results."""
    last = len(x[0]) - 1
    rows = (tuple(x[0][:-1]), out[1])
    rest = tuple(a for a in attrs[0] if a != last)
    return [(one_op_body(op, ((last,),), [x], rows), x, rows), (one_op_body(op, (rest,), [rows], out), rows, out)]


# Breakdowns already computed, per target: extraction prices the same kernel body many times (each growth
# step, each e-class that holds it, the greedy pass, the report), and a body's price depends on nothing else.
# Keyed by the target's id, with the target kept alive beside its table so that the id is not reused.
MEMO_ENTRIES = 200_000    # past it the tables start again
_memo: dict[int, tuple[Target, dict]] = {}
_memo_size = 0


def op_breakdown(op: str, attrs: tuple, ins: list[Type], out: Type, target: Target) -> Breakdown:
    """The op as one kernel on `target` (a `kernel` node carries its own body); on an NPU, a reduction
    over several axes as the two kernels the lowering runs (`row_stages`). Memoized (`MEMO_ENTRIES`)."""
    global _memo_size
    key = (op, attrs, tuple(ins), out)
    try:
        hash(key)
    except TypeError:   # an attribute that does not hash: priced each time
        return _op_breakdown(op, attrs, ins, out, target)
    if _memo_size >= MEMO_ENTRIES:
        _memo.clear()
        _memo_size = 0
    entry = _memo.get(id(target))
    if entry is None or entry[0] is not target:
        entry = _memo[id(target)] = (target, {})
    found = entry[1].get(key)
    if found is None:
        found = entry[1][key] = _op_breakdown(op, attrs, ins, out, target)
        _memo_size += 1
    return found


def _op_breakdown(op: str, attrs: tuple, ins: list[Type], out: Type, target: Target) -> Breakdown:
    if op in FREE:
        return NOTHING_RUNS
    if model_of(target).rows_first and op in REDUCTIONS and reduces_by_rows(op, attrs, ins[0][0]):
        parts = [kernel_breakdown(body, [x], y, target) for body, x, y in row_stages(op, attrs, ins[0], out)]
        return Breakdown(sum(p.time for p in parts), sum(p.flops for p in parts), sum(p.bytes for p in parts),
                         "; ".join(p.overflow for p in parts if p.overflow))
    if op == "kernel":
        return kernel_breakdown(attrs[0], ins, out, target, attrs[1] if len(attrs) > 1 else None)
    if op in LAYOUT_OPS and attrs[0] == "ND":
        return NOTHING_RUNS   # the identity: a view
    if op == "fractal_matmul":
        # The cube does the matmul of the padded ND matrices, and moves the same bytes: charge it as that.
        a, b, c = as_matmul(ins[0][0], ins[1][0], out[0])
        mats = [(a, ins[0][1]), (b, ins[1][1])]
        return kernel_breakdown(one_op_body("matmul", (), mats, (c, out[1])), mats, (c, out[1]), target,
                                packed=True)
    return kernel_breakdown(one_op_body(op, attrs, ins, out), ins, out, target)


def op_cost(op: str, attrs: tuple, ins: list[Type], out: Type, target: Target) -> float:
    """Seconds for one op run as one kernel on `target` (see `op_breakdown`)."""
    return op_breakdown(op, attrs, ins, out, target).time
