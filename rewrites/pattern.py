"""The pattern language rules are written in: typed variables, term constructors, attribute functions.

A pattern is data (`Var`, `Const`, `App`), so one rule serves three readers: the egglog compiler
(`rewrites/compile.py`), the s-expression text format (`rewrites/sexpr.py`) and the soundness checker's
numpy evaluation (`rewrites/checker.py`). Constructor names and argument sorts are `egraph/signatures.py`'s
`CONSTRUCTORS`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from superopt.egraph.signatures import (  # noqa: F401  (the DSL's sorts and constructor signatures)
    CONSTRUCTORS, DTYPE, FLOAT, FORMAT, INT, LIST, OP, SCALAR, SCALAR_AS_TENSOR, SCALAR_FNS, SORTS, TENSOR, VEC,
)

# Attribute functions: computed attributes in a rule's right-hand side, name -> (argument sorts, result).
ATTRIBUTE_FNS: dict[str, tuple[tuple[str, ...], str]] = {
    "compose": ((VEC, VEC), VEC),          # compose(p, q)[i] = p[q[i]]
    "shape_of": ((TENSOR,), VEC),          # the shape of a bound tensor
    "dtype_of": ((TENSOR,), DTYPE),        # the dtype of a bound tensor
    "dim": ((TENSOR, INT), INT),           # dim(t, i) = shape_of(t)[i]
    "zeros_like": ((TENSOR,), VEC),        # (0,) * rank(t)
    "ones_like": ((TENSOR,), VEC),         # (1,) * rank(t)
    "set_last": ((VEC, INT), VEC),         # v with its last entry replaced
    "set_at": ((VEC, INT, INT), VEC),      # v with entry i replaced
    "center_low": ((TENSOR, TENSOR), VEC),   # (ref - t) // 2 on the last two axes, 0 elsewhere
    "center_high": ((TENSOR, TENSOR), VEC),  # the rest of (ref - t) on the last two axes
    "iadd": ((INT, INT), INT),
    "fadd": ((FLOAT, FLOAT), FLOAT), "fsub": ((FLOAT, FLOAT), FLOAT), "fmul": ((FLOAT, FLOAT), FLOAT),
    "fdiv": ((FLOAT, FLOAT), FLOAT), "fmax": ((FLOAT, FLOAT), FLOAT), "fmin": ((FLOAT, FLOAT), FLOAT),
    "last_axis_of": ((TENSOR,), VEC),      # (rank(t) - 1,)
    "axes_of": ((TENSOR,), VEC),           # (0, 1, ..., rank(t) - 1): every axis
    "int32_conv": ((INT,), INT),           # conv params k accumulating in int32 (egraph/encode.py)
}


class Pattern:
    """Base of pattern nodes."""
    sort: str


@dataclass(frozen=True)
class Var(Pattern):
    name: str
    sort: str

    def __post_init__(self):
        if self.sort not in SORTS:
            raise ValueError(f"pattern variable {self.name!r}: unknown sort {self.sort!r}")

    def __repr__(self):
        return f"?{self.name}"


@dataclass(frozen=True)
class Const(Pattern):
    value: Any
    sort: str

    def __repr__(self):
        return repr(self.value)


@dataclass(frozen=True)
class App(Pattern):
    fn: str
    args: tuple

    @property
    def sort(self) -> str:
        return signature(self.fn)[1]

    def __repr__(self):
        return f"{self.fn}({', '.join(map(repr, self.args))})"


def signature(fn: str) -> tuple[tuple[str, ...], str]:
    if fn in CONSTRUCTORS:
        return CONSTRUCTORS[fn]
    if fn in ATTRIBUTE_FNS:
        return ATTRIBUTE_FNS[fn]
    raise KeyError(f"unknown constructor or attribute function {fn!r}")


def _coerce(value, sort: str, where: str) -> Pattern:
    if isinstance(value, Pattern):
        if value.sort != sort:
            raise TypeError(f"{where}: expected a {sort}, got {value!r} of sort {value.sort}")
        return value
    if sort == VEC and isinstance(value, (tuple, list)):
        return Const(tuple(int(v) for v in value), VEC)
    if sort in (DTYPE, OP, FORMAT) and isinstance(value, str):
        return Const(value, sort)
    if sort == FLOAT and isinstance(value, (int, float)):
        return Const(float(value), FLOAT)
    if sort == INT and isinstance(value, int):
        return Const(int(value), INT)
    raise TypeError(f"{where}: cannot use {value!r} as a {sort}")


def app(fn: str, *args) -> App:
    sorts, _ = signature(fn)
    if len(args) != len(sorts):
        raise TypeError(f"{fn} takes {len(sorts)} arguments, got {len(args)}")
    return App(fn, tuple(_coerce(a, s, f"{fn} argument {i}") for i, (a, s) in enumerate(zip(args, sorts))))


def variables(pattern: Pattern) -> list[Var]:
    """Variables in order of first appearance (iterative: patterns may be deep)."""
    out, seen, stack = [], set(), [pattern]
    while stack:
        p = stack.pop()
        if isinstance(p, Var):
            if p not in seen:
                seen.add(p)
                out.append(p)
        elif isinstance(p, App):
            stack.extend(reversed(p.args))
    return out


# ---- typed variables ----

def _declare(sort: str):
    def declare(names: str) -> list[Var]:
        return [Var(n, sort) for n in names.split()]
    declare.__doc__ = f"Pattern variables of sort {sort!r}, one per space-separated name."
    return declare


tensors, vecs, dtypes, ops = _declare(TENSOR), _declare(VEC), _declare(DTYPE), _declare(OP)
floats, ints, scalars = _declare(FLOAT), _declare(INT), _declare(SCALAR)
formats = _declare(FORMAT)


# ---- constructor builders (same names and argument order as egraph/terms.py) ----

def arg(i): return app("arg", i)
def const(i): return app("const", i)
def lit(value, dtype): return app("lit", value, dtype)
def unary(op, x): return app("unary", op, x)
def binary(op, x, y): return app("binary", op, x, y)
def integer_pow(x, n): return app("integer_pow", x, n)
def select(p, on_false, on_true): return app("select", p, on_false, on_true)
def convert(x, dtype): return app("convert", x, dtype)
def matmul(a, b, dtype): return app("matmul", a, b, dtype)
def reduce(op, x, axes): return app("reduce", op, x, axes)
def scan(op, x, axis, reverse): return app("scan", op, x, axis, reverse)
def transpose(x, perm): return app("transpose", x, perm)
def pool(op, x, window, strides, low, high): return app("pool", op, x, window, strides, low, high)
def reshape(x, shape): return app("reshape", x, shape)
def broadcast(x, shape, dims): return app("broadcast", x, shape, dims)
def slice_(x, start, limit, strides): return app("slice", x, start, limit, strides)
def pad(x, value, low, high, interior): return app("pad", x, value, low, high, interior)
def pack(x, format): return app("pack", x, format)
def unpack(x, format, shape): return app("unpack", x, format, shape)
def fractal_matmul(a, b, dtype): return app("fractal_matmul", a, b, dtype)


def concat(items, dimension) -> App:
    lst = app("tnil")
    for item in reversed(list(items)):
        lst = app("tcons", item, lst)
    return app("concat", lst, dimension)


def kernel(body): return app("kernel", body)
def sarg(x, shape): return app("sarg", x, shape)
def sunary(op, x): return app("sunary", op, x)
def sbinary(op, x, y): return app("sbinary", op, x, y)
def sselect(p, on_false, on_true): return app("sselect", p, on_false, on_true)
def sconvert(x, dtype): return app("sconvert", x, dtype)
def spow(x, n): return app("spow", x, n)
def sbcast(x, shape): return app("sbcast", x, shape)
def srow(op, x): return app("srow", op, x)
def sperm(x, perm): return app("sperm", x, perm)
def smm(a, b, dtype): return app("smm", a, b, dtype)
def sconv(lhs, rhs, params): return app("sconv", lhs, rhs, params)
def schain(a, b, dtype): return app("schain", a, b, dtype)
def sconvchain(a, rhs, params): return app("sconvchain", a, rhs, params)
def conv(lhs, rhs, params): return app("conv", lhs, rhs, params)


def exp(x): return unary("exp", x)
def log(x): return unary("log", x)
def neg(x): return unary("neg", x)
def add(x, y): return binary("add", x, y)
def sub(x, y): return binary("sub", x, y)
def mul(x, y): return binary("mul", x, y)
def div(x, y): return binary("div", x, y)


# ---- attribute functions ----

def compose(p, q): return app("compose", p, q)
def shape_of(t): return app("shape_of", t)
def dtype_of(t): return app("dtype_of", t)
def dim(t, i): return app("dim", t, i)
def zeros_like(t): return app("zeros_like", t)
def ones_like(t): return app("ones_like", t)
def set_last(v, value): return app("set_last", v, value)
def last_axis_of(t): return app("last_axis_of", t)
def axes_of(t): return app("axes_of", t)
def int32_conv(k): return app("int32_conv", k)
def iadd(a, b): return app("iadd", a, b)
def set_at(v, i, value): return app("set_at", v, i, value)
def center_low(t, ref): return app("center_low", t, ref)
def center_high(t, ref): return app("center_high", t, ref)
