"""The benchmark suite: its workloads are the programs they say they are, and the tables and plots are
written from what was measured."""
import re

import jax
import jax.numpy as jnp
import numpy as np

from bench import plots
from superopt.workloads import CONV_CHAIN_SHAPES, GEMM_CHAIN_SHAPES, WORKLOADS, YOLO_SAMPLE, conv_chain, decoder_block, \
    nasrnn
from bench.run import render
from superopt.egraph.capture import capture
import pytest

pytestmark = pytest.mark.slow   # whole models, worker processes or long searches: make test, not test-fast


def test_the_suite_has_every_family_the_issue_names():
    names = set(WORKLOADS)
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", n) for n in names)
    assert {"bert-encoder-128", "bert-encoder-512", "decoder-gqa-lora", "resnet-bottleneck", "mixed-precision-mlp",
            "int8-linear", "int8-conv", "train-step", "train-step-sgd", "nasrnn"} <= names
    assert {f"gemm-chain-{k}" for k in GEMM_CHAIN_SHAPES} <= names and len(GEMM_CHAIN_SHAPES) == 12
    assert {f"conv-chain-{k}" for k in CONV_CHAIN_SHAPES} <= names and len(CONV_CHAIN_SHAPES) == 8
    assert {f"yolo-{k}" for k in YOLO_SAMPLE} <= names


def test_a_conv_chain_applies_both_strides():
    w = conv_chain("c5")                       # 227x227x16, 3x3 stride 4 -> 64, 1x1 -> 16
    out = jax.eval_shape(w.fn, *w.args)
    assert out.shape == (1, 57, 57, 16)


def test_the_decoder_block_is_causal_and_its_groups_share_keys():
    w = decoder_block(seq=8, hidden=32, q_heads=4, kv_heads=2, ffn=48, rank=4)
    params, x = w.args
    assert params["Wk"].shape == (32, 16) and params["Wq"].shape == (32, 32)   # 2 kv heads of 8, 4 query heads
    block = jax.jit(w.fn)
    y = block(params, x)
    later = x.at[:, -1, :].add(1.0)            # a change at the last position reaches no earlier position
    y2 = block(params, later)
    np.testing.assert_allclose(np.asarray(y[:, :-1]), np.asarray(y2[:, :-1]), rtol=1e-6, atol=1e-6)
    assert not np.allclose(np.asarray(y[:, -1]), np.asarray(y2[:, -1]))


def test_the_nasrnn_cell_has_sixteen_matmuls_per_step_on_two_operands():
    w = nasrnn(steps=3, hidden=16, batch=2)
    graph = capture(w.fn, w.args).graph
    assert graph.op_counts()["matmul"] == 16 * 3
    y = np.asarray(w.fn(*w.args))
    assert y.shape == (2, 16) and np.all(np.abs(y) < 1)      # tanh of the root


def _row(name, ratio, **kw):
    row = {"name": name, "description": f"{name} program", "target": "cpu", "outcome": "optimized", "fired": {"r": 2},
           "stop": "saturated", "iterations": 3, "enodes": 40, "optimize_s": 0.5, "sat_extract_s": 0.3,
           "estimate": 2.0, "kernels_before": 5, "kernels_after": 2, "jit_ms": 1.0, "opt_ms": ratio,
           "ratio": ratio, "rounds": [(1e-3, ratio * 1e-3), (2e-3, ratio * 1e-3)], "npu_target": "npu-910b",
           "npu_unfused": 1000, "npu_optimized": 500}
    row.update(kw)
    return row


def test_the_tables_and_their_summary_are_computed_from_the_rows(tmp_path):
    rows = [_row("fast", 0.5), _row("same", 1.0, outcome="kept original: no cheaper program found"),
            _row("no-npu", 0.9, npu_error="CodegenError: too big"), _row("slow", 1.2, npu_optimized=1500),
            {"name": "broken", "error": "KeyError: 'x'"}]
    text = render(rows, 9, 3, "2026-01-01 00:00", "python -m bench.run", [], figure="figs/x.png")
    assert "| fast | 1.000 | 0.500 | 0.500 | 0.50, 0.25 | 1000 | 500 | 2.00x |" in text
    assert "| no-npu | 1.000 | 0.900 | 0.900 | 0.90, 0.45 | not lowered: CodegenError: too big | — | — |" in text
    assert "| broken | broken program" not in text and "| broken |  | error: KeyError: 'x' |" in text
    assert ("Of 4 workloads, superopt kept the original for 1 and changed 3; of those, 2 run faster than jax.jit "
            "by more than 3%, 1 slower by more than 3% (slow), the rest within 3%.") in text
    assert "On the NPU emulator 3 of 4 lowered, 2 with fewer cycles than op by op; slow takes more (0.67x)." in text
    assert "![workloads](figs/x.png)" in text
    path = plots.overview(rows, str(tmp_path / "o.png"))
    assert open(path, "rb").read().startswith(b"\x89PNG")
    assert plots.overview([rows[-1]], str(tmp_path / "none.png")) is None    # nothing measured, nothing drawn


def test_a_yolo_layer_is_conv_bias_and_leaky_relu():
    w = WORKLOADS["yolo-c14"]()                # 14x14x1024, 3x3 stride 2 -> 7x7x1024
    graph = capture(w.fn, w.args).graph
    assert graph.op_counts()["conv"] == 1 and jax.eval_shape(w.fn, *w.args).shape == (1, 7, 7, 1024)
    y = jax.jit(w.fn)(*w.args)
    assert float(jnp.min(y)) < 0 < float(jnp.max(y))          # leaky: negatives scaled, not cut to zero


def test_a_rerun_keeps_the_gpu_section_it_cannot_regenerate(tmp_path):
    from bench.gpu import SECTION
    from bench.run import carried_sections
    out = tmp_path / "B.md"
    out.write_text(f"# Benchmarks\n\n## Workloads\n\nold rows\n\n{SECTION}\n\n| gpu row |\n\n## Cost model\n\nold\n")
    kept = carried_sections(str(out))
    assert kept.strip() == f"{SECTION}\n\n| gpu row |" and "old rows" not in kept
    assert carried_sections(str(tmp_path / "missing.md")) == ""


def test_only_a_full_run_writes_benchmarks_md_and_the_tracked_plots():
    from bench.run import SECTIONS, destinations
    assert destinations(None, SECTIONS, None, None) == (True, "BENCHMARKS.md", "docs/figures")
    partial = (False, "build/bench/BENCHMARKS.partial.md", "build/bench/figures")
    assert destinations("gemm-chain", SECTIONS, None, None) == partial
    assert destinations(None, ["table", "tiling"], None, None) == partial
    assert destinations("g10", ["tiling"], "BENCHMARKS.md", None) == \
        (False, "BENCHMARKS.md", "build/bench/figures")                  # --output names it: written there
    assert destinations(None, SECTIONS, "out.md", "figs") == (True, "out.md", "figs")
