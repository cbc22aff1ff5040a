"""The `superopt` command line."""
import subprocess
import sys


from superopt.cli import main


def test_rules_list(capsys):
    assert main(["rules", "list", "--ruleset", "algebra"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("algebra (") and "matmul-assoc" in out and "rulesets/algebra.py:" in out


def test_rules_list_unknown_ruleset(capsys):
    assert main(["rules", "list", "--ruleset", "nope"]) == 2
    assert "unknown rule set 'nope'; known: algebra" in capsys.readouterr().err


def test_rules_check_named_rules(capsys):
    assert main(["rules", "check", "matmul-assoc", "neg-neg", "--examples", "20"]) == 0
    out = capsys.readouterr().out
    assert "checked 2 rules on 40 cases: all sound" in out


def test_rules_check_fails_on_an_unsound_rule(monkeypatch, capsys):
    from superopt import rulesets
    from superopt.rewrites.pattern import exp, tensors
    from superopt.rewrites.rule import RuleSet, rule
    x, = tensors("x")
    bad = RuleSet("bad", [rule("exp-is-identity", exp(x), x, doc="wrong")])
    monkeypatch.setitem(rulesets.RULESETS, "bad", bad)
    assert main(["rules", "check", "exp-is-identity", "--examples", "20"]) == 1
    out = capsys.readouterr().out
    assert "UNSOUND" in out and "problem:" in out and "1 failed: exp-is-identity" in out


def test_rules_check_unknown_rule(capsys):
    assert main(["rules", "check", "no-such-rule"]) == 2
    assert "no rule named no-such-rule" in capsys.readouterr().err


def test_console_script_is_installed():
    result = subprocess.run([sys.executable, "-m", "superopt.cli", "rules", "list"], capture_output=True, text=True)
    assert result.returncode == 0 and "transpose-of-transpose" in result.stdout
