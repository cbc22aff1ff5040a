"""Layout packing: pack/unpack cancellation, elementwise ops in a packed layout, and the NPU's matmul on
fractals (the formats are defined in `superopt/core/formats.py`).

- Cancellation. unpack(pack(x)) is always x. pack(unpack(y)) is y only where the shape fills whole
  blocks: otherwise y's padding may hold anything (an elementwise op applied in the packed layout turns
  zero padding into exp(0) = 1, say), and packing again writes zeros there (`fills_blocks`).
- Propagation. An elementwise op commutes with unpacking (it never mixes elements, and whatever it does
  to the padding is dropped), so a chain of elementwise ops behind a packed producer can run in the packed
  layout and unpack once at the end. Packing, the other way round, does not commute with an op that maps
  0 to something else, so there is no rule that pushes a pack into an op.
- The cube. matmul(x, y) is unpack(fractal_matmul(pack(x, ZZ), pack(y, ZN)), NZ): the cube's own
  contraction on 16x16 fractals (L0A ZZ, L0B ZN, L0C NZ), exact because the zero padding of the
  contracted axis multiplies zero padding. With constant weights, pack(W, ZN) is a constant sub-term,
  computed once when the program is built (`superopt/core/ir.py: hoistable`).

Which side is cheaper is the cost model's business: a pack or unpack of a per-call tensor is a format
conversion (TransData on an NPU, `extract/cost.py`), a pack of a constant costs nothing per call.
"""
from __future__ import annotations

from superopt.rewrites.pattern import (
    binary, convert, dtypes, formats, fractal_matmul, matmul, ops, pack, shape_of, tensors, unary, unpack, vecs,
)
from superopt.rewrites.rule import RuleSet, rule, when

x, y, z, c = tensors("x y z c")
(s,) = vecs("s")
(f,) = formats("f")
(d,) = dtypes("d")
(op,) = ops("op")

LAYOUT = RuleSet("layout", {
    "cancel": [
        rule("unpack-of-pack", unpack(pack(x, f), f, s), x, when("shape_is", x, s),
             doc="unpack(pack(x, f), f, shape(x)) -> x: the padding is dropped again"),
        rule("pack-of-unpack", pack(unpack(y, f, s), f), y, when("fills_blocks", s, f),
             doc="pack(unpack(y, f, s), f) -> y when s fills whole blocks (no padding to reset)"),
        rule("pack-nd", pack(x, "ND"), x, doc="ND is the identity layout"),
        rule("unpack-nd", unpack(x, "ND", s), x, doc="ND is the identity layout"),
    ],
    "propagate": [
        rule("unary-in-layout", unary(op, unpack(y, f, s)), unpack(unary(op, y), f, s), two_way=True,
             doc="op(unpack(y)) <-> unpack(op(y)): an elementwise op runs in the packed layout"),
        rule("convert-in-layout", convert(unpack(y, f, s), d), unpack(convert(y, d), f, s), two_way=True,
             doc="a cast runs in the packed layout"),
        rule("binary-in-layout", binary(op, unpack(y, f, s), unpack(z, f, s)), unpack(binary(op, y, z), f, s),
             when("same_shape", y, z), two_way=True,
             doc="unpack(y) op unpack(z) <-> unpack(y op z), both packed alike"),
        rule("scalar-binary-in-layout", binary(op, unpack(y, f, s), c), unpack(binary(op, y, c), f, s),
             when("scalar", c), two_way=True, doc="unpack(y) op c <-> unpack(y op c), rank-0 c"),
        rule("scalar-binary-in-layout-left", binary(op, c, unpack(y, f, s)), unpack(binary(op, c, y), f, s),
             when("scalar", c), two_way=True, doc="c op unpack(y) <-> unpack(c op y), rank-0 c"),
    ],
    "cube": [
        rule("matmul-on-fractals", matmul(x, y, d),
             unpack(fractal_matmul(pack(x, "ZZ"), pack(y, "ZN"), d), "NZ", shape_of(matmul(x, y, d))),
             numerics="rounding", targets=("npu",),
             doc="x@y = unpack(fractal_matmul(pack(x, ZZ), pack(y, ZN)), NZ): the cube's contraction on "
                 "fractals (the same products summed in another order, as a matmul's order is its own); the "
                 "NPU's alone: elsewhere no pack or unpack ever appears, and the other layout rules lie idle"),
    ],
})
