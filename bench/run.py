"""Benchmark superopt against plain ``jax.jit`` and write ``BENCHMARKS.md``.

Usage (from the repository root; ``make bench`` runs the default)::

    python -m bench.run [--filter REGEX] [--repeats N] [--rounds R] [--output BENCHMARKS.md]

For each workload, in one process: time ``superopt(fn).compile(*args)`` (the
optimizer itself), then run ``R`` rounds of interleaved timing of
``jax.jit(fn)`` against the optimized callable (median of ``N`` runs after
warm-up per round) and report the median over rounds.  Figures are written
exactly as measured.
"""
from __future__ import annotations

import argparse
import datetime
import re
import shlex
import statistics
import sys
import time

import jax

from bench.programs import WORKLOADS
from superopt import superopt
from superopt.timing import interleaved_medians

DEFAULT_WORKLOADS = ["reassoc-chain", "qkv-projection", "gemm-chain-g1", "gemm-chain-g4",
                     "gemm-chain-g10", "bert-encoder-128", "resnet-bottleneck"]
MAX_RULES_SHOWN = 6


def measure(name: str, repeats: int, rounds: int) -> dict:
    """Optimize one workload and time it against jax.jit; return one table row's figures."""
    wl = WORKLOADS[name]()
    args = wl.args
    base = jax.jit(wl.fn)
    opt = superopt(wl.fn, target="cpu")

    start = time.perf_counter()
    opt.compile(*args)
    optimize_s = time.perf_counter() - start
    rep = opt.report
    st = rep.stage_seconds
    sat_extract_s = st.get("saturate", 0.0) + st.get("freeze", 0.0) + st.get("extract", 0.0)

    thunks = {"jax.jit": lambda: base(*args), "superopt": lambda: opt(*args)}
    jit_t, opt_t, ratios = [], [], []
    for _ in range(rounds):
        m = interleaved_medians(thunks, repeats=repeats)
        jit_t.append(m["jax.jit"])
        opt_t.append(m["superopt"])
        ratios.append(m["superopt"] / m["jax.jit"])

    return {
        "name": wl.name, "description": wl.description, "outcome": rep.outcome,
        "fired": dict(rep.run.fired), "stop": rep.run.stop_reason.value,
        "iterations": rep.run.iterations, "enodes": rep.run.enodes,
        "optimize_s": optimize_s, "sat_extract_s": sat_extract_s,
        "estimate": rep.speedup_estimate,
        "jit_ms": statistics.median(jit_t) * 1e3, "opt_ms": statistics.median(opt_t) * 1e3,
        "ratio": statistics.median(ratios),
    }


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _rules(fired: dict) -> str:
    ranked = sorted(fired.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = ", ".join(f"{rule}×{n}" for rule, n in ranked[:MAX_RULES_SHOWN])
    if len(ranked) > MAX_RULES_SHOWN:
        shown += f", +{len(ranked) - MAX_RULES_SHOWN} more"
    return shown or "none"


def _ms(x: float) -> str:
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


COLUMNS = ["workload", "description", "outcome", "rules fired", "stop reason", "iterations",
           "e-nodes", "optimize time (s)", "saturate+extract (s)", "model estimate",
           "jax.jit (ms)", "superopt (ms)", "ratio superopt/jax.jit"]


def render(rows: list[dict], repeats: int, rounds: int, when: str, command: str, extra: list[str] = ()) -> str:
    """The whole BENCHMARKS.md text."""
    lines = [
        "# Benchmarks: superopt vs. jax.jit",
        "",
        f"Run: {when} (UTC).",
        "",
        "## How measured",
        "",
        "Machine: the project's 2-core CPU development machine, CPU only "
        f"(`target=\"cpu\"`); jax {jax.__version__}. Each workload runs in one process: "
        "`superopt(fn, target=\"cpu\").compile(*args)` is timed once by wall clock (optimize time, "
        "all stages), and saturate+extract is the sum of its saturate, freeze and extract stages. "
        "Then `jax.jit(fn)` and the optimized callable are timed interleaved (alternating each "
        f"repeat), each figure the median of {repeats} runs after 2 warm-up runs; this is done "
        f"{rounds} time(s) and the table gives the median over the rounds of each median "
        "time, and the median of the per-round ratios. Model estimate is the cost model's "
        "predicted speedup, cost before / cost after.",
        "",
        ("Reproduce with `make bench`, i.e. `python -m bench.run`." if command == "python -m bench.run"
         else f"Reproduce with `{command}` (`make bench` runs the default set)."),
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" for _ in COLUMNS) + "|",
    ]
    for r in rows:
        if "error" in r:
            cells = [r["name"], r.get("description", ""), f"error: {r['error']}"] + ["—"] * (len(COLUMNS) - 3)
        else:
            cells = [r["name"], r["description"], r["outcome"], _rules(r["fired"]), r["stop"],
                     r["iterations"], r["enodes"], f"{r['optimize_s']:.2f}", f"{r['sat_extract_s']:.2f}",
                     f"{r['estimate']:.2f}x", _ms(r["jit_ms"]), _ms(r["opt_ms"]), f"{r['ratio']:.3f}"]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines += [
        "",
        "## Reading the table",
        "",
        "A ratio below 1 means superopt's program is faster than `jax.jit` of the original. "
        "\"kept original\" means superopt found nothing cheaper under its cost model (or could not "
        "use what it found) and runs the original function under `jax.jit`, so its ratio is about 1 "
        "by construction and any deviation is measurement noise. Rules fired lists the rewrite "
        "rules that matched, with match counts, most frequent first. On the CPU target superopt "
        "lowers to JAX, and XLA fuses elementwise ops by itself: the model estimate prices the original "
        "op by op, so fusion raises it (BERT: 1.96x) far above what is measured against `jax.jit`, "
        "which already fuses. Fusion decisions that differ per target are tested in "
        "`tests/test_fusion.py` and shown in each report.",
        "",
        *extra,
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    ap.add_argument("--filter", help="regex over all workload names (default: the standard list)")
    ap.add_argument("--repeats", type=int, default=9, help="timed runs per round after warm-up")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    ap.add_argument("--output", default="BENCHMARKS.md", help="markdown file to write")
    ap.add_argument("--no-ranking", action="store_true", help="skip the cost-model ranking of chain candidates")
    ap.add_argument("--no-kernels", action="store_true", help="skip the tables of kernels and tiles chosen per target")
    ns = ap.parse_args(argv)

    names = [n for n in WORKLOADS if re.search(ns.filter, n)] if ns.filter else DEFAULT_WORKLOADS
    if not names:
        ap.error(f"no workload matches {ns.filter!r}; known: {', '.join(WORKLOADS)}")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    rows = []
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {name} ...", file=sys.stderr, flush=True)
        try:
            r = measure(name, ns.repeats, ns.rounds)
        except Exception as exc:  # report the failure in the table and carry on
            r = {"name": name, "error": f"{type(exc).__name__}: {exc}"}
            print(f"    FAILED: {r['error']}", file=sys.stderr, flush=True)
        else:
            print(f"    {r['outcome']}; optimize {r['optimize_s']:.2f} s; jax.jit {_ms(r['jit_ms'])} ms, "
                  f"superopt {_ms(r['opt_ms'])} ms, ratio {r['ratio']:.3f}", file=sys.stderr, flush=True)
        rows.append(r)

    extra: list[str] = []
    if not ns.no_kernels:
        from bench.kernels import main as kernels_by_target
        extra += kernels_by_target()
    if not ns.no_kernels:
        from bench.tiling import main as chain_tiles
        extra += chain_tiles()
        from bench.npu import main as npu_chains
        extra += npu_chains()
        from bench.training import main as training_step
        extra += training_step()
    if not ns.no_ranking:
        from bench.ranking import CHAINS, rank_chain, render as render_ranking
        rankings = []
        for name in CHAINS:
            print(f"[ranking] {name} ...", file=sys.stderr, flush=True)
            r = rank_chain(name, repeats=ns.repeats)
            print(f"    {len(r.predicted)} candidates, rho {r.rho:.2f}", file=sys.stderr, flush=True)
            rankings.append(r)
        extra += render_ranking(rankings, ns.repeats)

    command = "python -m bench.run" + "".join(
        f" {flag} {shlex.quote(str(val))}" for flag, val, default in [("--filter", ns.filter, None), ("--repeats", ns.repeats, 9),
                                                    ("--rounds", ns.rounds, 3)]
        if val != default)
    with open(ns.output, "w", encoding="utf-8") as f:
        f.write(render(rows, ns.repeats, ns.rounds, when, command, extra))
    print(f"wrote {ns.output}", file=sys.stderr)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
