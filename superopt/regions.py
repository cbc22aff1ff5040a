"""Loop and branch bodies searched as programs of their own: the body of every `lax.scan` (a `fori_loop` with
static bounds traces to one), the cond and body of a `lax.while_loop` and each branch of a `lax.cond` or
`lax.switch` that the loop pass (superopt/loops.py) left in place.

A body is a closed jaxpr of fixed argument and result types: a program like any other. `optimized_bodies`
hands each one to the pipeline (the `optimize` callback: capture, the same rule sets, extraction under the
same target and numerics mode, verification against the body as traced, the persistent cache under the
body's own key), and puts the program it returns back in the primitive's params, traced to a jaxpr of the
body's types. The loop stays the same `lax` construct: the same trip count, carries, `reverse`, branch
index; only what one iteration (one branch) computes changed, so every rule set rewrites inside loops,
nested ones too (a body's own loops are bodies of its own optimization). A body that no rule improves is
left as it was, and what went in stays bound to the user's primitive.

What crosses the loop's boundary (work moved out of the body, iterations batched, a short loop written out)
is the loop pass's, which runs first; the body pass sees only what it left.

Numerics: each iteration computes what the body as traced computes, within the contract of the mode
(README.md, "Numerics contract"); the whole program is verified against the user's as well.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
from superopt.core.ir import Graph
from superopt.loops import inlined_calls

# The params of each primitive that hold a body, and the smallest body (in equations) worth a search: a body of
# one or two equations (a running sum's add, a counter's compare) has nothing a rule could improve.
BODIES = {"scan": ("jaxpr",), "while": ("cond_jaxpr", "body_jaxpr"), "cond": ("branches",)}
MIN_EQUATIONS = 3


def avals_of(closed) -> tuple:
    """The body's argument types, as the pipeline captures a program at (weak types kept: a loop's carry
    must come back with the type it went in with)."""
    return tuple(jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type)
                 for v in closed.jaxpr.invars)


def as_function(closed) -> Callable:
    """The body as a function of its flat arguments returning its flat results, what the pipeline optimizes."""
    def body(*args):
        return list(jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *args))
    return body


def retraced(program: Callable, closed):
    """`program` (an optimized body) traced to a closed jaxpr of `closed`'s types, or None where its results'
    types differ (a body's results are a loop's carries)."""
    new = inlined_calls(jax.make_jaxpr(program)(*avals_of(closed)))   # no jit call: its shardings are not data
    old_out, new_out = closed.out_avals, new.out_avals
    if len(old_out) != len(new_out) or any((a.shape, a.dtype) != (b.shape, b.dtype) for a, b in zip(old_out, new_out)):
        return None
    return new


def worth_searching(closed) -> bool:
    """At least `MIN_EQUATIONS` equations that read or write an array (a while loop's condition on its counter
    and a scalar error, a counter's increment, have nothing a rule could make cheaper), and no effect."""
    return _equations(closed.jaxpr) >= MIN_EQUATIONS and not closed.jaxpr.effects


def _on_arrays(e) -> bool:
    return any(getattr(getattr(v, "aval", None), "shape", ()) not in ((), (1,)) for v in (*e.invars, *e.outvars))


def _equations(jaxpr) -> int:
    """The equations of `jaxpr` on arrays (`worth_searching`), those of the bodies of its loops and branches too."""
    n = 0
    for e in jaxpr.eqns:
        n += _on_arrays(e)
        for key in BODIES.get(e.primitive.name, ()):
            value = e.params[key]
            n += sum(_equations(b.jaxpr) for b in (value if isinstance(value, (tuple, list)) else [value]))
    return n


@dataclasses.dataclass
class Searched:
    """What the body pass did to a program: the program (itself where no body changed), the primitive of each
    loop or branch whose body changed ("scan", "while", "cond"), how many bodies were searched, and the rules
    that fired in them (changed or not)."""
    graph: Graph
    changed: list
    searched: int
    fired: list

    def note(self) -> str:
        """The report's words, "" where no body was searched."""
        if not self.searched:
            return ""
        counts = {n: self.changed.count(n) for n in dict.fromkeys(self.changed)}
        head = ("bodies optimized: " + ", ".join(f"{c} {n}" for n, c in counts.items()) if self.changed else
                f"bodies searched: {self.searched}, none made cheaper")
        return head + (f" (rules fired in them: {', '.join(sorted(self.fired))})" if self.fired else "")


def optimized_bodies(graph: Graph, optimize: Callable) -> Searched:
    """`graph` with each loop or branch body that `optimize` improves replaced (`Searched`). `optimize(closed)`
    returns a closed jaxpr of the same types, or None where it keeps the body, and the names of the rules
    that fired."""
    ops, changed_ops, fired = list(graph.opaque), [], []
    done: dict[int, tuple] = {}   # a body shared by several loops (a loop written out by the loop pass) is searched once

    def search(body):
        if id(body) not in done:
            done[id(body)] = (body, optimize(body) if worth_searching(body) else None)
        return done[id(body)][1] or (None, ())

    for k, op in enumerate(graph.opaque):
        keys = BODIES.get(op.name)
        if keys is None or op.effectful:
            continue
        params, changed = dict(op.params), False
        for key in keys:
            value = params[key]
            bodies = list(value) if isinstance(value, (tuple, list)) else [value]
            new = []
            for body in bodies:
                better, rules = search(body)
                new.append(better or body)
                fired += [r for r in rules if r not in fired]
            if any(n is not b for n, b in zip(new, bodies)):
                params[key] = tuple(new) if isinstance(value, (tuple, list)) else new[0]
                changed = True
        if changed:
            ops[k] = dataclasses.replace(op, params=params)
            changed_ops.append(op.name)
    searched = sum(result is not None for _, result in done.values())
    return Searched(dataclasses.replace(graph, opaque=ops) if changed_ops else graph, changed_ops, searched, fired)
