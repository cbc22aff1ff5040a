"""The `superopt` command: `superopt rules list [--ruleset NAME]`, `superopt demo`."""
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
