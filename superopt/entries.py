"""Results kept between processes (superopt/cache.py, superopt/reuse.py): a result as a cache entry, and an entry
read back as a result, never trusted: it must trace to the program's types, and its program must agree with the
program on verification's first random set the first time this process uses it.
"""
from __future__ import annotations

import warnings
from typing import Callable

import jax

from superopt.cache import CacheWarning
from superopt.core import verify as verification
from superopt.core.ir import Graph
from superopt.core.reference import evaluate as evaluate_reference
from superopt.core.serial import NotSerializable, to_data
from superopt.egraph.capture import Captured
from superopt.egraph.limits import RunReport
from superopt.extract.extraction import Extraction, Method
from superopt.lowering.jax import lower
from superopt.report import Outcome
from superopt.reuse import run_from_data, run_to_data, term_from_entry, with_consts
from superopt.stages import guard_check, traced


def entry_of(run: RunReport, outcome: Outcome, reason: str, chosen: Extraction | None, shared_consts: int = 0):
    """The cache entry of a result: the chosen program where it runs, and what its report is built from.
    None for a result that depends on the machine's load (a time limit) or has no data form. The first
    `shared_consts` constants of the chosen program are the original's: the key holds their hashes."""
    if outcome is Outcome.TIME_LIMIT:
        return None
    try:
        term = None
        if outcome is Outcome.OPTIMIZED:
            term = to_data(with_consts(chosen.graph, lambda consts: consts[shared_consts:]))
    except NotSerializable:
        return None
    found = {} if chosen is None else dict(cost=chosen.cost, node_costs=chosen.node_costs,
                                           method=chosen.method.to_data(), declined=list(chosen.declined),
                                           memory=chosen.memory)
    return dict(term=term, run=run_to_data(run), outcome=outcome.name, reason=reason, chosen=found)


def cached(store, key: str, kind: str, original: Graph, consts=()):
    """(run, outcome, reason, chosen, its JAX program) from the cache entry under `key`, or None: a miss, or
    an entry that is not a result for `original` (superopt/reuse.py: never trusted)."""
    entry = store.get(key, kind)
    return None if entry is None else from_entry(entry, original, consts)


def from_entry(entry: dict, original: Graph, consts=()):
    """(run, outcome, reason, chosen, its JAX program or None) of a cache entry for `original`, or None where
    it is not one."""
    try:
        term = term_from_entry(entry, original, consts)
        outcome = Outcome[entry["outcome"]]
        if (term is None) != (outcome is not Outcome.OPTIMIZED):
            raise NotSerializable("the entry's outcome and program disagree")
        found = entry["chosen"]
        chosen = None if not found else Extraction(
            term if term is not None else original, float(found["cost"]), [float(c) for c in found["node_costs"]],
            Method.from_data(found["method"]), list(found["declined"]), str(found["memory"]))
        program = traced_like(term, original) if term is not None else None
        return run_from_data(entry["run"]), outcome, str(entry["reason"]), chosen, program
    except Exception:   # noqa: BLE001  - whatever is wrong with it, the entry is recomputed
        return None


_verified_entries: set = set()   # (cache directory, key) of entries whose program this process verified


def rechecked(found: tuple, store, key: str, kind: str, captured: Captured, numerics: str) -> tuple | None:
    """`found` (`cached`'s) once its program, on its first use in this process, agrees with the captured
    program on the verification's first random input set, both evaluated by superopt's reference evaluator
    (no compilation; judged as verify.verify judges); else None, the entry dropped with a CacheWarning. An
    entry with the right checksum and types may still have been edited by whoever can write the cache
    (RELIABILITY.md, "What the cache trusts"). The adversarial and scaled sets ran when the entry was made
    and are not run again: this check is for a program that computes something else."""
    chosen, seen = found[3], (str(store.directory), key)
    if found[4] is None or seen in _verified_entries:
        return found
    original = traced(captured)
    try:
        args = verification.random_args(captured.in_avals, 0)
        problem = verification.judge(evaluate_reference(original, args), side_evaluated(chosen.graph, args),
                                     lambda: evaluate_reference(original, args, precise=True), numerics)
    except Exception as exc:   # noqa: BLE001
        problem = f"it failed to run ({type(exc).__name__}: {str(exc)[:200]})"
    if problem:
        store.drop(key, kind)
        warnings.warn(f"superopt: the cache entry {key[:16]} in {store.path} differs from the program it is stored "
                      f"for ({problem}); dropped it, and the program is optimized again", CacheWarning,
                      stacklevel=2)
        return None
    _verified_entries.add(seen)
    return found


def side_evaluated(graph: Graph, args) -> list:
    """`graph`'s outputs on `args` by the reference evaluator, a guarded graph's from the side its check picks."""
    check = guard_check(graph)
    if check is not None and evaluate_reference(check, args)[0] != 0:
        return side_evaluated(graph.guard.fallback, args)
    return evaluate_reference(graph, args)


def traced_like(term: Graph, original: Graph) -> Callable:
    """`term`'s JAX program, traced once at `original`'s argument types; NotSerializable where its results
    are not of `original`'s types. A term that does not trace (a malformed attribute) raises."""
    args = {n.attrs[0]: jax.ShapeDtypeStruct(n.shape, n.dtype) for n in original.nodes if n.op == "arg"}
    program = lower(term)
    outs = jax.eval_shape(lambda *flat: program(*flat), *[args[i] for i in range(original.n_args)])
    if [(tuple(o.shape), str(o.dtype)) for o in outs] != \
            [(original.nodes[o].shape, original.nodes[o].dtype) for o in original.results]:
        raise NotSerializable("the entry's program computes other types than the program's")
    return program
