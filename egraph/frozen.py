"""A read-only view of a saturated e-graph, built from egglog's private `freeze()` tables.

Every extractor and cost model reads e-classes, e-nodes and analyses from here; the tables come through
`egraph/egglog_api.py`, the one module that touches egglog internals (egglog 13.2 to 14.x).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable

from egglog import EGraph

from superopt.egraph import egglog_api as api

TENSOR_SORTS = ("Tensor", "TList", "Scalar")  # sorts whose rows are e-nodes
_ANALYSES = ("shape", "dtype")
# the analysis's facts of one tensor (egraph/analysis.py), read into FrozenEGraph.facts where asked for
FACTS = ("nonneg", "nonpos", "integral", "finite", "positive", "at_most_one", "at_least_one")


@dataclass(frozen=True)
class ENode:
    fn: str                       # egglog function name, e.g. "matmul"
    args: tuple                   # decoded primitive arguments, in order (ints, strings, floats, tuples)
    children: tuple[Hashable, ...]  # e-class ids of the tensor / list arguments, in order
    eclass: Hashable

    def __hash__(self):  # kernel variants carry whole bodies: hash once, not at every dict lookup
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.fn, self.args, self.children, self.eclass))
            object.__setattr__(self, "_hash", h)
        return h

    def __eq__(self, other):  # the cached hashes first: variants whose bodies differ differ there
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        return hash(self) == hash(other) and (self.fn, self.args, self.children, self.eclass) == \
            (other.fn, other.args, other.children, other.eclass)


@dataclass
class FrozenEGraph:
    classes: dict[Hashable, list[ENode]] = field(default_factory=dict)
    shapes: dict[Hashable, tuple] = field(default_factory=dict)
    dtypes: dict[Hashable, str] = field(default_factory=dict)
    outputs: dict[int, Hashable] = field(default_factory=dict)  # program output index -> e-class
    facts: dict[Hashable, set[str]] = field(default_factory=dict)  # e-class -> the analysis's facts (freeze's
    # `facts=True`: no extractor reads them)
    growth_cut: int = 0           # kernels whose growth the work budget cut (extract/kernels.py: expand)
    # kernel variant -> the tensor classes whose matmul or convolution it recomputes in its body
    # (extract/kernels.py: expand), so extraction can see a producer computed in several kernels
    recomputes: dict = field(default_factory=dict)
    # the domain conditions a speculative search assumed: (condition, node id of the captured program)
    # (rewrites/rule.py `given`, extract/guard.py)
    assumed: frozenset = frozenset()

    @property
    def n_nodes(self) -> int:
        return sum(len(v) for v in self.classes.values())

    @property
    def n_classes(self) -> int:
        return len(self.classes)


def _is_tensor_sort(sort: str) -> bool:
    return sort.rsplit(".", 1)[-1] in TENSOR_SORTS


def table_sizes(egraph: EGraph) -> dict[str, int]:
    """Rows per table of the expression layer's functions and relations, by egglog name (a constructor's own
    name: `slice`, not `slice_`): what `EGraph.all_function_sizes` says, without building a Python callable
    for every table at every call (the runner asks after each rule it applies)."""
    return api.table_sizes(egraph)


def saturate_registered(egraph: EGraph, rules) -> None:
    """Run the rule set `rules` to its fixpoint. Once it is registered in `egraph` (by its first run), through
    the bindings: the expression layer hashes each of its rules again at every run to see whether it is
    registered, which took a third of a small program's saturation for the analysis rule set."""
    if not api.is_registered(egraph, rules):
        egraph.run(rules.saturate())
        return
    api.run_commands(egraph, api.run_schedule(api.ruleset_name(rules), saturate=True))


def count(egraph: EGraph) -> tuple[int, int]:
    """(e-nodes, e-classes) of the tensor sorts, without decoding any values."""
    nodes, classes = 0, set()
    for fn in api.frozen_tables(egraph).values():
        if fn.is_let_binding or not _is_tensor_sort(fn.output_sort):
            continue
        for row in fn.rows:
            if not row.subsumed:
                nodes += 1
                classes.add(row.output)
    return nodes, len(classes)


def freeze(egraph: EGraph, facts: bool = False) -> FrozenEGraph:
    """The e-graph's e-classes, shapes, dtypes and outputs; with `facts`, the analysis's facts of each class."""
    tables = api.frozen_tables(egraph)
    decoders = api.decoders(egraph)
    to_i64, to_vec = decoders["i64"], decoders.pop("Vec")

    def decode(sort: str, value: Any):
        if sort in decoders:
            return decoders[sort](value)
        if "Vec" in sort:
            return tuple(to_i64(v) for v in to_vec(value))
        raise NotImplementedError(f"superopt: cannot decode egglog sort {sort!r}")

    view = FrozenEGraph()
    assumed = set()
    for name, fn in tables.items():
        if fn.is_let_binding:
            continue
        if name == "assumed":
            assumed.update((decoders["String"](row.inputs[0]), to_i64(row.inputs[1])) for row in fn.rows)
            continue
        if name == "output":
            for row in fn.rows:
                view.outputs[to_i64(row.inputs[0])] = row.inputs[1]
            continue
        if name in FACTS:
            for row in fn.rows if facts else ():
                view.facts.setdefault(row.inputs[0], set()).add(name)
            continue
        if name in _ANALYSES:
            table = view.shapes if name == "shape" else view.dtypes
            for row in fn.rows:
                table[row.inputs[0]] = decode("Vec" if name == "shape" else "String", row.output)
            continue
        if not _is_tensor_sort(fn.output_sort):
            continue
        tensor_inputs = [_is_tensor_sort(s) for s in fn.input_sorts]
        for row in fn.rows:
            if row.subsumed:
                continue
            args = tuple(decode(s, v) for s, v, t in zip(fn.input_sorts, row.inputs, tensor_inputs) if not t)
            children = tuple(v for v, t in zip(row.inputs, tensor_inputs) if t)
            view.classes.setdefault(row.output, []).append(ENode(name, args, children, row.output))
    view.assumed = frozenset(assumed)
    return view


def node_facts(egraph: EGraph) -> dict[int, set[str]]:
    """The analysis's facts of each node of a program encoded with its `origin` rows (egraph/encode.py) and
    saturated with the analysis alone: node id -> facts. Facts of the program as captured, which no assumed
    condition helped derive."""
    tables = api.frozen_tables(egraph)
    to_i64 = api.decoders(egraph)["i64"]
    of_class: dict = {}
    for name in FACTS:
        if name in tables:
            for row in tables[name].rows:
                of_class.setdefault(row.inputs[0], set()).add(name)
    origin = tables.get("origin")
    return {to_i64(row.inputs[1]): of_class.get(row.inputs[0], set()) for row in (origin.rows if origin else ())}
