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
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from superopt.core.ir import Node

from superopt.core.ops import REDUCTIONS
from superopt.lowering.jax import _LOWER as JAX_OPS   # the per-op table this backend shares with lowering/jax.py
from superopt.lowering.pallas.labels import ELEMENTWISE, Labelled, NoTemplate


@dataclass(frozen=True)
class Options:
    interpret: bool = True       # run the kernels in interpret mode (the only mode on a CPU)
    pow2: bool = False           # round every block edge up to a power of two (Triton's requirement)
    compiler_params: object = None


NARROW = frozenset({"bfloat16", "float16"})   # float types narrower than float32


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
    dt = np.dtype(dtype)
    if op in ("reduce_sum", "reduce_or"):
        return False if dt == np.bool_ else 0
    if op in ("reduce_prod", "reduce_and"):
        return True if dt == np.bool_ else 1
    low = op == "reduce_max"
    if dt == np.bool_:
        return not low
    if dt.kind in "iu":
        return np.iinfo(dt).min if low else np.iinfo(dt).max
    return -np.inf if low else np.inf


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
    if contract[0]:
        mask_a = valid(plan, ia, contract[0], a.shape, starts)
        if mask_a is not None:
            a = jnp.where(mask_a, a, jnp.zeros((), a.dtype))
            b = jnp.where(valid(plan, ib, contract[1], b.shape, starts), b, jnp.zeros((), b.dtype))
    return lax.dot_general(a, b, (contract, batch), preferred_element_type=out_dtype)


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
            env[i] = typed(plan, JAX_OPS[op](node, *(spread(plan, j, i, x, shape) for j, x in zip(node.inputs, ins))),
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
            env[i] = typed(plan, JAX_OPS[op](Node(op, (), (axes,), shape, node.dtype), x), node.dtype) if axes else x
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
        return ref[tuple(index)]
    return load


def launch(plan: Plan, kernel: Callable, inputs: list, options: Options, name: str) -> list:
    """pallas_call of `kernel(refs, outs)`: refs maps each `arg` body value to its block's ref (an input
    loaded under two labellings is passed twice), outs are the roots' output refs, in order."""
    body, roots = plan.lb.body, plan.lb.roots
    args = [i for i, n in enumerate(body) if n.op == "arg"]
    grid = tuple(plan.steps(lab) for lab in plan.grid)

    def run(*refs):
        kernel(dict(zip(args, refs[:len(args)])), refs[len(args):])

    call = pl.pallas_call(
        run, grid=grid, name=name,
        out_shape=[jax.ShapeDtypeStruct(body[r].shape, np.dtype(body[r].dtype)) for r in roots],
        in_specs=[plan.spec(i) for i in args], out_specs=[plan.spec(r) for r in roots],
        interpret=options.interpret, compiler_params=options.compiler_params)
    return call(*[inputs[body[i].attrs[0]] for i in args])


def store(plan: Plan, outs, env: dict) -> None:
    for r, out in zip(plan.lb.roots, outs):
        out[...] = env[r].astype(out.dtype)


def whole_block(extent: int, pow2: bool) -> int:
    return pl.next_power_of_2(extent) if pow2 else extent
