"""The term language in egglog: `Tensor` constructors mirroring lax primitives, and analyses.

Leaves are inputs and constants by id (never by value); scalar literals carry their value so rules can
fold them. Attributes that decide meaning (permutations, target shapes, dtypes) are constructor
arguments, so different choices are different e-nodes. `shape` and `dtype` are functions without merge:
two derivations that disagree raise instead of producing a wrong program.
"""
from __future__ import annotations

from egglog import Expr, String, StringLike, Vec, f64Like, function, i64, i64Like, relation


class Tensor(Expr):
    """A tensor-valued term (an e-class of equivalent programs)."""


class TList(Expr):
    """A cons list of tensors, for ops of any arity (concat, opaque primitives)."""


@function(egg_fn="tnil")
def tnil() -> TList: ...
@function(egg_fn="tcons")
def tcons(head: Tensor, tail: TList) -> TList: ...


# ---- leaves ----
@function(egg_fn="arg")
def arg(index: i64Like) -> Tensor: ...
@function(egg_fn="const")
def const(index: i64Like) -> Tensor: ...
@function(egg_fn="lit")
def lit(value: f64Like, dtype: StringLike) -> Tensor: ...
@function(egg_fn="iota")
def iota(dimension: i64Like, shape: Vec[i64], dtype: StringLike) -> Tensor: ...


# ---- elementwise ----
@function(egg_fn="unary")
def unary(op: StringLike, x: Tensor) -> Tensor: ...
@function(egg_fn="binary")
def binary(op: StringLike, x: Tensor, y: Tensor) -> Tensor: ...
@function(egg_fn="integer_pow")
def integer_pow(x: Tensor, y: i64Like) -> Tensor: ...
@function(egg_fn="select")
def select(pred: Tensor, on_false: Tensor, on_true: Tensor) -> Tensor: ...
@function(egg_fn="convert")
def convert(x: Tensor, dtype: StringLike) -> Tensor: ...


# ---- contractions and reductions ----
@function(egg_fn="matmul")
def matmul(a: Tensor, b: Tensor, dtype: StringLike) -> Tensor:
    """numpy matmul: equal leading batch dims, or a rank-2 rhs; result in `dtype`."""
@function(egg_fn="conv")
def conv(lhs: Tensor, rhs: Tensor, params: i64Like) -> Tensor:
    """conv_general_dilated; `params` is an id into the encoding's table of conv params."""
@function(egg_fn="reduce")
def reduce(op: StringLike, x: Tensor, axes: Vec[i64]) -> Tensor: ...
@function(egg_fn="pool")
def pool(op: StringLike, x: Tensor, window: Vec[i64], strides: Vec[i64], low: Vec[i64], high: Vec[i64]) -> Tensor:
    """A window reduction (reduce_window_max / _min / _sum) without dilation."""
@function(egg_fn="argreduce")
def argreduce(op: StringLike, x: Tensor, axis: i64Like, dtype: StringLike) -> Tensor: ...
@function(egg_fn="scan")
def scan(op: StringLike, x: Tensor, axis: i64Like, reverse: i64Like) -> Tensor:
    """A cumulative op (cumsum, cumprod, cummax, cummin) along `axis`, from the end when `reverse` is 1."""


# ---- data movement ----
@function(egg_fn="transpose")
def transpose(x: Tensor, perm: Vec[i64]) -> Tensor: ...
@function(egg_fn="reshape")
def reshape(x: Tensor, shape: Vec[i64]) -> Tensor: ...
@function(egg_fn="broadcast")
def broadcast(x: Tensor, shape: Vec[i64], dims: Vec[i64]) -> Tensor: ...
@function(egg_fn="concat")
def concat(xs: TList, dimension: i64Like) -> Tensor: ...
@function(egg_fn="slice")
def slice_(x: Tensor, start: Vec[i64], limit: Vec[i64], strides: Vec[i64]) -> Tensor: ...
@function(egg_fn="pad")
def pad(x: Tensor, value: Tensor, low: Vec[i64], high: Vec[i64], interior: Vec[i64]) -> Tensor: ...
@function(egg_fn="pack")
def pack(x: Tensor, format: StringLike) -> Tensor:
    """`x` in a packed layout (superopt/core/formats.py: NZ, ZZ, ZN, NC1HWC0, VNNI, B32; ND is the identity),
    zero-padded to whole blocks."""
@function(egg_fn="unpack")
def unpack(x: Tensor, format: StringLike, shape: Vec[i64]) -> Tensor:
    """The `shape` tensor that packed tensor `x` holds in `format` (its padding dropped)."""
@function(egg_fn="fractal_matmul")
def fractal_matmul(a: Tensor, b: Tensor, dtype: StringLike) -> Tensor:
    """The cube's contraction on 16x16 fractals: ZZ-packed a [..., M1, K1, 16, 16] times ZN-packed b
    [K1, N1, 16, 16] (or with a's batch) -> NZ-packed [..., N1, M1, 16, 16], accumulated in `dtype`."""
@function(egg_fn="opaque")
def opaque(index: i64Like, output: i64Like, args: TList) -> Tensor:
    """A primitive superopt does not model, by id into the encoding's table; lowered by binding it."""


# ---- kernels: one launch each, with a per-element body in the Scalar language ----
class Scalar(Expr):
    """The value a kernel body computes, over a shape fixed by its leaves: a tensor that lives in
    registers or on-chip buffers instead of global memory. Operands of one op always have equal shapes;
    broadcasting happens only at `sarg` and `sbcast`."""


@function(egg_fn="kernel")
def kernel(body: Scalar) -> Tensor:
    """One kernel launch computing `body`; everything outside a body lives in global memory."""
@function(egg_fn="sarg")
def sarg(x: Tensor, shape: Vec[i64]) -> Scalar:
    """Load `x` from global memory, broadcast (rank 0, or size-1 axes) to `shape`."""
@function(egg_fn="sunary")
def sunary(op: StringLike, x: Scalar) -> Scalar: ...
@function(egg_fn="sbinary")
def sbinary(op: StringLike, x: Scalar, y: Scalar) -> Scalar: ...
@function(egg_fn="sselect")
def sselect(pred: Scalar, on_false: Scalar, on_true: Scalar) -> Scalar: ...
@function(egg_fn="sconvert")
def sconvert(x: Scalar, dtype: StringLike) -> Scalar: ...
@function(egg_fn="spow")
def spow(x: Scalar, y: i64Like) -> Scalar: ...
@function(egg_fn="sbcast")
def sbcast(x: Scalar, shape: Vec[i64]) -> Scalar:
    """A value computed in the kernel (rank 0, or size-1 axes) broadcast to `shape`."""
@function(egg_fn="srow")
def srow(op: StringLike, x: Scalar) -> Scalar:
    """Reduce over the last axis, keeping it with size 1: a row reduction done on chip."""
@function(egg_fn="sperm")
def sperm(x: Scalar, perm: Vec[i64]) -> Scalar:
    """The body value with its axes permuted (a transposed access inside the kernel)."""
@function(egg_fn="smm")
def smm(a: Tensor, b: Tensor, dtype: StringLike) -> Scalar:
    """matmul(a, b) computed inside the kernel (its operands streamed in tiles), accumulated in `dtype`."""
@function(egg_fn="sconv")
def sconv(lhs: Tensor, rhs: Tensor, params: i64Like) -> Scalar:
    """conv(lhs, rhs, params) computed inside the kernel."""
@function(egg_fn="schain")
def schain(a: Scalar, b: Tensor, dtype: StringLike) -> Scalar:
    """matmul(a, b) whose left operand `a` is computed in the same kernel: with `smm` as `a`, a GEMM chain
    (C = A@B, E = C@D) whose intermediate never leaves the chip; with a softmax between, attention."""
@function(egg_fn="sconvchain")
def sconvchain(a: Scalar, rhs: Tensor, params: i64Like) -> Scalar:
    """conv(a, rhs, params) whose input `a` is computed in the same kernel: with `sconv` as `a`, a
    convolution chain whose intermediate never leaves the chip."""


# ---- analyses: no merge, so a disagreement is an error ----
@function(egg_fn="shape")
def shape(x: Tensor) -> Vec[i64]: ...
@function(egg_fn="dtype")
def dtype(x: Tensor) -> String: ...
# Extent of a concatenation along an axis, and the demand that asks for it.
@function(egg_fn="concat_extent")
def concat_extent(xs: TList, dimension: i64Like) -> i64: ...
concat_demand = relation("concat_demand", TList, i64, egg_fn="concat_demand")
# The program's k-th output is this e-class (rows are canonicalized as classes merge).
output = relation("output", i64, Tensor, egg_fn="output")
# Speculation (extract/guard.py, domain conditions): node i of the captured program is in this e-class (written
# only for a search that may assume a rule's domain condition); a rule assumed the condition on node i's value.
origin = relation("origin", Tensor, i64, egg_fn="origin")
assumed = relation("assumed", String, i64, egg_fn="assumed")
# Ops whose result dtype is bool whatever the operand dtype.
bool_result_op = relation("bool_result_op", String, egg_fn="bool_result_op")
float_dtype = relation("float_dtype", String, egg_fn="float_dtype")
same_dtype_op = relation("same_dtype_op", String, egg_fn="same_dtype_op")
# Ops whose result has the real dtype of their operand's: abs, real, imag (complex64 -> float32, float32 -> float32).
real_result_op = relation("real_result_op", String, egg_fn="real_result_op")
real_dtype = relation("real_dtype", String, String, egg_fn="real_dtype")   # a dtype, and that of its real part
# Sign analysis (egraph/analysis.py): no element of the tensor is below -0 (each is +-0, positive, +inf or NaN).
nonneg = relation("nonneg", Tensor, egg_fn="nonneg")
nonneg_op = relation("nonneg_op", String, egg_fn="nonneg_op")            # gives such elements from any input
keeps_nonneg_op = relation("keeps_nonneg_op", String, egg_fn="keeps_nonneg_op")  # from such an input
pair_nonneg_op = relation("pair_nonneg_op", String, egg_fn="pair_nonneg_op")     # from two such operands
# Integer analysis (egraph/analysis.py): every element of the tensor is an integer, +-inf or NaN.
integral = relation("integral", Tensor, egg_fn="integral")
integral_op = relation("integral_op", String, egg_fn="integral_op")            # gives such elements from any input
keeps_integral_op = relation("keeps_integral_op", String, egg_fn="keeps_integral_op")  # from such an input
pair_integral_op = relation("pair_integral_op", String, egg_fn="pair_integral_op")     # from two such operands
integer_dtype = relation("integer_dtype", String, egg_fn="integer_dtype")       # bool and the integer dtypes
# Range analysis (egraph/analysis.py): every element is finite (no NaN, no +-inf); every element is at least
# its dtype's smallest normal number (+inf and NaN allowed); every element is at most one (-inf, NaN allowed).
finite = relation("finite", Tensor, egg_fn="finite")
positive = relation("positive", Tensor, egg_fn="positive")
at_most_one = relation("at_most_one", Tensor, egg_fn="at_most_one")
# Facts the range analysis derives on the way to those: every element is at most +0 (-inf and NaN allowed);
# every element is at least one (+inf and NaN allowed); m is the largest element of x along the axes p, which
# are none of them empty (NaN where one is), ...; reducing the axes p of a tensor keeps the axes dims, in order.
nonpos = relation("nonpos", Tensor, egg_fn="nonpos")
at_least_one = relation("at_least_one", Tensor, egg_fn="at_least_one")
row_max = relation("row_max", Tensor, Tensor, Vec[i64], egg_fn="row_max")
# ... and y is such an m broadcast back against x, so that y - x subtracts from each element its own maximum
peak = relation("peak", Tensor, Tensor, Vec[i64], egg_fn="peak")
# along the axes p, each row of e (whose elements are >= -0) has an element at least one (or NaN)
tops_one = relation("tops_one", Tensor, Vec[i64], egg_fn="tops_one")
# y, broadcast back against x (whose elements are >= -0), is at least each element of x along the axes p
row_sum = relation("row_sum", Tensor, Tensor, Vec[i64], egg_fn="row_sum")
# every element of z is one of x (a view); z is x where x is not NaN, and NaN elsewhere
view_of = relation("view_of", Tensor, Tensor, egg_fn="view_of")
nan_guarded = relation("nan_guarded", Tensor, Tensor, egg_fn="nan_guarded")
# converting from the first float dtype to the second is exact
widening = relation("widening", String, String, egg_fn="widening")
kept_axes = relation("kept_axes", Vec[i64], Vec[i64], egg_fn="kept_axes")
keeps_finite_op = relation("keeps_finite_op", String, egg_fn="keeps_finite_op")   # finite from a finite input
at_most_one_op = relation("at_most_one_op", String, egg_fn="at_most_one_op")      # at most one from any input
# Conv params (an id into the encoding's table) whose output features and kernel output features are
# both the last axis (NHWC / HWIO): a per-channel vector broadcast on the last axis scales both alike.
conv_channels_last = relation("conv_channels_last", i64, egg_fn="conv_channels_last")


# The conv params (an id) that are these ones accumulating in int32 (preferred_element_type int32); set
# by the encoder for each conv of its table that does not already say int32 (quantization's int8 conv).
@function(egg_fn="conv_int32")
def conv_int32(params: i64Like) -> i64: ...


# ---- helpers for writing rules readably ----
def ints(values) -> Vec[i64]:
    return Vec[i64](*(i64(int(v)) for v in values)) if len(values) else Vec[i64].empty()


def tlist(items) -> TList:
    out = tnil()
    for item in reversed(list(items)):
        out = tcons(item, out)
    return out


def exp(x: Tensor) -> Tensor: return unary("exp", x)
def log(x: Tensor) -> Tensor: return unary("log", x)
def neg(x: Tensor) -> Tensor: return unary("neg", x)
def add(x: Tensor, y: Tensor) -> Tensor: return binary("add", x, y)
def sub(x: Tensor, y: Tensor) -> Tensor: return binary("sub", x, y)
def mul(x: Tensor, y: Tensor) -> Tensor: return binary("mul", x, y)
def div(x: Tensor, y: Tensor) -> Tensor: return binary("div", x, y)
