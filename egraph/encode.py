"""Encode a `Graph` into an egglog e-graph, and decode chosen e-nodes back into IR nodes. The encoder
and the decoding table below mirror each other, keyed by op and by egglog function name; a missing
entry is an error naming the op.

Encoding takes time linear in the program's size. egglog 13.2 makes every global `let` a table of its
own and every later command pays for all of them (40,000 lets: 26 s; 5,000: 0.7 s), and the Python
expression layer costs about 0.7 ms a node. So the encoder writes egglog's command objects directly,
`_CHUNK` nodes to a rule with an empty query, run once: in a rule each node is a local `let` (depth
never recurses) with its shape and dtype rows, and a node that a later rule reads is stored in one
helper table, `superopt_encode_ref` (node id -> e-class), which that rule's query looks up. A rule's
query holds at most `_QUERY` lookups (a chunk ends early where its nodes read more, and the outputs go
in as many rules as they need): egglog compiles a query in time that grows faster than its atoms (a
program of 465 outputs took 0.85 s in one rule, 0.01 s in rules of 16 lookups). When every
node and output is in, the helper table's rows are deleted: the e-graph holds the same terms, analysis
rows and outputs as when each node was a global `let`, and the frozen e-graph (`egraph/frozen.py`) is
the same, table order included, because functions are declared where the expression layer declared
them (`tests/test_limits.py` compares the two encoders).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from egglog import EGraph, i64, set_

from superopt.core.deadline import Deadline
from superopt.egraph import egglog_api as api
from superopt.egraph import terms as T
from superopt.egraph.egglog_api import Call, Lit, Var, bindings
from superopt.egraph.analysis import axes_facts, facts
from superopt.egraph.signatures import CONSTRUCTORS
from superopt.core.ir import Graph, Node
from superopt.core.ops import lookup

_CHUNK = 256                 # nodes per rule: a rule compiles in time linear in its actions; few cross rules
_QUERY = 16                  # lookups of the helper table per rule, at most (module doc)
_REF = "superopt_encode_ref"  # the helper table: node id -> e-class, for nodes read across rules
_SPAN = api.SPAN
_ANALYSES_DECLARED_AT = 128  # the expression layer declared `shape` and `dtype` with the 128th node's rows


@dataclass
class Encoding:
    egraph: EGraph
    graph: Graph
    conv_params: list = field(default_factory=list)

    def intern_conv(self, params) -> int:
        if params not in self.conv_params:
            self.conv_params.append(params)
            index = len(self.conv_params) - 1
            if channels_last(params):
                self.egraph.register(T.conv_channels_last(i64(index)))
            twin = int32_twin(params)
            if twin is not None:     # the same conv accumulating in int32, for quantization's int8 conv
                self.egraph.register(set_(T.conv_int32(i64(index))).to(i64(self.intern_conv(twin))))
        return self.conv_params.index(params)


def int32_twin(params) -> tuple | None:
    """`params` with preferred_element_type int32, for params that give the operands' dtype (none, or
    float32: the f32 conv of widened int8 operands); else None."""
    p = dict(params)
    if "preferred_element_type" not in p or \
            p["preferred_element_type"] is not None and np.dtype(p["preferred_element_type"]) != np.float32:
        return None
    return tuple((k, np.dtype("int32") if k == "preferred_element_type" else v) for k, v in params)


def channels_last(params) -> bool:
    """Whether a conv's output feature axis and its kernel's output feature axis are both the last one."""
    spec = dict(params)["dimension_numbers"]
    return spec.out_spec[1] == len(spec.out_spec) - 1 and spec.rhs_spec[0] == len(spec.rhs_spec) - 1


class _Writer:
    """egglog actions for the nodes of a graph, as egglog's own command objects (module doc)."""

    def __init__(self, enc: Encoding):
        self.enc, self.eg = enc, enc.egraph
        self.names: dict = {}          # term function -> its egglog name, once declared
        self.strings: dict = {}
        self.ref_declared = False
        self.rules = 0

    def declare(self, fn) -> str:
        """`fn`'s egglog name, declaring it first where the expression layer would have declared it."""
        name = self.names.get(fn)
        if name is None:
            name = self.names[fn] = api.egg_name(self.eg, fn)
        return name

    def string(self, value: str):
        lit = self.strings.get(value)
        if lit is None:
            lit = self.strings[value] = Lit(_SPAN, bindings.String(value))
        return lit

    @staticmethod
    def int(value):
        return Lit(_SPAN, bindings.Int(int(value)))

    @staticmethod
    def vec(values):
        if len(values):
            return Call(_SPAN, "vec-of", [Lit(_SPAN, bindings.Int(int(v))) for v in values])
        return Call(_SPAN, "vec-empty", [])

    def tlist(self, items: list):
        cons = self.declare(T.tcons) if items else None
        out = Call(_SPAN, self.declare(T.tnil), [])
        for item in reversed(items):
            out = Call(_SPAN, cons, [item, out])
        return out

    def expr(self, node: Node, ins: list):
        """The egglog call for `node` with its inputs `ins` (variables)."""
        op, a = node.op, node.attrs
        call, s, i, v = self.declare, self.string, self.int, self.vec
        family = lookup(op).family   # an op of a family is its constructor applied to the op's name
        if family == "unary":
            return Call(_SPAN, call(T.unary), [s(op), ins[0]])
        if family == "binary":
            return Call(_SPAN, call(T.binary), [s(op), ins[0], ins[1]])
        if family == "reduce":
            return Call(_SPAN, call(T.reduce), [s(op), ins[0], v(a[0])])
        if family == "argreduce":
            return Call(_SPAN, call(T.argreduce), [s(op), ins[0], i(a[0]), s(node.dtype)])
        if family == "pool":
            return Call(_SPAN, call(T.pool), [s(op), ins[0], *(v(x) for x in a)])
        if family == "scan":
            return Call(_SPAN, call(T.scan), [s(op), ins[0], i(a[0]), i(a[1])])
        if op == "conv":   # the params are interned first, as the expression layer did
            index = self.enc.intern_conv(a[0])
            return Call(_SPAN, call(T.conv), [ins[0], ins[1], i(index)])
        fn, args = {
            "arg": (T.arg, lambda: [i(a[0])]),
            "const": (T.const, lambda: [i(a[0])]),
            "lit": (T.lit, lambda: [Lit(_SPAN, bindings.Float(float(a[0]))), s(node.dtype)]),
            "iota": (T.iota, lambda: [i(a[0]), v(node.shape), s(node.dtype)]),
            "integer_pow": (T.integer_pow, lambda: [ins[0], i(a[0])]),
            "select": (T.select, lambda: list(ins)),
            "convert": (T.convert, lambda: [ins[0], s(node.dtype)]),
            "matmul": (T.matmul, lambda: [ins[0], ins[1], s(node.dtype)]),
            "transpose": (T.transpose, lambda: [ins[0], v(a[0])]),
            "reshape": (T.reshape, lambda: [ins[0], v(node.shape)]),
            "broadcast": (T.broadcast, lambda: [ins[0], v(node.shape), v(a[0])]),
            "concat": (T.concat, lambda: [self.tlist(ins), i(a[0])]),
            "slice": (T.slice_, lambda: [ins[0], *(v(x) for x in a)]),
            "pad": (T.pad, lambda: [ins[0], ins[1], *(v(x) for x in a)]),
            "pack": (T.pack, lambda: [ins[0], s(a[0])]),
            "unpack": (T.unpack, lambda: [ins[0], s(a[0]), v(node.shape)]),
            "fractal_matmul": (T.fractal_matmul, lambda: [ins[0], ins[1], s(node.dtype)]),
            "opaque": (T.opaque, lambda: [i(a[0]), i(a[1]), self.tlist(ins)]),
        }.get(op, (None, None))
        if fn is None:
            raise NotImplementedError(f"superopt: no egglog encoding for op {op!r}")
        name = call(fn)        # the function first, then what its arguments use (a list's cons cells)
        return Call(_SPAN, name, args())

    def run_rule(self, actions: list, query: list, tag: str) -> None:
        """Run `actions` once, as a rule with the (constant) `query`, in a rule set of its own."""
        self.rules += 1
        name = f"superopt_encode_{tag}{self.rules}"
        api.run_commands(self.eg, api.add_ruleset(name), api.rule_command(actions, query, name, name),
                         api.run_schedule(name))

    def declare_ref(self) -> None:
        if not self.ref_declared:
            tensor = next(sort for sort in api.sort_names(self.eg) if sort.rsplit(".", 1)[-1] == "Tensor")
            api.run_commands(self.eg, api.function_command(_REF, ["i64"], tensor))
            self.ref_declared = True


_template: dict = {}   # the main thread's empty e-graph that `scratch` lends, and whether it is lent


@contextmanager
def template(prime: Callable | None = None):
    """The process's template e-graph itself (`scratch`), for a search that encodes its program in the child
    process it saturates in (`egraph/isolate.py` `encode_and_saturate`): nothing is written to it in this
    process, so it is neither pushed nor popped. `prime(template)` as in `scratch`. None where `scratch`
    would lend a new e-graph (another thread, or the template lent already)."""
    eg = _the_template()
    if eg is None:
        yield None
        return
    if prime is not None:
        prime(eg)
    _template["lent"] = True
    try:
        yield eg
    finally:
        _template["lent"] = False


def _the_template() -> EGraph | None:
    """The main thread's template e-graph, made on first use; None on another thread or while it is lent."""
    from superopt.egraph.analysis import analysis
    from superopt.egraph.frozen import saturate_registered
    if _template.get("lent") or threading.current_thread() is not threading.main_thread():
        return None
    if "egraph" not in _template:
        eg = EGraph()
        eg.register(*facts())
        saturate_registered(eg, analysis())
        _template["egraph"] = eg
    return _template["egraph"]


@contextmanager
def scratch(prime: Callable | None = None):
    """An empty e-graph for one program's search, on which `encode(..., egraph=)` writes: the process's
    template e-graph, which holds the analyses' facts and the analysis rule set registered once, pushed
    for the search and popped after it (egglog restores its state, Python side included). Registering the
    analysis rule set in each new e-graph took 78 ms of every search, where running it on a small program
    takes under a millisecond; a search forks its saturation from the pushed state, so the child holds the
    program and the parent gets the template back at the pop. `prime(template)`, called before the push,
    registers more in the template for good (the rule sets of earlier searches: `runner.prime`). The
    template belongs to the main thread (an egglog e-graph must be dropped on the thread that made it);
    another thread (`background=True`'s worker), or a nested use while the template is lent, gets a new
    e-graph with the facts, as before."""
    eg = _the_template()
    if eg is None:
        fresh = EGraph()
        fresh.register(*facts())
        yield fresh
        return
    if prime is not None:
        prime(eg)
    eg.push()
    _template["lent"] = True
    try:
        yield eg
    finally:
        _template["lent"] = False
        eg.pop()


def _chunks(live: list, nodes: list) -> list[tuple[int, int]]:
    """Positions [first, end) in `live` of each rule's nodes: `_CHUNK` nodes, or fewer where the next node
    would take the rule's lookups of nodes written by earlier rules past `_QUERY`."""
    chunks, first, written, read = [], 0, set(), set()
    for p, i in enumerate(live):
        new = {j for j in nodes[i].inputs if j not in written and j not in read}
        if p > first and (p - first == _CHUNK or len(read) + len(new) > _QUERY):
            chunks.append((first, p))
            first, written, read = p, set(), set()
            new = set(nodes[i].inputs)
        read |= new
        written.add(i)
    chunks.append((first, len(live)))
    return chunks


def constructors(graph: Graph) -> frozenset[str]:
    """The constructors (egglog names, as `signatures.CONSTRUCTORS` has them) of the terms `encode` writes for
    `graph`: what the runner's census would find in the encoded e-graph, known before it is encoded (a search
    that encodes in a child process: `egraph/isolate.py`)."""
    names = set()
    for i in graph.live():
        node = graph.nodes[i]
        family = lookup(node.op).family
        if family in _FAMILIES:
            names.add(family)
            continue
        names.add(node.op)
        if node.op in ("concat", "opaque"):   # their operands as a list: nil, and a cons cell for each
            names.add("tnil")
            if node.inputs:
                names.add("tcons")
    return frozenset(names & set(CONSTRUCTORS))


_FAMILIES = ("unary", "binary", "reduce", "argreduce", "pool", "scan")   # as `_Writer.expr` writes them


def encode(graph: Graph, deadline: Deadline | None = None, origins: bool = False,
           egraph: EGraph | None = None) -> Encoding:
    """Insert every live node of `graph` into a fresh e-graph with its shape and dtype; in time linear
    in the number of nodes (module doc). With `deadline`, raises `TimeLimit("encode")` once it passes
    (checked after every `_CHUNK` nodes). With `origins`, each node's e-class gets an `origin` row holding
    its id, which a rule assuming a domain condition reads (rewrites/compile.py, extract/guard.py).
    `egraph`: an empty e-graph that holds the analyses' facts already (`scratch`) instead of a new one."""
    enc = Encoding(EGraph() if egraph is None else egraph, graph)
    eg = enc.egraph
    ground = (*(facts() if egraph is None else ()), *axes_facts(graph))
    if ground:
        eg.register(*ground)
    live = graph.live()
    if not live:
        return enc
    nodes = graph.nodes
    last_read = {}   # node -> position of its last reader (len(live): an output)
    for p, i in enumerate(live):
        for j in nodes[i].inputs:
            last_read[j] = p
    for o in graph.outputs:
        last_read[o] = len(live)
    w = _Writer(enc)
    stored = False
    origin = w.declare(T.origin) if origins else None
    for first, end in _chunks(live, nodes):
        if deadline is not None:
            deadline.check("encode")
        actions, query, bound, shapes = [], [], set(), {}

        def var(j):
            if j not in bound:      # written by an earlier rule: look it up in the helper table
                bound.add(j)
                query.append(bindings.Eq(_SPAN, Var(_SPAN, f"n{j}"), Call(_SPAN, _REF, [w.int(j)])))
            return Var(_SPAN, f"n{j}")

        for p in range(first, end):
            i = live[p]
            node = nodes[i]
            actions.append(bindings.Let(_SPAN, f"n{i}", w.expr(node, [var(j) for j in node.inputs])))
            bound.add(i)
            here = Var(_SPAN, f"n{i}")
            shape = shapes.get(node.shape)
            if shape is None:       # one Vec per distinct shape in a rule
                shape = shapes[node.shape] = Var(_SPAN, f"s{len(shapes)}")
                actions.append(bindings.Let(_SPAN, f"s{len(shapes) - 1}", w.vec(node.shape)))
            actions.append(bindings.Set(_SPAN, "shape", [here], shape))
            actions.append(bindings.Set(_SPAN, "dtype", [here], w.string(node.dtype)))
            if origin is not None:
                actions.append(bindings.Expr_(_SPAN, Call(_SPAN, origin, [here, w.int(i)])))
            if p + 1 == _ANALYSES_DECLARED_AT:   # where the expression layer declared shape and dtype
                w.declare(T.shape), w.declare(T.dtype)
            if last_read.get(i, -1) >= end:    # read by a later rule, or an output
                w.declare_ref()
                actions.append(bindings.Set(_SPAN, _REF, [w.int(i)], here))
                stored = True
        w.declare(T.shape), w.declare(T.dtype)
        w.run_rule(actions, query, "nodes")
    out = w.declare(T.output)
    k, outputs = 0, graph.outputs
    while k < len(outputs):     # `_QUERY` distinct outputs to a rule
        actions, query, bound = [], [], set()
        while k < len(outputs) and (outputs[k] in bound or len(query) < _QUERY):
            o = outputs[k]
            if o not in bound:
                bound.add(o)
                query.append(bindings.Eq(_SPAN, Var(_SPAN, f"n{o}"), Call(_SPAN, _REF, [w.int(o)])))
            actions.append(bindings.Expr_(_SPAN, Call(_SPAN, out, [w.int(k), Var(_SPAN, f"n{o}")])))
            k += 1
        w.run_rule(actions, query, "outputs")
    if stored:   # the helper table goes: the e-graph holds the program's terms and nothing else
        w.run_rule([bindings.Change(_SPAN, bindings.Delete(), _REF, [Var(_SPAN, "i")])],
                   [bindings.Eq(_SPAN, Var(_SPAN, "x"), Call(_SPAN, _REF, [Var(_SPAN, "i")]))], "clear")
    return enc


# ---- decoding: egglog function name + decoded arguments -> (op, attrs) of an IR node ----

def _lit_value(value: float, dtype: str):
    if dtype == "bool":
        return bool(value)
    if dtype.startswith(("int", "uint")):
        return int(value)
    return float(value)


def decode(fn: str, args: tuple, children: tuple, enc: Encoding) -> tuple[str, tuple]:
    """(op, attrs) for an e-node; `args` are its decoded primitive arguments in order."""
    if fn in ("unary", "binary"):
        return args[0], ()
    table = {
        "arg": lambda: ("arg", (args[0],)),
        "const": lambda: ("const", (args[0],)),
        "lit": lambda: ("lit", (_lit_value(args[0], args[1]),)),
        "iota": lambda: ("iota", (args[0],)),
        "integer_pow": lambda: ("integer_pow", (args[0],)),
        "select": lambda: ("select", ()),
        "convert": lambda: ("convert", ()),
        "matmul": lambda: ("matmul", ()),
        "conv": lambda: ("conv", (enc.conv_params[args[0]],)),
        "reduce": lambda: (args[0], (tuple(args[1]),)),
        "argreduce": lambda: (args[0], (args[1],)),
        "scan": lambda: (args[0], (args[1], args[2])),
        "pool": lambda: (args[0], tuple(tuple(v) for v in args[1:])),
        "transpose": lambda: ("transpose", (tuple(args[0]),)),
        "reshape": lambda: ("reshape", ()),
        "broadcast": lambda: ("broadcast", (tuple(args[1]),)),
        "concat": lambda: ("concat", (args[0],)),
        "slice": lambda: ("slice", tuple(tuple(v) for v in args)),
        "pad": lambda: ("pad", tuple(tuple(v) for v in args)),
        "pack": lambda: ("pack", (args[0],)),
        "unpack": lambda: ("unpack", (args[0],)),
        "fractal_matmul": lambda: ("fractal_matmul", ()),
        "opaque": lambda: ("opaque", (args[0], args[1])),
        "kernel": lambda: ("kernel", args),  # a concrete body chosen by extract/kernels.py
    }
    if fn not in table:
        raise NotImplementedError(f"superopt: no decoding for egglog function {fn!r}")
    return table[fn]()
