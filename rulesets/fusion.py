"""Fusion: ops become kernels, and kernels absorb their producers.

Two kinds of rules, and nothing else:

- *lifting* puts, next to every op that can run inside a kernel, a one-op `kernel` whose body loads the
  operands (`sarg`) and applies the op in the Scalar language;
- *inlining* says that loading a kernel's result equals computing its body in place:
  `sarg(kernel(b), shape) = b`; a load that broadcasts (a row value, a scalar) is first rewritten into a
  plain load broadcast on chip, `sbcast(sarg(x, shape(x)), shape)`, so it can be inlined the same way.

Saturating both leaves, in every load of an intermediate, the choice between reading it from global
memory and recomputing it on chip. Which producers a kernel absorbs (elementwise chains of any length,
epilogues behind a matmul, a row reduction with the ops around it, a transposed write) is decided by the
extractor (`extract/kernels.py`) under the target's limits: registers on a GPU, the Unified Buffer and
format conversions on an NPU.
"""
from __future__ import annotations

from superopt.rewrites.pattern import (
    binary, broadcast, conv, convert, dtypes, integer_pow, ints, kernel, matmul, ops, reduce, reshape, sarg,
    sbcast, sbinary, scalars, schain, sconv, sconvchain, sconvert, select, set_last, shape_of, smm, sperm, spow, srow,
    sselect, sunary, tensors, transpose, unary, vecs,
)
from superopt.rewrites.rule import RuleSet, rule, when

x, y, z = tensors("x y z")
(b,) = scalars("b")
p, q, s = vecs("p q s")
(d,) = dtypes("d")
(op,) = ops("op")
n, m = ints("n m")


def _load(t, like):
    """Load `t` over the shape of tensor `like` (the kernel's shape)."""
    return sarg(t, shape_of(like))


_unary, _binary = unary(op, x), binary(op, x, y)
_select, _convert, _pow = select(x, y, z), convert(x, d), integer_pow(x, n)
_conv = conv(x, z, m)

FUSION = RuleSet("fusion", {
    "lift": [
        rule("lift-unary", _unary, kernel(sunary(op, _load(x, _unary))), doc="an elementwise op is a one-op kernel"),
        rule("lift-binary", _binary, kernel(sbinary(op, _load(x, _binary), _load(y, _binary))),
             doc="a binary op is a one-op kernel; operands broadcast as they load"),
        rule("lift-select", _select, kernel(sselect(_load(x, _select), _load(y, _select), _load(z, _select))),
             doc="select is a one-op kernel"),
        rule("lift-convert", _convert, kernel(sconvert(_load(x, _convert), d)), doc="a cast is a one-op kernel"),
        rule("lift-integer-pow", _pow, kernel(spow(_load(x, _pow), n)), doc="x**n is a one-op kernel"),
        rule("lift-transpose", transpose(x, p), kernel(sperm(_load(x, x), p)),
             doc="a transpose is a kernel that reads with permuted indices"),
        rule("lift-matmul", matmul(x, y, d), kernel(smm(x, y, d)),
             doc="a matmul is a kernel; consumers may take it as their prologue (an epilogue fusion)"),
        rule("lift-conv", conv(x, y, n), kernel(sconv(x, y, n)),
             doc="a convolution is a kernel; consumers may take it as their prologue"),
        rule("lift-row-reduction", broadcast(reduce(op, x, p), s, q), kernel(srow(op, _load(x, x))),
             when("last_axis", p, x), when("identity_perm", q), when("shape_is", broadcast(reduce(op, x, p), s, q),
                                                                       set_last(shape_of(x), 1)),
             doc="a reduction over the last axis, kept as a size-1 axis, is a row kernel"),
        rule("lift-row-reduction-reshape", reshape(reduce(op, x, p), s), kernel(srow(op, _load(x, x))),
             when("last_axis", p, x), when("shape_is", reshape(reduce(op, x, p), s), set_last(shape_of(x), 1)),
             doc="the same row reduction, kept by a reshape"),
    ],
    "chain": [
        rule("chain-left", smm(x, y, d), schain(_load(x, x), y, d),
             doc="a matmul may take its left operand from the kernel's body: inlining a producing matmul "
                 "there makes a GEMM chain, and a softmax between the two makes attention"),
        rule("chain-conv", sconv(_conv, y, n), sconvchain(_load(_conv, _conv), y, n),
             doc="a convolution of a convolution's result may take its input from the kernel's body: inlining "
                 "the producing convolution there makes a convolution chain (3x3 then 1x1, 1x1 then 1x1, 1x1 then "
                 "3x3 by bands with their halo)"),
    ],
    "inline": [
        rule("inline-load", sarg(kernel(b), s), b, when("shape_is", kernel(b), s),
             doc="loading a kernel's result = computing its body in place"),
        rule("broadcast-on-chip", sarg(x, s), sbcast(sarg(x, shape_of(x)), s), when("differs_shape", x, s),
             doc="a broadcasting load = a plain load broadcast on chip (which inline-load can then inline)"),
    ],
})

