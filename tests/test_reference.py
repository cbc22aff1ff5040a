"""The numpy reference evaluator agrees with the JAX lowering, op by op, on captured programs."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from superopt.egraph.capture import capture
from superopt.core.ir import Graph, Node
from superopt.lowering.jax import lower
from superopt.core import ops
from superopt.core.reference import evaluate, evaluate_node

rng = np.random.default_rng(0)
BF16 = ml_dtypes.bfloat16
TOL = {"float16": (2e-3, 1e-3), "bfloat16": (2e-2, 1e-2), "complex64": (1e-5, 1e-6)}


def rand(shape=(3, 4), dtype=np.float32, lo=-3.0, hi=3.0):
    x = rng.uniform(lo, hi, shape)
    x.flat[0] = 0.0 if lo <= 0 <= hi else x.flat[0]  # always a zero where the domain has one
    return x.astype(dtype)


def ints(shape=(3, 4), lo=-9, hi=10, dtype=np.int32):
    x = rng.integers(lo, hi, shape).astype(dtype)
    x.flat[0] = 0
    return x


def bools(shape=(3, 4)):
    return rng.random(shape) < 0.5


def assert_agree(ref, got):
    got = np.asarray(got)
    assert ref.dtype == got.dtype and ref.shape == got.shape, (ref.dtype, ref.shape, got.dtype, got.shape)
    if ref.dtype.kind in "biu":
        np.testing.assert_array_equal(ref, got)
        return
    rtol, atol = TOL.get(str(ref.dtype), (1e-5, 1e-6))
    wide = np.complex128 if ref.dtype.kind == "c" else np.float64
    np.testing.assert_allclose(ref.astype(wide), got.astype(wide), rtol=rtol, atol=atol, equal_nan=True)


def check(fn, *args, op=None):
    """Capture fn, evaluate with the reference and with the lowering; `op` must have been modelled."""
    graph = capture(fn, args).graph
    if op is not None:
        assert op in graph.op_counts(), graph.op_counts()
    flat = jax.tree_util.tree_leaves(args)
    for ref, got in zip(evaluate(graph, flat), lower(graph)(*flat), strict=True):
        assert_agree(ref, got)
    return graph


def check_one_node(op, x, out_dtype=None):
    """A hand-built one-node graph (conj is kept opaque by capture; both roundings are checked here too)."""
    g = Graph(n_args=1)
    a = g.add(Node("arg", (), (0,), x.shape, str(x.dtype)))
    g.outputs = [g.add(Node(op, (a,), (), x.shape, out_dtype or str(x.dtype)))]
    assert_agree(evaluate(g, [x])[0], lower(g)(x)[0])


# ---- elementwise ----

DOMAIN = {"any": lambda: rand(), "pos": lambda: rand(lo=0.1, hi=5.0), "unit": lambda: rand(lo=-0.9, hi=0.9),
          "ge1": lambda: rand(lo=1.0, hi=5.0), "int": lambda: ints(), "bool": lambda: bools(),
          "complex": lambda: (rand() + 1j * rand()).astype(np.complex64)}
UNARY = {
    "neg": (lambda x: -x, "any"), "abs": (jnp.abs, "any"), "sign": (jnp.sign, "any"), "floor": (jnp.floor, "any"),
    "ceil": (jnp.ceil, "any"), "exp": (jnp.exp, "any"), "exp2": (jnp.exp2, "any"), "log": (jnp.log, "pos"),
    "log1p": (jnp.log1p, "pos"), "expm1": (jnp.expm1, "any"), "tanh": (jnp.tanh, "any"),
    "logistic": (jax.nn.sigmoid, "any"), "sqrt": (jnp.sqrt, "pos"), "rsqrt": (lax.rsqrt, "pos"),
    "cbrt": (jnp.cbrt, "any"), "erf": (lax.erf, "any"), "erfc": (lax.erfc, "any"), "erf_inv": (lax.erf_inv, "unit"),
    "sin": (jnp.sin, "any"), "cos": (jnp.cos, "any"), "tan": (jnp.tan, "unit"), "asin": (jnp.arcsin, "unit"),
    "acos": (jnp.arccos, "unit"), "atan": (jnp.arctan, "any"), "sinh": (jnp.sinh, "any"),
    "cosh": (jnp.cosh, "any"), "asinh": (jnp.arcsinh, "any"), "acosh": (jnp.arccosh, "ge1"),
    "atanh": (jnp.arctanh, "unit"), "not": (jnp.logical_not, "bool"), "is_finite": (jnp.isfinite, "any"),
    "square": (jnp.square, "any"), "stop_gradient": (lax.stop_gradient, "any"), "real": (jnp.real, "complex"),
    "imag": (jnp.imag, "complex"),
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op):
    fn, domain = UNARY[op]
    check(fn, DOMAIN[domain](), op=op)


def test_bitwise_not_on_ints_and_hand_built_ops():
    check(lax.bitwise_not, ints(), op="not")
    check_one_node("round", np.array([0.5, -0.5, 1.5, 2.5, -2.5, 0.49999997, -3.7, 0.0], np.float32))
    check_one_node("round_even", np.array([0.5, -0.5, 1.5, 2.5, -2.5, 0.49999997, -3.7, 0.0], np.float32))
    check_one_node("conj", (rand() + 1j * rand()).astype(np.complex64))


x_, y_ = rand(), rand()
y_[1] = x_[1]  # some equal pairs, so the comparisons see ties
BINARY = {
    "add": (jnp.add, x_, y_), "sub": (jnp.subtract, x_, y_), "mul": (jnp.multiply, x_, y_),
    "div": (jnp.divide, x_, y_), "rem": (lax.rem, x_, y_), "pow": (lax.pow, np.abs(x_), y_),
    "max": (jnp.maximum, x_, y_), "min": (jnp.minimum, x_, y_), "atan2": (jnp.arctan2, x_, y_),
    "nextafter": (jnp.nextafter, x_, y_), "eq": (jnp.equal, x_, y_), "ne": (jnp.not_equal, x_, y_),
    "lt": (jnp.less, x_, y_), "le": (jnp.less_equal, x_, y_), "gt": (jnp.greater, x_, y_),
    "ge": (jnp.greater_equal, x_, y_), "and": (jnp.logical_and, bools(), bools()),
    "or": (jnp.logical_or, bools(), bools()), "xor": (jnp.logical_xor, bools(), bools()),
}
i_, j_ = ints(), ints()
j_[j_ == 0] = 3
INT_BINARY = {
    "add": (jnp.add, i_, j_), "sub": (jnp.subtract, i_, j_), "mul": (jnp.multiply, i_, j_),
    "div": (lax.div, i_, j_), "rem": (lax.rem, i_, j_), "max": (jnp.maximum, i_, j_), "min": (jnp.minimum, i_, j_),
    "and": (jnp.bitwise_and, i_, j_), "or": (jnp.bitwise_or, i_, j_), "xor": (jnp.bitwise_xor, i_, j_),
    "lt": (jnp.less, i_, j_),
    "shift_left": (lax.shift_left, i_, ints(lo=-2, hi=35)),
    "shift_right_logical": (lax.shift_right_logical, i_, ints(lo=-2, hi=35)),
    "shift_right_arithmetic": (lax.shift_right_arithmetic, i_, ints(lo=-2, hi=35)),
}


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary(op):
    fn, x, y = BINARY[op]
    check(fn, x, y, op=op)
    check(lambda a: fn(a, a[0, 2] if a.dtype == bool else a.dtype.type(0.75)), x, op=op)  # a rank-0 operand


@pytest.mark.parametrize("op", sorted(INT_BINARY))
def test_int_binary(op):
    fn, x, y = INT_BINARY[op]
    check(fn, x, y, op=op)


def test_int_division_edges():
    mn = np.iinfo(np.int32).min
    x = np.array([7, -7, 7, -7, mn, mn, 5, -5, 0], np.int32)
    y = np.array([2, 2, -2, -2, -1, 3, 0, 0, 0], np.int32)
    check(lax.div, x, y, op="div")
    check(lax.rem, x, y, op="rem")
    check(lax.div, x.astype(np.uint32) % 50, np.abs(y).astype(np.uint32), op="div")
    check(lambda a: lax.pow(a, jnp.array([2, -1, 0, 3, 1, -2, 2, 3, 1], jnp.int32)), x.astype(np.float32), op="pow")


SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -3.0, 80.0], np.float32)


@pytest.mark.parametrize("op", sorted(op for op, (_, d) in UNARY.items() if d not in ("bool", "complex")))
def test_unary_nan_inf(op):
    check(UNARY[op][0], SPECIAL, op=op)


@pytest.mark.parametrize("op", sorted(op for op, (_, x, _) in BINARY.items() if x.dtype != bool))
def test_binary_nan_inf(op):
    a, b = np.meshgrid(SPECIAL, SPECIAL)
    check(BINARY[op][0], a, b, op=op)


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_low_precision(dtype):
    x, y = rand(dtype=dtype), rand(dtype=dtype)
    for fn in (jnp.add, jnp.multiply, jnp.divide, jnp.maximum, jnp.nextafter):
        check(fn, x, y)
    for fn in (jnp.exp, jnp.tanh, jax.nn.sigmoid, lambda a: a ** 3, lambda a: a.sum(axis=1),
               lambda a: a.astype(jnp.float32), lambda a: (a > 0).astype(a.dtype), lambda a: a @ a.T):
        check(fn, x)
    check(lambda a: a.astype(dtype), rand())


# ---- select, powers, contractions ----

def test_select_and_integer_pow():
    check(lambda a, b: jnp.where(a > 0, a, b), x_, y_, op="select")
    check(lambda p, a, b: lax.select(p, a, b), np.bool_(True), x_, y_, op="select")  # a rank-0 pred
    for y in (3, -2, 0, 1, 6):
        check(lambda a: lax.integer_pow(a, y), x_ + 0.5, op="integer_pow")
    check(lambda a: a ** 3, ints(), op="integer_pow")


def test_matmul():
    check(jnp.matmul, rand((3, 4)), rand((4, 5)), op="matmul")
    check(jnp.matmul, rand((2, 3, 4)), rand((2, 4, 5)), op="matmul")
    check(jnp.matmul, rand((2, 3, 4)), rand((4, 5)), op="matmul")
    check(jnp.matmul, ints((3, 4)), ints((4, 2)), op="matmul")
    dims = (((1,), (0,)), ((), ()))
    check(lambda a, b: lax.dot_general(a, b, dims, preferred_element_type=jnp.float32),
          rand((3, 8), BF16), rand((8, 5), BF16), op="matmul")


def conv(**kw):
    return lambda a, b: lax.conv_general_dilated(a, b, **kw)


def test_conv():
    check(conv(window_strides=(2, 2), padding="SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")),
          rand((1, 7, 7, 3)), rand((3, 3, 3, 4)), op="conv")
    check(conv(window_strides=(1, 1), padding="VALID", rhs_dilation=(2, 2), dimension_numbers=("NCHW", "OIHW", "NCHW")),
          rand((2, 3, 8, 8)), rand((4, 3, 3, 3)), op="conv")
    check(conv(window_strides=(1, 2), padding=((1, 0), (2, 1)), lhs_dilation=(2, 1), feature_group_count=2,
               dimension_numbers=("NCHW", "OIHW", "NHWC")),
          rand((1, 4, 5, 6)), rand((6, 2, 3, 3)), op="conv")
    check(conv(window_strides=(1,), padding=((-1, 2),), dimension_numbers=("NWC", "WIO", "NCW")),
          rand((2, 9, 3)), rand((3, 3, 2)), op="conv")


def test_conv_batch_groups_are_refused():
    graph = capture(conv(window_strides=(1,), padding="VALID", batch_group_count=2), (rand((4, 2, 5)), rand((4, 2, 3))))
    with pytest.raises(NotImplementedError, match="batch_group_count"):
        evaluate(graph.graph, [rand((4, 2, 5)), rand((4, 2, 3))])


# ---- reductions and structure ----

REDUCE = {
    "reduce_sum": (lambda a: a.sum(axis=(0, 2)), rand((2, 3, 4))), "reduce_max": (lambda a: a.max(axis=1), x_),
    "reduce_min": (lambda a: a.min(), x_), "reduce_prod": (lambda a: a.prod(axis=0), x_),
    "reduce_and": (lambda a: a.all(axis=1), bools()), "reduce_or": (lambda a: a.any(axis=0), bools()),
    "argmax": (lambda a: jnp.argmax(a, axis=1), np.round(x_)), "argmin": (lambda a: jnp.argmin(a, axis=0), np.round(x_)),
}


@pytest.mark.parametrize("op", sorted(REDUCE))
def test_reductions(op):
    fn, x = REDUCE[op]
    check(fn, x, op=op)


def test_int_and_special_reductions():
    check(lambda a: lax.reduce_and(a, (1,)), ints(), op="reduce_and")
    check(lambda a: lax.reduce_or(a, (0,)), ints(), op="reduce_or")
    check(lambda a: (a.sum(axis=0), a.max(axis=1), a.prod()), ints(lo=-3, hi=4))
    special = np.stack([SPECIAL, SPECIAL[::-1]])
    check(lambda a: (a.max(axis=1), a.min(axis=1), a.sum(axis=1), jnp.argmax(a, axis=1), jnp.argmin(a, axis=1)), special)


STRUCTURE = {
    "transpose": (lambda a: jnp.transpose(a, (2, 0, 1)), rand((2, 3, 4))),
    "reshape": (lambda a: a.reshape(4, 6), rand((2, 3, 4))),
    "broadcast": (lambda a: jnp.broadcast_to(a[:, None, :], (3, 5, 4)), x_),
    "concat": (lambda a: jnp.concatenate([a, -a, a * 2], axis=1), x_),
    "slice": (lambda a: lax.slice(a, (1, 0, 1), (6, 4, 7), (2, 3, 2)), rand((7, 5, 8))),
    "pad": (lambda a: lax.pad(a, jnp.float32(9), ((-1, 2, 1), (2, -3, 0))), x_),
    "iota": (lambda a: a + lax.broadcasted_iota(jnp.int32, (3, 4), 1) * lax.broadcasted_iota(jnp.int32, (3, 4), 0), ints()),
}


@pytest.mark.parametrize("op", sorted(STRUCTURE))
def test_structure(op):
    fn, x = STRUCTURE[op]
    check(fn, x, op=op)


def test_more_structure():
    check(lambda s: lax.broadcast_in_dim(s, (2, 3), ()), np.float32(2.5), op="broadcast")
    check(lambda a: lax.pad(a, jnp.float32(0), ((0, 0, 2), (-2, -1, 3))), x_, op="pad")
    check(lambda a: a + lax.iota(jnp.float32, 4), x_, op="iota")


CONVERT = {
    "f32->f16": (jnp.float16, rand() * 1000), "f32->i32": (jnp.int32, rand() * 100),
    "bool->f32": (jnp.float32, bools()), "f32->bf16": (BF16, rand()), "i32->bool": (jnp.bool_, ints()),
    "f32->u8": (jnp.uint8, np.array([-1.0, 0.0, 3.7, 255.5, 300.0, np.nan], np.float32)),
    "f32->i32 saturates": (jnp.int32, np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, -2.7], np.float32)),
    "i32->f32": (jnp.float32, ints()), "f16->bf16": (BF16, rand(dtype=np.float16)),
}


@pytest.mark.parametrize("case", sorted(CONVERT))
def test_convert(case):
    dtype, x = CONVERT[case]
    check(lambda a: lax.convert_element_type(a, dtype), x, op="convert")


# ---- leaves, opaque, coverage ----

def test_opaque_and_consts():
    graph = check(lambda a: jnp.sort(a, axis=1) * 2 + jnp.arange(4.0), x_)
    assert "opaque" in graph.op_counts()
    check(lambda k, v: lax.sort_key_val(k, v), x_, y_)  # one opaque equation, two outputs
    check(lambda a: a @ np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5), x_, op="const")


def test_unknown_op_is_named():
    with pytest.raises(NotImplementedError, match="unknown op 'frobnicate'"):
        evaluate_node("frobnicate", (), [x_], x_.shape, "float32")


def test_scipy_free_fallbacks():
    y = np.array([-0.999, -0.5, -1e-6, 0.0, 1e-9, 0.3, 0.9999, 1.0, -1.0, 1.5, np.nan], np.float32)
    erf_inv = ops._by_element(ops._erf_inv_scalar)(y)
    want = np.asarray(jax.scipy.special.erfinv(y), np.float64)
    np.testing.assert_allclose(erf_inv, want, rtol=1e-5, equal_nan=True)
    x = rand().astype(np.float64)
    np.testing.assert_allclose(ops._by_element(ops.math.erf)(x), jax.scipy.special.erf(x), rtol=1e-5)
