"""One optimization for every size: what optimizing fn at one set of argument shapes tells a call at others.

A function is called at many batch sizes; each new shape is a new specialization, and searching it again
costs seconds where jax.jit's compile costs a tenth of one. Most programs are the same program at every
size: the same ops, the same attributes, only some extents different. `Sizes` remembers, per `superopt(fn)`,
each decision it made (the program searched, the outcome, the program chosen); a call at new shapes whose
captured program is an earlier one with its sizes renamed takes that decision at the new sizes:

- **the renaming** (`renaming`): the argument extents that changed, old -> new, read off the argument
  types; each old extent must change the same way wherever it appears among the arguments, and be larger
  than `MIN_EXTENT` (a smaller number in an attribute may be an axis or a rank, not a size);
- **the test** (`resized`): the earlier program, every extent in node shapes and attributes (and every float
  literal equal to one, a mean's divisor) renamed, must equal the new program node for node, constants by
  value. Where it does not (a size that enters the program another way: a constant mask of the batch's
  shape, half the batch as a slice bound), the new shapes are searched as any new program is;
- **the decision**: a kept program stays kept (the report says it was decided at the earlier sizes, and
  `reuse_sizes=False` searches every size); a changed program is renamed the same way, priced again at the
  new sizes (kept unless it is still predicted `MIN_PREDICTED_GAIN` cheaper) and checked against the
  captured program on verification's first random input set at the new sizes, by the reference evaluator,
  as a cache entry is (`entries.rechecked`): the full verification ran on it at the earlier sizes. A
  guarded program is not renamed (its check's bound depends on the sizes): it is searched again.

A decision that depends on the machine's load (a time limit, a failed worker) is not reused. The same
renaming gives a program with symbolic extents (`jax.export` with a symbolic batch): the program is
optimized at stand-in extents (`stand_ins`), and the chosen program is renamed back to the symbols.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from superopt.core.ir import Graph, Node

MIN_EXTENT = 9        # extents up to 8 may be axes, ranks or counts in attributes: not renamed
MAX_DECISIONS = 16    # decisions kept per function (the latest)
STAND_INS = (128, 96, 160, 192, 224, 112, 144, 176, 208, 240)   # extents a symbolic dimension is optimized at


def renaming(old_avals, new_avals) -> dict | None:
    """old extent -> new extent for the arguments' extents that differ, or None where the arguments are not
    the same types at other sizes (another count, rank or dtype; an extent renamed two ways; a small one)."""
    if len(old_avals) != len(new_avals):
        return None
    sizes, kept = {}, set()
    for (old_shape, old_dtype), (new_shape, new_dtype) in zip(old_avals, new_avals):
        if str(old_dtype) != str(new_dtype) or len(old_shape) != len(new_shape):
            return None
        for o, n in zip(old_shape, new_shape):
            if not isinstance(o, int):
                return None
            if isinstance(n, int) and o == n:
                kept.add(o)
            elif o < MIN_EXTENT or sizes.get(o, n) != n:
                return None
            else:
                sizes[o] = n
    if not sizes or kept & sizes.keys():
        return None
    return sizes


def renamed(value, sizes: dict, floats: dict):
    """`value` (a node, a shape, an attribute) with every extent in `sizes` renamed, and every float in `floats`.
    Node inputs are ids, never renamed."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, np.integer)):
        return sizes.get(int(value), value)
    if isinstance(value, (float, np.floating)):
        return floats.get(float(value), value)
    if isinstance(value, Node):
        return Node(value.op, value.inputs, renamed(value.attrs, sizes, floats),
                    tuple(renamed(d, sizes, floats) for d in value.shape), value.dtype)
    if type(value) is tuple:
        return tuple(renamed(v, sizes, floats) for v in value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):   # a NamedTuple (dimension numbers)
        return type(value)(*(renamed(v, sizes, floats) for v in value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: renamed(getattr(value, f.name), sizes, floats)
                                             for f in dataclasses.fields(value) if f.init})
    return value


def _float_sizes(sizes: dict) -> dict:
    """A mean divides by its extent as a float literal: renamed with it, where the new extent is a number."""
    return {float(o): float(n) for o, n in sizes.items() if isinstance(n, int)}


def renamed_graph(graph: Graph, sizes: dict) -> Graph:
    floats = _float_sizes(sizes)
    return dataclasses.replace(graph, nodes=[renamed(n, sizes, floats) for n in graph.nodes], scopes={})


def _same_consts(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True)
                                    for x, y in zip(a, b))


def _canonical(value):
    """`value` with floats as their bits, so that a NaN literal equals another (Python's == says it does not)."""
    if isinstance(value, (float, np.floating)) and not isinstance(value, bool):
        return ("float", float(value).hex())
    if isinstance(value, Node):
        return (value.op, value.inputs, _canonical(value.attrs), value.shape, value.dtype)
    if isinstance(value, tuple):
        return (type(value).__name__,) + tuple(_canonical(v) for v in value)
    return value


def same_program(renamed_old: Graph, new: Graph) -> bool:
    """Whether `renamed_old` is `new` node for node (no opaque primitive or guard in either)."""
    return (not renamed_old.opaque and not new.opaque and renamed_old.guard is None and new.guard is None
            and len(renamed_old.nodes) == len(new.nodes)
            and all(a == b or _canonical(a) == _canonical(b) for a, b in zip(renamed_old.nodes, new.nodes))
            and renamed_old.outputs == new.outputs
            and renamed_old.n_args == new.n_args and renamed_old.hidden_outputs == new.hidden_outputs
            and _same_consts(renamed_old.consts, new.consts))


@dataclass
class Decision:
    """What optimizing one program at one set of sizes decided."""
    avals: tuple          # the arguments' (shape, dtype)
    program: Graph        # the program searched (the capture after the loop passes)
    fingerprint: str      # the search's options (stages.Search.fingerprint)
    outcome: object       # report.Outcome
    reason: str
    chosen: Graph | None  # the program chosen, where it is changed
    run: object           # the saturation's RunReport

    def sizes_text(self) -> str:
        return ", ".join("x".join(map(str, shape)) or "scalar" for shape, _ in self.avals)


@dataclass
class Match:
    """An earlier decision that holds for a new program: its renaming, and its chosen program renamed."""
    decision: Decision
    sizes: dict
    chosen: Graph | None


class Sizes:
    """The decisions of one `superopt(fn)` (module doc); thread-safe enough for its use: a lookup reads a
    snapshot of the list, a decision is appended whole."""

    def __init__(self):
        self._decisions: list[Decision] = []

    def remember(self, decision: Decision) -> None:
        if decision.program.opaque or decision.program.guard is not None:
            return
        if decision.chosen is not None and decision.chosen.opaque:
            return
        self._decisions = (self._decisions + [decision])[-MAX_DECISIONS:]

    def find(self, avals, program: Graph, fingerprint: str | None = None) -> Match | None:
        """The latest decision, made under `fingerprint` (None: any), that `program` at `avals` is a renaming
        of (module doc), or None."""
        if program.opaque or program.guard is not None:
            return None
        for decision in reversed(self._decisions):
            if fingerprint is not None and decision.fingerprint != fingerprint:
                continue
            sizes = renaming(decision.avals, avals)
            if sizes is None or not same_program(renamed_graph(decision.program, sizes), program):
                continue
            chosen = None
            if decision.chosen is not None:
                shared = len(decision.program.consts)
                chosen = renamed_graph(dataclasses.replace(decision.chosen, guard=None), sizes)
                chosen.consts = list(program.consts) + list(decision.chosen.consts[shared:])
            return Match(decision, sizes, chosen)
        return None


def stand_ins(avals, graph: Graph, skip=frozenset()) -> dict | None:
    """symbol -> the extent a program with symbolic argument extents is optimized at: one of `STAND_INS` that
    no extent or attribute of `graph` holds (so that renaming it back is unambiguous), nor `skip`; None where
    an extent is an expression of symbols rather than one symbol (`2*b`), or there are not stand-ins enough."""
    used: set = set(skip)

    def ints(value):
        if isinstance(value, bool):
            return
        if isinstance(value, (int, np.integer)):
            used.add(int(value))
        elif isinstance(value, (tuple, list)):
            for v in value:
                ints(v)
        elif isinstance(value, Node):
            ints(value.attrs)
            ints(value.shape)
    for node in graph.nodes:
        ints(node)
    symbols = []
    for shape, _ in avals:
        for d in shape:
            if not isinstance(d, int):
                if not str(d).isidentifier():
                    return None
                if d not in symbols:
                    symbols.append(d)
    free = [s for s in STAND_INS if s not in used]
    if len(free) < len(symbols):
        return None
    return dict(zip(symbols, free))
