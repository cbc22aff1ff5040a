"""Tensat's published rule files, read as they are, each rule given a verdict.

Tensat (uwplse/tensat) ships TASO's generated rules as `converted.txt` (one `LHS=>RHS` per line) and
`converted_multi.txt` (every two lines one rule whose two patterns match together). Its operators carry
TASO's arguments:

    (ewadd a b) (ewmul a b)   elementwise, equal shapes      (smul a s)     a times a rank-0 s
    (relu a) (tanh a) (sigmoid a)                            (transpose a)  the 2-D transpose
    (matmul act a b)          a @ b, then activation act (0 none, 1 sigmoid, 2 relu, 3 tanh)
    (conv2d sh sw pad act x w) x NCHW, w OIHW (groups = C / I), stride, padding 0 SAME or 1 VALID
    (concat axis rank a b)    a and b joined on axis, both of that rank
    (split_0 (split axis x)), (split_1 ...)  the parts of x, cut where the concat x is made of joins

The verdict is proven, not sampled (`rewrites/symbolic.py`): both sides are evaluated at several small
shapes with every input element a distinct symbol, and the output terms compared. Equal up to commuting
+ and * is `exact`; equal once sums are flattened is `order` (the same products added in another
grouping, which strict runs): both are sound. Equal only as polynomials is "unsound in floating point,
holds over the reals", and a shrunk float32 counterexample shows where it breaks; unequal even as
polynomials is unsound outright. A sound rule without convolutions is also a superopt `Rule`, with the
shape conditions under which both of its sides are well-formed, and can join a schedule (`ruleset`).
"""
from __future__ import annotations

from dataclasses import dataclass

from superopt.rewrites import symbolic
from superopt.rewrites.pattern import (
    DTYPE,
    INT,
    TENSOR,
    Const,
    Var,
    app,
    concat,
    dim,
    iadd,
    lit,
    ones_like,
    set_at,
    shape_of,
    slice_,
    zeros_like,
)
from superopt.rewrites.rule import Rule, RuleSet, when
from superopt.rewrites.sexpr import ParseError, _tokens, _tree

KNOWN = {("ewadd", 2), ("ewmul", 2), ("smul", 2), ("relu", 1), ("tanh", 1), ("sigmoid", 1), ("transpose", 1),
         ("matmul", 2), ("matmul", 3), ("conv2d", 6), ("concat", 3), ("concat", 4), ("split_0", 1), ("split_1", 1)}
# Tensat's other operators (its model language): read by neither published rule file, and not judged here.
UNMODELLED = frozenset({"poolavg", "poolmax", "Iconv", "Cpool", "enlarge", "reshape", "merge", "noop", "input",
                        "weight", "split", "batchnorm", "dropout", "unsqueeze", "pad"})


class Unsupported(ValueError):
    """A rule that reads but cannot be judged (the message says why)."""


@dataclass
class Verdict:
    """One rule of a file: where it is, its text, and what was found."""
    index: int                  # 1-based, in the file's order
    text: str
    status: str                 # "sound", "unsound" or "unsupported"
    numerics: str = ""          # sound: "exact" or "order"; unsound: "reals" where it holds over the reals
    detail: str = ""            # unsound: the counterexample; unsupported: why; sound: why it is not a Rule
    rule: Rule | None = None    # a sound rule superopt's term language can state

    def __str__(self) -> str:
        if self.status == "sound":
            what = f"sound ({self.numerics})"
        elif self.status == "unsound":
            what = "unsound in floating point, holds over the reals" if self.numerics == "reals" else \
                "unsound, even over the reals"
        else:
            what = "unsupported"
        return f"{self.index:>4}  {what}: {self.text}" + (f"\n        {self.detail}" if self.detail else "")


def parse(lines: list[str]) -> list[tuple]:
    """The (lhs, rhs) trees of one rule's lines; every operator checked against Tensat's."""
    pairs = []
    for line in lines:
        if "=>" not in line:
            raise ParseError(f"expected LHS=>RHS, got {line!r}")
        left, right = line.split("=>", 1)
        (lhs,), (rhs,) = _tree(_tokens(left)), _tree(_tokens(right))
        for side in (lhs, rhs):
            _check(side)
        pairs.append((lhs, rhs))
    bound = {v for lhs, _ in pairs for v in symbolic.leaves(lhs)}
    free = sorted({v for _, rhs in pairs for v in symbolic.leaves(rhs)} - bound)
    if free:
        raise Unsupported(f"the right side names {', '.join(free)}, which no left side binds")
    return pairs


def _check(tree) -> None:
    if isinstance(tree, str):
        if not tree.startswith("?"):
            raise Unsupported(f"the constant {tree!r}")
        return
    head, rest = tree[0], tree[1:]
    if (head, len(rest)) not in KNOWN:
        if head in UNMODELLED:
            raise Unsupported(f"operator {head} is Tensat's, but the verdicts do not model it")
        raise Unsupported(f"operator {head} with {len(rest)} arguments is not one of Tensat's")
    numeric = {"matmul": 1 if len(rest) == 3 else 0, "conv2d": 4, "concat": len(rest) - 2}.get(head, 0)
    for tok in rest[:numeric]:
        if not (isinstance(tok, str) and tok.lstrip("-").isdigit()):
            raise ParseError(f"{head}: expected a literal integer, got {tok!r}")
    if head in ("split_0", "split_1"):
        inner = rest[0]
        if not (isinstance(inner, list) and len(inner) == 3 and inner[0] == "split"):
            raise Unsupported(f"{head} applies to (split axis x)")
        if symbolic.concat_within(inner[2], int(inner[1])) is None:
            raise Unsupported(f"{head}: the split operand is not made of a concat on axis {inner[1]}: "
                              "where to cut is unknown")
        _check(inner[2])
        return
    for t in rest[numeric:]:
        _check(t)


def verdict(pairs: list, index: int, text: str, name: str = "tensat") -> Verdict:
    """Judge one parsed rule (module doc)."""
    draws = symbolic.shapes(pairs)
    if not draws:
        return Verdict(index, text, "unsupported", detail="no shapes of sizes 1 to 3 make both sides well-formed")
    label = symbolic.label(pairs, draws)
    if label in ("exact", "order"):
        try:
            rule, note = as_rule(pairs, label, f"{name}-{index}", text, draws[0]), ""
        except Unsupported as exc:
            rule, note = None, f"not a superopt rule: {exc}"
        return Verdict(index, text, "sound", label, note, rule)
    found = symbolic.float_counterexample(pairs, draws)
    if not found:
        found = "no float32 counterexample found in the search; not sound by the symbolic comparison"
    return Verdict(index, text, "unsound", "reals" if label == "reals" else "", found)


def _variables(side: str) -> set[str]:
    return {tok.strip("()") for tok in side.replace("(", " ").replace(")", " ").split() if tok.startswith("?")}


def looks_multi(text: str) -> bool:
    """Whether `text` reads as Tensat's multi-pattern format: an even number of lines, some line's right
    side names a variable its own left side does not bind, and in every pair of lines (1-2, 3-4, ...) the
    two left sides together bind both right sides' variables. A file of single rules has no unbound line
    (such a line is no rule on its own)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines or len(lines) % 2 or any("=>" not in line for line in lines):
        return False
    sides = [tuple(_variables(part) for part in line.split("=>", 1)) for line in lines]
    if all(rhs <= lhs for lhs, rhs in sides):
        return False
    return all(sides[i][1] | sides[i + 1][1] <= sides[i][0] | sides[i + 1][0] for i in range(0, len(sides), 2))


def import_rules(text: str, multi: bool | None = None, name: str | None = None) -> list[Verdict]:
    """A verdict for every rule of a Tensat file (`multi`: every two lines one rule; None: as the file
    reads, `looks_multi`). Rule i is named `{name}-{i}`, name "tensat" or "tensat-multi" by default."""
    if multi is None:
        multi = looks_multi(text)
    name = name or ("tensat-multi" if multi else "tensat")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    groups = [lines[i:i + 2] for i in range(0, len(lines), 2)] if multi else [[line] for line in lines]
    out = []
    for i, group in enumerate(groups, 1):
        text_of = " ; ".join(group)
        try:
            pairs = parse(group)
        except (Unsupported, ParseError) as exc:
            out.append(Verdict(i, text_of, "unsupported", detail=str(exc)))
            continue
        out.append(verdict(pairs, i, text_of, name))
    return out


def summary(verdicts: list[Verdict]) -> str:
    """The last line of an import: `N rules: parsed P, sound S, unsound U, unsupported X`."""
    count = {s: sum(v.status == s for v in verdicts) for s in ("sound", "unsound", "unsupported")}
    parsed = count["sound"] + count["unsound"]
    return (f"{len(verdicts)} rules: parsed {parsed}, sound {count['sound']}, unsound {count['unsound']}, "
            f"unsupported {count['unsupported']}")


def ruleset(verdicts: list[Verdict], name: str = "tensat") -> RuleSet:
    """The sound rules superopt can state, as a rule set a schedule takes (`superopt(fn, rulesets=...)`)."""
    return RuleSet(name, {"imported": [v.rule for v in verdicts if v.rule is not None]})


# ---- a sound rule as a superopt Rule ----

def as_rule(pairs, numerics: str, name: str, text: str, shapes: dict) -> Rule:
    """The rule in superopt's term language, with the conditions under which both sides are well-formed."""
    ranks = {name: len(shape) for name, shape in shapes.items()}
    writer = _Writer(ranks)
    patterns = [(writer.term(lhs), writer.term(rhs)) for lhs, rhs in pairs]
    for lhs, rhs in pairs:
        writer.same(writer.dims(lhs), writer.dims(rhs))
    conditions = [when("rank", writer.var(n), r) for n, r in sorted(ranks.items())] + writer.conditions
    try:
        return Rule(name, tuple(patterns), tuple(dict.fromkeys(conditions)), False, numerics, text,
                    source="<tensat>")
    except (ValueError, TypeError) as exc:
        raise Unsupported(str(exc)) from None


class _Writer:
    """Tensat trees to patterns, and each operator's shape requirements as `equal` conditions on the sizes
    of the inputs' axes (a size is a sum of input axes where concats join them)."""

    def __init__(self, ranks: dict):
        self.ranks, self.vars, self.conditions = ranks, {}, []

    def var(self, name: str) -> Var:
        return self.vars.setdefault(name, Var(name, TENSOR))

    def _dtype(self):
        return self.vars.setdefault("dtype", Var("dtype", DTYPE))

    def term(self, tree):
        if isinstance(tree, str):
            return self.var(tree[1:])
        head, rest = tree[0], tree[1:]
        if head == "ewadd" or head == "ewmul":
            return app("binary", "add" if head == "ewadd" else "mul", self.term(rest[0]), self.term(rest[1]))
        if head == "smul":
            return app("binary", "mul", self.term(rest[0]), self.term(rest[1]))
        if head in ("relu", "tanh", "sigmoid"):
            return self._activate(self.term(rest[0]), head)
        if head == "transpose":
            return app("transpose", self.term(rest[0]), (1, 0))
        if head == "matmul":
            act, (a, b) = (int(rest[0]), rest[1:]) if len(rest) == 3 else (0, rest)
            x, y = self.term(a), self.term(b)
            self.conditions += [when("has_dtype", x, self._dtype()), when("has_dtype", y, self._dtype())]
            return self._activate(app("matmul", x, y, self._dtype()), symbolic.ACTIVATIONS[act])
        if head == "concat":
            axis, _, (a, b) = symbolic.concat_args(rest)
            return concat([self.term(a), self.term(b)], axis)
        if head in ("split_0", "split_1"):
            axis, whole = int(rest[0][1]), rest[0][2]
            first = self.term(symbolic.concat_args(symbolic.concat_within(whole, axis)[1:])[2][0])
            x, ax = self.term(whole), Const(axis, INT)
            start = zeros_like(x) if head == "split_0" else set_at(zeros_like(x), ax, dim(first, ax))
            limit = set_at(shape_of(x), ax, dim(first, ax)) if head == "split_0" else shape_of(x)
            return slice_(x, start, limit, ones_like(x))
        raise Unsupported(f"{head}: superopt's convolution is NHWC with HWIO kernels and no groups; TASO's "
                          "NCHW conv2d has no term here")

    def _activate(self, x, act):
        if act is None:
            return x
        if act == "relu":
            return app("binary", "max", x, lit(0.0, self._dtype()))
        return app("unary", "logistic" if act == "sigmoid" else act, x)

    # shapes as sums of input axes

    def dims(self, tree) -> list[tuple]:
        if isinstance(tree, str):
            return [((tree[1:], i),) for i in range(self.ranks[tree[1:]])]
        head, rest = tree[0], tree[1:]
        if head in ("ewadd", "ewmul"):
            a, b = self.dims(rest[0]), self.dims(rest[1])
            self.same(a, b)
            return a
        if head in ("smul", "relu", "tanh", "sigmoid"):
            return self.dims(rest[0])
        if head == "transpose":
            return self.dims(rest[0])[::-1]
        if head == "matmul":
            a, b = self.dims(rest[-2]), self.dims(rest[-1])
            self.same([a[1]], [b[0]])
            return [a[0], b[1]]
        if head == "concat":
            axis, _, (x, y) = symbolic.concat_args(rest)
            a, b = self.dims(x), self.dims(y)
            self.same([d for i, d in enumerate(a) if i != axis], [d for i, d in enumerate(b) if i != axis])
            return [tuple(sorted(d + b[axis])) if i == axis else d for i, d in enumerate(a)]
        axis, whole = int(rest[0][1]), rest[0][2]          # split_0, split_1
        joined = symbolic.concat_within(whole, axis)
        operand = symbolic.concat_args(joined[1:])[2][0 if head == "split_0" else 1]
        part = self.dims(operand)[int(joined[1])]
        return [part if i == axis else d for i, d in enumerate(self.dims(whole))]

    def same(self, a: list, b: list) -> None:
        for x, y in zip(a, b):
            if x != y:
                x, y = sorted((x, y))
                self.conditions.append(when("equal", self._size(x), self._size(y)))

    def _size(self, terms: tuple):
        out = None
        for name, axis in terms:
            d = dim(self.var(name), axis)
            out = d if out is None else iadd(out, d)
        return out
