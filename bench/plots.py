"""PNG plots of the benchmark figures (matplotlib, no display needed). Each function draws one figure
from the rows `bench.run` measured and returns the path written, or None when there is nothing to draw."""
from __future__ import annotations

import os

FIGURES = "docs/figures"


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: str) -> str:
    from matplotlib.ticker import NullFormatter
    for ax in fig.axes:                     # log axes: label the decades only, or the labels overlap
        for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
            if scale == "log":
                axis.set_minor_formatter(NullFormatter())
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def overview(rows: list[dict], path: str) -> str | None:
    """Four panels per workload: CPU time ratio against jax.jit, NPU cycles unfused and optimized,
    optimize time with e-graph size, kernels before and after."""
    rows = [r for r in rows if "error" not in r]
    if not rows:
        return None
    plt = _pyplot()
    names = [r["name"] for r in rows]
    ys = list(range(len(rows)))
    fig, axes = plt.subplots(1, 4, figsize=(17, 0.32 * len(rows) + 1.8), sharey=True)

    ax = axes[0]
    ratios = [r["ratio"] for r in rows]
    ax.barh(ys, [x - 1 for x in ratios], left=1,   # from 1: faster extends left, slower right
            color=["#59a14f" if x < 0.97 else "#e15759" if x > 1.03 else "#bab0ac" for x in ratios])
    ax.axvline(1.0, color="#333", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlim(min(ratios + [0.9]) / 1.3, max(ratios + [1.1]) * 1.3)
    ax.set_xlabel("CPU time, superopt / jax.jit (log; < 1 is faster)")
    ax.set_yticks(ys, names, fontsize=8)
    ax.invert_yaxis()

    ax = axes[1]
    pairs = [(i, r["npu_unfused"], r["npu_optimized"]) for i, r in zip(ys, rows) if r.get("npu_unfused")]
    if pairs:
        ax.barh([i - 0.2 for i, _, _ in pairs], [u for _, u, _ in pairs], height=0.4, color="#bab0ac", label="unfused")
        ax.barh([i + 0.2 for i, _, _ in pairs], [o for _, _, o in pairs], height=0.4, color="#4e79a7",
                label="optimized")
        ax.set_xscale("log")
        ax.legend(fontsize=7, loc="lower right")
        for i, r in zip(ys, rows):
            if "npu_error" in r:
                ax.text(min(u for _, u, _ in pairs), i, " not lowered", va="center", fontsize=6, color="#c0392b")
    target = next((r["npu_target"] for r in rows if r.get("npu_target")), "npu")
    ax.set_xlabel(f"{target} emulator cycles (log)")

    ax = axes[2]
    ax.barh(ys, [r["optimize_s"] for r in rows], color="#f28e2b")
    ax.set_xscale("log")
    ax.set_xlabel("optimize time (s, log); e-nodes at the bar")
    for y, r in zip(ys, rows):
        ax.text(r["optimize_s"], y, f" {r['enodes']}", va="center", fontsize=6)

    ax = axes[3]
    ax.barh([y - 0.2 for y in ys], [r["kernels_before"] for r in rows], height=0.4, color="#bab0ac", label="before")
    ax.barh([y + 0.2 for y in ys], [r["kernels_after"] for r in rows], height=0.4, color="#76b7b2", label="after")
    ax.set_xscale("log")
    ax.set_xlabel("kernel launches (log); before -> after at the bar")
    for y, r in zip(ys, rows):
        ax.text(max(r["kernels_before"], r["kernels_after"]), y, f" {r['kernels_before']} -> {r['kernels_after']}",
                va="center", fontsize=6)
    ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"superopt on target {rows[0]['target']}: CPU time, NPU cycles, optimize time, kernels", fontsize=10)
    return _save(fig, path)


def tiling(data: list[dict], path: str) -> str | None:
    """Data volume of the chosen tiles and of the unfused GEMMs, over the attainable optimum, per chain."""
    if not data:
        return None
    plt = _pyplot()
    targets = sorted({r["target"] for r in data})
    fig, axes = plt.subplots(1, len(targets), figsize=(6 * len(targets), 3.4), squeeze=False)
    for ax, t in zip(axes[0], targets):
        rs = [r for r in data if r["target"] == t]
        xs = list(range(len(rs)))
        ax.bar([x - 0.2 for x in xs], [r["dv"] / r["dv_opt"] for r in rs], width=0.4, color="#4e79a7",
               label="chosen tiles / optimum")
        ax.bar([x + 0.2 for x in xs], [r["unfused"] / r["dv_opt"] for r in rs], width=0.4, color="#bab0ac",
               label="unfused / optimum")
        ax.axhline(1.0, color="#333", linewidth=0.8)
        ax.set_xticks(xs, [r["chain"] for r in rs], fontsize=8)
        ax.set_ylabel("data volume / attainable optimum")
        ax.set_title(f"GEMM chains on {t}", fontsize=9)
        ax.legend(fontsize=7)
    return _save(fig, path)


def ranking(rankings: list, path: str) -> str | None:
    """Predicted against measured time of each chain's candidate programs (log-log), rho in the legend."""
    if not rankings:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    for r in rankings:
        ax.scatter([p * 1e6 for p in r.predicted], [m * 1e6 for m in r.measured], s=18,
                   label=f"{r.name} (rho {r.rho:.2f})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted (us, cost model)")
    ax.set_ylabel("measured (us, CPU)")
    ax.set_title("Cost model ranking of candidate programs", fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, path)


def npu_chains(rows: list[dict], path: str) -> str | None:
    """Emulator cycles of the fused GEMM chain kernels against the two GEMMs apart."""
    if not rows:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.2))
    xs = list(range(len(rows)))
    ax.bar([x - 0.2 for x in xs], [r["unfused"] for r in rows], width=0.4, color="#bab0ac", label="two GEMMs apart")
    ax.bar([x + 0.2 for x in xs], [r["fused"] for r in rows], width=0.4, color="#e15759", label="fused chain kernel")
    ax.set_xticks(xs, [r["name"] for r in rows], fontsize=8)
    ax.set_ylabel("npu-910 emulator cycles")
    ax.legend(fontsize=7)
    return _save(fig, path)
