"""Segments: a large program cut where little crosses, each distinct piece optimized once.

Saturation and extraction grow faster than linearly with a program, and a model repeats itself: twelve
encoder layers are one layer twelve times. So before saturating, `split` cuts a large captured program into
contiguous segments, `optimize` (superopt/pipeline.py) optimizes each distinct segment once, and `stitch`
puts the chosen segments back together as one program, which is lowered and jitted whole.

Where to cut. In program order, the width of a cut is the number of computed values defined before it and
read after it. Between two layers of a residual network only the residual stream (and whatever every layer
reads, such as a mask computed once) crosses, so the layer boundaries are the cuts of least width. `split`
tries the cuts of width up to `WIDTH_SLACK` above the least, merges pieces smaller than `MIN_SEGMENT`
computed nodes into their successor, and keeps the cutting that leaves the fewest distinct computed nodes to
optimize. A program is split only where that pays: some segment repeats, or the program is larger than
`LARGE`; otherwise it is one segment, optimized whole as before.

Canonical form. A segment's inputs (program arguments, constants, slices of them, and values computed
before it) become its arguments, numbered in order of first use; literals and iotas are copied in, so their values are part of
what it computes. Two segments that compute the same thing from different weights therefore have the same
canonical graph and the same `key`, a content hash of that graph's data (superopt/core/serial.py), which
is also their key in the persistent cache. Weights closed over by the program are inputs like any other.

Seams. A rewrite that spans a cut (a fusion across a layer boundary, a product chain whose middle value is
all that crosses) is not searched within the segments. So once they are stitched, `seam_windows` cuts the
stitched program again: around each cut a window of about `SEAM_NODES` ops on either side, and
between windows the rest of each segment as it was chosen. The windows are optimized as segments are (each
distinct one once; a layered model's seams are one window), and stitched in where one was changed;
docs/design.md ("Segments") says what that costs.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

from superopt.core.ir import Graph, Node, hoistable
from superopt.core.ops import CONST_LEAVES, flagged
from superopt.core.serial import NotSerializable, digest, dumps, to_data

MIN_SEGMENT = 24     # computed nodes a segment has at least; smaller pieces join the next one
LARGE = 400          # computed nodes beyond which a program is split even where nothing repeats
WIDTH_SLACK = 3      # cut widths tried above the least one
MIN_PERIOD = 8       # the shortest period looked for: a layer of a few ops is a segment of its own
MAX_PERIOD = 4096    # the longest period looked for (a layer of this many ops; the search is linear in it)
PERIODS_TRIED = 64   # segment lengths compared, shortest first
SEGMENT_COST = 16    # a segment's fixed cost to optimize, in nodes (splitting, `_score`)
REPEATS = 0.5        # a program repeats itself at a period where this share of its nodes equal the period's next
SEAM_NODES = 12     # ops a seam window takes on either side of a cut (a kernel's body counts; at most a third)

_LEAVES = flagged("leaf")
_COPIED = CONST_LEAVES - {"const"}    # leaves whose value is in their attributes: copied into a segment


@dataclass
class Segment:
    nodes: list[int]     # the program's computed node ids, in order
    inputs: list[int]    # the program's node ids the segment reads, in order of first use (its arguments)
    outputs: list[int]   # the program's node ids of the segment read after it or returned by the program
    graph: Graph         # canonical: `inputs` as arguments 0..n-1, the nodes, `outputs` as its outputs
    key: str             # content hash of `graph`


def split(graph: Graph) -> list[Segment] | None:
    """The segments of `graph` (module doc), or None where splitting does not pay: the program is then
    optimized whole. Raises NotSerializable for a program with opaque primitives (never split or cached)."""
    if graph.opaque:
        raise NotSerializable("a program with opaque primitives is not split")
    copied = _copied_values(graph)
    computed = _computed(graph, copied)
    if len(computed) < 2 * MIN_SEGMENT:
        return None
    last = _last_readers(graph)
    widths = _cut_widths(graph, computed, last)
    best, best_score = None, _score([computed])
    for cuts, smallest in _cuttings(graph, computed, widths, copied):
        pieces = _pieces(computed, cuts, smallest)
        if len(pieces) < 2:
            continue
        segments = [_segment(graph, p, last, copied) for p in pieces]
        score = _score([s.nodes for s in {s.key: s for s in segments}.values()])
        if score < best_score:
            best, best_score = segments, score
    if best is None:
        return None
    repeats = len({s.key for s in best}) < len(best)
    return best if repeats or len(computed) > LARGE else None


def _score(distinct_pieces) -> int:
    """What optimizing these distinct pieces costs, in nodes: their nodes, plus each piece's fixed cost
    (a saturation's child process, a verification's compilations) as SEGMENT_COST nodes."""
    return sum(len(p) + SEGMENT_COST for p in distinct_pieces)


def _cuttings(graph: Graph, computed: list[int], widths: list[int], copied: dict[int, int]):
    """Candidate cuttings, as (cut positions into `computed`, the fewest nodes a piece has): one cut every
    `length` nodes where the program repeats itself with a period that divides it (`_period`), at the
    narrowest position of the period (a prologue or an epilogue stays a piece of its own, however small);
    and every cut of each width up to WIDTH_SLACK above the least, small pieces joined."""
    length = _period(graph, computed, copied)
    if length:
        total = [0] * length
        for c in range(1, len(computed)):
            total[c % length] += widths[c]
        phase = min(range(length), key=lambda r: (total[r] / len(range(r or length, len(computed), length)), r))
        yield list(range(phase or length, len(computed), length)), 1
    least = min(widths[1:])
    for width in range(least, least + WIDTH_SLACK + 1):
        yield [c for c in range(1, len(computed)) if widths[c] <= width], MIN_SEGMENT


def _period(graph: Graph, computed: list[int], copied: dict[int, int]) -> int | None:
    """The segment length at which the program repeats itself best, or None where it does not repeat.

    A node's signature is its op, attributes, type and inputs (a computed input by its distance back); a
    period p repeats where the signatures equal those p nodes later for at least REPEATS of the nodes that
    have a node p later (two layers are a period of half the program). Of
    the periods within a tenth of the best match, each taken as many times as it takes to reach
    MIN_SEGMENT nodes, the length whose windows cost least to optimize (`_score` of the distinct
    windows, told apart by their signatures) wins: a chain whose ops repeat every 9 nodes but whose matmul
    comes every 300 is cut every 300, not into many short distinct pieces."""
    pos = {i: k for k, i in enumerate(computed)}

    def signature(k: int, i: int) -> int:
        node = graph.nodes[i]
        ins = tuple(("c", k - pos[j]) if j in pos else ("k", copied[j]) if j in copied else
                    (graph.nodes[j].op, graph.nodes[j].shape, graph.nodes[j].dtype) for j in node.inputs)
        return hash((node.op, _attrs(node), node.shape, node.dtype, ins))
    sig = np.array([signature(k, i) for k, i in enumerate(computed)], dtype=np.int64)
    n = len(sig)
    match = {p: int(np.count_nonzero(sig[:-p] == sig[p:])) / (n - p)
             for p in range(MIN_PERIOD, min(n // 2, MAX_PERIOD) + 1)}
    if not match or max(match.values()) < REPEATS:
        return None
    best = max(match.values())
    lengths = sorted({p * -(-MIN_SEGMENT // p) for p, m in match.items() if m >= 0.9 * best})[:PERIODS_TRIED]

    def cost(length: int) -> int:
        windows = {sig[a:a + length].tobytes(): min(length, n - a) for a in range(0, n, length)}
        return _score([range(w) for w in windows.values()])
    return min(lengths, key=lambda length: (cost(length), length))


def _computed(graph: Graph, copied: dict[int, int]) -> list[int]:
    """The live nodes the segments are made of, in program order: neither leaves, nor the prologue, nor values
    computed from literals and iotas alone (`copied`: `_copied_values`)."""
    prologue = _prologue(graph)
    return [i for i in graph.live() if graph.nodes[i].op not in _LEAVES and i not in prologue and i not in copied]


def _copied_values(graph: Graph) -> dict[int, int]:
    """The live nodes whose value is in the program's text: literals and iotas, and what is computed from
    them alone (a causal mask built with `jnp.tril(jnp.ones(...))`), each with a hash of what it computes. A
    segment that reads one computes it itself, as it copies a literal: its value is part of what the segment
    computes, and a mask computed once and read by every layer would otherwise be an input each layer reads
    from further back (12 identical decoder blocks were cut into 5 distinct half layers, where 2 were 1)."""
    out: dict[int, int] = {}
    for i in graph.live():
        node = graph.nodes[i]
        if node.op in _COPIED or (node.op not in _LEAVES and hoistable(node.op, [j in out for j in node.inputs])):
            out[i] = hash((node.op, _attrs(node), node.shape, node.dtype, tuple(out[j] for j in node.inputs)))
    return out


def _attrs(node: Node) -> str:
    """A node's attributes as text, for hashing: a NaN literal's float hashes by its identity (Python 3.10 on),
    so two layers' `jnp.var` (which compares its count with a NaN fallback) hashed apart."""
    return repr(node.attrs)


def _prologue(graph: Graph) -> set[int]:
    """The live nodes that select a part of an argument or a constant (a slice of one, and reshapes of
    such a slice), computed before the segments and passed to them: a loop unrolled in Python reads
    `xs[t]` at every step, and its steps differ in nothing else, so each step is then the same segment."""
    out: set[int] = set()
    for i in graph.live():
        node = graph.nodes[i]
        if node.op == "slice" and all(graph.nodes[j].op in _LEAVES for j in node.inputs) or \
                node.op == "reshape" and all(j in out for j in node.inputs):
            out.add(i)
    return out


def _last_readers(graph: Graph) -> dict[int, int]:
    """For each node read by a live node or returned, the last reader's id (len(nodes) for a returned one)."""
    last: dict[int, int] = {}
    for i in graph.live():
        for j in graph.nodes[i].inputs:
            last[j] = i
    for o in graph.outputs:
        last[o] = len(graph.nodes)
    return last


def _cut_widths(graph: Graph, computed: list[int], last: dict[int, int]) -> list[int]:
    """widths[c]: computed values defined before computed[c] and read at or after it (widths[0] unused)."""
    pos = {i: k for k, i in enumerate(computed)}
    delta = [0] * (len(computed) + 2)
    for j, reader in last.items():   # value j crosses every cut c with pos[j] < c <= pos of its last reader
        if j in pos:
            end = pos.get(reader, len(computed))
            delta[pos[j] + 1] += 1
            delta[end + 1] -= 1
    widths, running = [], 0
    for c in range(len(computed)):
        running += delta[c]
        widths.append(running)
    return widths


def _pieces(computed: list[int], cuts: list[int], smallest: int) -> list[list[int]]:
    """`computed` cut at `cuts`, pieces under `smallest` nodes joined to the next (the last to the previous)."""
    pieces, start = [], 0
    for c in cuts + [len(computed)]:
        if c - start >= smallest or c == len(computed):
            pieces.append(computed[start:c])
            start = c
    if len(pieces) > 1 and len(pieces[-1]) < smallest:
        pieces[-2:] = [pieces[-2] + pieces[-1]]
    return [p for p in pieces if p]


def _segment(graph: Graph, nodes: list[int], last: dict[int, int], copied: dict[int, int]) -> Segment:
    inside = set(nodes)
    inputs = list(dict.fromkeys(j for i in nodes for j in graph.nodes[i].inputs
                                if j not in inside and j not in copied))
    outputs = [i for i in nodes if last.get(i, -1) > nodes[-1]]
    canonical = Graph(n_args=len(inputs))
    ids = {j: canonical.add(Node("arg", (), (k,), graph.nodes[j].shape, graph.nodes[j].dtype))
           for k, j in enumerate(inputs)}

    def copy(j: int) -> int:   # a literal, an iota or a value of them alone, with what it reads
        if j not in ids:
            node = graph.nodes[j]
            ids[j] = canonical.add(Node(node.op, tuple(copy(k) for k in node.inputs), node.attrs, node.shape,
                                        node.dtype))
        return ids[j]
    for i in nodes:
        node = graph.nodes[i]
        ids[i] = canonical.add(Node(node.op, tuple(copy(j) for j in node.inputs), node.attrs, node.shape, node.dtype))
    canonical.outputs = [ids[o] for o in outputs]
    return Segment(nodes, inputs, outputs, canonical, digest(dumps(to_data(canonical))))


def stitch(graph: Graph, segments: list[Segment], chosen: dict[str, Graph], starts: list | None = None) -> Graph:
    """`graph` with each segment replaced by `chosen[segment.key]`, a program of the segment's canonical
    arguments and outputs (the segment's own canonical graph where it was not changed). Where `starts` is
    a list, the id in the stitched program of each segment's first node is appended to it."""
    out = Graph(consts=list(graph.consts), n_args=graph.n_args, hidden_outputs=graph.hidden_outputs)
    ids: dict[int, int] = {}
    prologue, copied = _prologue(graph), _copied_values(graph)
    for i in graph.live():   # leaves, the parts of arguments the segments read, and values of literals alone (a
        node = graph.nodes[i]   # program may return one), as the program has them
        if node.op in _LEAVES or i in prologue or i in copied:
            ids[i] = out.add(Node(node.op, tuple(ids[j] for j in node.inputs), node.attrs, node.shape, node.dtype))
    for seg in segments:
        if starts is not None:
            starts.append(len(out.nodes))
        program = chosen[seg.key]
        local: dict[int, int] = {}
        for k, node in enumerate(program.nodes):
            if node.op == "arg":
                local[k] = ids[seg.inputs[node.attrs[0]]]
                continue
            attrs = node.attrs
            if node.op == "const":   # a constant of the chosen segment's own joins the program's
                out.consts.append(program.consts[node.attrs[0]])
                attrs = (len(out.consts) - 1,)
            local[k] = out.add(Node(node.op, tuple(local[j] for j in node.inputs), attrs, node.shape, node.dtype))
        for o, p in zip(seg.outputs, program.outputs):
            ids[o] = local[p]
    out.outputs = [ids[o] for o in graph.outputs]
    return out


@dataclass
class Seams:
    """The stitched program cut again around its seams (`seam_windows`)."""
    graph: Graph              # the stitched program
    pieces: list[Segment]     # its computed nodes in order: the segments' middles and the windows between them
    windows: dict             # the distinct windows, by key


def seam_windows(stitched: Graph, starts: list[int]) -> Seams | None:
    """`stitched` (the segments' chosen programs put together, `starts` their first node ids, from
    `stitch`) cut into pieces that cover its computed nodes in order: a window around each seam, the nodes
    that make `SEAM_NODES` ops from the end of the segment before it and as many from the start of the
    one after it, counting the ops of a kernel's body (at least one node, at most a third of either
    segment's nodes, so the middles are kept), and the middles between windows.
    None where no seam has a window (a segment too short to lend one nodes)."""
    copied = _copied_values(stitched)
    computed = _computed(stitched, copied)   # ids in increasing order
    bounds = [bisect_left(computed, start) for start in starts]
    spans = [(a, b) for a, b in zip(bounds, bounds[1:] + [len(computed)]) if b > a]

    def ops(k: int) -> int:   # the ops node k stands for: a kernel, those of its body
        node = stitched.nodes[computed[k]]
        return sum(n.op != "arg" for n in node.attrs[0]) if node.op == "kernel" else 1

    def reach(positions) -> int:   # how many of `positions` (from the cut outwards) make SEAM_NODES ops
        taken = total = 0
        for k in positions:
            if total >= SEAM_NODES:
                break
            taken, total = taken + 1, total + ops(k)
        return taken

    cuts = []   # (window start, window end) positions into `computed`
    for (a0, b0), (a1, b1) in zip(spans, spans[1:]):
        left = min(reach(range(b0 - 1, a0 - 1, -1)), (b0 - a0) // 3)
        right = min(reach(range(a1, b1)), (b1 - a1) // 3)
        if left and right:
            cuts.append((b0 - left, a1 + right))
    if not cuts:
        return None
    last = _last_readers(stitched)
    pieces, windows, at = [], {}, 0
    for start, end in cuts:
        if start > at:
            pieces.append(_segment(stitched, computed[at:start], last, copied))
        window = _segment(stitched, computed[start:end], last, copied)
        pieces.append(window)
        windows.setdefault(window.key, window)
        at = end
    if at < len(computed):
        pieces.append(_segment(stitched, computed[at:], last, copied))
    return Seams(stitched, pieces, windows)


