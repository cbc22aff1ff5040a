"""Layout packing: the formats, pack/unpack and fractal_matmul in every stage (reference, JAX, e-graph,
cost, NPU emulator), the layout rules' soundness, and hoisted packing of constant weights."""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import searching
from superopt.egraph.encode import encode
from superopt.core.ir import Graph, Node
from superopt.core.formats import FORMATS, fractal_matmul_shape, pack_np, packed_shape, unpack_np
from superopt.egraph.runner import saturate
from superopt.extract.cost import op_breakdown
from superopt.extract.greedy import extract, program_cost
from superopt.extract.target import load_target
from superopt.lowering import jax as jax_lowering
from superopt.lowering.npu.lower import NpuExecutable, cube_reference
from superopt.core import reference
from superopt.rewrites.checker import check_rule
from superopt.rewrites.pattern import exp, formats, pack, tensors, unpack, vecs
from superopt.rewrites.rule import rule
from superopt.rewrites.schedule import Schedule
from superopt.rulesets import DEFAULT, RULESETS
from superopt.rulesets.packing import LAYOUT

NPUS = ["npu-910", "npu-910b"]
FEW = settings(max_examples=8, deadline=None)


def _dims(block: int):
    return st.integers(1, 3) if block == 1 else st.integers(1, 2 * block + 1)


@st.composite
def formatted(draw, names=tuple(FORMATS)):
    """(format, logical shape), ragged and whole-block shapes alike."""
    name = draw(st.sampled_from(names))
    f = FORMATS[name]
    if not f.blocks:
        return name, tuple(draw(st.lists(st.integers(1, 4), max_size=3)))
    batch = () if f.rank else tuple(draw(st.lists(st.integers(1, 3), max_size=1)))
    return name, batch + tuple(draw(_dims(b)) for b in f.blocks)


def _values(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ---- the formats ----

@FEW
@given(formatted())
def test_pack_unpack_round_trip_and_zero_padding(case):
    name, shape = case
    x = _values(shape) + 10.0   # no zeros inside
    packed = pack_np(x, name)
    assert packed.shape == packed_shape(name, shape)
    assert np.array_equal(unpack_np(packed, name, shape), x)
    padding = packed.size - x.size
    assert np.count_nonzero(packed == 0) == padding   # the padding is zeros, and only the padding
    if FORMATS[name].fills_blocks(shape):
        assert padding == 0 and np.array_equal(pack_np(unpack_np(packed, name, shape), name), packed)


def test_layouts_are_the_documented_ones():
    x = np.arange(40 * 70).reshape(40, 70)
    i, j, a, b = 1, 3, 5, 7   # fractal (i, j), element (a, b) inside it
    assert pack_np(x, "ZZ")[i, j, a, b] == x[16 * i + a, 16 * j + b]
    assert pack_np(x, "ZN")[i, j, b, a] == x[16 * i + a, 16 * j + b]
    assert pack_np(x, "NZ")[j, i, a, b] == x[16 * i + a, 16 * j + b]
    assert pack_np(x, "NZ").shape == (5, 3, 16, 16) and pack_np(x, "ZZ").shape == (3, 5, 16, 16)
    assert pack_np(x, "B32")[1, 1, a, b] == x[32 + a, 32 + b] and pack_np(x, "B32").shape == (2, 3, 32, 32)
    assert pack_np(x, "B32")[1, 2, a, 6] == 0   # column 70 is padding
    assert pack_np(x, "VNNI")[i, 9, 3] == x[4 * i + 3, 9] and pack_np(x, "VNNI").shape == (10, 70, 4)
    nhwc = np.arange(2 * 3 * 4 * 20).reshape(2, 3, 4, 20)
    assert pack_np(nhwc, "NC1HWC0")[1, 1, 2, 3, 2] == nhwc[1, 2, 3, 18]
    assert pack_np(nhwc, "NC1HWC0").shape == (2, 2, 3, 4, 16)
    assert pack_np(x, "ND") is not None and np.array_equal(pack_np(x, "ND"), x)
    batched = np.arange(2 * 20 * 20).reshape(2, 20, 20)
    assert np.array_equal(pack_np(batched, "NZ")[1], pack_np(batched[1], "NZ"))   # batch axes stay in front


def test_a_format_that_does_not_apply_is_a_clear_error():
    from superopt.core.formats import LayoutError
    with pytest.raises(LayoutError, match="NC1HWC0 packs rank 4"):
        packed_shape("NC1HWC0", (3, 16))
    with pytest.raises(LayoutError, match="unknown format 'NHWC'"):
        packed_shape("NHWC", (3, 16))


# ---- reference and JAX lowering agree ----

def _graph(name, shape, dtype="float32"):
    """arg -> pack -> unpack, both outputs."""
    g = Graph(n_args=1)
    x = g.add(Node("arg", (), (0,), shape, dtype))
    p = g.add(Node("pack", (x,), (name,), packed_shape(name, shape), dtype))
    u = g.add(Node("unpack", (p,), (name,), shape, dtype))
    g.outputs = [p, u]
    return g


def _linear(m, k, n, weights_constant=True, batch=()):
    """unpack(fractal_matmul(pack(x, ZZ), pack(W, ZN)), NZ): x @ W on fractals."""
    w = _values((k, n), 1)
    g = Graph(consts=[w] if weights_constant else [], n_args=1 if weights_constant else 2)
    x = g.add(Node("arg", (), (0,), batch + (m, k), "float32"))
    wn = g.add(Node("const", (), (0,), (k, n), "float32")) if weights_constant else \
        g.add(Node("arg", (), (1,), (k, n), "float32"))
    px = g.add(Node("pack", (x,), ("ZZ",), packed_shape("ZZ", batch + (m, k)), "float32"))
    pw = g.add(Node("pack", (wn,), ("ZN",), packed_shape("ZN", (k, n)), "float32"))
    prod = g.add(Node("fractal_matmul", (px, pw), (), fractal_matmul_shape(g.nodes[px].shape, g.nodes[pw].shape),
                      "float32"))
    g.outputs = [g.add(Node("unpack", (prod,), ("NZ",), batch + (m, n), "float32"))]
    return g, w


@pytest.mark.slow
@FEW
@given(formatted(), st.sampled_from(["float32", "float16", "bfloat16"]))
def test_reference_and_jax_lowering_agree(case, dtype):
    name, shape = case
    g = _graph(name, shape, dtype)
    x = _values(shape).astype(np.dtype(dtype))
    want = reference.evaluate(g, [x])
    got = jax_lowering.lower(g)(x)
    for w, v in zip(want, got):
        assert np.array_equal(np.asarray(v), w)


@pytest.mark.slow
@FEW
@given(st.integers(1, 40), st.integers(1, 40), st.integers(1, 40), st.booleans())
def test_fractal_matmul_is_the_matmul(m, k, n, batched):
    batch = (2,) if batched else ()
    g, w = _linear(m, k, n, batch=batch)
    x = _values(batch + (m, k), 2)
    want = np.matmul(x.astype(np.float64), w.astype(np.float64))
    np.testing.assert_allclose(reference.evaluate(g, [x])[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(jax_lowering.lower(g)(x)[0]), want, rtol=1e-4, atol=1e-4)


# ---- rules ----

@pytest.mark.slow
@pytest.mark.parametrize("r", list(LAYOUT), ids=[r.name for r in LAYOUT])
def test_layout_rule_is_sound(r):
    result = check_rule(r, examples=60)
    assert result.sound, (r.name, result.counterexample, result.notes)


def test_layout_is_registered_and_default():
    assert RULESETS["layout"] is LAYOUT and "layout" in DEFAULT


y, x = tensors("y x")
(s,) = vecs("s")
(f,) = formats("f")


def test_pack_of_unpack_without_the_predicate_is_caught():
    bad = rule("pack-of-unpack-always", pack(unpack(y, f, s), f), y, doc="wrong: y's padding need not be zero")
    result = check_rule(bad, examples=100, shrink=False)
    assert not result.sound and result.counterexample is not None
    name, shape = result.counterexample.bindings["?f"], result.counterexample.bindings["?s"]
    assert not FORMATS[name].fills_blocks(shape)   # only a padded shape can go wrong


def test_pushing_a_pack_into_an_op_is_caught():
    bad = rule("pack-through-exp", pack(exp(x), f), exp(pack(x, f)), doc="wrong: exp(0) = 1 in the padding")
    assert not check_rule(bad, examples=100, shrink=False).sound


def _run(graph, rulesets, target="cpu"):
    enc, _, frozen = searching.saturated(graph, Schedule.of(*rulesets))
    return extract(frozen, enc, load_target(target))


def test_cancellation_in_an_egraph():
    g = _graph("NZ", (20, 30))
    g.outputs = [g.outputs[1]]                       # unpack(pack(x))
    chosen = _run(g, ["layout"]).graph
    assert {g.nodes[i].op for i in chosen.live()} == {"arg"}


@pytest.mark.parametrize("shape, cancels", [((32, 48), True), ((20, 48), False)])
def test_pack_of_unpack_cancels_only_without_padding(shape, cancels):
    g = Graph(n_args=1)
    y = g.add(Node("arg", (), (0,), packed_shape("ZZ", shape), "float32"))
    u = g.add(Node("unpack", (y,), ("ZZ",), shape, "float32"))
    g.outputs = [g.add(Node("pack", (u,), ("ZZ",), packed_shape("ZZ", shape), "float32"))]
    chosen = _run(g, ["layout"]).graph
    assert ({chosen.nodes[i].op for i in chosen.live()} == {"arg"}) == cancels


def test_elementwise_chain_runs_in_the_packed_layout():
    """exp(unpack(y)) * 2 -> unpack(exp(y) * 2): one unpack at the end, whichever form is chosen."""
    from superopt.egraph.frozen import freeze as _freeze
    g = Graph(n_args=1)
    y = g.add(Node("arg", (), (0,), (2, 2, 16, 16), "float32"))
    u = g.add(Node("unpack", (y,), ("NZ",), (20, 30), "float32"))
    e = g.add(Node("exp", (u,), (), (20, 30), "float32"))
    two = g.add(Node("lit", (), (2.0,), (), "float32"))
    g.outputs = [g.add(Node("mul", (e, two), (), (20, 30), "float32"))]
    enc = encode(g)
    saturate(enc.egraph, Schedule.of("layout"))
    fz = _freeze(enc.egraph)
    root = fz.classes[fz.outputs[0]]
    assert any(n.fn == "unpack" for n in root)      # the whole chain is an unpack of a packed chain


# ---- cost and hoisting ----

def test_a_pack_of_an_input_is_a_format_conversion_on_an_npu():
    npu, cpu = load_target("npu-910b"), load_target("cpu")
    t = (((256, 256), "float16"), ((16, 16, 16, 16), "float16"))
    parts = op_breakdown("pack", ("ZZ",), [t[0]], t[1], npu)
    assert parts.transdata_seconds > 0 and parts.unit == "vector"
    assert op_breakdown("pack", ("ZZ",), [t[0]], t[1], cpu).time > 0
    assert op_breakdown("pack", ("ND",), [t[0]], t[0], npu).time == 0


@pytest.mark.parametrize("target", ["cpu", "npu-910b"])
def test_a_pack_of_a_constant_is_free(target):
    g, _ = _linear(64, 96, 80)
    cost, per_node = program_cost(g, load_target(target))
    live = g.live()
    pack_w = next(i for i in live if g.nodes[i].op == "pack" and g.nodes[g.nodes[i].inputs[0]].op == "const")
    pack_x = next(i for i in live if g.nodes[i].op == "pack" and g.nodes[g.nodes[i].inputs[0]].op == "arg")
    assert per_node[live.index(pack_w)] == 0 and per_node[live.index(pack_x)] > 0


def test_packed_constant_weights_are_computed_once_in_jax(monkeypatch):
    calls = []
    original = jax_lowering._LOWER["pack"]
    monkeypatch.setitem(jax_lowering._LOWER, "pack", lambda n, v: calls.append(n.attrs[0]) or original(n, v))
    g, w = _linear(24, 40, 36)
    run = jax_lowering.lower(g)
    assert calls == ["ZN"]                          # the weights, when the callable was built
    x = _values((24, 40), 3)
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(run(x)[0]), x @ w, rtol=1e-4, atol=1e-4)
    assert calls == ["ZN", "ZZ"]                    # the activations, traced once; no pack per call


@pytest.mark.parametrize("target", NPUS)
def test_packed_constant_weights_are_preloaded_on_the_npu(target):
    g, w = _linear(40, 72, 56)
    exe = NpuExecutable(g, load_target(target))
    labels = [s.label for s in exe.stages]
    assert not any("pack ZN" in label for label in labels), labels       # computed when built
    assert any("pack ZZ" in label for label in labels)                   # the activations: per call
    assert any(v.shape == packed_shape("ZN", (72, 56)) for v in exe.preloaded.values())


@pytest.mark.slow
def test_cpu_programs_are_unchanged_by_the_layout_rules():
    from superopt import superopt
    w = _values((200, 300), 4)
    fn = lambda a: jnp.tanh(a @ w) * 2.0   # noqa: E731
    a = _values((100, 200), 5)
    without = superopt(fn, target="cpu", rulesets=[r for r in DEFAULT if r != "layout"])
    with_layout = superopt(fn, target="cpu")
    np.testing.assert_allclose(np.asarray(with_layout(a)), np.asarray(fn(a)), rtol=1e-4, atol=1e-4)
    without(a)
    # the cube's rule is the NPU's alone: on the cpu it does not run, and the other layout rules find no pack
    assert "matmul-on-fractals" not in with_layout.report.run.matches
    assert not any(with_layout.report.run.fired.get(r.name, 0) for r in LAYOUT.rules)
    assert with_layout.report.cost_after == pytest.approx(without.report.cost_after)
    assert "pack" not in with_layout.report.ops_after


def _nd_linear(m, k, n):
    nd = Graph(consts=[_values((k, n), 1)], n_args=1)
    a = nd.add(Node("arg", (), (0,), (m, k), "float32"))
    wc = nd.add(Node("const", (), (0,), (k, n), "float32"))
    nd.outputs = [nd.add(Node("matmul", (a, wc), (), (m, n), "float32"))]
    return nd


@pytest.mark.slow
def test_on_the_910_the_weight_is_packed_once_and_the_emulator_agrees_it_pays():
    """The 910 converts no ND matrix on copy: an ND matmul packs x and W and unpacks the product on every
    call. The extractor packs the constant W when the program is built instead, and that program takes
    fewer emulator cycles than the ND matmul lowered as it would run."""
    target = load_target("npu-910")
    nd = _nd_linear(100, 200, 300)
    chosen = _run(nd, ["layout"], "npu-910")
    ops = chosen.graph.op_counts()
    assert ops.get("fractal_matmul") == 1 and "matmul" not in ops
    weight_pack = next(n for n in chosen.graph.nodes if n.op == "pack" and n.attrs[0] == "ZN")
    assert chosen.graph.nodes[weight_pack.inputs[0]].op == "const"       # hoisted: computed at build time
    assert chosen.cost < program_cost(nd, target)[0]
    nd_run = NpuExecutable(nd, target)
    packed_run = NpuExecutable(chosen.graph, target)
    assert sum("(TransData)" in s.label for s in nd_run.stages) == 3    # x, W and the product, per call
    assert sum("(TransData)" in s.label for s in packed_run.stages) == 2   # x and the product
    assert packed_run.estimate().cycles < nd_run.estimate().cycles
    x = _values((100, 200), 3)
    np.testing.assert_allclose(packed_run(x)[0], nd_run(x)[0], rtol=1e-3, atol=1e-3)


def test_on_npu_the_model_keeps_the_nd_matmul_and_says_why():
    """The 910B converts ND tiles to fractals on chip for free (MTE2 in, FixPipe out), so the packed form,
    even with hoisted weights, pays two TransData passes for the activations that the ND matmul does not."""
    nd = Graph(consts=[_values((200, 300), 1)], n_args=1)
    a = nd.add(Node("arg", (), (0,), (100, 200), "float32"))
    wc = nd.add(Node("const", (), (0,), (200, 300), "float32"))
    nd.outputs = [nd.add(Node("matmul", (a, wc), (), (100, 300), "float32"))]
    target = load_target("npu-910b")
    chosen = _run(nd, ["layout"], "npu-910b")
    assert chosen.graph.op_counts().get("matmul") == 1
    packed, _ = _linear(100, 200, 300)
    assert program_cost(packed, target)[0] > chosen.cost


# ---- the NPU emulator ----

@FEW
@given(formatted(tuple(n for n in FORMATS if n != "ND")), st.sampled_from(NPUS))
def test_pack_and_unpack_run_on_the_emulator(case, target):
    name, shape = case
    g = _graph(name, shape)
    x = _values(shape, 6)
    exe = NpuExecutable(g, load_target(target))
    got = exe(x)
    assert not exe.host_ops and all("TransData" in s.label for s in exe.stages)
    for v, w in zip(got, reference.evaluate(g, [x])):
        assert np.array_equal(v, w)


@pytest.mark.slow
@FEW
@given(st.integers(1, 70), st.integers(1, 70), st.integers(1, 70), st.booleans(), st.booleans(),
       st.sampled_from(NPUS))
def test_fractal_matmul_runs_on_the_emulator(m, k, n, constant, batched, target):
    g, w = _linear(m, k, n, weights_constant=constant, batch=(2,) if batched else ())
    args = [_values(g.nodes[0].shape, 7)] + ([] if constant else [w])
    exe = NpuExecutable(g, load_target(target))
    got = exe(*args)[0]
    assert not exe.host_ops and any("fractal_matmul" in s.label for s in exe.stages)
    want = cube_reference(g, args)[0]     # fp16 operands, as the cube takes them
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * max(1.0, float(np.abs(want).max())))
    np.testing.assert_allclose(got, np.asarray(jax_lowering.lower(g)(*args)[0]), rtol=2e-2,
                               atol=2e-2 * math.sqrt(k))
