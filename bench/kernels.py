"""Which kernels each target gets: the fused program chosen for a workload on cpu, gpu-h100 and npu-910b.

No timing here (GPU and NPU programs run through JAX on this machine); the table shows what the cost
model chose per target and why saturation stopped, and counts kernels by kind.
"""
from __future__ import annotations

from superopt.workloads import WORKLOADS
from superopt import superopt
from superopt.core import progress
from superopt.core.ops import REDUCTIONS
from superopt.extract.tiling import cone

TARGETS = ("cpu", "gpu-h100", "npu-910b")
WORKLOADS_SHOWN = ("bert-encoder-128", "resnet-bottleneck")
_PLUMBING = frozenset({"arg", "const", "lit", "reshape", "broadcast", "iota"})


def kind(node) -> str:
    """A kernel's kind, read off its body; a plain op is a kernel of its own op."""
    if node.op != "kernel":
        return node.op
    ops = {n.op for n in node.attrs[0]}
    body = node.attrs[0]
    matmuls = [i for i, n in enumerate(body) if n.op == "matmul"]
    if len(matmuls) == 2:
        if len(node.attrs) > 1 and node.attrs[1].online:
            return "flash attention"
        # a row reduction between the two GEMMs (on the intermediate) is a softmax: attention
        between = {i for i in cone(body, body[matmuls[1]].inputs[0]) if matmuls[0] in cone(body, i) and i != matmuls[0]}
        return "attention" if any(body[i].op in REDUCTIONS for i in between) else "GEMM chain"
    if ops & {"matmul", "conv"}:
        producer = "matmul" if "matmul" in ops else "conv"
        return f"{producer}+epilogue" if len(ops - {"arg", "broadcast", "reshape", producer}) else producer
    if ops & {"reduce_sum", "reduce_max", "reduce_min"}:
        return "row kernel"
    return "elementwise"


def census(graph) -> dict[str, int]:
    """Kernels by kind, over the launches of the program (constant sub-terms, hoisted, excluded)."""
    constant = graph.constant_nodes()
    counts: dict[str, int] = {}
    for i in graph.live():
        node = graph.nodes[i]
        if i in constant or node.op in _PLUMBING:
            continue
        k = kind(node)
        counts[k] = counts.get(k, 0) + 1
    return counts


def chosen(name: str, target: str) -> dict:
    wl = WORKLOADS[name]()
    fast = superopt(wl.fn, target=target)
    spec = fast.compile(*wl.args)
    report = fast.report
    return {"workload": name, "target": target, "outcome": report.outcome, "stop": report.run.stop_reason.value,
            "enodes": report.run.enodes, "census": census(spec.term), "declined": report.declined[:1],
            "estimate": report.speedup_estimate}


def render(rows: list[dict]) -> list[str]:
    lines = ["## Kernels chosen per target", "",
             "The same workload optimized for each target (the GPU and NPU programs are extracted with those "
             "targets' cost models and run through JAX here). Launches are counted by kind; constant "
             "sub-terms are computed once when the program is built and not counted.", "",
             "| workload | target | outcome | stop reason | e-nodes | launches by kind | model estimate | "
             "largest fusion declined |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        kinds = ", ".join(f"{k} x{n}" for k, n in sorted(r["census"].items(), key=lambda kv: (-kv[1], kv[0])))
        declined = _declined_cell(r["declined"][0]) if r["declined"] else "none"
        lines.append(f"| {r['workload']} | {r['target']} | {r['outcome']} | {r['stop']} | {r['enodes']} | "
                     f"{kinds} | {r['estimate']:.2f}x | {declined} |")
    return lines + [""]


def _declined_cell(text: str, width: int = 48) -> str:
    """`kernel{body} -> type: why` with the body shortened, fit for a table cell."""
    head, _, why = text.partition("]: ")
    body = head.split(" -> ")[0]
    body = body if len(body) <= width else body[:width - 4] + "...}"
    return f"`{body}`: {why}".replace("|", "\\|")


def main(names=WORKLOADS_SHOWN) -> list[str]:
    rows = []
    for name in names:
        for target in TARGETS:
            progress.note(f"[kernels] {name} on {target}")
            rows.append(chosen(name, target))
    return render(rows)
