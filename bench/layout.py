"""Layout packing of a linear layer y = x @ W with constant weights.

On the NPU emulator (symbolic mode, npu-910b and npu-910, fp16): the ND matmul the extractor keeps,
against the same product on fractals, unpack(fractal_matmul(pack(x, ZZ), pack(W, ZN)), NZ), once with
W packed when the program is built (hoisted: a constant sub-term) and once with W packed on every call
(a TransData stage on the vector unit). Cycles are the sum of the stages' (each waits for the one before),
launch overhead not included; the cost model's figure for each program is beside it.

On the CPU (f32): median wall time of superopt's program (the default rule sets, layout included)
against jax.jit of the same function, and of the fractal form lowered to JAX with hoisted and with
per-call weight packing.

    python -m bench.layout [--repeats N] [--rounds R]
"""
from __future__ import annotations

import argparse
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from superopt import superopt
from superopt.egraph.capture import capture
from superopt.egraph.encode import encode
from superopt.egraph.frozen import freeze
from superopt.egraph.ir import Graph, Node
from superopt.egraph.layout import fractal_matmul_shape, packed_shape
from superopt.egraph.runner import saturate
from superopt.extract.greedy import extract, program_cost
from superopt.extract.target import load_target
from superopt.lowering.jax import lower
from superopt.lowering.npu.lower import NpuExecutable
from superopt.rewrites.schedule import Schedule
from superopt.rulesets import DEFAULT
from superopt.timing import interleaved_medians

SHAPES = {  # name: (M, K, N)
    "BERT-base QKV projection, seq 128": (128, 768, 768),
    "BERT-base FFN up-projection, seq 128": (128, 768, 3072),
    "ragged 100x200 @ 200x300": (100, 200, 300),
}
TARGETS = ("npu-910b", "npu-910")


def linear(m: int, k: int, n: int, dtype: str, form: str) -> tuple[Graph, np.ndarray]:
    """x @ W as a Graph: form "nd" (matmul), "prepacked" (fractal, W a constant) or "per-call" (fractal,
    W an argument packed on every call)."""
    w = np.random.default_rng(1).standard_normal((k, n)).astype(dtype)
    const = form != "per-call"
    g = Graph(consts=[w] if const else [], n_args=1 if const else 2)
    x = g.add(Node("arg", (), (0,), (m, k), dtype))
    wn = g.add(Node("const", (), (0,), (k, n), dtype) if const else Node("arg", (), (1,), (k, n), dtype))
    if form == "nd":
        g.outputs = [g.add(Node("matmul", (x, wn), (), (m, n), dtype))]
        return g, w
    px = g.add(Node("pack", (x,), ("ZZ",), packed_shape("ZZ", (m, k)), dtype))
    pw = g.add(Node("pack", (wn,), ("ZN",), packed_shape("ZN", (k, n)), dtype))
    prod = g.add(Node("fractal_matmul", (px, pw), (), fractal_matmul_shape(g.nodes[px].shape, g.nodes[pw].shape),
                      dtype))
    g.outputs = [g.add(Node("unpack", (prod,), ("NZ",), (m, n), dtype))]
    return g, w


def chosen_ops(m: int, k: int, n: int, dtype: str, target: str) -> str:
    """What the extractor picks for x @ W (W constant) under the default rule sets."""
    w = jnp.asarray(np.random.default_rng(1).standard_normal((k, n)), dtype)
    graph = capture(lambda x: x @ w, (jnp.zeros((m, k), dtype),)).graph
    enc = encode(graph)
    saturate(enc.egraph, Schedule.of(*DEFAULT))
    ops = extract(freeze(enc.egraph), enc, load_target(target)).graph.op_counts()
    return "packed" if "fractal_matmul" in ops else ("ND matmul" if "matmul" in ops or "kernel" in ops else str(ops))


def npu_rows() -> list[str]:
    lines = ["| linear layer | target | ND matmul | fractal, W prepacked (hoisted) | fractal, W packed per call | "
             "W packing per call | model: ND / prepacked / per call | extractor picks |",
             "|---|---|---:|---:|---:|---:|---|---|"]
    for name, (m, k, n) in SHAPES.items():
        for tname in TARGETS:
            target = load_target(tname)
            cycles, model = {}, {}
            for form in ("nd", "prepacked", "per-call"):
                g, _ = linear(m, k, n, "float16", form)
                cycles[form] = NpuExecutable(g, target).estimate().cycles
                model[form] = program_cost(g, target)[0] * 1e6
            saved = cycles["per-call"] - cycles["prepacked"]
            lines.append(f"| {name} | {tname} | {cycles['nd']} | {cycles['prepacked']} | {cycles['per-call']} | "
                         f"{saved} ({saved / cycles['per-call']:.0%}) | {model['nd']:.1f} / {model['prepacked']:.1f} "
                         f"/ {model['per-call']:.1f} us | {chosen_ops(m, k, n, 'float16', tname)} |")
    return lines


def cpu_rows(repeats: int, rounds: int) -> list[str]:
    lines = ["| linear layer | jax.jit | superopt (default rule sets) | jit / superopt | fractal in JAX, W prepacked | "
             "fractal in JAX, W packed per call |", "|---|---:|---:|---:|---:|---:|"]
    for name, (m, k, n) in SHAPES.items():
        x = np.random.default_rng(2).standard_normal((m, k)).astype(np.float32)
        w = np.random.default_rng(1).standard_normal((k, n)).astype(np.float32)
        fn = lambda a, w=jnp.asarray(w): a @ w   # noqa: E731
        base, opt = jax.jit(fn), superopt(fn, target="cpu")
        prepacked = lower(linear(m, k, n, "float32", "prepacked")[0])
        per_call = lower(linear(m, k, n, "float32", "per-call")[0])
        thunks = {"jit": lambda: base(x), "superopt": lambda: opt(x), "prepacked": lambda: prepacked(x),
                  "per-call": lambda: per_call(x, w)}
        runs = [interleaved_medians(thunks, repeats=repeats, warmup=3) for _ in range(rounds)]
        us = {key: statistics.median(r[key] for r in runs) * 1e6 for key in thunks}
        ratio = statistics.median(r["jit"] / r["superopt"] for r in runs)
        lines.append(f"| {name} | {us['jit']:.0f} us | {us['superopt']:.0f} us ({opt.report.outcome}) | {ratio:.2f}x | "
                     f"{us['prepacked']:.0f} us | {us['per-call']:.0f} us |")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=21, help="timed calls per program and round (median)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of interleaved timing (median over rounds)")
    args = parser.parse_args(argv)
    print("NPU emulator cycles (symbolic, fp16), one linear layer y = x @ W, W constant\n")
    print("\n".join(npu_rows()))
    print(f"\nCPU wall time (f32): median over {args.rounds} rounds of the median of {args.repeats} interleaved "
          f"calls (3 warm-up calls per round)\n")
    print("\n".join(cpu_rows(args.repeats, args.rounds)))


if __name__ == "__main__":
    main()
