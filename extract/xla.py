"""A whole program on a CPU, priced as XLA runs it: in XLA's own fusions.

On the cpu target every program superopt returns runs through XLA, which fuses by itself: a chain of
elementwise ops, views, slices and broadcasts becomes one loop, and a reduction takes the loop that
produces its operand. Pricing each op as a kernel of its own (`extraction.program_cost` on other
targets) would say that fusing such a chain by hand saves its intermediates' bytes and launches, when XLA
saves them for the original too; a rewritten program must be cheaper than the original as XLA runs it.

The fusions, as XLA's CPU pipeline forms them (a model, not its code):
- an op of `LOOP_OPS` joins the loop of its one reader where that reader is a loop op or a reduction, and
  the op is not a program result (a value read twice is written once and read back);
- a reduction ends a loop (its readers start another);
- a broadcast, reshape or iota read by several loops is recomputed in each (`DUPLICATED`);
- a transpose read only by matmuls or convolutions costs nothing: the dot reads its operand either way; so
  does a transpose that alone reads a dot's result (XLA emits the dot with its operands swapped);
- every other op (a matmul, a convolution, a scan, an opaque op) is a kernel of its own.
Each loop is priced as one kernel of the cpu model (`cost.kernel_breakdown`): what it reads from outside
and writes, its arithmetic, one launch. Constant sub-terms, hoisted when the program is built, are free.
"""
from __future__ import annotations

from superopt.core.ir import Graph, Node, unfused
from superopt.core.ops import ELEMENTWISE, MATRIX_OPS, REDUCTIONS
from superopt.extract.cost import kernel_breakdown, op_cost
from superopt.extract.target import Target

LOOP_OPS = ELEMENTWISE | {"broadcast", "reshape", "transpose", "slice", "concat", "pad", "iota", "lit"}
DUPLICATED = frozenset({"broadcast", "reshape", "iota", "lit"})
LEAVES = frozenset({"arg", "const"})


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
        if node.op in LOOP_OPS and i not in results and len(readers) == 1:
            (reader,) = readers
            if reader in root and (graph.nodes[reader].op in LOOP_OPS or graph.nodes[reader].op in REDUCTIONS):
                root[i] = root[reader]
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
    origin: dict[int, int] = {}
    flat = unfused(graph, origin)
    loops = fusions(flat)
    rooted = {k for members in loops.values() for k in members}   # every node some loop computes
    share: dict[int, float] = {}
    for i, members in loops.items():
        node = flat.nodes[i]
        if len(members) == 1 and node.op not in LOOP_OPS and node.op not in REDUCTIONS:
            ins = [(flat.nodes[j].shape, flat.nodes[j].dtype) for j in node.inputs]
            seconds = op_cost(node.op, node.attrs, ins, (node.shape, node.dtype), target)
        else:
            body, ins = _loop_body(flat, members, rooted)
            seconds = kernel_breakdown(body, ins, (node.shape, node.dtype), target).time
        share[origin[i]] = share.get(origin[i], 0.0) + seconds
    costs = [share.get(i, 0.0) for i in graph.live()]
    return sum(costs), costs
