"""Cast elimination: exact round trips go, inexact ones stay, casts move where they are exact, and a
mixed-precision MLP keeps only the casts its result needs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from superopt.workloads import mixed_precision_mlp_args as _mlp_args  # the benchmark's MLP, small
from superopt.workloads import mixed_precision_mlp_fn as mixed_precision_mlp
from superopt import superopt
from superopt.egraph.capture import capture
from superopt.egraph.encode import encode
from superopt.egraph.frozen import freeze
from superopt.egraph.runner import saturate
from superopt.rewrites.checker import check_rule
from superopt.rewrites.pattern import convert, tensors
from superopt.rewrites.rule import rule, when
from superopt.rewrites.schedule import Schedule
from superopt.rulesets import DEFAULT, RULESETS
from superopt.rulesets.casts import EXACT_WIDENINGS

f16, f32 = jnp.float16, jnp.float32
x, = tensors("x")


def deep_nodes(graph) -> list:
    """The live nodes and the nodes inside every kernel body."""
    out = []
    for i in graph.live():
        node = graph.nodes[i]
        out += [node] + (list(node.attrs[0]) if node.op == "kernel" else [])
    return out


def deep_counts(graph) -> dict:
    counts: dict = {}
    for node in deep_nodes(graph):
        counts[node.op] = counts.get(node.op, 0) + 1
    return counts


def _output_classes(fn, *args):
    """Saturate `fn`'s program with the default rule sets: (frozen e-graph, output class, arg classes)."""
    enc = encode(capture(fn, args).graph)
    saturate(enc.egraph, Schedule.of(*DEFAULT))
    frozen = freeze(enc.egraph)
    args_of = {n.args[0]: c for c, nodes in frozen.classes.items() for n in nodes if n.fn == "arg"}
    return frozen, frozen.outputs[0], args_of


def test_an_exact_round_trip_is_the_value_it_started_from():
    frozen, out, args_of = _output_classes(lambda a: a.astype(f32).astype(f16), jnp.ones((4, 8), f16))
    assert out == args_of[0]


@pytest.mark.slow
def test_the_inexact_round_trip_is_never_removed():
    # f32 -> f16 -> f32 rounds (and overflows above 65504): after saturating every default rule set the
    # result's e-class must not contain the input.
    frozen, out, args_of = _output_classes(lambda a: a.astype(f16).astype(f32), jnp.ones((4, 8), f32))
    assert out != args_of[0]
    assert all(n.fn != "arg" for n in frozen.classes[out])
    # and the rule that would remove it is unsound: the checker finds a value that does not survive
    bad = rule("drop-f32-f16-f32", convert(convert(x, "float16"), "float32"), x, when("has_dtype", x, "float32"),
               doc="wrong")
    assert check_rule(bad, examples=200, shrink=False).counterexample is not None
    # end to end, the optimized program rounds exactly as the original does
    fn = superopt(lambda a: jnp.tanh(a.astype(f16).astype(f32)), target="cpu")
    a = np.array([1.0001, 70000.0, -3.14159265, 1e-8], np.float32)
    with np.errstate(over="ignore"):  # 70000 overflows f16, in the expected value as in the program
        np.testing.assert_array_equal(np.asarray(fn(a)), np.tanh(a.astype(np.float16).astype(np.float32)))


@pytest.mark.parametrize("narrow,wide", EXACT_WIDENINGS)
def test_every_listed_widening_is_exact_on_all_of_the_narrow_type(narrow, wide):
    import ml_dtypes  # noqa: F401  (bfloat16)
    if np.dtype(narrow).kind == "i":
        info = np.iinfo(narrow)
        values = np.arange(info.min, info.max + 1).astype(narrow)
    else:  # every bit pattern of a 16-bit float, or a sample of float32's
        bits = np.arange(2 ** 16, dtype=np.uint16) if np.dtype(narrow).itemsize == 2 else \
            np.random.default_rng(0).integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32)
        values = bits.view(narrow)
    with np.errstate(invalid="ignore"):  # numpy warns when it widens a NaN from bfloat16
        back = values.astype(wide).astype(narrow)
        np.testing.assert_array_equal(back.astype(np.float64), values.astype(np.float64))  # NaN == NaN here


def test_cast_rules_are_registered_and_default():
    assert "casts" in RULESETS and "casts" in DEFAULT


@pytest.mark.slow
@pytest.mark.parametrize("target", ["cpu", "gpu-h100"])
def test_a_mixed_precision_mlp_loses_its_redundant_casts(target):
    args = _mlp_args()
    fn = superopt(mixed_precision_mlp, target=target)
    out = fn(*args)
    spec = fn.compile(*args)
    before, after = deep_counts(spec.original), deep_counts(spec.term)
    assert before["convert"] == 8
    # What is left: the hidden layer narrowed to f16 once, and the result narrowed to f16. The matmuls
    # read their f16 operands directly and accumulate in f32 (preferred_element_type); the zero of relu
    # is a constant cast, computed when the program is built.
    runtime = [n for n in deep_nodes(spec.term) if n.op == "convert" and not (n.shape == () and n.dtype == "float16")]
    assert len(runtime) == 2, spec.term
    assert after["convert"] < before["convert"]
    assert all(n.dtype == "float16" for n in runtime)
    matmuls = [n for n in deep_nodes(spec.term) if n.op == "matmul"]
    assert matmuls and all(n.dtype == "float32" for n in matmuls)
    expected = jax.jit(mixed_precision_mlp)(*args)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(expected, np.float32), rtol=2e-2, atol=2e-2)
