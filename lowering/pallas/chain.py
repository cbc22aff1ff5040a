"""Template: a GEMM chain E = f(A @ B) @ D, its transposed form E = f(A @ B)^T @ D, and attention whose
softmax rows fit one block.

Write C = A @ B (M x L, K contracted). In the plain chain the second GEMM contracts C's columns (L):
the grid runs over batch axes (squeezed) and M by TM, one program owns TM rows of E, and a loop inside
walks L by TL. In the transposed chain, E = f(C)^T @ D, the second GEMM contracts C's rows (M): the grid
runs over L by TL, one program owns TL rows of E, and the loop walks M by TM. Either way, per step of
that loop a nested K loop computes the TM x TL tile of C, the ops between the GEMMs (scale, mask,
softmax, a layer norm, the transpose) run on it, and the tile's product with the matching rows of D is
added to E's accumulator. C never leaves the program. The accumulator holds whole rows of E (N is
whole: the second GEMM's columns are one dot per step), and the epilogue runs on it after the loop.
Tiles TM, TK, TL are the term's. A reduction between the GEMMs over the loop's axis (softmax over L)
needs whole rows of C: then the loop is one step, unless the term chose online softmax, which is the
flash-attention template (`attention.py`).
"""
from __future__ import annotations

import jax.numpy as jnp

from superopt.lowering.pallas.blocks import Options, Plan, accumulator, dot, evaluate, launch, loader, store, typed
from superopt.lowering.pallas.labels import MAIN, MAT, Labelled, NoTemplate
from superopt.lowering.pallas.matmul import loop, matrix_plan, roles, tiles_of


def first_gemm_tile(plan: Plan, refs, start, k, outer, gemm1: list, first: int, operands: tuple, acc):
    """The TM x TL tile of C = A @ B at `start` along the `outer` loop label (L in a chain, M in a
    transposed chain), accumulated in `acc` over a loop on K."""
    def k_step(k_start, c):
        starts = {lab: s for lab, s in ((k, k_start), (outer, start)) if lab in plan.loops}
        env = evaluate(plan, gemm1, {}, loader(plan, refs, starts), starts)
        return c + dot(plan, first, env[operands[0]], env[operands[1]], starts, acc)
    return loop(plan, k, k_step, jnp.zeros(plan.shape(first), acc))


def chain_parts(lb: Labelled, transposed: bool = False) -> tuple[int, int, dict]:
    """(first matmul, second matmul, roles m, n, k, l, batch) of a two-GEMM chain, or NoTemplate. The
    roles are the first GEMM's (C = A @ B is M x L over K) and N, the second's columns; `transposed`:
    the second GEMM contracts C's rows (E = f(C)^T @ D, L x N) instead of its columns (M x N)."""
    mats = lb.in_region(MAT)
    if len(mats) != 2 or any(lb.body[i].op != "matmul" for i in mats):
        raise NoTemplate("the chain template takes two matmuls")
    first, second = mats
    users = [i for i, n in enumerate(lb.body) if first in n.inputs]
    direct = lb.body[second].inputs == (first, lb.body[second].inputs[1]) != (first, first)  # (A @ B) @ D
    if first in lb.roots or any(lb.region[u] != (second, 0) and not (u == second and direct) for u in users):
        raise NoTemplate("the first GEMM's result is used other than by the second's left operand")
    r1, r2 = roles(lb, first), roles(lb, second)
    rows, contracted = ("n", "m") if transposed else ("m", "n")
    if r2["k"] != r1[contracted] or r2["m"] != r1[rows] or r1["batch"] != r2["batch"]:
        raise NoTemplate(f"the second GEMM does not contract the first one's {'rows' if transposed else 'columns'}")
    return first, second, {"m": r1["m"], "k": r1["k"], "l": r1["n"], "n": r2["n"], "batch": r1["batch"]}


def chain(lb: Labelled, inputs: list, tiling, options: Options, name: str) -> tuple[list, Plan]:
    try:
        first, second, role = chain_parts(lb)
        rows, outer = "m", "l"
    except NoTemplate as exc:
        try:
            first, second, role = chain_parts(lb, transposed=True)
        except NoTemplate:
            raise exc from None
        rows, outer = "l", "m"
    plan = matrix_plan(lb, role, tiles_of(tiling), (rows,), ("k", outer), options, whole_roles=("n",))
    k, o = role["k"], role[outer]
    gemm1 = lb.in_region((first, 0)) + lb.in_region((first, 1))
    between = lb.in_region((second, 0)) + lb.in_region((second, 1))
    (a1, b1), (a2, b2) = lb.body[first].inputs, lb.body[second].inputs
    acc1, acc2 = accumulator(lb.body[first].dtype), accumulator(lb.body[second].dtype)

    def kernel(refs, outs):
        def o_step(o_start, e):
            c = first_gemm_tile(plan, refs, o_start, k, o, gemm1, first, (a1, b1), acc1)
            starts = {o: o_start} if o in plan.loops else {}
            env = evaluate(plan, between, {first: typed(plan, c, lb.body[first].dtype)}, loader(plan, refs, starts),
                           starts)
            return e + dot(plan, second, env[a2], env[b2], starts, acc2)
        e = loop(plan, o, o_step, jnp.zeros(plan.shape(second), acc2))
        env = evaluate(plan, lb.in_region(MAIN), {second: typed(plan, e, lb.body[second].dtype)}, loader(plan, refs))
        store(plan, outs, env)

    return launch(plan, kernel, inputs, options, name), plan
