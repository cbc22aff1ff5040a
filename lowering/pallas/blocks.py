"""Blocks: a labelled body's grid and BlockSpecs, and the body evaluated on blocks inside a kernel.

A `Plan` says, per label (`labels.py`), how a program sees that axis:

- a *grid* label is split over programs: block = its tile, index = the program id along it; a grid
  label of block 1 (a batch axis) is *squeezed*: dropped from the block, so kernels compute on 2-D tiles;
- a *loop* label is walked by a loop inside the kernel (a matmul's K, a GEMM chain's L): the operand's
  block holds the whole extent (padded up to whole steps) and each step slices one tile of it;
- any other label is *whole*: one block spans it (rows a reduction needs whole).

Ragged edges: blocks past the end of an array are padded (with NaN in interpret mode; GPU loads are
masked). Values there only reach output elements past the end, which are never written, except through
a reduction or a matrix product over a label whose block runs past its extent: there the evaluator
masks the padding with the reduction's identity (0 for sums and products, -inf for a max) first.
With `pow2` (what Triton needs), every block edge is rounded up to a power of two and masked alike.

Compiled with Triton (`Options.interpret` False), a kernel follows the Triton lowering's rules
(`compute`, `dot`, `fit_shared`): an op on bfloat16 or float16 values is computed in float32 and rounded
to its declared type (Triton has no narrow-float tanh, exp, division...; for +, -, *, / and sqrt the
result is the same as computed in the narrow type, since float32 carries more than twice its
precision); a float max or min propagates NaN as XLA's does (Triton's drops it); a float32 matrix product
is taken at full float32 precision (Triton's default is TF32); ops Triton cannot lower raise
`NoTemplate` (the node runs in JAX); and the tiles of a matrix kernel are shrunk until the operand tiles
Triton stages in shared memory fit one block's limit.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from superopt.core.ir import Node

from superopt.core.ops import OPS, REDUCTIONS
from superopt.lowering.jax import _LOWER as JAX_OPS   # the per-op table this backend shares with lowering/jax.py
from superopt.lowering.pallas.labels import ELEMENTWISE, MAT, Labelled, NoTemplate


@dataclass(frozen=True)
class Options:
    interpret: bool = True       # run the kernels in interpret mode (the only mode on a CPU)
    pow2: bool = False           # round every block edge up to a power of two (Triton's requirement)
    compiler_params: object = None
    smem_limit: int = 0          # compiled: shared-memory bytes one block may have (0: not checked)
    triton_rules: bool = False   # follow Triton's rules in interpret mode too (tests check them on a CPU)

    @property
    def triton(self) -> bool:
        """Whether kernels follow the Triton lowering's rules (`compute`, `dot`, `fit_shared`)."""
        return not self.interpret or self.triton_rules


NARROW = frozenset({"bfloat16", "float16"})   # float types narrower than float32
STAGES = 3           # Pallas-Triton's default num_stages on CUDA (CompilerParams.num_stages None)
LEAST_DOT = 16       # Triton's least edge of a dot operand (M, N, K)
# Ops the Pallas-Triton lowering has no rule for (jax 0.10-0.12; tests/test_pallas_gpu_rules.py checks
# the list against the installed jax's rule table): a kernel with one runs in JAX under Triton.
TRITON_GAPS = frozenset({"conj", "erf", "erfc", "lgamma", "reduce_and", "reduce_or", "reduce_prod", "round",
                         "round_even"})
MAXMIN = frozenset({"max", "min", "reduce_max", "reduce_min"})


class TooLarge(NoTemplate):
    """A matrix kernel whose tiles cannot be shrunk to fit one block's shared memory."""


def num_stages(options: Options) -> int:
    return getattr(options.compiler_params, "num_stages", None) or STAGES


def fit(extent: int, tile: int, pow2: bool) -> int:
    """The block edge for a tile along an axis of `extent`: at most the extent (padded up to a power of two
    with `pow2`)."""
    tile = max(1, min(tile, extent))
    return pl.next_power_of_2(tile) if pow2 else tile


@dataclass
class Plan:
    lb: Labelled
    grid: tuple                          # labels split over programs, outermost first
    block: dict                          # label -> block edge (a loop label: one step's tile)
    loops: frozenset = frozenset()       # labels walked inside the kernel
    squeezed: frozenset = frozenset()    # grid labels of block 1 dropped from blocks and values
    notes: list = field(default_factory=list)
    names: dict = field(default_factory=dict)   # label -> its role in a matrix kernel ("m", "n", "k", "l")
    interpret: bool = False              # the kernel runs in interpret mode (XLA on the host): see `typed`, `dot`
    triton: bool = False                 # the kernel follows Triton's rules (`Options.triton`)
    stages: int = 0                      # Triton's num_stages where `fit_shared` lowered it (0: the options')

    # ---- per value ----
    def kept(self, i: int) -> list[int]:
        """Axes of body value i that its block keeps."""
        return [a for a, lab in enumerate(self.lb.axes[i]) if lab is not None and lab not in self.squeezed]

    def shape(self, i: int) -> tuple:
        return tuple(self.block[self.lb.axes[i][a]] for a in self.kept(i))

    def steps(self, lab) -> int:
        return -(-self.lb.extent[lab] // self.block[lab])

    def padded(self, lab) -> bool:
        return lab is not None and self.steps(lab) * self.block[lab] != self.lb.extent[lab]

    def spec(self, i: int) -> pl.BlockSpec:
        """The BlockSpec of body value i (a loaded operand or an output)."""
        dims, where = [], []
        for lab in self.lb.axes[i]:
            if lab is None or lab in self.squeezed:
                dims.append(None)
            elif lab in self.loops:
                dims.append(self.steps(lab) * self.block[lab])
            else:
                dims.append(self.block[lab])
            where.append(self.grid.index(lab) if lab in self.grid else None)

        def index_map(*program):
            return tuple(program[g] if g is not None else 0 for g in where)
        return pl.BlockSpec(tuple(dims), index_map)

    def describe(self) -> str:
        """`grid 12x1, TM=128 TK=16 (4 steps)`: the grid, then each split label's tile (by its role when the
        plan has roles), or the block of the first output."""
        grid = "x".join(str(self.steps(lab)) for lab in self.grid) or "1"
        if not self.names:
            return f"grid {grid}, block {'x'.join(map(str, self.shape(self.lb.roots[0]))) or 'scalar'}"
        tiles = [f"T{self.names[lab].upper()}={self.block[lab]}" for lab in self.grid if lab not in self.squeezed]
        tiles += [f"T{self.names[lab].upper()}={self.block[lab]} ({plural(self.steps(lab), 'step')})"
                  for lab in sorted(self.loops, key=lambda lab: self.names[lab])]
        tiles += [f"T{role.upper()}={self.block[lab]} (whole)"
                  for lab, role in sorted(self.names.items(), key=lambda kv: kv[1])
                  if lab not in self.grid and lab not in self.loops]
        return f"grid {grid}" + (f", {' '.join(tiles)}" if tiles else "")


def plural(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


# ---- the body on blocks ----

def _identity(op: str, dtype) -> object:
    """The value a padded element of a reduction's operand holds: the reduction's identity (its op table
    entry's), so that the padding changes no result. A reduction without one has no block template."""
    identity = OPS[op].identity if op in OPS else None
    if identity is None:
        raise NoTemplate(f"no padding identity for {op!r} (its op table entry, superopt/core/ops.py, has none)")
    return identity(np.dtype(dtype))


def valid(plan: Plan, i: int, axes: list[int], shape: tuple, starts: dict):
    """A mask over block value i (of `shape`) that is False past the extent of any padded label among
    `axes` (positions in the value), or None when none is padded."""
    mask = None
    for p in axes:
        lab = plan.lb.axes[i][plan.kept(i)[p]]
        if not plan.padded(lab):
            continue
        index = lax.broadcasted_iota(jnp.int32, shape, p) + starts.get(lab, 0)
        inside = index < plan.lb.extent[lab]
        mask = inside if mask is None else mask & inside
    return mask


def accumulator(dtype) -> np.dtype:
    dt = np.dtype(dtype)
    if dt == np.bool_ or dt.kind in "iu":
        return np.dtype("int32") if dt.itemsize <= 4 else dt
    return np.dtype("float32") if dt.itemsize < 4 else dt


def dot(plan: Plan, m: int, a, b, starts: dict, out_dtype=None):
    """Matrix node m's product of the blocks a and b (its operands' values), padding masked."""
    body = plan.lb.body
    node = body[m]
    ia, ib = node.inputs
    ka, kb = plan.kept(ia), plan.kept(ib)
    ra, rb = len(body[ia].shape), len(body[ib].shape)
    ca, cb = ra - 1, (0 if rb == 2 else rb - 2)
    contract = ([ka.index(ca)], [kb.index(cb)]) if ca in ka and cb in kb else ([], [])
    batch = ([ka.index(x) for x in range(rb - 2) if x in ka], [kb.index(x) for x in range(rb - 2) if x in kb]) \
        if rb > 2 else ([], [])
    out_dtype = out_dtype or accumulator(node.dtype)
    if plan.interpret and np.dtype(out_dtype) == np.float32:
        # XLA on the host has no bf16 x bf16 -> f32 product for some operand layouts; widening first is
        # the same product (a bf16 or f16 product is exact in f32) with the same f32 accumulation
        a, b = (x.astype(np.float32) if np.dtype(x.dtype).name in NARROW else x for x in (a, b))
    if a.dtype != b.dtype:       # Triton multiplies operands of one type
        common = jnp.promote_types(a.dtype, b.dtype)
        a, b = a.astype(common), b.astype(common)
    if contract[0]:
        mask_a = valid(plan, ia, contract[0], a.shape, starts)
        if mask_a is not None:
            a = jnp.where(mask_a, a, jnp.zeros((), a.dtype))
            b = jnp.where(valid(plan, ib, contract[1], b.shape, starts), b, jnp.zeros((), b.dtype))
    if plan.triton:
        if batch[0] or batch[1]:
            raise NoTemplate("a batched product inside a block (Triton's dot is 2-D)")
        if np.dtype(a.dtype).kind == "u":
            raise NoTemplate("an unsigned integer product (Triton's dot is signed)")
        if a.ndim != 2 or b.ndim != 2 or not contract[0]:
            return _dot_by_sum(a, b, contract, out_dtype)
    # full float32 precision where the operands are float32 (Triton's default is TF32, XLA's on a CPU is full)
    precision = lax.Precision.HIGHEST if np.dtype(a.dtype) == np.float32 else None
    return lax.dot_general(a, b, (contract, batch), precision=precision, preferred_element_type=out_dtype)


def _dot_by_sum(a, b, contract: tuple, out_dtype):
    """A product Triton's 2-D dot does not take (a vector operand, nothing contracted) as a broadcast
    multiply and a sum, in the accumulator's type: out axes are a's free axes, then b's."""
    (ca, cb) = contract
    fa = [d for d in range(a.ndim) if d not in ca]
    fb = [d for d in range(b.ndim) if d not in cb]
    a = lax.transpose(a, tuple(fa + ca)).astype(out_dtype) if a.ndim > 1 else a.astype(out_dtype)
    b = lax.transpose(b, tuple(fb + cb)).astype(out_dtype) if b.ndim > 1 else b.astype(out_dtype)
    na, nb = len(fa), len(fb)
    shape = a.shape[:na] + b.shape[:nb] + a.shape[na:]
    a = lax.broadcast_in_dim(a, shape, tuple(range(na)) + tuple(range(na + nb, na + nb + len(ca))))
    b = lax.broadcast_in_dim(b, shape, tuple(range(na, na + nb)) + tuple(range(na + nb, na + nb + len(cb))))
    product = a * b
    return jnp.sum(product, axis=-1) if ca else product


def compute(plan: Plan, node: Node, *ins):
    """Node's elementwise op or reduction on blocks `ins`. Compiled with Triton: narrow floats computed
    in float32 (the caller's `typed` rounds the result to the node's type), a float max or min
    propagating NaN, and an op Triton cannot lower refused."""
    if not plan.triton:
        return JAX_OPS[node.op](node, *ins)
    dtypes = [np.dtype(x.dtype) for x in ins]
    if node.op in TRITON_GAPS:
        raise NoTemplate(f"Triton cannot lower {node.op!r}")
    if node.op in MAXMIN and any(d == np.bool_ for d in dtypes):
        raise NoTemplate(f"Triton has no {node.op!r} of booleans")
    if node.op == "convert":          # one rounding, from the source type straight to the declared one
        return JAX_OPS[node.op](node, *ins)
    ins = [x.astype(np.float32) if d.name in NARROW else x for x, d in zip(ins, dtypes)]
    wide = Node(node.op, node.inputs, node.attrs, node.shape, "float32" if node.dtype in NARROW else node.dtype)
    out = JAX_OPS[node.op](wide, *ins)
    if node.op in MAXMIN and np.dtype(out.dtype).kind == "f":
        if node.op in ("max", "min"):     # Triton's maxnumf/minnumf return the other operand for a NaN
            for x in ins:
                out = jnp.where(x != x, jnp.broadcast_to(x, out.shape).astype(out.dtype), out)
        else:
            nan = JAX_OPS["reduce_max"](Node("reduce_max", (), node.attrs, node.shape, "float32"),
                                        jnp.where(ins[0] != ins[0], 1.0, 0.0).astype(np.float32))
            out = jnp.where(nan > 0, jnp.asarray(np.nan, out.dtype), out)
    return out


def typed(plan: Plan, x, dtype):
    """`x` at `dtype`, the type the body declares for it. A GPU kernel holds a bfloat16 value as
    bfloat16; in interpret mode XLA fuses the kernel and drops float32 -> bfloat16 -> float32 round trips
    (it keeps excess precision), so in interpret mode a narrow float value goes through an optimization
    barrier, which XLA cannot see through: the kernel rounds where the term says, as on a GPU."""
    x = x.astype(dtype)
    if plan.interpret and np.dtype(dtype).name in NARROW:
        x = lax.optimization_barrier(x)
    return x


def spread(plan: Plan, j: int, i: int, x, shape: tuple):
    """Block `x` of body value j, an operand of elementwise node i whose block has `shape`, broadcast to
    that block. In the IR an operand broadcasts along its axes of extent 1 ((1, n) against (m, n), as lax
    does) or is rank-0; a block drops axes of extent 1 (they have no label), so such an operand's block
    has fewer axes than the result's: its kept axes sit at the result's axes they are tied to."""
    out_rank, in_rank = len(plan.lb.body[i].shape), len(plan.lb.body[j].shape)
    k_out = plan.kept(i)
    dims = tuple(k_out.index(a + out_rank - in_rank) for a in plan.kept(j))
    if tuple(jnp.shape(x)) == tuple(shape) and dims == tuple(range(len(shape))):
        return x
    return lax.broadcast_in_dim(x, shape, dims)


def evaluate(plan: Plan, order, env: dict, load: Callable, starts: dict | None = None) -> dict:
    """Evaluate body values `order` (topological) on blocks, skipping those already in `env`; `load(i)`
    gives a loaded operand's block, `starts` the first index of the current step of each loop label."""
    body, starts = plan.lb.body, starts or {}
    for i in order:
        if i in env:
            continue
        node = body[i]
        op = node.op
        ins = [env[j] for j in node.inputs]
        shape = plan.shape(i)
        if op == "arg":
            env[i] = load(i)
        elif op == "lit":
            env[i] = jnp.full(shape, node.attrs[0], np.dtype(node.dtype))
        elif op in ELEMENTWISE:
            env[i] = typed(plan, compute(plan, node, *(spread(plan, j, i, x, shape) for j, x in zip(node.inputs, ins))),
                           node.dtype)
        elif op == "broadcast":
            k_in, k_out = plan.kept(node.inputs[0]), plan.kept(i)
            dims = tuple(k_out.index(node.attrs[0][a]) for a in k_in)
            env[i] = lax.broadcast_in_dim(ins[0], shape, dims)
        elif op == "reshape":
            env[i] = ins[0].reshape(shape)
        elif op == "transpose":
            k_in = plan.kept(node.inputs[0])
            env[i] = lax.transpose(ins[0], tuple(k_in.index(node.attrs[0][o]) for o in plan.kept(i)))
        elif op in REDUCTIONS:
            k_in = plan.kept(node.inputs[0])
            axes = tuple(k_in.index(a) for a in node.attrs[0] if a in k_in)
            x = ins[0]
            mask = valid(plan, node.inputs[0], list(axes), x.shape, starts)
            if mask is not None:
                x = jnp.where(mask, x, jnp.asarray(_identity(op, x.dtype), x.dtype))
            env[i] = typed(plan, compute(plan, Node(op, (), (axes,), shape, node.dtype), x), node.dtype) if axes else x
        elif op == "matmul":
            env[i] = typed(plan, dot(plan, i, ins[0], ins[1], starts), node.dtype)
        else:
            raise NoTemplate(f"no block evaluation of {op!r}")
    return env


def loader(plan: Plan, refs: dict, starts: dict | None = None) -> Callable:
    """`load(i)` for `evaluate`: operand i's block, one step's tile along the loop labels in `starts`."""
    starts = starts or {}

    def load(i: int):
        ref = refs[i]
        labels = [plan.lb.axes[i][a] for a in plan.kept(i)]
        if not labels:
            return ref[...]
        index = []
        for lab in labels:
            if lab in plan.loops:
                if lab not in starts:
                    raise NoTemplate("an operand of a loop label is read outside its loop")
                index.append(pl.ds(starts[lab], plan.block[lab]))
            else:
                index.append(slice(None))
        mask = bounds(plan, i, starts) if plan.triton else None
        if mask is not None:
            load_masked, _ = _masked_access()
            return load_masked(ref.at[tuple(index)], mask=mask, other=jnp.zeros((), ref.dtype))
        return ref[tuple(index)]
    return load


def bounds(plan: Plan, i: int, starts: dict):
    """Compiled with Triton, which masks no access itself (a block past the end of an array reads and
    writes past it, into the next row): the mask of the elements of body value i's block (one step's
    tile along loop labels) that lie inside the array, or None when the block is inside it."""
    labels = [plan.lb.axes[i][a] for a in plan.kept(i)]
    shape, mask = plan.shape(i), None
    for p, lab in enumerate(labels):
        if not plan.padded(lab):
            continue
        first = _PROGRAM[plan.grid.index(lab)] * plan.block[lab] if lab in plan.grid else starts.get(lab, 0)
        inside = lax.broadcasted_iota(jnp.int32, shape, p) + first < plan.lb.extent[lab]
        mask = inside if mask is None else mask & inside
    return mask


_PROGRAM: list = []   # the program ids of the kernel being traced (`launch`), for `bounds`


def _masked_access():
    """(load, store) with a mask: Pallas-Triton's own (jax.experimental.pallas.triton)."""
    from jax.experimental.pallas import triton as plgpu
    return plgpu.load, plgpu.store


def launch(plan: Plan, kernel: Callable, inputs: list, options: Options, name: str) -> list:
    """pallas_call of `kernel(refs, outs)`: refs maps each `arg` body value to its block's ref (an input
    loaded under two labellings is passed twice), outs are the roots' output refs, in order."""
    body, roots = plan.lb.body, plan.lb.roots
    args = [i for i, n in enumerate(body) if n.op == "arg"]
    grid = tuple(plan.steps(lab) for lab in plan.grid)

    def run(*refs):
        # the program ids, read once at the top of the kernel (interpret mode finds none inside a loop)
        _PROGRAM[:] = [pl.program_id(g) for g in range(len(grid))]
        kernel(dict(zip(args, refs[:len(args)])), refs[len(args):])

    call = pl.pallas_call(
        run, grid=grid, name=name,
        out_shape=[jax.ShapeDtypeStruct(body[r].shape, np.dtype(body[r].dtype)) for r in roots],
        in_specs=[plan.spec(i) for i in args], out_specs=[plan.spec(r) for r in roots],
        interpret=options.interpret, compiler_params=compiler_params(plan, options))
    return call(*[inputs[body[i].attrs[0]] for i in args])


def compiler_params(plan: Plan, options: Options):
    """The options' compiler parameters, with the plan's own num_stages where it has one."""
    if plan.stages and options.compiler_params is not None:
        return dataclasses.replace(options.compiler_params, num_stages=plan.stages)
    return options.compiler_params


def store(plan: Plan, outs, env: dict) -> None:
    for r, out in zip(plan.lb.roots, outs):
        mask = bounds(plan, r, {}) if plan.triton else None
        if mask is not None:
            _, store_masked = _masked_access()
            store_masked(out, env[r].astype(out.dtype), mask=mask)
        else:
            out[...] = env[r].astype(out.dtype)


def whole_block(extent: int, pow2: bool) -> int:
    return pl.next_power_of_2(extent) if pow2 else extent


def shared_bytes(plan: Plan, stages: int) -> int:
    """Shared memory a Triton matrix kernel of this plan needs, as bounded here: each matrix op's operand
    tiles (one step's, at the type the dot takes), staged `stages` deep by the software pipeliner."""
    body, staged = plan.lb.body, 0
    for m in plan.lb.in_region(MAT):
        ia, ib = body[m].inputs
        item = max(np.dtype(body[ia].dtype).itemsize, np.dtype(body[ib].dtype).itemsize)
        staged += sum(math.prod(plan.shape(i)) for i in (ia, ib)) * item
    return stages * staged


def result_bytes(plan: Plan) -> int:
    """The largest matrix op's result tile (its accumulator, held in registers), in bytes."""
    body = plan.lb.body
    return max((math.prod(plan.shape(m)) * accumulator(body[m].dtype).itemsize for m in plan.lb.in_region(MAT)),
               default=0)


def fit_shared(plan: Plan, options: Options) -> None:
    """Compiled with a shared-memory limit: halve the plan's split matrix tiles (the largest first, a
    loop's on a tie; none below `LEAST_DOT`) until `shared_bytes` fits the limit, then, where even the
    least tiles do not (a label kept whole, N or a softmax row, holds too much), stage fewer steps
    (`Plan.stages`); `TooLarge` when one stage does not fit. An accumulator larger than the limit has its
    grid tiles halved too where they can be (it would spill registers; not a compile error)."""
    limit = options.smem_limit
    if not options.triton or not limit:
        return
    split = [lab for lab in plan.names if (lab in plan.grid and lab not in plan.squeezed) or lab in plan.loops]
    before = {lab: plan.block[lab] for lab in split}

    def halve(labels) -> bool:
        smaller = [lab for lab in labels if plan.block[lab] > LEAST_DOT]
        if smaller:
            lab = max(smaller, key=lambda lab: (plan.block[lab], lab in plan.loops))
            plan.block[lab] //= 2
        return bool(smaller)

    while result_bytes(plan) > limit and halve([lab for lab in split if lab in plan.grid]):
        pass
    stages = num_stages(options)
    while shared_bytes(plan, stages) > limit and halve(split):
        pass
    while shared_bytes(plan, stages) > limit and stages > 1:
        stages -= 1
        plan.stages = stages
    if (need := shared_bytes(plan, stages)) > limit:
        raise TooLarge(f"the matrix tiles need {need} bytes of shared memory, more than the {limit} a block "
                       "may have, at their least")
    shrunk = [f"T{plan.names[lab].upper()} {before[lab]} -> {plan.block[lab]}" for lab in split
              if plan.block[lab] != before[lab]]
    shrunk += [f"{plural(stages, 'stage')}"] if plan.stages else []
    if shrunk:
        plan.notes.append(f"{', '.join(shrunk)}: shared memory of a block is {limit} bytes")
