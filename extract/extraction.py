"""What an extractor returns, and the cost of a captured program under the same model: plain data and the
cost model only, so that a call the cache answers (superopt/pipeline.py) loads neither egglog nor an
extractor."""
from __future__ import annotations

from dataclasses import dataclass, field

from superopt.core.ir import Graph
from superopt.extract.cost import op_cost
from superopt.extract.loops import loop_costs
from superopt.extract.models.registry import model_of
from superopt.extract.target import Target


@dataclass
class Extraction:
    graph: Graph
    cost: float
    node_costs: list[float]  # per live node of `graph`, seconds per call (0 for hoisted constants)
    method: str = "greedy"   # which extractor produced it, and how it ended
    declined: list = field(default_factory=list)  # larger fusions that were available and not chosen, and why
    memory: str = ""         # what fitting a memory budget did, when one was given


def program_cost(graph: Graph, target: Target) -> tuple[float, list[float]]:
    """Cost of a program under the same model (constant sub-terms hoisted), per live node. Where the target's
    model `fuses` (the cpu: as XLA runs it, in its own fusions, extract/xla.py), as that model prices it;
    elsewhere each op or kernel node as one kernel. A loop
    (scan, fori_loop, while_loop) is priced as its trips times its body, a cond as its costliest branch
    (extract/loops.py)."""
    model = model_of(target)
    if model.fuses:
        return model.program_cost(graph, target)
    constant = graph.constant_nodes()
    live = graph.live()
    loops = loop_costs(graph, live, target)
    costs = []
    for i in live:
        node = graph.nodes[i]
        ins = [(graph.nodes[j].shape, graph.nodes[j].dtype) for j in node.inputs]
        costs.append(0.0 if i in constant else loops[i] if i in loops else
                     op_cost(node.op, node.attrs, ins, (node.shape, node.dtype), target))
    return sum(costs), costs


def as_run(chosen: Extraction, target: Target) -> Extraction:
    """`chosen` with its cost as the program runs (`program_cost`): where the model `fuses` (on a CPU, XLA
    fuses what extraction's kernels fuse and more), the price the decision to change the program compares."""
    if model_of(target).fuses:
        chosen.cost = program_cost(chosen.graph, target)[0]
    return chosen
