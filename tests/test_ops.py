"""The op table (superopt/core/ops.py): every op has what every layer and backend needs, and the layers
read it instead of keeping their own copies."""
import numpy as np
import pytest

from superopt.core import ops
from superopt.core.ir import Graph, Node
from superopt.core.ops import OPS
from superopt.core.reference import evaluate_node
from superopt.egraph.capture import _HANDLERS
from superopt.extract import cost
from superopt.extract.target import load_target
from superopt.lowering import jax as jax_lowering
from superopt.lowering.npu import emulator, vector
from superopt.lowering.pallas import program as pallas_program
from superopt.rewrites import checker

FAMILIES = {"unary", "binary", "reduce", "argreduce", "pool", "scan", "structural"}


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_has_an_entry_for_every_layer(name):
    op = OPS[name]
    assert op.family in FAMILIES
    assert op.flags <= ops.FLAGS, op.flags - ops.FLAGS
    assert op.npu in ops.NPU_PLACES and op.pallas in ops.PALLAS_PLACES
    assert op.flops is not None, "the cost models need its arithmetic"
    if op.has("graph"):                 # the graph walks evaluate it; no backend table may claim it
        assert op.numpy is None and op.jax is None and op.npu == "graph" and op.pallas == "graph"
        return
    assert op.numpy is not None, "the reference evaluator and the NPU emulator need its semantics"
    assert jax_lowering._LOWER[name] is op.jax, "the JAX lowering (and Pallas between kernels) need it"
    if op.named_call is not None:     # captured from JAX's composite of that name, not from a primitive
        assert op.capture is None and not op.captures
    elif op.family != "structural" and name != "round_even":   # round's hook captures round_even
        assert op.capture is not None and op.captures, "a family op is captured by its table hook"
    for primitive in op.captures:
        assert primitive in _HANDLERS
    if op.npu == "vector":
        assert name in vector.VECTOR_OPS
    if op.pallas == "body":
        assert name in pallas_program.BODY_OPS | pallas_program.VIEWS


def test_op_sets_are_derived_from_the_table():
    assert emulator.TRANSCENDENTAL is ops.TRANSCENDENTAL   # the emulator and the cost model agree
    assert emulator.ELEMENTWISE is ops.ELEMENTWISE
    assert cost.MATRIX_OPS is ops.MATRIX_OPS and cost.FREE is ops.FREE
    assert ops.UNARY_OPS | ops.BINARY_OPS <= ops.ELEMENTWISE
    assert "erf" in ops.TRANSCENDENTAL and "add" not in ops.TRANSCENDENTAL


def test_the_analyses_facts_are_read_from_the_table():
    from superopt.egraph import analysis
    assert analysis.NONNEG_OPS == ops.knowing("nonneg", "unary") and "exp" in analysis.NONNEG_OPS
    assert analysis.PAIR_NONNEG_OPS == ("add", "mul")
    assert "reduce_max" not in analysis.SIGN_REDUCTIONS   # its empty reduction is -inf
    assert analysis.INTEGRAL_REDUCTIONS == ops.knowing("keeps_integral", "reduce")
    assert set(ops.knowing("continuous")) <= checker.CONTINUOUS and "floor" not in checker.CONTINUOUS
    assert all(op.facts <= ops.FACTS for op in OPS.values())


_REDUCE_DTYPES = ("bool", "int8", "uint8", "int32", "float32", "bfloat16")
# what lax takes: no bitwise reduction of floats, no sum or product of bools, no window reduction of bools
_REDUCED = [(name, dtype) for name in sorted(ops.REDUCTIONS | ops.WINDOW_REDUCTIONS) for dtype in _REDUCE_DTYPES
            if not (name in ("reduce_and", "reduce_or") and dtype in ("float32", "bfloat16")
                    or name in ("reduce_sum", "reduce_prod") and dtype == "bool"
                    or name in ops.WINDOW_REDUCTIONS and dtype == "bool")]


def _reduced_operand(dtype: str):
    x = np.array([[-3.5, 0.0, 2.0, -0.25], [1.0, 7.0, -1.0, 0.5], [0.0, 0.0, 0.0, 0.0]])
    if dtype == "bool":
        return x > 0
    if dtype == "uint8":
        return (np.abs(x) * 3).astype(dtype)
    return (x * 3).astype(dtype) if dtype not in ("float32", "bfloat16") else x.astype(dtype)


@pytest.mark.parametrize("name,dtype", [(n, d) for n, d in _REDUCED if n in ops.REDUCTIONS])
def test_a_reductions_numpy_semantics_and_jax_lowering_agree(name, dtype):
    """The reductions' two meanings in the table (the reference evaluator's numpy, the JAX lowering), on bool,
    integer and float operands, over each axis and both (reduce_max of bool was True everywhere in numpy)."""
    op = OPS[name]
    x = _reduced_operand(dtype)
    for axes in ((0,), (1,), (0, 1)):
        shape = tuple(n for k, n in enumerate(x.shape) if k not in axes)
        want = evaluate_node(name, (axes,), [x], shape, dtype)
        got = np.asarray(op.jax(Node(name, (), (axes,), shape, dtype), x))
        np.testing.assert_array_equal(got, want, err_msg=f"{name} over {axes} of {dtype}")


@pytest.mark.parametrize("name,dtype", _REDUCED)
def test_a_reductions_identity_changes_no_result_and_combine_joins_partial_results(name, dtype):
    """Padding an operand with the table's identity (what Pallas blocks pad a partial tile with) leaves every
    reduction as it was, and `combine` of the reductions of two halves is the reduction of the whole."""
    op = OPS[name]
    x = _reduced_operand(dtype)
    pad = np.full((x.shape[0], 3), op.identity(np.dtype(dtype)), dtype)
    assert pad.dtype == np.dtype(dtype)
    if op.family == "pool":   # a window over the whole of axis 1, with the padding inside it
        attrs = ((1, x.shape[1]), (1, 1), (0, 0), (0, 0))
        whole = evaluate_node(name, attrs, [x], (x.shape[0], 1), dtype)
        padded_attrs = ((1, x.shape[1] + 3), (1, 1), (0, 0), (0, 0))
        padded = evaluate_node(name, padded_attrs, [np.concatenate([x, pad], 1)], (x.shape[0], 1), dtype)
        np.testing.assert_array_equal(padded, whole)
        return
    whole = evaluate_node(name, ((1,),), [x], (x.shape[0],), dtype)
    padded = evaluate_node(name, ((1,),), [np.concatenate([x, pad], 1)], (x.shape[0],), dtype)
    np.testing.assert_array_equal(padded, whole)
    halves = [evaluate_node(name, ((1,),), [part], (x.shape[0],), dtype) for part in (x[:, :2], x[:, 2:])]
    joined = evaluate_node(op.combine, (), halves, (x.shape[0],), dtype)
    np.testing.assert_array_equal(joined, whole)


def test_a_pallas_block_pads_with_the_tables_identity_and_refuses_a_reduction_without_one():
    from superopt.lowering.pallas import blocks
    from superopt.lowering.pallas.labels import NoTemplate
    assert blocks._identity("reduce_and", "int8") == -1      # every bit set: it was 1, which masks all but one
    assert not blocks._identity("reduce_max", "bool") and blocks._identity("reduce_min", "bool")
    with pytest.raises(NoTemplate, match="no padding identity for 'reduce_logsumexp'"):
        blocks._identity("reduce_logsumexp", "float32")


def test_a_composite_of_jax_is_one_op_by_its_named_call_and_a_users_namesake_is_not():
    """jnp.sinc (a jit named "sinc" in JAX's source: eq, mul, sin, div, select and a custom_jvp inside) is
    captured as the one op `sinc`, priced as one transcendental op, and lowered as jnp.sinc, derivative
    rule and all; a function of the user's that happens to be called sinc is entered as any call is."""
    import jax
    import jax.numpy as jnp

    from superopt import superopt
    from superopt.egraph.capture import capture
    x = np.linspace(-3, 3, 64, dtype=np.float32)   # 0 among them: where sinc's own derivative rule applies
    x[32] = 0.0
    graph = capture(lambda v: jnp.sinc(v) * 2.0, (x,)).graph
    assert [graph.nodes[i].op for i in graph.live() if graph.nodes[i].op != "arg"].count("sinc") == 1
    assert "sin" not in graph.op_counts() and "select" not in graph.op_counts()

    @jax.jit
    def sinc(v):   # the user's own, named like JAX's
        return v * 3.0
    assert "sinc" not in capture(lambda v: sinc(v) + 1.0, (x,)).graph.op_counts()

    def fn(v):
        return jnp.sum(jnp.sinc(v) * jnp.sinc(v))
    fast = superopt(fn, cache=False)
    np.testing.assert_allclose(fast(x), jax.jit(fn)(x), rtol=1e-5)
    np.testing.assert_allclose(jax.grad(fast)(x), jax.grad(fn)(x), rtol=1e-5, atol=1e-6)
    assert cost.flops("sinc", (), [((64,), "float32")], ((64,), "float32"), load_target("cpu")) == \
        64 * load_target("cpu").transcendental_flops


def test_an_unknown_op_is_an_error_naming_it_not_zero_cost():
    with pytest.raises(NotImplementedError, match="unknown op 'frobnicate'"):
        cost.flops("frobnicate", (), [((4,), "float32")], ((4,), "float32"), load_target("cpu"))
    with pytest.raises(NotImplementedError, match="unknown op 'frobnicate'"):
        Graph().add(Node("frobnicate", (), (), (4,), "float32"))


def test_transcendental_ops_cost_more_than_plain_ones():
    t = load_target("gpu-h100")
    ty = ((1024,), "float32")
    assert cost.flops("erf", (), [ty], ty, t) == 1024 * t.transcendental_flops
    assert cost.flops("add", (), [ty, ty], ty, t) == 1024


_X = np.array([-3.5, -1.0, -0.25, 0.0, 0.5, 0.75, 2.0, 7.0], np.float32)
_I = np.array([-7, -2, -1, 0, 1, 3, 5, 9], np.int32)
_DOMAIN = {"acosh": _X + 5, "erf_inv": _X / 8, "asin": _X / 8, "acos": _X / 8, "atanh": _X / 8,
           "log": np.abs(_X) + 0.5, "sqrt": np.abs(_X), "rsqrt": np.abs(_X) + 0.5, "log1p": np.abs(_X)}
_INTEGER = {"not", "and", "or", "xor", "shift_left", "shift_right_logical", "shift_right_arithmetic", "rem"}


def _operand(name: str):
    if name in _INTEGER:
        return _I
    return _DOMAIN.get(name, _X)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted((ops.UNARY_OPS | ops.BINARY_OPS | ops.SCANS) - {"real", "imag", "conj"}))
def test_numpy_semantics_and_the_jax_lowering_agree(name):
    """The op's two meanings in the table, on one operand set (elementwise ops and scans)."""
    op = OPS[name]
    x = _operand(name)
    ins = [x] if op.family != "binary" else [x, np.roll(x, 3) if name not in ("pow",) else np.abs(np.roll(x, 3))]
    if name in ("shift_left", "shift_right_logical", "shift_right_arithmetic"):
        ins[1] = np.abs(ins[1]) % 5
    attrs = (0, 0) if op.family == "scan" else ()
    out_dtype = "bool" if op.has("bool_result") else str(x.dtype)
    want = evaluate_node(name, attrs, ins, x.shape, out_dtype)
    got = np.asarray(op.jax(Node(name, (), attrs, x.shape, out_dtype), *ins))
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=2e-6, atol=1e-6,
                               equal_nan=True)


def test_the_checkers_draws_are_table_ops_of_their_family():
    assert set(checker.UNARY) <= ops.UNARY_OPS and set(checker.BINARY) <= ops.BINARY_OPS
    assert set(checker.REDUCE) <= ops.REDUCTIONS and set(checker.WINDOWS) == ops.WINDOW_REDUCTIONS
    assert set(checker.SCAN) == ops.SCANS


@pytest.mark.slow
def test_an_op_of_a_family_is_one_entry_lgamma_end_to_end():
    """lgamma (jax.scipy.special.gammaln) was opaque before its table entry; now it is captured, costed as
    transcendental, rewritten by the unary rules and lowered like every unary op."""
    import jax
    import jax.numpy as jnp

    from superopt import superopt
    from superopt.egraph.capture import capture

    fn = lambda a: jax.scipy.special.gammaln(a.T).T * 2.0   # noqa: E731  (transpose-through-unary applies)
    x = np.abs(np.random.default_rng(1).standard_normal((8, 16))).astype(np.float32) + 0.1
    assert capture(fn, (x,)).graph.op_counts().get("lgamma") == 1
    assert "lgamma" in ops.TRANSCENDENTAL
    fast = superopt(fn, target="cpu")
    np.testing.assert_allclose(np.asarray(fast(x)), np.asarray(jax.jit(fn)(x)), rtol=1e-6, atol=1e-6)
    assert "opaque" not in fast.report.ops_after
    poles = np.array([-2.0, -1.0, 0.0, 0.5, 3.0])
    scipy_free = ops._by_element(ops._lgamma_scalar)(poles)                  # math.lgamma; poles give inf
    np.testing.assert_allclose(scipy_free, jnp.asarray(jax.lax.lgamma(poles)), rtol=1e-6)
