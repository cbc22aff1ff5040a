"""Template: flash attention, softmax(f(Q @ K)) @ V over tiles of the key axis with an online softmax.

The term says so: its tiling has `online` set (`extract/tiling.py` checks that the ops between the
GEMMs are exp(S - max S) / sum, or a division by a per-row value it loads). The grid and the K loop are
the GEMM chain's (`chain.py`); the loop over L by TL carries, per row, the running maximum of S, the
value subtracted from S (the body's own expression of that maximum, e.g. max(-inf, rowmax)), the
running sum of exp and the accumulator of exp(S - m) @ V. When the maximum grows, the sum and the
accumulator are rescaled by exp(m_old - m_new); after the loop the accumulator is divided by the sum
once. Key columns past L (a ragged last tile) count as -inf in the maximum and 0 in the sum and in
the product. A row whose scores so far are all -inf subtracts 0 instead of -inf, as flash attention
does, so that it adds zeros rather than NaN until a finite score arrives.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from superopt.extract.tiling import _online_softmax, _strip, cone
from superopt.lowering.pallas.blocks import Options, Plan, accumulator, dot, evaluate, launch, loader, store, typed
from superopt.lowering.pallas.chain import chain_parts, first_gemm_tile
from superopt.lowering.pallas.labels import MAIN, Labelled, NoTemplate
from superopt.lowering.pallas.matmul import loop, matrix_plan, tiles_of


def softmax_parts(lb: Labelled, second: int) -> dict:
    """Body indices of the online softmax's pieces between the GEMMs."""
    body = lb.body
    if not _online_softmax(body, second):
        raise NoTemplate("the ops between the GEMMs are not a softmax over the key axis")
    p = _strip(body, body[second].inputs[0], ("convert", "reshape"))
    exp = _strip(body, body[p].inputs[0], ("convert",))
    den = _strip(body, body[p].inputs[1])
    sub = body[exp].inputs[0]
    scores, shift = body[sub].inputs
    if body[shift].op != "broadcast":
        raise NoTemplate("the subtracted maximum is not a per-row value")
    row_max = next(j for j in cone(body, shift) if body[j].op == "reduce_max")
    shift_row = body[shift].inputs[0]
    region = set(lb.in_region((second, 0)))
    s_nodes = sorted(region & cone(body, scores))
    m_nodes = sorted((region & cone(body, shift_row)) - set(s_nodes) - {row_max})
    e_nodes = sorted((region & cone(body, exp)) - set(s_nodes) - set(m_nodes) - {row_max})
    parts = dict(scores=scores, row_max=row_max, shift_row=shift_row, exp=exp, den=den,
                 s_nodes=s_nodes, m_nodes=m_nodes, e_nodes=e_nodes, den_nodes=[])
    if body[den].op == "reduce_sum":
        parts["den_nodes"] = sorted((region & cone(body, body[den].inputs[0])) - set(cone(body, exp)))
    return parts


def _along(plan: Plan, row_value: int, value: int, x, shape: tuple):
    """A per-row value (body value `row_value`'s block) broadcast over body value `value`'s block."""
    rows = [plan.lb.axes[row_value][a] for a in plan.kept(row_value)]
    cols = [plan.lb.axes[value][a] for a in plan.kept(value)]
    return lax.broadcast_in_dim(x, shape, tuple(cols.index(lab) for lab in rows))


def attention(lb: Labelled, inputs: list, tiling, options: Options, name: str) -> tuple[list, Plan]:
    first, second, role = chain_parts(lb)
    sm = softmax_parts(lb, second)
    if any(role["l"] in labels for region, labels in lb.reduced.items() if region != (second, 0)):
        raise NoTemplate("the key axis is reduced outside the softmax")
    plan = matrix_plan(lb, role, tiles_of(tiling), ("m",), ("k", "l"), options, whole_roles=("n",), online=("l",))
    k, l_ = role["k"], role["l"]
    body = lb.body
    gemm1 = lb.in_region((first, 0)) + lb.in_region((first, 1))
    (a1, b1), (a2, b2) = body[first].inputs, body[second].inputs
    acc1, acc2 = accumulator(body[first].dtype), accumulator(body[second].dtype)
    row_dtype = np.dtype(body[sm["row_max"]].dtype)
    row_shape = plan.shape(sm["shift_row"])
    row_sum = body[sm["den"]].op == "reduce_sum"

    def kernel(refs, outs):
        def l_step(l_start, carry):
            e, running, shift_prev, total = carry

            c = first_gemm_tile(plan, refs, l_start, k, l_, gemm1, first, (a1, b1), acc1)
            starts = {l_: l_start} if l_ in plan.loops else {}
            load = loader(plan, refs, starts)
            env = evaluate(plan, sm["s_nodes"], {first: typed(plan, c, body[first].dtype)}, load, starts)
            tile_max = evaluate(plan, [sm["row_max"]], env, load, starts)[sm["row_max"]]
            running = jnp.maximum(running, tile_max)
            env[sm["row_max"]] = running
            evaluate(plan, sm["m_nodes"], env, load, starts)
            shift = env[sm["shift_row"]].astype(jnp.float32)
            shift = jnp.where(shift == -jnp.inf, 0.0, shift)
            env[sm["shift_row"]] = shift.astype(body[sm["shift_row"]].dtype)
            evaluate(plan, sm["e_nodes"], env, load, starts)
            scale = jnp.exp(shift_prev - shift)
            if row_sum:
                evaluate(plan, sm["den_nodes"] + [sm["den"]], env, load, starts)
                total = scale * total + env[sm["den"]].astype(jnp.float32).reshape(row_shape)
            num = env[sm["exp"]].astype(body[a2].dtype)
            evaluate(plan, lb.in_region((second, 1)), env, load, starts)
            e = _along(plan, sm["shift_row"], second, scale, e.shape) * e + \
                dot(plan, second, num, env[b2], starts, acc2)
            return e, running, shift, total

        init = (jnp.zeros(plan.shape(second), acc2), jnp.full(plan.shape(sm["row_max"]), -jnp.inf, row_dtype),
                jnp.full(row_shape, -jnp.inf, jnp.float32), jnp.zeros(row_shape, jnp.float32))
        e, _, _, total = loop(plan, l_, l_step, init)
        if not row_sum:
            env = evaluate(plan, [sm["den"]], {}, loader(plan, refs))
            total = env[sm["den"]].astype(jnp.float32).reshape(row_shape)
        e = e / _along(plan, sm["shift_row"], second, total, e.shape)
        env = evaluate(plan, lb.in_region(MAIN), {second: typed(plan, e, body[second].dtype)}, loader(plan, refs))
        store(plan, outs, env)

    return launch(plan, kernel, inputs, options, name), plan
