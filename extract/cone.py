"""The cone of a discontinuity: under strict numerics, what a step reads is computed as captured.

A step (an op flagged `step` in core/ops.py: a comparison, floor, ceil, round, sign, float `rem`, a float->int
or float->bool convert, argmax, argmin, an opaque primitive such as a sort, but not an effect: a print shows
a value as an output does) turns a rounding-level change of
an operand into a change by a whole step: a bin edge computed 1.4e-17 instead of 0.0 puts a value lying on it
into the neighbouring bin. Random inputs almost never lie on such a boundary, so verification cannot be
trusted to see it. The cone is every captured node from which a value flows, through any path, into a float
operand of a step. Under `numerics="strict"` extraction computes it exactly as captured:

- the e-class of each float node of the cone chooses that node's own e-node (same op and attributes, its
  children the classes of its captured inputs). Where the e-graph merged two captured nodes, the first in
  program order wins, so the pinned choices never make a cycle;
- every other step e-node extraction may choose (a rewrite's new comparison, a kernel body's) reads its float
  operands from pinned classes: a kernel's through loads and exact moves (broadcast, reshape, transpose), or
  a literal the captured cone holds.

Integer and bool values are left free: every rule keeps them bit-identical, and a float becomes one only
through a step. So `where`'s condition, a bool, needs no flag of its own: its comparison reads pinned floats.
Outside the cone, and under `numerics="fast"`, nothing changes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from superopt.core.dtypes import is_float
from superopt.core.ir import Graph
from superopt.core.ops import MOVEMENT, flagged
from superopt.egraph.encode import Encoding, decode
from superopt.egraph.frozen import ENode, FrozenEGraph
from superopt.extract.errors import ExtractionError

STEPS = flagged("step")
_LISTS = frozenset({"tcons", "tnil"})
_EXACT_MOVES = MOVEMENT - {"convert", "arg"}   # a kernel body may move a pinned value before a step reads it


def stepped(op: str, in_dtypes: list, out_dtype: str) -> list[int]:
    """The operand positions of `op` whose float value a step reads (none for ops that are not steps)."""
    if op not in STEPS or (op == "convert" and is_float(out_dtype)):   # float -> float only rounds
        return []
    return [k for k, d in enumerate(in_dtypes) if d is not None and is_float(d)]


def _effect(graph: Graph, i: int) -> bool:
    """Whether node i is an effect (a debug print or callback, `Opaque.effectful`): what it shows of a value
    is like an output, rounded as the program computes it, not a step."""
    node = graph.nodes[i]
    return node.op == "opaque" and graph.opaque[node.attrs[0]].effectful


def cone(graph: Graph) -> set[int]:
    """The live nodes whose values flow into a float operand of a step (module doc)."""
    nodes = graph.nodes
    return _ancestors(graph, [nodes[i].inputs[k] for i in graph.live() if not _effect(graph, i)
                              for k in stepped(nodes[i].op, [nodes[j].dtype for j in nodes[i].inputs], nodes[i].dtype)])


def _ancestors(graph: Graph, stack: list) -> set[int]:
    """`stack`'s nodes and every node they read."""
    nodes = graph.nodes
    seen: set[int] = set()
    while stack:
        i = stack.pop()
        if i not in seen:
            seen.add(i)
            stack.extend(nodes[i].inputs)
    return seen


def _plain(v):
    """An attribute as a hashable key that captured nodes and decoded e-nodes share."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, (tuple, list)):
        return tuple(_plain(x) for x in v)
    if isinstance(v, float):
        return ("float", repr(v))   # NaN equal to NaN, -0.0 apart from 0.0
    return v


@dataclass
class Pins:
    """The cone's float classes and the captured e-node each must choose; `nodes`: captured nodes pinned."""
    chosen: dict
    nodes: int
    literals: frozenset   # (value, dtype) of the pinned literals: a kernel body's step may read them in place

    def forbidden(self, fz: FrozenEGraph, enc: Encoding) -> set[ENode]:
        """The e-nodes of `fz` (kernels expanded) that extraction may not choose (module doc)."""
        out = set()
        for cls, nodes in fz.classes.items():
            keep = self.chosen.get(cls)
            for n in nodes:
                if (keep is not None and n != keep) or not self._reads_pinned(fz, enc, n):
                    out.add(n)
        return out

    def _reads_pinned(self, fz: FrozenEGraph, enc: Encoding, n: ENode) -> bool:
        if n.fn in _LISTS:
            return True
        if n.fn == "kernel":
            return self._body_reads_pinned(n)
        op, _ = decode(n.fn, n.args, n.children, enc)
        if op not in STEPS:
            return True
        if any(m.fn in _LISTS for c in n.children for m in fz.classes.get(c, ())):
            # an opaque reads its list as captured, where an element of it is in the cone (pinned); an opaque
            # reading none (a sort of an argmin's integers) is not a step on the cone's floats
            if not any(e in self.chosen for c in n.children for e in _list_elements(fz, c)):
                return True
            return all(c in self.chosen for c in n.children)
        operands = stepped(op, [fz.dtypes.get(c) for c in n.children], fz.dtypes.get(n.eclass, ""))
        return all(n.children[k] in self.chosen for k in operands)

    def _body_reads_pinned(self, n: ENode) -> bool:
        body = n.args[0]
        for b in body:
            for k in stepped(b.op, [body[j].dtype for j in b.inputs], b.dtype):
                src = body[b.inputs[k]]
                while src.op in _EXACT_MOVES and src.inputs:
                    src = body[src.inputs[0]]
                if src.op == "lit" and (_plain(src.attrs[0]), src.dtype) in self.literals:
                    continue
                if src.op != "arg" or n.children[src.attrs[0]] not in self.chosen:
                    return False
        return True


def _list_elements(fz: FrozenEGraph, cls) -> set:
    """The element classes of the operand list class `cls` (tcons(a, tcons(b, tnil))), by any of its e-nodes."""
    out, todo, seen = set(), [cls], set()
    while todo:
        c = todo.pop()
        if c in seen:
            continue
        seen.add(c)
        for m in fz.classes.get(c, ()):
            if m.fn == "tcons":
                out.add(m.children[0])
                todo.append(m.children[1])
    return out


def pins(fz: FrozenEGraph, enc: Encoding) -> Pins:
    """The captured e-node of every float class of the cone of `enc.graph`. Raises ExtractionError where a
    captured node of the cone is not in the e-graph (then the program is kept as captured)."""
    graph = enc.graph
    inside = cone(graph)
    readers = {i for i in graph.live() if graph.nodes[i].op == "opaque" and not _effect(graph, i)
               and set(graph.nodes[i].inputs) & inside}
    if not inside:
        return Pins({}, 0, frozenset())
    index: dict = {}
    for cls, nodes in fz.classes.items():
        for n in nodes:
            if n.fn in _LISTS:
                index[(n.fn, n.children)] = (cls, n)
                continue
            try:
                op, attrs = decode(n.fn, n.args, n.children, enc)
            except NotImplementedError:
                continue   # the Scalar language of kernel bodies: no captured node is one
            if op != "kernel":
                index[(op, _plain(attrs), n.children, fz.shapes.get(cls), fz.dtypes.get(cls))] = (cls, n)
    classes: dict = {}
    chosen: dict = {}
    count, literals = 0, set()
    for i in sorted(_ancestors(graph, [*inside, *readers])):   # an opaque step's operand list is pinned too
        node = graph.nodes[i]
        kids = tuple(classes[j] for j in node.inputs)
        lists = []
        if node.op in ("concat", "opaque"):   # their operands are one list: tcons(a, tcons(b, tnil))
            tail = index.get(("tnil", ()))
            lists.append(tail)
            for c in reversed(kids):
                tail = tail and index.get(("tcons", (c, tail[0])))
                lists.append(tail)
            kids = (tail[0],) if tail else None
        hit = kids is not None and index.get((node.op, _plain(node.attrs), kids, tuple(int(d) for d in node.shape),
                                              node.dtype))
        if not hit:
            raise ExtractionError(f"superopt: node {i} ({node.op}) feeds a comparison or rounding and is not in "
                                  "the e-graph as captured")
        classes[i] = hit[0]
        for cls, n in lists:
            chosen.setdefault(cls, n)
        if i in inside and is_float(node.dtype):
            chosen.setdefault(*hit)
            count += 1
            if node.op == "lit":
                literals.add((_plain(node.attrs[0]), node.dtype))
    return Pins(chosen, count, frozenset(literals))


def pinned_count(p: Pins | None) -> int:
    """The captured nodes the pins keep (the extraction's `Method.pinned`)."""
    return p.nodes if p else 0
