"""Sibling kernels: independent launches of one output shape that read the same tensor, run as one
launch with one output each.

An optimizer step updates each parameter and its moment buffers from the same gradient, and a loss-
scaled step checks the gradients for Inf/NaN and sums their squares: in the term these are separate
kernels, and run apart each reads the gradient again. A backend that can run a group as one launch
(several roots of one merged body) reads each shared operand once. The Pallas backend groups elementwise
siblings (`lowering/pallas/optimizer.py`); the NPU lowering groups vector and cube kernels alike
(`lowering/npu/lower.py`), and the count of passes over gradient memory counts a group as one launch
(`extract/traffic.py`).

A group runs as soon as every member's operands are computed (`run_before`), so it is only formed when
nothing reads a member before then, and no member reads another.

With `chained`, a member may also read another of the same shape (a clipped gradient read by the moment
updates, the moments read by the parameter update) or reduce its rows (the is-finite check and squared
norm of a gradient, by rows): the group is then one kernel that computes the producer on chip for its
readers, and a gradient is read once after it is written. A member that nothing outside the
group reads (`internal`) is never written to global memory. Nothing outside the group may sit between two
members (read one and be read by another): the group would wait on itself. Every group has two outputs
at least: a chain computing one output is a kernel inlining its producers, which the extractor decides
(a backend grouping it would fuse the captured program it is compared with, too).
"""
from __future__ import annotations

from typing import Callable

from superopt.core.ir import Graph, Node


def sibling_groups(graph: Graph, skip: set, member: Callable[[Node], bool],
                   shared: Callable[[Node, Node], bool], chained: bool = False) -> list[list[int]]:
    """Groups (graph node ids, in program order, two or more each) of live nodes accepted by `member`,
    of one output shape, linked by an operand `shared(operand, reader)` accepts that is not in `skip`
    (constants, say), that can run as one launch once their operands are computed. With `chained`, a
    member may read another of its shape (module doc), which also links them; where the plain groups
    of a chained component take in more members than its chained groups (a recurrent cell whose steps
    chain into one component that no group can span), the plain groups are kept."""
    live = graph.live()
    pos = {i: n for n, i in enumerate(live)}
    users = graph.users()
    outputs = set(graph.outputs)
    candidates = [i for i in live if i not in skip and member(graph.nodes[i])]
    plain = _components(graph, candidates, skip, shared, False)
    if not chained:
        groups = [g for members in plain for g in _cut(graph, members, skip, False, live, pos, users, outputs)]
        return sorted(groups, key=lambda g: pos[g[-1]])
    within: dict = {}
    for members in plain:
        within.setdefault(members[0], []).extend(_cut(graph, members, skip, False, live, pos, users, outputs))
    groups = []
    for members in _components(graph, candidates, skip, shared, True):
        linked = _cut(graph, members, skip, True, live, pos, users, outputs)
        apart = [g for i in members for g in within.get(i, ())]
        groups += linked if sum(map(len, linked)) >= sum(map(len, apart)) else apart
    return sorted(groups, key=lambda g: pos[g[-1]])


def _components(graph: Graph, candidates: list, skip: set, shared, chained: bool) -> list[list[int]]:
    """The candidates linked by a shared operand (and, `chained`, by reading one another), each list in
    the candidates' order."""
    parent = {i: i for i in candidates}

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    readers: dict = {}
    for i in candidates:
        node = graph.nodes[i]
        for j in set(node.inputs):
            if j not in skip and shared(graph.nodes[j], node):
                readers.setdefault((j, node.shape), []).append(i)
    for same in readers.values():
        for i in same[1:]:
            parent[find(i)] = find(same[0])
    if chained:
        for i in candidates:
            for j in graph.nodes[i].inputs:
                if j in parent and _follows(graph.nodes[i].shape, graph.nodes[j].shape):
                    parent[find(i)] = find(j)
    components: dict = {}
    for i in candidates:
        components.setdefault(find(i), []).append(i)
    return list(components.values())


def _cut(graph: Graph, members: list, skip: set, chained: bool, live: list, pos: dict, users: dict,
         outputs: set) -> list:
    """One component cut, in program order, into groups that can run as one launch once their operands
    are computed, keeping those with two written outputs at least (a kernel computing a chain for a
    single output is the extractor's choice to make, a kernel that inlines its producers)."""
    groups: list = []

    def close(group: list) -> None:
        written = [i for i in group if i in outputs or not set(users.get(i, ())) <= set(group)]
        if len(written) > 1:
            groups.append(group)

    current: list = []
    for i in sorted(members, key=pos.get):
        trial = current + [i]
        inputs = {j for m in trial for j in graph.nodes[m].inputs} - skip   # constants exist from the start
        operands = inputs - set(trial)
        readers = [pos[u] for m in trial for u in users.get(m, [live[-1]]) if u not in trial]
        if (chained or not inputs & set(trial)) and max((pos[j] for j in operands), default=-1) < min(
                readers, default=len(live)):
            current = trial
        else:
            close(current)
            current = [i]
    close(current)
    return groups


def _follows(reader: tuple, producer: tuple) -> bool:
    """A chained reader runs over its producer's boxes: it has the producer's shape, or its rows reduced
    (the is-finite check or squared norm of a gradient, row by row)."""
    return bool(producer) and (reader == producer or reader == producer[:-1] + (1,))


def run_before(graph: Graph, groups: list[list[int]], skip: set) -> dict[int, list]:
    """{live node id: the groups to run just before it, in order}: each group right after the last of its
    members' operands that are not in `skip` (constants, there from the start), where an operand that is
    a member of another group exists once that group has run. A group some reader of a member would
    then precede (or that waits on a group waiting on it) is not formed: its members run apart. The
    callers run exactly the groups returned."""
    live = graph.live()
    pos = {i: n for n, i in enumerate(live)}
    users = graph.users()
    groups = [list(g) for g in groups]
    while True:
        owner = {i: k for k, g in enumerate(groups) for i in g}
        # at[k]: the group runs after the node at this position (x.5: after the groups it waits on at x)
        at = [-1.0] * len(groups)
        for _ in range(len(groups) + 1):
            new = [max((at[owner[j]] + 0.5 if j in owner else pos[j]
                        for m in g for j in graph.nodes[m].inputs if j not in skip and j not in g), default=-1.0)
                   for g in groups]
            moving = {k for k in range(len(groups)) if new[k] != at[k]}   # still moving: it waits on itself
            at = new
            if not moving:
                break

        def runs(i: int) -> float:            # when node i runs
            return at[owner[i]] if i in owner else pos[i]
        bad = moving | {k for k, g in enumerate(groups) if at[k] >= len(live) - 1
                        or any(runs(u) <= at[k] for m in g for u in users.get(m, ()) if u not in g)}
        if not bad:
            break
        groups = [g for k, g in enumerate(groups) if k not in bad]
    before: dict = {}
    for k in sorted(range(len(groups)), key=lambda k: at[k]):
        before.setdefault(live[int(at[k]) + 1], []).append(groups[k])
    return before


def internal(graph: Graph, group: list[int]) -> list[int]:
    """The members of a chained group (module doc) that only other members read: computed on chip for
    their readers and never written."""
    users = graph.users()
    outputs = set(graph.outputs)
    return [i for i in group if i not in outputs and users.get(i) and set(users[i]) <= set(group)]


def merged_body(graph: Graph, group: list[int], body_of, share: bool = False) -> tuple[tuple, tuple, list[int]]:
    """(one body computing every member, its roots, the graph nodes it loads): `arg` k of the merged body
    is the k-th loaded node; `body_of(i)` is member i's own body. A member that reads an earlier member
    (a chained group) takes that member's value, computed in the body. With `share`, a value two members
    compute alike (a recomputed gradient's matmul, a common unscale) is computed once."""
    loads: list[int] = []
    nodes: list[Node] = []
    known: dict = {}
    roots = []
    for i in group:
        inputs = graph.nodes[i].inputs
        index: list[int] = []
        for n in body_of(i):
            if n.op == "arg" and inputs[n.attrs[0]] in group[:len(roots)]:
                index.append(roots[group.index(inputs[n.attrs[0]])])
                continue
            if n.op == "arg":
                j = inputs[n.attrs[0]]
                if j not in loads:
                    loads.append(j)
                new = Node("arg", (), (loads.index(j),), n.shape, n.dtype)
            else:
                new = Node(n.op, tuple(index[k] for k in n.inputs), n.attrs, n.shape, n.dtype)
            if share and new in known:
                index.append(known[new])
                continue
            known.setdefault(new, len(nodes))
            index.append(len(nodes))
            nodes.append(new)
        roots.append(index[-1])
    return tuple(nodes), tuple(roots), loads
