"""The guard on ordinary data: superopt's guarded programs (extract/guard.py) against jax.jit, on the data programs
see, and where the check fails.

    python -m bench.guard [--samples S] [--output BENCHMARKS.md]

Two programs whose rewrite is equal over the reals only, so that strict numerics runs it behind a check of the
arguments: `((a @ b) @ c) @ v` (a, b, c 768x768, v 768x2; rewritten `a @ (b @ (c @ v))`) and `sum(a @ b)` (768x768;
rewritten as the column sums of a dotted with the row sums of b), float32, cpu target. Each runs on normal and
uniform arguments at scales 1e-3 to 1e3, on weights as model libraries initialize them (flax's Dense kernel
default, jax.nn.initializers.lecun_normal; equinox's Linear, uniform within 1/sqrt(fan_in); neither library is
needed), and on arguments where the check fails (a NaN, an inf, an element past the range's top at 2**(e+1)).
Which side ran is the check's answer on those arguments (lowering/jax.py `guard_passes`), confirmed by the value:
bit for bit the rewritten program's, or jax.jit's. Timing as bench/everyday.py times: each sample times enough
back-to-back calls of one callable to take about 20 ms (at least one) and divides; jax.jit and superopt alternate
sample by sample; per-call medians of wall time. Next to it, the process's CPU time per call (all of XLA's
threads), whose paired ratio moves less than wall time on a machine other jobs share; where the check fails,
three times the samples, since the difference to resolve is a few percent. The machine's load average
(os.getloadavg) is recorded before and after. Replaces its section of BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

SECTION = "## Guard on ordinary data"
N = 768
SCALES = (1e-3, 1e-1, 1.0, 1e1, 1e3)


def programs():
    import jax.numpy as jnp
    return [("((a @ b) @ c) @ v", lambda a, b, c, v: ((a @ b) @ c) @ v, ((N, N), (N, N), (N, N), (N, 2))),
            ("sum(a @ b)", lambda a, b: jnp.sum(a @ b), ((N, N), (N, N)))]


def datasets(shapes, exponent: int):
    """(name, arguments, expected side) per input set: ordinary data (the rewritten side), then arguments on
    which the check fails (the original)."""
    import jax
    import numpy as np
    rng = np.random.default_rng(0)
    out = []
    for kind in ("normal", "uniform"):
        for scale in SCALES:
            draw = (lambda s: rng.standard_normal(s) * scale) if kind == "normal" else \
                (lambda s: rng.uniform(-scale, scale, s))
            out.append((f"{kind}, scale {scale:g}", [draw(s).astype(np.float32) for s in shapes], True))
    keys = iter(jax.random.split(jax.random.key(0), 16))
    lecun = jax.nn.initializers.lecun_normal()
    out.append(("flax Dense init (lecun_normal)", [np.asarray(lecun(next(keys), s)) for s in shapes], True))
    out.append(("equinox Linear init (uniform, 1/sqrt(fan_in))",
                [(rng.uniform(-1, 1, s) / np.sqrt(s[0])).astype(np.float32) for s in shapes], True))
    base = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    for name, value in (("a NaN in the first argument", np.nan), ("an inf in the last argument", np.inf),
                        (f"2**{exponent + 1} in the first argument", 2.0 ** (exponent + 1))):
        args = [x.copy() for x in base]
        which = -1 if "last" in name else 0
        args[which].reshape(-1)[args[which].size // 2] = value
        out.append((name, args, False))
    return out


def _timed(fn, args, calls: int) -> tuple[float, float]:
    """(wall, CPU) seconds per call of `calls` back-to-back calls, the last one waited for."""
    import jax
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls - 1):
        fn(*args)
    jax.block_until_ready(fn(*args))
    return (time.perf_counter() - wall) / calls, (time.process_time() - cpu) / calls


def measure(samples: int = 21) -> tuple[list[dict], tuple, tuple]:
    import jax
    import numpy as np
    from superopt import superopt
    from superopt.lowering.jax import guard_passes, lower
    load_before = os.getloadavg()
    rows = []
    for title, fn, shapes in programs():
        jitted, fast = jax.jit(fn), superopt(fn, cache=False)
        start = time.perf_counter()
        spec = fast.compile(*(jax.ShapeDtypeStruct(s, np.float32) for s in shapes))
        optimize = time.perf_counter() - start
        guard = spec.term.guard
        if guard is None:
            raise SystemExit(f"bench.guard: {title} is not guarded ({spec.report.outcome}; {spec.report.extraction})")
        rewritten = lower(dataclasses.replace(spec.term, guard=None))
        for name, host, expected in datasets(shapes, guard.exponent):
            args = [jax.device_put(x) for x in host]
            passes = guard_passes(spec.term, *args)
            got = np.asarray(jax.block_until_ready(fast(*args)))
            want = np.asarray(jitted(*args))
            side = np.asarray(rewritten(*args)[0]) if passes else want
            same = np.array_equal(got, side, equal_nan=True)
            one = max(_timed(jitted, args, 1)[0], 1e-7)
            calls = max(1, int(0.02 / one))
            _timed(fast, args, calls)
            wall = {"jit": [], "superopt": []}
            cpu = {"jit": [], "superopt": []}
            for _ in range(samples if expected else 3 * samples):
                for key, f in (("jit", jitted), ("superopt", fast)):
                    w, c = _timed(f, args, calls)
                    wall[key].append(w)
                    cpu[key].append(c)
            med = {k: statistics.median(v) for k, v in wall.items()}
            row = dict(program=title, data=name, exponent=guard.exponent, passes=passes, expected=expected,
                       same=same, jit=med["jit"], superopt=med["superopt"], speedup=med["jit"] / med["superopt"],
                       cpu_ratio=statistics.median(s / j for s, j in zip(cpu["superopt"], cpu["jit"])),
                       samples=len(wall["jit"]), optimize=optimize)
            rows.append(row)
            print(f"{title:18s} {name:44s} {'rewritten' if passes else 'original':9s} "
                  f"{'(as its value says)' if same else '(VALUE DIFFERS)'} jit {med['jit'] * 1e3:8.2f} ms  superopt "
                  f"{med['superopt'] * 1e3:8.2f} ms  {row['speedup']:6.2f}x  CPU time {row['cpu_ratio']:.3f} of jit's",
                  flush=True)
    return rows, load_before, os.getloadavg()


def render(rows: list[dict], samples: int, load_before: tuple, load_after: tuple) -> list[str]:
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    load = lambda t: ", ".join(f"{x:.2f}" for x in t)   # noqa: E731
    lines = [SECTION, "",
             f"Run: {when} (UTC), `python -m bench.guard`, on the 2-core development machine, cpu target; load "
             f"average (1, 5, 15 min) {load(load_before)} before and {load(load_after)} after. Two programs that "
             "strict numerics runs behind a check of their arguments (module doc of `bench/guard.py`), float32, "
             f"768 wide; per-call medians of {samples} samples ({3 * samples} where the check fails), jax.jit and "
             "superopt alternating sample by sample; the last column is the median of the paired ratios of the "
             "process's CPU time per call, which other jobs on the machine move less than wall time. "
             "\"ran\" is the check's answer on those arguments (`lowering/jax.py`, `guard_passes`), and superopt's "
             "value equals, bit for bit, that side's (the rewritten program's, or jax.jit's) in every row marked "
             "so. The check passes where every element is finite and at most 2**e in magnitude (e from the "
             "program: no value of either program can overflow); small elements, zeros and subnormals pass, "
             "and their underflow is bounded by the reordered-sum bound's absolute term (README.md, "
             "\"Numerics contract\"). Before that, the check also wanted every nonzero element at least 2**-e in "
             "magnitude, so the chain's weights at scale 0.03 failed it on every call and it ran 1.15x slower "
             "than jax.jit (issue 55).", ""]
    for program in dict.fromkeys(r["program"] for r in rows):
        mine = [r for r in rows if r["program"] == program]
        ordinary = [r for r in mine if r["expected"]]
        failing = [r for r in mine if not r["expected"]]
        lines.append(f"- `{program}`: e = {mine[0]['exponent']} (optimized in {mine[0]['optimize']:.1f} s); on "
                     f"ordinary data {sum(r['passes'] for r in ordinary)} of {len(ordinary)} input sets ran the "
                     f"rewritten program, {min(r['speedup'] for r in ordinary):.1f}x to "
                     f"{max(r['speedup'] for r in ordinary):.1f}x faster than jax.jit; where the check failed, "
                     f"{sum(not r['passes'] for r in failing)} of {len(failing)} ran the original, in "
                     f"{min(r['superopt'] / r['jit'] for r in failing):.3f}x to "
                     f"{max(r['superopt'] / r['jit'] for r in failing):.3f}x jax.jit's wall time (medians) and "
                     f"{min(r['cpu_ratio'] for r in failing):.3f}x to {max(r['cpu_ratio'] for r in failing):.3f}x "
                     f"its CPU time (medians of paired ratios), {sum(r['cpu_ratio'] > 1.05 for r in failing)} of "
                     f"{len(failing)} more than 5% over it.")
    lines += ["", "| program | arguments | ran | value | samples | jax.jit | superopt | speedup | superopt / jax.jit, "
              "CPU time |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['program']}` | {r['data']} | {'rewritten' if r['passes'] else 'original'} | "
                     f"{'that side' + chr(39) + 's' if r['same'] else 'DIFFERS'} | {r['samples']} | "
                     f"{r['jit'] * 1e3:,.2f} ms | {r['superopt'] * 1e3:,.2f} ms | {r['speedup']:.2f}x | "
                     f"{r['cpu_ratio']:.3f} |")
    lines.append("")
    return lines


def main(argv=None) -> int:
    from bench.scale import replace_section
    ap = argparse.ArgumentParser(prog="python -m bench.guard", description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=21)
    ap.add_argument("--output", default="BENCHMARKS.md")
    ns = ap.parse_args(argv)
    rows, before, after = measure(ns.samples)
    lines = render(rows, ns.samples, before, after)
    print("\n".join(lines))
    replace_section(ns.output, lines, SECTION)
    wrong = [r for r in rows if r["passes"] != r["expected"] or not r["same"]]
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
