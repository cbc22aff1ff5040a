"""Templates: elementwise chains and row kernels (softmax, layer norm, RMS norm): bodies without a matrix op.

The kernel's output is split into 2-D tiles: its last axis into lanes of at most `LANES` elements, the
axis before it into rows, so that one program touches about `TILE_ELEMENTS` values; every other output
axis is a grid axis of block 1. A label a reduction sums over is whole in every block (a row kernel
reads whole rows), and counts towards the budget. An operand read through a transpose gets the
transposed block (its BlockSpec's index map permutes the program ids), a broadcast operand a block of
extent 1 along the broadcast axes. Such a body carries no tile sizes in the term, so these are the
template's own choice.
"""
from __future__ import annotations

import math

from superopt.lowering.pallas.blocks import Options, Plan, evaluate, fit, launch, loader, store, whole_block
from superopt.lowering.pallas.labels import Labelled

LANES = 512                   # the lane tile of an elementwise kernel (a multiple of 128, a power of two)
TILE_ELEMENTS = 8192          # elements of one program's output tile (32 KiB of float32)


def pointwise_plan(lb: Labelled, options: Options, lanes: int | None = LANES) -> Plan:
    """Grid and blocks for a body without matrix ops: reduced labels whole, the output tiled in 2-D
    (`lanes` None: the last axis whole as well)."""
    whole = set(lb.diagonal).union(*lb.reduced.values()) if lb.reduced else set(lb.diagonal)
    out = [lab for lab in lb.axes[lb.roots[0]] if lab is not None]
    whole |= lb.labels() - set(out)
    block = {lab: whole_block(lb.extent[lab], options.pow2) for lab in whole}
    free = [lab for lab in out if lab not in whole]
    budget = max(1, TILE_ELEMENTS // math.prod(block[lab] for lab in whole - set(out)))
    lane = out[-1] if out and out[-1] in free else None
    if lane is not None:
        block[lane] = fit(lb.extent[lane], _floor2(min(lanes or lb.extent[lane], budget)), options.pow2)
    row = next((lab for lab in reversed(out[:-1]) if lab in free), None)
    if row is not None:
        block[row] = fit(lb.extent[row], _floor2(budget // block[out[-1]]), options.pow2)
    squeezed = [lab for lab in free if lab not in (lane, row)]
    block.update({lab: 1 for lab in squeezed})
    grid = tuple(lab for lab in out if lab in free)
    return Plan(lb, grid, block, frozenset(), frozenset(squeezed), interpret=options.interpret, triton=options.triton)


def _floor2(n: int) -> int:
    """The power of two at or below n (at least 1)."""
    return 1 << (max(1, n).bit_length() - 1)


def pointwise_kernel(plan: Plan):
    def kernel(refs, outs):
        env = evaluate(plan, range(len(plan.lb.body)), {}, loader(plan, refs))
        store(plan, outs, env)
    return kernel


def pointwise(lb: Labelled, inputs: list, tiling, options: Options, name: str) -> tuple[list, Plan]:
    """The elementwise or row-kernel template: (outputs, plan)."""
    plan = pointwise_plan(lb, options)
    return launch(plan, pointwise_kernel(plan), inputs, options, name), plan
