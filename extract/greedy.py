"""DAG-aware greedy extraction over a frozen e-graph.

Each e-class keeps its cheapest e-node together with the set of e-classes that choice pulls in, so a
sub-term shared by several users is paid for once (the "cost set" of extraction-gym's greedy-dag).
A node whose cost set would contain its own class would make a cycle and is never chosen. Sub-terms that
depend on constants only are computed once when the program is built, so they cost nothing per call.

The optional work (growing kernels, trying producers computed once) has counted budgets that decide how far
it goes (`extract/kernels.py` GROWTH_BUDGET; `MAX_SHARING_TRIALS`, `SHARING_NODES`), so a busy machine gets
the same program. Under a call's deadline (`superopt/core/deadline.py`) it also stops, a backstop that the
extraction's `Method` records (`trials_stopped`), when `OPTIONAL_SHARE` of the search's time left at the start
of extraction is spent (`current_search`: a segment's CPU-time budget, else the call's), keeping what it
found; the greedy choice itself raises `TimeLimit("extract")` only once the call's deadline passes.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from superopt.core.deadline import Deadline, current, current_search
from superopt.core.ir import CycleError, Graph, Node, body_str, hoistable, postorder, type_str
from superopt.core.ops import on_npu
from superopt.egraph.encode import Encoding, decode
from superopt.egraph.frozen import ENode, FrozenEGraph
from superopt.extract import cone
from superopt.extract.cost import MATRIX_OPS, op_breakdown, op_cost
from superopt.extract.errors import ExtractionError
from superopt.extract.extraction import Extraction, Method, program_cost
from superopt.extract.kernels import expand
from superopt.extract.memory import fit_budget
from superopt.extract.target import Target

CUBE_OPS = on_npu("cube")   # the matrix ops and the cube's own fractal_matmul
_LISTS = frozenset({"tcons", "tnil"})
_EPS = 1e-15
OPTIONAL_SHARE = 0.5   # of the time left when extraction starts, what kernel growth and sharing trials may take
_CHECK_EVERY = 4096    # e-nodes visited between two looks at the clock


@dataclass
class _Best:
    total: float
    node: ENode
    costs: dict  # e-class -> cost of its chosen node, over the chosen sub-DAG
    const_only: bool


def _node_types(fz: FrozenEGraph, node: ENode):
    """(input types, output type) of a tensor e-node; None where an analysis is missing."""
    def tensor_type(cls):
        if cls in fz.shapes and cls in fz.dtypes:
            return (fz.shapes[cls], fz.dtypes[cls])
        return None

    ins = []
    for child in node.children:
        kinds = {n.fn for n in fz.classes.get(child, [])}
        if kinds & _LISTS:
            ins.extend(_list_types(fz, child, tensor_type))
        else:
            ins.append(tensor_type(child))
    return ins, tensor_type(node.eclass)


def _list_types(fz, cls, tensor_type):
    out, seen = [], set()
    while cls not in seen:
        seen.add(cls)
        cons = next((n for n in fz.classes.get(cls, []) if n.fn == "tcons"), None)
        if cons is None:
            break
        out.append(tensor_type(cons.children[0]))
        cls = cons.children[1]
    return out


def node_costs(fz: FrozenEGraph, enc: Encoding, target: Target, deadline: Deadline | None = None) -> dict[ENode, float]:
    """Cost of every e-node the analyses could type (the others are never chosen)."""
    own: dict[ENode, float] = {}
    deadline = deadline or current()
    for k, cls in enumerate(fz.classes.values()):
        if k % _CHECK_EVERY == 0:
            deadline.check("extract")
        for n in cls:
            if n.fn in _LISTS:
                own[n] = 0.0
                continue
            ins, out = _node_types(fz, n)
            if out is None or any(t is None for t in ins):
                continue  # a node the analyses could not type is never chosen
            op, attrs = decode(n.fn, n.args, n.children, enc)
            own[n] = op_cost(op, attrs, ins, out, target)
    return own


def _greedy(nodes: list[ENode], own: dict, parents: dict, fixed: dict, previous: dict | None = None,
            new: tuple = ()) -> dict:
    """Cheapest node per class by cost sets; classes in `fixed` are already paid for and never change.
    With `previous` (this function's result before the classes in `new` were fixed), only what the
    newly free classes make cheaper is recomputed."""
    deadline, visits = current(), 0
    if previous is None:
        best = dict(fixed)
        queue = deque(n for n in nodes if not n.children and n in own)
        new = tuple(fixed)
    else:
        best = {**previous, **fixed}
        queue = deque()
    for cls in new:
        queue.extend(parents.get(cls, ()))
    while queue:
        n = queue.popleft()
        visits += 1
        if visits % _CHECK_EVERY == 0:
            deadline.check("extract")
        if n not in own or n.eclass in fixed or any(c not in best for c in n.children):
            continue
        costs: dict = {}
        for c in n.children:
            costs.update(best[c].costs)
        if n.eclass in costs:
            continue  # choosing n would make its class depend on itself
        const_only = hoistable(n.fn, [best[c].const_only for c in n.children])
        costs[n.eclass] = 0.0 if const_only else own[n]
        total = sum(costs.values())
        old = best.get(n.eclass)
        if old is None or total < old.total - _EPS * max(1.0, old.total) or (math.isinf(old.total) and total < old.total):
            best[n.eclass] = _Best(total, n, costs, const_only)
            queue.extend(parents.get(n.eclass, ()))
    return best


def extract(fz: FrozenEGraph, enc: Encoding, target: Target, exclude=frozenset(),
            memory_budget: int | None = None, keep_cone: bool = False) -> Extraction:
    """Outputs are extracted in order; what one output's program computes is free for the next ones.
    Nodes in `exclude` are never chosen (used to force alternatives). With `keep_cone` (strict numerics),
    what flows into a comparison or a rounding is computed as captured (extract/cone.py). With `memory_budget` (bytes), a
    program whose peak memory (`extract/memory.py`) is above it is re-extracted with the largest
    intermediates recomputed in their consumers instead of stored, cheapest recompute per byte first.
    Under a call's deadline, optional work stops early and the choice raises `TimeLimit` (module doc)."""
    optional = current_search().part(OPTIONAL_SHARE)
    fz = expand(fz, enc.conv_params, target, stop=optional)
    pinned = cone.pins(fz, enc) if keep_cone else None
    if pinned is not None and pinned.chosen:
        exclude = exclude | pinned.forbidden(fz, enc)
    own = {n: c for n, c in node_costs(fz, enc, target).items() if n not in exclude}
    nodes = [n for cls in fz.classes.values() for n in cls]
    parents: dict = {}
    for n in nodes:
        for c in n.children:
            parents.setdefault(c, []).append(n)

    def choose(no_store=frozenset(), no_recompute=frozenset()) -> dict:
        allowed = own
        if no_store or no_recompute:
            allowed = {n: c for n, c in own.items() if no_store.isdisjoint(n.children)
                       and no_recompute.isdisjoint(fz.recomputes.get(n, ()))}
        return _choose(fz, nodes, allowed, parents)

    choice, no_recompute, shared = share_producers(fz, choose,
                                                   lambda ch: program_cost(_build(fz, enc, ch)[0], target)[0],
                                                   stop=optional)

    def remat_choose(no_store=frozenset()) -> dict:   # budget rounds keep the producers computed once
        return choose(no_store | shared, no_recompute)

    memory = ""
    if memory_budget is not None:
        choice, graph, memory = fit_budget(choice, remat_choose, lambda ch: _build(fz, enc, ch), own,
                                           memory_budget)
    else:
        graph = build_graph(fz, enc, choice)
    cost, per_node = program_cost(graph, target)
    hoisted = _hoisted(choice)
    method = Method("greedy", growth_cut=fz.growth_cut, trials_stopped=OPTIONAL_SHARE if optional.expired() else 0,
                    pinned=cone.pinned_count(pinned))
    return Extraction(graph, cost, per_node, method=method,
                      declined=declined_fusions(fz, choice, own, target, hoisted), memory=memory)


def _choose(fz: FrozenEGraph, nodes: list, own: dict, parents: dict) -> dict:
    """E-class -> chosen e-node for everything the outputs reach."""
    fixed: dict = {}
    best, new = None, ()
    for k in sorted(fz.outputs):
        best = _greedy(nodes, own, parents, fixed, best, new)
        root = fz.outputs[k]
        if root not in best:
            raise ExtractionError(f"superopt: no well-typed term found for output {k}")
        # Fix the classes the current choices reach. Not `best[root].costs`: a class keeps its node
        # when a child's better choice does not make it cheaper, and then its cost set still names the
        # child's old descendants, not the new ones.
        stack, newly = [root], []
        while stack:
            cls = stack.pop()
            if cls in fixed:
                continue
            b = best[cls]
            fixed[cls] = _Best(0.0, b.node, {cls: 0.0}, b.const_only)
            newly.append(cls)
            stack.extend(b.node.children)
        new = tuple(newly)
    return {cls: b.node for cls, b in fixed.items()}


MAX_SHARING_TRIALS = 24  # re-extractions that try a producer computed once, most used first
SHARING_NODES = 400_000  # and at most this many e-nodes over all of them: a trial takes about 60 us an e-node
                         # (a training step: 12 trials of 7,000 e-nodes, 5 s), so about 25 s, as 50% of a 60 s call did


def share_producers(fz: FrozenEGraph, choose, cost, stop: Deadline | None = None) -> tuple[dict, frozenset, frozenset]:
    """Greedy choice, plus the producers it should compute once: (choice, no_recompute, no_store).

    Each class's choice is cheapest for that class alone, so every consumer of a matmul may prefer
    to recompute it in its own kernel where loading it would cost a little more, or to read its own
    orientation of it, stored separately: five kernels then run the same matmul five times, a cost no
    single choice sees. A producer here is a matmul or convolution together with the transposes of it
    that the e-graph knows. For each producer used more than once (recomputed in a kernel, or stored),
    extract again with no kernel recomputing it, and with each stored orientation in turn as the only
    one stored, and keep the cheapest if the whole program's cost (`cost(choice)`) is lower.
    `choose(no_store=, no_recompute=)` extracts with no e-node loading a class in `no_store` and no
    kernel recomputing one in `no_recompute`. Trials stop at their budgets (`MAX_SHARING_TRIALS`, and
    `SHARING_NODES` e-nodes over all trials: counts, so the choice does not depend on the machine's
    speed) or, a backstop, at `stop` (a deadline), keeping the best choice found."""
    choice = choose()
    if not fz.recomputes:
        return choice, frozenset(), frozenset()
    transposes: dict = {}   # tensor class -> the classes of its transposes
    for cls, nodes in fz.classes.items():
        for n in nodes:
            if n.fn == "transpose" and n.children:
                transposes.setdefault(n.children[0], set()).add(cls)
                transposes.setdefault(cls, set()).add(n.children[0])

    def producers(ch: dict) -> list[frozenset]:
        uses: dict = {}
        for n in ch.values():
            for c in fz.recomputes.get(n, ()):
                uses[c] = uses.get(c, 0) + 1
        for c, n in ch.items():   # a producer stored in two orientations
            if transposes.get(c, set()) & ch.keys() and _computes_matrix(n):
                uses.setdefault(c, 0)
        groups, seen = [], set()
        for c in sorted(uses, key=lambda c: (-uses[c], str(c))):
            if c in seen:
                continue
            group = frozenset({c} | transposes.get(c, set()))
            seen |= group
            if sum(uses.get(g, 0) + (g in ch) for g in group) >= 2:
                groups.append(group)
        return groups

    size = sum(len(nodes) for nodes in fz.classes.values())
    most = min(MAX_SHARING_TRIALS, max(1, SHARING_NODES // max(size, 1)))
    best, no_recompute, no_store, tried, refused = cost(choice), frozenset(), frozenset(), 0, set()
    while tried < most and not (stop is not None and stop.expired()):
        # after a kept trial, a producer refused before may pay (its consumers changed): try it again
        group = next((g for g in producers(choice) if g not in refused), None)
        if group is None:
            break
        refused.add(group)
        stored = sorted((c for c in group if c in choice), key=str)
        options = [frozenset()]        # what may not be stored, besides the recomputes
        if len(stored) > 1:            # stored in several orientations: each in turn as the only one
            options += [group - {c} for c in stored]
        found = None
        for forbid in options:
            if tried == most or (stop is not None and stop.expired()):
                break
            tried += 1
            try:
                trial = choose(no_store=no_store | forbid, no_recompute=no_recompute | group)
            except ExtractionError:
                continue
            trial_cost = cost(trial)
            if trial_cost < best * (1 - 1e-9):
                best, found = trial_cost, (trial, forbid)
        if found is not None:
            choice, no_recompute, no_store = found[0], no_recompute | group, no_store | found[1]
            refused.clear()
    return choice, no_recompute, no_store


def _computes_matrix(n: ENode) -> bool:
    if n.fn == "kernel":
        return any(b.op in MATRIX_OPS for b in n.args[0])
    return n.fn in CUBE_OPS


def _hoisted(choice: dict) -> set:
    """The chosen classes whose sub-terms are constants computed when the program is built."""
    const: dict = {}
    for c in postorder(list(choice), lambda cls: choice[cls].children):
        const[c] = hoistable(choice[c].fn, [const[k] for k in choice[c].children])
    return {c for c, is_const in const.items() if is_const}


def _build(fz: FrozenEGraph, enc: Encoding, choice: dict) -> tuple[Graph, dict]:
    classes: dict = {}
    return build_graph(fz, enc, choice, classes), classes


def _ops(node: ENode) -> int:
    """How many ops a chosen node computes: a kernel's body ops, or 1."""
    if node.fn == "kernel":
        return sum(1 for n in node.args[0] if n.op not in ("arg", "broadcast", "reshape"))
    return 1


def declined_fusions(fz: FrozenEGraph, choice: dict, own: dict, target: Target, hoisted=frozenset(),
                     k: int = 5) -> list[str]:
    """For chosen kernels that had a larger fusion available, the largest one and why it lost: its
    overflow, or its time against the chosen kernels it would replace (with the penalties that made it
    slower). Classes in `hoisted` are constants computed once; they are not kernels a fusion replaces.
    Largest first, at most `k`."""

    def reach(roots) -> set:
        seen, stack = set(), list(roots)
        while stack:
            cls = stack.pop()
            if cls in seen or cls not in choice:
                continue
            seen.add(cls)
            stack.extend(choice[cls].children)
        return seen

    found = []
    for cls, chosen in choice.items():
        if chosen.fn in _LISTS:
            continue
        # Variants that read only what the chosen program computes anyway and would replace more than
        # the chosen kernel: the largest one, with the chosen kernels it covers.
        larger, below = [], reach([cls]) - hoisted
        for n in fz.classes.get(cls, []):
            if n.fn == "kernel" and n in own and n is not chosen and all(c in choice for c in n.children):
                covered = below - reach(n.children)
                if len(covered) > 1:
                    larger.append((len(covered), _ops(n), -own[n], n, covered))
        if not larger:
            continue
        _, _, _, fused, covered = max(larger, key=lambda t: t[:3])
        ins = [(fz.shapes[c], fz.dtypes[c]) for c in fused.children]
        parts = op_breakdown("kernel", fused.args, ins, (fz.shapes[cls], fz.dtypes[cls]), target)
        replaced = sum(own.get(choice[c], 0.0) for c in covered)
        penalties = "".join(f", {note}" for note in parts.notes())  # none when it overflows
        why = parts.overflow or (f"{_seconds(parts.time)} fused vs {_seconds(replaced)} for the "
                                        f"{len(covered)} kernel(s) chosen{penalties}")
        shape = type_str(Node("kernel", (), (), fz.shapes[cls], fz.dtypes[cls]))
        found.append((_ops(fused), f"kernel{{{body_str(fused.args[0])}}} -> {shape}: {why}"))
    return [text for _, text in sorted(found, key=lambda t: -t[0])[:k]]


def _seconds(t: float) -> str:
    return "inf" if t == float("inf") else f"{t * 1e6:.1f} us"


def build_graph(fz: FrozenEGraph, enc: Encoding, choice: dict, classes: dict | None = None) -> Graph:
    """The chosen sub-DAG as a Graph, built with an explicit stack (any depth). `classes`, when given,
    is filled with the e-class of every node id."""
    src = enc.graph
    graph = Graph(consts=src.consts, opaque=src.opaque, n_args=src.n_args, hidden_outputs=src.hidden_outputs)
    ids: dict = {}

    def tensor_children(n: ENode) -> list:
        kids = []
        for c in n.children:
            if choice[c].fn not in _LISTS:
                kids.append(c)
                continue
            while choice[c].fn == "tcons":
                kids.append(choice[c].children[0])
                c = choice[c].children[1]
        return kids

    try:
        order = postorder([fz.outputs[k] for k in sorted(fz.outputs)], lambda cls: tensor_children(choice[cls]))
    except CycleError as exc:
        raise ExtractionError("superopt: extraction chose a cyclic term") from exc
    for cls in order:
        n = choice[cls]
        op, attrs = decode(n.fn, n.args, n.children, enc)
        ids[cls] = graph.add(Node(op, tuple(ids[c] for c in tensor_children(n)), attrs, fz.shapes[cls], fz.dtypes[cls]))
        if classes is not None:
            classes[ids[cls]] = cls
    graph.outputs = [ids[fz.outputs[k]] for k in sorted(fz.outputs)]
    return graph
