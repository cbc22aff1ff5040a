"""Capture: a Python function and example arguments -> a `Graph` built from its jaxpr.

Each primitive has an entry in `_HANDLERS`: an op table entry's `capture` hook (core/ops.py), or a
structural handler below. The bodies of `jit`, `custom_jvp_call` and `custom_vjp_call` (their primal
bodies) are inlined, and any primitive without an entry becomes an `opaque` node that
lowering binds again with its original params, so every JAX program goes through unchanged in meaning.
The arguments may be abstract (`jax.ShapeDtypeStruct` leaves, weakly typed or not): `fn` is traced once.

Two kinds of equation are kept out of the optimizer's reach:

- PRNG keys. A typed key has an extended dtype (`key<fry>`), which no node can hold. The equations linked
  through key values (`random_wrap`, `random_split`, `random_fold_in`, `random_bits`, `random_unwrap`,
  jax.random's own jitted samplers such as `_normal`, kept whole so their bits are JAX's) form connected
  groups; each group becomes one opaque node (`Subprogram`): a small ClosedJaxpr whose inputs and outputs
  are ordinary arrays. Keys reach `capture` only as key data (uint32, re-wrapped inside the function);
  a key argument or result is a TypeError. Where grouping would make a cycle (a group reads a value
  computed from its own results: a key folded with its own random bits), the equations on the cycle are
  merged into the group too, so the program is never kept whole for that.
- Effects. An equation with effects and no results (`jax.debug.print`, `jax.debug.callback`, also inside an
  inlined `jit`) becomes a pinned opaque node (`Pinned`): it takes the previous effect's token as an extra
  input and returns a token (a bool scalar), and the last token is a hidden output of the graph
  (`Graph.hidden_outputs`), so rewrites can neither drop, merge nor reorder effects: each is bound once per
  call, in program order (XLA keeps that order for ordered effects, `ordered=True`; unordered ones run in
  the order XLA schedules them, exactly as under jax.jit). Lowering with `effects=False` skips them.
  Rematerialization never recomputes an opaque node (`extract/memory.py`). An equation with effects AND
  results (an `io_callback` with results, a `cond`, `while` or `scan` with a print inside) cannot be taken
  apart: `EffectfulResults` (a `KeepWhole`). By default `capture` then returns the whole program as one
  opaque node with `Captured.kept_whole` saying why; `capture(..., keep_whole=False)` raises it instead.
  A print of a key takes the key's data and wraps it again.

`without_debug_effects` gives a traced program with its output-less effects removed at every depth (the
user's program as superopt runs it on its own inputs, silently).
"""
from __future__ import annotations

import heapq
import math
import os
from dataclasses import dataclass
from typing import Any, Callable

import jax
import numpy as np
from jax.extend import core as jcore

from superopt.core import jax_compat
from superopt.core.dtypes import is_float
from superopt.core.graphs import strongly_connected
from superopt.core.ir import Graph, Node, Opaque

from superopt.core.ops import OPS, Op

# Primitives whose body is inlined, with the param holding the body.
_CALL_BODIES = {"jit": "jaxpr", "pjit": "jaxpr", "custom_jvp_call": "call_jaxpr",
                "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
                "closed_call": "call_jaxpr", "core_call": "call_jaxpr"}
# Primitives that return their operand unchanged.
_IDENTITIES = frozenset({"copy", "copy_p", "optimization_barrier_identity"})
# Where JAX's own functions live: a jitted jax.random sampler taking a key is kept whole, not inlined.
_JAX_SOURCE = os.path.join("jax", "_src", "")
# jit names of JAX's own composites that are one op of the table (Op.named_call) -> the op
_NAMED_CALLS = {op.named_call: op.name for op in OPS.values() if op.named_call}


@dataclass
class Captured:
    graph: Graph
    in_tree: Any
    out_tree: Any
    in_avals: tuple          # (shape, dtype) per flat argument
    jaxpr: Any = None        # the ClosedJaxpr of the flat function traced (the reference program is built
                             # from it: fn is not traced again)
    kept_whole: str = ""     # why the program is one opaque node the optimizer must not change, or ""
    traced: Graph | None = None   # the program as traced, where `graph` is it re-rolled (superopt/reroll.py), its
                                  # loops vectorized (superopt/loops.py) or their bodies optimized
                                  # (superopt/regions.py): what the optimized program is priced and reported against
    vectorized: str = ""          # what superopt/loops.py did to the loops of `graph`, in words
    rerolled: str = ""            # what superopt/reroll.py did to its loops over rows, in words


class KeepWhole(Exception):
    """The program cannot be taken apart without changing what it does; the message says why."""


class EffectfulResults(KeepWhole):
    """An equation has effects and results (an `io_callback` with results, a loop or branch with a print
    inside): what it returns may depend on the effect, so the program is kept whole. `primitive` names it."""

    def __init__(self, primitive: str):
        self.primitive = primitive
        super().__init__(f"its results depend on an effect ({primitive} has effects and results)")


def _extended(aval) -> bool:
    dtype = getattr(aval, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.extended)


def _key_data_aval(aval):
    """The aval of a typed key's data (uint32, the key's shape and then the implementation's)."""
    return jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(aval.shape, aval.dtype))


def _key_impl(dtype):
    """The PRNG implementation of a key dtype, as `jax.random.wrap_key_data` takes it."""
    found = []
    jax.eval_shape(lambda k: found.append(jax.random.key_impl(k)), jax.ShapeDtypeStruct((), dtype))
    return found[0]


class Subprogram:
    """Equations run as one opaque primitive (a group of PRNG key equations, or a program kept whole): bound
    by evaluating their ClosedJaxpr. Its inputs are ordinary arrays; a key result (read by a pinned effect)
    comes out as key data. `silent`, where the equations have output-less effects, is the same program
    without them: bound with `effects=False` (the Opaque is then `effectful`) it runs that one."""
    multiple_results = True

    def __init__(self, closed, name: str):
        self.closed, self.name = closed, name
        self.silent = without_debug_effects(closed) if closed.jaxpr.effects else None
        self.key_outputs = frozenset(j for j, v in enumerate(closed.jaxpr.outvars) if _extended(v.aval))

    def bind(self, *args, effects: bool = True):
        closed = self.closed if effects or self.silent is None else self.silent
        outs = jcore.jaxpr_as_fun(closed)(*args)
        return [jax.random.key_data(o) if j in self.key_outputs else o for j, o in enumerate(outs)]

    def __repr__(self) -> str:
        return self.name


class Pinned:
    """An effect with no results (a debug print or callback), pinned in program order: its last input is
    the previous effect's token, its one result a token (a bool scalar) that the next effect takes. Inputs
    that were typed keys arrive as key data and are wrapped again (`wraps`: the implementation per input,
    or None). Bound with `effects=False` (superopt's own runs on its own inputs) it only returns the token."""
    multiple_results = True

    def __init__(self, primitive, n_inputs: int, wraps: tuple = ()):
        self.primitive, self.n_inputs, self.name = primitive, n_inputs, primitive.name
        self.wraps = tuple(wraps) or (None,) * n_inputs

    def bind(self, *args, effects: bool = True, **params):
        if effects:
            ins = [x if impl is None else jax.random.wrap_key_data(x, impl=impl)
                   for x, impl in zip(args[:self.n_inputs], self.wraps)]
            self.primitive.bind(*ins, **params)
        return [np.bool_(False)]

    def __repr__(self) -> str:
        return self.name


def dtype_name(dtype) -> str:
    return str(np.dtype(dtype))


class _Builder:
    def __init__(self) -> None:
        self.graph = Graph()
        self.const_ids: dict[int, int] = {}
        self.effect: int | None = None   # the last pinned effect's token node
        self.scope = ""                  # the named scope of the equation being walked (`Graph.scopes`)

    def node(self, op: str, inputs, attrs, aval_or_shape, dtype=None) -> int:
        if dtype is None:
            shape, dtype = tuple(aval_or_shape.shape), dtype_name(aval_or_shape.dtype)
        else:
            shape, dtype = tuple(aval_or_shape), dtype_name(dtype)
        i = self.graph.add(Node(op, tuple(inputs), tuple(attrs), shape, dtype))
        if self.scope and op not in ("arg", "lit", "const"):
            self.graph.scopes[i] = self.scope
        return i

    def const(self, value, dtype=None) -> int:
        arr = np.asarray(value, dtype=dtype)
        if arr.ndim == 0 and arr.dtype.kind in "fiub":
            if arr.dtype.kind == "f" and arr == 0 and np.signbit(arr):
                # egglog's f64 holds -0.0 and 0.0 as one value, so the literal -0.0 would merge with 0.0
                # (x * -0.0 and x * 0.0 would become one term): it enters the e-graph as neg(0.0)
                return self.node("neg", (self.node("lit", (), (0.0,), (), arr.dtype),), (), (), arr.dtype)
            return self.node("lit", (), (arr.item(),), (), arr.dtype)
        key = id(value)
        if key not in self.const_ids:
            self.graph.consts.append(arr)
            self.const_ids[key] = self.node("const", (), (len(self.graph.consts) - 1,), arr.shape, arr.dtype)
        return self.const_ids[key]

    def outer_value(self, aval, effect: bool) -> int:
        """A value of the caller's trace that `fn` reads without taking it as an argument. An effect may read
        one: `jax.debug.breakpoint()` hands its debugger the traced locals of every frame on the stack,
        the caller's (and superopt's own, above `fn`) among them. The program is specialized apart from
        the caller's trace, so there the effect sees zeros of that shape and dtype; the frames of `fn`
        itself hold their own values. Anything else that reads one is refused, naming it."""
        if not effect:
            raise TypeError(f"superopt: fn reads a traced value of its caller ({aval.str_short()}) that is not "
                            "one of its arguments; pass it as an argument")
        return self.const(np.zeros(aval.shape, aval.dtype))

    def walk(self, closed, in_ids: list[int]) -> list[int]:
        """The nodes of `closed`'s results, its arguments being the nodes `in_ids`: call bodies inlined,
        key equations grouped, effects pinned (module doc); the equations run in an order that respects
        every data dependency and keeps the effects in program order."""
        flat = _flatten(closed)
        eqns, outs, key_consts = flat.eqns, flat.outs, flat.key_consts
        env: dict[Any, int] = dict(zip(closed.jaxpr.invars, in_ids))

        def read(v, effect: bool = False) -> int:
            if isinstance(v, jcore.Literal):
                return self.const(v.val, v.aval.dtype)
            if v not in env:
                if v in flat.values:        # a constant, or a literal an inlined call was passed
                    value = flat.values[v]
                    if isinstance(value, jax.core.Tracer):
                        return self.outer_value(v.aval, effect)
                    env[v] = read(value) if isinstance(value, jcore.Literal) else self.const(value)
                elif v in key_consts:       # a key constant an effect reads: as its key data
                    env[v] = self.const(np.asarray(jax.random.key_data(key_consts[v])))
            return env[v]

        readers: dict[Any, list[int]] = {}
        for k, e in enumerate(eqns):
            for v in e.invars:
                if not isinstance(v, jcore.Literal):
                    readers.setdefault(v, []).append(k)
        for v in outs:
            if not isinstance(v, jcore.Literal):
                readers.setdefault(v, []).append(-1)
        for unit, members in _plan(eqns):
            for k in members:
                for v in flat.before.get(k, ()):
                    if not isinstance(flat.values.get(v), jax.core.Tracer):   # read where it is used
                        read(v)
            if unit == "eqn":
                eqn = eqns[members[0]]
                effect = bool(eqn.effects) and not eqn.outvars
                for var, i in zip(eqn.outvars, self.equation(eqn, [read(v, effect) for v in eqn.invars])):
                    env[var] = i
            else:
                inputs, outputs, program = _group_program(members, eqns, key_consts, readers)
                env.update(zip(outputs, self.subprogram(program, [read(v) for v in inputs])))
        for v in flat.before.get(len(eqns), ()):
            if not isinstance(flat.values.get(v), jax.core.Tracer):
                read(v)
        for v in outs:
            if not isinstance(v, jcore.Literal) and _extended(v.aval):
                raise TypeError("superopt: the function returns a PRNG key; superopt() returns keys as their "
                                "key data (call the function through superopt, or return jax.random.key_data)")
        return [read(v) for v in outs]

    def subprogram(self, closed, ins: list[int], name: str | None = None) -> list[int]:
        if name is None:
            names = set()
            for e in closed.jaxpr.eqns:
                if e.primitive.name.startswith("random_"):
                    names.add(e.primitive.name.removeprefix("random_"))
                elif e.primitive.name in _CALL_BODIES and isinstance(e.params.get("name"), str):
                    names.add(e.params["name"].lstrip("_"))
            name = f"prng[{','.join(sorted(names))}]"
        program = Subprogram(closed, name)
        self.graph.opaque.append(Opaque(program, {}, len(closed.jaxpr.outvars), effectful=program.silent is not None))
        k = len(self.graph.opaque) - 1
        avals = [_key_data_aval(v.aval) if _extended(v.aval) else v.aval for v in closed.jaxpr.outvars]
        return [self.node("opaque", ins, (k, j), aval) for j, aval in enumerate(avals)]

    def pinned(self, eqn, ins: list[int]) -> list[int]:
        """An effect with no results, after the previous one (module doc)."""
        if self.effect is None:
            self.effect = self.node("lit", (), (False,), (), np.bool_)
        wraps = tuple(_key_impl(v.aval.dtype) if _extended(v.aval) else None for v in eqn.invars)
        self.graph.opaque.append(Opaque(Pinned(eqn.primitive, len(ins), wraps), dict(eqn.params), 1,
                                        effectful=True))
        k = len(self.graph.opaque) - 1
        self.effect = self.node("opaque", [*ins, self.effect], (k, 0), (), np.bool_)
        return []

    def equation(self, eqn, ins: list[int]) -> list[int]:
        self.scope = str(getattr(eqn.source_info, "name_stack", "") or "")
        name = eqn.primitive.name
        if eqn.effects:
            if eqn.outvars:
                raise EffectfulResults(name)
            return self.pinned(eqn, ins)
        if name in _IDENTITIES and len(ins) == 1:
            return ins
        handler = _HANDLERS.get(name)
        if handler is not None:
            result = handler(self, eqn, ins)
            if result is not None:
                return [result]
        return self.opaque(eqn, ins)

    def opaque(self, eqn, ins: list[int]) -> list[int]:
        self.graph.opaque.append(Opaque(eqn.primitive, dict(eqn.params), len(eqn.outvars)))
        k = len(self.graph.opaque) - 1
        return [self.node("opaque", ins, (k, j), v.aval) for j, v in enumerate(eqn.outvars)]


def _join(*effects) -> frozenset:
    return frozenset().union(*effects)


def _touches_key(eqn) -> bool:
    return any(_extended(v.aval) for v in (*eqn.invars, *eqn.outvars))


def _expanded(eqn):
    """A primitive newer JAX releases emit where older ones emitted primitives superopt models (a tanh
    derivative's `one_minus_square`, say), as a ClosedJaxpr of those: what JAX's lowering of it computes
    (core/jax_compat.py); None for any other equation."""
    avals = [v.aval for v in eqn.invars]
    fn = jax_compat.expansion(eqn.primitive.name, eqn.params, avals)
    if fn is None or len(eqn.outvars) != 1:
        return None
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in avals]
    closed = jax.make_jaxpr(fn)(*args)
    (got,), want = closed.out_avals, eqn.outvars[0].aval
    return closed if (got.shape, got.dtype) == (want.shape, want.dtype) else None


def _jax_own(closed) -> bool:
    """Whether a call's body is JAX's own code (jnp.sinc, jax.random's samplers), not the user's."""
    info = getattr(closed.jaxpr, "debug_info", None)
    return _JAX_SOURCE in (getattr(info, "func_src_info", None) or "")


def _named_op(eqn) -> str | None:
    """The op table's op a call of JAX's own composite stands for (`Op.named_call`: `jit[name=sinc]` in
    jax's source), where it takes and gives one float array of one type; else None."""
    name = eqn.primitive.name
    op = _NAMED_CALLS.get(eqn.params.get("name")) if name in ("jit", "pjit") else None
    if op is None or len(eqn.invars) != 1 or len(eqn.outvars) != 1:
        return None
    (x,), (y,) = eqn.invars, eqn.outvars
    if (x.aval.shape, x.aval.dtype) != (y.aval.shape, y.aval.dtype) or not is_float(x.aval.dtype) \
            or np.dtype(x.aval.dtype).kind == "c":
        return None
    body = eqn.params.get(_CALL_BODIES[name])
    closed = body if isinstance(body, jcore.ClosedJaxpr) else jcore.ClosedJaxpr(body, ())
    return op if _jax_own(closed) else None


def _inlined_body(eqn):
    """The body (a ClosedJaxpr) of a call to inline, or None: a call of JAX's own code that takes or
    returns a key (jax.random's samplers) stays one equation, so its random bits are computed as JAX does,
    and so does one of JAX's composites that is one op of the table (`_named_op`). A primitive with an
    expansion (`_expanded`) is inlined as that."""
    name = eqn.primitive.name
    if name not in _CALL_BODIES:
        return _expanded(eqn)
    body = eqn.params.get(_CALL_BODIES[name])
    if body is None or _named_op(eqn) is not None:
        return None
    closed = body if isinstance(body, jcore.ClosedJaxpr) else jcore.ClosedJaxpr(body, ())
    if _touches_key(eqn) and _jax_own(closed):
        return None
    return closed


def _platform_branch(platforms) -> int:
    """The index `platform_index` gives on the platform JAX runs programs on: the first entry naming it,
    else the entry None (every other platform)."""
    here = jax.default_backend()
    names = {here} | ({"cuda", "rocm"} if here == "gpu" else set())
    for k, entry in enumerate(platforms):
        if entry is not None and names & set(entry):
            return k
    return next(k for k, entry in enumerate(platforms) if entry is None)


@dataclass
class _Flat:
    """A program with its call bodies inlined (`_flatten`)."""
    eqns: list                # equations, in program order, each with variables of its own
    values: dict              # variable -> its value (an array, or a literal passed to an inlined call)
    key_consts: dict          # variable -> the value of a typed-key constant
    before: dict              # equation index (len(eqns): the end) -> variables in `values` to bind before it
    outs: list                # the program's results: variables or literals


def _flatten(closed) -> _Flat:
    """`closed` with every call body inlined (`_inlined_body`): each inlined equation gets variables of its
    own, so a body called twice is two sets of equations. A literal argument of an inlined call and the
    constants of a body become variables with a value, bound where the call was (so the Graph's nodes come in
    the order a walk of the nested program would make them)."""
    flat = _Flat([], {}, {}, {}, [])
    pending: list = []

    def bind(var, value) -> None:
        if _extended(var.aval):
            flat.key_consts[var] = value
        else:
            flat.values[var] = value
            pending.append(var)

    def inline(jaxpr, values, env: dict) -> list:
        def atom(v):
            return v if isinstance(v, jcore.Literal) else env[v]
        for var, value in zip(jaxpr.constvars, values):
            env[var] = fresh = jcore.Var(var.aval)
            bind(fresh, value)
        for eqn in jaxpr.eqns:
            ins = [atom(v) for v in eqn.invars]
            if eqn.primitive.name == "platform_index" and len(eqn.outvars) == 1:
                # Where JAX's own code picks an implementation per platform (jnp.diagonal, say), the branch
                # of the platform the program runs on is the program.
                env[eqn.outvars[0]] = jcore.Literal(_platform_branch(eqn.params["platforms"]),
                                                    eqn.outvars[0].aval)
                continue
            body = _inlined_body(eqn)
            if body is None and eqn.primitive.name == "cond" and isinstance(ins[0], jcore.Literal):
                body, ins = eqn.params["branches"][int(ins[0].val)], ins[1:]
            if body is not None:
                for k, v in enumerate(ins):
                    if isinstance(v, jcore.Literal):
                        ins[k] = jcore.Var(v.aval)
                        bind(ins[k], v)
                results = inline(body.jaxpr, body.consts, dict(zip(body.jaxpr.invars, ins)))
            else:
                results = [v if isinstance(v, jcore.DropVar) else jcore.Var(v.aval) for v in eqn.outvars]
                if pending:
                    flat.before[len(flat.eqns)] = pending[:]
                    pending.clear()
                flat.eqns.append(eqn.replace(invars=ins, outvars=results))
            for var, result in zip(eqn.outvars, results):
                if not isinstance(var, jcore.DropVar):
                    env[var] = result
        return [atom(v) for v in jaxpr.outvars]

    flat.outs = inline(closed.jaxpr, closed.consts, {v: v for v in closed.jaxpr.invars})
    if pending:
        flat.before[len(flat.eqns)] = pending[:]
    return flat


def _plan(eqns) -> list[tuple[str, list[int]]]:
    """The order to emit the equations in: ("eqn", [k]) for an equation on its own, ("group", members) for
    a group run as one opaque node (equation indices in program order).

    The equations linked through typed-key values form the groups. As nodes, groups and the other
    equations depend on each other through the values they read, and each effect on the effect before it;
    where that makes a cycle (a group reads a value computed from its own results), everything on the
    cycle (each strongly connected component) becomes one group. The emission order is topological,
    earliest equation first among the ready ones. Raises EffectfulResults for an equation with effects
    and results."""
    n = len(eqns)
    for e in eqns:
        if e.effects and e.outvars:
            raise EffectfulResults(e.primitive.name)
    parent = list(range(n))

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    def union(a: int, b: int) -> None:
        a, b = root(a), root(b)
        if a != b:
            parent[max(a, b)] = min(a, b)    # the root is a unit's earliest equation

    keyed = {k for k, e in enumerate(eqns) if not e.effects and _touches_key(e)}
    producer = {v: k for k, e in enumerate(eqns) for v in e.outvars if not isinstance(v, jcore.DropVar)}
    reads = [[producer[v] for v in e.invars if not isinstance(v, jcore.Literal) and v in producer] for e in eqns]
    for k in keyed:     # a key read from the equation that computed it: one group
        for v in eqns[k].invars:
            if not isinstance(v, jcore.Literal) and _extended(v.aval) and v in producer:
                union(producer[v], k)
    effects = [k for k, e in enumerate(eqns) if e.effects]

    def edges() -> dict[int, set[int]]:
        out: dict[int, set[int]] = {}
        for k in range(n):
            for p in reads[k]:
                if root(p) != root(k):
                    out.setdefault(root(p), set()).add(root(k))
        for a, b in zip(effects, effects[1:]):
            if root(a) != root(b):
                out.setdefault(root(a), set()).add(root(b))
        return out

    units = sorted({root(k) for k in range(n)})
    for component in strongly_connected(units, edges()):
        for k in component[1:]:
            union(component[0], k)
    members: dict[int, list[int]] = {}
    for k in range(n):
        members.setdefault(root(k), []).append(k)
    for group in members.values():
        if len(group) > 1 and any(eqns[k].effects for k in group):
            raise KeepWhole("an effect is on a cycle with a PRNG key computation")
    graph = edges()
    waiting = {u: 0 for u in members}
    for u, vs in graph.items():
        for v in vs:
            waiting[v] += 1
    ready = [u for u, w in waiting.items() if w == 0]
    heapq.heapify(ready)
    plan = []
    while ready:
        u = heapq.heappop(ready)
        group = members[u]
        plan.append(("group" if len(group) > 1 or group[0] in keyed else "eqn", group))
        for v in graph.get(u, ()):
            waiting[v] -= 1
            if waiting[v] == 0:
                heapq.heappush(ready, v)
    assert len(plan) == len(members), "capture: the equations' dependencies are cyclic"
    return plan


def _group_program(members: list[int], eqns: list, key_consts: dict, readers: dict) -> tuple[list, list, Any]:
    """(outer variables read, outer variables written, the ClosedJaxpr) of a group of equations (indices
    in program order). Its results are the values it computes that are not keys, and the keys read outside
    it (by effects, which take them as key data); typed-key constants it reads become its own constants.
    `readers`: variable -> the equations that read it (-1: the program's results)."""
    group = [eqns[k] for k in members]
    inside = set(members)
    produced = {v for e in group for v in e.outvars}
    inputs, consts = [], []
    for e in group:
        for v in e.invars:
            if isinstance(v, jcore.Literal) or v in produced or v in inputs or v in consts:
                continue
            (consts if v in key_consts else inputs).append(v)
    outputs = [v for e in group for v in e.outvars if not isinstance(v, jcore.DropVar)
               and (not _extended(v.aval) or any(r not in inside for r in readers.get(v, ())))]
    info = jcore.DebugInfo("superopt", "PRNG key equations of the captured program",
                           tuple(f"in{k}" for k in range(len(inputs))), tuple(f"out{k}" for k in range(len(outputs))))
    jaxpr = jcore.Jaxpr(consts, inputs, outputs, group, _join(*(e.effects for e in group)), info)
    return inputs, outputs, jcore.ClosedJaxpr(jaxpr, [key_consts[v] for v in consts])


# ---- handlers: one per primitive family; each returns the new node id, or None to go opaque ----

def _out(eqn):
    return eqn.outvars[0].aval


def _integer_pow(b, eqn, ins):
    return b.node("integer_pow", ins, (int(eqn.params["y"]),), _out(eqn))


def _select_n(b, eqn, ins):
    if len(ins) != 3:
        return None
    return b.node("select", ins, (), _out(eqn))


def _transpose(b, eqn, ins):
    return b.node("transpose", ins, (tuple(int(p) for p in eqn.params["permutation"]),), _out(eqn))


def _reshape(b, eqn, ins):
    if eqn.params.get("dimensions") is not None:
        return None
    return b.node("reshape", ins, (), _out(eqn))


def _squeeze(b, eqn, ins):
    return b.node("reshape", ins, (), _out(eqn))


def _broadcast(b, eqn, ins):
    if len(ins) != 1:  # dynamic shapes
        return None
    return b.node("broadcast", ins, (tuple(int(d) for d in eqn.params["broadcast_dimensions"]),), _out(eqn))


def _convert(b, eqn, ins):
    src = b.graph.nodes[ins[0]]
    if src.dtype == dtype_name(_out(eqn).dtype):
        return ins[0]  # a weak-type change only
    return b.node("convert", ins, (), _out(eqn))


def _concat(b, eqn, ins):
    return b.node("concat", ins, (int(eqn.params["dimension"]),), _out(eqn))


def _stack(b, eqn, ins):
    """stack = each operand with a unit axis inserted, concatenated along it."""
    axis, out = int(eqn.params["axis"]), _out(eqn)
    unit = [b.node("reshape", (i,), (), out.shape[:axis] + (1,) + out.shape[axis + 1:], out.dtype) for i in ins]
    return b.node("concat", unit, (axis,), out)


def _add_any(b, eqn, ins):
    """add_any (autodiff's sum of cotangents) is an elementwise add."""
    return b.node("add", ins, (), _out(eqn))


def _slice(b, eqn, ins):
    start = tuple(int(s) for s in eqn.params["start_indices"])
    strides = eqn.params.get("strides") or (1,) * len(start)
    limit = tuple(int(s) for s in eqn.params["limit_indices"])
    return b.node("slice", ins, (start, limit, tuple(int(s) for s in strides)), _out(eqn))


def _pad(b, eqn, ins):
    config = eqn.params["padding_config"]
    lo, hi, interior = (tuple(int(c[k]) for c in config) for k in range(3))
    return b.node("pad", ins, (lo, hi, interior), _out(eqn))


def _iota(b, eqn, ins):
    if ins:
        return None
    return b.node("iota", (), (int(eqn.params["dimension"]),), _out(eqn))


def _conv(b, eqn, ins):
    params = tuple(sorted(eqn.params.items()))
    try:
        hash(params)
    except TypeError:
        return None
    return b.node("conv", ins, (params,), _out(eqn))


def _dot_general(b, eqn, ins):
    """dot_general in canonical form: transposes and reshapes around one batched `matmul`."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lc, rc, lb, rb = (tuple(int(d) for d in x) for x in (lc, rc, lb, rb))
    lhs, rhs = (b.graph.nodes[i] for i in ins)
    out = _out(eqn)
    ls, rs = lhs.shape, rhs.shape
    if not lb and lc == (len(ls) - 1,) and len(ls) >= 2 and len(rs) == 2 and rc == (0,):
        return b.node("matmul", ins, (), out)  # x @ W: numpy matmul with a rank-2 rhs
    lf = tuple(d for d in range(len(ls)) if d not in lc and d not in lb)
    rf = tuple(d for d in range(len(rs)) if d not in rc and d not in rb)
    batch = tuple(ls[d] for d in lb)
    m, k, n = math.prod(ls[d] for d in lf), math.prod(ls[d] for d in lc), math.prod(rs[d] for d in rf)

    def arrange(i, shape, perm, target):
        node = b.graph.nodes[i]
        if perm != tuple(range(len(shape))):
            i = b.node("transpose", (i,), (perm,), tuple(shape[p] for p in perm), node.dtype)
        if tuple(b.graph.nodes[i].shape) != target:
            i = b.node("reshape", (i,), (), target, node.dtype)
        return i

    a = arrange(ins[0], ls, lb + lf + lc, batch + (m, k))
    c = arrange(ins[1], rs, rb + rc + rf, batch + (k, n))
    mm = b.node("matmul", (a, c), (), batch + (m, n), out.dtype)
    if batch + (m, n) != tuple(out.shape):
        mm = b.node("reshape", (mm,), (), out)
    return mm


def _gather(b, eqn, ins):
    """A gather of single elements at positions known when the program is built, in an arithmetic
    progression of the operand's flat order (jnp.diagonal, a strided pick): a view of the flattened operand
    sliced with a stride. Any other gather stays opaque."""
    from superopt.core.reference import constant_values
    dn, operand, indices = eqn.params["dimension_numbers"], b.graph.nodes[ins[0]], ins[1]
    rank = len(operand.shape)
    if tuple(eqn.params["slice_sizes"]) != (1,) * rank or tuple(dn.offset_dims) or \
            tuple(dn.collapsed_slice_dims) != tuple(range(rank)) or tuple(dn.start_index_map) != tuple(range(rank)) \
            or getattr(dn, "operand_batching_dims", ()) or not operand.shape:
        return None
    if indices not in b.graph.constant_nodes_of(indices):
        return None
    where = constant_values(b.graph, [indices])[0].reshape(-1, rank)
    if where.shape[0] < 2 or (where < 0).any() or (where >= np.asarray(operand.shape)).any():
        return None
    flat = np.ravel_multi_index(tuple(where.T), operand.shape)
    step = int(flat[1] - flat[0])
    if step < 1 or not np.array_equal(flat, flat[0] + step * np.arange(len(flat))):
        return None
    n = math.prod(operand.shape)
    line = b.node("reshape", (ins[0],), (), (n,), operand.dtype)
    picked = b.node("slice", (line,), ((int(flat[0]),), (int(flat[-1]) + 1,), (step,)), (len(flat),), operand.dtype)
    out = _out(eqn)
    return picked if tuple(out.shape) == (len(flat),) else b.node("reshape", (picked,), (), out)


def _dynamic_slice(b, eqn, ins):
    """A dynamic_slice whose start indices are known when the program is built (a loop written out, an
    index computed from literals) is a slice, its start clamped into the operand as dynamic_slice clamps it.
    Any other stays opaque."""
    from superopt.core.reference import constant_values
    operand, starts = b.graph.nodes[ins[0]], list(ins[1:])
    if not starts or any(i not in b.graph.constant_nodes_of(i) for i in starts):
        return None
    values = constant_values(b.graph, starts)
    sizes = tuple(int(n) for n in eqn.params["slice_sizes"])
    start = tuple(int(min(max(int(np.asarray(v)), 0), dim - size))
                  for v, dim, size in zip(values, operand.shape, sizes))
    limit = tuple(s + n for s, n in zip(start, sizes))
    return b.node("slice", (ins[0],), (start, limit, (1,) * len(start)), _out(eqn))


def _named_call(b, eqn, ins):
    """A call `_named_op` kept whole: its op (None, opaque, for any other call left uncalled)."""
    op = _named_op(eqn)
    return None if op is None else b.node(op, ins, (), _out(eqn))


def _from_table(op: Op) -> Callable:
    """The handler of a primitive an op table entry captures: its `capture` hook names the op and attrs."""
    def handler(b, eqn, ins):
        found = op.capture(eqn.params)
        return None if found is None else b.node(found[0], ins, found[1], _out(eqn))
    return handler


_HANDLERS: dict[str, Callable] = {
    **{primitive: _from_table(op) for op in OPS.values() if op.capture for primitive in op.captures},
    "jit": _named_call, "pjit": _named_call,
    "integer_pow": _integer_pow, "select_n": _select_n, "transpose": _transpose, "reshape": _reshape,
    "squeeze": _squeeze, "broadcast_in_dim": _broadcast, "convert_element_type": _convert,
    "concatenate": _concat, "stack": _stack, "add_any": _add_any, "slice": _slice, "pad": _pad, "iota": _iota,
    "conv_general_dilated": _conv, "dot_general": _dot_general, "gather": _gather,
    "dynamic_slice": _dynamic_slice,
}




def _check_leaf(path, leaf) -> None:
    where = jax.tree_util.keystr(path) or "(root)"
    if isinstance(leaf, (jax.Array, np.ndarray, np.generic, int, float, bool, complex, jax.ShapeDtypeStruct)):
        if _extended(leaf):
            raise TypeError(f"superopt: argument {where} is a PRNG key; capture takes keys as their key data "
                            "(jax.random.key_data), re-wrapped inside the function (superopt() does this)")
        return
    raise TypeError(
        f"superopt: argument {where} is a {type(leaf).__name__}, "
        "not an array; pass arrays (or pytrees of arrays) and close over everything else")


def capture(fn: Callable, args: tuple, keep_whole: bool = True) -> Captured:
    """Trace `fn(*args)` to a jaxpr and walk it into a Graph (outputs flattened, as the jaxpr has them).

    `args` is a tuple of pytrees whose leaves are arrays, Python scalars or abstract values
    (`jax.ShapeDtypeStruct`, weakly typed or not); `fn` is traced once, here, and `Captured.jaxpr` is what
    it traced. A program that cannot be taken apart (`KeepWhole`: `EffectfulResults`) is, with
    `keep_whole=True`, one opaque node running the whole traced program, `Captured.kept_whole` saying why;
    with `keep_whole=False` the exception propagates."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(args)[0]:
        _check_leaf(path, leaf)
    flat, in_tree = jax.tree_util.tree_flatten(args)
    out_tree_box = []

    def flat_fn(*flat_args):
        out = fn(*jax.tree_util.tree_unflatten(in_tree, flat_args))
        leaves, tree = jax.tree_util.tree_flatten(out)
        out_tree_box.append(tree)
        return leaves

    closed = jax.make_jaxpr(flat_fn)(*flat)
    in_avals = tuple((tuple(v.aval.shape), dtype_name(v.aval.dtype)) for v in closed.jaxpr.invars)

    def start() -> tuple[_Builder, list[int]]:
        builder = _Builder()
        arg_ids = [builder.node("arg", (), (i,), v.aval) for i, v in enumerate(closed.jaxpr.invars)]
        builder.graph.n_args = len(arg_ids)
        return builder, arg_ids

    builder, arg_ids = start()
    kept_whole = ""
    try:
        builder.graph.outputs = builder.walk(closed, arg_ids)
        if builder.effect is not None:     # the effects' last token: a hidden output keeps them all
            builder.graph.outputs.append(builder.effect)
            builder.graph.hidden_outputs = 1
    except KeepWhole as exc:
        if not keep_whole:
            raise
        kept_whole = str(exc)
        builder, arg_ids = start()
        builder.graph.outputs = builder.subprogram(closed, arg_ids, name="program")
    return Captured(builder.graph, in_tree, out_tree_box[-1], in_avals, closed, kept_whole)


# ---- the program without its debug effects ----

def _removable(eqn) -> bool:
    """An equation with effects and no results whose effects touch no input (a print or a callback, not a
    state update through a reference: those effects name an input, `input_index`)."""
    return bool(eqn.effects) and not eqn.outvars and not any(hasattr(e, "input_index") for e in eqn.effects)


# The calls that carry a derivative rule of their own (jax.custom_jvp, jax.custom_vjp).
CUSTOM_JVP, CUSTOM_VJP = frozenset({"custom_jvp_call"}), frozenset({"custom_vjp_call", "custom_vjp_call_jaxpr"})


def custom_calls(closed) -> frozenset:
    """The names of the custom-derivative primitives (`CUSTOM_JVP`, `CUSTOM_VJP`) called at any depth of
    `closed` (a ClosedJaxpr, or None): capture inlines their primal bodies, so the program they were in must
    keep their rules some other way (superopt/backends.py, `with_custom_rules`)."""
    found, stack = set(), [closed.jaxpr] if closed is not None else []
    while stack:
        for eqn in stack.pop().eqns:
            if eqn.primitive.name in CUSTOM_JVP | CUSTOM_VJP:
                found.add(eqn.primitive.name)
            stack.extend(jcore.jaxprs_in_params(eqn.params))
    return frozenset(found)


def without_debug_effects(closed):
    """A copy of `closed` (a ClosedJaxpr) with every equation that has effects and no results (debug prints
    and callbacks; not state updates) removed at every depth: in the jaxprs that params hold (jit's `jaxpr`,
    cond's `branches`, while's `cond_jaxpr` and `body_jaxpr`, scan's `jaxpr`, custom_jvp/vjp's bodies),
    also inside tuples, with the effects of every equation and jaxpr recomputed. The user's program as
    superopt runs it on its own inputs, silently. `closed` itself when it has no effects."""
    if not closed.jaxpr.effects:
        return closed
    return jcore.ClosedJaxpr(_strip_jaxpr(closed.jaxpr, {}), closed.consts)


def _strip_jaxpr(jaxpr, memo: dict):
    if id(jaxpr) in memo:
        return memo[id(jaxpr)][1]
    if not jaxpr.effects:
        stripped = jaxpr
    else:
        eqns = []
        for eqn in jaxpr.eqns:
            if _removable(eqn):
                continue
            if eqn.effects:
                params = {name: _strip_param(value, memo) for name, value in eqn.params.items()}
                old = [j for value in eqn.params.values() for j in _jaxprs(value)]
                new = [j for value in params.values() for j in _jaxprs(value)]
                # An effect stays if it names an input, if a body still has it, or if it is the equation's
                # own (no body had it).
                effects = {e for e in eqn.effects if hasattr(e, "input_index") or any(e in j.effects for j in new)
                           or not any(e in j.effects for j in old)}
                eqn = eqn.replace(params=params, effects=_join(effects))
            eqns.append(eqn)
        remaining = _join(*(e.effects for e in eqns))
        effects = {e for e in jaxpr.effects if hasattr(e, "input_index") or e in remaining}
        stripped = jaxpr.replace(eqns=eqns, effects=_join(effects))
    memo[id(jaxpr)] = (jaxpr, stripped)     # the original is kept alive: its id is not reused
    return stripped


def _strip_param(value, memo: dict):
    if isinstance(value, jcore.ClosedJaxpr):
        if not value.jaxpr.effects:
            return value
        return jcore.ClosedJaxpr(_strip_jaxpr(value.jaxpr, memo), value.consts)
    if isinstance(value, jcore.Jaxpr):
        return _strip_jaxpr(value, memo)
    if isinstance(value, (tuple, list)):
        return type(value)(_strip_param(v, memo) for v in value)
    return value


def _jaxprs(value) -> list:
    if isinstance(value, jcore.ClosedJaxpr):
        return [value.jaxpr]
    if isinstance(value, jcore.Jaxpr):
        return [value]
    if isinstance(value, (tuple, list)):
        return [j for v in value for j in _jaxprs(v)]
    return []


# ---- host callbacks on superopt's own inputs ----

# The primitives that call the user's host code and return what it computes. (`io_callback` with results keeps
# its program whole; `jax.debug.callback` has no results and is left out: `without_debug_effects`.)
HOST_CALLS = frozenset({"pure_callback"})


class StandIn:
    """What a `jax.pure_callback` calls where superopt runs a program on inputs of its own (verification, the
    backends' checks): never the user's host function, which sees only the user's values (a library's
    runtime check would fire on superopt's infinities; a host function may count its calls or write a file).
    Each result is the operand of the same shape, cast to the result's dtype (its non-finite values zeroed
    for an integer result), or, where no operand has that shape, a fixed ramp: a function of the callback's
    operands, so the programs around the callback are compared, and the callback's operands through the
    results that pass them on."""

    def __init__(self, result_avals):
        self.result_avals = tuple(result_avals)

    def __call__(self, *operands):
        out = []
        for k, aval in enumerate(self.result_avals):
            dtype = np.dtype(aval.dtype)
            same = [np.asarray(x) for x in operands if np.shape(x) == tuple(aval.shape)]
            if same:
                value = same[k % len(same)]
                if dtype.kind in "iub":
                    value = np.nan_to_num(value.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
                out.append(np.asarray(value).astype(dtype))
            else:
                size = math.prod(aval.shape)
                out.append((np.arange(size) % 7 / 8).reshape(aval.shape).astype(dtype))
        return out


def stand_in_params(primitive_name: str, params: dict) -> dict:
    """An equation's params with every host callback in it, or in the jaxprs it holds, a `StandIn`."""
    if primitive_name in HOST_CALLS:
        return {**params, "callback": StandIn(params["result_avals"])}
    if not any(calls_host(j) for j in jcore.jaxprs_in_params(params)):
        return params
    return {name: _in_jaxprs(value, lambda j: _stand_ins(j, {})) for name, value in params.items()}


def with_stand_ins(closed):
    """A copy of `closed` (a ClosedJaxpr) whose host callbacks, at every depth, call a `StandIn`; `closed`
    itself where it makes none."""
    if not calls_host(closed):
        return closed
    return jcore.ClosedJaxpr(_stand_ins(closed.jaxpr, {}), closed.consts)


def calls_host(closed) -> bool:
    """Whether `closed` (a ClosedJaxpr or Jaxpr) calls host code for results (`HOST_CALLS`) at any depth."""
    return any(_eqn_calls_host(eqn) for eqn in getattr(closed, "jaxpr", closed).eqns)


def graph_calls_host(graph: Graph) -> bool:
    """Whether one of `graph`'s opaque equations calls host code for results, in itself or in a body."""
    return any(op.name in HOST_CALLS or any(calls_host(j) for j in jcore.jaxprs_in_params(op.params))
               for op in graph.opaque)


def _eqn_calls_host(eqn) -> bool:
    return eqn.primitive.name in HOST_CALLS or any(calls_host(j) for j in jcore.jaxprs_in_params(eqn.params))


def _stand_ins(jaxpr, memo: dict):
    if id(jaxpr) not in memo:
        eqns = [eqn.replace(params=stand_in_params(eqn.primitive.name, eqn.params)) if _eqn_calls_host(eqn)
                else eqn for eqn in jaxpr.eqns]
        memo[id(jaxpr)] = (jaxpr, jaxpr.replace(eqns=eqns))   # the original kept alive: its id is not reused
    return memo[id(jaxpr)][1]


def _in_jaxprs(value, rewrite):
    """`value` (a param) with `rewrite` applied to each Jaxpr in it, in ClosedJaxprs, tuples and lists."""
    if isinstance(value, jcore.ClosedJaxpr):
        return jcore.ClosedJaxpr(rewrite(value.jaxpr), value.consts)
    if isinstance(value, jcore.Jaxpr):
        return rewrite(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_in_jaxprs(v, rewrite) for v in value)
    return value
