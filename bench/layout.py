"""Layout packing of a linear layer y = x @ W with constant weights.

On the NPU emulator (symbolic mode, npu-910b and npu-910, fp16): the ND matmul against the same product
on fractals, unpack(fractal_matmul(pack(x, ZZ), pack(W, ZN)), NZ), once with W packed when the program
is built (hoisted: a constant sub-term) and once with W packed on every call (a TransData stage on the
vector unit). The 910B's copies convert ND tiles to the cube's fractals on the way in and out; the
910's do not, so there the ND matmul is lowered as TransData stages for x, W and the product around
the cube, on every call. Cycles are the sum of the stages' (each waits for the one before),
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
from superopt.core import progress
from superopt.core.deadline import Deadline
from superopt.core.formats import fractal_matmul_shape, packed_shape
from superopt.core.ir import Graph, Node
from superopt.egraph.capture import capture
from superopt.egraph.runner import Limits
from superopt.extract.greedy import program_cost
from superopt.extract.target import load_target
from superopt.lowering.jax import lower
from superopt.lowering.npu.lower import NpuExecutable
from superopt.stages import Stages, choose, saturate, schedule_of
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
    captured = capture(lambda x: x @ w, (jnp.zeros((m, k), dtype),))
    limits, timer = Limits(), Stages()
    deadline = Deadline(limits.seconds)
    schedule, _ = schedule_of(DEFAULT, "strict")
    saturated = saturate(captured, schedule, limits, deadline, timer, isolated=False)
    ops = choose(saturated, load_target(target), "greedy", None, deadline, limits, timer).graph.op_counts()
    return "packed" if "fractal_matmul" in ops else ("ND matmul" if "matmul" in ops or "kernel" in ops else str(ops))


def npu_data() -> list[dict]:
    """Per linear layer and NPU target: emulator cycles and model microseconds of the three forms, and what
    the extractor picks."""
    out = []
    for name, (m, k, n) in SHAPES.items():
        for tname in TARGETS:
            progress.note(f"[layout] {name} on {tname}")
            target = load_target(tname)
            cycles, model = {}, {}
            for form in ("nd", "prepacked", "per-call"):
                g, _ = linear(m, k, n, "float16", form)
                cycles[form] = NpuExecutable(g, target).estimate().cycles
                model[form] = program_cost(g, target)[0] * 1e6
            out.append({"name": name, "target": tname, "cycles": cycles, "model": model,
                        "picks": chosen_ops(m, k, n, "float16", tname)})
    return out


def npu_rows(data: list[dict] | None = None) -> list[str]:
    lines = ["| linear layer | target | ND matmul | fractal, W prepacked (hoisted) | fractal, W packed per call | "
             "W packing per call | model: ND / prepacked / per call | extractor picks |",
             "|---|---|---:|---:|---:|---:|---|---|"]
    for r in npu_data() if data is None else data:
        cycles, model = r["cycles"], r["model"]
        saved = cycles["per-call"] - cycles["prepacked"]
        lines.append(f"| {r['name']} | {r['target']} | {cycles['nd']} | {cycles['prepacked']} | {cycles['per-call']} | "
                     f"{saved} ({saved / cycles['per-call']:.0%}) | {model['nd']:.1f} / {model['prepacked']:.1f} "
                     f"/ {model['per-call']:.1f} us | {r['picks']} |")
    return lines


def cpu_rows(repeats: int, rounds: int, outcomes: list | None = None) -> list[str]:
    """The CPU table; the superopt outcome and jit/superopt ratio of each layer go to `outcomes`."""
    lines = ["| linear layer | jax.jit | superopt (default rule sets) | jit / superopt | fractal in JAX, W prepacked | "
             "fractal in JAX, W packed per call |", "|---|---:|---:|---:|---:|---:|"]
    for name, (m, k, n) in SHAPES.items():
        progress.note(f"[layout] {name} on cpu")
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
        if outcomes is not None:
            outcomes.append((opt.report.outcome, ratio))
    return lines


def section(repeats: int = 21, rounds: int = 5) -> list[str]:
    """The BENCHMARKS.md section; the sentences under the tables are read off the figures."""
    data = npu_data()
    outcomes: list = []
    cpu = cpu_rows(repeats, rounds, outcomes)
    shares = [(r["cycles"]["per-call"] - r["cycles"]["prepacked"]) / r["cycles"]["per-call"] for r in data]
    kept = sum(o.startswith("kept original") for o, _ in outcomes)
    ratios = [ratio for _, ratio in outcomes]
    fastest = lambda r: "ND matmul" if r["cycles"]["nd"] <= r["cycles"]["prepacked"] else "packed"   # noqa: E731
    per_target = []
    for tname in TARGETS:
        rows_ = [r for r in data if r["target"] == tname]
        winners = {fastest(r) for r in rows_}
        if winners == {"packed"}:
            gains = [1 - r["cycles"]["prepacked"] / r["cycles"]["nd"] for r in rows_]
            per_target.append(f"on {tname} the prepacked form is the fastest in every row ({min(gains):.0%}-"
                              f"{max(gains):.0%} fewer cycles than the ND matmul)")
        elif winners == {"ND matmul"}:
            per_target.append(f"on {tname} the ND matmul is the fastest in every row (packing only adds the "
                              f"activations' conversions)")
        else:
            per_target.append(f"on {tname} the fastest form differs by row")
    agree = sum(r["picks"] == fastest(r) for r in data)
    verdict = "; ".join(per_target) + f". The extractor picks the emulator's fastest form in {agree} of {len(data)} rows."
    return ["", "## Layout packing (NPU formats)", "",
            *[line for par in __doc__.split("\n\n")[1:3] for line in (" ".join(par.split()), "")],
            f"NPU columns: emulator cycles (symbolic, fp16). CPU: medians over {rounds} rounds of the median of "
            f"{repeats} interleaved calls (f32). Reproduce with `python -m bench.layout`.", "",
            *npu_rows(data), "", *cpu, "",
            f"Hoisting the weight pack saves one format conversion per call ({min(shares):.0%}-{max(shares):.0%} of "
            f"the per-call packed program's cycles): {verdict} "
            f"On the CPU superopt kept the original for {kept} of {len(outcomes)} layers (jit / superopt "
            f"{min(ratios):.2f}x to {max(ratios):.2f}x; a kept original differs from jax.jit only by noise)."]


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
