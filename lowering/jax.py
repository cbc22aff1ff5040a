"""Lowering to JAX: a table keyed by op; the whole graph composes into one `jax.jit` callable.

Every primitive is bound through the public lax function, or with all of its params, so JAX's JVP,
transpose and batching rules apply: jax.grad, jvp, vjp, jacrev and vmap of a lowered program work as they
do on the original. Pinned effects (debug prints) are bound in the graph's order and run once per call
(in that order where they are ordered effects; unordered ones as XLA schedules them, as under jax.jit),
unless `effects=False`; the graph's hidden outputs (their token) are not returned.

Sub-terms that depend only on constants are evaluated once, when the callable is built, and passed
to the jitted body as arguments (so packing or concatenating constant weights costs nothing per call).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import numpy as np

from superopt.core.ir import Graph
from superopt.core.ops import OPS, lookup
from superopt.egraph.capture import stand_in_params
from superopt.extract.guard import check_of

# Each op's lowering is its op table entry's `jax` function (core/ops.py); every primitive is bound through
# its public lax function, or with all of its params.
_LOWER: dict[str, Callable] = {op.name: op.jax for op in OPS.values() if op.jax is not None}


def evaluate(graph: Graph, args, values: dict[int, object] | None = None, only=None,
             effects: bool = True) -> dict[int, object]:
    """Evaluate the live nodes (or the ids in `only`) in order; `values` holds already-known nodes. With
    `effects=False` pinned effects (debug prints) do not run and host callbacks call stand-ins
    (`capture.StandIn`): superopt's own runs on its own inputs. A node with a named scope (`Graph.scopes`)
    is bound in it, so profiles and HLO keep the user's `jax.named_scope` names."""
    env = dict(values or {})
    opaque_results: dict[tuple, list] = {}
    for i in (only if only is not None else graph.live()):
        if i in env:
            continue
        scope = graph.scopes.get(i)
        if scope:
            with jax.named_scope(scope):
                env[i] = _value(graph, i, env, args, opaque_results, effects)
        else:
            env[i] = _value(graph, i, env, args, opaque_results, effects)
    return env


def _value(graph: Graph, i: int, env: dict, args, opaque_results: dict, effects: bool):
    """Node `i`'s value, its operands' values being in `env`."""
    node = graph.nodes[i]
    ins = [env[j] for j in node.inputs]
    if node.op == "arg":
        return args[node.attrs[0]]
    if node.op == "const":
        return graph.consts[node.attrs[0]]
    if node.op == "lit":
        return np.asarray(node.attrs[0], dtype=np.dtype(node.dtype))
    if node.op == "kernel":  # one launch; in JAX its body is traced inline and XLA fuses it
        body = node.attrs[0]
        return evaluate(Graph(nodes=list(body), outputs=[len(body) - 1]), ins)[len(body) - 1]
    if node.op == "opaque":
        key = (node.attrs[0], node.inputs)  # one bind per opaque equation, however many outputs
        if key not in opaque_results:
            op = graph.opaque[node.attrs[0]]
            params = op.params if effects else stand_in_params(op.name, op.params)   # no user host code
            out = op.primitive.bind(*ins, **params, **({"effects": effects} if op.effectful else {}))
            opaque_results[key] = list(out) if op.primitive.multiple_results else [out]
        return opaque_results[key][node.attrs[1]]
    lower = _LOWER.get(node.op)
    if lower is None:
        raise NotImplementedError(f"superopt: no JAX lowering for op {lookup(node.op).name!r}")
    return lower(node, *ins)


def lower(graph: Graph, effects: bool = True) -> Callable:
    """A jitted callable of the flat arguments returning fn's flat results (a list; hidden outputs left
    out). With `effects=False` the program's pinned effects (debug prints) do not run and its host callbacks
    call stand-ins: the program as superopt runs it on its own inputs."""
    if graph.guard is not None:
        return _guarded(graph, effects)
    const_ids = graph.constant_nodes()
    # Constant nodes that feed computed nodes (or are outputs) are materialised once, here.
    needed = sorted({j for i in graph.live() if i not in const_ids for j in graph.nodes[i].inputs if j in const_ids}
                    | {o for o in graph.outputs if o in const_ids})
    heavy = [i for i in needed if graph.nodes[i].op != "lit"]
    const_order = [i for i in graph.live() if i in const_ids]
    consts_env = jax.jit(lambda: [evaluate(graph, (), only=const_order)[i] for i in heavy])() if heavy else []
    hoisted = dict(zip(heavy, consts_env))
    rest = [i for i in graph.live() if i not in const_ids or i in needed]

    @jax.jit
    def run(flat_args, hoisted_values):
        env = evaluate(graph, flat_args, dict(zip(heavy, hoisted_values)), only=rest, effects=effects)
        return [env[o] for o in graph.results]

    hoisted_values = [hoisted[i] for i in heavy]

    def call(*flat_args):
        return run(list(flat_args), hoisted_values)
    # With no constant hoisted, `run` compiles to what `inlined` does: superopt compares what XLA compiles for the
    # program in this form (superopt/stages.py `same_executable`), and verification's calls reuse that compile
    call.lower_inline = None if heavy else (lambda *flat: run.lower(list(flat), []))
    return call


def inlined(graph: Graph, effects: bool = True) -> Callable:
    """`graph` as one jitted function of the flat arguments with its constants inside it (not hoisted out as
    `lower` does): what XLA compiles for it compares with what it compiles for the original (`lowering/hlo.py`).
    A guarded graph has no such single program: its guard is a branch the original does not have."""
    assert graph.guard is None, "a guarded program has no single executable to compare"

    def run(*flat):
        env = evaluate(graph, list(flat), effects=effects)
        return [env[o] for o in graph.results]
    return jax.jit(run)


def _guarded(graph: Graph, effects: bool) -> Callable:
    """A guarded program: `graph` where its guard's check (extract/guard.py `check_graph`) finds every checked
    argument finite and within its bound, the guard's fallback where it does not (one `lax.cond`: only the branch
    taken runs, outside `vmap`)."""
    guard = graph.guard
    fast, slow = lower(dataclasses.replace(graph, guard=None), effects), lower(guard.fallback, effects)
    check = check_of(graph)

    @jax.jit
    def run(flat_args):
        ok = evaluate(check, flat_args)[check.outputs[0]] == 0
        return jax.lax.cond(ok, lambda xs: fast(*xs), lambda xs: slow(*xs), flat_args)

    return lambda *flat_args: run(list(flat_args))


def guard_test(graph: Graph) -> Callable | None:
    """A jitted callable of the flat arguments: which side a guarded program (`graph`, the term of a
    specialization) runs on them, True for the rewritten program, False for the fallback, by the same check its
    lowering runs (`_guarded`); None where `graph` has no guard. Built once, called on any number of sets."""
    check = check_of(graph)
    if check is None:
        return None
    test = jax.jit(lambda xs: evaluate(check, xs)[check.outputs[0]] == 0)
    return lambda *flat_args: bool(test(list(flat_args)))


def guard_passes(graph: Graph, *flat_args) -> bool | None:
    """`guard_test(graph)` on `flat_args`: the side a guarded program runs on them, None where it has no guard.
    The report says a program is guarded, not which side a call ran."""
    test = guard_test(graph)
    return None if test is None else test(*flat_args)
