"""The thesis GEMM chains G1-G12 on the NPU emulator (npu-910): the fused chain kernel with the tiles the
extractor chose, against the two GEMMs run apart (each at its own best tiling, C through GM).

Symbolic mode (shapes only): cycles, GM bytes and queue utilisation are what the numeric run gives,
without the arithmetic. Cycles are one kernel's, from first issue to last instruction, over all
cores; launch overhead is not included.
"""
from __future__ import annotations

import sys
import time

from bench.programs import GEMM_CHAIN_SHAPES
from bench.tiling import chosen_kernel
from superopt.extract.cost import one_op_body, tiling_options
from superopt.extract.target import load_target
from superopt.lowering.npu.codegen import chain_program, gemm_program
from superopt.lowering.npu.emulator import emulate

TARGET = "npu-910"
F16 = "float16"


def unfused(b, m, n, k, l, target):
    """(cycles, GM bytes) of C = A @ B then E = C @ D as two kernels, each at its best tiling."""
    cycles = moved = 0
    for a, bb, out in (((b, m, k), (b, k, l), (b, m, l)), ((b, m, l), (b, l, n), (b, m, n))):
        ins = [(a, F16), (bb, F16)]
        options, _ = tiling_options(one_op_body("matmul", (F16,), ins, (out, F16)), ins, (out, F16), target)
        tiling = options[0]
        program = gemm_program(("A", a, F16), ("B", bb, F16), ("C", out, F16), tiling.order, dict(tiling.tiles),
                               target)
        result = emulate(program, target, symbolic=True, trace=False)
        cycles, moved = cycles + result.cycles, moved + result.gm_bytes
    return cycles, moved


def rows() -> list[dict]:
    target = load_target(TARGET)
    out = []
    for name, (b, m, n, k, l) in GEMM_CHAIN_SHAPES.items():
        _, tiling = chosen_kernel(name, TARGET)
        shapes = [("A", (b, m, k)), ("B", (b, k, l)), ("D", (b, l, n)), ("E", (b, m, n))]
        program = chain_program(*[(nm, s, F16) for nm, s in shapes], tiling.order, dict(tiling.tiles), target)
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


def main() -> list[str]:
    """The BENCHMARKS.md section."""
    print("[npu] G1-G12 on the npu-910 emulator ...", file=sys.stderr, flush=True)
    rs = rows()
    speedups = sorted(r["unfused"] / r["fused"] for r in rs)
    return ["", "## GEMM chains on the NPU emulator (npu-910)", "",
            *[line.strip() for line in __doc__.split("\n\n", 1)[1].splitlines()], "",
            f"Fused over unfused cycles: {speedups[0]:.2f}x to {speedups[-1]:.2f}x. The fused kernels' GM bytes "
            "equal the tiling's modelled volume exactly (tests/test_npu_emulator.py). Reproduce with "
            "`python -m bench.npu`.", "", markdown(rs)]


if __name__ == "__main__":
    print("\n".join(main()))
