"""The text format for rules: s-expressions that files can hold and non-Python authors can write.

    (rule matmul-assoc
      (matmul (matmul ?x ?y ?d) ?z ?d) <=> (matmul ?x (matmul ?y ?z ?d) ?d)
      :when ((has_dtype ?x ?d) (matmul_ok ?y ?z))
      :numerics reals :category matmul :ruleset algebra
      :doc "(x@y)@z <-> x@(y@z)")

`:given ((positive ?x))` declares domain conditions (rewrites/functions.py `given`): proven by the analysis, or
assumed by a search that speculates and checked at run time.

`:numerics` is `exact`, `rounding`, `order` or `reals` (rewrites/rule.py; `exact` when left out); `:targets (cpu)`
limits a rule to those kinds of target (every kind when left out). `=>` is one-way,
`<=>` two-way, and `(group (LHS => RHS) ...)` matches several patterns together.
Elementwise ops and reductions are written by name (`(add ?x ?y)`, `(exp ?x)`, `(reduce_sum ?x [1])`);
a variable op is written `(binary ?op ?x ?y)`. Vectors are `[0 1 2]`, strings are JSON strings, and a
variable's sort comes from where it first appears. `dialect="taso"` also reads the operator names of
TASO and Tensat rules (see `rewrites/taso.py`). Every rule prints in this format and reads back equal.
"""
from __future__ import annotations

import json
import re

from superopt.core.ops import BINARY_OPS, REDUCTIONS, SCANS, UNARY_OPS, WINDOW_REDUCTIONS
from superopt.rewrites.functions import PREDICATES, given
from superopt.rewrites.pattern import (
    ATTRIBUTE_FNS,
    CONSTRUCTORS,
    DTYPE,
    FLOAT,
    FORMAT,
    INT,
    OP,
    TENSOR,
    VEC,
    App,
    Const,
    Var,
    app,
)
from superopt.rewrites.rule import Rule
from superopt.rewrites.taso import Noop, expand

_TOKEN = re.compile(r'\s*(?:(;[^\n]*)|([()\[\]])|("(?:[^"\\]|\\.)*")|([^\s()\[\]";]+))')


class ParseError(ValueError):
    pass


# ---- printing ----

def format_pattern(p) -> str:
    if isinstance(p, Var):
        return f"?{p.name}"
    if isinstance(p, Const):
        if p.sort == VEC:
            return "[" + " ".join(str(v) for v in p.value) + "]"
        if p.sort in (DTYPE, OP, FORMAT):
            return json.dumps(p.value)
        return repr(float(p.value)) if p.sort == FLOAT else str(int(p.value))
    args = list(p.args)
    head = p.fn
    if p.fn in ("unary", "binary", "reduce", "pool", "scan") and isinstance(args[0], Const):
        head, args = args[0].value, args[1:]
    if p.fn == "tcons" or p.fn == "tnil":
        items = []
        while isinstance(p, App) and p.fn == "tcons":
            items.append(p.args[0])
            p = p.args[1]
        if isinstance(p, App) and p.fn == "tnil":
            return "(list" + "".join(" " + format_pattern(i) for i in items) + ")"
    return "(" + " ".join([head] + [format_pattern(a) for a in args]) + ")"


def format_rule(r: Rule) -> str:
    lines = [f"(rule {r.name}"]
    if len(r.pairs) == 1:
        (lhs, rhs), = r.pairs
        lines.append(f"  {format_pattern(lhs)} {'<=>' if r.two_way else '=>'} {format_pattern(rhs)}")
    else:
        lines.append("  (group " + " ".join(f"({format_pattern(l)} => {format_pattern(h)})" for l, h in r.pairs) + ")")
    if r.when:
        lines.append("  :when (" + " ".join("(" + " ".join([n] + [format_pattern(a) for a in args]) + ")"
                                         for n, args in r.when) + ")")
    if r.given:
        lines.append("  :given (" + " ".join(f"({c.name} {format_pattern(c.arg)})" for c in r.given) + ")")
    lines.append(f"  :numerics {r.numerics} :category {json.dumps(r.category)} :ruleset {json.dumps(r.ruleset)}"
                 + (f" :targets ({' '.join(r.targets)})" if r.targets else ""))
    lines.append(f"  :doc {json.dumps(r.doc)})")
    return "\n".join(lines)


def format_rules(rules) -> str:
    return "\n\n".join(format_rule(r) for r in rules) + "\n"


# ---- reading ----

def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ParseError(f"cannot read {text[pos:pos + 20]!r}")
        pos = m.end()
        if m.group(1) is None:
            out.append(next(g for g in m.groups()[1:] if g is not None))
    return out


def _tree(tokens: list[str]):
    """Nested lists; `[...]` becomes ("vec", [...])."""
    stack: list = [[]]
    for tok in tokens:
        if tok in "([":
            stack.append([] if tok == "(" else ["__vec__"])
        elif tok in ")]":
            if len(stack) == 1:
                raise ParseError("unbalanced closing bracket")
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(tok)
    if len(stack) != 1:
        raise ParseError("unbalanced opening bracket")
    return stack[0]


class _Reader:
    def __init__(self, dialect: str):
        if dialect not in ("superopt", "taso"):
            raise ValueError(f"unknown dialect {dialect!r}")
        self.dialect = dialect
        self.vars: dict[str, Var] = {}

    def var(self, name: str, sort: str) -> Var:
        v = self.vars.setdefault(name, Var(name, sort))
        if v.sort != sort:
            raise ParseError(f"?{name} is used as a {v.sort} and as a {sort}")
        return v

    def atom(self, tok, sort: str):
        if isinstance(tok, list):
            if tok and tok[0] == "__vec__":
                return Const(tuple(int(v) for v in tok[1:]), VEC)
            return self.term(tok, sort)
        if tok.startswith("?"):
            return self.var(tok[1:], sort)
        if tok.startswith('"'):
            return Const(json.loads(tok), sort)
        try:
            return Const(int(tok), INT) if sort == INT else Const(float(tok), FLOAT)
        except ValueError:
            raise ParseError(f"expected a {sort}, got {tok!r}") from None

    def term(self, node: list, sort: str = TENSOR):
        if not node or not isinstance(node[0], str):
            raise ParseError(f"expected (op args...), got {node!r}")
        head, rest = node[0], node[1:]
        if self.dialect == "taso":
            try:
                expanded = expand(self, head, rest)
            except ValueError as exc:
                raise ParseError(str(exc)) from exc
            if expanded is not None:
                return expanded
        if head in UNARY_OPS:
            return app("unary", head, *[self.atom(a, TENSOR) for a in rest])
        if head in BINARY_OPS:
            return app("binary", head, *[self.atom(a, TENSOR) for a in rest])
        if head in REDUCTIONS:
            return app("reduce", head, self.atom(rest[0], TENSOR), self.atom(rest[1], VEC))
        if head in SCANS:
            return app("scan", head, self.atom(rest[0], TENSOR), self.atom(rest[1], INT), self.atom(rest[2], INT))
        if head in WINDOW_REDUCTIONS:
            return app("pool", head, self.atom(rest[0], TENSOR), *(self.atom(a, VEC) for a in rest[1:]))
        if head == "list":
            out = app("tnil")
            for item in reversed(rest):
                out = app("tcons", self.atom(item, TENSOR), out)
            return out
        if head in CONSTRUCTORS or head in ATTRIBUTE_FNS:
            sorts = (CONSTRUCTORS.get(head) or ATTRIBUTE_FNS[head])[0]
            if len(rest) != len(sorts):
                raise ParseError(f"{head} takes {len(sorts)} arguments, got {len(rest)}")
            return app(head, *[self.atom(a, s) for a, s in zip(rest, sorts)])
        raise ParseError(f"unknown operator {head!r}")

    def pair(self, items: list) -> tuple:
        if len(items) != 3 or items[1] not in ("=>", "<=>"):
            raise ParseError(f"expected LHS => RHS or LHS <=> RHS, got {items!r}")
        head = items[0][0] if isinstance(items[0], list) and items[0] else None
        sort = CONSTRUCTORS[head][1] if head in CONSTRUCTORS else TENSOR  # kernel-body rules are Scalar-rooted
        return self.atom(items[0], sort), self.atom(items[2], sort), items[1] == "<=>"

    def rule(self, node: list) -> Rule:
        if len(node) < 2 or node[0] != "rule":
            raise ParseError("a rule starts with (rule NAME ...)")
        name, body = node[1], node[2:]
        self.vars = {}
        if body and isinstance(body[0], list) and body[0] and body[0][0] == "group":
            pairs = [self.pair(p)[:2] for p in body[0][1:]]
            two_way, body = False, body[1:]
        else:
            lhs, rhs, two_way = self.pair(body[:3])
            pairs, body = [(lhs, rhs)], body[3:]
        if self.dialect == "taso" and len(pairs) == 1:
            pairs = _ungroup(pairs[0])
        options = {"when": [], "given": [], "numerics": "exact", "category": "", "ruleset": "", "doc": "", "targets": ()}
        for key, value in zip(body[::2], body[1::2]):
            if key == ":when":
                options["when"] = [self.predicate(p) for p in value]
            elif key == ":given":
                options["given"] = [given(p[0], self.atom(p[1], TENSOR)) if isinstance(p, list) and len(p) == 2
                                    else _bad_given(p) for p in value]
            elif key == ":targets" and isinstance(value, list) and all(isinstance(k, str) for k in value):
                options["targets"] = tuple(value)
            elif key in (":numerics", ":category", ":ruleset", ":doc"):
                options[key[1:]] = json.loads(value) if value.startswith('"') else value
            else:
                raise ParseError(f"rule {name}: unknown option {key!r}")
        return Rule(name, tuple(pairs), tuple(options["when"]), two_way, options["numerics"], options["doc"],
                    options["category"], options["ruleset"], source="<text>", targets=options["targets"],
                    given=tuple(options["given"]))

    def predicate(self, node: list) -> tuple:
        name, args = node[0], node[1:]
        if name not in PREDICATES:
            raise ParseError(f"unknown predicate {name!r}")
        sorts = PREDICATES[name].sorts
        if len(args) != len(sorts):
            raise ParseError(f"predicate {name} takes {len(sorts)} arguments")
        return name, tuple(self.atom(a, s) for a, s in zip(args, sorts))


def _bad_given(node):
    raise ParseError(f"a domain condition is (CONDITION ?x), not {node!r}")


def _ungroup(pair) -> list:
    """TASO's `noop` joins several outputs: (noop a b) => (noop c d) matches a and b together."""
    lhs, rhs = pair
    if isinstance(lhs, Noop) or isinstance(rhs, Noop):
        if not (isinstance(lhs, Noop) and isinstance(rhs, Noop) and len(rhs.args) == len(lhs.args)):
            raise ParseError("noop must appear on both sides with as many operands")
        return list(zip(lhs.args, rhs.args))
    return [pair]


def parse_rules(text: str, dialect: str = "superopt") -> list[Rule]:
    reader = _Reader(dialect)
    return [reader.rule(node) for node in _tree(_tokens(text))]


def parse_rule(text: str, dialect: str = "superopt") -> Rule:
    rules = parse_rules(text, dialect)
    if len(rules) != 1:
        raise ParseError(f"expected one rule, found {len(rules)}")
    return rules[0]
