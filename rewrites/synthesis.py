"""Rules found by enumeration, in the style of Ruler and Enumo, proven by the soundness checker.

    superopt rules synthesize [--size N] [--write FILE]

1. **Enumerate** terms over a small language (`VARS`, `LITERALS`, `UNARY`, `BINARY`: three float32 square
   matrices x, y, z, the literals 0 and 1, elementwise ops, integer_pow 2, transpose and matmul) by size, in
   layers (`LAYERS`: every op to 4 nodes, two smaller sets of ops to 5), each new term built from the
   representatives of the classes found so far (Ruler's trick: a term equal to a smaller one is never
   grown further).
2. **Fingerprint** each term by its float64 values on random inputs; terms with one fingerprint are
   candidates for one equality, `term -> the class's smallest term`.
3. **Label** a candidate on a float32 battery: every combination of the extreme values of the numerics
   contract (NaN, +-inf, -0, the largest value and its square root, subnormals, ...) for elementwise
   terms, plus random values of every magnitude. Bitwise equal is `exact`; NaN and inf where the left
   side's are and finite values within float32's tolerance is `rounding`; equal over the reals only
   (the fingerprint) is `reals`. Then the rule is **proven** with `check_rule` under that label (weaker
   labels in turn if the checker refutes it).
4. **Keep a minimal set**: candidates are taken smallest first, and one that the rules already kept
   derive is dropped; at the end, so is each rule the others derive. Derivation (`derives`) is equality
   saturation on a small e-graph (`_EGraph`) of the candidate's two sides, run with the strict rules alone
   for a strict candidate and with every kept rule for a `reals` one.

`rediscovered` measures the result against `rulesets/algebra.py`: each hand-written rule whose ops all lie
in the language, instantiated in it, counts if the synthesized rules derive it.
"""
from __future__ import annotations

import itertools
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from superopt.core.verify import TOLERANCES
from superopt.rewrites.checker import check_rule
from superopt.rewrites.pattern import TENSOR, Const, Var, app, lit, tensors
from superopt.rewrites.rule import Rule, RuleSet, when

UNARY = ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "pow2", "transpose")
BINARY = ("add", "sub", "mul", "div", "max", "min", "matmul")
VARS = ("x", "y", "z")
LITERALS = (0.0, 1.0)
N = 3                                   # matrices are N x N
LABELS = ("exact", "rounding", "reals")       # strongest first
STRICT = ("exact", "rounding")


# ---- terms: ("var", name), ("lit", value), (op, a) or (op, a, b) ----

def size(t) -> int:
    return 1 if t[0] in ("var", "lit") else 1 + sum(size(c) for c in t[1:])


def show(t) -> str:
    if t[0] == "var":
        return t[1]
    if t[0] == "lit":
        return f"{t[1]:g}"
    return f"({t[0]} {' '.join(show(c) for c in t[1:])})"


def _vars(t) -> set:
    if t[0] == "var":
        return {t[1]}
    if t[0] == "lit":
        return set()
    return set().union(*(_vars(c) for c in t[1:]))


def _ops(t) -> set:
    if t[0] in ("var", "lit"):
        return set()
    return {t[0]}.union(*(_ops(c) for c in t[1:]))


def evaluate(t, env: dict, dtype):
    """A term's value; env maps a variable to an array (..., N, N), literals broadcast."""
    op = t[0]
    if op == "var":
        return env[t[1]]
    if op == "lit":
        return dtype(t[1])
    a = evaluate(t[1], env, dtype)
    if op == "neg":
        return -a
    if op == "abs":
        return np.abs(a)
    if op == "exp":
        return np.exp(a)
    if op == "log":
        return np.log(a)
    if op == "sqrt":
        return np.sqrt(a)
    if op == "rsqrt":
        return dtype(1) / np.sqrt(a)
    if op == "pow2":
        return a * a
    if op == "transpose":
        return np.swapaxes(np.broadcast_to(a, _shape(env)), -1, -2)
    b = evaluate(t[2], env, dtype)
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "div":
        return a / b
    if op == "max":
        return np.maximum(a, b)
    if op == "min":
        return np.minimum(a, b)
    return np.matmul(np.broadcast_to(a, _shape(env)), np.broadcast_to(b, _shape(env)))


def _shape(env):
    return next(iter(env.values())).shape


# ---- fingerprints (float64, random inputs) ----

def _fingerprint_inputs(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {v: rng.standard_normal((6, N, N)) * 3.0 for v in VARS}


def fingerprint(t, env) -> bytes:
    with np.errstate(all="ignore"):
        v = np.broadcast_to(np.asarray(evaluate(t, env, np.float64), np.float64), _shape(env))
    mant, exp_ = np.frexp(np.where(np.isfinite(v), v, 0.0))
    key = np.where(np.abs(v) < 1e-12, 0, np.round(mant * 2**26)).astype(np.int64)
    return key.tobytes() + np.where(np.isfinite(v), exp_, 0).astype(np.int16).tobytes() + \
        np.isnan(v).tobytes() + np.sign(np.where(np.isinf(v), v, 0)).astype(np.int8).tobytes()


# ---- enumeration ----

def enumerate_terms(layers):
    """(term, fingerprint) by size, grown from class representatives (module doc). `layers` is a list of
    (ops, size): the terms of each layer use those ops and grow to that size (Enumo's layered workloads: the
    whole language to a small size, a part of it further)."""
    env = _fingerprint_inputs()
    reps: dict[bytes, tuple] = {}
    leaves = [("var", v) for v in VARS] + [("lit", c) for c in LITERALS]
    for t in leaves:
        reps.setdefault(fingerprint(t, env), t)
    out, seen = [], set()
    for ops, max_size in layers:
        by_size: dict[int, list] = {1: leaves}
        for k in range(2, max_size + 1):
            terms = [(op, a) for op in UNARY if op in ops for a in by_size.get(k - 1, [])]
            for i in range(1, k - 1):
                for op in (b for b in BINARY if b in ops):
                    terms += [(op, a, b) for a, b in itertools.product(by_size.get(i, []), by_size.get(k - 1 - i, []))]
            by_size[k] = []
            for t in terms:
                f = fingerprint(t, env)
                if t not in seen:
                    seen.add(t)
                    out.append((t, f))
                if reps.setdefault(f, t) == t:
                    by_size[k].append(t)
    return out, reps


# ---- a small e-graph over terms, for derivability ----

class _EGraph:
    def __init__(self):
        self.parent: list[int] = []
        self.memo: dict[tuple, int] = {}
        self.nodes: dict[int, set] = {}

    def find(self, a: int) -> int:
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def add(self, t) -> int:
        if t[0] in ("var", "lit"):
            node = t
        else:
            node = (t[0],) + tuple(self.add(c) for c in t[1:])
        return self._add_node(node)

    def _add_node(self, node) -> int:
        node = self._canon(node)
        if node in self.memo:
            return self.find(self.memo[node])
        cid = len(self.parent)
        self.parent.append(cid)
        self.memo[node] = cid
        self.nodes[cid] = {node}
        return cid

    def _canon(self, node):
        if node[0] in ("var", "lit"):
            return node
        return (node[0],) + tuple(self.find(c) for c in node[1:])

    def union(self, a: int, b: int) -> bool:
        a, b = self.find(a), self.find(b)
        if a == b:
            return False
        self.parent[b] = a
        self.nodes[a] |= self.nodes.pop(b)
        return True

    def rebuild(self) -> None:
        changed = True
        while changed:
            changed = False
            memo: dict = {}
            for node, cid in list(self.memo.items()):
                canon, cid = self._canon(node), self.find(cid)
                if canon in memo and self.find(memo[canon]) != cid:
                    self.union(memo[canon], cid)
                    changed = True
                memo[canon] = self.find(cid)
            self.memo = memo
            for cid in list(self.nodes):
                if cid in self.nodes and self.find(cid) == cid:
                    self.nodes[cid] = {self._canon(n) for n in self.nodes[cid]}

    def match(self, pattern, cid: int, env: dict):
        """Bindings of pattern variables (("var", name) in a rule: any class) that make pattern match cid."""
        cid = self.find(cid)
        if pattern[0] == "var":
            bound = env.get(pattern[1])
            if bound is None:
                yield {**env, pattern[1]: cid}
            elif self.find(bound) == cid:
                yield env
            return
        for node in list(self.nodes.get(cid, ())):
            if node[0] != pattern[0] or len(node) != len(pattern):
                continue
            if pattern[0] == "lit":
                if node[1] == pattern[1]:
                    yield env
                continue
            envs = [env]
            for p, c in zip(pattern[1:], node[1:]):
                envs = [e2 for e in envs for e2 in self.match(p, c, e)]
            yield from envs

    def instantiate(self, pattern, env: dict) -> int:
        if pattern[0] == "var":
            return env[pattern[1]]
        if pattern[0] == "lit":
            return self._add_node(pattern)
        return self._add_node((pattern[0],) + tuple(self.instantiate(p, env) for p in pattern[1:]))

    def saturate(self, rules, iterations: int = 3, node_limit: int = 60000) -> None:
        for _ in range(iterations):
            merges = []
            for lhs, rhs in rules:
                for cid in list(self.nodes):
                    for env in self.match(lhs, cid, {}):
                        merges.append((cid, rhs, env))
            changed = False
            for cid, rhs, env in merges:
                if len(self.parent) > node_limit:
                    break
                changed |= self.union(cid, self.instantiate(rhs, env))
            self.rebuild()
            if not changed:
                return


# ---- labels ----

_SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 3.0, np.finfo(np.float32).max, -np.finfo(np.float32).max,
                      1.8e19, -1.8e19, np.finfo(np.float32).tiny, 1e-45, -1e-45, np.inf, -np.inf, np.nan],
                     np.float32)


def _battery(t_vars: set, seed: int = 0) -> dict:
    """float32 inputs (B, N, N): every combination of the specials for the rule's variables (each matrix
    filled with one value per combination), then random values of every magnitude with specials mixed in."""
    rng = np.random.default_rng(seed)
    names = sorted(t_vars) or ["x"]
    combos = np.array(list(itertools.product(range(len(_SPECIALS)), repeat=len(names))))
    env = {}
    for k, name in enumerate(VARS):
        if name in names:
            full = np.broadcast_to(_SPECIALS[combos[:, names.index(name)]][:, None, None], (len(combos), N, N))
        else:
            full = np.zeros((len(combos), N, N), np.float32)
        r = (rng.standard_normal((3000, N, N)) * 10.0 ** rng.uniform(-6, 6, (3000, N, N))).astype(np.float32)
        mix = rng.random(r.shape) < 0.15
        r[mix] = rng.choice(_SPECIALS, int(mix.sum()))
        env[name] = np.concatenate([full, r]).astype(np.float32)
    return env


def battery_label(lhs, rhs) -> str:
    """The strongest label under which the two sides agree on the battery (module doc), or "reals"."""
    env = _battery(_vars(lhs) | _vars(rhs))
    with np.errstate(all="ignore"):
        a = np.broadcast_to(np.asarray(evaluate(lhs, env, np.float32), np.float32), _shape(env))
        b = np.broadcast_to(np.asarray(evaluate(rhs, env, np.float32), np.float32), _shape(env))
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if np.array_equal(nan_a, nan_b) and np.array_equal(a.view(np.uint32)[~nan_a], b.view(np.uint32)[~nan_b]):
        return "exact"
    if _within_tolerance(a, b):
        return "rounding"
    return "reals"


def _within_tolerance(e, a) -> bool:
    """Per input set (the first axis), what `compare_outputs` asks of float32 (superopt/core/verify.py): NaN
    and inf where the expected side's are, finite values within the elementwise and normwise tolerances."""
    e, a = e.astype(np.float64), a.astype(np.float64)
    if not np.array_equal(np.isnan(e), np.isnan(a)):
        return False
    inf = np.isinf(e) | np.isinf(a)
    if not np.array_equal(e[inf], a[inf]):
        return False
    tol, norm_tol = TOLERANCES["float32"]
    tiny = float(np.finfo(np.float32).tiny)
    finite = ~(np.isnan(e) | inf)
    ef, af = np.where(finite, e, 0.0), np.where(finite, a, 0.0)
    af = np.where((np.abs(ef) < tiny) & (np.abs(af) < tiny), ef, af)
    axes = tuple(range(1, e.ndim))
    scale = np.maximum(np.max(np.abs(ef), axis=axes, keepdims=True), tiny)
    if not np.all(np.abs(ef - af) <= tol * (np.abs(ef) + scale)):
        return False
    norm = np.sqrt(np.sum((ef - af) ** 2, axis=axes)) / np.maximum(np.sqrt(np.sum(ef ** 2, axis=axes)), tiny)
    return bool(np.all(norm <= norm_tol))


# ---- as superopt rules ----

def to_pattern(t, names: dict):
    op = t[0]
    if op == "var":
        return names[t[1]]
    if op == "lit":
        return lit(t[1], "float32")
    if op == "pow2":
        return app("integer_pow", to_pattern(t[1], names), 2)
    if op == "transpose":
        return app("transpose", to_pattern(t[1], names), (1, 0))
    if op in UNARY:
        return app("unary", op, to_pattern(t[1], names))
    if op == "matmul":
        return app("matmul", to_pattern(t[1], names), to_pattern(t[2], names), "float32")
    return app("binary", op, to_pattern(t[1], names), to_pattern(t[2], names))


def as_rule(name: str, lhs, rhs, numerics: str) -> Rule:
    """The synthesized equality as a superopt rule, under the conditions it was proven in: float32 inputs
    of one shape, square matrices where a matmul or transpose appears."""
    used = sorted(_vars(lhs))
    names = dict(zip(VARS, tensors(" ".join(VARS))))
    conditions = [when("has_dtype", names[v], "float32") for v in used]
    conditions += [when("same_shape", names[a], names[b]) for a, b in zip(used, used[1:])]
    if (_ops(lhs) | _ops(rhs)) & {"matmul", "transpose"}:
        conditions += [when("rank", names[v], 2) for v in used] + [when("square", names[v]) for v in used]
    return Rule(name, ((to_pattern(lhs, names), to_pattern(rhs, names)),), tuple(conditions), False, numerics,
                f"{show(lhs)} -> {show(rhs)} (synthesized)", source="<synthesized>")


# ---- the search ----

@dataclass
class Synthesized:
    rules: list = field(default_factory=list)         # (lhs, rhs, label, Rule)
    terms: int = 0
    classes: int = 0
    candidates: int = 0
    derivable: int = 0
    refuted: int = 0
    seconds: float = 0.0
    stages: dict = field(default_factory=dict)

    def ruleset(self, name: str = "synthesized") -> RuleSet:
        return RuleSet(name, {"synthesized": [r for *_, r in self.rules]})


def _acceptable(lhs, rhs) -> bool:
    """Rules superopt can state as rewrites: the right side's variables bound by the left, and a right side
    with a variable where the left has one (a lone literal would change the shape). Of the rules without
    variables, only an op of a literal that is a literal (exp(0) = 1): the rest is constant folding."""
    if not _vars(lhs):
        return size(lhs) == 2 and rhs[0] == "lit"
    return _vars(rhs) <= _vars(lhs) and bool(_vars(rhs))


ALL = frozenset(UNARY + BINARY)
# Enumo's layers: the whole language to 4 nodes; products and transposes, and exponentials with products
# and sums, to 5 (exp(x) * exp(y), (x @ y) @ z)
LAYERS = ((ALL, 4), (frozenset({"matmul", "transpose", "add"}), 5), (frozenset({"exp", "log", "add", "mul"}), 5))


def synthesize(layers=LAYERS, examples: int = 40, jobs: int = 1, progress=None) -> Synthesized:
    """Enumerate, label, prove and minimize (module doc); `jobs` processes run the checker."""
    start = time.perf_counter()
    out = Synthesized()
    terms, reps = enumerate_terms(layers)
    out.terms, out.classes = len(terms), len(reps)
    out.stages["enumerate"] = time.perf_counter() - start
    candidates = []
    for t, f in terms:
        r = reps[f]
        if t != r and _acceptable(t, r):
            candidates.append((t, r))
    candidates.sort(key=lambda c: (max(size(c[0]), size(c[1])), size(c[0]) + size(c[1]), repr(c)))
    out.candidates = len(candidates)
    clock = {"label": 0.0, "derive": 0.0, "check": 0.0}
    strict_rules: list = []
    all_rules: list = []

    def derivable(lhs, rhs, label) -> bool:
        t0 = time.perf_counter()
        found = derives(strict_rules if label in STRICT else all_rules, lhs, rhs)
        clock["derive"] += time.perf_counter() - t0
        return found

    pool = _pool(jobs)
    try:
        queue = iter(candidates)
        while True:
            batch = []      # the next candidates the rules kept so far do not derive, one or two per worker
            for lhs, rhs in queue:
                t0 = time.perf_counter()
                label = battery_label(lhs, rhs)
                clock["label"] += time.perf_counter() - t0
                if derivable(lhs, rhs, label):
                    out.derivable += 1
                    continue
                batch.append((lhs, rhs, label))
                if len(batch) >= 2 * jobs:
                    break
            if not batch:
                break
            t0 = time.perf_counter()
            labels = [LABELS[LABELS.index(label):] for _, _, label in batch]
            work = [(as_rule("synth-candidate", lhs, rhs, "exact"), ls, examples)
                    for (lhs, rhs, _), ls in zip(batch, labels)]
            proofs = list(pool.map(_prove, work)) if pool else [_prove(w) for w in work]
            clock["check"] += time.perf_counter() - t0
            for (lhs, rhs, label), proven in zip(batch, proofs):
                if proven is None:
                    out.refuted += 1
                elif derivable(lhs, rhs, proven):      # by a rule kept earlier in this batch
                    out.derivable += 1
                else:
                    out.rules.append((lhs, rhs, proven, None))
                    all_rules.append((lhs, rhs))
                    if proven in STRICT:
                        strict_rules.append((lhs, rhs))
                    if progress:
                        progress(f"({proven}) {show(lhs)} -> {show(rhs)}")
    finally:
        if pool:
            pool.shutdown()
    t0 = time.perf_counter()
    out.rules = _minimal(out)
    out.stages.update(clock, minimize=time.perf_counter() - t0)
    out.seconds = time.perf_counter() - start
    return out


def _prove(work) -> str | None:
    """The first of the labels under which the checker finds no counterexample, or None."""
    rule, labels, examples = work
    for label in labels:
        labelled = Rule(rule.name, rule.pairs, rule.when, False, label, rule.doc, source=rule.source)
        if check_rule(labelled, examples, shrink=False).sound:
            return label
    return None


def _pool(jobs: int):
    if jobs <= 1:
        return None
    return ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))


def _minimal(out: Synthesized) -> list:
    """Drop each rule the others derive (the last kept first: the largest), a strict rule only by strict
    ones; then number the rest."""
    kept = list(out.rules)
    for i in range(len(kept) - 1, -1, -1):
        lhs, rhs, label, _ = kept[i]
        others = [(a, b) for j, (a, b, other, _) in enumerate(kept)
                  if j != i and (label == "reals" or other != "reals")]
        if derives(others, lhs, rhs):
            del kept[i]
            out.derivable += 1
    return [(lhs, rhs, label, as_rule(f"synth-{k}", lhs, rhs, label)) for k, (lhs, rhs, label, _) in enumerate(kept, 1)]


# ---- how much of algebra.py it finds ----

def hand_written_in_language(ruleset) -> dict:
    """{rule name: (lhs, rhs)} of the hand-written rules whose patterns lie in the language, as terms."""
    out = {}
    for r in ruleset:
        if len(r.pairs) != 1 or any(name not in ("has_dtype", "same_shape", "matmul_ok", "rank", "fits",
                                                 "swaps_last_two") for name, _ in r.when):
            continue
        try:
            lhs, rhs = (_from_pattern(p, {}) for p in r.pairs[0])
        except ValueError:
            continue
        out[r.name] = (lhs, rhs)
    return out


def _from_pattern(p, names: dict):
    if isinstance(p, Var):
        if p.sort != TENSOR:
            raise ValueError(p)
        return ("var", names.setdefault(p.name, VARS[len(names)] if len(names) < len(VARS) else "?"))
    fn, args = p.fn, p.args
    value = lambda a: a.value if isinstance(a, Const) else None   # noqa: E731
    if fn == "lit" and value(args[0]) in LITERALS:
        return ("lit", float(value(args[0])))
    if fn == "unary" and value(args[0]) in UNARY:
        return (value(args[0]), _from_pattern(args[1], names))
    if fn == "binary" and value(args[0]) in BINARY:
        return (value(args[0]), _from_pattern(args[1], names), _from_pattern(args[2], names))
    if fn == "integer_pow" and value(args[1]) == 2:
        return ("pow2", _from_pattern(args[0], names))
    if fn == "matmul":
        return ("matmul", _from_pattern(args[0], names), _from_pattern(args[1], names))
    if fn == "transpose" and isinstance(args[1], Var):     # a 2-D transpose: (1, 0)
        return ("transpose", _from_pattern(args[0], names))
    raise ValueError(p)


def derives(rules, lhs, rhs, iterations: int = 4) -> bool:
    """Whether equality saturation with `rules`, from an e-graph of the two terms alone, joins them."""
    g = _EGraph()
    a, b = g.add(lhs), g.add(rhs)
    g.saturate(rules, iterations, node_limit=3000)
    return g.find(a) == g.find(b)


def rediscovered(found: Synthesized, hand: dict, iterations: int = 4) -> dict:
    """{hand-written rule: True if the synthesized rules derive it}."""
    rules = [(lhs, rhs) for lhs, rhs, *_ in found.rules]
    out = {}
    for name, (lhs, rhs) in hand.items():
        if "?" not in show(lhs) + show(rhs):
            out[name] = derives(rules, lhs, rhs, iterations)
    return out

