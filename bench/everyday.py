"""Everyday numeric kernels: small NumPy-style JAX functions of the kinds real code is full of (products and
their diagonals, traces and sums; reductions that are matrix-vector products; Python loops over rows, stacked
back; repeated products and sums; quotient and power identities; identities on a known domain), each run by
superopt on cpu and by jax.jit, interleaved in one process.

    python -m bench.everyday [--samples S] [--output BENCHMARKS.md]

Every axis is 200 (1000 for vectors), float32. Each sample times enough back-to-back calls of one callable
to take about 20 ms and divides (the per-call cost, dispatch included); the callables alternate sample by
sample, so drift hits all alike. The speedup is jax.jit's median per-call time over superopt's. The
optimization itself (a fresh cache each time: `cache=False`) is timed apart, once per kernel and mode:
superopt runs under numerics="strict" (the default) and "fast". Replaces its section of BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

SECTION = "## Everyday numeric kernels"
N, V = 200, 1000      # every matrix axis; vectors


def kernels():
    """(name, fn, args): the suite, written for this benchmark."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    rng = np.random.default_rng(0)
    m = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)   # noqa: E731
    A, B, C = m(N, N), m(N, N), m(N, N)
    x = m(N)
    u, w = m(V), m(V)
    rows = range(N)
    return [
        ("diag-of-product", lambda a, b: jnp.diag(a @ b), (A, B)),
        ("trace-of-product", lambda a, b: jnp.trace(a @ b), (A, B)),
        ("sum-of-product", lambda a, b: jnp.sum(a @ b), (A, B)),
        ("diag-of-gram", lambda a: jnp.diag(a.T @ a), (A,)),
        ("trace-of-three", lambda a, b, c: jnp.trace(a @ b @ c), (A, B, C)),
        ("reduce-as-matvec", lambda a, v: jnp.sum(a * v[None, :], axis=1), (A, x)),
        ("reduce-as-vecmat", lambda a, v: jnp.sum(a * v[:, None], axis=0), (A, x)),
        ("sum-of-outer", lambda a, b: jnp.sum(jnp.outer(a, b)), (u, w)),
        ("matvec-chain", lambda a, b, v: (a @ b) @ v, (A, B, x)),
        ("sum-of-matvecs", lambda a, b, v: a @ v + b @ v, (A, B, x)),
        ("row-loop-dot", lambda a, v: jnp.stack([jnp.sum(a[i] * v) for i in rows]), (A, x)),
        ("row-loop-exp", lambda a: jnp.stack([jnp.exp(a[i]) * 2.0 for i in rows]), (A,)),
        ("column-loop-scale", lambda a, v: jnp.stack([a[:, i] * v[i] for i in rows], axis=1), (A, x)),
        ("stacked-rows-sum", lambda a: jnp.sum(jnp.stack([a[i] for i in rows]), axis=0), (A,)),
        ("halves-concatenated", lambda a: jnp.concatenate([a[:N // 2] * 3.0, a[N // 2:] * 3.0]), (A,)),
        ("repeated-product", lambda v: v * v * v * v, (u,)),
        ("repeated-sum", lambda v: v + v + v + v, (u,)),
        ("power-product", lambda v: v ** 2 * v ** 3, (u,)),
        ("power-of-power", lambda v: (v ** 2) ** 3, (u,)),
        ("square-of-sum", lambda a, b: a * a + 2.0 * a * b + b * b, (A, B)),
        ("exp-product", lambda a, b: jnp.exp(a) * jnp.exp(b), (A, B)),
        ("nested-quotient", lambda a, b, c: a / b / c, (A, B, C)),
        ("quotient-of-scalings", lambda a, b: (a * 3.0) / (b * 3.0), (A, B)),
        ("exp-of-log-positive", lambda a: jnp.exp(jnp.log(jnp.exp(a))), (A,)),
        ("sqrt-squared-nonneg", lambda a: jnp.sqrt(jnp.abs(a)) ** 2, (A,)),
        ("sqrt-of-square", lambda a: jnp.sqrt(jnp.square(a)), (A,)),
        ("abs-of-exp", lambda a: jnp.abs(jnp.exp(a)), (A,)),
        ("relu-of-softplus", lambda a: jnp.maximum(jax.nn.softplus(a), 0.0), (A,)),
        ("softmax-row-sums", lambda a: jnp.sum(jax.nn.softmax(a, axis=1), axis=1), (A,)),
        ("variance", lambda v: jnp.mean((v - jnp.mean(v)) ** 2), (u,)),
        ("normalize-twice", lambda v: (v / jnp.linalg.norm(v)) / jnp.linalg.norm(v / jnp.linalg.norm(v)), (u,)),
        ("log-of-product", lambda a, b: jnp.log(jnp.exp(a) * jnp.exp(b)), (A, B)),
    ]


def measure(samples: int = 21) -> list[dict]:
    """Per kernel: jax.jit, superopt under the default numerics="strict" and under numerics="fast", the
    three callables alternating sample by sample."""
    import jax
    from bench.kernelbench import interleaved, optimized
    from superopt.report import Outcome
    rows = []
    for name, fn, args in kernels():
        jitted = jax.jit(fn)
        modes, seconds = optimized(fn, args)
        med, calls = interleaved({"jit": jitted, **modes}, args, samples)
        row = dict(name=name, jit=med["jit"], calls=calls)
        for mode, f in modes.items():
            r = f.report
            row[mode] = dict(time=med[mode], speedup=med["jit"] / med[mode], optimize=seconds[mode],
                             changed=r.kind is Outcome.OPTIMIZED, why=r.reason or "")
        rows.append(row)
        st, fa = row["strict"], row["fast"]
        print(f"{name:24s} jit {med['jit'] * 1e6:9.1f} us  strict {st['time'] * 1e6:9.1f} us {st['speedup']:5.2f}x"
              f"  fast {fa['time'] * 1e6:9.1f} us {fa['speedup']:5.2f}x  "
              f"{'changed' if st['changed'] else 'kept: ' + st['why'][:50]}  ({st['optimize']:.1f} s)", flush=True)
    return rows


def render(rows: list[dict], samples: int, load: tuple[str, str] = ("?", "?")) -> list[str]:
    from bench.kernelbench import geomean
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime())

    def summary(mode: str) -> tuple[float, list, list]:
        geo = geomean(r[mode]["speedup"] for r in rows)
        changed = [r for r in rows if r[mode]["changed"]]
        return geo, changed, [r for r in changed if r[mode]["speedup"] < 1 / 1.03]

    lines = [SECTION, "",
             f"Run: {when} (UTC), `python -m bench.everyday`, on the 2-core development machine (load average from "
             f"`uptime`: {load[0]} at the start, {load[1]} at the end), cpu target. "
             f"{len(rows)} small kernels written for this benchmark (module doc of `bench/everyday.py`): every axis "
             f"{N}, vectors {V}, float32. Per-call medians of {samples} samples, each about 20 ms of back-to-back "
             "calls, jax.jit and superopt's callables (its call cost included) alternating sample by sample; "
             "speedup = jax.jit's time over superopt's. superopt runs under the default `numerics=\"strict\"` "
             "and under `numerics=\"fast\"` (rewrites equal over the reals, such as re-associating or factoring "
             "a product, which may overflow where the original does not).", ""]
    for mode in ("strict", "fast"):
        geo, changed, slower = summary(mode)
        lines.append(f"- `{mode}`: geometric-mean speedup over jax.jit **{geo:.2f}x**; superopt changed "
                     f"{len(changed)} of the {len(rows)}, {len(slower)} of those more than 3% slower than jax.jit.")
    lines += ["", "| kernel | jax.jit | strict | speedup | program (strict) | optimizing | fast | speedup | "
                  "program (fast) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        st, fa = r["strict"], r["fast"]
        lines.append(f"| {r['name']} | {r['jit'] * 1e6:,.1f} us | {st['time'] * 1e6:,.1f} us | {st['speedup']:.2f}x | "
                     f"{_what(st)} | {st['optimize']:.1f} s | {fa['time'] * 1e6:,.1f} us | {fa['speedup']:.2f}x | "
                     f"{_what(fa)} |")
    lines.append("")
    return lines


def _what(result: dict) -> str:
    from bench.kernelbench import short
    return "changed" if result["changed"] else f"original ({short(result['why'], 60)})"


def main(argv=None) -> int:
    from bench.scale import replace_section
    ap = argparse.ArgumentParser(prog="python -m bench.everyday", description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=21)
    ap.add_argument("--output", default="BENCHMARKS.md")
    ns = ap.parse_args(argv)
    start = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = measure(ns.samples)
    lines = render(rows, ns.samples, (start, ", ".join(f"{x:.2f}" for x in os.getloadavg())))
    print("\n".join(lines))
    replace_section(ns.output, lines, SECTION)
    return 0


if __name__ == "__main__":
    sys.exit(main())
