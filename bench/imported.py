"""Tensat's rules next to superopt's own: the workloads optimized with the default rule sets, and with the
sound rules imported from Tensat's published files added to them.

    python -m bench.imported DIR [--filter NAME,...] [--output FILE]

DIR holds Tensat's `converted.txt` and `converted_multi.txt` (uwplse/tensat; they are not part of
superopt). Per workload and target the table gives the modelled cost of the chosen program (cpu: the
model's seconds; npu-910b: the NPU program's cycles from a symbolic emulator run), the time to optimize,
and the imported rules that fired.
"""
from __future__ import annotations

import argparse
import os
import time

from bench.synthesis import emit

SHOWN = ("reassoc-chain", "qkv-projection", "gemm-chain-g1", "bert-encoder-128", "transformer-block",
         "decoder-gqa-lora", "resnet-bottleneck", "conv-chain-c2", "mixed-precision-mlp", "nasrnn")
TARGETS = ("cpu", "npu-910b")


def imported(directory: str):
    from superopt.rewrites.tensat import import_rules, ruleset
    verdicts = []
    for name, multi in (("converted.txt", False), ("converted_multi.txt", True)):
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            verdicts += import_rules(f.read(), multi=multi)
    return verdicts, ruleset(verdicts)


def _cost(spec, target: str):
    if target.startswith("npu"):
        if spec.npu is None:
            return None
        return spec.npu.estimate().cycles if hasattr(spec.npu, "estimate") else spec.npu.cycles   # segments: summed
    r = spec.report
    return r.cost_after if r.optimized else r.cost_before


def run(directory: str, names=SHOWN) -> dict:
    from superopt import superopt
    from superopt.rulesets import DEFAULT
    from superopt.workloads import WORKLOADS
    verdicts, extra = imported(directory)
    rows = []
    for name in names:
        w = WORKLOADS[name]()
        for target in TARGETS:
            row = dict(name=name, target=target)
            for key, rulesets in (("default", DEFAULT), ("imported", DEFAULT + (extra,))):
                start = time.perf_counter()
                f = superopt(w.fn, target=target, cache=False, rulesets=rulesets)
                spec = f.compile(*w.args)
                row[key] = dict(cost=_cost(spec, target), seconds=time.perf_counter() - start,
                                outcome=spec.report.outcome,
                                fired=sorted(k for k, n in spec.report.run.matches.items()
                                             if n and k.startswith("tensat")))
            rows.append(row)
            d, i = row["default"], row["imported"]
            print(f"{name:22s} {target:9s} {d['cost']} -> {i['cost']}  ({d['seconds']:.1f} s, {i['seconds']:.1f} s)"
                  f"  {i['fired']}", flush=True)
    return dict(rows=rows, rules=sum(v.rule is not None for v in verdicts),
                sound=sum(v.status == "sound" for v in verdicts))


def render(data: dict) -> list[str]:
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    lines = ["", "## Rules imported from Tensat", "",
             f"Run: {when} (UTC), `python -m bench.imported DIR` with Tensat's two published rule files, on the 2-core "
             f"development machine. Of their {data['sound']} sound rules, {data['rules']} are rules superopt can state "
             "(the others are TASO convolutions; docs/rule-authoring.md, section 9); they join the default rule sets. "
             "Cost: the cpu model's seconds, or npu-910b cycles from a symbolic emulator run of the chosen program.",
             "", "| workload | target | cost, default rules | cost, with Tensat's | optimize, default | optimize, with "
             "Tensat's | Tensat rules that fired |", "|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        d, i = r["default"], r["imported"]
        fmt = (lambda c: f"{c:.4g}") if r["target"] == "cpu" else (lambda c: f"{c}")
        cost = lambda c: "n/a" if c is None else fmt(c)   # noqa: E731
        fired = ", ".join(i["fired"][:6]) + (f" (+{len(i['fired']) - 6})" if len(i["fired"]) > 6 else "")
        lines.append(f"| {r['name']} | {r['target']} | {cost(d['cost'])} | {cost(i['cost'])} | {d['seconds']:.1f} s | "
                     f"{i['seconds']:.1f} s | {fired or 'none'} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("directory", help="where converted.txt and converted_multi.txt are")
    ap.add_argument("--filter", help="comma-separated workload names (default: a representative ten)")
    ap.add_argument("--output", help="write the section to this file instead of printing it")
    ns = ap.parse_args(argv)
    names = ns.filter.split(",") if ns.filter else SHOWN
    emit(render(run(ns.directory, names)), ns.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
