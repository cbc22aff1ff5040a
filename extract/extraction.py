"""What an extractor returns, and the cost of a captured program under the same model: plain data and the
cost model only, so that a call the cache answers (superopt/pipeline.py) loads neither egglog nor an
extractor."""
from __future__ import annotations

from dataclasses import dataclass, field

from superopt.core.ir import Graph
from superopt.extract.cost import op_cost
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
    """Cost of a captured program under the same model (constant sub-terms hoisted), per live node."""
    constant = graph.constant_nodes()
    costs = []
    for i in graph.live():
        node = graph.nodes[i]
        ins = [(graph.nodes[j].shape, graph.nodes[j].dtype) for j in node.inputs]
        costs.append(0.0 if i in constant else op_cost(node.op, node.attrs, ins, (node.shape, node.dtype), target))
    return sum(costs), costs
