"""Limits bound the whole call: long elementwise chains (with a matmul every 100 steps) under
`Limits(seconds=0.5)` and `Limits(seconds=2)`.

Each run is a fresh Python process (`python -m bench.limits --one N SECONDS`), so its wall time is
that of a program's first call: importing nothing more, but compiling the rule sets, tracing and
capturing the function, every stage of superopt, and running the program that comes back (jax.jit
compiling the original where superopt keeps it). Stage seconds are the report's `stage_seconds`;
the table gives the median of `--runs` runs (by wall time) for each row, and the outcome of that run.

    python -m bench.limits                      # 2,000 and 20,000 ops, 0.5 s and 2 s, median of 3
    python -m bench.limits --sizes 2000 --runs 1
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

STAGES = ("capture", "encode", "saturate", "extract", "lower", "verify")


def chain(n_ops: int):
    """About `n_ops` jaxpr equations: sin, scale and shift per step, tanh(h @ w) every 100 steps."""
    import jax.numpy as jnp

    def program(x, w):
        h = x
        for i in range(n_ops // 3):
            h = jnp.sin(h) * 1.0001 + 0.5
            if i % 100 == 99:
                h = jnp.tanh(h @ w)
        return h
    return program


def one(n_ops: int, seconds: float) -> dict:
    """One first call, in this process: wall time, stage seconds, outcome, and whether it is right."""
    import jax
    import numpy as np

    from superopt import superopt
    from superopt.egraph.runner import Limits

    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    w = (rng.standard_normal((16, 16)) * 0.25).astype(np.float32)
    program = chain(n_ops)
    start = time.perf_counter()
    fast = superopt(program, limits=Limits(seconds=seconds))
    out = jax.block_until_ready(fast(x, w))
    wall = time.perf_counter() - start
    expected = jax.jit(program)(x, w)
    report = fast.report
    return {"ops": n_ops, "nodes": sum(report.ops_before.values()), "seconds": seconds, "wall": wall,
            "stages": dict(report.stage_seconds), "outcome": report.outcome,
            "stop": report.run.stop_reason.value,
            "correct": bool(np.allclose(np.asarray(out), np.asarray(expected), rtol=1e-4, atol=1e-4))}


def measure(n_ops: int, seconds: float, runs: int) -> dict:
    results = []
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-m", "bench.limits", "--one", str(n_ops), str(seconds)],
                              capture_output=True, text=True, check=True,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    results.sort(key=lambda r: r["wall"])
    median = dict(results[len(results) // 2])
    median["walls"] = [r["wall"] for r in results]
    median["correct"] = all(r["correct"] for r in results)
    return median


def table(rows: list[dict]) -> str:
    head = "| ops (nodes) | Limits.seconds | " + " | ".join(STAGES) + " | wall (first call) | outcome |"
    lines = [head, "|" + "---|" * (len(STAGES) + 4)]
    for r in rows:
        stages = " | ".join(f"{r['stages'][s]:.2f}" if s in r["stages"] else "-" for s in STAGES)
        right = "" if r["correct"] else " (WRONG RESULT)"
        lines.append(f"| {r['ops']:,} ({r['nodes']:,}) | {r['seconds']:g} | {stages} | {r['wall']:.2f} s | "
                     f"{r['outcome']}{right} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 20000])
    parser.add_argument("--seconds", type=float, nargs="+", default=[0.5, 2.0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--one", nargs=2, metavar=("N_OPS", "SECONDS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(int(args.one[0]), float(args.one[1]))))
        return
    rows = []
    for n in args.sizes:
        for s in args.seconds:
            rows.append(measure(n, s, args.runs))
            print(f"{n} ops, {s:g} s: wall {', '.join(f'{w:.2f}' for w in rows[-1]['walls'])} s",
                  file=sys.stderr, flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
