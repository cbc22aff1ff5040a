"""Algebra: sound graph-level identities that pay on real programs.

One table, in sections. Legality conditions are named predicates over shapes and dtypes; which side is
cheaper is the cost model's business, so identities that can pay either way are declared `two_way`.
"""
from __future__ import annotations

from superopt.rewrites.pattern import (
    add, app, arg, axes_of, binary, broadcast, compose, concat, const, conv, dim, div, dtype_of, dtypes, exp,
    floats, iadd, ints, lit, log, last_axis_of, matmul, mul, neg, ones_like, ops, reduce, reshape, select, set_at,
    set_last, shape_of, scan, slice_, sub, tensors, transpose, unary, vecs, zeros_like, integer_pow,
)
from superopt.rewrites.rule import RuleSet, given, multi_rule, rule, when

x, y, z, w = tensors("x y z w")
p, q, s, t = vecs("p q s t")
lo, hi, step = vecs("lo hi step")
(d,) = dtypes("d")
(op,) = ops("op")
c1, c2 = floats("c1 c2")
i, j, k = ints("i j k")
one, zero = lit(1.0, d), lit(0.0, d)


def _pow(v, c: float):
    """v ** c, a float32 v and literal c (the rules that read it are float32's: `has_dtype`)."""
    return binary("pow", v, lit(c, "float32"))


def _unit_broadcast(v, shape, dims: tuple) -> list:
    """Conditions that broadcast(v, shape, dims), v a matrix, only adds one unit axis (rank 3): v's axes land
    on `dims` unexpanded. Sizes compared one by one, so the rule compiles once (a predicate over a whole shape
    would expand it once per rank)."""
    b = broadcast(v, shape, dims)
    (unit,) = {0, 1, 2} - set(dims)
    return [when("rank", v, 2), when("rank", b, 3), when("equal", dim(b, unit), 1),
            *(when("equal", dim(b, k), dim(v, i)) for i, k in enumerate(dims))]


def _moderate_positive(*xs) -> list:
    """Domain conditions: each of `xs` positive (at least the smallest normal number) and moderate (finite,
    within the square roots of the normal range), so a product or quotient of two is a normal number."""
    return [given(name, v) for v in xs for name in ("positive", "moderate")]


def _merge_shared_lhs(leaf, n: int):
    """x@W1, ..., x@Wn with leaf weights ordered by id -> slices of x@concat(W1..Wn) on the last axis."""
    ids = [i, j, k][:n]
    ws = [leaf(v) for v in ids]
    merged = matmul(x, concat(ws, 1), d)
    pairs, start = [], 0
    for w in ws:
        product = matmul(x, w, d)
        stop = iadd(start, dim(w, 1))
        pairs.append((product, slice_(merged, set_last(zeros_like(x), start), set_last(shape_of(product), stop),
                                      ones_like(x))))
        start = stop
    order = [when("less", a, b) for a, b in zip(ids, ids[1:])]
    kind = "inputs" if leaf is arg else "constants"
    return multi_rule(f"matmul-merge-{n}-shared-lhs-{kind}", pairs, *order, *(when("rank", w, 2) for w in ws),
                      numerics="rounding", doc=f"x@W1..x@W{n} ({kind}) -> slices of x@concat(W1..W{n})")


def _by_rows(op_name: str, dtype: str | None = None):
    """A full reduction = the reduction of its row reductions. The rows are a row kernel, which takes the
    elementwise ops before it (an unscale, an is-finite check, a square) on chip. Sums are restricted to
    f32, whose row sums XLA also keeps in f32; in f16 or bf16 the rounded row sums lose accuracy. A sum
    regrouped so adds the same terms in another order ("order")."""
    whole = reduce(op_name, x, p)
    return rule(f"{op_name.replace('_', '-')}-all-by-rows", whole,
                reduce(op_name, reshape(reduce(op_name, x, last_axis_of(x)), set_last(shape_of(x), 1)), p),
                when("all_axes", p, x), when("long_last_axis", x), *([when("has_dtype", x, dtype)] if dtype else []),
                numerics="order" if op_name == "reduce_sum" else "exact",
                doc=f"{op_name}(x) over all axes = {op_name} of the row {op_name}s of x")


def _fold(op_name: str, symbol: str, attribute: str, *conditions):
    """c1 op c2 -> one literal, computed in f64 (functions.py: for literals the dtype holds, the f64
    result rounded once to the dtype is what XLA computes), kept only when the result is a normal number
    of the dtype: an overflow to inf or an underflow to zero would not be the f64 value, and a zero
    result's sign is lost in egglog's f64 (-0.0 and 0.0 are one value there)."""
    folded = app(attribute, c1, c2)
    return rule(f"fold-{op_name}", binary(op_name, lit(c1, d), lit(c2, d)), lit(folded, d),
                when("float_dtype", d), *conditions, when("fold_in_range", folded, d), numerics="rounding",
                doc=f"c1 {symbol} c2 -> one literal, a normal number of the dtype")


# jnp.trace's mask: row index == column index
_EYE = binary("eq", app("iota", 0, s, "int32"), app("iota", 1, s, "int32"))


ALGEBRA = RuleSet("algebra", {
    "transpose": [
        rule("transpose-of-transpose", transpose(transpose(x, p), q), transpose(x, compose(p, q)),
             doc="transpose(transpose(x, p), q) -> transpose(x, p[q])"),
        rule("transpose-identity", transpose(x, p), x, when("identity_perm", p), doc="transpose(x, 0..r-1) -> x"),
        rule("transpose-of-matmul", transpose(matmul(x, y, d), p), matmul(transpose(y, p), transpose(x, p), d),
             when("swaps_last_two", p), when("fits", p, x), when("fits", p, y), two_way=True,
             doc="(x@y)^T <-> y^T @ x^T on the last two axes"),
        rule("transpose-through-unary", transpose(unary(op, x), p), unary(op, transpose(x, p)), two_way=True,
             doc="elementwise ops commute with transposes"),
        rule("transpose-through-binary", transpose(binary(op, x, y), p), binary(op, transpose(x, p), transpose(y, p)),
             when("same_shape", x, y), two_way=True, doc="transpose(x op y) <-> transpose(x) op transpose(y)"),
        rule("transpose-through-scalar-binary", transpose(binary(op, x, y), p), binary(op, transpose(x, p), y),
             when("scalar", y), two_way=True, doc="transpose(x op c) <-> transpose(x) op c, rank-0 c"),
    ],
    "matmul": [
        rule("matmul-assoc", matmul(matmul(x, y, d), z, d), matmul(x, matmul(y, z, d), d),
             when("has_dtype", x, d), when("has_dtype", y, d), when("has_dtype", z, d), when("matmul_ok", y, z),
             two_way=True, numerics="reals", doc="(x@y)@z <-> x@(y@z); shapes decide which is cheaper"),
        # Factoring only: expanding x@(y+z) into x@y + x@z can cancel catastrophically (bfloat16
        # 2.25 * (3.875 - 4) = -0.28125 becomes 8.75 - 9 = -0.25) and never saves a product.
        rule("matmul-distribute-lhs", add(matmul(x, y, d), matmul(x, z, d)), matmul(x, add(y, z), d),
             when("same_shape", y, z), when("has_dtype", y, d), numerics="reals",
             doc="x@y + x@z -> x@(y+z)"),
        rule("matmul-distribute-rhs", add(matmul(x, z, d), matmul(y, z, d)), matmul(add(x, y), z, d),
             when("same_shape", x, y), when("has_dtype", x, d), numerics="reals",
             doc="x@z + y@z -> (x+y)@z"),
        _merge_shared_lhs(arg, 2), _merge_shared_lhs(arg, 3),
        _merge_shared_lhs(const, 2), _merge_shared_lhs(const, 3),
        rule("matmul-scale-lhs", matmul(mul(x, lit(c1, d)), y, d), mul(matmul(x, y, d), lit(c1, d)),
             when("has_dtype", x, d), two_way=True, numerics="reals", doc="(x*c)@y <-> (x@y)*c, scalar c"),
        rule("matmul-scale-rhs", matmul(x, mul(y, lit(c1, d)), d), mul(matmul(x, y, d), lit(c1, d)),
             when("has_dtype", y, d), two_way=True, numerics="reals", doc="x@(y*c) <-> (x@y)*c, scalar c"),
        rule("conv-scale-lhs", conv(mul(x, lit(c1, d)), y, k), mul(conv(x, y, k), lit(c1, d)),
             when("has_dtype", x, d), when("has_dtype", y, d), two_way=True, numerics="reals",
             doc="conv(x*c, y) <-> conv(x, y)*c, scalar c (a convolution is linear in each operand)"),
        rule("conv-scale-rhs", conv(x, mul(y, lit(c1, d)), k), mul(conv(x, y, k), lit(c1, d)),
             when("has_dtype", x, d), when("has_dtype", y, d), two_way=True, numerics="reals",
             doc="conv(x, y*c) <-> conv(x, y)*c, scalar c"),
    ],
    # A reduction of a product that reads a part of it: the products it needs, summed ("order": the same
    # products a dot adds, in another grouping). float32 only, where XLA's dot and its row sums both add
    # in float32.
    "products": [
        rule("diagonal-of-matmul", slice_(reshape(matmul(x, y, "float32"), s), lo, hi, step),
             reduce("reduce_sum", mul(x, transpose(y, (1, 0))), (1,)),
             when("rank", x, 2), when("rank", y, 2), when("has_dtype", x, "float32"), when("has_dtype", y, "float32"),
             when("main_diagonal", lo, hi, step, matmul(x, y, "float32")), numerics="order",
             doc="diag(x@y) -> the row sums of x * y^T: n*k products instead of n*n*k"),
        rule("trace-of-matmul", reduce("reduce_sum", select(_EYE, broadcast(lit(0.0, "float32"), s, ()),
                                                            matmul(x, y, "float32")), p),
             reduce("reduce_sum", mul(x, transpose(y, (1, 0))), p),
             when("rank", x, 2), when("rank", y, 2), when("has_dtype", x, "float32"), when("has_dtype", y, "float32"),
             when("square", matmul(x, y, "float32")), when("all_axes", p, matmul(x, y, "float32")),
             numerics="order", doc="trace(x@y) (jnp.trace: the sum of the product where row = column) -> "
                                   "the sum of x * y^T"),
    ],
    # Full sums of products, factored ("reals": sum_ij x_i y_j = (sum_i x_i)(sum_j y_j) can overflow, or
    # cancel, where the products summed one by one do not). n*m products become n + m additions.
    "factored-sums": [
        rule("sum-of-matmul", reduce("reduce_sum", matmul(x, y, "float32"), p),
             reduce("reduce_sum", mul(reduce("reduce_sum", x, (0,)), reduce("reduce_sum", y, (1,))), (0,)),
             when("rank", x, 2), when("rank", y, 2), when("has_dtype", x, "float32"), when("has_dtype", y, "float32"),
             when("all_axes", p, matmul(x, y, "float32")), numerics="reals",
             doc="sum(x@y) -> the column sums of x dotted with the row sums of y: (n + m)*k additions "
                 "instead of n*m*k products"),
        rule("sum-of-outer-product", reduce("reduce_sum", mul(x, y), p),
             mul(reduce("reduce_sum", x, (0, 1)), reduce("reduce_sum", y, (0, 1))),
             when("column_vector", x), when("row_vector", y), when("all_axes", p, mul(x, y)),
             when("has_dtype", x, "float32"), when("has_dtype", y, "float32"), numerics="reals",
             doc="sum(u[:, None] * v[None, :]) -> sum(u) * sum(v)"),
        rule("sum-of-outer-product-left", reduce("reduce_sum", mul(y, x), p),
             mul(reduce("reduce_sum", y, (0, 1)), reduce("reduce_sum", x, (0, 1))),
             when("column_vector", x), when("row_vector", y), when("all_axes", p, mul(y, x)),
             when("has_dtype", x, "float32"), when("has_dtype", y, "float32"), numerics="reals",
             doc="sum(v[None, :] * u[:, None]) -> sum(v) * sum(u)"),
    ],
    # Sums of broadcast products that are matrix-vector products: the same products, added by a dot.
    "matvec": [
        # A product of two broadcasts (unit axes added, nothing expanded: `_unit_broadcast`) summed over their
        # shared axis is a matrix product written out by hand (einsum-like code, pairwise dot products): XLA
        # fuses the product into its reduction loop, which is not vectorised, and does not form a dot.
        rule("summed-outer-product-as-matmul",
             reduce("reduce_sum", mul(broadcast(x, s, (0, 1)), broadcast(y, t, (1, 2))), (1,)),
             matmul(x, y, dtype_of(x)), *_unit_broadcast(x, s, (0, 1)), *_unit_broadcast(y, t, (1, 2)),
             when("has_dtype", y, dtype_of(x)), when("float_dtype", dtype_of(x)), numerics="order",
             doc="sum(x[:, :, None] * y[None, :, :], axis=1) -> x @ y"),
        rule("summed-row-products-as-matmul",
             reduce("reduce_sum", mul(broadcast(x, s, (0, 2)), broadcast(y, t, (1, 2))), (2,)),
             matmul(x, transpose(y, (1, 0)), dtype_of(x)), *_unit_broadcast(x, s, (0, 2)),
             *_unit_broadcast(y, t, (1, 2)), when("has_dtype", y, dtype_of(x)), when("float_dtype", dtype_of(x)),
             numerics="order", doc="sum(x[:, None, :] * y[None, :, :], axis=2) -> x @ y.T (each row of x dotted "
                                   "with each of y)"),
        rule("row-sums-of-scaled-rows", reduce("reduce_sum", mul(x, y), (1,)),
             reshape(matmul(x, transpose(y, (1, 0)), "float32"), shape_of(reduce("reduce_sum", mul(x, y), (1,)))),
             when("rank", x, 2), when("row_vector", y), when("same_shape", x, mul(x, y)),
             when("has_dtype", x, "float32"), when("has_dtype", y, "float32"), numerics="order",
             doc="sum(x * v[None, :], axis=1) -> x @ v (x as large as the product: not itself broadcast)"),
        rule("column-sums-of-scaled-columns", reduce("reduce_sum", mul(x, y), (0,)),
             reshape(matmul(transpose(y, (1, 0)), x, "float32"), shape_of(reduce("reduce_sum", mul(x, y), (0,)))),
             when("rank", x, 2), when("column_vector", y), when("same_shape", x, mul(x, y)),
             when("has_dtype", x, "float32"), when("has_dtype", y, "float32"), numerics="order",
             doc="sum(x * v[:, None], axis=0) -> v @ x (x as large as the product: not itself broadcast)"),
        # A plain row or column sum is a product with ones: each term times 1 is the term, added by a dot.
        # XLA's CPU dot (a GEMV) reads a cached matrix several times faster than its reduction loop adds it
        # (extract/targets/cpu.toml); on a GPU or an NPU (whose cube takes float16) the sum stays a sum.
        rule("row-sums-as-matvec", reduce("reduce_sum", x, (1,)),
             reshape(matmul(x, transpose(broadcast(lit(1.0, "float32"), set_at(shape_of(x), 0, 1), ()), (1, 0)),
                            "float32"), shape_of(reduce("reduce_sum", x, (1,)))),
             when("rank", x, 2), when("has_dtype", x, "float32"), numerics="order", targets=("cpu",),
             doc="sum(x, axis=1) -> x @ ones (x a float32 matrix)"),
        rule("column-sums-as-vecmat", reduce("reduce_sum", x, (0,)),
             reshape(matmul(transpose(broadcast(lit(1.0, "float32"), set_last(shape_of(x), 1), ()), (1, 0)), x,
                            "float32"), shape_of(reduce("reduce_sum", x, (0,)))),
             when("rank", x, 2), when("has_dtype", x, "float32"), numerics="order", targets=("cpu",),
             doc="sum(x, axis=0) -> ones @ x (x a float32 matrix)"),
    ],
    # Identities on a known domain: the sign analysis (egraph/analysis.py) proves x >= -0 (NaN allowed), the
    # integer analysis that every element is an integer (inf and NaN allowed), the range analysis that every
    # element is finite, at least the smallest normal number, or at most one.
    "domain": [
        rule("exp-of-log-of-nonneg", unary("exp", unary("log", x)), x, when("nonneg", x), numerics="rounding",
             doc="exp(log(x)) -> x where x >= 0 (log(0) = -inf and exp(-inf) = 0; inf and NaN stay)"),
        rule("square-of-sqrt-of-nonneg", integer_pow(unary("sqrt", x), 2), x, given("nonneg", x), numerics="rounding",
             doc="sqrt(x)**2 -> x where x >= 0"),
        rule("abs-of-nonneg", unary("abs", x), x, when("nonneg", x), numerics="rounding",
             doc="|x| -> x where x >= 0 (|-0| is +0: a zero's sign only)"),
        *(rule(f"{name.replace('_', '-')}-of-integral", unary(name, x), x, when("integral", x),
               doc=f"{name}(x) -> x where every element of x is an integer (or +-inf, NaN, -0: kept as they are)")
          for name in ("floor", "ceil", "round", "round_even")),
        rule("sub-self-of-finite", sub(x, x), broadcast(lit(0.0, dtype_of(x)), shape_of(x), ()),
             when("finite", x), when("float_dtype", dtype_of(x)),
             doc="x - x -> 0 where no element of x is NaN or inf (a finite x - x is +0)"),
        rule("div-self-of-finite-positive", div(x, x), broadcast(lit(1.0, dtype_of(x)), shape_of(x), ()),
             when("finite", x), when("positive", x), when("float_dtype", dtype_of(x)),
             doc="x / x -> 1 where every element of x is finite and at least the smallest normal number"),
        rule("min-one-of-at-most-one", binary("min", x, lit(1.0, d)), x, when("at_most_one", x),
             numerics="rounding", doc="min(x, 1) -> x where no element of x is above 1 (NaN stays NaN)"),
        rule("min-one-of-at-most-one-left", binary("min", lit(1.0, d), x), x, when("at_most_one", x),
             numerics="rounding", doc="min(1, x) -> x where no element of x is above 1 (NaN stays NaN)"),
        rule("relu-of-nonneg", binary("max", x, lit(0.0, d)), x, when("nonneg", x), numerics="rounding",
             doc="max(x, 0) -> x where x >= 0 (max(-0, 0) is +0: a zero's sign only; NaN stays NaN)"),
        rule("quotient-by-own-sqrt", div(x, unary("sqrt", x)), unary("sqrt", x), given("positive", x),
             given("finite", x), numerics="rounding",
             doc="x / sqrt(x) -> sqrt(x) where x is finite and at least the smallest normal number (0 / 0 and "
                 "inf / inf are NaN)"),
    ],
    # Identities that hold on a domain the analysis cannot prove: a search that speculates takes them behind a
    # run-time check of the condition on the operand each assumed it of (extract/guard.py); elsewhere the
    # original runs. Each saves a transcendental (log, exp, sqrt), which XLA's CPU code computes at several
    # times the cost of a multiply, and XLA's own simplifier leaves these alone.
    "speculative": [
        rule("sum-of-logs", add(log(x), log(y)), log(mul(x, y)), *_moderate_positive(x, y), numerics="rounding",
             doc="log(x) + log(y) -> log(x * y) where x, y are positive, finite and within the square roots of "
                 "the normal range (x * y neither overflows nor underflows)"),
        rule("difference-of-logs", sub(log(x), log(y)), log(div(x, y)), *_moderate_positive(x, y),
             numerics="rounding", doc="log(x) - log(y) -> log(x / y) where x, y are positive and moderate"),
        rule("product-of-exps", mul(exp(x), exp(y)), exp(add(x, y)), given("exp_moderate", x),
             given("exp_moderate", y), numerics="rounding",
             doc="exp(x) * exp(y) -> exp(x + y) where |x|, |y| <= half the log of the largest value, less 1 "
                 "(float32: 43), so neither side overflows or underflows"),
        rule("quotient-of-exps", div(exp(x), exp(y)), exp(sub(x, y)), given("exp_moderate", x),
             given("exp_moderate", y), numerics="rounding",
             doc="exp(x) / exp(y) -> exp(x - y) where |x|, |y| are exp-moderate"),
        rule("log-of-scaled-exp", log(mul(exp(x), y)), add(x, log(y)), given("exp_moderate", x),
             *_moderate_positive(y), numerics="rounding",
             doc="log(exp(x) * y) -> x + log(y) where x is exp-moderate and y positive and moderate"),
        rule("exp-of-shifted-log", exp(add(x, log(y))), mul(exp(x), y), given("exp_moderate", x),
             *_moderate_positive(y), numerics="rounding",
             doc="exp(x + log(y)) -> exp(x) * y where x is exp-moderate and y positive and moderate"),
        rule("exp-of-log-moderate", exp(log(x)), x, *_moderate_positive(x), numerics="rounding",
             doc="exp(log(x)) -> x where x is positive and moderate (near the range's ends exp(log(x)) "
                 "overflows or flushes to 0 where x does not: log's rounding, times 88, moves it)"),
        rule("exp-of-sum-of-logs", exp(add(log(x), log(y))), mul(x, y), *_moderate_positive(x, y),
             numerics="rounding", doc="exp(log(x) + log(y)) -> x * y where x, y are positive and moderate"),
        rule("exp-of-difference-of-logs", exp(sub(log(x), log(y))), div(x, y), *_moderate_positive(x, y),
             numerics="rounding", doc="exp(log(x) - log(y)) -> x / y where x, y are positive and moderate"),
        rule("product-of-sqrts", mul(unary("sqrt", x), unary("sqrt", y)), unary("sqrt", mul(x, y)),
             *_moderate_positive(x, y), numerics="rounding",
             doc="sqrt(x) * sqrt(y) -> sqrt(x * y) where x, y are positive and moderate"),
        rule("quotient-of-sqrts", div(unary("sqrt", x), unary("sqrt", y)), unary("sqrt", div(x, y)),
             *_moderate_positive(x, y), numerics="rounding",
             doc="sqrt(x) / sqrt(y) -> sqrt(x / y) where x, y are positive and moderate"),
    ],
    # Powers by a literal exponent as products of square roots, or as an exp of a log: XLA's CPU pow costs about
    # seven exps an element (extract/targets/cpu.toml, pow_flops). Equal up to rounding where x is positive: a
    # negative subnormal x, which XLA's comparisons and square roots read as -0, gives NaN in pow and 0 here.
    "powers": [
        rule("power-one-and-a-half", _pow(x, 1.5), mul(x, unary("sqrt", x)), given("positive", x),
             when("has_dtype", x, "float32"), numerics="rounding",
             doc="x ** 1.5 -> x * sqrt(x) where x is positive"),
        rule("power-two-and-a-half", _pow(x, 2.5), mul(mul(x, x), unary("sqrt", x)), given("positive", x),
             when("has_dtype", x, "float32"), numerics="rounding",
             doc="x ** 2.5 -> x * x * sqrt(x) where x is positive"),
        rule("quarter-power-as-roots", _pow(x, 0.25), unary("sqrt", unary("sqrt", x)), given("positive", x),
             when("has_dtype", x, "float32"), numerics="rounding",
             doc="x ** 0.25 -> sqrt(sqrt(x)) where x is positive (XLA's pow reads a subnormal x as it is, sqrt "
                 "flushes it to 0; pow costs several exps)"),
        rule("three-quarter-power-as-roots", _pow(x, 0.75), mul(unary("sqrt", x), unary("sqrt", unary("sqrt", x))),
             given("positive", x), when("has_dtype", x, "float32"), numerics="rounding",
             doc="x ** 0.75 -> sqrt(x) * sqrt(sqrt(x)) where x is positive"),
    ],
    "shape": [
        rule("reshape-of-reshape", reshape(reshape(x, s), t), reshape(x, t), doc="reshape(reshape(x)) -> reshape(x)"),
        rule("reshape-identity", reshape(x, s), x, when("shape_is", x, s), doc="reshape(x, shape(x)) -> x"),
        rule("broadcast-as-reshape", broadcast(x, s, p), reshape(x, s), when("same_numel", x, s),
             doc="a broadcast that only inserts unit dimensions is a reshape"),
        rule("reshape-through-unary", reshape(unary(op, x), s), unary(op, reshape(x, s)), two_way=True,
             doc="elementwise ops commute with reshapes"),
        rule("reshape-through-scalar-binary", reshape(binary(op, x, y), s), binary(op, reshape(x, s), y),
             when("scalar", y), two_way=True, doc="reshape(x op c) <-> reshape(x) op c, rank-0 c"),
        rule("reshape-through-scalar-binary-left", reshape(binary(op, y, x), s), binary(op, y, reshape(x, s)),
             when("scalar", y), two_way=True, doc="reshape(c op x) <-> c op reshape(x), rank-0 c"),
        rule("broadcast-of-broadcast", broadcast(broadcast(x, s, p), t, q), broadcast(x, t, compose(q, p)),
             doc="broadcast(broadcast(x)) -> one broadcast"),
        rule("binary-of-broadcasts", binary(op, broadcast(x, s, p), broadcast(y, s, p)),
             broadcast(binary(op, x, y), s, p), when("same_shape", x, y),
             doc="an elementwise op on two equal broadcasts = the op on their sources, broadcast once "
                 "(a per-channel constant stays per-channel)"),
    ],
    "reductions": [
        _by_rows("reduce_sum", "float32"), _by_rows("reduce_max"), _by_rows("reduce_min"),
        _by_rows("reduce_and", "bool"), _by_rows("reduce_or", "bool"),
        rule("reduce-of-row-reductions", reduce(op, reduce(op, x, q), p),
             reduce(op, reshape(reduce(op, x, q), set_last(shape_of(x), 1)), axes_of(x)),
             when("last_axis", q, x), when("all_axes", p, reduce(op, x, q)),
             numerics="rounding", doc="the full reduction of a tensor's row reductions = the full reduction of "
             "the rows kept as a size-1 axis, which a row kernel computes (a cross-entropy's per-example "
             "losses are summed as the kernel that computes them writes them)"),
        rule("reduce-over-unit-axes", reduce(op, x, p), reshape(x, shape_of(reduce(op, x, p))),
             when("unit_axes", p, x), numerics="rounding",   # a sum starts at +0: the sum of -0 is +0
             doc="a reduction whose reduced axes all have size one reduces nothing: a reshape (the sum of a "
                 "bias gradient's one row, say, is a view instead of a pass over it)"),
    ],
    "identity": [
        rule("mul-one", mul(x, one), x, doc="x*1 -> x"),
        rule("mul-one-left", mul(one, x), x, doc="1*x -> x"),
        rule("add-zero", add(x, zero), x, numerics="rounding", doc="x+0 -> x (-0 + 0 is +0: a zero's sign only)"),
        rule("add-zero-left", add(zero, x), x, numerics="rounding", doc="0+x -> x (0 + -0 is +0)"),
        rule("sub-zero", sub(x, zero), x, doc="x-0 -> x"),
        rule("div-one", div(x, one), x, doc="x/1 -> x"),
        rule("neg-neg", neg(neg(x)), x, doc="-(-x) -> x"),
        rule("abs-neg", unary("abs", neg(x)), unary("abs", x), doc="|-x| -> |x|"),
        rule("abs-abs", unary("abs", unary("abs", x)), unary("abs", x), doc="||x|| -> |x|"),
        rule("mul-neg-neg", mul(neg(x), neg(y)), mul(x, y), doc="(-x)*(-y) -> x*y"),
        rule("add-neg", add(x, neg(y)), sub(x, y), doc="x + (-y) -> x - y"),
        rule("sub-neg", sub(x, neg(y)), add(x, y), doc="x - (-y) -> x + y"),
        rule("max-self", binary("max", x, x), x, doc="max(x, x) -> x"),
        rule("min-self", binary("min", x, x), x, doc="min(x, x) -> x"),
        rule("select-same", select(y, x, x), x, doc="select(p, x, x) -> x"),
        rule("cummax-of-cummax", scan("cummax", scan("cummax", x, i, j), i, j), scan("cummax", x, i, j),
             doc="a running max of a running max along the same axis is the running max"),
        rule("cummin-of-cummin", scan("cummin", scan("cummin", x, i, j), i, j), scan("cummin", x, i, j),
             doc="a running min of a running min along the same axis is the running min"),
        rule("cumsum-of-neg", scan("cumsum", neg(x), i, j), neg(scan("cumsum", x, i, j)), two_way=True,
             numerics="rounding", doc="cumsum(-x) <-> -cumsum(x): negation commutes with every rounded sum, but "
                                      "-0 + 0 is +0, so a zero's sign may differ"),
        rule("integer-pow-one", integer_pow(x, 1), x, doc="x**1 -> x"),
        rule("integer-pow-two", integer_pow(x, 2), mul(x, x), two_way=True, doc="x**2 <-> x*x"),
    ],
    "exp-log": [
        rule("exp-zero", exp(zero), one, doc="exp(0) -> 1"),
        rule("log-one", log(one), zero, doc="log(1) -> 0"),
        rule("div-sqrt-as-rsqrt", div(x, unary("sqrt", y)), mul(x, unary("rsqrt", y)), two_way=True,
             numerics="rounding", doc="x / sqrt(y) <-> x * rsqrt(y) (rsqrt of the smallest subnormal is "
             "finite; y = +-0, inf and negative y give the same inf, 0 and NaN)"),
        rule("recip-sqrt", div(one, unary("sqrt", x)), unary("rsqrt", x), numerics="rounding",
             doc="1/sqrt(x) -> rsqrt(x)"),
        rule("reduce-sum-scale", reduce("reduce_sum", mul(x, lit(c1, d)), p), mul(reduce("reduce_sum", x, p), lit(c1, d)),
             two_way=True, numerics="reals", doc="sum(x*c) <-> sum(x)*c, scalar c"),
    ],
    "constants": [
        _fold("add", "+", "fadd"), _fold("sub", "-", "fsub"), _fold("mul", "*", "fmul"),
        _fold("div", "/", "fdiv", when("nonzero", c2)), _fold("max", "max", "fmax"), _fold("min", "min", "fmin"),
    ],
    "batch-norm": [
        rule("bn-scale-into-weights", mul(conv(x, y, k), broadcast(z, s, p)),
             conv(x, mul(y, broadcast(z, shape_of(y), p)), k),
             when("conv_channels_last", k), when("last_axis", p, y), numerics="reals",
             doc="a per-channel scale after a convolution scales its weights instead (constant weights: "
                 "folded once when the program is built)"),
        rule("bn-shift-before-scale", mul(sub(conv(x, y, k), z), w),
             sub(mul(conv(x, y, k), w), mul(z, w)), numerics="reals",
             doc="(conv - mean) * scale = conv * scale - mean * scale, so the scale can reach the weights"),
    ],
})
