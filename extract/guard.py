"""Guarded programs: a rewrite that holds on part of the input space only, made legal by a check at run time.

Two kinds of rewrite need one. A "reals" rewrite (below) under strict numerics, whose check bounds the
arguments' magnitudes; and a rule with domain conditions (rewrites/functions.py `given`: an operand nonneg,
positive, finite or moderate) that the analysis cannot prove, whose check tests each condition on the value of
the captured program the rule assumed it of (`unproven`, `check_graph`'s `conditions`; docs/design.md). Either
way the original runs where the check fails.

A "reals" rewrite (superopt/numerics.py: a matrix product re-associated, a full sum of products factored) breaks
the strict contract in one way that no bound on rounding covers: an intermediate of the rewritten program may
overflow where the original's do not (`a @ (b @ v)` with `b @ v` past the range, `a @ b` not). Where neither
program can overflow, the two compute the same sums of the same products added in another order, as an "order"
rewrite does, and each value is within the reordered-sum bound of the original's (README's contract;
`core/verify.py`, `reordered_sum_bound`; proven below). Where terms cancel exactly that bound can be all of the
value: nothing here proves more.

What the check excludes, and what it does not. `exponent` bounds every value of a program of polynomial ops
(products, sums, contractions, moves, quotients by a constant) from above: given float arguments whose elements
are finite and at most 2**e in magnitude, every value is at most 2**hi, with hi the sum of its factors' bounds
for a product and log2 of the number of terms more for a sum. That holds for the computed values too, not only
the exact ones: 2**hi (and k 2**h, for a partial sum of k terms of at most 2**h, k <= 2**p) is a float, and
rounding to nearest is monotone, so a computed value whose exact result (of computed operands) is within such a
bound stays within it; flushing to zero only shrinks values. `exponent` returns the largest such e for which
every value of the original and of the rewritten program is at most 2**(the dtype's largest exponent): neither
overflows. The program superopt returns runs the rewritten program where every float argument it reads is finite
and at most 2**e in magnitude, and the original otherwise (`lowering/jax.py`); the check (`check_graph`) is one
pass over each argument. Small elements are not excluded (weights, activations and gradients are full of them):
what they can do is bounded instead, by the absolute term of the bound below.

The bound on a sum computed in another order (`reordered_sum_bound`). Model of one float op (Higham, Accuracy
and Stability of Numerical Algorithms, 2nd ed., sections 2.1-2.4): fl(z) = z (1 + d) + h, |d| <= u, |h| <= l,
u the unit roundoff and l the underflow step of the op's dtype. With gradual underflow l would be half the
smallest subnormal, for products only (a sum that underflows is exact). XLA's CPU kernels flush subnormal
results and arguments to zero in float32, bfloat16 and float64 (measured; tests/test_guard.py checks it), so
there any result, a sum's included, may lose up to the smallest normal number, and an argument element below it
is read as 0: l is the dtype's smallest normal number, and each leaf (an argument element, a constant) may be
off by up to l too. float16 is computed in float32 and rounded to float16 with gradual underflow: l is half its
smallest subnormal. Moves, negation and abs do not round.

Write an output of a polynomial program as its formal expansion y = sum_t c_t prod_(leaves of t), n terms
(every sum, difference, contraction and reuse of a value expanded; a quotient by a constant is a product with its
reciprocal, a leaf), and let
    T = sum_t |c_t prod ...|                      the sum of the terms' magnitudes,
    W = sum_t prod_(leaves of t) max(1, |leaf|)   each term with its factors below 1 raised to 1,
    m = the most multiplications, quotients and conversions in one term.
Claim: the computed value ŷ satisfies
    |ŷ - y| <= ((1 + u)**K - 1) T + (1 + u)**K ((1 + l)**N - 1) W,   K = n - 1 + m,  N = n + 2 m,
with u and l the largest over the program's float dtypes. Two programs with the same terms (an "order" rewrite, a
guarded "reals" rewrite: the same products, summed in another order or grouping) differ by at most twice that.

Proof. (1) Majorants. Evaluate the program on magnitudes twice: G, exactly (so G >= |value| at every value, and
G = T at an output), and Ĝ, with every leaf raised by l and every rounding op computing (1 + u) (its op on the
operands' Ĝ) + l. By induction over the program, each computed value v' of a value v has |v' - v| <= Ĝ_v - G_v
(and so |v'| <= Ĝ_v). For a product, |x'y'(1 + d) + h - xy| <= (1 + u)|x'y' - xy| + u|xy| + l, and
|x'y' - xy| <= |x'||y' - y| + |y||x' - x| <= Ĝ_x (Ĝ_y - G_y) + G_y (Ĝ_x - G_x) = Ĝ_x Ĝ_y - G_x G_y, so the error
is at most (1 + u) Ĝ_x Ĝ_y + l - G_x G_y = Ĝ - G. A sum is the same with + for the product; a quotient by a
constant is a product with an exact leaf; a conversion rounds one operand; a move, negation or abs changes
neither side (abs is 1-Lipschitz); a sum of k terms is k - 1 additions in whatever order the program adds them;
a fused multiply-add rounds once, within the model. So |ŷ - y| <= Ĝ - T at each output.
(2) Expansion. Unfold the program into a tree (a value read twice becomes two copies, with the same Ĝ). Then Ĝ
is a polynomial with nonnegative coefficients in the leaves' magnitudes, l and (1 + u). Each of its monomials
follows one choice at each sum down from the output and stops at a set S of nodes (rounding ops or leaves)
where it takes l instead of the node's value; extending its choices below S in any way gives a term t whose
tree holds S, a different (t, S) for each monomial. The monomial is at most (1 + u)**K_t l**|S| times the
product of t's leaves not below S, K_t the rounding ops of t's tree. With S empty these sum to at most
(1 + u)**K T; the rest to at most (1 + u)**K sum_t prod_(leaves of t) max(1, |leaf|) sum_(S nonempty) l**|S|
<= (1 + u)**K W ((1 + l)**N - 1), N_t the rounding ops and leaves of t's tree.
(3) Counting. t's tree holds at most n - 1 additions: switching the choice at one of them gives a term that
differs from t first there, a different one for each. It holds at most m multiplications, quotients and
conversions, and at most m + 1 leaves (each product or quotient joins two subtrees). So K_t <= n - 1 + m and
N_t <= n + 2 m, and Ĝ - T is at most the claim.

Read plainly: (1 + u)**K - 1 is about K u, so the first term is the standard bound on a sum in any order (Higham
section 4.2, the products' roundings added); the second is about (n + 2 m) l W, far below any float32 result
of ordinary size (l = 2**-126), which is what elements too small to matter can do. Where (n + 2 m) u is not small
(a sum of 2**20 float32 products) the bound says little, as the standard one does.
"""
from __future__ import annotations

import dataclasses
import math

import ml_dtypes
import numpy as np

from superopt.core.dtypes import exp_moderate_bound, is_float, moderate_bounds, smallest_normal
from superopt.core.ir import Graph, Node, unfused
from superopt.core.reference import constant_values
from superopt.core import lazy
from superopt.core.serial import array_digest

encoding = lazy.module("superopt.egraph.encode")
runner = lazy.module("superopt.egraph.runner")
frozen = lazy.module("superopt.egraph.frozen")
forked = lazy.module("superopt.core.forked")

# The least exponent worth a check: with a range below 2**8, data of ordinary scale (activations and counts in
# the hundreds) would fail it and the original would run after it.
MIN_EXPONENT = 8

_MOVES = frozenset({"neg", "abs", "transpose", "reshape", "broadcast", "slice", "reduce_max", "reduce_min",
                    "stop_gradient"})
_UNIONS = frozenset({"concat", "max", "min", "pad"})
_SUMS = frozenset({"add", "sub"})


def _float_info(dtype: str):
    """(significand bits, largest exponent of a finite value) of a float dtype, or None for any other dtype."""
    if dtype == "bool" or not is_float(dtype) or np.dtype(dtype).kind == "c":
        return None
    info = ml_dtypes.finfo(np.dtype(dtype))
    return info.nmant + 1, int(info.maxexp) - 1


class _Unbounded(Exception):
    """The program has an op the analysis does not bound."""


def _literal(values: np.ndarray):
    """(least, largest) exponent bounds of a known value's nonzero magnitudes: None where it is all zeros."""
    mags = np.abs(np.asarray(values, dtype=np.float64)).ravel()
    if not np.all(np.isfinite(mags)):
        raise _Unbounded("a constant is not finite")
    mags = mags[mags != 0]
    if mags.size == 0:
        return None
    return math.floor(math.log2(mags.min())), math.ceil(math.log2(mags.max()))


def _max(bounds):
    bounds = [b for b in bounds if b is not None]
    return max(bounds) if bounds else None


def _sum(bound, terms: int, p: int):
    """The bound of a sum of `terms` values each at most 2**bound, as computed: k 2**bound is a float for k < 2**p,
    so each partial sum stays within it; past that each addition may round up by a factor (1 + 2**-p)."""
    if bound is None:
        return None
    terms = max(terms, 1)
    extra = math.log2(terms) + (0.0 if terms <= 2 ** p else (terms - 1) * math.log2(1 + 2.0 ** -p))
    return bound + math.ceil(extra)


def _states(flat: Graph, e: int) -> bool:
    """Whether every value of `flat` (a program without kernel nodes: `unfused`) is finite, given float arguments
    whose elements are finite and at most 2**e in magnitude. Raises _Unbounded for a program the analysis does not
    cover."""
    state: dict[int, int | None] = {}     # the exponent bound of each value's magnitudes; None: always zero
    divisors: dict[int, int] = {}         # constants with no zero element (and their moves): their least exponent
    known, constant = _constant_values(flat), flat.constant_nodes()
    for i in flat.live():
        node: Node = flat.nodes[i]
        info = _float_info(node.dtype)
        if i in constant and info is None:
            continue                      # an integer or bool constant, for nodes computed from constants alone
        if info is None or (i not in known and any(j not in state for j in node.inputs)):
            raise _Unbounded(f"{node.op} of {node.dtype}")
        p, largest = info
        ins = [state.get(j) for j in node.inputs]   # a constant's own operands are not read: it is known
        if node.op == "arg":
            s = e
        elif node.op in ("lit", "const") or i in known:
            values = known[i] if i in known else np.asarray(node.attrs[0]) if node.op == "lit" else \
                flat.consts[node.attrs[0]]
            bounds = _literal(values)
            s = None if bounds is None else bounds[1]
            if bounds is not None and np.all(values != 0):
                divisors[i] = bounds[0]
        elif node.op in _MOVES:
            s = ins[0]
            if node.inputs[0] in divisors:
                divisors[i] = divisors[node.inputs[0]]
        elif node.op == "div" and node.inputs[1] in divisors:   # a mean's division by its count
            s = None if ins[0] is None else ins[0] - divisors[node.inputs[1]]
        elif node.op in _UNIONS or node.op == "convert":
            s = _max(ins)
        elif node.op in ("mul", "square") or (node.op == "integer_pow" and node.attrs[0] >= 1):
            factors = ins if node.op == "mul" else [ins[0]] * (2 if node.op == "square" else node.attrs[0])
            s = None if any(f is None for f in factors) else sum(factors)
        elif node.op in _SUMS:
            s = _sum(_max(ins), 2, p)
        elif node.op == "reduce_sum":
            shape = flat.nodes[node.inputs[0]].shape
            s = _sum(ins[0], int(np.prod([shape[a] for a in node.attrs[0]], dtype=np.int64)), p)
        elif node.op == "matmul":
            product = None if ins[0] is None or ins[1] is None else ins[0] + ins[1]
            s = _sum(product, flat.nodes[node.inputs[0]].shape[-1], p)
        else:
            raise _Unbounded(node.op)
        if s is not None and s > largest:
            return False
        state[i] = s
    return True


def _constant_values(flat: Graph) -> dict:
    """The values of the nodes computed from constants alone other than literals and constants (an identity
    matrix from iota and a comparison, a loop's known start): bounded as the constants they are."""
    computed = sorted(i for i in flat.constant_nodes() if flat.nodes[i].op not in ("lit", "const"))
    return dict(zip(computed, constant_values(flat, computed))) if computed else {}


def exponent(*graphs: Graph) -> int | None:
    """The largest e (at least MIN_EXPONENT) such that, for float arguments whose elements are finite and at most
    2**e in magnitude, no value of any of `graphs` overflows; None where a graph has an op the analysis does not
    bound, or no such e exists."""
    flats = [unfused(g) for g in graphs]
    try:
        if not all(_states(g, MIN_EXPONENT) for g in flats):
            return None
        lo, hi = MIN_EXPONENT, 1 << 12   # bisect: a wider range only widens every bound
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if all(_states(g, mid) for g in flats):
                lo = mid
            else:
                hi = mid - 1
        return lo
    except _Unbounded:
        return None


def worth_trying(graph: Graph) -> bool:
    """Whether a guarded program may pay for `graph`: some result of it is computed by ops the analysis bounds
    (`exponent`) and has a sum or a matrix product, which "reals" rules re-associate or factor. The other
    results (a sort, a loop, a cumsum beside it) do not stop it: a guarded program bounds only the results
    its search changed (`changed_results`)."""
    flat = unfused(graph)
    for k in range(len(flat.outputs)):
        part = results_only(flat, [k])
        ops = part.op_counts()
        if "matmul" not in ops and "reduce_sum" not in ops:
            continue
        try:
            if _states(part, MIN_EXPONENT):
                return True
        except _Unbounded:
            continue
    return False


def results_only(graph: Graph, results: list[int]) -> Graph:
    """`graph` computing only the results at positions `results` (its other nodes are not live)."""
    return dataclasses.replace(graph, outputs=[graph.outputs[k] for k in results])


def changed_results(before: Graph, after: Graph) -> list[int]:
    """The positions of the results `after` computes otherwise than `before` does: all but those whose whole
    computation is the same ops on the same operands in both (kernels unfused; constants by their values;
    arguments and opaque primitives by identity). What both compute alike needs no bound: a guarded program
    runs it as the original does."""
    graphs = [unfused(before), unfused(after)]
    if len(graphs[0].outputs) != len(graphs[1].outputs):
        return list(range(len(graphs[1].outputs)))
    ids: dict[tuple, int] = {}   # one number per distinct computation, shared by both graphs (hash-consing)
    numbered = []
    for graph in graphs:
        number: dict[int, int] = {}
        for j in graph.live():   # operands before their users
            node = graph.nodes[j]
            if node.op == "const":
                attrs = (array_digest(graph.consts[node.attrs[0]]),)
            elif node.op == "opaque":
                attrs = (id(graph.opaque[node.attrs[0]]), node.attrs[1])
            else:
                attrs = node.attrs
            number[j] = ids.setdefault((node.op, attrs, node.shape, node.dtype,
                                        tuple(number[c] for c in node.inputs)), len(ids))
        numbered.append([number[o] for o in graph.outputs])
    return [k for k, (a, b) in enumerate(zip(*numbered)) if a != b]


def checked_args(*graphs: Graph) -> tuple[int, ...]:
    """The arguments the run-time check reads: every one that one of `graphs` reads."""
    return tuple(sorted({g.nodes[i].attrs[0] for g in graphs for i in g.live() if g.nodes[i].op == "arg"}))


def check_graph(exponent: int | None, args: tuple[int, ...], *graphs: Graph, conditions: tuple = (),
                base: Graph | None = None) -> Graph:
    """The run-time check as a program, priced like any other and lowered as it is (lowering/jax.py): its one
    output (int8) is 0 exactly where the guarded program may run, 1 elsewhere. It passes where
      - every element of the arguments `args` (`arg` nodes of `graphs`) is finite and at most 2**exponent in
        magnitude (a guarded "reals" rewrite; no such test where `exponent` is None), and
      - each domain condition (name, node) of `conditions` holds for every element of that node of `base`
        (the program as captured, whose nodes the check computes as it does): `nonneg`, no element below -0;
        `positive`, none below the dtype's smallest normal number; `finite`, none NaN or inf; `moderate` and
        `exp_moderate`, finite and within their bounds of magnitude (core/dtypes.py). NaN passes the first
        two, as it does in the analysis that proves them (egraph/analysis.py) and in the checker that proves
        the rules (rewrites/checker.py).
    One fused pass per shape of value checked: each position's flag, 0 where every test of that shape passes
    there and 1 elsewhere (NaN fails every comparison, so it flags 1 where a comparison must hold), and their
    max. The flags are int8, not the floats themselves: XLA's CPU max reduction of floats dropped a NaN element
    (measured), and a max of small integers is the cheapest reduction it runs. Two 768x768 float32 arguments
    checked on their own took 0.27 ms of CPU time (medians), against 0.38 ms for an excess per element summed by
    matrix-vector products with ones (the check before) and 0.31 ms for the max of |x| alone, which misses NaN;
    checked ahead of `sum(a @ b)`, one pass over both added 3.2% to its CPU time, one per argument 5.0% (on the
    loaded 2-core development machine)."""
    if base is not None and conditions:   # the captured program's nodes, so the conditions' ids stay valid
        check = dataclasses.replace(base, nodes=list(base.nodes), outputs=[], guard=None, scopes={},
                                    hidden_outputs=0)
    else:
        check = Graph(n_args=graphs[0].n_args if graphs else base.n_args)
    present = {n.attrs[0]: i for i, n in enumerate(check.nodes) if n.op == "arg"}
    nodes = {n.attrs[0]: n for g in graphs for n in g.nodes if n.op == "arg"}

    def fill(value, shape: tuple, dtype: str) -> int:
        return check.add(Node("broadcast", (check.add(Node("lit", (), (value,), (), dtype)),), ((),), shape, dtype))

    def value(k: int) -> int:
        if k not in present:
            present[k] = check.add(nodes[k])
        return present[k]

    bounds: dict[int, _Bounds] = {}   # node of `check` -> what its elements must meet
    for k in args if exponent is not None else ():
        bounds.setdefault(value(k), _Bounds()).meet("at_most", 2.0 ** exponent)
    for name, i in conditions:
        bounds.setdefault(i, _Bounds()).condition(name, check.nodes[i].dtype)
    passes: dict[tuple, int] = {}   # shape -> the bool node where every test of that shape passes
    for i, b in bounds.items():
        ok = b.test(check, i, fill)
        if ok is not None:
            shape = check.nodes[i].shape
            passes[shape] = ok if shape not in passes else check.add(Node("and", (passes[shape], ok), (), shape,
                                                                          "bool"))
    worst = None
    for shape, ok in passes.items():
        flags = check.add(Node("select", (ok, fill(1, shape, "int8"), fill(0, shape, "int8")), (), shape,
                               "int8"))   # select's operands: the condition, the value where false, where true
        flag = check.add(Node("reduce_max", (flags,), (tuple(range(len(shape))),), (), "int8"))
        worst = flag if worst is None else check.add(Node("max", (worst, flag), (), (), "int8"))
    if worst is None:   # nothing to check (fn takes no argument, or only arguments that bound nothing)
        worst = check.add(Node("lit", (), (0,), (), "int8"))
    check.outputs = [worst]
    return check


def check_of(graph: Graph) -> Graph | None:
    """The check a guarded `graph` runs before it (`check_graph` on its guard), a program priced like any other
    and lowered as it is; None where `graph` has no guard."""
    g = graph.guard
    if g is None:
        return None
    return check_graph(g.exponent, g.args, g.fallback, graph, conditions=g.conditions, base=g.fallback)


@dataclasses.dataclass
class _Bounds:
    """What every element of one checked value must meet, all of a guard's tests on it merged into one interval
    (so the check compares each element once or twice: a chain of comparisons per condition cost twice as
    much, measured): at least `least` (signed), at least `least_magnitude` and at most `most` in magnitude;
    NaN passes only where every test on the value lets it (`nonneg` and `positive` do, as the analysis that
    proves them does), and a value of a dtype that is not a float fails where a test needs one."""
    least: float | None = None
    least_magnitude: float | None = None
    most: float | None = None
    impossible: bool = False

    def meet(self, what: str, bound: float) -> None:
        if what == "at_least":
            self.least = bound if self.least is None else max(self.least, bound)
        elif what == "at_least_magnitude":
            self.least_magnitude = bound if self.least_magnitude is None else max(self.least_magnitude, bound)
        else:
            self.most = bound if self.most is None else min(self.most, bound)

    def condition(self, name: str, dtype: str) -> None:
        """Add domain condition `name` (core/ir.py DOMAIN_CHECKS) on a value of `dtype`."""
        floating = is_float(dtype)
        if name == "nonneg":
            if np.dtype(dtype).kind not in "ub":
                self.meet("at_least", 0.0)
        elif name == "positive":
            self.meet("at_least", smallest_normal(dtype) if floating else 1.0)
        elif name in ("finite", "moderate", "exp_moderate"):
            if not floating:
                self.impossible = name != "finite"   # an integer is finite, and neither of the others
                return
            if name == "finite":
                self.meet("at_most", float(ml_dtypes.finfo(np.dtype(dtype)).max))
            elif name == "moderate":
                lo, hi = moderate_bounds(dtype)
                self.meet("at_least_magnitude", lo)
                self.meet("at_most", hi)
            else:
                self.meet("at_most", exp_moderate_bound(dtype))
        else:
            raise ValueError(f"superopt: no run-time check for domain condition {name!r}")

    def test(self, graph: Graph, i: int, fill) -> int | None:
        """The bool node (added to `graph`) true where node `i`'s element meets these bounds; None where every
        element of its dtype does."""
        node = graph.nodes[i]
        shape, dtype = node.shape, node.dtype

        def add(op, *ins, out=None):
            return graph.add(Node(op, ins, (), shape, out or dtype))
        if self.impossible:   # an integer value: x != x is false everywhere
            return add("ne", i, i, out="bool")
        if self.most is None and self.least_magnitude is None:
            if self.least is None:
                return None
            return add("not", add("lt", i, fill(self.least, shape, dtype), out="bool"), out="bool")   # NaN passes
        # an interval on x, or on |x|; NaN fails both comparisons, so it fails here (as it must: a bound on the
        # magnitude is a test NaN does not pass)
        most = self.most if self.most is not None else np.inf
        if self.least is not None or self.least_magnitude is None:
            least = max(b for b in (self.least, self.least_magnitude, -most) if b is not None)
            x = i
        else:
            least, x = self.least_magnitude, add("abs", i)
        clamped = add("max", add("min", x, fill(most, shape, dtype)), fill(least, shape, dtype))
        return add("eq", clamped, x, out="bool")


def unproven(graph: Graph, assumed, facts: dict | None = None) -> tuple:
    """The domain conditions of `assumed` ((name, node id of `graph`) pairs a speculative search recorded) that
    the analysis does not prove of `graph` as captured, in order: those the run-time check must test. The facts
    come from the analysis of `graph` alone (its own e-graph, no rule run), never from the speculative
    e-graph, whose classes an assumption may have joined (exp(log(x)) -> x would make x look nonneg there).
    `facts`: those facts, where the speculative search's child read them before its first rule ran."""
    if not assumed:
        return ()
    if facts is None:   # not read where the speculative search encoded `graph` (egraph/isolate.py)
        with encoding.template() as template:   # the process's template, which holds the analysis rule set
            if template is not None and forked.enabled():   # written in a child: the template stays as it is
                facts = forked.Forked(_facts, graph, template).result()
            else:
                facts = _facts(graph, None)
    return tuple(sorted((name, i) for name, i in assumed if name not in facts.get(i, ())))


def _facts(graph: Graph, egraph) -> dict:
    """The analysis's facts of each node of `graph` (`frozen.node_facts`), encoded on `egraph` (a new e-graph
    where None: registering the analysis rule set in one took 0.15 s of every guarded program's first call)."""
    enc = encoding.encode(graph, origins=True, egraph=egraph)
    runner.saturate_analysis(enc.egraph)
    return frozen.node_facts(enc.egraph)


def describe_conditions(graph: Graph, conditions) -> str:
    """The report's words for domain conditions on nodes of `graph`: 'argument 0 >= smallest normal, ...'."""
    words = {"nonneg": "no element below -0", "positive": "every element at least the smallest normal number",
             "finite": "every element finite",
             "moderate": "every element finite, of magnitude within the square roots of the normal range",
             "exp_moderate": "every element finite, of magnitude at most half the log of the largest value, less 1"}
    out = []
    for name, i in conditions:
        node = graph.nodes[i]
        what = f"argument {node.attrs[0]}" if node.op == "arg" else f"the {node.op} -> {node.dtype}{list(node.shape)}"
        out.append(f"{what}: {words.get(name, name)}")
    return "; ".join(out)
