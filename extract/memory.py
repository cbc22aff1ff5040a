"""Peak memory of a program, and extraction within a memory budget (rematerialization).

The model: the program runs its nodes one after another in the order of the Graph (the order the
lowering emits them). Arguments and the constants computed when the program is built are resident for
the whole call. Every other node allocates its result when it runs and frees it after its last user
has run; outputs are never freed. While a node runs, its inputs and its result are live together. A
reshape is a view of its input: it allocates nothing and keeps its input alive as long as it is used.
What a kernel keeps on chip (registers, shared memory, the unified buffer) is not counted: only
tensors in main or global memory are.

`floor` is what every program for the same function must hold at its end (arguments and outputs), so
no budget below it can be met.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from superopt.egraph.ir import Graph

_VIEWS = frozenset({"reshape"})
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


@dataclass(frozen=True)
class Peak:
    bytes: int           # the most bytes live at once
    at: int              # the node running when the peak is reached (-1 if only resident bytes)
    floor: int           # bytes of arguments, hoisted constants and outputs
    live: tuple = ()     # intermediates (neither resident nor outputs) live at the peak, largest first
    profile: tuple = field(default=(), repr=False)  # bytes live while each computed node runs, in order

    def excess(self, budget: int) -> int:
        """Bytes above `budget`, summed over the program's steps: 0 when the budget is met, and
        smaller whenever any step over it holds less."""
        return sum(max(0, b - budget) for b in self.profile)

    def __str__(self) -> str:
        return f"{self.bytes / 1e6:.2f} MB"


def parse_bytes(budget) -> int:
    """A memory budget as bytes: an int, or a string such as "48MB", "1.5 GiB", "4096"."""
    if isinstance(budget, bool):
        raise TypeError("superopt: memory_budget must be a number of bytes or a string like '64MB'")
    if isinstance(budget, (int, float)):
        value = budget
    elif isinstance(budget, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", budget)
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"superopt: cannot read memory_budget {budget!r}; write bytes or a size such as "
                             f"'64MB' or '1.5GiB' (units: {', '.join(u for u in _UNITS if u)})")
        value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    else:
        raise TypeError(f"superopt: memory_budget must be a number of bytes or a string like '64MB', "
                        f"got {type(budget).__name__}")
    if value <= 0:
        raise ValueError(f"superopt: memory_budget must be positive, got {budget!r}")
    return int(value)


def peak_memory(graph: Graph) -> Peak:
    """The peak of live bytes over the program order (see the module docstring)."""
    order = graph.live()
    resident = graph.constant_nodes() | {i for i in order if graph.nodes[i].op == "arg"}
    outputs = set(graph.outputs)

    # Views share their input's buffer; a buffer lives until the last user of any of its views.
    owner: dict[int, int] = {}
    for i in order:
        node = graph.nodes[i]
        owner[i] = owner[node.inputs[0]] if node.op in _VIEWS and node.inputs else i
    last_use: dict[int, int] = {}
    for pos, i in enumerate(order):
        for j in graph.nodes[i].inputs:
            last_use[owner[j]] = pos
    kept = resident | {owner[i] for i in outputs}

    size = {i: graph.nodes[i].nbytes for i in order}
    floor = sum(size[i] for i in kept if i == owner[i])
    current = sum(size[i] for i in resident)
    peak, at, live_at_peak = current, -1, ()
    alive: set[int] = set()
    profile = []
    for pos, i in enumerate(order):
        if i in resident or owner[i] != i:
            continue
        current += size[i]
        alive.add(i)
        profile.append(current)
        if current > peak:
            peak, at = current, i
            live_at_peak = tuple(sorted((j for j in alive if j not in kept), key=lambda j: (-size[j], j)))
        for j in {owner[k] for k in graph.nodes[i].inputs} | {i}:
            if j in alive and j not in kept and last_use.get(j, -1) <= pos:
                alive.discard(j)
                current -= size[j]
    return Peak(peak, at, floor, live_at_peak, tuple(profile))


def fit_budget(choice: dict, choose, build, own: dict, budget: int, max_rounds: int = 16) -> tuple[dict, str]:
    """Rematerialization: re-extract until the program's peak memory is within `budget` bytes.

    `choice` is the unconstrained extraction (e-class -> e-node); `choose(no_store)` extracts again with
    no chosen e-node reading a class in `no_store` (so its consumers recompute it inside their kernels,
    or it is not computed at all), raising ExtractionError when some output cannot do without one;
    `build(choice)` gives (Graph, node id -> e-class); `own` is the cost of each e-node. Each round
    forbids storing one more intermediate live at the peak, the one whose producer costs least per
    byte it frees; a round is kept only if it lowers the bytes over budget summed over the program's
    steps (`Peak.excess`), so it always makes progress. Returns the last choice kept (the
    lowest peak reached) and a sentence saying what was done."""
    from superopt.extract.greedy import ExtractionError
    graph, classes = build(choice)
    first = peak = peak_memory(graph)
    if peak.bytes <= budget:
        return choice, f"peak {peak} within the budget of {budget / 1e6:.2f} MB; nothing recomputed"
    if budget < peak.floor:
        return choice, (f"budget of {budget / 1e6:.2f} MB is below the {peak.floor / 1e6:.2f} MB that arguments and "
                        f"outputs need; peak {peak}, nothing recomputed")
    no_store, refused, rounds = frozenset(), set(), 0
    while peak.bytes > budget and rounds < max_rounds:
        candidates = [classes[i] for i in peak.live if classes[i] not in refused]
        if not candidates:
            break
        nbytes = {classes[i]: graph.nodes[i].nbytes for i in peak.live}
        cls = min(candidates, key=lambda c: (own.get(choice[c], float("inf")) / max(nbytes[c], 1), -nbytes[c]))
        rounds += 1
        try:
            trial = choose(no_store | {cls})
        except ExtractionError:
            refused.add(cls)
            continue
        trial_graph, trial_classes = build(trial)
        trial_peak = peak_memory(trial_graph)
        if trial_peak.excess(budget) >= peak.excess(budget):
            refused.add(cls)
            continue
        no_store, choice, graph, classes, peak = no_store | {cls}, trial, trial_graph, trial_classes, trial_peak
    done = f"recomputed {len(no_store)} intermediate(s) in their consumers"
    if peak.bytes <= budget:
        return choice, f"peak {first} -> {peak}, within the budget of {budget / 1e6:.2f} MB: {done}"
    why = "the round limit was reached" if rounds >= max_rounds else \
        "no other intermediate live at the peak can be recomputed"
    return choice, f"budget of {budget / 1e6:.2f} MB NOT met: peak {first} -> {peak} ({done}; {why})"
