"""A whole program on a CPU, priced as XLA runs it: in XLA's own fusions.

On the cpu target every program superopt returns runs through XLA, which fuses by itself: a chain of
elementwise ops, views, slices and broadcasts becomes one loop, and a reduction takes the loop that
produces its operand. Pricing each op as a kernel of its own (`extraction.program_cost` on other
targets) would say that fusing such a chain by hand saves its intermediates' bytes and launches, when XLA
saves them for the original too; a rewritten program must be cheaper than the original as XLA runs it.

The fusions, as XLA's CPU pipeline forms them (a model, not its code):
- an op of `LOOP_OPS` joins the loop of its readers where they are loop ops or reductions all in one loop,
  and the op is not a program result (a value read by two loops is written once and read back);
- a reduction ends a loop (its readers start another);
- a broadcast, reshape or iota read by several loops is recomputed in each (`DUPLICATED`);
- a transpose read only by matmuls or convolutions costs nothing: the dot reads its operand either way; so
  does a transpose that alone reads a dot's result (XLA emits the dot with its operands swapped);
- every other op (a matmul, a convolution, an opaque op) is a kernel of its own; a loop (scan, while) is
  priced as its trips times its body, itself priced so, a cond as its costliest branch (extract/loops.py).
Before it fuses, XLA's algebraic simplifier removes what it can prove away (`simplified`): a rewrite that
only does what the simplifier does is no gain on a CPU (under jax.jit, `exp(log(exp(a)))` runs one
exponential and `log(exp(a) * exp(b))` one add).
Each loop is priced as one kernel of the cpu model (`cost.kernel_breakdown`): what it reads from outside
and writes, its arithmetic, one launch. Constant sub-terms, hoisted when the program is built, are free.
"""
from __future__ import annotations

from superopt.core.ir import Graph, Node, unfused
from superopt.core.ops import ELEMENTWISE, MATRIX_OPS, REDUCTIONS
from superopt.extract.cost import kernel_breakdown, op_cost
from superopt.extract.loops import loop_costs
from superopt.extract.target import Target

LOOP_OPS = ELEMENTWISE | {"broadcast", "reshape", "transpose", "slice", "concat", "pad", "iota", "lit"}
DUPLICATED = frozenset({"broadcast", "reshape", "iota", "lit"})
LEAVES = frozenset({"arg", "const"})
# Ops whose result XLA's simplifier knows has no negative element (it drops an `abs` of them): observed in
# the optimized HLO of jax.jit on CPU, as every rewrite of `simplified` (tests/test_xla_cost.py checks each).
XLA_NONNEG = frozenset({"exp", "abs", "square"})
INVERSES = {("log", "exp"), ("neg", "neg")}    # (outer, inner): outer(inner(x)) is x


def simplified(graph: Graph, origin: dict[int, int] | None = None) -> Graph:
    """`graph` as XLA's algebraic simplifier leaves it, as far as that changes what it costs: log(exp(x))
    and -(-x) are x; a transpose of a transpose that undoes it, x * 1, x + 0 and max(x, x) are x; |y| is y
    where y is an exponential, a square or an absolute value; sqrt(x^2) is |x|, and sqrt(y)^2 is y for such
    a y; exp(a) * exp(b) is exp(a + b) and exp(a) / exp(b) is exp(a - b); a reshape of a reshape is one
    reshape (none where it keeps the shape), and a concat of a tensor's slices in order is the tensor. `origin`,
    where given, is filled with each node of the result's node of `graph` (the node it stands for)."""
    out = Graph(consts=graph.consts, opaque=graph.opaque, n_args=graph.n_args, hidden_outputs=graph.hidden_outputs)
    new: dict[int, int] = {}
    back: dict[int, int] = {}

    def add(i: int, op: str, inputs: tuple, attrs: tuple = ()) -> int:
        node = graph.nodes[i]
        k = out.add(Node(op, inputs, attrs, node.shape, node.dtype))
        back[k] = i
        return k

    for i, node in enumerate(graph.nodes):
        ins = tuple(new[j] for j in node.inputs)
        same = _same(out, node, ins)
        if same is not None:
            new[i] = same
        elif node.op in ("mul", "div") and all(out.nodes[j].op == "exp" and out.nodes[j].shape == node.shape
                                               for j in ins):
            a, b = (out.nodes[j].inputs[0] for j in ins)
            new[i] = add(i, "exp", (add(i, "add" if node.op == "mul" else "sub", (a, b)),))
        elif node.op == "sqrt" and out.nodes[ins[0]].op == "square":
            new[i] = add(i, "abs", out.nodes[ins[0]].inputs)
        elif node.op == "reshape" and out.nodes[ins[0]].op == "reshape":
            inner = out.nodes[ins[0]].inputs[0]
            new[i] = inner if out.nodes[inner].shape == node.shape else add(i, "reshape", (inner,), node.attrs)
        else:
            new[i] = add(i, node.op, ins, node.attrs)
    out.outputs = [new[o] for o in graph.outputs]
    if origin is not None:
        origin.update(back)
    return out


def _whole(out: Graph, node: Node, ins: tuple) -> int | None:
    """The tensor a concat puts back together from its slices, in order, along the concat's axis (a
    stack of every row of a matrix, once reshapes are folded), or None."""
    (axis,) = node.attrs
    parts = [out.nodes[j] for j in ins]
    if not all(p.op == "slice" for p in parts) or len({p.inputs[0] for p in parts}) != 1:
        return None
    source = parts[0].inputs[0]
    if out.nodes[source].shape != node.shape:
        return None
    at = 0
    for p in parts:
        starts, limits, strides = p.attrs
        whole_elsewhere = all(starts[a] == 0 and limits[a] == node.shape[a]
                              for a in range(len(node.shape)) if a != axis)
        if set(strides) != {1} or not whole_elsewhere or starts[axis] != at:
            return None
        at = limits[axis]
    return source if at == node.shape[axis] else None


def _same(out: Graph, node: Node, ins: tuple) -> int | None:
    """The node of `out` that `node` (its inputs `ins`, already in `out`) simplifies to, or None."""
    inner = [out.nodes[j] for j in ins]
    if len(ins) == 1:
        x = inner[0]
        if node.op == "reshape" and x.shape == node.shape:
            return ins[0]
        if (node.op, x.op) in INVERSES:
            return x.inputs[0]
        if node.op == "abs" and x.op in XLA_NONNEG:
            return ins[0]
        if node.op == "transpose" and x.op == "transpose" and \
                tuple(x.attrs[0][p] for p in node.attrs[0]) == tuple(range(len(node.shape))):
            return x.inputs[0]
        if node.op == "integer_pow" and node.attrs == (2,) and x.op == "sqrt" and \
                out.nodes[x.inputs[0]].op in XLA_NONNEG:
            return x.inputs[0]
        return None
    if node.op == "max" and len(set(ins)) == 1:
        return ins[0]
    if node.op == "concat":
        return _whole(out, node, ins)
    neutral = {"mul": 1.0, "add": 0.0}.get(node.op)
    if neutral is not None and len(ins) == 2:
        for k, other in ((0, 1), (1, 0)):
            lit = inner[k]
            if lit.op == "lit" and lit.attrs[0] == neutral and inner[other].shape == node.shape \
                    and inner[other].dtype == node.dtype:
                return ins[other]
    return None


def fusions(graph: Graph) -> dict[int, list[int]]:
    """XLA's loops of a kernel-free `graph`: root node -> its members in program order (the root last).
    Leaves, hoisted constants, duplicated views and transposes folded into a dot belong to none."""
    live, users = graph.live(), graph.users()
    results, constant = set(graph.outputs), graph.constant_nodes()
    root: dict[int, int] = {}
    for i in reversed(live):
        node = graph.nodes[i]
        if node.op in LEAVES or i in constant or _folded(graph, i, users):
            continue
        readers = set(users.get(i, ()))
        if node.op in DUPLICATED and i not in results and readers and all(r in root for r in readers):
            continue   # recomputed inside each reader's loop (see `_loop_body`)
        loop_readers = readers and all(r in root and (graph.nodes[r].op in LOOP_OPS or graph.nodes[r].op in REDUCTIONS)
                                       for r in readers)
        if node.op in LOOP_OPS and i not in results and loop_readers and len({root[r] for r in readers}) == 1:
            root[i] = root[next(iter(readers))]      # its readers are all in one loop: it is computed there
            continue
        root[i] = i
    loops: dict[int, list[int]] = {}
    for i in sorted(root):
        loops.setdefault(root[i], []).append(i)
    return loops


def _folded(graph: Graph, i: int, users: dict) -> bool:
    """A transpose XLA folds into a dot: of an operand only dots read, or of a dot's result only it reads
    (the dot is emitted with its operands swapped)."""
    node = graph.nodes[i]
    if node.op != "transpose":
        return False
    source = node.inputs[0]
    read_by_dots = bool(users.get(i)) and all(graph.nodes[r].op in MATRIX_OPS for r in users[i])
    return read_by_dots or (graph.nodes[source].op in MATRIX_OPS and users.get(source) == [i]
                            and source not in graph.outputs)


def _loop_body(graph: Graph, members: list[int], inside: set) -> tuple[tuple, list]:
    """(body, operand types) of one loop: its members, with the duplicated views they read recomputed."""
    take, stack = set(members), list(members)
    while stack:
        for j in graph.nodes[stack.pop()].inputs:
            if j not in take and j not in inside and graph.nodes[j].op in DUPLICATED:
                take.add(j)
                stack.append(j)
    order = sorted(take)
    outside = sorted({j for k in order for j in graph.nodes[k].inputs if j not in take})
    index = {j: n for n, j in enumerate(outside)}
    body = [Node("arg", (), (n,), graph.nodes[j].shape, graph.nodes[j].dtype) for n, j in enumerate(outside)]
    for k in order:
        index[k] = len(body)
        node = graph.nodes[k]
        body.append(Node(node.op, tuple(index[j] for j in node.inputs), node.attrs, node.shape, node.dtype))
    return tuple(body), [(graph.nodes[j].shape, graph.nodes[j].dtype) for j in outside]


def xla_cost(graph: Graph, target: Target) -> tuple[float, list[float]]:
    """Seconds per call of `graph` run by XLA on the cpu `target`, and its share per live node of `graph`
    (a loop's price on its root; a kernel node of `graph` gets its body's loops)."""
    unfolded: dict[int, int] = {}
    back: dict[int, int] = {}
    flat = simplified(unfused(graph, unfolded), back)
    origin = {k: unfolded[i] for k, i in back.items()}     # a node of `flat` -> the node of `graph` it stands for
    loops = fusions(flat)
    rooted = {k for members in loops.values() for k in members}   # every node some loop computes
    iterated = loop_costs(flat, loops, target)
    share: dict[int, float] = {}
    for i, members in loops.items():
        node = flat.nodes[i]
        if i in iterated:
            seconds = iterated[i]
        elif len(members) == 1 and node.op not in LOOP_OPS and node.op not in REDUCTIONS:
            ins = [(flat.nodes[j].shape, flat.nodes[j].dtype) for j in node.inputs]
            seconds = op_cost(node.op, node.attrs, ins, (node.shape, node.dtype), target)
        else:
            body, ins = _loop_body(flat, members, rooted)
            seconds = kernel_breakdown(body, ins, (node.shape, node.dtype), target).time
        share[origin[i]] = share.get(origin[i], 0.0) + seconds
    costs = [share.get(i, 0.0) for i in graph.live()]
    return sum(costs), costs
