"""Everyday numeric kernels: small NumPy-style JAX functions of the kinds real code is full of (products and
their diagonals, traces and sums; reductions that are matrix-vector products; Python loops over rows, stacked
back; repeated products and sums; quotient and power identities; identities on a known domain), each run by
superopt on cpu and by jax.jit, interleaved in one process; then identities that hold on a domain only
(`domain_kernels`), each run inside and outside its domain.

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
        ("einsum-by-broadcast", lambda a, b: jnp.sum(a[:, :, None] * b[None, :, :], axis=1), (A, B)),
        ("pairwise-dots-by-broadcast", lambda a, b: jnp.sum(a[:, None, :] * b[None, :, :], axis=2), (A, B)),
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


def domain_kernels():
    """(name, fn, inside, outside): identities that hold on a domain (rulesets/algebra.py, "speculative" and
    "powers"), each with arguments inside it (positive draws, |normal| + 0.1; or normal draws for exp's
    arguments) and outside it (normal draws, with negative elements; or exp's arguments scaled past 43)."""
    import jax.numpy as jnp
    import numpy as np
    rng = np.random.default_rng(1)
    m = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)   # noqa: E731
    P, Q, R = (jnp.abs(m(N, N)) + 0.1 for _ in range(3))
    G, H = m(N, N), m(N, N)
    out = (m(N, N), m(N, N))           # normal draws: half the elements negative
    wide = (G * 100.0, H * 100.0)      # exp's arguments past exp_moderate's 43
    return [
        ("power-one-and-a-half", lambda a: a ** 1.5, (P,), out[:1]),
        ("power-two-and-a-half", lambda a: a ** 2.5, (P,), out[:1]),
        ("quarter-power", lambda a: a ** 0.25, (P,), out[:1]),
        ("three-quarter-power", lambda a: a ** 0.75, (P,), out[:1]),
        ("period-from-axis", lambda a, m_: 6.283 * a ** 1.5 / jnp.sqrt(m_), (P, Q), (out[0], Q)),
        ("sum-of-powers", lambda a, b: a ** 1.5 + b ** 2.5, (P, Q), out),
        ("power-times-log", lambda a: a ** 1.5 * jnp.log(a), (P,), out[:1]),
        ("sum-of-logs", lambda a, b: jnp.log(a) + jnp.log(b), (P, Q), out),
        ("difference-of-logs", lambda a, b: jnp.log(a) - jnp.log(b), (P, Q), out),
        ("exp-of-log", lambda a: jnp.exp(jnp.log(a)) * 2.0, (P,), out[:1]),
        ("exp-of-sum-of-logs", lambda a, b: jnp.exp(jnp.log(a) + jnp.log(b)), (P, Q), out),
        ("exp-of-difference-of-logs", lambda a, b: jnp.exp(jnp.log(a) - jnp.log(b)), (P, Q), out),
        ("product-of-exps", lambda a, b: jnp.exp(a) * jnp.exp(b), (G, H), wide),
        ("quotient-of-exps", lambda a, b: jnp.exp(a) / jnp.exp(b), (G, H), wide),
        ("log-of-scaled-exp", lambda a, b: jnp.log(jnp.exp(a) * b), (G, P), (wide[0], out[1])),
        ("exp-of-shifted-log", lambda a, b: jnp.exp(a + jnp.log(b)), (G, P), (wide[0], out[1])),
        ("product-of-sqrts", lambda a, b: jnp.sqrt(a) * jnp.sqrt(b), (P, Q), out),
        ("quotient-of-sqrts", lambda a, b: jnp.sqrt(a) / jnp.sqrt(b), (P, R), out),
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


def measure_domain(samples: int = 21) -> list[dict]:
    """Per domain kernel, inside and outside its domain: jax.jit and superopt under numerics="strict", alternating;
    which side of its guard superopt's program ran (`guard_passes`), and whether its values are jax.jit's
    bit for bit outside the domain."""
    import jax
    import numpy as np
    from bench.kernelbench import interleaved, optimized
    from superopt.lowering.jax import guard_passes
    from superopt.report import Outcome
    rows = []
    for name, fn, inside, outside in domain_kernels():
        jitted = jax.jit(fn)
        modes, seconds = optimized(fn, inside, modes=("strict",))
        f = modes["strict"]
        term = f._last.term
        row = dict(name=name, changed=f.report.kind is Outcome.OPTIMIZED, why=f.report.reason or "",
                   guarded=term.guard is not None, optimize=seconds["strict"], extraction=str(f.report.extraction or ""))
        for side, args in (("inside", inside), ("outside", outside)):
            med, _ = interleaved({"jit": jitted, "strict": f}, args, samples)
            ran = guard_passes(term, *args) if term.guard is not None else None
            same = bool(np.array_equal(np.asarray(f(*args)), np.asarray(jitted(*args)), equal_nan=True))
            row[side] = dict(jit=med["jit"], time=med["strict"], speedup=med["jit"] / med["strict"], ran=ran,
                             same=same)
        rows.append(row)
        i, o = row["inside"], row["outside"]
        print(f"{name:26s} inside {i['speedup']:5.2f}x (ran {i['ran']})  outside {o['speedup']:5.2f}x (ran {o['ran']}, "
              f"same {o['same']})  {'guarded' if row['guarded'] else 'changed' if row['changed'] else 'kept'}  "
              f"({row['optimize']:.1f} s)", flush=True)
    return rows


def render_domain(rows: list[dict], samples: int) -> list[str]:
    from bench.kernelbench import geomean, short
    taken = [r for r in rows if r["guarded"]]
    lines = ["", "### Identities on a domain", "",
             f"{len(rows)} kernels whose rewrites hold on a domain (rulesets/algebra.py, sections \"speculative\" "
             "and \"powers\"; module doc of `bench/everyday.py`, `domain_kernels`), each run on arguments inside the "
             "domain and outside it, same machine, samples and interleaving as above, `numerics=\"strict\"`. "
             "superopt takes such a rewrite behind a check of the condition on the values it assumed it of, "
             "where the check is predicted to cost at most 5% of the original's time (a call that fails it runs "
             "the check and then the original). \"ran\": the side of the guard the call ran (`guard_passes`); "
             "\"same\": superopt's values outside the domain equal jax.jit's bit for bit.", "",
             f"- guarded programs taken: {len(taken)} of {len(rows)}; inside the domain their geometric-mean speedup "
             f"is **{geomean(r['inside']['speedup'] for r in taken) if taken else 1.0:.2f}x**, outside it "
             f"{geomean(r['outside']['speedup'] for r in taken) if taken else 1.0:.2f}x "
             f"(slowest {min((r['outside']['speedup'] for r in taken), default=1.0):.2f}x).",
             f"- every kernel inside the domain: geometric mean {geomean(r['inside']['speedup'] for r in rows):.2f}x; "
             f"outside it: {geomean(r['outside']['speedup'] for r in rows):.2f}x; values outside equal to "
             f"jax.jit's in {sum(r['outside']['same'] for r in rows)} of {len(rows)}.", "",
             "| kernel | program | inside: jax.jit | superopt | speedup | ran | outside: jax.jit | superopt | "
             "speedup | ran | same |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        i, o = r["inside"], r["outside"]
        what = ("guarded" if r["guarded"] else "changed" if r["changed"] else
                f"original ({short(r['why'] or r['extraction'], 70)})")
        side = lambda s: "-" if s["ran"] is None else "rewritten" if s["ran"] else "original"   # noqa: E731
        lines.append(f"| {r['name']} | {what} | {i['jit'] * 1e6:,.1f} us | {i['time'] * 1e6:,.1f} us | "
                     f"{i['speedup']:.2f}x | {side(i)} | {o['jit'] * 1e6:,.1f} us | {o['time'] * 1e6:,.1f} us | "
                     f"{o['speedup']:.2f}x | {side(o)} | {'yes' if o['same'] else 'no'} |")
    lines.append("")
    return lines


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
    domain = measure_domain(ns.samples)
    lines = render(rows, ns.samples, (start, ", ".join(f"{x:.2f}" for x in os.getloadavg())))
    lines = lines[:-1] + render_domain(domain, ns.samples)
    from bench.kernelbench import geomean
    every = [r["strict"]["speedup"] for r in rows] + [r["inside"]["speedup"] for r in domain]
    slower = [r for r in domain if (r["guarded"] or r["changed"]) and r["inside"]["speedup"] < 1 / 1.03]
    lines += [f"Over both tables ({len(every)} kernels, the domain kernels inside their domain), strict: geometric "
              f"mean **{geomean(every):.2f}x**; {len(slower)} changed domain kernels more than 3% slower than jax.jit "
              "inside their domain.", ""]
    print("\n".join(lines))
    replace_section(ns.output, lines, SECTION)
    return 0


if __name__ == "__main__":
    sys.exit(main())
