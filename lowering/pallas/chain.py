"""Template: a GEMM chain E = f(A @ B) @ D, and attention whose softmax rows fit one block.

The grid runs over batch axes (squeezed) and M by TM: one program owns TM rows of E. Inside, a loop
walks L (the first GEMM's columns, the second's reduction) by TL; per step a nested K loop computes the
TM x TL tile of C = A @ B, the ops between the GEMMs (scale, mask, softmax, a layer norm) run on it,
and the tile's product with the TL rows of D is added to E's accumulator. C never leaves the program.
The accumulator holds whole rows of E (N is whole: the second GEMM's columns are one dot per step),
and the epilogue runs on it after the loop. Tiles TM, TK, TL are the term's. A reduction over L
between the GEMMs (softmax) needs whole rows of C: then L is one step, unless the term chose online
softmax, which is the flash-attention template (`attention.py`).
"""
from __future__ import annotations

import jax.numpy as jnp

from superopt.lowering.pallas.blocks import Options, Plan, accumulator, dot, evaluate, launch, loader, store
from superopt.lowering.pallas.labels import MAIN, MAT, Labelled, NoTemplate
from superopt.lowering.pallas.matmul import loop, matrix_plan, roles, tiles_of


def first_gemm_tile(plan: Plan, refs, l_start, k, l_, gemm1: list, first: int, operands: tuple, acc):
    """The TM x TL tile of C = A @ B at `l_start`, accumulated in `acc` over a loop on K."""
    def k_step(k_start, c):
        starts = {lab: s for lab, s in ((k, k_start), (l_, l_start)) if lab in plan.loops}
        env = evaluate(plan, gemm1, {}, loader(plan, refs, starts), starts)
        return c + dot(plan, first, env[operands[0]], env[operands[1]], starts, acc)
    return loop(plan, k, k_step, jnp.zeros(plan.shape(first), acc))


def chain_parts(lb: Labelled) -> tuple[int, int, dict]:
    """(first matmul, second matmul, roles m, n, k, l, batch) of a two-GEMM chain, or NoTemplate."""
    mats = lb.in_region(MAT)
    if len(mats) != 2 or any(lb.body[i].op != "matmul" for i in mats):
        raise NoTemplate("the chain template takes two matmuls")
    first, second = mats
    users = [i for i, n in enumerate(lb.body) if first in n.inputs]
    direct = lb.body[second].inputs == (first, lb.body[second].inputs[1]) != (first, first)  # (A @ B) @ D
    if first in lb.roots or any(lb.region[u] != (second, 0) and not (u == second and direct) for u in users):
        raise NoTemplate("the first GEMM's result is used other than by the second's left operand")
    r1, r2 = roles(lb, first), roles(lb, second)
    if r2["k"] != r1["n"] or r2["m"] != r1["m"] or r1["batch"] != r2["batch"]:
        raise NoTemplate("the second GEMM does not contract the first one's columns")
    return first, second, {"m": r1["m"], "k": r1["k"], "l": r1["n"], "n": r2["n"], "batch": r1["batch"]}


def chain(lb: Labelled, inputs: list, tiling, options: Options, name: str) -> tuple[list, Plan]:
    first, second, role = chain_parts(lb)
    plan = matrix_plan(lb, role, tiles_of(tiling), ("m",), ("k", "l"), options, whole_roles=("n",))
    k, l_ = role["k"], role["l"]
    gemm1 = lb.in_region((first, 0)) + lb.in_region((first, 1))
    between = lb.in_region((second, 0)) + lb.in_region((second, 1))
    (a1, b1), (a2, b2) = lb.body[first].inputs, lb.body[second].inputs
    acc1, acc2 = accumulator(lb.body[first].dtype), accumulator(lb.body[second].dtype)

    def kernel(refs, outs):
        def l_step(l_start, e):
            c = first_gemm_tile(plan, refs, l_start, k, l_, gemm1, first, (a1, b1), acc1)
            starts = {l_: l_start} if l_ in plan.loops else {}
            env = evaluate(plan, between, {first: c.astype(lb.body[first].dtype)}, loader(plan, refs, starts), starts)
            return e + dot(plan, second, env[a2], env[b2], starts, acc2)
        e = loop(plan, l_, l_step, jnp.zeros(plan.shape(second), acc2))
        env = evaluate(plan, lb.in_region(MAIN), {second: e.astype(lb.body[second].dtype)}, loader(plan, refs))
        store(plan, outs, env)

    return launch(plan, kernel, inputs, options, name), plan
