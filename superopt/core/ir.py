"""The Python-side mirror of the term language: a DAG of typed nodes (the ops: core/ops.py).

One IR serves every stage that is not the e-graph itself: capture builds a `Graph` from a jaxpr,
extraction builds one from the chosen e-nodes, and lowering, printing and cost evaluation walk it.
Nodes are stored in topological order, so every walk is a plain loop (no recursion, any depth).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from superopt.core.ops import ALL_OPS, CONST_LEAVES, NEVER_HOISTED, REDUCTIONS, lookup


def hoistable(op: str, inputs_constant: list[bool]) -> bool:
    """Whether an op whose inputs are (or are not) constant is itself computable when the program is
    built: such sub-terms are evaluated once and cost nothing per call. Names coincide for IR ops and
    egglog constructors."""
    return op in CONST_LEAVES or (op not in NEVER_HOISTED and bool(inputs_constant) and all(inputs_constant))


class CycleError(ValueError):
    """A walk met a node on its own path."""


def postorder(roots, children) -> list:
    """Every node reachable from `roots`, children before parents (an explicit stack: any depth).
    Raises CycleError if a node reaches itself."""
    order, done, on_path = [], set(), set()
    stack = [(r, False) for r in reversed(list(roots))]
    while stack:
        item, expanded = stack.pop()
        if item in done:
            continue
        if expanded:
            on_path.discard(item)
            done.add(item)
            order.append(item)
            continue
        if item in on_path:
            raise CycleError(f"{item!r} reaches itself")
        on_path.add(item)
        stack.append((item, True))
        stack.extend((c, False) for c in reversed(list(children(item))) if c not in done)
    return order


@dataclass(frozen=True)
class Node:
    op: str
    inputs: tuple[int, ...]
    attrs: tuple[Any, ...]
    shape: tuple[int, ...]
    dtype: str

    def __hash__(self):  # kernel bodies nest nodes: hash once, not at every lookup
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.op, self.inputs, self.attrs, self.shape, self.dtype))
            object.__setattr__(self, "_hash", h)
        return h

    def __eq__(self, other):  # the cached hashes first: unequal bodies differ there, without a deep walk
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        return hash(self) == hash(other) and (self.op, self.inputs, self.attrs, self.shape, self.dtype) == \
            (other.op, other.inputs, other.attrs, other.shape, other.dtype)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize if self.dtype != "bool" else self.size


@dataclass(frozen=True)
class Opaque:
    """A primitive superopt does not model: lowered back by binding it with its own params. `primitive` may
    also be one of capture's stand-ins (`capture.Subprogram`: a group of PRNG key equations or a program kept
    whole; `capture.Pinned`: an effect), which have `name`, `multiple_results` and `bind`. `effectful`: it is
    bound with `effects=` too (a pinned effect, or a program kept whole that has effects); `effects=False`,
    where superopt runs the program on its own inputs, skips its output-less effects."""
    primitive: Any
    params: dict
    n_outputs: int
    effectful: bool = False

    @property
    def name(self) -> str:
        return self.primitive.name


# The domain conditions a guard checks at run time (extract/guard.py `_Bounds`; rewrites/functions.py `DOMAINS`
# names the same ones for rules)
DOMAIN_CHECKS = ("nonneg", "positive", "finite", "moderate", "exp_moderate")


@dataclass
class Guard:
    """What makes a program guarded (extract/guard.py): it runs where every element of the float arguments `args`
    is finite and at most 2**exponent in magnitude (no such test where `exponent` is None), and where each
    domain condition (name, node id of `fallback`) of `conditions` holds for that node's values; `fallback`,
    the program as captured, runs where one does not."""
    exponent: int | None
    args: tuple[int, ...]
    fallback: "Graph"
    conditions: tuple = ()


@dataclass
class Graph:
    """A tensor program: nodes in topological order, outputs as node ids, plus side tables. A `guard`'s
    program runs in its place where the guard's check fails."""
    nodes: list[Node] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    consts: list[np.ndarray] = field(default_factory=list)
    opaque: list[Opaque] = field(default_factory=list)
    n_args: int = 0
    hidden_outputs: int = 0   # trailing outputs that are not fn's: the token that keeps pinned effects live
    guard: Guard | None = None
    scopes: dict = field(default_factory=dict)   # node id -> the `jax.named_scope` names it was traced under
    #                                               ("block/attn"), where it has any: lowering binds it there

    @property
    def results(self) -> list[int]:
        """The outputs that are fn's results (`outputs` without the hidden ones)."""
        return self.outputs[:len(self.outputs) - self.hidden_outputs]

    def add(self, node: Node) -> int:
        if node.op not in ALL_OPS:
            lookup(node.op)   # raises, naming the op
        assert all(i < len(self.nodes) for i in node.inputs), "inputs must precede their users"
        self.nodes.append(node)
        return len(self.nodes) - 1

    def live(self) -> list[int]:
        """Ids of nodes reachable from the outputs, in topological order."""
        seen = set(self.outputs)
        for i in range(len(self.nodes) - 1, -1, -1):
            if i in seen:
                seen.update(self.nodes[i].inputs)
        return sorted(seen)

    def users(self) -> dict[int, list[int]]:
        """For each live node with readers, the live nodes that read it (in program order, once per use)."""
        users: dict[int, list[int]] = {}
        for i in self.live():
            for j in self.nodes[i].inputs:
                users.setdefault(j, []).append(i)
        return users

    def constant_nodes(self) -> set[int]:
        """Live nodes computable from constants alone (see `hoistable`)."""
        return self._constants(self.live())

    def constant_nodes_of(self, root: int) -> set[int]:
        """Of `root` and the nodes it reads, those computable from constants alone (`constant_nodes`, for
        one node of a graph still being built)."""
        return self._constants(postorder([root], lambda i: self.nodes[i].inputs))

    def _constants(self, order) -> set[int]:
        """Of the nodes `order` lists (inputs first), those computable from constants alone."""
        constant: set[int] = set()
        for i in order:
            if hoistable(self.nodes[i].op, [j in constant for j in self.nodes[i].inputs]):
                constant.add(i)
        return constant

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for i in self.live():
            op = self.nodes[i].op
            counts[op] = counts.get(op, 0) + 1
        return counts


def unfused(graph: Graph, origin: dict | None = None) -> Graph:
    """`graph` with each kernel node replaced by the ops of its body: the same values, in the term language
    the e-graph encodes (a chosen program's kernels are extraction's, and a seam window is cut from chosen
    programs). `graph` itself where it has no kernel. `origin`, where given, is filled with each new node's
    node of `graph` (a body's ops: their kernel)."""
    if not any(node.op == "kernel" for node in graph.nodes):
        if origin is not None:
            origin.update((i, i) for i in range(len(graph.nodes)))
        return graph
    out = Graph(consts=list(graph.consts), opaque=list(graph.opaque), n_args=graph.n_args,
                hidden_outputs=graph.hidden_outputs)
    ids: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        if node.op != "kernel":
            ids[i] = out.add(Node(node.op, tuple(ids[j] for j in node.inputs), node.attrs, node.shape, node.dtype))
            if origin is not None:
                origin[ids[i]] = i
            continue
        body: dict[int, int] = {}
        for k, inner in enumerate(node.attrs[0]):   # `arg` k of a body is the kernel's input k
            body[k] = ids[node.inputs[inner.attrs[0]]] if inner.op == "arg" else \
                out.add(Node(inner.op, tuple(body[j] for j in inner.inputs), inner.attrs, inner.shape, inner.dtype))
            if origin is not None and inner.op != "arg":
                origin[body[k]] = i
        ids[i] = body[len(node.attrs[0]) - 1]
    out.outputs = [ids[o] for o in graph.outputs]
    return out


def type_str(node: Node) -> str:
    short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int32": "i32",
             "int8": "i8", "int64": "i64", "uint8": "u8", "bool": "bool", "int16": "i16", "uint32": "u32"}
    return f"{short.get(node.dtype, node.dtype)}[{','.join(map(str, node.shape))}]"


def _attr_str(node: Node, graph: Graph) -> str:
    if node.op == "arg":
        return f"{node.attrs[0]}"
    if node.op == "const":
        return f"{node.attrs[0]}"
    if node.op == "lit":
        return f"{node.attrs[0]!r}"
    if node.op == "opaque":
        return f"{graph.opaque[node.attrs[0]].name}#{node.attrs[1]}"
    if node.op == "conv":
        params = dict(node.attrs[0])
        return f"strides={params['window_strides']}"
    return ",".join(str(a) for a in node.attrs)


_TRANSPARENT = frozenset({"broadcast", "reshape"})  # shown as their operand: broadcasting is implicit


def body_str(body: tuple) -> str:
    """A kernel body as one expression over its inputs `in0, in1, ...`; values used twice get a name."""
    uses = [0] * len(body)
    for node in body:
        for j in node.inputs:
            uses[j] += 1
    text: dict[int, str] = {}
    lets = []
    for i, node in enumerate(body):
        args = [text[j] for j in node.inputs]
        if node.op == "arg":
            text[i] = f"in{node.attrs[0]}"
            continue
        if node.op in _TRANSPARENT:
            text[i] = args[0]
            continue
        if node.op in REDUCTIONS:
            expr = f"row_{node.op[len('reduce_'):]}({args[0]})"
        elif node.op == "transpose":
            expr = f"transpose[{','.join(map(str, node.attrs[0]))}]({args[0]})"
        elif node.op == "integer_pow":
            expr = f"pow({args[0]}, {node.attrs[0]})"
        elif node.op == "convert":
            expr = f"convert[{type_str(node).split('[')[0]}]({args[0]})"
        else:
            expr = f"{node.op}({', '.join(args)})"
        if uses[i] > 1 and i != len(body) - 1:
            name = f"t{len(lets)}"
            lets.append(f"{name} = {expr}")
            expr = name
        text[i] = expr
    return "; ".join(lets + [text[len(body) - 1]])


def pretty(graph: Graph) -> str:
    """Readable let-listing of the live nodes: `%3 = matmul(%1, %2) : f32[128,64]`."""
    lines = []
    names: dict[int, str] = {}
    for i in graph.live():
        node = graph.nodes[i]
        names[i] = f"%{len(names)}"
        args = ", ".join(names[j] for j in node.inputs)
        if node.op == "kernel":
            head = f"kernel{{{body_str(node.attrs[0])}}}"
        else:
            attrs = _attr_str(node, graph)
            head = f"{node.op}[{attrs}]" if attrs else node.op
        lines.append(f"{names[i]} = {head}({args}) : {type_str(node)}")
    lines.append("return " + ", ".join(names[o] for o in graph.outputs))
    if graph.guard is not None:
        e, args = graph.guard.exponent, ", ".join(f"arg[{k}]" for k in graph.guard.args)
        where = [f"every element of {args} is finite and at most 2**{e} in magnitude"] if e is not None else []
        where += [f"{name}(%{i} of the program below)" for name, i in graph.guard.conditions]
        lines.append(f"where {' and '.join(where)}; elsewhere:")
        lines.append(pretty(graph.guard.fallback))
    return "\n".join(lines)


def carry_scopes(original: Graph, chosen: Graph) -> dict:
    """`Graph.scopes` for `chosen`, a program computing what `original` does: a node the same as one of the
    original's (the same op, attributes, type and operands, compared structurally from the arguments up)
    keeps that node's scope, and an output the scope of the original's output; a node the rewrite made takes the
    longest scope its nearest consumers share (where it has none, its operands), so a program rewritten inside
    `jax.named_scope("block")` stays in it."""
    if not original.scopes:
        return {}
    table: dict = {}
    known = {}
    for i, key in _structural_keys(original, table).items():
        if i in original.scopes:
            known.setdefault(key, original.scopes[i])
    keys = _structural_keys(chosen, table)
    scopes = {i: known[key] for i, key in keys.items() if key in known}
    for o, was in zip(chosen.outputs, original.outputs):   # an output computes what the original's did
        if o not in scopes and was in original.scopes:
            scopes[o] = original.scopes[was]
    live = chosen.live()
    consumers: dict[int, list[int]] = {}
    for i in live:
        for j in chosen.nodes[i].inputs:
            consumers.setdefault(j, []).append(i)
    leaves = ("arg", "lit", "const")
    for i in reversed(live):          # consumers first
        if i not in scopes and chosen.nodes[i].op not in leaves:
            around = [scopes[c] for c in consumers.get(i, ()) if c in scopes]
            if around:
                scopes[i] = _shared_scope(around)
    for i in live:                    # what no consumer placed: its operands' scope
        if i not in scopes and chosen.nodes[i].op not in leaves:
            around = [scopes[j] for j in chosen.nodes[i].inputs if j in scopes]
            if around:
                scopes[i] = _shared_scope(around)
    return {i: s for i, s in scopes.items() if s}


def _shared_scope(scopes: list[str]) -> str:
    parts = [s.split("/") for s in scopes]
    shared = []
    for names in zip(*parts):
        if len(set(names)) != 1:
            break
        shared.append(names[0])
    return "/".join(shared)


def _structural_keys(graph: Graph, table: dict) -> dict[int, int]:
    """Per live node, an int equal for two nodes (of graphs keyed with one `table`) that compute the same
    thing from the same arguments: interned (op, attributes, type, operand keys); a constant by its index,
    which two graphs may number apart (they then simply do not match)."""
    keys: dict[int, int] = {}
    for i in graph.live():
        node = graph.nodes[i]
        try:
            key = (node.op, node.attrs, node.shape, node.dtype, tuple(keys[j] for j in node.inputs))
            hash(key)
        except TypeError:   # an attribute that does not hash (an array): the node matches nothing
            key = ("unmatched", i, id(graph))
        keys[i] = table.setdefault(key, len(table))
    return keys
