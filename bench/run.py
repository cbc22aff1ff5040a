"""Benchmark superopt against plain ``jax.jit`` and write ``BENCHMARKS.md`` and its plots.

Usage (from the repository root; ``make bench`` runs the default)::

    python -m bench.run [--target T] [--filter REGEX] [--sections table,npu,...] [--repeats N] [--rounds R]
                        [--output FILE] [--figures DIR]

A full run (every section, no --filter) writes ``BENCHMARKS.md`` and its plots in ``docs/figures``. A
partial run (``--filter``, or a subset of ``--sections``) writes ``build/bench/BENCHMARKS.partial.md`` and
plots in ``build/bench/figures`` instead, and never touches the tracked files unless ``--output`` (and
``--figures``) name them. On a terminal a progress bar shows; otherwise one line per step goes to stderr.

For each workload of the main table, in one process: time ``superopt(fn, target=T).compile(*args)`` (the
optimizer itself), count kernel launches before and after, run ``R`` rounds of interleaved timing of
``jax.jit(fn)`` against the optimized program on this CPU (median of ``N`` runs after warm-up per
round; the median over rounds is reported), and count NPU emulator cycles of the captured program op by
op and of the program superopt chose for the NPU target. Then the sections: kernels per target, tiles of
the GEMM chains against the analytic optimum, programs and chains on the NPU emulator, the training step,
rematerialization under a memory budget, layout packing, the cost model's ranking, and the cost of a call
against jax.jit's on tiny programs; and the workloads
whose program differs between ``numerics="strict"`` (the default) and ``numerics="fast"``. ``--filter`` selects the workloads of every section by
name (a section with none left is omitted), so a filtered run is quick. Figures are written exactly as
measured.
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import shlex
import statistics
import sys
import time

SECTIONS = ("table", "numerics", "kernels", "tiling", "npu", "training", "remat", "layout", "ranking", "callcost")
MAX_RULES_SHOWN = 6
OUTPUT = "BENCHMARKS.md"                              # a full run's markdown and plots (tracked)
FIGURES = "docs/figures"
PARTIAL_OUTPUT = "build/bench/BENCHMARKS.partial.md"  # a partial run's (build/ is not tracked)
PARTIAL_FIGURES = "build/bench/figures"


def _is_npu(target: str) -> bool:
    return target.startswith("npu")


def _launches(graph) -> int:
    from bench.kernels import census
    return sum(census(graph).values())


def npu_cycles(fn, args, target: str, spec=None) -> dict:
    """Emulator cycles (symbolic) of the captured program op by op and of the program superopt chose for
    the NPU `target` (from `spec` when it was compiled for that target)."""
    from superopt import superopt
    from superopt.extract.target import load_target
    from superopt.lowering.npu.lower import NpuExecutable
    from superopt.npu_backend import default_precision
    spec = spec or superopt(fn, target=target, backend="jax").compile(*args)
    tgt = load_target(target)
    precision = default_precision(spec.original, tgt)   # both programs at the precision the emulator would run
    try:
        before = NpuExecutable(spec.original, tgt, precision=precision).estimate().cycles
        after = before if spec.term is spec.original else \
            NpuExecutable(spec.term, tgt, precision=precision).estimate().cycles
    except Exception as exc:  # a lowering or emulator failure is a finding for the table, not a crash
        return {"npu_target": target, "npu_error": f"{type(exc).__name__}: {exc}"}
    return {"npu_target": target, "npu_unfused": before, "npu_optimized": after}


def prepare(name: str, target: str, npu_target: str) -> tuple[dict, dict]:
    """Optimize one workload for `target` and count its NPU cycles: (its row so far, the thunks to time:
    jax.jit of the function and superopt's program, on the workload's arguments)."""
    import jax
    from superopt.workloads import WORKLOADS
    from superopt import superopt
    wl = WORKLOADS[name]()
    args = wl.args
    base = jax.jit(wl.fn)
    opt = superopt(wl.fn, target=target, backend="jax")

    start = time.perf_counter()
    spec = opt.compile(*args)
    optimize_s = time.perf_counter() - start
    rep = spec.report
    st = rep.stage_seconds
    # A program optimized in segments reports its segments' stages summed, as "saturate (segments)" etc.
    sat_extract_s = sum(st.get(stage, 0.0) + st.get(f"{stage} (segments)", 0.0)
                        for stage in ("saturate", "freeze", "extract"))
    row = {
        "name": wl.name, "description": wl.description, "target": target, "outcome": rep.outcome,
        "fired": dict(rep.run.fired), "stop": rep.run.stop_reason.value,
        "iterations": rep.run.iterations, "enodes": rep.run.enodes,
        "optimize_s": optimize_s, "sat_extract_s": sat_extract_s, "estimate": rep.speedup_estimate,
        "kernels_before": _launches(spec.original), "kernels_after": _launches(spec.term),
        "rounds": [],
    }
    row.update(npu_cycles(wl.fn, args, npu_target, spec if npu_target == target else None))
    return row, {"jax.jit": lambda: base(*args), "superopt": lambda: opt(*args)}


def time_round(row: dict, thunks: dict, repeats: int) -> None:
    """One round of interleaved timing; the row's figures become the medians over its rounds so far."""
    from superopt.timing import interleaved_medians
    m = interleaved_medians(thunks, repeats=repeats)
    row["rounds"].append((m["jax.jit"], m["superopt"]))
    row["jit_ms"] = statistics.median(j for j, _ in row["rounds"]) * 1e3
    row["opt_ms"] = statistics.median(o for _, o in row["rounds"]) * 1e3
    row["ratio"] = statistics.median(o / j for j, o in row["rounds"])


def measure(name: str, target: str, npu_target: str, repeats: int, rounds: int) -> dict:
    """One workload's row: optimized, its NPU cycles counted, timed in `rounds` consecutive rounds."""
    row, thunks = prepare(name, target, npu_target)
    for _ in range(rounds):
        time_round(row, thunks, repeats)
    return row


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _rules(fired: dict) -> str:
    ranked = sorted(fired.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = ", ".join(f"{rule}×{n}" for rule, n in ranked[:MAX_RULES_SHOWN])
    if len(ranked) > MAX_RULES_SHOWN:
        shown += f", +{len(ranked) - MAX_RULES_SHOWN} more"
    return shown or "none"


def _ms(x: float) -> str:
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


SEARCH_COLUMNS = ["workload", "description", "outcome", "stop reason", "iterations", "e-nodes", "optimize time (s)",
                  "saturate+extract (s)", "kernels before -> after", "model estimate", "rules fired"]
RUN_COLUMNS = ["workload", "jax.jit (ms)", "superopt (ms)", "ratio superopt/jax.jit", "ratio per round",
               "NPU cycles unfused", "NPU cycles optimized", "NPU speedup"]


def _table(columns: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|",
            *["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]]


def _npu_cells(r: dict) -> list:
    if "npu_error" in r:
        return [f"not lowered: {r['npu_error'][:90]}", "—", "—"]
    return [r["npu_unfused"], r["npu_optimized"], f"{r['npu_unfused'] / r['npu_optimized']:.2f}x"]


def render_table(rows: list[dict], target: str, npu_target: str, repeats: int, rounds: int,
                 figure: str | None) -> list[str]:
    """The main tables: the search per workload, then the run time on this CPU and the NPU cycles."""
    ok = [r for r in rows if "error" not in r]
    search = [[r["name"], r["description"], r["outcome"], r["stop"], r["iterations"], r["enodes"],
               f"{r['optimize_s']:.2f}", f"{r['sat_extract_s']:.2f}", f"{r['kernels_before']} -> {r['kernels_after']}",
               f"{r['estimate']:.2f}x", _rules(r["fired"])] for r in ok]
    search += [[r["name"], r.get("description", ""), f"error: {r['error']}"] + ["—"] * (len(SEARCH_COLUMNS) - 3)
               for r in rows if "error" in r]
    run = [[r["name"], _ms(r["jit_ms"]), _ms(r["opt_ms"]), f"{r['ratio']:.3f}",
            ", ".join(f"{o / j:.2f}" for j, o in r.get("rounds", ())), *_npu_cells(r)] for r in ok]
    kept = [r for r in ok if r["outcome"].startswith("kept original")]
    changed = [r for r in ok if r not in kept]
    faster = [r["name"] for r in changed if r["ratio"] < 0.97]
    slower = [r["name"] for r in changed if r["ratio"] > 1.03]
    lowered = [r for r in ok if "npu_error" not in r]
    lines = [
        "## Workloads", "",
        f"Each workload is optimized for `target=\"{target}\"`. Optimize time is one wall-clock "
        "`compile(*args)` (all stages); saturate+extract is the sum of its saturate, freeze and extract stages. "
        "Kernels are launches of the program, by the count `bench/kernels.py` makes (constant sub-terms, "
        "computed once, and free views excluded). Model estimate is the cost model's predicted speedup, "
        "cost before / cost after.", "",
        *_table(SEARCH_COLUMNS, search), "",
        f"Run time: `jax.jit(fn)` and superopt's program (extracted for {target}, run through JAX on this CPU) "
        f"timed interleaved, each figure the median of {repeats} runs after 2 warm-up runs, in {rounds} round(s) "
        "that visit every workload in turn (so a burst of load from other processes hits one round of a "
        "workload, not all of them): the median of the per-round medians and of the per-round ratios. A kept "
        "original runs the same program as jax.jit, so its rounds show the noise. NPU cycles: the captured program "
        f"lowered op by op against the program superopt chose for {npu_target}, both on the emulator "
        "(`lowering/npu/`, symbolic mode; stages in sequence, launch overhead not included).", "",
        *_table(RUN_COLUMNS, run), "",
        f"Of {len(ok)} workloads, superopt kept the original for {len(kept)} and changed {len(changed)}; of those, "
        f"{len(faster)} run faster than jax.jit by more than 3%, {len(slower)} slower by more than 3%"
        + (f" ({', '.join(slower)})" if slower else "") + ", the rest within 3%. "
        f"On the NPU emulator {len(lowered)} of {len(ok)} lowered, "
        f"{sum(r['npu_optimized'] < r['npu_unfused'] for r in lowered)} with fewer cycles than op by op"
        + "".join(f"; {r['name']} takes more ({r['npu_unfused'] / r['npu_optimized']:.2f}x)" for r in lowered
                  if r["npu_optimized"] > r["npu_unfused"]) + ".", "",
    ]
    if figure:
        lines += [f"![workloads]({figure})", ""]
    return lines


def render(rows: list[dict], repeats: int, rounds: int, when: str, command: str, extra: list[str] = (),
           target: str = "cpu", npu_target: str = "npu-910b", figure: str | None = None) -> str:
    """The whole BENCHMARKS.md text."""
    import jax
    reproduce = ("Reproduce with `make bench`, i.e. `python -m bench.run`."
                 if command == "python -m bench.run" else f"Reproduce with `{command}` (`make bench` runs everything).")
    lines = [
        "# Benchmarks: superopt vs. jax.jit", "",
        f"Run: {when} (UTC). {reproduce}", "",
        "## How measured", "",
        "Machine: the project's 2-core CPU development machine; jax " + jax.__version__ + ". Times are measured on "
        "this CPU; GPU and NPU figures come from the cost models and the NPU emulator, not from hardware. "
        "Every figure in this file is written by the run, as measured; the sentences that summarize a table "
        "are computed from it.", "",
    ]
    if rows:
        lines += render_table(rows, target, npu_target, repeats, rounds, figure)
        lines += _reading(rows)
    return "\n".join(lines + list(extra)) + "\n"


def _reading(rows: list[dict]) -> list[str]:
    ok = [r for r in rows if "error" not in r]
    bert = next((r for r in ok if r["name"] == "bert-encoder-128"), None)
    example = (f" (BERT-128: model {bert['estimate']:.2f}x, measured ratio {bert['ratio']:.3f})" if bert else "")
    return [
        "## Reading the tables", "",
        "A ratio below 1 means superopt's program is faster than `jax.jit` of the original. \"kept original\" "
        "means superopt found nothing cheaper under its cost model (or could not use what it found) and runs "
        "the original function under `jax.jit`, so its ratio is about 1 by construction and any deviation is "
        "measurement noise. Rules fired lists the rewrite rules that matched, with match counts, most frequent "
        "first. On the CPU superopt lowers to JAX, and XLA fuses elementwise ops by itself: the model estimate "
        "prices the original op by op, so fusion raises it far above what is measured against `jax.jit`, which "
        f"already fuses{example}. Fusion decisions that differ per target are tested in `tests/test_fusion.py` "
        "and shown in each report (`superopt explain`).", "",
    ]


def carried_sections(path: str) -> str:
    """Sections of the file at `path` that this run does not regenerate and keeps as they are: the Pallas
    timings `python -m bench.gpu` writes on a machine with a GPU, and the whole-model figures of
    `python -m bench.scale` (which `make bench` runs next)."""
    from bench.gpu import SECTION as GPU
    from bench.scale import SECTION as SCALE
    try:
        with open(path, encoding="utf-8") as f:
            old = f.read()
    except OSError:
        return ""
    kept = ""
    for section in (GPU, SCALE):
        start = old.find(section)
        if start < 0:
            continue
        end = old.find("\n## ", start + len(section))
        kept += "\n" + (old[start:end + 1] if end >= 0 else old[start:]).rstrip("\n") + "\n"
    return kept


def _selected(pattern: str | None, names) -> list[str]:
    return [n for n in names if pattern is None or re.search(pattern, n)]


def build_parser(prog: str = "python -m bench.run") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="cpu", help="target of the main table (default cpu)")
    ap.add_argument("--npu-target", default=None, help="NPU target of the cycle columns (default: --target when it "
                                                       "is an NPU, else npu-910b)")
    ap.add_argument("--filter", help="regex over workload names; every section keeps only the names it matches")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, from {', '.join(SECTIONS)}")
    ap.add_argument("--repeats", type=int, default=9, help="timed runs per round after warm-up")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds, each over every workload")
    ap.add_argument("--output", default=None, help=f"markdown file to write (default: {OUTPUT} for a full run, "
                                                   f"{PARTIAL_OUTPUT} for a run with --filter or fewer --sections)")
    ap.add_argument("--figures", default=None, help=f"folder for the PNG plots, linked from the output (default: "
                                                    f"{FIGURES} for a full run, {PARTIAL_FIGURES} for a partial one)")
    ap.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    ap.add_argument("--no-ranking", action="store_true", help="skip the cost-model ranking (as --sections without it)")
    ap.add_argument("--no-kernels", action="store_true", help="skip every section after the main tables")
    return ap


def _figure(ns, name: str, output_dir: str) -> tuple[str, str] | None:
    """(path to write, link relative to the markdown file) of a plot, or None with --no-plots."""
    if ns.no_plots:
        return None
    path = os.path.join(ns.figures, name)
    return path, os.path.relpath(path, output_dir or ".").replace(os.sep, "/")


def destinations(pattern: str | None, sections, output: str | None, figures: str | None) -> tuple[bool, str, str]:
    """(whether this is a full run, the markdown file, the plots folder): a full run (every section, no
    filter) writes BENCHMARKS.md and docs/figures, a partial one build/bench/; --output and --figures win."""
    full = pattern is None and set(sections) == set(SECTIONS)
    return full, output or (OUTPUT if full else PARTIAL_OUTPUT), figures or (FIGURES if full else PARTIAL_FIGURES)


def _say(text: str) -> None:
    """A progress line: above the bar on a terminal, else one line on stderr."""
    from superopt.core import progress
    if progress.active():
        progress.note(text)
    else:
        print(f"bench: {text}", file=sys.stderr, flush=True)


def run(ns) -> int:
    from bench import plots
    from superopt.workloads import CONV_CHAIN_SHAPES, GEMM_CHAIN_SHAPES, WORKLOADS
    from superopt.core import progress
    from superopt.extract.target import load_target
    load_target(ns.target)                                # an unknown target fails before any work
    npu_target = ns.npu_target or (ns.target if _is_npu(ns.target) else "npu-910b")
    if load_target(npu_target).npu is None:
        raise ValueError(f"bench: --npu-target {npu_target!r} is not an NPU target")
    sections = [s.strip() for s in ns.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        raise ValueError(f"bench: unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    if ns.repeats < 1 or ns.rounds < 1:
        raise ValueError("bench: --repeats and --rounds must be at least 1")
    if ns.no_ranking:
        sections = [s for s in sections if s != "ranking"]
    if ns.no_kernels:
        sections = [s for s in sections if s == "table"]
    if ns.filter is not None:
        try:
            re.compile(ns.filter)
        except re.error as exc:
            raise ValueError(f"bench: --filter {ns.filter!r} is not a regular expression ({exc})") from None

    from bench import callcost, kernels, npu, ranking, tiling
    names = _selected(ns.filter, WORKLOADS) if "table" in sections else []
    chains = [k for k in GEMM_CHAIN_SHAPES if f"gemm-chain-{k}" in _selected(ns.filter, WORKLOADS)]
    plan = {
        "numerics": _selected(ns.filter, WORKLOADS),
        "kernels": _selected(ns.filter, kernels.WORKLOADS_SHOWN),
        "tiling": chains,
        "npu": _selected(ns.filter, npu.PROGRAMS) + chains
        + [k for k in CONV_CHAIN_SHAPES if f"conv-chain-{k}" in _selected(ns.filter, WORKLOADS)],
        "training": _selected(ns.filter, ["train-step", "train-step-sgd"]),
        "remat": _selected(ns.filter, ["remat-mlp-grad"]),
        "layout": _selected(ns.filter, ["layout-packing"]),
        "ranking": _selected(ns.filter, ranking.CHAINS),
        "callcost": _selected(ns.filter, callcost.NAMES),
    }
    steps = len(names) * (1 + ns.rounds) + sum(1 for s in sections if s != "table" and plan[s])
    if not steps:
        raise ValueError(f"bench: nothing matches --filter {ns.filter!r} in sections {', '.join(sections)}; "
                         f"workloads: {', '.join(WORKLOADS)}")
    full, ns.output, ns.figures = destinations(ns.filter, sections, ns.output, ns.figures)
    out_dir = os.path.dirname(ns.output)
    for folder in [out_dir] + ([] if ns.no_plots else [ns.figures]):
        try:
            if folder:
                os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"bench: cannot create the folder {folder!r} ({exc.strerror})") from None
    if os.path.isdir(ns.output) or not os.access(out_dir or ".", os.W_OK) or \
            (os.path.exists(ns.output) and not os.access(ns.output, os.W_OK)):
        raise ValueError(f"bench: cannot write --output {ns.output!r}")
    shown = [s for s in sections if s == "table" and names or s != "table" and plan[s]]
    _say(f"{len(names)} workload(s) in the main table, sections {', '.join(shown)}; "
         + ("a full run" if full else "a partial run") + f", writing {ns.output}")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    rows: list[dict] = []
    extra: list[str] = []
    overview = _figure(ns, f"bench-{ns.target}.png", out_dir)
    with progress.task("bench", total=steps) as bar:
        timed = []
        for name in names:
            bar.update(f"bench: optimize {name}")
            try:
                r, thunks = prepare(name, ns.target, npu_target)
            except Exception as exc:  # report the failure in the table and carry on
                r = {"name": name, "error": f"{type(exc).__name__}: {exc}"}
                print(f"bench: {name} FAILED: {r['error']}", file=sys.stderr, flush=True)
            else:
                _say(f"[{len(rows) + 1}/{len(names)}] {name}: {r['outcome']}; optimize {r['optimize_s']:.2f} s")
                timed.append((r, thunks))
            rows.append(r)
            bar.advance()
        for k in range(ns.rounds):
            if timed:
                _say(f"timing round {k + 1} of {ns.rounds} ({len(timed)} workload(s))")
            for r, thunks in timed:
                bar.update(f"bench: time {r['name']}, round {k + 1} of {ns.rounds}")
                try:
                    time_round(r, thunks, ns.repeats)
                except Exception as exc:
                    r["error"] = f"timing failed: {type(exc).__name__}: {exc}"
                    print(f"bench: {r['name']} FAILED: {r['error']}", file=sys.stderr, flush=True)
                    timed = [(q, t) for q, t in timed if q is not r]
                bar.advance()
        timed.clear()   # the compiled programs and their arguments can go
        if overview:
            overview = plots.overview(rows, overview[0]) and overview
        if "numerics" in sections and plan["numerics"]:
            bar.update("bench: numerics, strict against fast")
            _say("section numerics: numerics, strict against fast")
            from bench import numerics
            extra += numerics.main(plan["numerics"])
            bar.advance()
        if "kernels" in sections and plan["kernels"]:
            bar.update("bench: kernels per target")
            _say("section kernels: kernels per target")
            extra += ["", *kernels.main(plan["kernels"])]
            bar.advance()
        if "tiling" in sections and plan["tiling"]:
            bar.update("bench: tiles of the GEMM chains")
            _say("section tiling: tiles of the GEMM chains")
            data = tiling.rows(plan["tiling"])
            extra += tiling.render(data)
            fig = _figure(ns, "bench-tiling.png", out_dir)
            if fig and plots.tiling(data, fig[0]):
                extra += ["", f"![data volume over the optimum]({fig[1]})"]
            bar.advance()
        if "npu" in sections and plan["npu"]:
            bar.update("bench: programs and chains on the NPU emulator")
            _say("section npu: programs and chains on the NPU emulator")
            timeline = None if ns.no_plots else os.path.join(ns.figures, "npu-910b-bert-encoder-128.png")
            programs = [n for n in plan["npu"] if n in npu.PROGRAMS]
            prs = npu.program_rows(programs, timeline=timeline) if programs else []
            rs = npu.rows([c for c in plan["npu"] if c in GEMM_CHAIN_SHAPES])
            link = timeline and os.path.relpath(timeline, out_dir or ".").replace(os.sep, "/")
            extra += npu.render_programs(prs, link) if prs else []
            if rs:
                extra += npu.render_chains(rs)
                fig = _figure(ns, "bench-npu-chains.png", out_dir)
                if fig and plots.npu_chains(rs, fig[0]):
                    extra += ["", f"![GEMM chains on the emulator]({fig[1]})"]
            convs = [c for c in plan["npu"] if c in CONV_CHAIN_SHAPES]
            extra += npu.render_convs(npu.conv_rows(convs)) if convs else []
            bar.advance()
        if "training" in sections and plan["training"]:
            bar.update("bench: training step")
            _say("section training: training step")
            from bench import training
            extra += training.main(plan["training"])
            bar.advance()
        if "remat" in sections and plan["remat"]:
            bar.update("bench: rematerialization")
            _say("section remat: rematerialization")
            from bench import remat
            extra += remat.main()
            bar.advance()
        if "layout" in sections and plan["layout"]:
            bar.update("bench: layout packing")
            _say("section layout: layout packing")
            from bench import layout
            extra += layout.section()
            bar.advance()
        if "ranking" in sections and plan["ranking"]:
            rankings = []
            for chain in plan["ranking"]:
                bar.update(f"bench: ranking {chain}")
                _say(f"section ranking: {chain}")
                rankings.append(ranking.rank_chain(chain, repeats=ns.repeats))
            extra += ["", *ranking.render(rankings, ns.repeats)]
            fig = _figure(ns, "bench-ranking.png", out_dir)
            if fig and plots.ranking(rankings, fig[0]):
                extra += [f"![predicted against measured]({fig[1]})", ""]
            bar.advance()
        if "callcost" in sections and plan["callcost"]:
            bar.update("bench: call cost against jax.jit")
            _say("section callcost: call cost against jax.jit")
            extra += callcost.main()
            bar.advance()
        bar.update(f"bench: done ({len(rows)} workloads, {len(sections)} sections)")

    defaults = build_parser()
    command = "python -m bench.run" + "".join(
        f" --{flag.replace('_', '-')} {shlex.quote(str(getattr(ns, flag)))}"
        for flag in ("target", "npu_target", "filter", "sections", "repeats", "rounds")
        if getattr(ns, flag) != defaults.get_default(flag))
    text = render(rows, ns.repeats, ns.rounds, when, command, extra, ns.target, npu_target,
                  overview[1] if overview else None)
    text += carried_sections(ns.output)
    with open(ns.output, "w", encoding="utf-8") as f:
        f.write(text)
    note = "" if full or ns.output == OUTPUT else \
        f" (a partial run: {OUTPUT} and {FIGURES}/ are written by a full run only, or with --output)"
    print(f"wrote {ns.output}" + (f" and plots in {ns.figures}" if not ns.no_plots else "") + note,
          file=sys.stderr)
    return 1 if any("error" in r for r in rows) else 0


def main(argv: list[str] | None = None, prog: str = "python -m bench.run") -> int:
    from superopt.core import progress
    ns = build_parser(prog).parse_args(argv)
    # The tables time optimizing: no result may come from the persistent cache (bench.scale measures that).
    os.environ.setdefault("SUPEROPT_CACHE", "off")
    try:
        with progress.bars():
            return run(ns)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
