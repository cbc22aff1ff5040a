"""Tiles chosen for the thesis's GEMM chains G1-G12 on npu-910 and gpu-a100, against the analytic optimum.

Each chain E = (A @ B) @ D runs through the whole pipeline in float16 (the matrix units' dtype); the
extracted program is one chain kernel whose tiling attribute the extractor picked. For it the table
gives the tiles, their on-chip footprint MU against the capacity, the data volume DV they move, and:
- DV* (closed form): 2ML(K+N)/TM* per batch entry, TM* = -a + sqrt(a^2 + MC) (thesis Table 3.4), a
  bound over real-valued tiles that ignores the extents;
- DV* (clamped): the same real-valued optimum with each tile at most its extent (what the closed form
  becomes when a whole extent fits);
- DV opt (integer tiles): the exact minimum of the same volume over tiles that are multiples of the
  granule, tile counts being integers (`optimal_dv_tiles`): the attainable optimum, and the reference
  for "within 10%";
- unfused: the two GEMMs as separate kernels, each at its best tiling, C written and read back.
MC is the capacity in elements of the operands (bytes / 2 for float16); volumes are in elements.
On npu-910 the extractor picks the tiles by the NPU model's cycles (the busiest cube core, the (m, l) tiles
dealt to the cores), not by DV alone, so it moves more than the optimum where that keeps more cores busy.
"""
from __future__ import annotations

import jax.numpy as jnp

from superopt.workloads import GEMM_CHAIN_SHAPES, gemm_chain
from superopt import superopt
from superopt.core import progress
from superopt.extract.cost import one_op_body, tiling_options
from superopt.extract.models.chimera import optimal_dv_clamped, optimal_dv_mlkn, optimal_dv_tiles
from superopt.extract.models.registry import model_of
from superopt.extract.target import load_target

TARGETS = ("npu-910", "gpu-a100")
ITEMSIZE = 2


def chosen_kernel(name: str, target: str):
    """(node, tiling) of the one chain kernel extracted for G<name> in float16 on `target`: the extractor's
    choice, not run (no verification on JAX, no NPU program: the callers measure the tiles themselves)."""
    w = gemm_chain(name)
    args = tuple(jnp.asarray(a, jnp.float16) for a in w.args)
    graph = superopt(w.fn, target=target, verify=False, backend="jax").compile(*args).term
    kernels = [graph.nodes[i] for i in graph.live() if graph.nodes[i].op == "kernel"]
    chains = [k for k in kernels if sum(n.op == "matmul" for n in k.attrs[0]) == 2]
    if len(chains) != 1 or len(kernels) != 1:
        raise AssertionError(f"{name} on {target}: expected one chain kernel, got {len(kernels)} kernels")
    return chains[0], chains[0].attrs[1]


def unfused_dv(b, m, n, k, l, target) -> float:
    """Elements moved by the two GEMMs run apart, each at its best tiling."""
    f16 = "float16"
    total = 0.0
    for shape_a, shape_b, shape_out in (((b, m, k), (b, k, l), (b, m, l)), ((b, m, l), (b, l, n), (b, m, n))):
        ins = [(shape_a, f16), (shape_b, f16)]
        options, _ = tiling_options(one_op_body("matmul", (f16,), ins, (shape_out, f16)), ins, (shape_out, f16), target)
        total += options[0].moved_bytes / ITEMSIZE
    return total


def rows(chains=None) -> list[dict]:
    """Per target and chain (keys of GEMM_CHAIN_SHAPES; all by default): the tiles chosen and the volumes."""
    out = []
    for target_name in TARGETS:
        target = load_target(target_name)
        mc, a = target.tile_bytes // ITEMSIZE, model_of(target).tile_granule
        for name in chains or GEMM_CHAIN_SHAPES:
            b, m, n, k, l = GEMM_CHAIN_SHAPES[name]
            progress.note(f"[tiling] {name.upper()} on {target_name}")
            _, tiling = chosen_kernel(name, target_name)
            dv = tiling.moved_bytes / ITEMSIZE
            out.append(dict(
                target=target_name, chain=name.upper(), tiling=tiling, mu=tiling.tile_bytes // ITEMSIZE,
                capacity=mc, dv=dv, dv_closed=b * optimal_dv_mlkn(m, n, k, l, mc, a),
                dv_clamped=b * optimal_dv_clamped(m, n, k, l, mc, a),
                dv_opt=b * optimal_dv_tiles(m, n, k, l, mc, a)[0], unfused=unfused_dv(b, m, n, k, l, target)))
    return out


def table(data: list[dict]) -> str:
    lines = ["| target | chain | order, tiles | MU / capacity | DV chosen | DV* closed form | DV* clamped "
             "| DV opt (integer tiles) | chosen / opt | unfused DV |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in data:
        lines.append(
            f"| {r['target']} | {r['chain']} | {r['tiling']} | {r['mu']} / {r['capacity']} | {r['dv']:.4g} "
            f"| {r['dv_closed']:.4g} | {r['dv_clamped']:.4g} | {r['dv_opt']:.4g} "
            f"| {r['dv'] / r['dv_opt']:.3f} | {r['unfused']:.4g} |")
    return "\n".join(lines)


def render(data: list[dict]) -> list[str]:
    """The BENCHMARKS.md section."""
    worst = max(r["dv"] / r["dv_opt"] for r in data)
    fits = all(r["mu"] <= r["capacity"] for r in data)
    return ["", "## Tiles of the GEMM chains G1-G12 (npu-910, gpu-a100)", "",
            *[line.strip() for line in __doc__.split("\n\n", 1)[1].splitlines()], "",
            f"Every chosen MU fits its capacity: {fits}. Chosen DV / attainable optimum: at most {worst:.3f}.", "",
            table(data)]


def main() -> list[str]:
    return render(rows())


if __name__ == "__main__":
    print("\n".join(main()))
