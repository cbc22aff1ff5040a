"""Same program, same options, same result, whatever the load: every workload of the benchmark optimized from a
fresh cache, with a digest of the term superopt chose, written to a JSON file; a second run (on a machine busy
or idle) is compared with it.

    python -m bench.determinism --out idle.json [--target cpu] [--filter REGEX] [--extractor ilp]
    python -m bench.determinism --out busy.json --compare idle.json

The budgets that decide the program count deterministic units (README, "Limits"); time limits are backstops. A
run where a backstop fired says so (its report's stop reason or outcome names a time limit) and such a
workload is listed apart: it is the backstop, not the budget, that decided it. Exit status 1 where a workload's
term differs between the two runs and no backstop fired in either.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time


def run(target: str, pattern: str, extractor: str = "greedy") -> dict:
    from superopt import superopt
    from superopt.core.ir import pretty
    from superopt.workloads import WORKLOADS
    out = {}
    for name in sorted(WORKLOADS):
        if not re.search(pattern, name):
            continue
        wl = WORKLOADS[name]()
        fast = superopt(wl.fn, target=target, cache=False, backend="jax", extractor=extractor)
        start = time.perf_counter()
        spec = fast.compile(*wl.args)
        seconds = time.perf_counter() - start
        report = spec.report
        backstop = (report.run.stop_reason.value == "time limit" or "time limit" in report.outcome
                    or (report.extraction is not None and report.extraction.timed))
        out[name] = dict(term=hashlib.sha1(pretty(spec.term).encode()).hexdigest()[:16], outcome=report.outcome,
                         iterations=report.run.iterations, enodes=report.run.enodes, seconds=round(seconds, 2),
                         backstop=backstop)
        print(f"{name:26s} {out[name]['term']}  {seconds:6.1f} s  {report.outcome[:60]}"
              + ("  (a backstop fired)" if backstop else ""), flush=True)
    return out


def compare(now: dict, then: dict) -> tuple[list, list]:
    """(workloads whose terms differ with no backstop in either run, those that differ where one fired)."""
    differ, backstopped = [], []
    for name in sorted(set(now) & set(then)):
        if now[name]["term"] != then[name]["term"]:
            (backstopped if now[name]["backstop"] or then[name]["backstop"] else differ).append(name)
    return differ, backstopped


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--compare")
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--filter", default="")
    parser.add_argument("--extractor", default="greedy", choices=("greedy", "ilp"))
    ns = parser.parse_args(argv)
    load = os.getloadavg()
    results = dict(target=ns.target, extractor=ns.extractor, load_before=load,
                   workloads=run(ns.target, ns.filter, ns.extractor),
                   load_after=os.getloadavg())
    with open(ns.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"load average {load[0]:.2f} before, {results['load_after'][0]:.2f} after")
    if not ns.compare:
        return 0
    with open(ns.compare) as f:
        then = json.load(f)
    differ, backstopped = compare(results["workloads"], then["workloads"])
    same = len(set(results["workloads"]) & set(then["workloads"])) - len(differ) - len(backstopped)
    print(f"compared with {ns.compare} (load {then['load_before'][0]:.2f}): {same} the same term, "
          f"{len(differ)} different ({', '.join(differ) or 'none'}), {len(backstopped)} different where a backstop "
          f"fired ({', '.join(backstopped) or 'none'})")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
