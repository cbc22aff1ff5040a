"""Template: a matmul with its prologues and epilogue, and a K loop.

The grid runs over the output's tiles: batch axes (block 1, squeezed), then M by TM, then N by TN,
the tiles the extractor chose (the term's `Tiling`; `extract/tiling.py`). Each program walks K by TK
in a loop: per step it loads one TK-slice of the operands' producers (an activation before the
matmul, a normalisation of A's rows, a transposed load), computes them on the slice and accumulates
the product in float32 (int32 for integers). The epilogue (bias, activation, residual, a layer norm
over whole rows) then runs once on the accumulator. A K that TK does not divide is padded and masked
to zero on both operands. A label the body reduces over is whole whatever the tiles say (the
extractor's tilings already keep such loops whole).
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from superopt.lowering.pallas.blocks import (
    LEAST_DOT, Options, Plan, accumulator, dot, evaluate, fit, fit_shared, launch, loader, store, typed, whole_block,
)
from superopt.lowering.pallas.labels import MAIN, MAT, Labelled, NoTemplate

DEFAULT_TILES = {"m": 64, "n": 64, "k": 32, "l": 64}   # when the term carries no tiling (a target without tile memory)


def roles(lb: Labelled, m: int) -> dict:
    """{"m": rows, "n": columns, "k": contracted, "batch": [...]} labels of matrix node m (None: extent 1)."""
    out = lb.axes[m]
    b_rank = len(lb.body[lb.body[m].inputs[1]].shape)
    a_rank = len(lb.body[lb.body[m].inputs[0]].shape)
    rows = out[-2] if a_rank >= 2 and len(out) >= 2 else None
    batch = [lab for lab in (out[:-2] if a_rank >= 2 else out[:-1]) if lab is not None]
    if b_rank > 2 and a_rank < 2:
        raise NoTemplate("a batched matmul of a vector")
    return {"m": rows, "n": out[-1] if out else None, "k": lb.contracted(m), "batch": batch}


def tiles_of(tiling) -> dict:
    return dict(tiling.tiles) if tiling is not None else dict(DEFAULT_TILES)


def reduced_anywhere(lb: Labelled) -> set:
    return set().union(*lb.reduced.values()) if lb.reduced else set()


def matrix_plan(lb: Labelled, role: dict, tiles: dict, grid_roles: tuple, loop_roles: tuple,
                options: Options, whole_roles: tuple = (), online: tuple = ()) -> Plan:
    """A plan where batch labels and `grid_roles` are split over programs, `loop_roles` walked inside,
    `whole_roles` and everything reduced (except the `online` roles) or unnamed whole."""
    named = {role[r]: r for r in ("m", "n", "k", "l") if role.get(r) is not None}
    if len(named) != len([r for r in ("m", "n", "k", "l") if role.get(r) is not None]):
        raise NoTemplate("two loops of the matrix ops run over one axis")
    reduced = reduced_anywhere(lb) - {role[r] for r in online}
    whole = set(lb.diagonal) | reduced | (lb.labels() - set(named) - set(role["batch"]))
    whole |= {role[r] for r in whole_roles if role.get(r) is not None}
    notes = [f"{named[lab].upper()} whole, not the tiling's {tiles.get(named[lab])}: the body reduces over it"
             for lab in sorted(whole & set(named)) if named[lab] in grid_roles + loop_roles
             and tiles.get(named[lab], 0) < lb.extent[lab]]
    block, grid, loops, squeezed = {}, [], set(), set()
    for lab in lb.labels():
        if lab in whole:
            block[lab] = whole_block(lb.extent[lab], options.pow2)
    for lab in role["batch"]:
        if lab not in whole:
            block[lab] = 1
            grid.append(lab)
            squeezed.add(lab)
    for r in grid_roles + loop_roles:
        lab = role.get(r)
        if lab is None or lab in whole:
            continue
        block[lab] = fit(lb.extent[lab], tiles.get(r, DEFAULT_TILES[r]), options.pow2)
        (grid.append(lab) if r in grid_roles else loops.add(lab))
    if options.pow2:     # Triton's dot takes operands of at least 16 along M, N and K (the padding is masked)
        block.update({lab: max(block[lab], LEAST_DOT) for lab in named})
    plan = Plan(lb, tuple(grid), block, frozenset(loops), frozenset(squeezed), notes, named, options.interpret,
                options.triton)
    fit_shared(plan, options)
    return plan


def loop(plan: Plan, lab, step, init):
    """`step(start, carry)` over the loop label's tiles (once, from 0, when `lab` is not walked)."""
    if lab is None or lab not in plan.loops:
        return step(0, init)
    tile = plan.block[lab]
    return lax.fori_loop(0, plan.steps(lab), lambda s, c: step(s * tile, c), init)


def matmul(lb: Labelled, inputs: list, tiling, options: Options, name: str) -> tuple[list, Plan]:
    mats = lb.in_region(MAT)
    if len(mats) != 1 or lb.body[mats[0]].op != "matmul":
        raise NoTemplate("the matmul template takes one matmul")
    m = mats[0]
    role = roles(lb, m)
    plan = matrix_plan(lb, role, tiles_of(tiling), ("m", "n"), ("k",), options)
    k = role["k"]
    prologue = lb.in_region((m, 0)) + lb.in_region((m, 1))
    a, b = lb.body[m].inputs
    acc_dtype = accumulator(lb.body[m].dtype)

    def kernel(refs, outs):
        def step(start, acc):
            starts = {k: start} if k in plan.loops else {}
            env = evaluate(plan, prologue, {}, loader(plan, refs, starts), starts)
            return acc + dot(plan, m, env[a], env[b], starts, acc_dtype)
        acc = loop(plan, k, step, jnp.zeros(plan.shape(m), acc_dtype))
        env = evaluate(plan, lb.in_region(MAIN), {m: typed(plan, acc, lb.body[m].dtype)}, loader(plan, refs))
        store(plan, outs, env)

    return launch(plan, kernel, inputs, options, name), plan
