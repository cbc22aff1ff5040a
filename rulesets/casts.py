"""Casts: remove the round trips that are exact, move casts to where they are cheapest, and let a matmul
take narrow operands with a wide accumulator.

- A round trip through a wider type returns the value it started from when every value of the narrow
  type is exactly representable in the wide one (f16 -> f32 -> f16, bf16 -> f32 -> bf16,
  i8 -> i32 -> i8, ...). Only those pairs are listed (`EXACT_WIDENINGS`); f32 -> f16 -> f32 rounds, so
  it is not a rule, and tests/test_casts.py shows the checker rejects it and the e-graph keeps it.
- A cast commutes with data movement (transpose, reshape, broadcast, slice) and, into a float type,
  with max and min (rounding is monotone, and NaN stays NaN); relu is max(x, 0). Both directions are
  rules: moving a narrowing cast before a transpose halves the bytes the transpose moves, and moving it
  after an elementwise op lets the op fuse with its producer. The cost model decides.
- `matmul(convert(x, f32), convert(y, f32), f32)` with f16 or bf16 operands is the mixed-precision
  matmul `matmul(x, y, f32)` (lax's preferred_element_type): every product of two f16 or bf16 values is
  exact in f32. The operands then cross global memory in their narrow type.

Fusing a cast into a kernel's prologue or epilogue needs no rule of its own: a cast lifts to a one-op
kernel (`lift-convert` in fusion.py) and inlines into its consumer like any elementwise op.
"""
from __future__ import annotations

from superopt.rewrites.pattern import (
    binary, broadcast, convert, dtype_of, dtypes, lit, matmul, reshape, slice_, tensors, transpose, vecs,
)
from superopt.rewrites.rule import RuleSet, rule, when

x, y = tensors("x y")
p, s, t, u = vecs("p s t u")
d, e = dtypes("d e")

# (narrow, wide): every value of `narrow` is exactly a value of `wide`, so narrow -> wide -> narrow is the
# identity (and the wide value converts back without rounding, saturation or a NaN rule firing).
EXACT_WIDENINGS = (
    ("float16", "float32"), ("bfloat16", "float32"), ("float16", "float64"), ("bfloat16", "float64"),
    ("float32", "float64"), ("int8", "int32"), ("int8", "float16"), ("int8", "bfloat16"), ("int8", "float32"),
)
_SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64", "int8": "i8", "int32": "i32"}


def _round_trip(narrow: str, wide: str):
    a, b = _SHORT[narrow], _SHORT[wide]
    return rule(f"round-trip-{a}-{b}-{a}", convert(convert(x, wide), narrow), x, when("has_dtype", x, narrow),
                doc=f"{a} -> {b} -> {a} is the identity: every {a} is exactly a {b}")


def _mixed_precision(narrow: str):
    a = _SHORT[narrow]
    return rule(f"matmul-mixed-precision-{a}", matmul(convert(x, "float32"), convert(y, "float32"), "float32"),
                matmul(x, y, "float32"), when("has_dtype", x, narrow), when("has_dtype", y, narrow),
                doc=f"f32 matmul of {a} operands widened = the {a} matmul accumulating in f32 "
                    f"(preferred_element_type): {a} products are exact in f32")


CASTS = RuleSet("casts", {
    "round-trip": [_round_trip(narrow, wide) for narrow, wide in EXACT_WIDENINGS],
    "move": [
        rule("convert-through-transpose", convert(transpose(x, p), d), transpose(convert(x, d), p), two_way=True,
             doc="a cast commutes with a transpose (cast the narrower side)"),
        rule("convert-through-reshape", convert(reshape(x, s), d), reshape(convert(x, d), s), two_way=True,
             doc="a cast commutes with a reshape"),
        rule("convert-through-broadcast", convert(broadcast(x, s, p), d), broadcast(convert(x, d), s, p),
             two_way=True, doc="a cast commutes with a broadcast: cast the small operand, not the broadcast one"),
        rule("convert-through-slice", convert(slice_(x, s, t, u), d), slice_(convert(x, d), s, t, u), two_way=True,
             doc="a cast commutes with a slice: cast only the elements kept"),
        rule("convert-through-max", convert(binary("max", x, y), d), binary("max", convert(x, d), convert(y, d)),
             when("float_dtype", d), two_way=True, numerics="rounding",
             doc="a cast into a float type commutes with max: rounding is monotone and keeps NaN (the sign of a "
                 "zero result may differ: which of -0 and 0 a max returns depends on the order)"),
        rule("convert-through-min", convert(binary("min", x, y), d), binary("min", convert(x, d), convert(y, d)),
             when("float_dtype", d), two_way=True, numerics="rounding",
             doc="a cast into a float type commutes with min (up to a zero's sign, as max)"),
        rule("convert-through-relu", convert(binary("max", x, lit(0.0, e)), d),
             binary("max", convert(x, d), lit(0.0, d)), when("float_dtype", d), numerics="rounding",
             doc="a cast into a float type commutes with relu = max(x, 0); 0 is exact in every type (the "
                 "sign of a zero result may differ: the reference's max of -0 and 0 depends on the order)"),
        rule("convert-before-relu", binary("max", convert(x, d), lit(0.0, d)),
             convert(binary("max", x, lit(0.0, dtype_of(x))), d), when("float_dtype", d), numerics="rounding",
             doc="relu after a cast into a float type = the cast after relu (up to a zero's sign)"),
    ],
    "matmul": [_mixed_precision("float16"), _mixed_precision("bfloat16")],
})
