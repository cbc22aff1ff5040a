"""Synthesized rules: what `superopt rules synthesize` finds, how long it takes, how much of
rulesets/algebra.py it rediscovers, and what its rules do to the everyday kernels (bench/everyday.py).

    python -m bench.synthesis [--jobs J] [--samples S] [--output BENCHMARKS.md]

Each kernel is optimized twice per numerics mode, with the default rule sets and with the synthesized
rules added to them; where the model finds a cheaper program with the synthesized rules, the two
programs and jax.jit are timed, alternating sample by sample (`bench/callcost.py:per_call`).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time


def run(jobs: int = 2, samples: int = 7) -> dict:
    import jax
    from bench.callcost import per_call
    from bench.everyday import kernels
    from superopt import superopt
    from superopt.report import Outcome
    from superopt.rewrites import synthesis
    from superopt.rulesets import ALGEBRA, DEFAULT
    found = synthesis.synthesize(jobs=jobs)
    derived = synthesis.rediscovered(found, synthesis.hand_written_in_language(ALGEBRA))
    extra = found.ruleset()
    rows = []
    for name, fn, args in kernels():
        for mode in ("strict", "fast"):
            base = superopt(fn, cache=False, numerics=mode)
            more = superopt(fn, cache=False, numerics=mode, rulesets=DEFAULT + (extra,))
            costs = []
            for f in (base, more):
                r = f.compile(*args).report
                costs.append(r.cost_after if r.kind is Outcome.OPTIMIZED else r.cost_before)
            if not costs[1] < costs[0] * 0.97:
                continue
            fired = sorted((k for k, n in more.report.run.matches.items() if n and k.startswith("synth-")),
                           key=_number)
            jitted = jax.jit(fn)
            for f in (jitted, base, more):
                jax.block_until_ready(f(*args))
            calls = max(1, int(0.02 / max(per_call(jitted, args, 3), 1e-7)))
            times = {k: [] for k in ("jit", "base", "more")}
            for _ in range(samples):
                for k, f in (("jit", jitted), ("base", base), ("more", more)):
                    times[k].append(per_call(f, args, calls))
            med = {k: statistics.median(v) for k, v in times.items()}
            rows.append(dict(name=name, mode=mode, cost=costs, fired=fired, **med))
            print(f"{name:22s} {mode:6s} model {costs[0]:.3g} -> {costs[1]:.3g}  jit {med['jit'] * 1e6:.1f} us  "
                  f"default {med['base'] * 1e6:.1f} us  with synthesized {med['more'] * 1e6:.1f} us  {fired}",
                  flush=True)
    npu = []
    for name, fn, args in kernels():
        for mode in ("strict", "fast"):
            cycles, fired = [], []
            for rulesets in (DEFAULT, DEFAULT + (extra,)):
                f = superopt(fn, cache=False, numerics=mode, target=NPU, rulesets=rulesets)
                spec = f.compile(*args)
                cycles.append(spec.npu.estimate().cycles if spec.npu is not None else None)
                fired = [k for k, n in f.report.run.matches.items() if n and k.startswith("synth-")]
            if None not in cycles and cycles[1] < cycles[0]:
                npu.append(dict(name=name, mode=mode, cycles=cycles, fired=sorted(fired, key=_number)))
                print(f"{name:22s} {mode:6s} {NPU} cycles {cycles[0]} -> {cycles[1]}  {fired}", flush=True)
    return dict(found=found, derived=derived, rows=rows, npu=npu, jobs=jobs, samples=samples)


NPU = "npu-910b"


def _number(name: str) -> int:
    return int(name.split("-")[1])


def render(data: dict) -> list[str]:
    from superopt.rewrites.synthesis import show
    found, derived, rows = data["found"], data["derived"], data["rows"]
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    labels = {k: sum(r[2] == k for r in found.rules) for k in ("exact", "rounding", "reals")}
    stages = ", ".join(f"{k} {v:.0f} s" for k, v in found.stages.items() if v >= 0.5)
    lines = ["", "## Synthesized rules", "",
             f"Run: {when} (UTC), `python -m bench.synthesis --jobs {data['jobs']}`, on the 2-core development "
             f"machine. `superopt rules synthesize` (rewrites/synthesis.py) enumerated {found.terms} terms in "
             f"{found.classes} classes of equal values over its language (x, y, z, 0, 1; neg, abs, exp, log, "
             f"sqrt, rsqrt, x**2, transpose; add, sub, mul, div, max, min, matmul: every op to 4 nodes; matmul, "
             f"transpose and add to 5; exp, log, add and mul to 5). Of {found.candidates} candidate "
             f"equalities, {found.derivable} were derivable from rules kept before them and {found.refuted} "
             f"refuted by the checker; it kept "
             f"**{len(found.rules)} rules** ({labels['exact']} exact, {labels['rounding']} rounding, "
             f"{labels['reals']} reals) in **{found.seconds:.0f} s** ({stages}), with {data['jobs']} checker "
             "processes.", "",
             f"- Rediscovered: **{sum(derived.values())} of the {len(derived)}** rules of `rulesets/algebra.py` whose "
             "ops all lie in the language (a rule counts when saturation with the synthesized rules joins its "
             "two sides)."]
    missing = sorted(k for k, v in derived.items() if not v)
    if missing:
        lines.append(f"- Not rediscovered: {', '.join(f'`{m}`' for m in missing)}.")
    lines += ["", "Everyday kernels (bench/everyday.py) whose modelled cost drops by more than 3% once the "
              "synthesized rules join the default rule sets, timed against the default program and jax.jit "
              f"(per-call medians of {data['samples']} alternating samples):", ""]
    by_name = {r[3].name: r for r in found.rules}

    def fired(names):
        return "; ".join(f"`{k}` {show(by_name[k][0])} -> {show(by_name[k][1])}" for k in names[:4] if k in by_name)

    if not rows:
        lines.append("None.")
    else:
        lines += ["| kernel | numerics | model cost default -> with synthesized | jax.jit | default | with "
                  "synthesized | synthesized rules that fired |", "|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['name']} | {r['mode']} | {r['cost'][0]:.3g} -> {r['cost'][1]:.3g} | "
                         f"{r['jit'] * 1e6:.1f} us | {r['base'] * 1e6:.1f} us | {r['more'] * 1e6:.1f} us | "
                         f"{fired(r['fired'])} |")
    lines += ["", f"The same kernels on {NPU}: those whose emulator cycles (a symbolic run of the NPU program, "
              "`NpuExecutable.estimate`) drop once the synthesized rules join the default rule sets:", ""]
    if not data["npu"]:
        lines.append("None.")
        return lines
    lines += ["| kernel | numerics | cycles default -> with synthesized | speedup | synthesized rules that fired |",
              "|---|---|---|---|---|"]
    for r in data["npu"]:
        a, b = r["cycles"]
        lines.append(f"| {r['name']} | {r['mode']} | {a} -> {b} | {a / b:.2f}x | {fired(r['fired'])} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=7)
    ap.add_argument("--output", help="write the section to this file instead of printing it")
    ns = ap.parse_args(argv)
    emit(render(run(ns.jobs, ns.samples)), ns.output)
    return 0


def emit(lines: list[str], output: str | None) -> None:
    """A section's lines, to the file `output` or else to stdout."""
    text = "\n".join(lines) + "\n"
    if output:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    raise SystemExit(main())
