"""Kernel kinds: which template runs a kernel body, read off the body and its tiling.

| kind            | body                                                | template          |
|-----------------|-----------------------------------------------------|-------------------|
| elementwise     | no matrix op, no reduction                          | `elementwise.py`  |
| row kernel      | no matrix op; reductions (softmax, layer/RMS norm)  | `elementwise.py`  |
| matmul          | one matmul, with prologues and an epilogue          | `matmul.py`       |
| GEMM chain      | two matmuls, the first feeding the second's left    | `chain.py`        |
|                 | (C @ D, or C^T @ D: the second contracts C's rows)  |                   |
| attention       | a GEMM chain with a softmax between the two         | `chain.py`        |
| flash attention | attention whose tiling says online softmax          | `attention.py`    |
| fused update    | sibling elementwise kernels (an optimizer step)     | `optimizer.py`    |

(`optimizer.py` finds the siblings and merges their bodies; the elementwise template runs them.)

A body the kind's template cannot run (three matrix ops, two GEMMs the chain template does not take)
runs as one Pallas program over whole arrays (`whole`), and the launch says why; under Triton, which
takes power-of-two blocks only, it raises `NoTemplate` instead. Convolutions have no template, nor has a
body with an empty array (a sum over an empty axis): always `NoTemplate`. The program runs a node that
raised it with the JAX lowering and lists it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import jax
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from superopt.core.ir import Graph, Node

from superopt.core.ops import REDUCTIONS
from superopt.extract.tiling import _online_softmax
from superopt.lowering.jax import evaluate as jax_evaluate
from superopt.lowering.pallas.attention import attention
from superopt.lowering.pallas.blocks import NARROW, Options, TooLarge
from superopt.lowering.pallas.chain import chain
from superopt.lowering.pallas.elementwise import pointwise
from superopt.lowering.pallas.labels import MATRIX, NoTemplate, label
from superopt.lowering.pallas.matmul import matmul

TEMPLATES = {"elementwise": pointwise, "row kernel": pointwise, "fused update": pointwise, "matmul": matmul,
             "GEMM chain": chain, "attention": chain, "flash attention": attention}


@dataclass
class Launch:
    """One pallas_call of the program: the graph nodes it computes, and how."""
    nodes: tuple
    kind: str
    detail: str                  # grid and tiles, or "one program over whole arrays"
    note: str = ""               # why a template was not used, or a tile the body overrode
    plan: object = field(default=None, repr=False, compare=False)   # the template's `blocks.Plan`

    def __str__(self) -> str:
        where = ",".join(f"%{i}" for i in self.nodes)
        return f"{where} {self.kind}: {self.detail}" + (f" ({self.note})" if self.note else "")


def kind_of(body: tuple, tiling=None) -> str:
    mats = [i for i, n in enumerate(body) if n.op in MATRIX]
    if any(body[i].op == "conv" for i in mats):
        return "conv"
    if not mats:
        return "row kernel" if any(n.op in REDUCTIONS for n in body) else "elementwise"
    if len(mats) == 1:
        return "matmul"
    if len(mats) == 2:
        if tiling is not None and getattr(tiling, "online", False):
            return "flash attention"
        return "attention" if _online_softmax(body, mats[1]) else "GEMM chain"
    return f"{len(mats)} matrix ops"


def inline_scalars(body: tuple, scalars: dict) -> tuple:
    """The body with the rank-0 operands whose values are known (literals, constants) as literals."""
    return tuple(Node("lit", (), (scalars[n.attrs[0]],), n.shape, n.dtype)
                 if n.op == "arg" and n.attrs[0] in scalars else n for n in body)


def run_kernel(body: tuple, inputs: list, tiling, options: Options, name: str, kind: str | None = None,
               roots: tuple | None = None, scalars: dict | None = None) -> tuple[list, Launch]:
    """The body's outputs (a list, one per root) computed by its kind's template, and the launch."""
    kind = kind or kind_of(body, tiling)
    if kind == "conv":
        raise NoTemplate("no Pallas template for convolutions")
    if any(0 in n.shape for n in body):    # a template's tiles divide by extents: an empty sum divided by 0
        raise NoTemplate("an empty array: nothing to tile")
    body = inline_scalars(body, scalars or {})
    why = f"no template for {kind}"
    templates = [(kind, TEMPLATES[kind])] if kind in TEMPLATES else []
    if kind == "attention":   # whole softmax rows too large for shared memory: over tiles of them instead
        templates.append(("flash attention", attention))
    for run_as, template in templates:
        try:
            lb = label(body, roots, tie_roots=kind == "fused update")
            outs, plan = template(lb, inputs, tiling, options, name)
            notes = plan.notes + ([f"as flash attention: {why}"] if run_as != kind else [])
            return outs, Launch((), run_as, plan.describe(), "; ".join(notes), plan)
        except TooLarge as exc:
            why = str(exc)
        except NoTemplate as exc:
            why = str(exc)
            break
    if options.pow2:   # Triton takes power-of-two blocks only; whole arrays rarely are
        raise NoTemplate(why)
    return whole(body, inputs, options, name, roots), Launch((), kind, "one program over whole arrays", why)


def whole(body: tuple, inputs: list, options: Options, name: str, roots: tuple | None = None) -> list:
    """The body as one Pallas program whose blocks are the whole arrays."""
    roots = tuple(roots) if roots is not None else (len(body) - 1,)
    used = sorted({n.attrs[0] for n in body if n.op == "arg"})

    def spec(shape):
        return pl.BlockSpec(tuple(shape), lambda: (0,) * len(shape))

    def kernel(*refs):
        loaded = {k: ref[...] for k, ref in zip(used, refs[:len(used)])}
        args = [loaded.get(k) for k in range(max(used, default=-1) + 1)]
        graph = Graph(nodes=list(body), outputs=list(roots))
        env: dict = {}
        for i in graph.live():      # one node at a time: a bf16 value rounds at its type (`blocks.typed`)
            env = jax_evaluate(graph, args, env, only=[i])
            if options.interpret and body[i].op not in ("arg", "lit") and body[i].dtype in NARROW:
                env[i] = lax.optimization_barrier(env[i])
        for r, out in zip(roots, refs[len(used):]):
            out[...] = env[r].astype(out.dtype)

    call = pl.pallas_call(
        kernel, name=name, out_shape=[jax.ShapeDtypeStruct(body[r].shape, np.dtype(body[r].dtype)) for r in roots],
        in_specs=[spec(inputs[k].shape) for k in used], out_specs=[spec(body[r].shape) for r in roots],
        interpret=options.interpret, compiler_params=options.compiler_params)
    return call(*[inputs[k] for k in used])
