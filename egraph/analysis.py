"""Shape, dtype and sign analyses as egglog rules, for the nodes rewrite rules create.

The encoder sets `shape` and `dtype` of every captured node from the jaxpr; these rules derive them for
new nodes. Both tables have no merge, so a rule whose result disagrees with the captured types makes the
run fail loudly rather than yield a wrong program. Where a result needs a loop over dimensions
(transpose, slice, pad, reduce), one rule per rank is generated, up to `MAX_RANK`.

The sign analysis (`nonneg`: no element below -0; NaN and +inf allowed) is a relation, derived from ops that
give such values (exp, abs, sqrt, a square, an even power, a literal >= 0) and ops that keep them (sums,
products, min and max, reductions, views), for rules that hold on a known domain to use as a predicate
(`exp(log(x)) = x` where x >= 0). The integer analysis (`integral`: every element an integer, +-inf or NaN)
is one too, derived from integer and bool dtypes, integer literals, iota and rounding ops and kept by sums,
differences, products, min, max, their reductions and views (`floor(x) = x` where x is integral). So are
three range facts: `finite` (no NaN or inf: integer and bool dtypes and their casts to float32, float64 or
bfloat16, finite literals, kept by the ops that cannot overflow, such as neg, abs, sign, rounding, logistic,
tanh, sin, cos, min and max), `positive` (at least the dtype's smallest normal number, +inf and NaN allowed:
literals, cosh, and what keeps it: sqrt, abs, max with anything, a sum with a value >= -0, min and the
smallest element of such values) and `at_most_one` (-inf and NaN allowed: logistic, tanh, sin, cos, literals,
a min with such a value, a max or product of such values, a value <= +0 and its exp). Rules use them as
predicates: x - x = 0 where x is finite, x / x = 1 where it is finite and positive, min(x, 1) = x where x is
at most one.

Softmax and normalizations are sources through facts about rows: `row_max` and `peak` (a value's maximum
along some axes, and that broadcast back against it), from which a value less its own maximum is `nonpos`
(at most +0) and its exp at most one; `tops_one` (exp of that has exp(0) = 1 in each row), from which its
sum along the same axes is `at_least_one`; `row_sum` (a sum of values >= -0 broadcast back against them),
from which a quotient of those values by it, where it is positive, is at most one. A variance is nonneg (a
sum of squares over a positive count), and positive once an epsilon that is a normal number is added.

Integer arithmetic wraps (two's complement, as XLA's): of an integer dtype, sums, differences, products,
squares, powers, abs and negations get no sign or range fact (int32's 46341 * 46341 is negative), and a
value less its maximum is not nonpos; an unsigned dtype, literals, min, max, sign, quotients and views keep
theirs. `rules check` tests each derivation on integer extremes (rewrites/checker.py, `check_facts`).
"""
from __future__ import annotations

import functools

from egglog import String, Vec, eq, f64, i64, rule, ruleset, set_, var, vars_

from superopt.core.ops import BINARY_OPS, UNARY_OPS, flagged, knowing
from superopt.core.formats import FORMATS
from superopt.egraph.terms import (
    Tensor, TList, argreduce, binary, bool_result_op, broadcast, float_dtype, same_dtype_op, concat, concat_demand, concat_extent, conv,
    conv_int32, convert,
    dtype, real_dtype, real_result_op, fractal_matmul, ints, integer_dtype, integer_pow, integral, integral_op, iota, keeps_integral_op,
    keeps_nonneg_op, lit, matmul, nonneg, nonneg_op, pack, pad, pair_integral_op, pair_nonneg_op, pool, reduce,
    reshape, scan, select, shape, slice_, tcons, tnil, transpose, unary, unpack,
    finite, positive, at_most_one, keeps_finite_op, at_most_one_op, nonpos, at_least_one, row_max, peak, kept_axes,
    tops_one, row_sum, widening, view_of, nan_guarded,
)

MAX_RANK = 6

x, y, z, w = vars_("x y z w", Tensor)
w2, u, u2 = vars_("w2 u u2", Tensor)
v = var("v", f64)
xs, rest = vars_("xs rest", TList)
s, t, p, a, b, c = vars_("s t p a b c", Vec[i64])
op, d = vars_("op d", String)
k, e, n = vars_("k e n", i64)
fd = var("fd", String)


def _floating(t):
    """The conditions that `t` has a float dtype: integer arithmetic wraps (two's complement, as XLA's does),
    so a fact that holds of a sum, product, negation or difference over the reals holds of it only in a float
    dtype (int32's x * x is negative for 46341; abs and neg of its smallest value are that value)."""
    return eq(fd).to(dtype(t)), float_dtype(fd)


def _elementwise_rules():
    yield rule(eq(z).to(unary(op, x)), eq(s).to(shape(x))).then(set_(shape(z)).to(s))
    yield rule(eq(z).to(unary(op, x)), eq(d).to(dtype(x)), same_dtype_op(op)).then(set_(dtype(z)).to(d))
    yield rule(eq(z).to(unary(op, x)), bool_result_op(op)).then(set_(dtype(z)).to(String("bool")))
    yield rule(eq(z).to(unary(op, x)), real_result_op(op), eq(fd).to(dtype(x)), real_dtype(fd, d)).then(
        set_(dtype(z)).to(d))
    # A rank-0 operand broadcasts against the other one; equal ranks broadcast size-1 axes (as lax does).
    yield rule(eq(z).to(binary(op, x, y)), eq(s).to(shape(x)), s.length() > 0, eq(t).to(shape(y)),
               eq(t.length()).to(i64(0))).then(set_(shape(z)).to(s))
    yield rule(eq(z).to(binary(op, x, y)), eq(s).to(shape(x)), eq(s.length()).to(i64(0)), eq(t).to(shape(y))).then(
        set_(shape(z)).to(t))
    # (an axis of 1 against one of 0 is 0: the larger extent, times 0 where either is 0)
    for r in range(1, MAX_RANK + 1):
        yield rule(eq(z).to(binary(op, x, y)), eq(s).to(shape(x)), eq(s.length()).to(i64(r)), eq(t).to(shape(y)),
                   eq(t.length()).to(i64(r))).then(set_(shape(z)).to(
                       Vec[i64](*(s[i].max(t[i]) * s[i].min(t[i]).min(i64(1)) for i in range(r)))))
    yield rule(eq(z).to(binary(op, x, y)), eq(d).to(dtype(x)), same_dtype_op(op)).then(set_(dtype(z)).to(d))
    yield rule(eq(z).to(binary(op, x, y)), bool_result_op(op)).then(set_(dtype(z)).to(String("bool")))
    yield rule(eq(z).to(integer_pow(x, k)), eq(s).to(shape(x)), eq(d).to(dtype(x))).then(
        set_(shape(z)).to(s), set_(dtype(z)).to(d))
    yield rule(eq(z).to(select(x, y, w)), eq(s).to(shape(y)), eq(d).to(dtype(y))).then(
        set_(shape(z)).to(s), set_(dtype(z)).to(d))
    yield rule(eq(z).to(convert(x, d)), eq(s).to(shape(x))).then(set_(shape(z)).to(s), set_(dtype(z)).to(d))
    yield rule(eq(z).to(lit(v, d))).then(
        set_(shape(z)).to(Vec[i64].empty()), set_(dtype(z)).to(d))


def _layout_rules():
    yield rule(eq(z).to(reshape(x, s)), eq(d).to(dtype(x))).then(set_(shape(z)).to(s), set_(dtype(z)).to(d))
    yield rule(eq(z).to(broadcast(x, s, p)), eq(d).to(dtype(x))).then(set_(shape(z)).to(s), set_(dtype(z)).to(d))
    yield rule(eq(z).to(iota(k, s, d))).then(set_(shape(z)).to(s), set_(dtype(z)).to(d))
    for r in range(1, MAX_RANK + 1):
        yield rule(eq(z).to(transpose(x, p)), eq(p.length()).to(i64(r)), eq(s).to(shape(x)), eq(d).to(dtype(x))).then(
            set_(shape(z)).to(Vec[i64](*(s[p[i]] for i in range(r)))), set_(dtype(z)).to(d))
        w, st, lo, hi = vars_("pw pst plo phi", Vec[i64])
        yield rule(eq(z).to(pool(op, x, w, st, lo, hi)), eq(w.length()).to(i64(r)), eq(s).to(shape(x)),
                   eq(d).to(dtype(x))).then(
            set_(shape(z)).to(Vec[i64](*((s[i] + lo[i] + hi[i] - w[i]) / st[i] + 1 for i in range(r)))),
            set_(dtype(z)).to(d))
        yield rule(eq(z).to(slice_(x, a, b, c)), eq(a.length()).to(i64(r)), eq(d).to(dtype(x))).then(
            set_(shape(z)).to(Vec[i64](*((b[i] - a[i] + c[i] - 1) / c[i] for i in range(r)))), set_(dtype(z)).to(d))
        yield rule(eq(z).to(pad(x, y, a, b, c)), eq(a.length()).to(i64(r)), eq(s).to(shape(x)), eq(d).to(dtype(x))).then(
            set_(shape(z)).to(Vec[i64](*(a[i] + b[i] + s[i] + (s[i] - 1).max(i64(0)) * c[i] for i in range(r)))),
            set_(dtype(z)).to(d))


def _contraction_rules():
    yield rule(eq(z).to(matmul(x, y, d)), eq(s).to(shape(x)), eq(t).to(shape(y))).then(
        set_(shape(z)).to(s.set(s.length() - 1, t[t.length() - 1])), set_(dtype(z)).to(d))
    # Reductions remove their (sorted) axes, last first so earlier indices stay valid.
    for m in range(1, MAX_RANK + 1):
        removed = s
        for i in reversed(range(m)):
            removed = removed.remove(p[i])
        yield rule(eq(z).to(reduce(op, x, p)), eq(p.length()).to(i64(m)), eq(s).to(shape(x)), eq(d).to(dtype(x))).then(
            set_(shape(z)).to(removed), set_(dtype(z)).to(d))
    yield rule(eq(z).to(reduce(op, x, p)), eq(p.length()).to(i64(0)), eq(s).to(shape(x)), eq(d).to(dtype(x))).then(
        set_(shape(z)).to(s), set_(dtype(z)).to(d))
    yield rule(eq(z).to(argreduce(op, x, k, d)), eq(s).to(shape(x))).then(
        set_(shape(z)).to(s.remove(k)), set_(dtype(z)).to(d))
    yield rule(eq(z).to(scan(op, x, k, n)), eq(s).to(shape(x)), eq(d).to(dtype(x))).then(
        set_(shape(z)).to(s), set_(dtype(z)).to(d))
    # A conv's result shape is a function of its operands' shapes and its params (not computed here: the
    # params are an id), so a new conv takes it from a typed one of the same params and operand shapes,
    # or of the params it is the int32 twin of (quant.py's int8 conv), which give int32.
    x2, y2 = vars_("x2 y2", Tensor)
    yield rule(eq(z).to(conv(x, y, k)), eq(w).to(conv(x2, y2, k)), eq(s).to(shape(w)), eq(d).to(dtype(w)),
               eq(shape(x)).to(shape(x2)), eq(shape(y)).to(shape(y2)), eq(dtype(x)).to(dtype(x2))).then(
        set_(shape(z)).to(s), set_(dtype(z)).to(d))
    yield rule(eq(z).to(conv(x, y, k)), eq(k).to(conv_int32(n)), eq(w).to(conv(x2, y2, n)), eq(s).to(shape(w)),
               eq(shape(x)).to(shape(x2)), eq(shape(y)).to(shape(y2))).then(
        set_(shape(z)).to(s), set_(dtype(z)).to(String("int32")))


def _packing_rules():
    """Packed shapes per format and rank (superopt/core/formats.py); an unpack has the shape it names; the cube's
    fractal contraction swaps the fractal counts of its result (NZ: N1 before M1)."""
    for f in FORMATS.values():
        for r in range(MAX_RANK + 1):
            if f.fits(r):
                dims = f.packed_dims([s[i] for i in range(r)], lambda n, blk: (n + (blk - 1)) / blk)
                yield rule(eq(z).to(pack(x, String(f.name))), eq(s).to(shape(x)), eq(s.length()).to(i64(r)),
                           eq(d).to(dtype(x))).then(set_(shape(z)).to(Vec[i64](*dims) if dims else Vec[i64].empty()),
                                                    set_(dtype(z)).to(d))
    yield rule(eq(z).to(unpack(x, op, s)), eq(d).to(dtype(x))).then(set_(shape(z)).to(s), set_(dtype(z)).to(d))
    yield rule(eq(z).to(fractal_matmul(x, y, d)), eq(s).to(shape(x)), eq(t).to(shape(y))).then(
        set_(shape(z)).to(s.set(s.length() - 4, t[t.length() - 3]).set(s.length() - 3, s[s.length() - 4])),
        set_(dtype(z)).to(d))


def _concat_rules():
    yield rule(concat(xs, k)).then(concat_demand(xs, k))
    yield rule(concat_demand(tcons(x, rest), k)).then(concat_demand(rest, k))
    yield rule(concat_demand(tnil(), k)).then(set_(concat_extent(tnil(), k)).to(i64(0)))
    yield rule(concat_demand(tcons(x, rest), k), eq(e).to(concat_extent(rest, k)), eq(s).to(shape(x))).then(
        set_(concat_extent(tcons(x, rest), k)).to(s[k] + e))
    yield rule(eq(z).to(concat(tcons(x, rest), k)), eq(e).to(concat_extent(tcons(x, rest), k)),
               eq(s).to(shape(x)), eq(d).to(dtype(x))).then(set_(shape(z)).to(s.set(k, e)), set_(dtype(z)).to(d))


# The sign analysis's op tables, from the op table's facts (core/ops.py, FACTS). Unary ops whose every result
# is >= -0 or NaN (sqrt(-0) is -0, of a negative NaN); unary ops that keep such a value so (log1p(-0) = -0,
# tanh(+inf) = 1); binary ops of two such operands that give one (a sum, a product: 0 * inf is NaN; not a
# quotient, x / -0 is -inf; max and min have their own rules, for integers too); reductions that do (not
# reduce_max: its empty reduction is -inf).
NONNEG_OPS = knowing("nonneg", "unary")
KEEPS_NONNEG_OPS = knowing("keeps_nonneg", "unary")
PAIR_NONNEG_OPS = knowing("keeps_nonneg", "binary")
SIGN_REDUCTIONS = knowing("keeps_nonneg", "reduce")


def _sign_rules():
    # abs, square, a sum, a product, a power of integers wrap (abs(-128) is -128 in int8): floats only
    yield rule(eq(z).to(unary(op, x)), nonneg_op(op), *_floating(z)).then(nonneg(z))
    yield rule(eq(z).to(unary(op, x)), keeps_nonneg_op(op), nonneg(x)).then(nonneg(z))
    yield rule(eq(z).to(binary(op, x, y)), pair_nonneg_op(op), nonneg(x), nonneg(y), *_floating(z)).then(nonneg(z))
    yield rule(eq(z).to(binary(String("min"), x, y)), nonneg(x), nonneg(y)).then(nonneg(z))
    yield rule(eq(z).to(binary(String("mul"), x, x)), *_floating(z)).then(nonneg(z))
    yield rule(eq(z).to(binary(String("max"), x, y)), nonneg(y)).then(nonneg(z))
    yield rule(eq(z).to(binary(String("max"), x, y)), nonneg(x)).then(nonneg(z))
    yield rule(eq(z).to(integer_pow(x, k)), eq(k % i64(2)).to(i64(0)), *_floating(z)).then(nonneg(z))
    yield rule(eq(z).to(integer_pow(x, k)), k >= i64(0), nonneg(x), *_floating(z)).then(nonneg(z))
    yield rule(eq(z).to(lit(v, d)), v >= f64(0.0)).then(nonneg(z))
    for name in SIGN_REDUCTIONS:
        wraps = () if name == "reduce_min" else _floating(z)   # an empty integer reduce_min is the dtype's max
        yield rule(eq(z).to(reduce(String(name), x, p)), nonneg(x), *wraps).then(nonneg(z))
    yield from _kept_by_views(nonneg)
    yield rule(eq(z).to(convert(x, d)), nonneg(x), float_dtype(d)).then(nonneg(z))
    for unsigned in ("bool", "uint8", "uint16", "uint32", "uint64"):
        yield rule(eq(dtype(z)).to(String(unsigned))).then(nonneg(z))
    # from the range analysis's facts: a quotient by a value >= the smallest normal (x / +inf is 0), the
    # negation of a value <= +0, a value <= +0 taken from one >= -0, a log of a value >= 1 (XLA's is 0 or more
    # on every float32 in [1, 2], every float16 and bfloat16 >= 1), rsqrt of a positive value (rsqrt(+inf) = 0)
    yield rule(eq(z).to(binary(String("div"), x, y)), nonneg(x), positive(y)).then(nonneg(z))
    yield rule(eq(z).to(unary(String("neg"), x)), nonpos(x), *_floating(z)).then(nonneg(z))
    yield rule(eq(z).to(binary(String("sub"), x, y)), nonneg(x), nonpos(y), *_floating(z)).then(nonneg(z))
    yield rule(eq(z).to(unary(String("log"), x)), at_least_one(x)).then(nonneg(z))
    yield rule(eq(z).to(unary(String("rsqrt"), x)), positive(x)).then(nonneg(z))


def _view_rules():
    """`view_of(z, x)`: every element of z is one of x (a reshape, broadcast, transpose, slice or stop_gradient
    of it). `nan_guarded(z, x)`: z is x where x is not NaN and NaN elsewhere: jnp.logaddexp(c, y) (and so
    softplus) chooses c + y where c - y is NaN and its own result elsewhere, and with y finite that is only
    where c is NaN, so c + y is NaN too."""
    yield rule(eq(z).to(reshape(x, s))).then(view_of(z, x))
    yield rule(eq(z).to(broadcast(x, s, p))).then(view_of(z, x))
    yield rule(eq(z).to(transpose(x, p))).then(view_of(z, x))
    yield rule(eq(z).to(slice_(x, s, t, p))).then(view_of(z, x))
    yield rule(eq(z).to(unary(String("stop_gradient"), x))).then(view_of(z, x))
    yield rule(eq(z).to(select(w, x, w2)), eq(w).to(binary(String("ne"), y, y)),
               eq(y).to(binary(String("sub"), u, u2)), eq(w2).to(binary(String("add"), u, u2)), finite(u2)).then(
        nan_guarded(z, x))


def _kept_by_views(fact):
    """A fact of every element holds for a view of the tensor, for a choice between two that have it, and but
    for `finite` (NaN is no finite number) for a NaN-guarded one."""
    yield rule(view_of(z, x), fact(x)).then(fact(z))
    yield rule(eq(z).to(select(w, x, y)), fact(x), fact(y)).then(fact(z))
    if fact is not finite:
        yield rule(nan_guarded(z, x), fact(x)).then(fact(z))


# The integer analysis's op tables (the op table's facts): unary ops whose every result is an integer, +-inf
# or NaN; unary ops that keep such a value so; binary ops of two such operands that give one (not a quotient:
# 1 / 2); reductions that do.
INTEGRAL_OPS = knowing("integral", "unary")
KEEPS_INTEGRAL_OPS = knowing("keeps_integral", "unary")
PAIR_INTEGRAL_OPS = knowing("keeps_integral", "binary")
INTEGRAL_REDUCTIONS = knowing("keeps_integral", "reduce")
INTEGER_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def _integral_rules():
    yield rule(eq(d).to(dtype(z)), integer_dtype(d)).then(integral(z))
    yield rule(eq(z).to(unary(op, x)), integral_op(op)).then(integral(z))
    yield rule(eq(z).to(unary(op, x)), keeps_integral_op(op), integral(x)).then(integral(z))
    yield rule(eq(z).to(binary(op, x, y)), pair_integral_op(op), integral(x), integral(y)).then(integral(z))
    yield rule(eq(z).to(integer_pow(x, k)), k >= i64(0), integral(x)).then(integral(z))
    yield rule(eq(z).to(lit(v, d)), eq(v).to(f64.from_i64(v.to_i64()))).then(integral(z))
    yield rule(eq(z).to(iota(k, s, d))).then(integral(z))
    for name in INTEGRAL_REDUCTIONS:
        yield rule(eq(z).to(reduce(String(name), x, p)), integral(x)).then(integral(z))
    yield from _kept_by_views(integral)
    yield rule(eq(z).to(convert(x, d)), integral(x)).then(integral(z))


# The range analysis's op tables: unary ops whose result is finite where their operand is (none overflows);
# unary ops whose every result is at most one or NaN (logistic(+inf) = 1, sin(+inf) is NaN): XLA's CPU
# approximations of these stay at most 1 on 5 million float32 values near and past saturation; its erf
# does not (1.0000001 on 217 of them), so it is not one.
KEEPS_FINITE_OPS = knowing("keeps_finite", "unary")
AT_MOST_ONE_OPS = knowing("at_most_one", "unary")


def _range_rules():
    yield rule(eq(d).to(dtype(z)), integer_dtype(d)).then(finite(z))
    for wide in ("float32", "float64", "bfloat16"):   # every integer dtype's range fits; float16's does not
        yield rule(eq(z).to(convert(x, String(wide))), eq(d).to(dtype(x)), integer_dtype(d)).then(finite(z))
    yield rule(eq(z).to(lit(v, d)), v <= f64(1.7976931348623157e308), v >= f64(-1.7976931348623157e308)).then(finite(z))
    # not a float iota: a float16 one past 65504 elements counts to inf (an integer one is finite by its dtype)
    yield rule(eq(z).to(unary(op, x)), keeps_finite_op(op), finite(x)).then(finite(z))
    for name in ("max", "min"):
        yield rule(eq(z).to(binary(String(name), x, y)), finite(x), finite(y)).then(finite(z))
    yield from _kept_by_views(finite)
    # positive: at least the dtype's smallest normal number (+inf and NaN allowed), so no flush to zero of
    # a subnormal makes it 0; a literal at least float16's smallest normal, 2**-14, the largest of them
    yield rule(eq(z).to(lit(v, d)), v >= f64(2.0 ** -14)).then(positive(z))
    for wide, tiny in (("float32", 2.0 ** -126), ("bfloat16", 2.0 ** -126), ("float64", 2.0 ** -1022)):
        yield rule(eq(z).to(lit(v, String(wide))), v >= f64(tiny)).then(positive(z))   # an epsilon of 1e-5
    yield rule(at_least_one(z)).then(positive(z))
    # rsqrt of a finite positive value is finite and positive (rsqrt(2**-126) is 2**63, of 65504 is 2**-8)
    yield rule(eq(z).to(unary(String("rsqrt"), x)), finite(x), positive(x)).then(finite(z), positive(z))
    yield rule(eq(z).to(unary(String("sqrt"), x)), finite(x), nonneg(x)).then(finite(z))
    yield rule(eq(z).to(unary(String("cosh"), x))).then(positive(z))
    for name in ("sqrt", "abs"):
        yield rule(eq(z).to(unary(String(name), x)), positive(x)).then(positive(z))
    yield rule(eq(z).to(binary(String("max"), x, y)), positive(x)).then(positive(z))
    yield rule(eq(z).to(binary(String("max"), x, y)), positive(y)).then(positive(z))
    yield rule(eq(z).to(binary(String("min"), x, y)), positive(x), positive(y)).then(positive(z))
    yield rule(eq(z).to(binary(String("add"), x, y)), positive(x), nonneg(y), *_floating(z)).then(positive(z))
    yield rule(eq(z).to(binary(String("add"), x, y)), nonneg(x), positive(y), *_floating(z)).then(positive(z))
    yield rule(eq(z).to(binary(String("sub"), x, y)), positive(x), nonpos(y), *_floating(z)).then(positive(z))
    yield rule(eq(z).to(reduce(String("reduce_min"), x, p)), positive(x)).then(positive(z))   # empty: +inf
    yield from _kept_by_views(positive)
    # at most one (-inf and NaN allowed)
    yield rule(eq(z).to(unary(op, x)), at_most_one_op(op)).then(at_most_one(z))
    yield rule(eq(z).to(lit(v, d)), v <= f64(1.0)).then(at_most_one(z))
    yield rule(nonpos(z)).then(at_most_one(z))
    # XLA's exp is at most 1 on every float32 in [-1, -0] and every float16 and bfloat16 <= 0
    yield rule(eq(z).to(unary(String("exp"), x)), nonpos(x)).then(at_most_one(z))
    # a quotient by the sum along axes p of values >= -0 (a softmax): the sum is each of them or more, as
    # rounding is monotone, and at least the smallest normal number, so no flush to zero makes it less
    yield rule(eq(z).to(binary(String("div"), x, y)), row_sum(y, x, p), positive(y)).then(at_most_one(z))
    yield rule(eq(z).to(binary(String("min"), x, y)), at_most_one(x)).then(at_most_one(z))
    yield rule(eq(z).to(binary(String("min"), x, y)), at_most_one(y)).then(at_most_one(z))
    yield rule(eq(z).to(binary(String("max"), x, y)), at_most_one(x), at_most_one(y)).then(at_most_one(z))
    yield rule(eq(z).to(binary(String("mul"), x, y)), at_most_one(x), nonneg(x), at_most_one(y), nonneg(y)).then(
        at_most_one(z))
    yield rule(eq(z).to(reduce(String("reduce_max"), x, p)), at_most_one(x)).then(at_most_one(z))   # empty: -inf
    yield from _kept_by_views(at_most_one)


def _row_max_rules():
    """`row_max(m, x, p)`: m is the largest element of x along axes p, none of them empty (NaN where one is)."""
    for r in range(1, MAX_RANK + 1):
        yield rule(eq(z).to(reduce(String("reduce_max"), x, p)), eq(p.length()).to(i64(r)), eq(s).to(shape(x)),
                   *(s[p[i]] > i64(0) for i in range(r))).then(row_max(z, x, p))
    # jax.nn.softmax takes max(-inf, the row maxima): each is -inf or more
    yield rule(eq(z).to(binary(String("max"), y, w)), eq(y).to(lit(v, d)), v < f64(-1.7976931348623157e308),
               row_max(w, x, p)).then(row_max(z, x, p))
    yield rule(eq(z).to(binary(String("max"), w, y)), eq(y).to(lit(v, d)), v < f64(-1.7976931348623157e308),
               row_max(w, x, p)).then(row_max(z, x, p))
    # `peak(y, x, p)`: y is such a maximum broadcast back so that each element of x meets its own
    yield rule(eq(y).to(broadcast(w, s, c)), row_max(w, x, p), kept_axes(p, c)).then(peak(y, x, p))
    yield rule(eq(z).to(unary(String("stop_gradient"), y)), peak(y, x, p)).then(peak(z, x, p))


def _nonpos_rules():
    """`nonpos`: no element above +0 (-inf and NaN allowed). Its source that matters is a value less its own
    maximum along some axes, broadcast back (softmax, logsumexp): exactly <= 0, so rounded <= 0, as is a
    flush to zero of it."""
    # (an integer x less its maximum wraps: int8's -128 - 1 is 127; so do the sums, products and
    # negations below, and an unsigned one's negation)
    yield rule(eq(z).to(binary(String("sub"), x, y)), peak(y, x, p), *_floating(z)).then(nonpos(z))
    yield rule(eq(z).to(lit(v, d)), v <= f64(0.0)).then(nonpos(z))   # egglog orders NaN above +inf: not NaN
    yield rule(eq(z).to(unary(String("neg"), x)), nonneg(x), *_floating(z)).then(nonpos(z))
    yield rule(eq(z).to(unary(op, x)), keeps_nonneg_op(op), nonpos(x)).then(nonpos(z))   # odd, monotone, f(0) = 0
    yield rule(eq(z).to(binary(String("sub"), x, y)), nonpos(x), nonneg(y), *_floating(z)).then(nonpos(z))
    yield rule(eq(z).to(binary(String("add"), x, y)), nonpos(x), nonpos(y), *_floating(z)).then(nonpos(z))
    yield rule(eq(z).to(binary(String("mul"), x, y)), nonpos(x), nonneg(y), *_floating(z)).then(nonpos(z))
    yield rule(eq(z).to(binary(String("mul"), x, y)), nonneg(x), nonpos(y), *_floating(z)).then(nonpos(z))
    yield rule(eq(z).to(binary(String("div"), x, y)), nonpos(x), positive(y)).then(nonpos(z))
    yield rule(eq(z).to(binary(String("min"), x, y)), nonpos(x)).then(nonpos(z))
    yield rule(eq(z).to(binary(String("min"), x, y)), nonpos(y)).then(nonpos(z))
    yield rule(eq(z).to(binary(String("max"), x, y)), nonpos(x), nonpos(y)).then(nonpos(z))
    yield rule(eq(z).to(reduce(String("reduce_sum"), x, p)), nonpos(x), *_floating(z)).then(nonpos(z))
    yield rule(eq(z).to(reduce(String("reduce_max"), x, p)), nonpos(x)).then(nonpos(z))   # not reduce_min: +inf
    yield from _kept_by_views(nonpos)
    yield rule(eq(z).to(convert(x, d)), nonpos(x), float_dtype(d)).then(nonpos(z))


def _at_least_one_rules():
    """`at_least_one`: no element below 1 (+inf and NaN allowed). Its source that matters is the sum along
    axes p of exp(x - its maximum along p): the maximum's own term is exp(0) = 1 and the others are >= 0."""
    yield rule(eq(z).to(reduce(String("reduce_sum"), x, p)), tops_one(x, p), nonneg(x)).then(at_least_one(z))
    yield rule(eq(z).to(lit(v, d)), v >= f64(1.0)).then(at_least_one(z))
    # XLA's exp is at least 1 on every float32 in [+0, 1] and every float16 and bfloat16 >= 0
    yield rule(eq(z).to(unary(String("exp"), x)), nonneg(x)).then(at_least_one(z))
    yield rule(eq(z).to(binary(String("add"), x, y)), at_least_one(x), nonneg(y), *_floating(z)).then(at_least_one(z))
    yield rule(eq(z).to(binary(String("add"), x, y)), nonneg(x), at_least_one(y), *_floating(z)).then(at_least_one(z))
    yield rule(eq(z).to(binary(String("mul"), x, y)), at_least_one(x), at_least_one(y), *_floating(z)).then(
        at_least_one(z))
    yield rule(eq(z).to(binary(String("max"), x, y)), at_least_one(x)).then(at_least_one(z))
    yield rule(eq(z).to(binary(String("max"), x, y)), at_least_one(y)).then(at_least_one(z))
    yield rule(eq(z).to(binary(String("min"), x, y)), at_least_one(x), at_least_one(y)).then(at_least_one(z))
    yield rule(eq(z).to(reduce(String("reduce_min"), x, p)), at_least_one(x)).then(at_least_one(z))   # empty: +inf
    yield from _kept_by_views(at_least_one)
    yield rule(eq(z).to(convert(x, d)), at_least_one(x), float_dtype(d)).then(at_least_one(z))   # 1 is exact


def _row_sum_rules():
    """`tops_one(e, p)`: each row of e along axes p has an element at least one: exp(x - its maximum along p)
    has exp(0) = 1 there. `row_sum(y, x, p)`: y is the sum of x along p broadcast back against x, with x's
    elements >= -0, so each of them or more, as rounding is monotone (jnp sums float16 in float32 and
    converts the sum back, which keeps it: each float16 is a float32)."""
    yield rule(eq(z).to(unary(String("exp"), y)), eq(y).to(binary(String("sub"), x, w)), peak(w, x, p)).then(
        tops_one(z, p))
    yield rule(eq(z).to(convert(x, d)), tops_one(x, p), float_dtype(d)).then(tops_one(z, p))
    yield rule(eq(y).to(broadcast(w, s, c)), eq(w).to(reduce(String("reduce_sum"), x, p)), kept_axes(p, c),
               nonneg(x)).then(row_sum(y, x, p))
    yield rule(eq(y).to(broadcast(w, s, c)), eq(w).to(reduce(String("reduce_sum"), u, p)), eq(u).to(convert(x, d)),
               widening(dtype(x), d), kept_axes(p, c), nonneg(x)).then(row_sum(y, x, p))
    yield rule(eq(z).to(convert(y, d)), row_sum(y, x, p), eq(dtype(x)).to(d)).then(row_sum(z, x, p))
    yield rule(eq(z).to(unary(String("stop_gradient"), y)), row_sum(y, x, p)).then(row_sum(z, x, p))


# Unary ops whose result is real where the operand is complex (abs of complex64 is float32; jnp.angle is
# atan2 of imag and real): of any other dtype, the operand's own.
REAL_RESULT_OPS = knowing("real_result", "unary")
# Each dtype the e-graph may hold, and the dtype of its real part.
REAL_DTYPES = tuple((t, t) for t in INTEGER_DTYPES + ("float8_e4m3fn", "float8_e5m2", "float16", "bfloat16",
                                                     "float32", "float64")) + (
    ("complex64", "float32"), ("complex128", "float64"))

# dtype pairs whose conversion (first to second) is exact
WIDENING = (("float16", "float32"), ("float16", "float64"), ("bfloat16", "float32"), ("bfloat16", "float64"),
            ("float32", "float64"))


@functools.cache
def facts() -> tuple:
    """Ground facts the analyses need, registered once per e-graph."""
    bool_ops = flagged("bool_result")
    floats = ("float16", "bfloat16", "float32", "float64")
    return tuple([float_dtype(String(f)) for f in floats] + [bool_result_op(String(o)) for o in sorted(bool_ops)] + [
        same_dtype_op(String(o)) for o in sorted((UNARY_OPS | BINARY_OPS) - bool_ops - set(REAL_RESULT_OPS))] + [
        real_result_op(String(o)) for o in REAL_RESULT_OPS] + [real_dtype(String(a), String(b)) for a, b in REAL_DTYPES] + [
        nonneg_op(String(o)) for o in NONNEG_OPS] + [keeps_nonneg_op(String(o)) for o in KEEPS_NONNEG_OPS] + [
        pair_nonneg_op(String(o)) for o in PAIR_NONNEG_OPS] + [
        integral_op(String(o)) for o in INTEGRAL_OPS] + [keeps_integral_op(String(o)) for o in KEEPS_INTEGRAL_OPS] + [
        pair_integral_op(String(o)) for o in PAIR_INTEGRAL_OPS] + [integer_dtype(String(t)) for t in INTEGER_DTYPES] + [
        keeps_finite_op(String(o)) for o in KEEPS_FINITE_OPS] + [at_most_one_op(String(o)) for o in AT_MOST_ONE_OPS] + [
        widening(String(a), String(b)) for a, b in WIDENING])


def axes_facts(graph) -> list:
    """`kept_axes` of the reductions in `graph` (not of every set of axes of every rank: 120 facts that
    took longer to register than a small program to encode): a reduction that rewrites create along other
    axes only goes without the facts that need them."""
    found = {(n.attrs[0], len(graph.nodes[n.inputs[0]].shape)) for n in graph.nodes
             if n.op in ("reduce_max", "reduce_sum") and n.attrs and n.attrs[0]}
    return [kept_axes(ints(p), ints([i for i in range(rank) if i not in p])) for p, rank in sorted(found)]


_adopted: list = []   # the analysis rules as read back from the cache (superopt/reuse.py), if built so


@functools.cache
def analysis_rules() -> tuple:
    """The analysis rules: those adopted from the cache, or built now (building them is a tenth of a second)."""
    if _adopted:
        return _adopted[0]
    return (*_elementwise_rules(), *_layout_rules(), *_contraction_rules(), *_concat_rules(), *_packing_rules(),
            *_view_rules(), *_sign_rules(), *_integral_rules(), *_row_max_rules(), *_row_sum_rules(),
            *_range_rules(), *_nonpos_rules(), *_at_least_one_rules())


def adopt(rules: tuple) -> None:
    """Use `rules` (the analysis rules, rebuilt from their data by egraph/saved.py) instead of building them,
    unless the rule set was built already."""
    if not _adopted and analysis_rules.cache_info().currsize == 0:
        _adopted.append(tuple(rules))


@functools.cache
def analysis():
    """The analysis rule set, built at its first use: a process whose programs all come from the cache
    never pays for it."""
    return ruleset(*analysis_rules(), name="analysis")
