"""The NPU emulator and its code generator: numerics against numpy, the Chimera byte count, capacity,
alignment, races and deadlocks as clear errors, symbolic mode and the timeline."""
import json
import re

import numpy as np
import pytest
from hypothesis import given, strategies as st

from superopt.extract.models.chimera import data_movement, gemm, gemm_chain
from superopt.core.ir import Node
from superopt.core.formats import holds, pack_np, unpack_np
from superopt.extract.target import load_target
from superopt.lowering.npu.codegen import CodegenError, chain_program, gemm_program
from superopt.lowering.npu.vector import vector_program
from superopt.lowering.npu.emulator import (
    AlignmentError, CapacityError, DeadlockError, RaceError, chrome_trace, emulate,
)
from superopt.lowering.npu.isa import Buf, CopyIn, CopyOut, Gm, Program, SetFlag, VecOp, WaitFlag

TARGETS = ("npu-910", "npu-910b")
ORDERS = [("m", "n", "k"), ("n", "m", "k"), ("m", "k", "n"), ("k", "m", "n"), ("k", "n", "m"), ("n", "k", "m")]


def fp16(x):
    return x.astype(np.float16).astype(np.float32)


def in_gm(target, arrays: dict, formats: dict) -> tuple[dict, dict, dict]:
    """The operands as a target's cube reads them from GM: ND where it converts on copy (the 910B), else
    packed into `formats` (the 910): (GM tensors by name, layout by name, program tensors by name)."""
    packed = not target.npu.nd_on_copy
    gm = {x: pack_np(v, formats[x]) if packed else v for x, v in arrays.items()}
    layouts = {x: formats[x] if packed else "ND" for x in formats}
    return gm, layouts, {x: (x, holds(layouts[x], v.shape) if packed else v.shape, "float32") for x, v in gm.items()}


def read_back(result, name: str, layout: str, shape: tuple) -> np.ndarray:
    """Output `name` of an emulator run as the ND matrix `shape` (unpacked, padding cut off)."""
    out = result.outputs[name]
    if layout == "ND":
        return out
    return unpack_np(out, layout, holds(layout, out.shape))[tuple(slice(0, d) for d in shape)]


def run_gemm(target, m, n, k, order, tiles, batch=1, seed=0, relu=False):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((batch, m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    gm, lay, t = in_gm(target, {"A": a, "B": b}, {"A": "ZZ", "B": "ZN", "C": "NZ"})
    c = (batch, t["A"][1][-2], t["B"][1][-1])     # the padded product where the operands are packed
    program = gemm_program(t["A"], t["B"], ("C", c, "float32"), order, tiles, target, relu=relu,
                           layouts=(lay["A"], lay["B"], lay["C"]))
    result = emulate(program, target, gm)
    result.outputs["C"] = read_back(result, "C", lay["C"], (batch, m, n))
    want = fp16(a) @ fp16(b)   # the cube multiplies fp16 operands and accumulates in fp32
    return result, np.maximum(want, 0) if relu else want


def test_the_910_takes_no_nd_cube_operand_and_says_what_to_pack():
    """The 910 (Atlas training series) has no ND <-> NZ conversion on copy: an ND operand is an error."""
    with pytest.raises(CodegenError, match=r"npu-910 converts no ND matrix .* A, B, C must be packed"):
        gemm_program(("A", (32, 32), "float16"), ("B", (32, 32), "float16"), ("C", (32, 32), "float16"),
                     ("m", "n", "k"), {"m": 16, "n": 16, "k": 16}, load_target("npu-910"))


@given(m=st.integers(1, 90), n=st.integers(1, 90), k=st.integers(1, 90), order=st.sampled_from(ORDERS),
       tm=st.sampled_from([16, 32, 48]), tn=st.sampled_from([16, 32, 64]), tk=st.sampled_from([16, 32]),
       target=st.sampled_from(TARGETS))
def test_tiled_gemm_matches_numpy_on_random_shapes_ragged_edges_included(m, n, k, order, tm, tn, tk, target):
    result, want = run_gemm(load_target(target), m, n, k, order, {"m": tm, "n": tn, "k": tk})
    np.testing.assert_allclose(result.outputs["C"], want, rtol=1e-4, atol=1e-4)


def test_batched_gemm_with_relu_epilogue():
    result, want = run_gemm(load_target("npu-910b"), 40, 24, 33, ("m", "n", "k"), {"m": 16, "n": 16, "k": 16},
                            batch=3, relu=True)
    np.testing.assert_allclose(result.outputs["C"], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("order", ORDERS)
def test_bytes_between_gm_and_chip_equal_the_chimera_formula(order):
    """Divisible shapes: what the emulator moves is Algorithm 1's DV for the same order and tiles."""
    m, n, k, tiles = 128, 96, 64, {"m": 32, "n": 48, "k": 16}
    result, _ = run_gemm(load_target("npu-910b"), m, n, k, order, tiles)
    ops, io, ext = gemm(m, n, k)
    dv, _ = data_movement(ops, io, list(order), ext, tiles, weights={"A": 4, "B": 4, "C": 4})
    assert result.gm_bytes == dv
    assert result.bytes_by_path["GM->L1"] + result.bytes_by_path["L0C->GM"] == dv


def test_ragged_tiles_move_no_more_than_the_formula():
    result, _ = run_gemm(load_target("npu-910b"), 50, 70, 40, ("m", "n", "k"), {"m": 32, "n": 32, "k": 16})
    ops, io, ext = gemm(50, 70, 40)
    dv, _ = data_movement(ops, io, ["m", "n", "k"], ext, {"m": 32, "n": 32, "k": 16}, weights={"A": 4, "B": 4, "C": 4})
    assert 50 * 40 * 4 + 40 * 70 * 4 + 50 * 70 * 4 <= result.gm_bytes < dv


def test_symbolic_mode_counts_the_same_cycles_and_bytes_without_data():
    target = load_target("npu-910b")
    tiles = {"m": 64, "n": 64, "k": 32}
    program = gemm_program(("A", (256, 128), "float16"), ("B", (128, 192), "float16"), ("C", (256, 192), "float16"),
                           ("m", "n", "k"), tiles, target)
    symbolic = emulate(program, target, symbolic=True)
    rng = np.random.default_rng(1)
    numeric = emulate(program, target, {"A": rng.standard_normal((256, 128)), "B": rng.standard_normal((128, 192))})
    assert symbolic.outputs["C"] is None
    assert (symbolic.cycles, symbolic.bytes_by_path) == (numeric.cycles, numeric.bytes_by_path)


@pytest.mark.slow
def test_double_buffering_overlaps_copies_with_the_cube():
    """With two slots per operand the copy of the next tile runs while the cube works on this one."""
    target = load_target("npu-910")
    result, _ = run_gemm(target, 512, 512, 512, ("m", "n", "k"), {"m": 128, "n": 128, "k": 64})
    core = "core0"
    busy = sum(b for q, b in result.busy.items() if q.startswith(core + "."))
    assert result.cycles < busy


def test_an_output_tile_larger_than_l0c_is_multiplied_over_the_whole_k_and_moves_the_same_bytes():
    """512x512 fp32 does not fit L0C (128 KB on the 910B); with k innermost the tile is computed one L0C
    block at a time from A rows and B columns gathered over all of K."""
    tiles = {"m": 512, "n": 512, "k": 32}
    result, want = run_gemm(load_target("npu-910b"), 512, 512, 96, ("m", "n", "k"), tiles)
    np.testing.assert_allclose(result.outputs["C"], want, rtol=1e-4, atol=1e-4)
    ops, io, ext = gemm(512, 512, 96)
    assert result.gm_bytes == data_movement(ops, io, ["m", "n", "k"], ext, tiles, weights=dict.fromkeys("ABC", 4))[0]


def test_an_output_tile_larger_than_l0c_with_an_outer_reduction_is_a_clear_error():
    with pytest.raises(CodegenError, match=r"L0C .* not the innermost loop"):
        run_gemm(load_target("npu-910b"), 512, 512, 64, ("k", "m", "n"), {"m": 512, "n": 512, "k": 16})


def test_a_buffer_past_its_capacity_is_an_error_naming_buffer_bytes_and_capacity():
    target = load_target("npu-910b")
    big = Buf("x_tile", "UB", 0, (1024, 64), "float32")   # 256 KB > 192 KB
    program = Program(instrs=[CopyIn("core0", "MTE2", src=Gm("x", (0, 0), (1024, 64)), dst=big)], buffers=[big],
                      inputs=[("x", (1024, 64), "float32")])
    with pytest.raises(CapacityError, match=r"'x_tile' needs 262144 bytes of UB .* capacity 196608"):
        emulate(program, target, symbolic=True)


def test_a_misaligned_buffer_is_an_error():
    buf = Buf("a", "L0A", 256, (16, 16), "float16")
    with pytest.raises(AlignmentError, match="512-byte"):
        emulate(Program(buffers=[buf]), load_target("npu-910"), symbolic=True)


def _copy_then_compute(with_flags: bool) -> Program:
    x = Buf("x", "UB", 0, (8, 64), "float32")
    y = Buf("y", "UB", 4096, (8, 64), "float32")
    instrs = [CopyIn("core0", "MTE2", src=Gm("in", (0, 0), (8, 64)), dst=x)]
    if with_flags:
        instrs += [SetFlag("core0", "MTE2", dst_core="core0", dst_queue="vector", event=0),
                   WaitFlag("core0", "vector", src_core="core0", src_queue="MTE2", event=0)]
    instrs += [VecOp("core0", "vector", op="exp", dst=y, srcs=(x,)),
               CopyOut("core0", "MTE3", src=y, dst=Gm("out", (0, 0), (8, 64)))]
    return Program(instrs=instrs, buffers=[x, y], inputs=[("in", (8, 64), "float32")],
                   outputs=[("out", (8, 64), "float32")])


def test_a_missing_flag_is_a_race_and_the_flagged_program_runs():
    target = load_target("npu-910")
    with pytest.raises(RaceError, match="reads UB:x"):
        emulate(_copy_then_compute(with_flags=False), target, symbolic=True)
    program = _copy_then_compute(with_flags=True)
    program.instrs.insert(4, SetFlag("core0", "vector", dst_core="core0", dst_queue="MTE3", event=0))
    program.instrs.insert(5, WaitFlag("core0", "MTE3", src_core="core0", src_queue="vector", event=0))
    data = np.linspace(-1, 1, 512, dtype=np.float32).reshape(8, 64)
    result = emulate(program, target, {"in": data})
    np.testing.assert_allclose(result.outputs["out"], np.exp(data), rtol=1e-6)


def test_a_wait_without_its_flag_is_a_deadlock():
    program = Program(instrs=[WaitFlag("core0", "vector", src_core="core0", src_queue="MTE2", event=3)])
    with pytest.raises(DeadlockError, match="event 3"):
        emulate(program, load_target("npu-910"), symbolic=True)


@given(rows=st.integers(1, 70), cols=st.integers(1, 300), per_row=st.booleans(),
       op=st.sampled_from(["add", "mul", "max", "sub"]), dtype=st.sampled_from(["float32", "float16"]))
def test_vector_kernels_match_numpy(rows, cols, per_row, op, dtype):
    rng = np.random.default_rng(rows * 1000 + cols)
    x = rng.standard_normal((rows, cols)).astype(dtype)
    y = rng.standard_normal((rows, 1 if per_row else cols)).astype(dtype)
    target = load_target("npu-910b")
    body = (Node("arg", (), (0,), x.shape, dtype), Node("arg", (), (1,), y.shape, dtype),
            Node("broadcast", (1,), ((0, 1),), x.shape, dtype), Node(op, (0, 2), (), x.shape, dtype))
    # a small UB budget forces many boxes, and ragged ones
    program = vector_program(body, [("x", x.shape, dtype), ("y", y.shape, dtype)], ("o", x.shape, dtype), target,
                             budget=16 * 1024)
    got = emulate(program, target, {"x": x, "y": y}).outputs["o"]
    want = {"add": np.add, "mul": np.multiply, "max": np.maximum, "sub": np.subtract}[op](x, y)
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-3, atol=1e-3)


def test_row_reductions_run_on_the_vector_unit():
    x = np.random.default_rng(2).standard_normal((33, 257)).astype(np.float32)
    target = load_target("npu-910")
    for op, want in (("reduce_sum", x.sum(-1, keepdims=True)), ("reduce_max", x.max(-1, keepdims=True))):
        body = (Node("arg", (), (0,), x.shape, "float32"), Node(op, (0,), ((1,),), (33,), "float32"),
                Node("reshape", (1,), (), (33, 1), "float32"))
        program = vector_program(body, [("x", x.shape, "float32")], ("o", (33, 1), "float32"), target)
        np.testing.assert_allclose(emulate(program, target, {"x": x}).outputs["o"], want, rtol=1e-5)


def test_the_timeline_is_chrome_trace_json_with_one_track_per_queue():
    result, _ = run_gemm(load_target("npu-910b"), 64, 64, 64, ("m", "n", "k"), {"m": 32, "n": 32, "k": 32})
    trace = json.loads(json.dumps(chrome_trace(result)))
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert {"aic0.MTE2", "aic0.MTE1", "aic0.cube"} <= names
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert spans and all(e["dur"] >= 0 for e in spans)
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(result.seconds * 1e6)


CHAIN_ORDERS = [("m", "l", "k", "n"), ("l", "m", "k", "n"), ("m", "l", "n", "k"), ("l", "m", "n", "k")]


def run_chain(target, b, m, n, k, l, order, tiles, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((b, m, k)).astype(np.float32)
    bb = rng.standard_normal((k, l)).astype(np.float32)
    d = rng.standard_normal((l, n)).astype(np.float32)
    gm, lay, t = in_gm(target, {"A": a, "B": bb, "D": d}, {"A": "ZZ", "B": "ZN", "D": "ZN", "E": "NZ"})
    e = (b, t["A"][1][-2], t["D"][1][-1])
    program = chain_program(t["A"], t["B"], t["D"], ("E", e, "float32"), order, tiles, target,
                            layouts=tuple(lay[x] for x in "ABDE"))
    result = emulate(program, target, gm)
    result.outputs["E"] = read_back(result, "E", lay["E"], (b, m, n))
    return result, fp16(fp16(a) @ fp16(bb)) @ fp16(d)   # C is kept on chip as fp16


@given(b=st.integers(1, 2), m=st.integers(1, 70), n=st.integers(1, 40), k=st.integers(1, 40), l=st.integers(1, 70),
       order=st.sampled_from(CHAIN_ORDERS), target=st.sampled_from(TARGETS))
def test_gemm_chain_matches_numpy_on_random_shapes(b, m, n, k, l, order, target):
    result, want = run_chain(load_target(target), b, m, n, k, l, order, {"m": 32, "n": 16, "k": 16, "l": 32})
    np.testing.assert_allclose(result.outputs["E"], want, rtol=1e-3, atol=1e-3)
    assert "L0C->L1" in result.bytes_by_path        # C went from the cube to L1, never to GM


@pytest.mark.parametrize("order", CHAIN_ORDERS)
def test_gemm_chain_bytes_equal_the_chimera_formula(order):
    tiles = {"m": 32, "n": 16, "k": 16, "l": 48}
    result, _ = run_chain(load_target("npu-910"), 1, 128, 32, 64, 96, order, tiles)
    ops, io, ext = gemm_chain(128, 32, 64, 96)
    dv, _ = data_movement(ops, io, list(order), ext, tiles, weights=dict.fromkeys("ABCDE", 4))
    assert result.gm_bytes == dv


@pytest.mark.slow
def test_thesis_chains_run_with_the_tiles_the_extractor_chose_and_move_what_the_model_says():
    """G1-G12 on npu-910: the chosen tiles fit the chip as generated, and the emulator's GM bytes are
    exactly the tiling's modelled volume."""
    from superopt.workloads import GEMM_CHAIN_SHAPES
    from bench.tiling import chosen_kernel
    target = load_target("npu-910")
    for name, (b, m, n, k, l) in GEMM_CHAIN_SHAPES.items():
        _, tiling = chosen_kernel(name, "npu-910")
        shapes = [("A", (b, m, k)), ("B", (b, k, l)), ("D", (b, l, n)), ("E", (b, m, n))]
        program = chain_program(*[(nm, s, "float16") for nm, s in shapes], tiling.order, dict(tiling.tiles), target,
                                layouts=("ZZ", "ZN", "ZN", "NZ"))   # multiples of 16: no padding
        result = emulate(program, target, symbolic=True, trace=False)
        assert result.gm_bytes == tiling.moved_bytes, name


def _softmax_then_transpose(g, q, s):
    """softmax over the last axis of x [g, q, s], written out as [s, g, q]: the reduced axis is the
    output's first (as in grouped-query attention's softmax between two transposes)."""
    shape, row = (g, q, s), (g, q, 1)
    return (Node("arg", (), (0,), shape, "float32"),
            Node("reduce_max", (0,), ((2,),), (g, q), "float32"), Node("reshape", (1,), (), row, "float32"),
            Node("broadcast", (2,), ((0, 1, 2),), shape, "float32"), Node("sub", (0, 3), (), shape, "float32"),
            Node("exp", (4,), (), shape, "float32"),
            Node("reduce_sum", (5,), ((2,),), (g, q), "float32"), Node("reshape", (6,), (), row, "float32"),
            Node("broadcast", (7,), ((0, 1, 2),), shape, "float32"), Node("div", (5, 8), (), shape, "float32"),
            Node("transpose", (9,), ((2, 0, 1),), (s, g, q), "float32"))


def test_a_reduced_axis_before_the_chunked_one_stays_whole_and_the_axes_after_it_are_chunked():
    """decoder-gqa-lora's softmax: the reduced axis is not the output's last. A box keeps it whole and
    chunks an axis after it; the error names what the smallest such box needs (it once counted one
    element per value, 736 bytes, and gave up although rows of 128 fit)."""
    g, q, s = 4, 32, 64
    x = np.random.default_rng(4).standard_normal((g, q, s)).astype(np.float32)
    e = np.exp(x - x.max(-1, keepdims=True))
    want = (e / e.sum(-1, keepdims=True)).transpose(2, 0, 1)
    target = load_target("npu-910b")
    body, ins, out = _softmax_then_transpose(g, q, s), [("x", x.shape, "float32")], ("o", (s, g, q), "float32")
    program = vector_program(body, ins, out, target, budget=16 * 1024)   # a whole [s, g, q] box needs 160 KB
    result = emulate(program, target, {"x": x})
    np.testing.assert_allclose(result.outputs["o"], want, rtol=1e-5, atol=1e-6)
    assert result.bytes_by_path["GM->UB"] == x.nbytes and result.bytes_by_path["UB->GM"] == x.nbytes
    with pytest.raises(CodegenError, match="smallest box") as info:
        vector_program(body, ins, out, target, budget=2048)
    need = int(re.search(r"needs (\d+) bytes", str(info.value)).group(1))
    assert need > 5 * s * 4                              # at least a whole row of each value
    vector_program(body, ins, out, target, budget=need)  # and that is exactly what it takes
    with pytest.raises(CodegenError):
        vector_program(body, ins, out, target, budget=need - 1)


def test_a_small_vector_kernel_is_spread_over_the_cores():
    """nasrnn's cell: an output of one 512-wide row fits the UB in one box, but one core moves only its
    share of the bandwidth and pays every copy's latency alone; boxes over several cores are faster."""
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal((1, 512)).astype(np.float32) for _ in range(4)]
    target = load_target("npu-910b")
    shape = (1, 512)
    body = tuple(Node("arg", (), (k,), shape, "float32") for k in range(4)) + (
        Node("add", (0, 1), (), shape, "float32"), Node("tanh", (4,), (), shape, "float32"),
        Node("mul", (2, 3), (), shape, "float32"), Node("logistic", (6,), (), shape, "float32"),
        Node("mul", (5, 7), (), shape, "float32"))
    ins = [(f"x{k}", shape, "float32") for k in range(4)]
    spread = vector_program(body, ins, ("o", shape, "float32"), target)
    one = vector_program(body, ins, ("o", shape, "float32"), target, cores=["aiv0"])   # one box, one core
    fast, slow = emulate(spread, target, dict(zip(["x0", "x1", "x2", "x3"], xs))), emulate(one, target, symbolic=True)
    assert len(spread.cores) > 1 and fast.cycles < slow.cycles
    want = np.tanh(xs[0] + xs[1]) * (1 / (1 + np.exp(-(xs[2] * xs[3]))))
    np.testing.assert_allclose(fast.outputs["o"], want, rtol=1e-5, atol=1e-6)


def test_img2col_in_channel_blocks_when_one_patch_row_does_not_fit_the_ub():
    """yolo-c14 (14x14x1024, 3x3 stride 2): not even one patch of all channels fits the UB beside its
    input rows. The patches are laid out a block of channels at a time, each block's columns written
    per kernel tap, and every buffer fits (the emulator checks)."""
    import dataclasses
    from superopt.lowering.npu.vector import img2col_program
    base = load_target("npu-910b")
    target = dataclasses.replace(base, npu=dataclasses.replace(base.npu, ub_bytes=4 * 1024))
    n, h, w, c, k, s = 1, 7, 6, 64, 3, 2
    ho, wo = -(-h // s), -(-w // s)
    pads = tuple((max((o - 1) * s + k - d, 0) // 2, max((o - 1) * s + k - d, 0) - max((o - 1) * s + k - d, 0) // 2)
                 for o, d in ((ho, h), (wo, w)))
    x = np.random.default_rng(7).standard_normal((n, h, w, c)).astype(np.float32)
    program = img2col_program(("x", x.shape, "float32"), ("p", (n * ho * wo, k * k * c), "float16"), (k, k), (s, s),
                              pads, (ho, wo), target)
    result = emulate(program, target, {"x": x})
    padded = np.pad(x[0], (pads[0], pads[1], (0, 0)))
    want = np.stack([padded[i * s:i * s + k, j * s:j * s + k].reshape(-1) for i in range(ho) for j in range(wo)])
    np.testing.assert_array_equal(result.outputs["p"], want.astype(np.float16))
    assert any(isinstance(i, CopyOut) and i.at for i in program.instrs)    # channel blocks, a run per tap


@pytest.mark.parametrize("tiles, regime", [
    ({"m": 64, "l": 96, "k": 128, "n": 64}, "stream"),      # the C tile is one L0C block: K streams
    ({"m": 32, "l": 96, "k": 320, "n": 64}, "resident"),    # one l tile covers L: each core keeps B and D
    ({"m": 256, "l": 48, "k": 128, "n": 64}, "whole"),      # two C blocks: A rows and B columns over all K
])
def test_gemm_chain_regimes_move_what_the_npu_model_says(tiles, regime):
    """The three ways the generator runs a chain's first GEMM compute the chain, and the emulator's GM
    bytes are the NPU model's for the same tiles (the extractor ranks tilings by that model)."""
    from superopt.extract.models.npu import chain_estimate, resident, streams
    target = load_target("npu-910b")
    m, n, k, l = 300, 64, 320, 96
    steps = {x: -(-e // tiles[x]) for x, e in (("m", m), ("n", n), ("k", k), ("l", l))}
    stream = streams(tiles["m"], tiles["l"], tiles["k"], k)
    assert regime == ("stream" if stream else "resident" if resident(1, steps, stream)[0] else "whole")
    result, want = run_chain(target, 1, m, n, k, l, ("m", "l", "k", "n"), tiles)
    # C is rounded to fp16 once, as the reference rounds it, but from sums in another order (K tiles)
    np.testing.assert_allclose(result.outputs["E"], want, rtol=1e-2, atol=1e-3 * np.abs(want).max())
    est = chain_estimate(1, m, n, k, l, tiles, (4, 4, 4, 4), "float16", target)
    assert result.gm_bytes == est.bytes_moved
