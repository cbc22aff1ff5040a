"""Rule synthesis (`rewrites/synthesis.py`, `superopt rules synthesize`), on a small part of its language so
that it runs in seconds: enumeration grows only class representatives, candidates are labelled on the
float32 battery and proven by the checker, and a derivable candidate is not kept."""
from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np

from superopt import superopt
from superopt.rewrites import synthesis as S
from superopt.rewrites.sexpr import format_rules, parse_rules
from superopt.rulesets import ALGEBRA
import pytest

pytestmark = pytest.mark.slow   # whole models, worker processes or long searches: make test, not test-fast

SMALL = ((frozenset({"neg", "add", "sub", "mul"}), 3),)
x, y = ("var", "x"), ("var", "y")


def test_the_battery_tells_a_bitwise_identity_from_a_rounding_one_and_from_one_over_the_reals():
    assert S.battery_label(("neg", ("neg", x)), x) == "exact"
    assert S.battery_label(("add", ("lit", 0.0), x), x) == "rounding"          # -0 + 0 is +0
    assert S.battery_label(("mul", ("add", x, y), x), ("add", ("mul", x, x), ("mul", y, x))) == "reals"


def test_synthesis_keeps_a_minimal_set_of_proven_rules():
    found = S.synthesize(SMALL, examples=20)
    kept = {(S.show(lhs), S.show(rhs)): label for lhs, rhs, label, _ in found.rules}
    assert kept[("(neg (neg x))", "x")] == "exact"
    assert kept[("(add 0 x)", "x")] == "rounding"
    assert kept[("(sub 0 x)", "(neg x)")] == "rounding"                     # 0 - 0 is +0, -(0) is -0
    # commuting an add is kept once; x + 0 -> x then follows from 0 + x -> x, and 1 + x from y + x
    assert kept[("(add y x)", "(add x y)")] == "exact"
    assert ("(add x 0)", "x") not in kept and ("(add 1 x)", "(add x 1)") not in kept
    assert found.derivable > 0
    # every rule kept holds on the battery under its label, and reads back from the text format
    for lhs, rhs, label, rule in found.rules:
        assert S.LABELS.index(S.battery_label(lhs, rhs)) <= S.LABELS.index(label)
    text = format_rules([r for *_, r in found.rules])
    assert format_rules(parse_rules(text)) == text


def test_rediscovery_counts_the_hand_written_rules_the_synthesized_ones_derive():
    hand = S.hand_written_in_language(ALGEBRA)
    assert {"neg-neg", "mul-one", "add-zero", "matmul-assoc", "sub-neg"} <= set(hand)
    assert "exp-of-log-of-nonneg" not in hand                 # a domain condition: outside the language
    found = S.synthesize(SMALL, examples=20)
    derived = S.rediscovered(found, hand)
    assert derived["neg-neg"] and derived["add-zero"] and derived["sub-zero"] and derived["mul-one-left"]
    assert not derived["sub-neg"]                              # x - (-y) has four nodes: past this size
    assert not derived["matmul-assoc"]                         # no matmul in this language


def test_synthesized_rules_join_a_schedule():
    found = S.synthesize(SMALL, examples=20)
    a = jnp.asarray(np.random.default_rng(0).standard_normal((8, 8)), jnp.float32)
    fn = lambda v: -(-v) * 2.0   # noqa: E731
    fast = superopt(fn, rulesets=("algebra", found.ruleset()))
    np.testing.assert_allclose(np.asarray(fast(a)), np.asarray(fn(a)))
    assert any(name.startswith("synth-") for name, n in fast.report.run.matches.items() if n)


def test_the_command_reports_what_it_kept_and_what_it_rediscovered(tmp_path, capsys):
    from superopt.cli import main
    path = tmp_path / "synth.rules"
    assert main(["rules", "synthesize", "--size", "2", "--jobs", "1", "--write", str(path)]) == 0
    out = capsys.readouterr().out
    kept = int(re.search(r"kept (\d+) rules", out).group(1))
    assert kept == len(parse_rules(path.read_text())) > 0
    hand = len(S.hand_written_in_language(ALGEBRA))
    assert f"of the {hand} rules of rulesets/algebra.py in the language" in out
    assert main(["rules", "synthesize", "--size", "1"]) == 2
