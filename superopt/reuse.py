"""What makes two optimizations the same, and a result worth reusing: cache keys, entries and their checks.

A result in the persistent cache (`superopt/cache.py`) is keyed by everything that decides it:

- the program, canonical (`superopt/core/serial.py`; constants by the hash of their bytes);
- the target, as loaded (its figures and this machine's calibration);
- the schedule of rules the numerics mode runs;
- the options that change the choice (numerics, extractor, memory budget, limits, whether results are checked);
- superopt's version and a digest of its own source files, and the versions of JAX and egglog.

A change to any of them is a miss. An entry read back is not trusted: it must decode
(`serial.from_data` checks every node), its arguments and results must have the program's types, and its
program must trace at the program's argument types to its result types (`entries.traced_like`); anything
else is a miss, and the program is optimized again.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
from pathlib import Path

import jax

from superopt.core import lazy
from superopt.core.ir import Graph
from superopt.core.serial import NotSerializable, digest, dumps, from_data, opaque_fingerprint, to_data
from superopt.egraph.limits import PhaseReport, RunReport, StopReason
from superopt.rewrites.rule import Rule

# egglog's: imported where compiled rules are read or written, not on a call the cache answers
analysis = lazy.module("superopt.egraph.analysis")
saved = lazy.module("superopt.egraph.saved")

# The packages whose files are superopt's code (the folders of the installed layout; pyproject.toml).
_PACKAGES = ("superopt", "superopt.core", "superopt.egraph", "superopt.rewrites", "superopt.rulesets",
             "superopt.extract", "superopt.extract.models", "superopt.lowering", "superopt.lowering.npu",
             "superopt.lowering.pallas")


@functools.cache
def code_version() -> str:
    """superopt's version, a digest of its source and data files, and JAX's and egglog's versions."""
    h = hashlib.sha256()
    for name in _PACKAGES:
        spec = importlib.util.find_spec(name)
        for folder in spec.submodule_search_locations or ():
            for path in sorted(Path(folder).glob("*")):
                if path.suffix in (".py", ".toml"):
                    h.update(path.name.encode())
                    h.update(path.read_bytes())
    return f"superopt {importlib.metadata.version('superopt')} ({h.hexdigest()[:16]}), jax {jax.__version__}, " \
           f"egglog {importlib.metadata.version('egglog')}"


def fingerprint(target, schedule, **options) -> str:
    """The digest of what decides a result besides the program (module doc)."""
    return digest(code_version(), repr(target), repr(schedule), repr(sorted(options.items())))


def program_key(graph: Graph, fingerprint_: str) -> str:
    """The cache key of `graph` under `fingerprint_`: its data with each constant as the hash of its bytes."""
    data = to_data(dataclasses.replace(graph, consts=[]))
    data["consts"] = [[str(c.dtype), list(c.shape), hashlib.sha256(c.tobytes()).hexdigest()] for c in graph.consts]
    return digest(fingerprint_, dumps(data))


def with_consts(graph: Graph, change) -> Graph:
    """`graph` with `change(consts)` as its constants, and so its guard's fallback (core/ir.py `Guard`): a cache
    entry holds a program's own constants, its key the hashes of those it shares with the original."""
    guard = graph.guard and dataclasses.replace(graph.guard, fallback=with_consts(graph.guard.fallback, change))
    return dataclasses.replace(graph, consts=change(graph.consts), guard=guard)


def opaque_by_fingerprint(graph: Graph) -> dict:
    """The opaque primitives of `graph` (the program being answered) by fingerprint: what a cached program
    with opaque primitives binds (core/serial.py). Those without one are left out (no entry can hold them)."""
    out = {}
    for o in graph.opaque:
        try:
            out[opaque_fingerprint(o)] = o
        except NotSerializable:
            pass
    return out


def term_from_entry(entry: dict, original: Graph, consts=None) -> Graph | None:
    """The chosen program an entry holds, if it is one for `original` (same argument and result types);
    None for an entry that keeps the original. NotSerializable for anything else."""
    term = from_data(entry["term"], opaque_by_fingerprint(original)) if entry.get("term") is not None else None
    if term is None:
        return None
    if consts is not None:
        term = with_consts(term, lambda own: list(consts) + own)
    args = sorted((n.attrs[0], n.shape, n.dtype) for n in term.nodes if n.op == "arg")
    want = sorted((n.attrs[0], n.shape, n.dtype) for n in original.nodes if n.op == "arg")
    if term.n_args != original.n_args or not set(args) <= set(want):
        raise NotSerializable("the entry's arguments are not the program's")
    if [(term.nodes[o].shape, term.nodes[o].dtype) for o in term.outputs] != \
            [(original.nodes[o].shape, original.nodes[o].dtype) for o in original.outputs]:
        raise NotSerializable("the entry's results are not the program's")
    if any(n.op == "const" and not 0 <= n.attrs[0] < len(term.consts) for n in term.nodes):
        raise NotSerializable("the entry reads a constant it does not have")
    return term


def run_to_data(run: RunReport) -> dict:
    phases = [dict(name=p.name, stop_reason=p.stop_reason.value, iterations=p.iterations, seconds=p.seconds,
                   matches=p.matches, rule_seconds=p.rule_seconds, bans=p.bans) for p in run.phases]
    return dict(stop_reason=run.stop_reason.value, iterations=run.iterations, enodes=run.enodes,
                eclasses=run.eclasses, seconds=run.seconds, matches=run.matches, rule_seconds=run.rule_seconds,
                phases=phases, error=run.error)


def run_from_data(data: dict) -> RunReport:
    phases = [PhaseReport(p["name"], StopReason(p["stop_reason"]), int(p["iterations"]), float(p["seconds"]),
                          dict(p["matches"]), dict(p["rule_seconds"]), dict(p["bans"])) for p in data["phases"]]
    return RunReport(StopReason(data["stop_reason"]), int(data["iterations"]), int(data["enodes"]),
                     int(data["eclasses"]), float(data["seconds"]), dict(data["matches"]),
                     dict(data["rule_seconds"]), phases, data["error"])


def combined_run(runs: list[RunReport]) -> RunReport:
    """One run report for the segments of a program: e-graph sizes, seconds and matches added up (per phase
    too), the iterations of the longest run, and the first stop reason other than saturation."""
    stops = [r.stop_reason for r in runs if r.stop_reason is not StopReason.SATURATED]
    out = RunReport(stops[0] if stops else StopReason.SATURATED, max((r.iterations for r in runs), default=0),
                    sum(r.enodes for r in runs), sum(r.eclasses for r in runs), sum(r.seconds for r in runs))
    for r in runs:
        for name, n in r.matches.items():
            out.matches[name] = out.matches.get(name, 0) + n
        for name, s in r.rule_seconds.items():
            out.rule_seconds[name] = out.rule_seconds.get(name, 0.0) + s
        for ph in r.phases:
            mine = next((p for p in out.phases if p.name == ph.name), None)
            if mine is None:
                mine = PhaseReport(ph.name)
                out.phases.append(mine)
            if mine.stop_reason is StopReason.SATURATED:
                mine.stop_reason = ph.stop_reason
            mine.iterations = max(mine.iterations, ph.iterations)
            mine.seconds += ph.seconds
            for table, theirs in ((mine.matches, ph.matches), (mine.rule_seconds, ph.rule_seconds), (mine.bans, ph.bans)):
                for name, n in theirs.items():
                    table[name] = table.get(name, 0) + n
    out.error = next((r.error for r in runs if r.error), None)
    return out


# ---- compiled rules (egraph/saved.py) ----

RULES_KIND = "rules"


def _rules(schedule) -> list:
    return list({id(r): r for phase in schedule.phases for r in phase.rules}.values())


def _own(rules: list) -> bool:
    """Whether every rule is one of the DSL's (an object that brings its own egglog rules is not kept)."""
    return all(isinstance(r, Rule) for r in rules)


def rules_key(schedule) -> str:
    """The key of `schedule`'s compiled egglog rules (and the analysis rules every schedule runs)."""
    return digest(code_version(), RULES_KIND, repr(schedule))


_present: dict = {}   # (cache directory, key) -> names of the compiled rules this process read from or wrote there


def prepare_rules(schedule, source) -> None:
    """Before saturating: adopt `schedule`'s compiled rules from `source`, a store or the data a parent process
    sent (`compiled_rules`), those not built in this process already. Whatever is missing (a saturation
    builds only the rules that can match its program: `egraph/runner.py:reachable`) or does not read back
    whole is built as usual."""
    if ready(schedule) or not _own(_rules(schedule)):
        return
    if isinstance(source, dict):
        adopt_rules(schedule, source)
        return
    key = rules_key(schedule)
    entry = source.get(key, RULES_KIND)
    if entry is not None and adopt_rules(schedule, entry):
        _present[(str(source.directory), key)] = frozenset(entry["names"])


def ready(schedule) -> bool:
    """Whether `schedule`'s rules and the analysis rules are built (or adopted) in this process."""
    rules = _rules(schedule)
    return _own(rules) and all(r.compiled for r in rules) and analysis.analysis_rules.cache_info().currsize > 0


def adopt_rules(schedule, data: dict) -> bool:
    """Adopt compiled rules from `data` (`compiled_rules`'s: some of the schedule's rules, in its order, and
    the analysis rules); False where it is not theirs (nothing adopted)."""
    rules = _rules(schedule)
    try:
        at, names = list(data["at"]), list(data["names"])
        mismatched = any(not 0 <= i < len(rules) or rules[i].name != name for i, name in zip(at, names))
        if len(at) != len(names) or mismatched or at != sorted(set(at)):
            return False
        groups = saved.rules_from_data(data["rules"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    if len(groups) != len(at) + 1:
        return False
    for i, egg in zip(at, groups):
        rules[i].adopt(egg)
    analysis.adopt(groups[-1])
    return True


# (rules_key, positions of the compiled rules) -> `compiled_rules`'s data: each new cache directory a process
# writes to (a test's, a user's second one) would otherwise encode the same rules again
_as_data: dict = {}


def compiled_rules(schedule) -> dict | None:
    """The compiled rules of `schedule` built (or adopted) in this process, and the analysis rules, as data
    for the cache; None where none is built, or the analysis rules are not."""
    rules = _rules(schedule)
    at = [i for i, r in enumerate(rules) if r.compiled]
    if not (_own(rules) and at and analysis.analysis_rules.cache_info().currsize > 0):
        return None
    memo = (rules_key(schedule), tuple(at))   # a rule is compiled once per process: the same rules, the same data
    if memo not in _as_data:
        try:
            _as_data[memo] = dict(at=at, names=[rules[i].name for i in at],
                                  rules=saved.rules_to_data([rules[i].egg for i in at] + [analysis.analysis_rules()]))
        except TypeError:
            _as_data[memo] = None
    return _as_data[memo]


def save_rules(schedule, store, data: dict | None = None) -> None:
    """Keep `schedule`'s compiled rules in `store`: those built or adopted in this process, with `data` a worker
    built (adopted here first), wherever the store's entry lacks some of them."""
    if not _own(_rules(schedule)):   # rules that bring their own egglog rules are not kept
        return
    key = rules_key(schedule)
    if data is not None:
        adopt_rules(schedule, data)
    where = (str(store.directory), key)
    if {r.name for r in _rules(schedule) if r.compiled} <= _present.get(where, frozenset()):
        return      # the store has them all (checked before encoding them, which takes a while)
    data = compiled_rules(schedule)
    if data is not None:
        store.put(key, RULES_KIND, data)
        _present[where] = frozenset(data["names"])
