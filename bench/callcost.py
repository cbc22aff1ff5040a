"""What a call costs: superopt's callable against jax.jit of the same function, on tiny programs where the
call itself is most of the time.

    python -m bench.callcost [--calls N] [--samples S]

Each sample times `--calls` back-to-back calls of one callable (the last result waited for) and divides:
the per-call cost, dispatch included. The callables alternate sample by sample in one process, so drift
hits both alike; the table gives the median per-call time of each over `--samples` samples and the median
of the per-sample ratios. superopt's callable is warmed first (its one optimization is not timed).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time


NAMES = ("dot-sum", "gelu-scale", "dense-relu")


def programs():
    """(name, description, fn, args): three tiny programs, as small kernels in real code are."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    rng = np.random.default_rng(0)
    v = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)   # noqa: E731
    w = {"w": v(16, 16), "b": v(16)}
    return [
        ("dot-sum", "sum(a * b), 16 floats", lambda a, b: jnp.sum(a * b), (v(16), v(16))),
        ("gelu-scale", "tanh-GELU of 64 floats times 2", lambda x: jax.nn.gelu(x) * 2.0, (v(64),)),
        ("dense-relu", "relu(x @ w + b), 4x16 @ 16x16, params as a dict (pytree)",
         lambda p, x: jax.nn.relu(x @ p["w"] + p["b"]), (w, v(4, 16))),
    ]


def per_call(fn, args, calls: int) -> float:
    import jax
    start = time.perf_counter()
    for _ in range(calls - 1):
        fn(*args)
    jax.block_until_ready(fn(*args))
    return (time.perf_counter() - start) / calls


def rows(calls: int = 2000, samples: int = 15) -> list[dict]:
    import jax
    from superopt import superopt
    out = []
    for name, what, fn, args in programs():
        jitted, fast = jax.jit(fn), superopt(fn)
        jax.block_until_ready(jitted(*args))
        jax.block_until_ready(fast(*args))           # optimizes once
        for _ in range(3):                           # warm both paths
            per_call(jitted, args, calls // 10 or 1)
            per_call(fast, args, calls // 10 or 1)
        t_jit, t_opt = [], []
        for _ in range(samples):
            t_jit.append(per_call(jitted, args, calls))
            t_opt.append(per_call(fast, args, calls))
        out.append({"name": name, "what": what, "outcome": fast.report.outcome,
                    "jit_us": statistics.median(t_jit) * 1e6, "superopt_us": statistics.median(t_opt) * 1e6,
                    "ratio": statistics.median(o / j for o, j in zip(t_opt, t_jit))})
    return out


def render(data: list[dict], calls: int, samples: int) -> list[str]:
    lines = ["", "## Call cost against jax.jit", "",
             "A steady-state call of `superopt(fn)` dispatches through jax.jit's compiled fast path: the "
             "callable's class calls the jitted function itself, so no Python frame of superopt's runs per "
             f"call. Each sample times {calls} back-to-back calls; the two callables alternate sample by sample "
             f"in one process; medians over {samples} samples (`python -m bench.callcost`). A ratio is "
             "superopt's per-call time over jax.jit's, the median of the per-sample ratios.", "",
             "| program | superopt's outcome | jax.jit per call | superopt per call | superopt / jax.jit |",
             "|---|---|---|---|---|"]
    for r in data:
        lines.append(f"| {r['name']}: {r['what']} | {r['outcome']} | {r['jit_us']:.2f} us | "
                     f"{r['superopt_us']:.2f} us | {r['ratio']:.3f} |")
    return lines


def main(argv: list[str] | None = None) -> list[str]:
    ap = argparse.ArgumentParser(prog="python -m bench.callcost", description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per sample (default 2000)")
    ap.add_argument("--samples", type=int, default=15, help="samples per callable (default 15)")
    ns = ap.parse_args([] if argv is None else argv)
    if ns.calls < 1 or ns.samples < 1:
        raise SystemExit("bench.callcost: --calls and --samples must be at least 1")
    return render(rows(ns.calls, ns.samples), ns.calls, ns.samples)


if __name__ == "__main__":
    print("\n".join(main(sys.argv[1:])))
