"""Loop vectorization: a `lax.scan` (a `fori_loop` with static bounds traces to one) whose iterations do not
depend on each other becomes one batched computation, before the search.

A scan's body maps (consts, carry, xs[k]) to (carry', ys[k]). Each carry component is classified from the
body's jaxpr:

- a **counter**: `carry' = carry + 1` on an integer whose initial value is known (a literal or constant of
  the program): at iteration k it is `init + k` (`init + L - 1 - k` for a reversed scan);
- **invariant**: `carry' = carry`;
- **accumulated**: `carry' = carry + g`, where the carry is read by nothing else: the final value is
  `init + sum_k g_k`, the same terms added in another order (README.md, "Numerics contract");
- **row-written**: `carry' = carry.at[i].set(u)` (a scatter or a dynamic_update_slice of one row along
  axis 0), where i is computed from the counters alone, takes L consecutive in-range values (increasing or
  decreasing by one),
  and the carry is otherwise read only at row i, before it is written: each iteration reads the row as it
  was before the loop and writes only its own, so the final value is the rows `init[:lo]`, the stacked
  updates (in row order), `init[lo + L:]`.

Anything else (a carry read whole, a value carried from one iteration to the next, effects) leaves the
loop as it is (its body is searched on its own: superopt/regions.py), unless it has at most `UNROLL` iterations
of a short body (`UNROLL_EQUATIONS`): then it is written out, iteration after
iteration (the same ops in the same order), so that algebra across iterations can fire (a Horner
recurrence becomes one fused polynomial), or, where some of its costly work reads no carry, split: that work
done for all iterations ahead, batched, and a loop of the rest (`_split`).

Where every carry is one of these, the body runs once, under `jax.vmap` over the iteration index: the
counters as the vector of their values, xs as they are, each row read of a loop-invariant array or of a
row-written carry at the counter's row as the slice of those rows (not a gather), and everything
else shared. What comes back is the term language's own ops on whole tensors, captured again, so every
rule set and the cost model see the loop's work as a program, and the pipeline prices it against the loop
as traced (a loop costs its trip count times its body plus the target's per-iteration overhead).

Batching computes each element from the same operands with the same ops (elementwise results are equal;
a reduction adds the same terms in an order XLA chooses); an accumulation's sum is re-ordered. The program
is verified against the user's loop like any other candidate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from superopt.core import jax_compat
from superopt.core.ir import Graph, Node, postorder

MAX_PASSES = 3          # nested loops: the batched body of an outer loop may hold an inner loop to vectorize
UNROLL = 8              # a loop of at most this many iterations that does not vectorize is written out,
UNROLL_EQUATIONS = 128  # where its iterations written out come to at most this many equations: a long body (a
#                         layer of a scanned stack) is searched once as a body instead (superopt/regions.py)


class _Unsupported(Exception):
    """The loop's iterations may depend on each other, or the analysis does not cover its body."""


@dataclass
class _RowRead:
    """A read of row `rows[k]` (iteration k) of `source` (an invar of the body) along axis 0."""
    source: object
    rows: np.ndarray


@dataclass
class _Segment:
    """A sum, at iteration k, of the elements of `data` (None: of ones, a count) whose `ids` equal the
    counter, `first + k`: row k of one segment sum of `data` by `ids - first`."""
    ids: object
    data: object
    dtype: object
    first: int


@dataclass
class _Plan:
    body: object                 # the body's ClosedJaxpr
    nc: int
    nk: int
    length: int
    counters: dict               # carry index -> counter values per iteration (np.ndarray)
    invariant: set
    accumulated: dict            # carry index -> the var added to it (g)
    written: dict                # carry index -> (the update var, the row written per iteration)
    reads: dict                  # eqn id -> _RowRead: contiguous row reads, given as batched rows
    skip: set                    # eqn ids not evaluated (the writers and the accumulations)
    hoisted: list                # the equations that read only loop invariants: evaluated once, not batched
    segments: dict               # eqn id -> _Segment: masked sums by the counter, as one segment sum


def _literal(atom):
    return isinstance(atom, jcore.Literal)


def _is_one(atom) -> bool:
    return _literal(atom) and np.ndim(atom.val) == 0 and atom.val == 1


def _plan(params: dict, known: list) -> _Plan:
    """How the scan with these params vectorizes, given the values of its operands that are known (None
    where not), or _Unsupported."""
    (nc, nk), length = jax_compat.scan_counts(params), params["length"]
    if params["jaxpr"].jaxpr.effects or length < 1:
        raise _Unsupported("effects")
    closed = inlined_calls(params["jaxpr"])
    jaxpr = closed.jaxpr
    kvars, kouts = jaxpr.invars[nc:nc + nk], jaxpr.outvars[:nk]
    producer = {v: e for e in jaxpr.eqns for v in e.outvars}
    uses: dict = {}
    for e in jaxpr.eqns:
        for a in e.invars:
            if not _literal(a):
                uses.setdefault(a, []).append(e)
    def carried_only(out) -> bool:
        """The body's new value of a carry is read by nothing in the body and is not also a ys."""
        return out not in uses and sum(o is out for o in jaxpr.outvars) == 1

    counters = _counters(jaxpr, producer, nc, nk, known, length, params["reverse"])
    scalars = _counter_scalars(jaxpr, {kvars[j]: vals for j, vals in counters.items()}, length)

    invariant, accumulated, written, reads, skip = set(), {}, {}, {}, set()
    state = {}
    for j, (v, out) in enumerate(zip(kvars, kouts)):
        if j in counters:
            continue
        if out is v:
            invariant.add(j)
            continue
        state[v] = j
        e = producer.get(out)
        if e is None:
            raise _Unsupported(f"carry {j} is replaced")
        if e.primitive.name == "add":
            mine = [a for a in e.invars if _carried(a, v, producer, uses, e) is not None]
            if len(mine) == 1 and len(e.invars) == 2 and carried_only(out):
                accumulated[j] = next(a for a in e.invars if a is not mine[0])
                skip.add(id(e))
                if mine[0] is not v:
                    skip.add(id(producer[mine[0]]))
                continue
            raise _Unsupported(f"carry {j} is added to itself in another way")
        rows = _written_rows(e, scalars) if e.invars[0] is v else None
        if rows is None or not carried_only(out):
            raise _Unsupported(f"carry {j}: {e.primitive.name} is not one row at the counter")
        if not _contiguous(rows, v.aval.shape[0]):   # consecutive rows are distinct: none is written twice
            raise _Unsupported("rows written out of order, twice, or outside the carry")
        written[j] = (e.invars[2] if e.primitive.name == "scatter" else e.invars[1], rows)
        skip.add(id(e))
        for use in uses.get(v, []):
            if use is e:
                continue
            read = _row_read(use, scalars)
            if read is None or not np.array_equal(read, rows):
                raise _Unsupported(f"carry {j} is read other than at the row it writes")
            reads[id(use)] = _RowRead(v, read)
    # every other use of a carried state is a dependence between iterations
    for v, j in state.items():
        if any(o is v for o in jaxpr.outvars):
            raise _Unsupported(f"carry {j} is a ys")
        for use in uses.get(v, []):
            if id(use) not in skip and id(use) not in reads:
                raise _Unsupported(f"carry {j} is read by {use.primitive.name}")
    # contiguous row reads of loop invariants (consts, invariant carries) are slices, not gathers
    invariant_vars = set(jaxpr.invars[:nc]) | {kvars[j] for j in invariant}
    reads.update(_slice_reads((e for e in jaxpr.eqns if id(e) not in reads), invariant_vars, scalars))
    hoisted, invariant_vars = _invariant_equations(jaxpr, invariant_vars)
    segments = {id(e): seg for e in jaxpr.eqns if id(e) not in skip
                for seg in [_masked_sum(e, producer, scalars, invariant_vars)] if seg is not None}
    return _Plan(closed, nc, nk, length, counters, invariant, accumulated, written, reads, skip, hoisted, segments)


def _counters(jaxpr, producer: dict, nc: int, nk: int, known: list, length: int, reverse: bool) -> dict:
    """Carry index -> its value at each iteration, in the order of xs (an array of `length`), for each carry
    that counts: `carry' = carry + 1` on an integer scalar whose initial value is known."""
    steps = np.arange(length)
    order = steps[::-1] if reverse else steps
    kvars, kouts = jaxpr.invars[nc:nc + nk], jaxpr.outvars[:nk]
    counters = {}
    for j, (v, out) in enumerate(zip(kvars, kouts)):
        e = producer.get(out)
        if (e is not None and e.primitive.name == "add" and np.issubdtype(v.aval.dtype, np.integer)
                and v.aval.shape == () and known[nc + j] is not None
                and ((e.invars[0] is v and _is_one(e.invars[1])) or (e.invars[1] is v and _is_one(e.invars[0])))):
            counters[j] = int(np.asarray(known[nc + j])) + order
    return counters


_CALLS = ("pjit", "jit", "closed_call", "core_call")


def inlined_calls(closed):
    """`closed` traced again with its `jit` calls (jnp.where is one) inlined, so the patterns above see the
    equations inside them."""
    if not any(e.primitive.name in _CALLS for e in closed.jaxpr.eqns):
        return closed

    def run(jaxpr, consts, *args):
        env = dict(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, args))
        read = lambda a: a.val if _literal(a) else env[a]   # noqa: E731
        for e in jaxpr.eqns:
            body = e.params.get("jaxpr") if e.primitive.name in _CALLS else None
            if body is not None:
                inner = body if isinstance(body, jcore.ClosedJaxpr) else jcore.ClosedJaxpr(body, ())
                out = run(inner.jaxpr, inner.consts, *map(read, e.invars))
            else:
                out = _bind(e, list(map(read, e.invars)))
                out = out if e.primitive.multiple_results else [out]
            env.update(zip(e.outvars, out))
        return [read(v) for v in jaxpr.outvars]

    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type) for v in closed.jaxpr.invars]
    return jax.make_jaxpr(lambda *a: run(closed.jaxpr, closed.consts, *a))(*avals)


def _invariant_equations(jaxpr, invariant: set) -> tuple[list, set]:
    """The equations whose operands are all loop invariants (or computed from them), in order, and every
    invariant var: loop-invariant code, evaluated once outside the batched body."""
    invariant = set(invariant) | set(jaxpr.constvars)
    hoisted = []
    for e in jaxpr.eqns:
        if e.effects or not all(_literal(a) or a in invariant for a in e.invars):
            continue
        hoisted.append(e)
        invariant.update(e.outvars)
    return hoisted, invariant


def _zero(atom, producer: dict) -> bool:
    """A literal zero, or a broadcast or conversion of one."""
    while not _literal(atom):
        e = producer.get(atom)
        if e is None or e.primitive.name not in ("broadcast_in_dim", "convert_element_type"):
            return False
        atom = e.invars[0]
    return bool(np.all(np.asarray(atom.val) == 0))


def _masked_sum(e, producer: dict, scalars: dict, invariant: set):
    """A `_Segment` where `e` sums, over the axis of an invariant index vector `ids`, an invariant array where
    `ids == counter` and zero elsewhere (`jnp.sum(jnp.where(ids == k, data, 0), axis=0)`), or counts where
    `ids == counter` (`jnp.sum(ids == k)`); else None."""
    if e.primitive.name != "reduce_sum" or tuple(e.params["axes"]) != (0,):
        return None
    p = producer.get(e.invars[0])
    if p is None:
        return None
    if p.primitive.name == "convert_element_type":
        pred, data = p.invars[0], None
    elif p.primitive.name == "select_n" and len(p.invars) == 3 and _zero(p.invars[1], producer):
        pred, data = p.invars[0], p.invars[2]
        if data not in invariant:
            return None
    else:
        return None
    b = producer.get(pred)
    while b is not None and b.primitive.name == "broadcast_in_dim" and b.params["broadcast_dimensions"][:1] == (0,):
        pred, b = b.invars[0], producer.get(b.invars[0])   # the mask spread over the data's other axes
    if b is None or b.primitive.name != "eq" or len(pred.aval.shape) != 1:
        return None
    ids, counter = b.invars if b.invars[1] in scalars else b.invars[::-1]
    if _literal(ids) or ids not in invariant or counter not in scalars or ids.aval.shape != pred.aval.shape:
        return None
    values = np.asarray(scalars[counter]).reshape(-1)
    if values.size < 1 or not np.all(np.diff(values) == 1):
        return None
    if data is not None and np.shape(data.aval)[:1] != ids.aval.shape:
        return None
    return _Segment(ids, data, e.outvars[0].aval.dtype, int(values[0]))


def _carried(atom, v, producer: dict, uses: dict, add):
    """`atom` where it is the carry `v`, or a same-dtype convert of it that only `add` reads (JAX converts a
    weakly typed carry before adding), else None."""
    if atom is v:
        return v
    e = producer.get(atom)
    if (e is not None and e.primitive.name == "convert_element_type" and e.invars[0] is v
            and e.params["new_dtype"] == v.aval.dtype and uses.get(atom) == [add]):
        return atom
    return None


def _contiguous(rows: np.ndarray, size: int) -> bool:
    """The rows are consecutive, increasing or decreasing by one, and within a tensor of `size` rows."""
    step = np.diff(rows)
    return bool(np.all(step == 1) or np.all(step == -1)) and rows.min() >= 0 and rows.max() < size


def _in_order(values, rows: np.ndarray):
    """`values` (one per iteration, stacked) as the rows min(rows).. they are, in the tensor's order."""
    return values[::-1] if len(rows) > 1 and rows[1] < rows[0] else values


def _counter_scalars(jaxpr, counters: dict, length: int) -> dict:
    """The concrete value per iteration (an array of `length`) of each scalar the body computes from its
    counters and literals alone: the row indices of its reads and writes."""
    known = {v: np.asarray(vals, v.aval.dtype) for v, vals in counters.items()}
    for e in jaxpr.eqns:
        if (not e.invars or any(isinstance(p, (jcore.Jaxpr, jcore.ClosedJaxpr)) for p in e.params.values())
                or not all(_literal(a) or a in known for a in e.invars)
                or any(o.aval.shape not in ((), (1,)) for o in e.outvars)):
            continue
        cols = [jnp.broadcast_to(jnp.asarray(a.val), (length,) + np.shape(a.val)) if _literal(a) else known[a]
                for a in e.invars]
        try:
            with jax.core.eval_context():
                out = jax.vmap(lambda *xs: _bind(e, list(xs)))(*cols)
        except Exception:   # noqa: BLE001 - a scalar op this evaluation cannot run is simply not known
            continue
        for o, val in zip(e.outvars, out if e.primitive.multiple_results else [out]):
            known[o] = np.asarray(val)
    return known


def _index_rows(indices, scalars: dict):
    """The per-iteration values of a start index list whose first entry is counter-derived and whose others
    are all zero, else None."""
    first, rest = indices[0], indices[1:]
    if _literal(first) or first not in scalars:
        return None
    for a in rest:
        value = a.val if _literal(a) else scalars.get(a)
        if value is None or np.any(np.asarray(value) != 0):
            return None
    return np.asarray(scalars[first]).reshape(-1)


def _row_read(e, scalars: dict):
    """The rows a `dynamic_slice` of one full row along axis 0 reads, per iteration, or None."""
    if e.primitive.name != "dynamic_slice":
        return None
    shape, sizes = e.invars[0].aval.shape, e.params["slice_sizes"]
    if len(shape) < 1 or sizes[0] != 1 or tuple(sizes[1:]) != tuple(shape[1:]):
        return None
    return _index_rows(e.invars[1:], scalars)


def _slice_reads(eqns, invariant: set, scalars: dict) -> dict:
    """Eqn id -> `_RowRead` for each of `eqns` that reads one row of a loop invariant at contiguous rows, one
    per iteration: given as the slice of those rows (`_rows`), not batched into a gather."""
    reads = {}
    for e in eqns:
        if e.primitive.name != "dynamic_slice" or e.invars[0] not in invariant:
            continue
        rows = _row_read(e, scalars)
        if rows is not None and _contiguous(rows, e.invars[0].aval.shape[0]):
            reads[id(e)] = _RowRead(e.invars[0], rows)
    return reads


def _rows(read: _RowRead, env: dict, length: int):
    """The rows `read` reads, one per iteration in the order of xs, as the `dynamic_slice` gives each: (1, ...)."""
    lo = int(read.rows.min())
    return _in_order(jax.lax.slice_in_dim(env[read.source], lo, lo + length, axis=0), read.rows)[:, None]


def _written_rows(e, scalars: dict):
    """The rows a one-row write writes per iteration (a `dynamic_update_slice` of a (1, ...) update, or a
    `scatter` of one row at index [i] along axis 0), or None."""
    shape = e.invars[0].aval.shape
    if not shape:
        return None
    if e.primitive.name == "dynamic_update_slice":
        if e.invars[1].aval.shape != (1,) + tuple(shape[1:]):
            return None
        return _index_rows(e.invars[2:], scalars)
    if e.primitive.name == "scatter":
        dn = e.params["dimension_numbers"]
        index, update = e.invars[1], e.invars[2]
        if (tuple(dn.inserted_window_dims) != (0,) or tuple(dn.scatter_dims_to_operand_dims) != (0,)
                or tuple(dn.update_window_dims) != tuple(range(len(shape) - 1)) or dn.operand_batching_dims
                or update.aval.shape != tuple(shape[1:]) or index.aval.shape != (1,) or index not in scalars
                or e.params.get("update_jaxpr") is not None):
            return None
        return np.asarray(scalars[index]).reshape(-1)
    return None


def _lifted(plan: _Plan):
    """The loop's outputs (final carries, then ys) as a function of its operands, batched (module doc)."""
    jaxpr, consts = plan.body.jaxpr, plan.body.consts
    nc, nk = plan.nc, plan.nk
    invars = jaxpr.invars
    kvars = invars[nc:nc + nk]
    reads = list(plan.reads.items())

    segments = list(plan.segments.items())
    hoisted = {id(e) for e in plan.hoisted}
    given_ids = {eqn_id for eqn_id, _ in reads} | {eqn_id for eqn_id, _ in segments}
    results = [*plan.accumulated.values(), *(u for u, _ in plan.written.values()), *jaxpr.outvars[nk:]]
    body = _needed(jaxpr.eqns, results, plan.skip | hoisted, given_ids)

    def run(*operands):
        inits = operands[nc:nc + nk]
        shared = {v: x for v, x in zip(invars[:nc], operands[:nc])}
        shared.update({kvars[j]: inits[j] for j in plan.invariant})
        shared.update(zip(jaxpr.constvars, consts))
        for e in plan.hoisted:            # loop-invariant work, once
            out = _bind(e, [a.val if _literal(a) else shared[a] for a in e.invars])
            shared.update(zip(e.outvars, out if e.primitive.multiple_results else [out]))
        sources = {**shared, **{kvars[j]: inits[j] for j in plan.written}}
        rows = [_rows(r, sources, plan.length) for _, r in reads]
        rows += [_segment_sum(seg, shared, plan.length) for _, seg in segments]
        counters = [jnp.asarray(vals, kvars[j].aval.dtype) for j, vals in plan.counters.items()]

        def one(counter_values, xs, row_values):
            env = dict(shared)
            env.update({kvars[j]: c for j, c in zip(plan.counters, counter_values)})
            env.update(zip(invars[nc + nk:], xs))
            env.update(zip([eqn_id for eqn_id, _ in reads] + [eqn_id for eqn_id, _ in segments], row_values))
            read = lambda a: a.val if _literal(a) else env[a]   # noqa: E731
            for e in body:
                if id(e) in given_ids:
                    env[e.outvars[0]] = env[id(e)]
                    continue
                out = _bind(e, [read(a) for a in e.invars])
                for o, val in zip(e.outvars, out if e.primitive.multiple_results else [out]):
                    env[o] = val
            accumulated = [read(g) for g in plan.accumulated.values()]
            updates = [jnp.reshape(read(u), kvars[j].aval.shape[1:]) for j, (u, _) in plan.written.items()]
            ys = [read(y) for y in jaxpr.outvars[nk:]]
            return accumulated, updates, ys

        accumulated, updates, ys = jax.vmap(one)(counters, list(operands[nc + nk:]), rows)
        finals = list(inits)
        for j, vals in plan.counters.items():
            finals[j] = inits[j] + jnp.asarray(plan.length, kvars[j].aval.dtype)
        for (j, _), g in zip(plan.accumulated.items(), accumulated):
            finals[j] = (inits[j] + jnp.sum(g, axis=0, dtype=g.dtype)).astype(kvars[j].aval.dtype)
        for (j, (_, written)), u in zip(plan.written.items(), updates):
            init, lo = inits[j], int(written.min())
            parts = [init[:lo], _in_order(u, written).astype(init.dtype), init[lo + plan.length:]]
            finals[j] = jnp.concatenate([p for p in parts if p.shape[0]], axis=0)
        return finals + list(ys)

    return run


def _needed(eqns, results: list, left_out: set, given: set) -> list:
    """The equations the batched body must evaluate for `results`: none in `left_out` (hoisted or replaced),
    and none that only feed an equation whose value is `given` (a row read, a segment sum)."""
    want = {v for v in results if not _literal(v)}
    keep = []
    for e in reversed(eqns):
        if id(e) in left_out or not any(o in want for o in e.outvars):
            continue
        keep.append(e)
        if id(e) not in given:
            want.update(a for a in e.invars if not _literal(a))
    return keep[::-1]


def _segment_sum(seg: _Segment, env: dict, length: int):
    """Row k: the sum over the elements whose id is `seg.first + k` (ids outside the loop's range dropped)."""
    ids = env[seg.ids]
    data = jnp.ones(ids.shape, seg.dtype) if seg.data is None else env[seg.data]
    return jax.ops.segment_sum(data, ids - jnp.asarray(seg.first, ids.dtype), num_segments=length).astype(seg.dtype)


def _unrolled(params: dict, known: list):
    """The scan's outputs as a function of its operands with its iterations written out one after another:
    the same ops in the same order, so the values are the loop's; the e-graph then sees across iterations.
    A carry whose initial value is known (a counter's literal start) starts as that value, so the indices
    computed from it are known in each copy (a row read becomes a slice)."""
    closed, (nc, nk), length = params["jaxpr"], jax_compat.scan_counts(params), params["length"]
    starts = [None if v is None or np.ndim(v) else v for v in known[nc:nc + nk]]

    def run(*operands):
        consts, xs = operands[:nc], operands[nc + nk:]
        carry = [x if v is None else jnp.asarray(v, x.dtype) for x, v in zip(operands[nc:nc + nk], starts)]
        ys = [None] * length
        for t in range(length):
            k = length - 1 - t if params["reverse"] else t
            out = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *consts, *carry, *[x[k] for x in xs])
            carry, ys[k] = list(out[:nk]), out[nk:]
        stacked = [jnp.stack([y[n] for y in ys]) for n in range(len(closed.jaxpr.outvars) - nk)]
        return carry + stacked

    return run


# Equations not worth moving out of a loop: XLA fuses them into their readers, so done once outside they only
# cost the memory of their result.
_CHEAP = ("broadcast_in_dim", "reshape", "convert_element_type", "squeeze", "expand_dims", "copy", "copy_p")


def _hoisted(params: dict):
    """The scan's outputs as a function of its operands with its loop-invariant work (equations of the consts
    and of carries the body passes on unchanged) done once, before a scan of the rest: the same ops on the
    same values, so the same results. XLA moves such work out of its loops too (its while-loop invariant
    code motion); done here, the search sees it outside, priced once, and the body it searches is only what
    each iteration computes (a rewrite of the body that pays off only if the invariant work ran every
    iteration, such as re-associating h @ (w @ w.T), is not taken). _Unsupported where nothing but
    `_CHEAP` equations is invariant."""
    closed = inlined_calls(params["jaxpr"])
    jaxpr, (nc, nk) = closed.jaxpr, jax_compat.scan_counts(params)
    invars, outvars = jaxpr.invars, jaxpr.outvars
    kept = {j for j in range(nk) if outvars[j] is invars[nc + j]}
    hoisted, _ = _invariant_equations(jaxpr, set(invars[:nc]) | {invars[nc + j] for j in kept})
    if not any(e.primitive.name not in _CHEAP for e in hoisted):
        raise _Unsupported("no loop-invariant work")
    moved = {id(e) for e in hoisted}
    rest = [e for e in jaxpr.eqns if id(e) not in moved]

    def run(*operands):
        consts, inits, xs = operands[:nc], operands[nc:nc + nk], operands[nc + nk:]
        shared = dict(zip(jaxpr.constvars, closed.consts))
        shared.update(zip(invars[:nc], consts))
        shared.update({invars[nc + j]: inits[j] for j in kept})
        _evaluate(hoisted, shared)        # once

        def step(carry, x):
            env = dict(shared)
            env.update(zip(invars[nc:nc + nk], carry))
            env.update(zip(invars[nc + nk:], x))
            read = _evaluate(rest, env)
            return [read(v) for v in outvars[:nk]], [read(v) for v in outvars[nk:]]

        carry, ys = jax.lax.scan(step, list(inits), list(xs), length=params["length"], reverse=params["reverse"])
        return list(carry) + list(ys)

    return run


# Ops that only move or re-shape data: computed ahead of a loop they gain nothing (`_split`).
_MOVES = _CHEAP + ("dynamic_slice", "slice", "gather", "transpose", "concatenate", "pad", "rev", "iota",
                   "dynamic_update_slice", "select_n")
MAX_SPLIT_BYTES = 64 << 20   # what a split loop computes ahead, all iterations together


def _split(params: dict, known: list):
    """The scan's outputs as a function of its operands with the work of each iteration that does not depend
    on what the loop carries (it reads only xs, counters and loop invariants) done for all iterations at once
    before the loop, batched under `jax.vmap`, and a loop of the rest reading those values as rows (loop
    fission: an RNN's input projection `x_t @ w` becomes one matrix product; a running sum of `f(x_t)` one
    batched f and a loop of additions). Loop-invariant work is done once, as `_hoisted` does. The loop left
    keeps every carry and computes it with the same ops in the same order; each value computed ahead is
    computed from the same operands with the same ops (a product batched into a larger one adds its terms in
    an order XLA chooses, as a batched loop's do). Values that one iteration computes ahead and the loop
    alone reads come in as rows of its xs; a ys computed ahead is the batched value itself.
    _Unsupported where no costly work (anything but `_MOVES`) is independent of the carries, or where what is
    computed ahead would take more than MAX_SPLIT_BYTES."""
    closed = inlined_calls(params["jaxpr"])
    jaxpr, (nc, nk), length = closed.jaxpr, jax_compat.scan_counts(params), params["length"]
    if jaxpr.effects or length < 2:
        raise _Unsupported("effects")
    invars, outvars = jaxpr.invars, jaxpr.outvars
    kvars, xvars = invars[nc:nc + nk], invars[nc + nk:]
    producer = {v: e for e in jaxpr.eqns for v in e.outvars}
    counters = _counters(jaxpr, producer, nc, nk, known, length, params["reverse"])
    kept = {j for j in range(nk) if outvars[j] is invars[nc + j]}
    hoisted, invariant = _invariant_equations(jaxpr, set(invars[:nc]) | {kvars[j] for j in kept})
    hoisted_ids = {id(e) for e in hoisted}
    free = set(invariant) | set(xvars) | {kvars[j] for j in counters}
    free_eqns = []
    for e in jaxpr.eqns:
        if id(e) not in hoisted_ids and all(_literal(a) or a in free for a in e.invars):
            free_eqns.append(e)
            free.update(e.outvars)
    moved, want = [], set()
    for e in reversed(free_eqns):   # costly free work, and the free work it is computed from
        costly = e.primitive.name not in _MOVES and any(np.prod(o.aval.shape) > 1 for o in e.outvars)
        if costly or any(o in want for o in e.outvars):
            moved.append(e)
            want.update(a for a in e.invars if not _literal(a))
    if not any(e.primitive.name not in _MOVES for e in moved):
        raise _Unsupported("no costly work independent of the carries")
    moved.reverse()
    moved_ids = {id(e) for e in moved}
    moved_out = {o for e in moved for o in e.outvars}
    ny = len(outvars) - nk
    ahead_ys = [p for p in range(ny) if outvars[nk + p] in moved_out]
    loop_ys = [p for p in range(ny) if p not in ahead_ys]
    results = list(outvars[:nk]) + [outvars[nk + p] for p in loop_ys]
    rest = _needed(jaxpr.eqns, results, moved_ids | hoisted_ids, set())
    read_by_rest = {a for e in rest for a in e.invars if not _literal(a)} | set(results)
    frontier = list(dict.fromkeys(o for e in moved for o in e.outvars if o in read_by_rest))
    ahead_bytes = sum(length * math.prod(v.aval.shape) * np.dtype(v.aval.dtype).itemsize
                      for v in frontier + [outvars[nk + p] for p in ahead_ys])
    if ahead_bytes > MAX_SPLIT_BYTES:
        raise _Unsupported(f"{ahead_bytes} bytes computed ahead")
    scalars = _counter_scalars(jaxpr, {kvars[j]: vals for j, vals in counters.items()}, length)
    reads = _slice_reads(moved, invariant, scalars)
    ahead = _needed(moved, frontier + [outvars[nk + p] for p in ahead_ys], set(), set(reads))

    def run(*operands):
        consts, inits, xs = operands[:nc], operands[nc:nc + nk], operands[nc + nk:]
        shared = dict(zip(jaxpr.constvars, closed.consts))
        shared.update(zip(invars[:nc], consts))
        shared.update({kvars[j]: inits[j] for j in kept})
        _evaluate(hoisted, shared)        # once
        rows = [_rows(r, shared, length) for r in reads.values()]
        counts = [jnp.asarray(vals, kvars[j].aval.dtype) for j, vals in counters.items()]

        def one(count, x, row):   # one iteration's work ahead
            env = dict(shared)
            env.update(zip([kvars[j] for j in counters], count))
            env.update(zip(xvars, x))
            read = _evaluate(ahead, env, dict(zip(reads, row)))
            return [read(v) for v in frontier], [read(outvars[nk + p]) for p in ahead_ys]

        values, ys_ahead = jax.vmap(one, axis_size=length)(counts, list(xs), rows)

        def step(carry, x):
            env = dict(shared)
            env.update(zip(kvars, carry))
            env.update(zip(xvars, x[:len(xvars)]))
            env.update(zip(frontier, x[len(xvars):]))
            read = _evaluate(rest, env)
            return [read(v) for v in outvars[:nk]], [read(outvars[nk + p]) for p in loop_ys]

        carry, ys_loop = jax.lax.scan(step, list(inits), list(xs) + list(values), length=length,
                                      reverse=params["reverse"], unroll=params.get("unroll", 1))
        ys = dict(zip(ahead_ys, ys_ahead)) | dict(zip(loop_ys, ys_loop))
        return list(carry) + [ys[p] for p in range(ny)]

    return run


def _evaluate(eqns, env: dict, given: dict | None = None):
    """`eqns` evaluated in order into `env` (var -> value), each equation whose id is in `given` taking its
    value from there; returns the reader of atoms (a literal's value, else env's)."""
    read = lambda a: a.val if _literal(a) else env[a]   # noqa: E731
    for e in eqns:
        if given and id(e) in given:
            env[e.outvars[0]] = given[id(e)]
            continue
        out = _bind(e, [read(a) for a in e.invars])
        env.update(zip(e.outvars, out if e.primitive.multiple_results else [out]))
    return read


def _bind(e, args: list):
    """Equation `e` bound on `args`, as `jax.core.eval_jaxpr` binds it (JAX releases differ in whether
    `get_bind_params` returns the sub-functions too)."""
    got = e.primitive.get_bind_params(e.params)
    subfuns, params = got if isinstance(got, tuple) else ((), got)
    return e.primitive.bind(*subfuns, *args, **params)


def vectorize(graph: Graph) -> tuple[Graph, list[str]]:
    """`graph` with each scan whose iterations are independent (module doc) replaced by its body batched, each
    short one that does not batch written out, the loop-invariant work of the others moved out of them, then
    pairs of scans over one range fused (`_fused_pass`), and what was done to each loop ("batched",
    "unrolled", "hoisted", "fused"); `graph` itself where nothing was."""
    done: list[str] = []
    for one_pass in (_one_pass, _fused_pass):
        for _ in range(MAX_PASSES):
            graph, kinds = one_pass(graph)
            done += kinds
            if not kinds:
                break
    return graph, done


def _fused(pa: dict, pb: dict, fed: dict | None = None):
    """Two scans over one range (the same length and direction) as one: its body runs the first's body, then
    the second's, on their own carries and slices; its results are the first's, then the second's. `fed`
    (the second's xs position -> the first's ys position): rows the second reads of the first's ys are the
    values the first's body just computed (a map loop into the reduction after it), and are not operands of
    the fused loop. Nothing else of one reads the other's results (`_fused_pass`), so each body sees what it
    saw alone: the same ops on the same values ("exact")."""
    (nca, nka), (ncb, nkb) = jax_compat.scan_counts(pa), jax_compat.scan_counts(pb)
    a, b = pa["jaxpr"], pb["jaxpr"]
    fed = fed or {}
    n_a = len(a.jaxpr.invars)
    ya = len(a.jaxpr.outvars) - nka
    xb = len(b.jaxpr.invars) - ncb - nkb

    def run(*operands):
        ops_a, ops_b = operands[:n_a], operands[n_a:]
        consts_a, xs_a = ops_a[:nca], ops_a[nca + nka:]
        consts_b, xs_b = ops_b[:ncb], ops_b[ncb + nkb:]   # without the fed ones

        def step(carry, x):
            out_a = jax.core.eval_jaxpr(a.jaxpr, a.consts, *consts_a, *carry[:nka], *x[:len(xs_a)])
            rows = iter(x[len(xs_a):])
            x_b = [out_a[nka + fed[k]] if k in fed else next(rows) for k in range(xb)]
            out_b = jax.core.eval_jaxpr(b.jaxpr, b.consts, *consts_b, *carry[nka:], *x_b)
            return list(out_a[:nka]) + list(out_b[:nkb]), list(out_a[nka:]) + list(out_b[nkb:])

        unroll = pa.get("unroll", 1) if pa.get("unroll", 1) == pb.get("unroll", 1) else 1
        carry, ys = jax.lax.scan(step, list(ops_a[nca:nca + nka]) + list(ops_b[ncb:ncb + nkb]),
                                 list(xs_a) + list(xs_b), length=pa["length"], reverse=pa["reverse"], unroll=unroll)
        return list(carry[:nka]) + list(ys[:ya]) + list(carry[nka:]) + list(ys[ya:])

    return run


def _fused_pass(graph: Graph) -> tuple[Graph, list[str]]:
    """`graph` with pairs of scans over one range fused (`_fused`): two loops that read the same rows, or only
    share a trip count, pay one loop's per-iteration overhead and read what they share once; a loop that
    reads another's ys row by row takes each row as it is computed, never stored whole for it. A pair is
    fused where, besides such rows, neither reads the other's results, directly or through anything else (the
    dependence test: no result of one among what the other's other operands are computed from)."""
    from superopt.egraph.capture import capture
    operands: dict[int, tuple] = {}
    for i in graph.live():
        node = graph.nodes[i]
        if node.op == "opaque":
            operands[node.attrs[0]] = node.inputs

    def reads(nodes) -> set:   # the opaque equations `nodes` are computed from (themselves included)
        return {graph.nodes[i].attrs[0] for i in postorder(nodes, lambda i: graph.nodes[i].inputs)
                if graph.nodes[i].op == "opaque"}
    scans = [k for k in operands if graph.opaque[k].name == "scan" and not graph.opaque[k].effectful
             and not graph.opaque[k].params["jaxpr"].jaxpr.effects]
    upstream = {k: reads(operands[k]) for k in scans}   # one walk per loop, not one per pair
    replaced: dict[int, tuple] = {}
    kinds: list[str] = []
    for n, a in enumerate(scans):
        for m, b in enumerate(scans):
            if a == b or a in replaced or b in replaced:
                continue
            pa, pb = graph.opaque[a].params, graph.opaque[b].params
            if (pa["length"], pa["reverse"]) != (pb["length"], pb["reverse"]):
                continue
            (_, nka), (ncb, nkb) = jax_compat.scan_counts(pa), jax_compat.scan_counts(pb)
            fed = {k - ncb - nkb: graph.nodes[j].attrs[1] - nka for k, j in enumerate(operands[b])
                   if k >= ncb + nkb and graph.nodes[j].op == "opaque" and graph.nodes[j].attrs[0] == a
                   and graph.nodes[j].attrs[1] >= nka}
            rest_b = [j for k, j in enumerate(operands[b]) if k - ncb - nkb not in fed]
            if b in upstream[a] or (not fed and m < n) or a in (reads(rest_b) if fed else upstream[b]):
                continue   # (an independent pair is tried once, in program order)
            ins = tuple(operands[a]) + tuple(rest_b)
            avals = tuple(jax.ShapeDtypeStruct(graph.nodes[j].shape, graph.nodes[j].dtype) for j in ins)
            try:
                sub = capture(_fused(pa, pb, fed), avals, keep_whole=False).graph
            except Exception:   # noqa: BLE001 - a pair that does not capture as one loop stays two
                continue
            if sub.hidden_outputs:
                continue
            replaced[a], replaced[b] = (sub, ins, 0), (sub, ins, graph.opaque[a].n_outputs)
            kinds.append("fused")
    if not replaced:
        return graph, []
    return _spliced(graph, replaced), kinds


def _known(graph: Graph, i: int):
    node = graph.nodes[i]
    if node.op == "lit":
        return np.asarray(node.attrs[0], dtype=np.dtype(node.dtype))
    if node.op == "const":
        return np.asarray(graph.consts[node.attrs[0]])
    return None


def _one_pass(graph: Graph) -> tuple[Graph, list[str]]:
    from superopt.egraph.capture import capture
    replaced: dict[int, tuple[Graph, tuple]] = {}
    kinds: list[str] = []
    for i in graph.live():
        node = graph.nodes[i]
        if node.op != "opaque" or node.attrs[0] in replaced:
            continue
        op = graph.opaque[node.attrs[0]]
        if op.name != "scan" or op.effectful:
            continue
        known = [_known(graph, j) for j in node.inputs]
        try:
            lifted, kind = _lifted(_plan(op.params, known)), "batched"
        except _Unsupported:
            body = op.params["jaxpr"].jaxpr
            if body.effects:
                continue
            if op.params["length"] <= UNROLL and op.params["length"] * len(body.eqns) <= UNROLL_EQUATIONS:
                lifted, kind = _unrolled(op.params, known), "unrolled"
            else:
                try:
                    lifted, kind = _split(op.params, known), "split"
                except _Unsupported:
                    try:
                        lifted, kind = _hoisted(op.params), "hoisted"
                    except _Unsupported:
                        continue
        avals = tuple(jax.ShapeDtypeStruct(graph.nodes[j].shape, graph.nodes[j].dtype) for j in node.inputs)
        try:
            sub = capture(lifted, avals, keep_whole=False).graph
        except Exception:   # noqa: BLE001 - a body that does not batch or capture stays a loop
            continue
        if sub.hidden_outputs:
            continue
        replaced[node.attrs[0]] = (sub, node.inputs)
        kinds.append(kind)
    if not replaced:
        return graph, []
    return _spliced(graph, replaced), kinds


def _spliced(graph: Graph, replaced: dict) -> Graph:
    """`graph` with the outputs of each replaced opaque equation taken from its sub-graph, whose arguments
    are the equation's operands (`replaced`: equation -> (sub-graph, operands[, the offset of its outputs among
    the sub-graph's, where several equations share one])."""
    out = Graph(consts=list(graph.consts), n_args=graph.n_args, hidden_outputs=graph.hidden_outputs)
    ids: dict[int, int] = {}
    inlined: dict[int, list] = {}
    opaque_index: dict[int, int] = {}

    def emit(i: int) -> None:
        node = graph.nodes[i]
        if node.op == "opaque" and node.attrs[0] in replaced:
            sub, operands, *offset = replaced[node.attrs[0]]   # loops fused share one sub-graph, at an offset
            if id(sub) not in inlined:
                # a fused loop's operands may come after its first loop's results in `graph`: what they are
                # computed from goes first (none of it reads either loop: `_fused_pass`)
                for j in postorder(operands, lambda k: () if k in ids else graph.nodes[k].inputs):
                    if j not in ids:
                        emit(j)
                inlined[id(sub)] = _inline(out, sub, [ids[j] for j in operands], opaque_index, graph)
            ids[i] = inlined[id(sub)][(offset[0] if offset else 0) + node.attrs[1]]
            return
        attrs = node.attrs
        if node.op == "opaque":
            attrs = (_opaque(out, graph.opaque[node.attrs[0]], opaque_index, node.attrs[0]),) + tuple(node.attrs[1:])
        ids[i] = out.add(Node(node.op, tuple(ids[j] for j in node.inputs), attrs, node.shape, node.dtype))

    for i in graph.live():
        if i not in ids:
            emit(i)
    out.outputs = [ids[o] for o in graph.outputs]
    return out


def _opaque(out: Graph, op, index: dict, key) -> int:
    if key not in index:
        out.opaque.append(op)
        index[key] = len(out.opaque) - 1
    return index[key]


def _inline(out: Graph, sub: Graph, ins: list, opaque_index: dict, graph: Graph) -> list:
    local: dict[int, int] = {}
    for k in sub.live():
        inner = sub.nodes[k]
        if inner.op == "arg":
            local[k] = ins[inner.attrs[0]]
            continue
        attrs = inner.attrs
        if inner.op == "const":
            out.consts.append(sub.consts[inner.attrs[0]])
            attrs = (len(out.consts) - 1,)
        elif inner.op == "opaque":
            attrs = (_opaque(out, sub.opaque[inner.attrs[0]], opaque_index, ("sub", id(sub), inner.attrs[0])),) \
                + tuple(inner.attrs[1:])
        local[k] = out.add(Node(inner.op, tuple(local[j] for j in inner.inputs), attrs, inner.shape, inner.dtype))
    return [local[o] for o in sub.outputs]


def vectorized_note(kinds: list[str]) -> str:
    """The report's words for what was done to the program's loops before the search."""
    batched, unrolled, hoisted = kinds.count("batched"), kinds.count("unrolled"), kinds.count("hoisted")
    fused, split = kinds.count("fused"), kinds.count("split")
    parts = ([f"{batched} with independent iterations batched"] if batched else []) + \
        ([f"{unrolled} short one{'s' if unrolled != 1 else ''} written out"] if unrolled else []) + \
        ([f"{split} with the work independent of their carries done ahead, batched"] if split else []) + \
        ([f"{hoisted} with loop-invariant work moved out"] if hoisted else []) + \
        ([f"{fused} pair{'s' if fused != 1 else ''} over one range fused"] if fused else [])
    return f"loops before the search: {'; '.join(parts)}"
