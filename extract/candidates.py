"""Distinct programs from one e-graph, for measuring how well the cost model ranks them.

The greedy choice first; then, for every e-class with alternatives, the greedy choice with one
alternative forced (the class's other nodes excluded); then pairs of forced choices, until `limit`
distinct programs are found or the time budget is spent. Programs are distinct when their printed terms
differ up to the order of independent nodes (`program_key`); of equal ones the cheapest is kept.
"""
from __future__ import annotations

import hashlib
import itertools
import time
from math import prod

from superopt.core.ir import Graph, _attr_str, body_str, type_str
from superopt.egraph.encode import Encoding
from superopt.egraph.frozen import FrozenEGraph
from superopt.extract.greedy import Extraction, ExtractionError, extract, node_costs
from superopt.extract.kernels import expand
from superopt.extract.target import Target


def program_key(graph: Graph) -> str:
    """The printed program (`pretty`: ops, attributes, types and kernel bodies) up to the numbering and
    order of its nodes, and with a reshape and a broadcast that only add unit axes the same view: equal
    for two extractions that compute the same thing and differ in nothing a reader could see."""
    keys: dict[int, str] = {}
    for i in graph.live():
        node = graph.nodes[i]
        if node.op == "kernel":
            head = f"kernel{{{body_str(node.attrs[0])}}}"
        elif node.op in ("reshape", "broadcast") and len(node.inputs) == 1 and \
                prod(node.shape) == prod(graph.nodes[node.inputs[0]].shape):
            head = "view"
        else:
            head = f"{node.op}[{_attr_str(node, graph)}]"
        text = f"{head}({','.join(keys[j] for j in node.inputs)}):{type_str(node)}"
        keys[i] = hashlib.sha1(text.encode()).hexdigest()
    return ",".join(keys[o] for o in graph.outputs)


def candidates(fz: FrozenEGraph, enc: Encoding, target: Target, limit: int = 8,
               deadline: float | None = None) -> list[Extraction]:
    """Up to `limit` distinct programs, cheapest first; the greedy choice is always tried, and no further
    extraction starts after `deadline` (a `time.perf_counter()` value)."""
    fz = expand(fz, enc.conv_params, target)  # once: kernels as concrete variants
    found: dict[str, Extraction] = {}

    def add(exclude) -> None:
        try:
            e = extract(fz, enc, target, exclude=frozenset(exclude))
        except ExtractionError:
            return
        key = program_key(e.graph)
        if key not in found or e.cost < found[key].cost:
            found[key] = e

    def done() -> bool:
        return len(found) >= limit or (deadline is not None and time.perf_counter() > deadline)

    add(())
    typed = node_costs(fz, enc, target)
    choices = [[n for n in nodes if n in typed] for _, nodes in sorted(fz.classes.items(), key=lambda kv: str(kv[0]))]
    forcings = [(node, [m for m in nodes if m is not node]) for nodes in choices if len(nodes) > 1 for node in nodes]
    for _, others in forcings:
        if done():
            break
        add(others)
    for (_, a), (_, b) in itertools.combinations(forcings, 2):
        if done():
            break
        add(a + b)
    return sorted(found.values(), key=lambda e: e.cost)


def spearman(xs, ys) -> float:
    """Spearman's rank correlation (ties get their average rank)."""
    def ranks(values):
        order = sorted(range(len(values)), key=lambda i: values[i])
        r = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return r
    rx, ry = ranks(list(xs)), ranks(list(ys))
    n = len(rx)
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sx = sum((a - mx) ** 2 for a in rx) ** 0.5
    sy = sum((b - my) ** 2 for b in ry) ** 0.5
    return cov / (sx * sy) if sx and sy else 0.0
