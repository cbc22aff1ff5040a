"""The price of a loop: trip count x its body's price, plus the target's overhead per iteration (and of a
cond: its costliest branch).

Capture keeps a `lax.scan` (and a `lax.fori_loop` with static bounds, which JAX traces to a scan) and a
`lax.while_loop` as one opaque node (`Graph.opaque`): its params hold the body. Priced as an opaque op, a
loop costs what one kernel moving its operands costs (a stencil time loop measured at 8.2 ms was priced at
15 us; 6.9 ms here), and a rewrite outside the loop looked several percent better than it was. Here a loop
is priced as

    trips x (body + condition) + loop steps x per-iteration overhead

- The body (and a while loop's condition) is its jaxpr captured into a `Graph` (`egraph.capture`) and priced
  by `extraction.program_cost` itself, so a loop inside a body is priced the same way (nested loops
  multiply) and on a CPU the body is priced in XLA's own fusions. Bodies are captured once per jaxpr
  (`_graphs`) and priced once per jaxpr and target (`_costs`): program_cost runs many times per
  optimization on graphs sharing one table of opaque primitives.
- Inside a body, a kernel costs `Target.loop_launch_overhead` instead of `launch_overhead` (on a CPU, XLA
  calls a loop body's kernels directly, 5 to 8 ns each; on a GPU or NPU each is a real launch),
  and, where the body reads a row of a carried array or writes one (`dynamic_slice`, `gather`,
  `dynamic_update_slice`, `scatter`), it moves that row, not the array: XLA updates a loop's carried
  buffers in place. Priced as opaque ops, a row loop's slice and update would move the whole array every
  iteration.
- What a body computes from its loop invariants alone (its consts, the carries it passes on unchanged) is
  priced once, not per iteration: XLA moves it out of the loop (its while-loop invariant code motion; a
  `fori_loop` computing `h @ (w @ w.T)` ran at the price of one `w @ w.T` and 16 `h @ g`), as superopt's
  loop pass does before the search (superopt/loops.py).
- `scan`: trips = `length` (a `reverse` scan is the same); `unroll` = k runs k iterations per loop step, so
  the overhead is paid ceil(length / k) times (`unroll=True`: none). Per iteration it pays
  `Target.loop_iteration_overhead`.
- `while`: the trip count is not known before it runs; it is priced as `WHILE_TRIPS` iterations (a declared
  estimate) of body and condition, each paying `Target.while_iteration_overhead` (on a GPU the condition's
  result goes back to the host every iteration). `loop_notes` says so, for the report.
- `cond` (`lax.cond`, `lax.switch`; inside a loop body most often) is priced as its costliest branch plus
  one `while_iteration_overhead`: its branch index is read as a while loop's condition is.

A body that cannot be captured (an effect with results inside it) is priced per iteration as one kernel
moving its inputs and outputs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from superopt.core import jax_compat
from superopt.core.ir import Graph, Node, Opaque
from superopt.extract.cost import op_cost
from superopt.extract.models.registry import model_of
from superopt.extract.target import Target

# A while loop's trip count is unknown until it runs: it is priced as this many iterations.
WHILE_TRIPS = 100
LOOPS = frozenset({"scan", "while"})
PRICED = LOOPS | {"cond"}      # the opaque primitives priced by their bodies
# Reads of a row of an operand (operand first), and writes of one (operand, then the update: scatter's
# update is its third operand, a dynamic_update_slice's its second).
ROW_READS = frozenset({"dynamic_slice", "gather"})
ROW_WRITES = {"dynamic_update_slice": 1, "scatter": 2, "scatter-add": 2, "scatter_add": 2, "scatter-mul": 2,
              "scatter_mul": 2, "scatter-min": 2, "scatter_min": 2, "scatter-max": 2, "scatter_max": 2}
MEMO_ENTRIES = 4096       # past it the tables start again

Type = tuple[tuple[int, ...], str]


@dataclass(frozen=True)
class LoopPrice:
    """What one loop costs per call, and what that is made of."""
    kind: str                 # "scan", "while" or "cond"
    trips: int                # iterations priced
    estimated: bool           # the trip count is `WHILE_TRIPS`, not the loop's own
    body: float               # seconds of one iteration's body (and condition)
    overhead: float           # seconds of the loop's own bookkeeping, all iterations
    total: float


def is_loop(graph: Graph, node: Node) -> bool:
    """Whether `node` is a result of a loop or a cond (`PRICED`)."""
    return node.op == "opaque" and graph.opaque[node.attrs[0]].name in PRICED


def loop_costs(graph: Graph, nodes, target: Target) -> dict[int, float]:
    """Node id -> seconds, for the loop nodes among `nodes` (ids of `graph`): a loop's whole price on the
    first of its result nodes listed, 0 on the others (one loop is one opaque entry with a node per result)."""
    out: dict[int, float] = {}
    seen: set[int] = set()
    for i in nodes:
        node = graph.nodes[i]
        if not is_loop(graph, node):
            continue
        k = node.attrs[0]
        out[i] = 0.0 if k in seen else loop_price(graph.opaque[k], target).total
        seen.add(k)
    return out


def loop_price(loop: Opaque, target: Target) -> LoopPrice:
    """The price of one `scan`, `while` or `cond` opaque entry on `target` (module doc)."""
    p = loop.params
    inside = _inside(target)
    if loop.name == "cond":
        body = max(sum(_body_cost(branch, inside)) for branch in p["branches"])
        overhead = _figure(target.while_iteration_overhead, target)
        return LoopPrice("cond", 1, False, body, overhead, body + overhead)
    if loop.name == "scan":
        trips = int(p["length"])
        unroll = p.get("unroll", 1)
        steps = 0 if unroll is True else math.ceil(trips / max(1, int(unroll)))
        body, once = _body_cost(p["jaxpr"], inside, _invariant_args(p["jaxpr"], *jax_compat.scan_counts(p)))
        overhead = steps * _figure(target.loop_iteration_overhead, target)
        return LoopPrice("scan", trips, False, body, overhead, once + trips * body + overhead)
    trips = WHILE_TRIPS
    nc = p["body_nconsts"]
    body, once = _body_cost(p["body_jaxpr"], inside, _invariant_args(p["body_jaxpr"], nc,
                                                                     len(p["body_jaxpr"].jaxpr.invars) - nc))
    condition, cond_once = _body_cost(p["cond_jaxpr"], inside, frozenset(range(p["cond_nconsts"])))
    overhead = trips * _figure(target.while_iteration_overhead, target)
    body += condition
    return LoopPrice("while", trips, True, body, overhead, once + cond_once + trips * body + overhead)


def _invariant_args(closed, nconsts: int, ncarry: int) -> frozenset:
    """The body's arguments that are the same in every iteration: its consts, and the carries it passes on
    unchanged."""
    jaxpr = closed.jaxpr
    return frozenset(range(nconsts)) | frozenset(nconsts + j for j in range(ncarry)
                                                 if jaxpr.outvars[j] is jaxpr.invars[nconsts + j])


def loop_notes(graph: Graph) -> list[str]:
    """One line per while loop of `graph` (at any depth: inside a loop's body too) whose trip count the
    price assumes, for the report."""
    notes: list[str] = []
    _notes(graph, notes, "")
    return notes


def _notes(graph: Graph, notes: list[str], where: str) -> None:
    done: set[int] = set()
    for i in graph.live():
        node = graph.nodes[i]
        if not is_loop(graph, node) or node.attrs[0] in done:
            continue
        k = node.attrs[0]
        done.add(k)
        loop = graph.opaque[k]
        if loop.name == "while":
            carried = loop.params["body_jaxpr"].jaxpr.invars[loop.params["body_nconsts"]:]
            carry = ", ".join(f"{d}{list(s)}" for s, d in _types(carried))
            notes.append(f"while loop{where} (carry {carry}): trip count unknown, priced as {WHILE_TRIPS} "
                         "iterations")
            bodies = (loop.params["body_jaxpr"], loop.params["cond_jaxpr"])
        else:
            bodies = loop.params["branches"] if loop.name == "cond" else (loop.params["jaxpr"],)
        for closed in bodies:
            body = _body_graph(closed)
            if body is not None:
                _notes(body, notes, f" inside a {loop.name}{'' if loop.name == 'cond' else ' loop'}{where}")


# ---- bodies ----

_graphs: dict[int, tuple[object, Graph | None]] = {}      # id(ClosedJaxpr) -> (it, its captured body)
_costs: dict[tuple[int, int], tuple[object, Target, float]] = {}
_inner: dict[int, tuple[Target, Target]] = {}


def _figure(value: float | None, target: Target) -> float:
    """A loop figure of `target`, `launch_overhead` where the target declares none."""
    return target.launch_overhead if value is None else value


def _inside(target: Target) -> Target:
    """`target` as a loop body's kernels see it: each launch costs `loop_launch_overhead`. One object per
    target, so that the kernel prices memoized per target object (`cost.op_breakdown`) are shared."""
    found = _inner.get(id(target))
    if found is not None and found[0] is target:
        return found[1]
    launch = _figure(target.loop_launch_overhead, target)
    inner = target if launch == target.launch_overhead else replace(target, launch_overhead=launch)
    if len(_inner) >= MEMO_ENTRIES:
        _inner.clear()
    _inner[id(target)] = (target, inner)
    _inner[id(inner)] = (inner, inner)
    return inner


def _types(variables) -> list[Type]:
    from superopt.egraph.capture import dtype_name
    return [(tuple(v.aval.shape), dtype_name(v.aval.dtype)) for v in variables]


def _body_graph(closed) -> Graph | None:
    """The body `closed` (a ClosedJaxpr) captured into a Graph, or None where it cannot be (an effect with
    results inside it, a key-typed carry)."""
    found = _graphs.get(id(closed))
    if found is not None and found[0] is closed:
        return found[1]
    import jax
    from superopt.egraph.capture import capture
    avals = tuple(jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=getattr(v.aval, "weak_type", False))
                  for v in closed.jaxpr.invars)
    try:
        graph = capture(lambda *a: jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *a), avals,
                        keep_whole=False).graph
    except Exception:   # a body capture cannot take apart: priced as one kernel (`_body_cost`)
        graph = None
    if len(_graphs) >= MEMO_ENTRIES:
        _graphs.clear()
    _graphs[id(closed)] = (closed, graph)
    return graph


def _body_cost(closed, inside: Target, invariant: frozenset = frozenset()) -> tuple[float, float]:
    """Seconds of one run of the body `closed` on the loop body's target `inside`: (what each iteration
    computes, what only reads the `invariant` arguments, which XLA computes once, before the loop: its
    while-loop invariant code motion). Memoized."""
    key = (id(closed), id(inside), invariant)
    found = _costs.get(key)
    if found is not None and found[0] is closed and found[1] is inside:
        return found[2]
    graph = _body_graph(closed)
    if graph is None:
        ins, outs = _types(closed.jaxpr.invars), _types(closed.jaxpr.outvars)
        seconds = (op_cost("opaque", (0, 0), ins, outs[0] if outs else ((), "float32"), inside), 0.0)
    else:
        seconds = _in_place_cost(graph, inside, invariant)
    if len(_costs) >= MEMO_ENTRIES:
        _costs.clear()
    _costs[key] = (closed, inside, seconds)
    return seconds


def _invariant_nodes(graph: Graph, invariant: frozenset) -> set[int]:
    """The live nodes of a body computed from its `invariant` arguments, constants and literals alone."""
    out: set[int] = set()
    for i in graph.live():
        node = graph.nodes[i]
        if node.op == "arg":
            fixed = node.attrs[0] in invariant
        elif node.op == "opaque":
            fixed = bool(node.inputs) and all(j in out for j in node.inputs) and not graph.opaque[node.attrs[0]].effectful
        else:
            fixed = all(j in out for j in node.inputs)
        if fixed:
            out.add(i)
    return out


def _in_place_cost(graph: Graph, inside: Target, invariant: frozenset = frozenset()) -> tuple[float, float]:
    """`program_cost` of a body as (per iteration, once: `_body_cost`), with each row read or write priced as
    moving the row (module doc): such an opaque op is a kernel of its own in either path of program_cost,
    so its price is replaced whole. Where the model does not price fusions (`KindModel.fuses`: program_cost
    prices each op as a kernel) a scalar op is free: XLA computes a body's scalar index arithmetic (a fori_loop's `i < 0 ? i + n : i`) in the kernels
    that read it."""
    from superopt.extract.extraction import program_cost
    total, costs = program_cost(graph, inside)
    fixed = _invariant_nodes(graph, invariant) if invariant else set()
    once = 0.0
    for i, cost in zip(graph.live(), costs):
        node = graph.nodes[i]
        if cost == 0.0:
            continue
        if i in fixed:
            total -= cost
            once += cost
            continue
        if not model_of(inside).fuses and not node.shape and node.op not in ("opaque", "kernel"):
            total -= cost
            continue
        if node.op != "opaque":
            continue
        name = graph.opaque[node.attrs[0]].name
        ins = [(graph.nodes[j].shape, graph.nodes[j].dtype) for j in node.inputs]
        if name in ROW_READS:
            row = (node.shape, node.dtype)
            moved = [row] + ins[1:]
        elif name in ROW_WRITES and len(ins) > ROW_WRITES[name]:
            row = ins[ROW_WRITES[name]]
            moved = [t for n, t in enumerate(ins) if n != 0]
        else:
            continue
        total += op_cost("opaque", node.attrs, moved, row, inside) - cost
    return total, once
