"""Programs on the NPU emulator.

Whole programs (npu-910b and npu-910): the captured program lowered op by op ("unfused") against the
program superopt chose ("optimized"), both through the same lowering (`lowering/npu/lower.py`); the
optimized one is what `superopt(fn, target=...)` runs.

The thesis GEMM chains G1-G12 (npu-910): the fused chain kernel with the tiles the extractor chose,
against the two GEMMs run apart (each at its own best tiling, C through GM), the operands and results
in the cube's fractal formats (the 910 converts no ND matrix on copy; the shapes fill whole fractals,
so the bytes are the ND matrices'). Symbolic mode (shapes
only): cycles, GM bytes and queue utilisation are what the numeric run gives, without the arithmetic.
Cycles are one kernel's, from first issue to last instruction, over all cores; launch overhead is not
included.
"""
from __future__ import annotations

import os
import time

import jax
import numpy as np

from bench.tiling import chosen_kernel
from superopt import superopt
from superopt.core import progress
from superopt.core.formats import CUBE_FORMATS
from superopt.extract.cost import one_op_body, tiling_options
from superopt.extract.target import load_target
from superopt.lowering.npu.codegen import chain_program, gemm_program
from superopt.lowering.npu.emulator import emulate
from superopt.lowering.npu.lower import NpuExecutable
from superopt.npu_backend import default_precision
from superopt.workloads import CONV_CHAIN_SHAPES, GEMM_CHAIN_SHAPES, WORKLOADS, conv_chain

PROGRAMS = ("bert-encoder-128", "bert-encoder-512", "transformer-block", "resnet-bottleneck")
PROGRAM_TARGETS = ("npu-910b", "npu-910")
TIMELINE = "docs/figures/npu-910b-bert-encoder-128.png"

TARGET = "npu-910"
CONV_TARGET = "npu-910b"
F16 = "float16"


def unfused(b, m, n, k, l, target):
    """(cycles, GM bytes) of C = A @ B then E = C @ D as two kernels, each at its best tiling."""
    cycles = moved = 0
    for a, bb, out in (((b, m, k), (b, k, l), (b, m, l)), ((b, m, l), (b, l, n), (b, m, n))):
        ins = [(a, F16), (bb, F16)]
        options, _ = tiling_options(one_op_body("matmul", (F16,), ins, (out, F16)), ins, (out, F16), target)
        tiling = options[0]
        program = gemm_program(("A", a, F16), ("B", bb, F16), ("C", out, F16), tiling.order, dict(tiling.tiles),
                               target, layouts=CUBE_FORMATS)
        result = emulate(program, target, symbolic=True, trace=False)
        cycles, moved = cycles + result.cycles, moved + result.gm_bytes
    return cycles, moved


def rows(chains=None) -> list[dict]:
    """The fused chain kernel against the two GEMMs apart, for `chains` (keys of GEMM_CHAIN_SHAPES; all)."""
    target = load_target(TARGET)
    out = []
    for name in chains or GEMM_CHAIN_SHAPES:
        b, m, n, k, l = GEMM_CHAIN_SHAPES[name]
        _, tiling = chosen_kernel(name, TARGET)
        shapes = [("A", (b, m, k)), ("B", (b, k, l)), ("D", (b, l, n)), ("E", (b, m, n))]
        program = chain_program(*[(nm, s, F16) for nm, s in shapes], tiling.order, dict(tiling.tiles), target,
                                layouts=("ZZ", "ZN", "ZN", "NZ"))
        start = time.perf_counter()
        fused = emulate(program, target, symbolic=True, trace=False)
        wall = time.perf_counter() - start
        apart_cycles, apart_bytes = unfused(b, m, n, k, l, target)
        util = fused.queue_utilisation
        out.append({"name": name.upper(), "shape": f"{b}x{m}x{n}x{k}x{l}", "tiles": str(tiling),
                    "fused": fused.cycles, "unfused": apart_cycles, "bytes": fused.gm_bytes, "unfused_bytes": apart_bytes,
                    "cube": util.get("cube", 0.0), "mte2": util.get("MTE2", 0.0), "wall": wall})
    return out


def markdown(rs: list[dict]) -> str:
    lines = ["| chain | b x M x N x K x L | tiles | cycles fused | cycles unfused | speedup | GM bytes fused | "
             "GM bytes unfused | cube util | MTE2 util | emulator wall (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        lines.append(f"| {r['name']} | {r['shape']} | {r['tiles']} | {r['fused']} | {r['unfused']} | "
                     f"{r['unfused'] / r['fused']:.2f}x | {r['bytes']} | {r['unfused_bytes']} | {r['cube']:.0%} | "
                     f"{r['mte2']:.0%} | {r['wall']:.2f} |")
    return "\n".join(lines)


def program_rows(names=PROGRAMS, targets=PROGRAM_TARGETS, timeline: str | None = TIMELINE) -> list[dict]:
    """Per program and target: cycles, GM bytes and utilisation unfused and optimized (symbolic runs),
    the wall time of the symbolic and the numeric emulation, and the error against JAX."""
    out = []
    for name in names:
        w = WORKLOADS[name]()
        flat = jax.tree_util.tree_leaves(w.args)
        want = [np.asarray(x) for x in jax.tree_util.tree_leaves(w.fn(*w.args))]
        for target_name in targets:
            progress.note(f"[npu] {name} on {target_name}")
            target = load_target(target_name)
            fast = superopt(w.fn, target=target_name)
            spec = fast.compile(*w.args)
            if spec.npu is None:
                out.append({"name": name, "target": target_name, "error": str(fast.report.backend)})
                continue
            start = time.perf_counter()
            optimized = spec.npu.estimate()
            wall_symbolic = time.perf_counter() - start
            op_by_op = NpuExecutable(spec.original, target, precision=spec.npu.precision)
            unfused = op_by_op.estimate()
            traced = spec.npu.run(*flat)
            err = max(float(np.abs(g - e).max() / (np.abs(e).max() or 1.0)) for g, e in zip(traced.outputs, want))
            if timeline and name == "bert-encoder-128" and target_name == "npu-910b":
                os.makedirs(os.path.dirname(timeline), exist_ok=True)
                spec.npu.write_timeline(traced, timeline)
            util = optimized.utilisation(target)
            out.append({"name": name, "target": target_name, "unfused": unfused.cycles, "optimized": optimized.cycles,
                        "unfused_bytes": unfused.gm_bytes, "bytes": optimized.gm_bytes,
                        "stages": f"{len(op_by_op.stages)} -> {len(spec.npu.stages)}",
                        "util": ", ".join(f"{q} {util.get(q, 0.0):.0%}" for q in ("cube", "vector", "MTE2", "MTE3")),
                        "us": optimized.cycles / target.npu.clock_hz * 1e6, "wall_symbolic": wall_symbolic,
                        "wall_numeric": traced.wall_seconds, "err": err, "host": len(spec.npu.host_ops)})
    return out


def program_markdown(rs: list[dict]) -> str:
    lines = ["| program | target | stages unfused -> optimized | cycles unfused | cycles optimized | speedup | "
             "time optimized | GM MB unfused | GM MB optimized | utilisation (optimized) | emulator wall, symbolic | "
             "emulator wall, numeric | max error vs JAX (of max abs) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['target']} | not on the emulator: {r['error']} |" + " |" * 10)
            continue
        lines.append(f"| {r['name']} | {r['target']} | {r['stages']} | {r['unfused']} | {r['optimized']} | "
                     f"{r['unfused'] / r['optimized']:.2f}x | {r['us']:.1f} us | {r['unfused_bytes'] / 1e6:.1f} | "
                     f"{r['bytes'] / 1e6:.1f} | {r['util']} | {r['wall_symbolic']:.2f} s | {r['wall_numeric']:.2f} s | "
                     f"{r['err']:.1e} |")
    return "\n".join(lines)


def conv_rows(names=tuple(CONV_CHAIN_SHAPES), target_name: str = CONV_TARGET) -> list[dict]:
    """The thesis convolution chains C1-C8 on `target_name`: superopt's program against the captured one
    lowered op by op (symbolic runs), whether the chain fused (one cube stage keeping the first result on
    chip) and with which tiles, and the optimize time."""
    target = load_target(target_name)
    out = []
    for name in names:
        progress.note(f"[npu] conv chain {name} on {target_name}")
        w = conv_chain(name)
        start = time.perf_counter()
        spec = superopt(w.fn, target=target_name, cache=False).compile(*w.args)
        seconds = time.perf_counter() - start
        precision = default_precision(spec.original, target)
        unfused = NpuExecutable(spec.original, target, precision=precision).estimate()
        optimized = unfused if spec.npu is None else spec.npu.estimate()
        chain = next((label.split(": ", 1)[1] for label, _ in optimized.results if "convolution chain" in label), "")
        out.append({"name": name.upper(), "shape": w.description.split(": ", 1)[1].removesuffix(" (f32)"),
                    "outcome": spec.report.outcome, "chain": chain, "unfused": unfused.cycles,
                    "optimized": optimized.cycles, "unfused_bytes": unfused.gm_bytes, "bytes": optimized.gm_bytes,
                    "seconds": seconds})
    return out


def render_convs(rs: list[dict], target_name: str = CONV_TARGET) -> list[str]:
    fused = [r for r in rs if r["chain"]]
    faster = [r for r in fused if r["optimized"] < r["unfused"]]
    lines = ["| chain | shape | outcome | fused cube stage | cycles unfused | cycles optimized | speedup | "
             "GM MB unfused | GM MB optimized | optimize (s) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        lines.append(f"| {r['name']} | {r['shape']} | {r['outcome']} | {r['chain'] or 'none: runs apart'} | "
                     f"{r['unfused']} | {r['optimized']} | {r['unfused'] / r['optimized']:.2f}x | "
                     f"{r['unfused_bytes'] / 1e6:.1f} | {r['bytes'] / 1e6:.1f} | {r['seconds']:.1f} |")
    return ["", f"## Convolution chains C1-C8 on the NPU emulator ({target_name})", "",
            "The thesis convolution chains (NHWC, batch 1, f32, SAME padding, weights as arguments): superopt's "
            "program against the captured program lowered op by op, both on the emulator in symbolic mode at "
            "the precision the emulator runs them (fp32 cube operands on the 910B). A convolution of a "
            "convolution's result may take its input from the kernel's body (rule `chain-conv`); where the "
            "second is 1x1 with stride 1 the pair is a GEMM chain over the first's patch matrix; where the "
            "first is 1x1 and the second has stride 1, the kernel runs by bands of output rows, each band's "
            "first result and its halo of rows computed into L1 and the second taken from there as shifted "
            "GEMMs. The NPU model decides whether it runs as one cube stage (the first result kept in L1) or "
            "apart. "
            "Reproduce with `python -m bench.run --sections npu --filter conv-chain`.", "",
            f"{len(fused)} of {len(rs)} fuse; {len(faster)} of them in fewer cycles than op by op"
            + "".join(f"; {r['name']} runs apart ({r['shape']})" for r in rs if not r["chain"]) + ".", "",
            *lines]


def render(prs: list[dict], rs: list[dict], timeline: str | None = TIMELINE) -> list[str]:
    """The BENCHMARKS.md sections for whole programs (`prs`, from `program_rows`) and chains (`rs`, from
    `rows`); either may be empty."""
    out = []
    if prs:
        out += render_programs(prs, timeline)
    if rs:
        out += render_chains(rs)
    return out


def render_programs(prs: list[dict], timeline: str | None = TIMELINE) -> list[str]:
    shown = timeline and any(r["name"] == "bert-encoder-128" and r["target"] == "npu-910b" for r in prs)
    return ["", "## Programs on the NPU emulator", "",
            *[line.strip() for line in __doc__.split("\n\n", 2)[1].splitlines()], "",
            "Cycles are the sum of the stages' (each stage waits for the one before; launch overhead not "
            "included); utilisation is busy cycles over cycles x the cores that have the queue (npu-910b: 24 cube "
            "cores with MTE1 and the cube, 48 vector cores with the vector unit and MTE3, MTE2 on all 72; "
            "npu-910: 32 cores with all six queues). A matmul operand computed in a kernel and the ops after its last "
            "matmul are vector stages that exchange data with the cube through GM (the 910B's own path; on "
            "the 910 an upper bound). Reproduce with `python -m bench.npu`.", "",
            program_markdown(prs), "",
            *([f"The timeline of BERT-128 on npu-910b (first two cube and vector cores; dotted lines between "
               f"stages): ![timeline]({timeline})", ""] if shown else [])]


def render_chains(rs: list[dict]) -> list[str]:
    speedups = sorted(r["unfused"] / r["fused"] for r in rs)
    return ["", "## GEMM chains on the NPU emulator (npu-910)", "",
            *[line.strip() for line in __doc__.split("\n\n", 2)[2].splitlines()], "",
            f"Fused over unfused cycles: {speedups[0]:.2f}x to {speedups[-1]:.2f}x. The fused kernels' GM bytes "
            "equal the tiling's modelled volume exactly (tests/test_npu_emulator.py). Reproduce with "
            "`python -m bench.npu`.", "", markdown(rs)]


def main() -> list[str]:
    """The BENCHMARKS.md sections, all programs and chains."""
    return render(program_rows(), rows()) + render_convs(conv_rows())


if __name__ == "__main__":
    print("\n".join(main()))
