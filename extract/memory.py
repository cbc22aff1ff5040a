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
from dataclasses import dataclass, field, replace

from superopt.core.ir import Graph
from superopt.core.ops import flagged
from superopt.extract.errors import ExtractionError

_VIEWS = flagged("view")
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
        return size_str(self.bytes)


def size_str(nbytes: float) -> str:
    """Bytes for a reader: "30.41 MB", "12.3 KB", "512 B" (decimal units, as `parse_bytes` reads them)."""
    for unit, scale, digits in (("GB", 1e9, 2), ("MB", 1e6, 2), ("KB", 1e3, 1)):
        if nbytes >= scale:
            return f"{nbytes / scale:.{digits}f} {unit}"
    return f"{int(nbytes)} B"


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
    # Views share their input's buffer; a buffer lives until the last user of any of its views.
    resident, owner, size = _buffers(graph, order)
    outputs = set(graph.outputs)
    last_use: dict[int, int] = {}
    for pos, i in enumerate(order):
        for j in graph.nodes[i].inputs:
            last_use[owner[j]] = pos
    kept = resident | {owner[i] for i in outputs}
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


def _buffers(graph: Graph, order: list[int]) -> tuple[set, dict, dict]:
    """(resident ids, id -> id of the buffer it lives in, buffer -> bytes), as `peak_memory` sees them."""
    resident = graph.constant_nodes() | {i for i in order if graph.nodes[i].op == "arg"}
    owner: dict[int, int] = {}
    for i in order:
        node = graph.nodes[i]
        owner[i] = owner[node.inputs[0]] if node.op in _VIEWS and node.inputs else i
    return resident, owner, {i: graph.nodes[i].nbytes for i in order}


@dataclass(frozen=True)
class _Scheduling:
    """What the schedulers need of a program, counted as `peak_memory` counts it."""
    order: list[int]                  # the live nodes in program order
    position: dict[int, int]          # node -> its index in `order`
    resident: set[int]                # arguments and constants: live for the whole call
    size: dict[int, int]              # node -> bytes of its result
    kept: set[int]                    # buffers never freed: resident ones and outputs'
    counted: set[int]                 # nodes that allocate a buffer (not resident, not a view)
    reads: dict[int, set[int]]        # node -> the buffers it reads
    readers: dict[int, set[int]]      # buffer -> the nodes that read it
    deps: dict[int, set[int]]         # node -> its inputs
    users: dict[int, set[int]]        # node -> the nodes that take it as an input

    @classmethod
    def of(cls, graph: Graph) -> "_Scheduling":
        order = graph.live()
        resident, owner, size = _buffers(graph, order)
        deps = {i: set(graph.nodes[i].inputs) for i in order}
        reads = {i: {owner[j] for j in deps[i]} for i in order}
        readers: dict[int, set[int]] = {}
        users: dict[int, set[int]] = {}
        for i in order:
            for b in reads[i]:
                readers.setdefault(b, set()).add(i)
            for j in deps[i]:
                users.setdefault(j, set()).add(i)
        return cls(order, {i: p for p, i in enumerate(order)}, resident, size,
                   resident | {owner[i] for i in graph.outputs},
                   {i for i in order if i not in resident and owner[i] == i}, reads, readers, deps, users)


def memory_order(graph: Graph) -> list[int]:
    """A topological order of the live nodes that frees intermediates sooner (list scheduling).

    Each step runs, of the nodes whose inputs have run, the one that adds the fewest bytes: its result
    less the buffers it reads for the last time; ties go to the earlier node. Resident nodes and views
    allocate nothing. Greedy, so not always the lowest peak: `reorder_for_memory` keeps the lowest of
    this order, `beam_order`'s and the program's own."""
    sc = _Scheduling.of(graph)
    size, kept, reads = sc.size, sc.kept, sc.reads
    pending = {b: len(r) for b, r in sc.readers.items()}
    waiting = {i: len(sc.deps[i]) for i in sc.order}
    ready = {i for i in sc.order if not waiting[i]}

    def growth(i: int) -> int:
        alloc = size[i] if i in sc.counted else 0
        return alloc - sum(size[b] for b in reads[i] if b not in kept and pending[b] == 1)

    scheduled: list[int] = []
    while ready:
        i = min(ready, key=lambda k: (growth(k), sc.position[k]))
        ready.discard(i)
        scheduled.append(i)
        for b in reads[i]:
            pending[b] -= 1
        for u in sc.users.get(i, ()):
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.add(u)
    assert len(scheduled) == len(sc.order), "memory_order: the live nodes are not a DAG"
    return scheduled


def beam_order(graph: Graph, width: int = 8) -> list[int]:
    """A topological order of the live nodes found by beam search on the peak.

    `memory_order` commits to the step that adds the fewest bytes now, so of two producers of one size
    it may run the one whose readers still wait on others first, and hold both results at once. This
    keeps the `width` partial orders with the lowest peak so far (then the fewest bytes live, then the
    program's own order), extending each by every node whose inputs have run, so a step that costs a
    little now and frees a large tensor soon survives. Bytes are counted as `peak_memory` counts them."""
    sc = _Scheduling.of(graph)
    size, kept, reads, counted = sc.size, sc.kept, sc.reads, sc.counted

    def step(peak: int, current: int, done: frozenset, i: int) -> tuple[int, int]:
        """(peak, bytes live after) once node i runs next."""
        if i not in counted:
            return peak, current
        current += size[i]
        peak = max(peak, current)
        for b in reads[i] | {i}:
            if b in counted and b not in kept and all(r in done or r == i for r in sc.readers.get(b, ())):
                current -= size[b]
        return peak, current

    start = sum(size[i] for i in sc.resident)
    beam = [(start, start, (), frozenset(), frozenset(i for i in sc.order if not sc.deps[i]))]
    for _ in sc.order:
        children = []
        for k, (peak, current, _, done, ready) in enumerate(beam):
            for i in ready:
                children.append((*step(peak, current, done, i), sc.position[i], k, i))
        children.sort()
        beam_next, seen = [], set()
        for peak, current, _, k, i in children:
            done = beam[k][3] | {i}
            if done in seen:
                continue
            seen.add(done)
            ready = (beam[k][4] - {i}) | {u for u in sc.users.get(i, ()) if sc.deps[u] <= done}
            beam_next.append((peak, current, beam[k][2] + (i,), done, ready))
            if len(beam_next) == width:
                break
        beam = beam_next
    assert beam and len(beam[0][2]) == len(sc.order), "beam_order: the live nodes are not a DAG"
    return list(beam[0][2])


def renumber(graph: Graph, order: list[int]) -> tuple[Graph, dict[int, int]]:
    """The live nodes of `graph` in `order` (a topological order), and old id -> new id."""
    new = Graph(consts=graph.consts, opaque=graph.opaque, n_args=graph.n_args, hidden_outputs=graph.hidden_outputs)
    ids: dict[int, int] = {}
    for i in order:
        node = graph.nodes[i]
        ids[i] = new.add(replace(node, inputs=tuple(ids[j] for j in node.inputs)))
    new.outputs = [ids[i] for i in graph.outputs]
    return new, ids


def reorder_for_memory(graph: Graph) -> tuple[Graph, dict[int, int]]:
    """`graph` renumbered in whichever of its own order, `memory_order` and `beam_order` gives the
    lowest peak, its own on a tie (same nodes, same results: only when each intermediate is computed,
    and so freed, changes)."""
    own = graph.live()
    candidates = [renumber(graph, own)]
    candidates += [renumber(graph, order) for order in (memory_order(graph), beam_order(graph)) if order != own]
    return min(candidates, key=lambda c: peak_memory(c[0]).bytes)    # min keeps the first of equals


def fit_budget(choice: dict, choose, build, own: dict, budget: int,
               max_rounds: int = 16) -> tuple[dict, Graph, str]:
    """Rematerialization: re-extract until the program's peak memory is within `budget` bytes.

    `choice` is the unconstrained extraction (e-class -> e-node); `choose(no_store)` extracts again with
    no chosen e-node reading a class in `no_store` (so its consumers recompute it inside their kernels,
    or it is not computed at all), raising ExtractionError when some output cannot do without one;
    `build(choice)` gives (Graph, node id -> e-class); `own` is the cost of each e-node.

    First the program runs in the order that frees intermediates soonest (`reorder_for_memory`), which
    costs no compute. While the peak is still over the budget, each round forbids storing one more
    intermediate live at the peak, the one whose producer costs least per byte it frees; a round is
    kept only if it lowers the bytes over budget summed over the program's steps (`Peak.excess`), so
    it always makes progress. Returns the choice that reached the lowest peak with the fewest
    intermediates recomputed, its program (reordered where that lowers the peak) and a sentence saying
    what was done."""

    def built(ch: dict) -> tuple[Graph, dict, Peak, bool]:
        plain, plain_classes = build(ch)
        graph, ids = reorder_for_memory(plain)
        peak = peak_memory(graph)
        return graph, {ids[i]: c for i, c in plain_classes.items() if i in ids}, peak, \
            peak.bytes < peak_memory(plain).bytes

    plain = build(choice)[0]
    first = peak_memory(plain)
    mb = size_str(budget)
    if first.bytes <= budget:
        return choice, plain, f"peak {first} within the budget of {mb}; nothing recomputed"
    if budget < first.floor:
        return choice, plain, (f"budget of {mb} is below the {size_str(first.floor)} that arguments and "
                               f"outputs need; peak {first}, nothing recomputed")
    graph, classes, peak, reordered = built(choice)
    no_store, refused, rounds = frozenset(), set(), 0
    best = (choice, graph, peak, reordered, no_store)     # lowest peak, fewest recomputed
    while peak.bytes > budget and rounds < max_rounds:
        # An opaque node's result is never recomputed: no consumer can compute it in its own kernel, and a
        # pinned effect (a debug print) must run exactly once.
        candidates = [classes[i] for i in peak.live if classes[i] not in refused and graph.nodes[i].op != "opaque"]
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
        trial_graph, trial_classes, trial_peak, trial_reordered = built(trial)
        if trial_peak.excess(budget) >= peak.excess(budget):
            refused.add(cls)
            continue
        no_store, choice, graph, classes, peak = no_store | {cls}, trial, trial_graph, trial_classes, trial_peak
        if peak.bytes < best[2].bytes:
            best = (choice, graph, peak, trial_reordered, no_store)
    # Recomputing costs compute: a round that spread the excess without lowering the peak is undone.
    choice, graph, peak, reordered, no_store = best
    done = f"recomputed {len(no_store)} intermediate(s) in their consumers" if no_store else "nothing recomputed"
    if reordered:
        done = f"reordered the program so intermediates are freed sooner{' and ' if no_store else '; '}{done}"
    if peak.bytes <= budget:
        return choice, graph, f"peak {first} -> {peak}, within the budget of {mb}: {done}"
    why = "the round limit was reached" if rounds >= max_rounds else \
        "no other intermediate live at the peak can be recomputed so that the peak falls"
    return choice, graph, f"budget of {mb} NOT met: peak {first} -> {peak} ({done}; {why})"
