"""Quantization: dequantize -> matmul (or conv) -> requantize becomes an int8 kernel.

A quantized linear layer is written the way users write it: int8 operands widened to f32 and scaled
(`xq.astype(f32) * sx`, `wq.astype(f32) * sw`, a scale per tensor or per output column), an f32 matmul,
and a requantizing tail (divide by the output scale, round, add the zero point, clip, narrow to int8).

- The scales leave the matmul: per tensor by `matmul-scale-lhs` / `matmul-scale-rhs` (algebra), per
  output column by `matmul-scale-columns` below. What remains is a matmul of two widened int8 tensors.
- `matmul-int8` makes that an int8 x int8 matmul accumulating in int32, widened afterwards. Every
  product of two int8 values is exact and the int32 sum is exact while it fits, so the int32 result is
  the exact sum, which the f32 accumulation only approximates past 2**24; the legality condition bounds
  the contraction so the int32 sum cannot overflow.
- `conv-int8` does the same for a convolution: the same conv params with preferred_element_type int32
  (the encoder interns that twin of every f32 conv's params, `int32_conv`), for channels-last kernels
  whose window times input features bounds the sum. Per-tensor scales leave the conv by
  `conv-scale-lhs` / `conv-scale-rhs` (algebra), and a weight scale per output channel by
  `conv-scale-output-channels` below (its broadcast takes the conv's output shape, `shape_of`: the
  shape of a term the left-hand side matched, as a right-hand side can only ask for those).
- Nothing else is needed for the fused requantize epilogue: the scale, bias, round, zero point, clip and
  cast are elementwise, so fusion (fusion.py) inlines them behind the matmul, and the extractor decides.
  The result is one kernel reading int8 operands and writing int8.

Asymmetric activations (a zero point subtracted before the matmul) are left as they are: moving that
subtraction out needs a column sum of the weights, a rule not written yet.
"""
from __future__ import annotations

from superopt.rewrites.pattern import (broadcast, conv, convert, dtypes, floats, int32_conv, ints, lit, matmul, mul,
                                      shape_of, tensors, vecs)
from superopt.rewrites.rule import RuleSet, rule, when

x, y, z = tensors("x y z")
(d,) = dtypes("d")
(k,) = ints("k")
s, p = vecs("s p")
c1, c2 = floats("c1 c2")


def _int8_scale(op: str, side: str):
    """A literal scale on one or both widened int8 operands of an f32 matmul or conv <-> the same scale
    after it. The general scale rules (algebra's matmul-scale-*, conv-scale-*) may change where a result
    overflows, so they run only under numerics="fast"; here the operands are int8, the contraction is
    bounded (int32_accumulates) and the scales are bounded away from overflow and underflow
    (int8_scale), so both sides stay finite and normal and differ by rounding only."""
    a, b = convert(x, "float32"), convert(y, "float32")
    left, right = (mul(a, lit(c1, "float32")) if side in ("lhs", "both") else a,
                   mul(b, lit(c2, "float32")) if side in ("rhs", "both") else b)
    if op == "matmul":
        before, after = matmul(left, right, "float32"), matmul(a, b, "float32")
        bound = [when("int32_accumulates", x)]
    else:
        before, after = conv(left, right, k), conv(a, b, k)
        bound = [when("conv_channels_last", k), when("int32_accumulates_conv", y)]
    scales = [c for c, sides in ((c1, ("lhs", "both")), (c2, ("rhs", "both"))) if side in sides]
    for c in scales:
        after = mul(after, lit(c, "float32"))
    return rule(f"{op}-int8-scale-{side}", before, after, when("has_dtype", x, "int8"), when("has_dtype", y, "int8"),
                *bound, *(when("int8_scale", c) for c in scales), two_way=True, numerics="rounding",
                doc=f"a literal scale on {'both int8 operands' if side == 'both' else f'the {side} int8 operand'} "
                    f"of a {op} <-> after it, for bounded scales and contractions")

QUANT = RuleSet("quant", {
    "int8-matmul": [
        rule("matmul-int8", matmul(convert(x, "float32"), convert(y, "float32"), "float32"),
             convert(matmul(x, y, "int32"), "float32"), when("has_dtype", x, "int8"), when("has_dtype", y, "int8"),
             when("int32_accumulates", x), numerics="rounding",
             doc="an f32 matmul of widened int8 operands = the int8 matmul accumulating in int32, widened "
                 "(exact while the int32 sum fits; the f32 sum rounds past 2**24)"),
        rule("conv-int8", conv(convert(x, "float32"), convert(y, "float32"), k),
             convert(conv(x, y, int32_conv(k)), "float32"), when("has_dtype", x, "int8"),
             when("has_dtype", y, "int8"), when("has_int32_conv", k), when("conv_channels_last", k),
             when("int32_accumulates_conv", y), numerics="rounding",
             doc="an f32 conv of widened int8 operands = the int8 conv accumulating in int32, widened "
                 "(exact while the int32 sum fits)"),
    ],
    "int8-scales": [_int8_scale(op, side) for op in ("matmul", "conv") for side in ("lhs", "rhs", "both")],
    "scales": [
        rule("matmul-scale-columns", matmul(x, mul(y, z), d), mul(matmul(x, y, d), z),
             when("rank", x, 2), when("rank", y, 2), when("row_vector", z), when("has_dtype", y, d), numerics="reals",
             doc="x @ (y * s) = (x @ y) * s for a per-column scale s of shape [1, N]"),
        rule("conv-scale-output-channels", conv(x, mul(y, broadcast(z, s, p)), k),
             mul(conv(x, y, k), broadcast(z, shape_of(conv(x, mul(y, broadcast(z, s, p)), k)), p)), when("rank", z, 1),
             when("last_axis", p, y), when("conv_channels_last", k), numerics="reals",
             doc="conv(x, w * s) = conv(x, w) * s for a scale s per output channel, the last axis of a "
                 "channels-last kernel and of its output"),
    ],
})
