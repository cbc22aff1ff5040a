"""The `superopt` command: `superopt rules list [--ruleset NAME]`, `superopt rules check [NAME ...]`,
`superopt calibrate`, `superopt demo`."""
from __future__ import annotations

import argparse
import sys


def _rules_list(args) -> int:
    from superopt.rulesets import RULESETS, resolve
    sets = resolve([args.ruleset]) if args.ruleset else list(RULESETS.values())
    for rs in sets:
        print(f"{rs.name} ({len(rs)} rules)")
        for r in rs:
            print(f"  {r.name:<34} {r.numerics:<6} {r.doc}  [{r.source}]")
    return 0


def _rules_check(args) -> int:
    from superopt.rewrites.checker import check_rule
    from superopt.rulesets import RULESETS
    rules = [r for rs in RULESETS.values() for r in rs]
    if args.names:
        known = {r.name for r in rules}
        missing = [n for n in args.names if n not in known]
        if missing:
            raise ValueError(f"superopt: no rule named {', '.join(missing)}; see `superopt rules list`")
        rules = [r for r in rules if r.name in args.names]
    unsound, cases = [], 0
    for r in rules:
        result = check_rule(r, examples=args.examples)
        cases += result.cases
        status = "sound" if result.sound else ("UNSOUND" if result.counterexample else "UNCHECKED")
        print(f"{status:<9} {r.ruleset}/{r.name:<40} {result.cases:>4} cases  [{r.source}]")
        if not result.sound:
            unsound.append(r.name)
            print(result.counterexample or "  no binding satisfied the left-hand side: " + "; ".join(result.notes))
    print(f"checked {len(rules)} rules on {cases} cases: "
          + ("all sound" if not unsound else f"{len(unsound)} failed: {', '.join(unsound)}"))
    return 1 if unsound else 0


def _calibrate(args) -> int:
    from superopt.extract.calibrate import cache_path, calibrate
    sizes = {"matmul_size": 512, "stream_mib": 32} if args.quick else {}
    figures = calibrate(**sizes)
    print(f"peak f32 matmul : {figures['peak_flops'] / 1e9:8.1f} GFLOP/s")
    print(f"memory bandwidth: {figures['mem_bandwidth'] / 1e9:8.1f} GB/s (read + write)")
    print(f"cached in {cache_path()}; the cpu target uses these figures from now on")
    return 0


def _demo(args) -> int:
    from superopt.demo import main as demo_main
    demo_main()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="superopt", description="equality-saturation superoptimizer for JAX")
    sub = parser.add_subparsers(dest="command", required=True)
    rules = sub.add_parser("rules", help="inspect the registered rewrite rules")
    rules_sub = rules.add_subparsers(dest="rules_command", required=True)
    listing = rules_sub.add_parser("list", help="list rules with their rule set, numerics and source")
    listing.add_argument("--ruleset", help="only this rule set")
    listing.set_defaults(run=_rules_list)
    check = rules_sub.add_parser("check", help="check rules for soundness on random bindings (all by default)")
    check.add_argument("names", nargs="*", help="rule names to check")
    check.add_argument("--examples", type=int, default=60, help="bindings per rule (default 60)")
    check.set_defaults(run=_rules_check)
    cal = sub.add_parser("calibrate", help="measure this machine's FLOP/s and bandwidth for the cpu target")
    cal.add_argument("--quick", action="store_true", help="small sizes: seconds instead of tens of seconds")
    cal.set_defaults(run=_calibrate)
    demo = sub.add_parser("demo", help="optimize the embedded transformer block and time it")
    demo.set_defaults(run=_demo)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
