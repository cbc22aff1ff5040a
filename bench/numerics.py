"""What the numerics contract costs: workloads whose program changes between `numerics="strict"` (the
default) and `numerics="fast"`, with the model estimate and the measured time of each.

    python -m bench.numerics [--filter REGEX]

A workload appears when the two modes choose different programs: strict leaves out the rewrites that are
equal over the reals but may overflow where the original does not (re-associating matrix products, moving a
scale across one, ...), so its program is what superopt runs by default, and fast's is the figure under the
opt-in. Times: jax.jit, the strict program and the fast program timed interleaved in one process, medians
of `repeats` calls per round, median over rounds.
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys


def row(name: str, target: str = "cpu", repeats: int = 9, rounds: int = 3) -> dict | None:
    """The workload's figures under both modes, or None when both choose the same program."""
    import jax
    from superopt.workloads import WORKLOADS
    from superopt import superopt
    from superopt.core.ir import pretty
    from superopt.numerics import MODES
    from superopt.timing import interleaved_medians
    wl = WORKLOADS[name]()
    fast = {mode: superopt(wl.fn, target=target, backend="jax", numerics=mode) for mode in MODES}
    specs = {mode: f.compile(*wl.args) for mode, f in fast.items()}
    if pretty(specs["strict"].term) == pretty(specs["fast"].term):
        return None
    thunks = {"jax.jit": (lambda f=jax.jit(wl.fn): f(*wl.args))}
    thunks.update({mode: (lambda f=f: f(*wl.args)) for mode, f in fast.items()})
    samples = [interleaved_medians(thunks, repeats=repeats) for _ in range(rounds)]
    out = {"name": name, "rounds": rounds, "repeats": repeats}
    for mode, spec in specs.items():
        rep = spec.report
        out[mode] = {"outcome": rep.outcome, "estimate": rep.speedup_estimate,
                     "ratio": statistics.median(s[mode] / s["jax.jit"] for s in samples),
                     "overflow_rewrites": dict(rep.overflow_rewrites)}
    return out


def render(rows: list[dict], considered: int) -> list[str]:
    lines = ["", "## Numerics: strict (default) against fast", "",
             "superopt's default, `numerics=\"strict\"`, runs only rewrites that keep the numerics contract "
             "(README.md): finite and NaN results exactly where the original has them. `numerics=\"fast\"` also "
             "runs rewrites that are equal over the reals but may overflow where the original does not. "
             f"Of the {considered} workloads of the main table, {len(rows)} "
             f"{'gets' if len(rows) == 1 else 'get'} a different program under fast (below); every other "
             "workload's program is the same in both modes. Ratios are superopt's time over "
             "jax.jit's (below 1 is faster), the three timed interleaved in one process.", ""]
    if not rows:
        return lines
    lines += ["| workload | strict: outcome | strict: model | strict / jax.jit | fast: outcome | fast: model | "
              "fast / jax.jit | fast-only rewrites that fired |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s, f = r["strict"], r["fast"]
        fired = ", ".join(f"{n}×{k}" for n, k in sorted(f["overflow_rewrites"].items())) or "none"
        lines.append(f"| {r['name']} | {s['outcome']} | {s['estimate']:.2f}x | {s['ratio']:.3f} | {f['outcome']} | "
                     f"{f['estimate']:.2f}x | {f['ratio']:.3f} | {fired} |")
    return lines


def main(names: list[str]) -> list[str]:
    rows = [r for r in (row(n) for n in names) if r is not None]
    return render(rows, len(names))


if __name__ == "__main__":
    from superopt.workloads import WORKLOADS
    ap = argparse.ArgumentParser(prog="python -m bench.numerics", description=__doc__.splitlines()[0])
    ap.add_argument("--filter", help="regex over workload names")
    ns = ap.parse_args()
    chosen = [n for n in WORKLOADS if ns.filter is None or re.search(ns.filter, n)]
    print("\n".join(main(chosen)))
    sys.exit(0)
