"""Compile a rule's patterns to egglog rules.

Each (lhs, rhs) pair becomes `rule(eq(root).to(lhs), *conditions).then(union(root).with_(rhs))`.
Predicates with several alternatives (a disjunction) give one egglog rule per alternative, and rules
whose predicates or attribute functions loop over a vector are expanded once per rank up to `MAX_RANK`.
Shapes used anywhere in a rule are bound in its query, because egglog cannot look a function up in an
action.
"""
from __future__ import annotations

import itertools

from egglog import String, Vec, eq, f64, i64, union, var
from egglog import rule as egg_rule

from superopt.egraph import terms as T
from superopt.rewrites.functions import ATTRIBUTES, PREDICATES
from superopt.rewrites.pattern import (
    CONSTRUCTORS, DTYPE, FLOAT, FORMAT, INT, LIST, OP, SCALAR, TENSOR, VEC, App, Const, Pattern, Var,
)

MAX_RANK = 6
_EGG_SORTS = {TENSOR: T.Tensor, SCALAR: T.Scalar, LIST: T.TList, VEC: Vec[i64], DTYPE: String, OP: String, FLOAT: f64, INT: i64,
              FORMAT: String}
_CONSTRUCTOR_FNS = {"arg": T.arg, "const": T.const, "lit": T.lit, "iota": T.iota, "unary": T.unary,
                    "binary": T.binary, "integer_pow": T.integer_pow, "select": T.select, "convert": T.convert,
                    "matmul": T.matmul, "conv": T.conv, "reduce": T.reduce, "argreduce": T.argreduce, "scan": T.scan,
                    "transpose": T.transpose, "reshape": T.reshape, "broadcast": T.broadcast, "concat": T.concat,
                    "slice": T.slice_, "pad": T.pad, "pool": T.pool, "tnil": T.tnil, "tcons": T.tcons,
                    "kernel": T.kernel, "sarg": T.sarg, "sunary": T.sunary, "sbinary": T.sbinary,
                    "sselect": T.sselect, "sconvert": T.sconvert, "spow": T.spow, "sbcast": T.sbcast,
                    "srow": T.srow, "sperm": T.sperm, "smm": T.smm, "sconv": T.sconv,
                    "schain": T.schain, "sconvchain": T.sconvchain, "pack": T.pack, "unpack": T.unpack,
                    "fractal_matmul": T.fractal_matmul}
assert set(_CONSTRUCTOR_FNS) == set(CONSTRUCTORS), "every constructor needs an egglog function"


class CompileContext:
    """Egglog variables and query facts for one expansion of one rule."""

    def __init__(self, ranks: dict[Var, int]):
        self.ranks = ranks
        self.facts: list = []
        self._vars: dict[Var, object] = {}
        self._shapes: dict[Pattern, object] = {}

    def rank(self, v: Pattern) -> int:
        if isinstance(v, Const) and v.sort == VEC:
            return len(v.value)
        if v not in self.ranks:
            raise KeyError(f"the rank of {v!r} is not fixed in this expansion (declare it in `ranks`)")
        return self.ranks[v]

    def var(self, v: Var):
        if v not in self._vars:
            self._vars[v] = var(v.name, _EGG_SORTS[v.sort])
        return self._vars[v]

    def dtype(self, p: Pattern):
        if ("dtype", p) not in self._shapes:
            dv = var(f"dtype_{len(self._shapes)}", String)
            self.facts.append(eq(dv).to(T.dtype(self.expr(p))))
            self._shapes[("dtype", p)] = dv
        return self._shapes[("dtype", p)]

    def bind(self, expr, sort):
        """A query variable equal to `expr`: egglog looks up a function's value (not a constructor's) in
        a rule's query only, so a right-hand side reads it through this variable."""
        v = var(f"bound_{len(self._shapes)}", sort)
        self.facts.append(eq(v).to(expr))
        self._shapes[("bound", len(self._shapes))] = v
        return v

    def shape(self, p: Pattern):
        if p not in self._shapes:
            sv = var(f"shape_{len(self._shapes)}", Vec[i64])
            self.facts.append(eq(sv).to(T.shape(self.expr(p))))
            self._shapes[p] = sv
        return self._shapes[p]

    def expr(self, p: Pattern):
        if isinstance(p, Var):
            return self.var(p)
        if isinstance(p, Const):
            return _constant(p)
        if p.fn in ATTRIBUTES:
            return ATTRIBUTES[p.fn].egg(self, *p.args)
        return _CONSTRUCTOR_FNS[p.fn](*(self.expr(a) for a in p.args))


def _constant(c: Const):
    if c.sort == VEC:
        return Vec[i64](*(i64(v) for v in c.value)) if c.value else Vec[i64].empty()
    return {DTYPE: String, OP: String, FORMAT: String, FLOAT: f64, INT: i64}[c.sort](c.value)


def _rank_keys(rule) -> list[Pattern]:
    keys: list[Pattern] = []

    def visit(p):
        stack = [p]
        while stack:
            q = stack.pop()
            if isinstance(q, App):
                if q.fn in ATTRIBUTES:
                    keys.extend(ATTRIBUTES[q.fn].ranks(*q.args))
                stack.extend(q.args)

    for lhs, rhs in rule.pairs:
        visit(lhs)
        visit(rhs)
    for name, args in _conditions(rule):
        keys.extend(PREDICATES[name].ranks(*args))
        for a in args:
            visit(a)
    return list(dict.fromkeys(keys))


def _rank_fact(ctx: CompileContext, key: Pattern, r: int):
    length = ctx.shape(key).length() if key.sort == TENSOR else ctx.expr(key).length()
    return eq(length).to(i64(r))


def _conditions(rule) -> tuple:
    """The predicates the analysis must prove: `when`, and the domain conditions (`given`) of a rule that does
    not speculate."""
    if getattr(rule, "speculative", False):
        return tuple(rule.when)
    return getattr(rule, "conditions", tuple(rule.when))   # a foreign rule object (a test's) has `when` only


def _assumptions(ctx: CompileContext, rule) -> tuple[list, list]:
    """(query facts, actions) of a speculating rule: each assumed operand's class holds a node of the captured
    program (`origin`, egraph/encode.py), and the rule records the condition on that node (`assumed`)."""
    if not getattr(rule, "speculative", False):
        return [], []
    query, actions = [], []
    for k, cond in enumerate(rule.given):
        node = var(f"origin_{k}", i64)
        query.append(T.origin(ctx.expr(cond.arg), node))
        actions.append(T.assumed(String(cond.name), node))
    return query, actions


def compile_rule(rule) -> list:
    """All egglog rules for `rule` (every direction, rank and predicate alternative)."""
    keys = _rank_keys(rule)
    roots = [Var(f"root_{i}", lhs.sort) for i, (lhs, _) in enumerate(rule.pairs)]
    directions = [rule.pairs] + ([[(rhs, lhs) for lhs, rhs in rule.pairs]] if rule.two_way else [])
    out = []
    for pairs in directions:
        for combo in itertools.product(range(MAX_RANK + 1), repeat=len(keys)):
            ctx = CompileContext(dict(zip(keys, combo)))
            query = [eq(ctx.var(root)).to(ctx.expr(lhs)) for root, (lhs, _) in zip(roots, pairs)]
            actions = [union(ctx.var(root)).with_(ctx.expr(rhs)) for root, (_, rhs) in zip(roots, pairs)]
            alternatives = [PREDICATES[name].egg(ctx, *args) for name, args in _conditions(rule)]
            rank_facts = [_rank_fact(ctx, k, r) for k, r in zip(keys, combo)]
            assumed, records = _assumptions(ctx, rule)
            for chosen in itertools.product(*alternatives):
                facts = [f for alt in chosen for f in alt]
                out.append(egg_rule(*query, *assumed, *ctx.facts, *rank_facts, *facts).then(*actions, *records))
    if not out and getattr(rule, "given", ()) and not getattr(rule, "speculative", False):
        return []   # a domain condition no analysis proves: the rule runs only where a search speculates
    if not out:
        raise ValueError(f"rule {rule.name!r} compiles to no egglog rule (its predicates never hold)")
    return out
