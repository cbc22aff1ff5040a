"""The operator names of TASO and Tensat rules, as a table over superopt's term language.

`parse_rules(text, dialect="taso")` reads rules written with these names. Each entry maps an operator of
a given arity to a pattern; an arity that does not match falls through to superopt's own constructors
(so `(matmul ?a ?b ?d)` is still ours). The element type of TASO's untyped operators is one implicit
dtype variable `?dtype` per rule.

    ewadd a b        -> a + b                 ewmul a b       -> a * b
    smul a s         -> a * s (s rank 0)      matmul a b      -> a @ b
    transpose a      -> 2-D transpose         relu a          -> max(a, 0)
    tanh a           -> tanh(a)               sigmoid a       -> logistic(a)
    conv2d p x w     -> conv(x, w) with conv parameters p (an id into the encoding's table)
    poolmax x w s    -> max pooling with window w and strides s, no padding
    concat axis a b  -> concatenation         split0/1 axis (concat axis a b) -> the first / second part
    enlarge w ref    -> w zero-padded to ref's spatial size (OIHW: the last two axes), centred
    noop a b         -> several patterns matched together: (noop a b) => (noop c d) is a two-output rule
"""
from __future__ import annotations

from dataclasses import dataclass

from superopt.rewrites.pattern import (
    DTYPE, INT, TENSOR, VEC, App, app, center_high, center_low, concat, dim, lit, ones_like, pad, pool, set_at,
    shape_of, slice_, zeros_like,
)


@dataclass(frozen=True)
class Noop:
    """TASO's joint output: its operands are matched (and rewritten) together."""
    args: tuple


def _split(reader, rest, part: int):
    axis = reader.atom(rest[0], INT)
    whole = reader.atom(rest[1], TENSOR)
    if not (isinstance(whole, App) and whole.fn == "concat"):
        raise ValueError("split0/split1 apply to a concat pattern: (split0 ?axis (concat ?axis ?a ?b))")
    first = whole.args[0].args[0]
    start = zeros_like(first) if part == 0 else set_at(zeros_like(first), axis, dim(first, axis))
    limit = shape_of(first) if part == 0 else shape_of(whole)
    return slice_(whole, start, limit, ones_like(first))


def expand(reader, head: str, rest: list):
    """The pattern for a TASO operator application, or None if `head`/arity is not a TASO operator."""
    t = lambda a: reader.atom(a, TENSOR)  # noqa: E731
    dtype = lambda: reader.var("dtype", DTYPE)  # noqa: E731
    n = len(rest)
    table = {
        ("ewadd", 2): lambda: app("binary", "add", t(rest[0]), t(rest[1])),
        ("ewmul", 2): lambda: app("binary", "mul", t(rest[0]), t(rest[1])),
        ("smul", 2): lambda: app("binary", "mul", t(rest[0]), t(rest[1])),
        ("matmul", 2): lambda: app("matmul", t(rest[0]), t(rest[1]), dtype()),
        ("transpose", 1): lambda: app("transpose", t(rest[0]), (1, 0)),
        ("relu", 1): lambda: app("binary", "max", t(rest[0]), lit(0.0, dtype())),
        ("tanh", 1): lambda: app("unary", "tanh", t(rest[0])),
        ("sigmoid", 1): lambda: app("unary", "logistic", t(rest[0])),
        ("conv2d", 3): lambda: app("conv", t(rest[1]), t(rest[2]), reader.atom(rest[0], INT)),
        ("poolmax", 3): lambda: _poolmax(reader, rest),
        ("concat", 3): lambda: concat([t(rest[1]), t(rest[2])], reader.atom(rest[0], INT)),
        ("split0", 2): lambda: _split(reader, rest, 0),
        ("split1", 2): lambda: _split(reader, rest, 1),
        ("enlarge", 2): lambda: _enlarge(reader, rest),
    }
    if head == "noop":
        return Noop(tuple(t(a) for a in rest))
    build = table.get((head, n))
    return build() if build else None


def _poolmax(reader, rest):
    x = reader.atom(rest[0], TENSOR)
    return pool("reduce_window_max", x, reader.atom(rest[1], VEC), reader.atom(rest[2], VEC), zeros_like(x),
                zeros_like(x))


def _enlarge(reader, rest):
    w, ref = reader.atom(rest[0], TENSOR), reader.atom(rest[1], TENSOR)
    return pad(w, lit(0.0, reader.var("dtype", DTYPE)), center_low(w, ref), center_high(w, ref), zeros_like(w))
