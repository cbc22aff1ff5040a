"""Distinct programs from one e-graph, for measuring how well the cost model ranks them.

The greedy choice first; then, for every e-class with alternatives, the greedy choice with one
alternative forced (the class's other nodes excluded); then pairs of forced choices, until `limit`
distinct programs are found. Programs are distinct when their printed terms differ.
"""
from __future__ import annotations

import itertools

from superopt.egraph.encode import Encoding
from superopt.egraph.frozen import FrozenEGraph
from superopt.egraph.ir import pretty
from superopt.extract.greedy import ExtractionError, Extraction, extract, node_costs
from superopt.extract.kernels import expand
from superopt.extract.target import Target


def candidates(fz: FrozenEGraph, enc: Encoding, target: Target, limit: int = 8) -> list[Extraction]:
    fz = expand(fz, enc.conv_params, target)  # once: kernels as concrete variants
    found: dict[str, Extraction] = {}

    def add(exclude) -> None:
        try:
            e = extract(fz, enc, target, exclude=frozenset(exclude))
        except ExtractionError:
            return
        found.setdefault(pretty(e.graph), e)

    add(())
    typed = node_costs(fz, enc, target)
    choices = [[n for n in nodes if n in typed] for _, nodes in sorted(fz.classes.items(), key=lambda kv: str(kv[0]))]
    forcings = [(node, [m for m in nodes if m is not node]) for nodes in choices if len(nodes) > 1 for node in nodes]
    for _, others in forcings:
        if len(found) >= limit:
            break
        add(others)
    for (_, a), (_, b) in itertools.combinations(forcings, 2):
        if len(found) >= limit:
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
