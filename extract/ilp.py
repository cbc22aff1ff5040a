"""ILP extraction with HiGHS: the cheapest DAG, each e-node paid once, provably optimal when it finishes.

One binary x_n per typed e-node. Every program output needs a chosen node in its class; a chosen node
needs a chosen node in each child class; a class has at most one chosen node; and an order variable t_c
per class makes the choice acyclic (a chosen node's class comes after its children's). The objective is
the sum of the chosen nodes' costs, with nodes computable from constants alone at zero (they are
hoisted). The ILP result is compared with greedy's by the cost of the built program, so extracting with
the ILP is never worse than greedy; without a solution it falls back to greedy.

What decides the result is counted: HiGHS runs on one thread (its parallel search is not repeatable) and
stops at `NODE_BUDGET` branch-and-bound nodes, so the same e-graph gives the same choice on an idle and a
busy machine. Its time limit is a backstop, and the method record says when it fired ("stopped by the
time backstop"): only then does the result depend on the machine's speed.
"""
from __future__ import annotations

import math

from superopt.core.deadline import current, current_search
from superopt.core.graphs import strongly_connected
from superopt.egraph.encode import Encoding
from superopt.egraph.frozen import FrozenEGraph
from superopt.core.ir import hoistable
from superopt.extract import cone
from superopt.extract.kernels import expand
from superopt.extract.extraction import Method
from superopt.extract.greedy import (OPTIONAL_SHARE, Extraction, build_graph, declined_fusions, extract as extract_greedy,
                                     node_costs, program_cost)
from superopt.extract.target import Target

# Branch-and-bound nodes HiGHS may explore before it returns the best solution found: a deterministic
# budget, sized on an idle 2-core machine. A BERT layer's e-graph (1,642 binaries) takes 6 to 9 s for its
# root node and 50 more; most workloads' e-graphs are solved at the root. The time backstop (20 s) fires on
# larger ones: a training step's e-graph (7,050 binaries) had not finished its root node in 30 s.
NODE_BUDGET = 20


def _constant_classes(fz: FrozenEGraph, typed) -> set:
    """Classes whose value some derivation computes from constants alone."""
    constant: set = set()
    changed = True
    while changed:
        changed = False
        for cls, nodes in fz.classes.items():
            if cls in constant:
                continue
            for n in nodes:
                if n in typed and hoistable(n.fn, [c in constant for c in n.children]):
                    constant.add(cls)
                    changed = True
                    break
    return constant


def _reachable(fz: FrozenEGraph, typed) -> set:
    seen, stack = set(), list(fz.outputs.values())
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for n in fz.classes.get(cls, []):
            if n in typed:
                stack.extend(n.children)
    return seen


def _cycle_components(members: dict) -> dict:
    """The classes that lie on a cycle of the class graph (a node's class -> its children's classes), each
    mapped to the index of its strongly connected component: only there can a choice be cyclic, so only
    there does the ILP need order variables (their big-M constraints make the relaxation weak and slow)."""
    edges = {cls: {c for n in ns for c in n.children if c in members and c != cls} for cls, ns in members.items()}
    return {cls: k for k, scc in enumerate(strongly_connected(sorted(members), edges)) for cls in scc}


def extract_ilp(fz: FrozenEGraph, enc: Encoding, target: Target, time_limit: float = 20.0,
                keep_cone: bool = False) -> Extraction:
    """`keep_cone`: as greedy's (extract/cone.py), in both."""
    deadline = current()   # the call's (superopt/core/deadline.py): growth, greedy and HiGHS share what is left
    # kernels as concrete variants, each with a fixed cost
    fz = expand(fz, enc.conv_params, target, stop=current_search().part(OPTIONAL_SHARE / 2))
    greedy = extract_greedy(fz, enc, target, keep_cone=keep_cone)
    pinned = cone.pins(fz, enc) if keep_cone else None
    forbidden = pinned.forbidden(fz, enc) if pinned is not None and pinned.chosen else set()
    time_limit = max(min(time_limit, deadline.share(OPTIONAL_SHARE)), 1e-3)
    try:
        import highspy
    except ImportError:  # pragma: no cover - highspy is a dependency
        greedy.method = greedy.method.but(detail="highspy is not installed")
        return greedy
    own = {n: c for n, c in node_costs(fz, enc, target).items()
           if math.isfinite(c) and n not in forbidden}  # infinite: cannot run
    classes = _reachable(fz, own)
    constant = _constant_classes(fz, own)
    nodes = [n for cls in classes for n in fz.classes.get(cls, []) if n in own]

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_max_nodes", NODE_BUDGET)
    h.setOptionValue("threads", 1)
    x = {n: h.addBinary() for n in nodes}
    members: dict = {}
    for n in nodes:
        members.setdefault(n.eclass, []).append(n)
    order = {cls: h.addVariable(lb=0, ub=len(classes)) for cls in _cycle_components(members)}
    for cls in fz.outputs.values():
        h.addConstr(sum(x[n] for n in members.get(cls, [])) >= 1)
    for cls, ns in members.items():
        h.addConstr(sum(x[n] for n in ns) <= 1)
    cyclic = _cycle_components(members)
    big = len(classes) + 1
    for n in nodes:
        for child in set(n.children):
            options = members.get(child, [])
            if child == n.eclass or not options:
                h.addConstr(x[n] <= 0)
                continue
            h.addConstr(x[n] <= sum(x[m] for m in options))
            if cyclic.get(child, -1) == cyclic.get(n.eclass, -2):   # only a cycle needs an order
                h.addConstr(order[n.eclass] - order[child] >= 1 - big * (1 - x[n]))

    def cost(n):
        return 0.0 if hoistable(n.fn, [c in constant for c in n.children]) else own[n]

    h.minimize(sum(cost(n) * x[n] for n in nodes))
    status = h.modelStatusToString(h.getModelStatus())
    chosen = {n.eclass: n for n in nodes if h.val(x[n]) > 0.5}
    if any(cls not in chosen for cls in fz.outputs.values()):
        greedy.method = greedy.method.but(detail=f"the ILP found no solution: {status}")
        return greedy
    graph = build_graph(fz, enc, chosen)
    total, per_node = program_cost(graph, target)
    proof, backstop = _proof(status, time_limit), "time limit" in status.lower()
    if total <= greedy.cost:
        hoisted = {cls for cls, n in chosen.items() if hoistable(n.fn, [c in constant for c in n.children])}
        return Extraction(graph, total, per_node, method=Method("ilp", proof, backstop=backstop,
                                                                 pinned=cone.pinned_count(pinned)),
                          declined=declined_fusions(fz, chosen, own, target, hoisted))
    greedy.method = greedy.method.but(detail=f"cheaper than the ILP's result, {proof}", backstop=backstop)
    return greedy


def _proof(status: str, time_limit: float) -> str:
    """What the solver's stop says about the result: proven optimal, the best within the node budget
    (deterministic), or the best when the time backstop fired (depends on the machine's speed)."""
    if status == "Optimal":
        return "optimal"
    if status == "Solution limit reached":   # what HiGHS reports at mip_max_nodes
        return f"best within {NODE_BUDGET} nodes"
    if "time limit" in status.lower():
        return f"stopped by the time backstop, {time_limit:.3g} s"
    return f"stopped: {status}"
