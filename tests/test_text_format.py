"""The s-expression text format: every registered rule round-trips, and TASO/Tensat rules read and check."""
import jax.numpy as jnp
import numpy as np
import pytest

from superopt.rewrites.checker import check_rule
from superopt.rewrites.sexpr import ParseError, format_rule, format_rules, parse_rule, parse_rules
from superopt.rulesets import RULESETS

ALL_RULES = [r for rs in RULESETS.values() for r in rs]

# Rules in the style of TASO's and Tensat's rule files, written with their operator names.
TASO_RULES = """
(rule ewadd-commute (ewadd ?a ?b) => (ewadd ?b ?a) :doc "a + b = b + a")
(rule ewmul-commute (ewmul ?a ?b) => (ewmul ?b ?a) :doc "a * b = b * a")
(rule ewadd-assoc (ewadd (ewadd ?a ?b) ?c) => (ewadd ?a (ewadd ?b ?c)) :numerics reals :doc "+ associates")
(rule ewmul-distribute (ewmul (ewadd ?a ?b) ?c) => (ewadd (ewmul ?a ?c) (ewmul ?b ?c)) :numerics reals
      :doc "* distributes over +")
(rule matmul-assoc (matmul (matmul ?a ?b) ?c) => (matmul ?a (matmul ?b ?c)) :when ((matmul_ok ?b ?c))
      :numerics reals :doc "@ associates")
(rule transpose-transpose (transpose (transpose ?a)) => ?a :doc "2-D transpose is an involution")
(rule transpose-matmul (transpose (matmul ?a ?b)) => (matmul (transpose ?b) (transpose ?a))
      :when ((rank ?a 2) (rank ?b 2)) :doc "(ab)^T = b^T a^T")
(rule relu-relu (relu (relu ?a)) => (relu ?a) :doc "relu is idempotent")
(rule relu-transpose (relu (transpose ?a)) => (transpose (relu ?a)) :doc "relu commutes with transpose")
(rule tanh-transpose (tanh (transpose ?a)) => (transpose (tanh ?a)) :doc "tanh commutes with transpose")
(rule sigmoid-transpose (sigmoid (transpose ?a)) <=> (transpose (sigmoid ?a)) :doc "two-way")
(rule smul-matmul (matmul (smul ?a ?s) ?b) => (smul (matmul ?a ?b) ?s) :when ((scalar ?s)) :numerics reals
      :doc "scalars move through matmul")
(rule poolmax-relu (poolmax (relu ?x) ?w ?s) => (relu (poolmax ?x ?w ?s)) :numerics rounding
      :doc "max pooling commutes with relu, but for the sign of a zero: max(-0, 0) keeps either")
(rule split0-concat (split0 1 (concat 1 ?a ?b)) => ?a :doc "the first part of a concatenation")
(rule split1-concat (split1 1 (concat 1 ?a ?b)) => ?b :doc "the second part of a concatenation")
(rule conv-smul (conv2d ?p (smul ?x ?s) ?w) => (smul (conv2d ?p ?x ?w) ?s) :when ((scalar ?s)) :numerics reals
      :doc "scalars move through convolution")
(rule add-mul-swap (noop (ewadd ?a ?b) (ewmul ?a ?b)) => (noop (ewadd ?b ?a) (ewmul ?b ?a))
      :doc "a two-output rule: both outputs rewritten together")
"""


@pytest.mark.parametrize("r", ALL_RULES, ids=[r.name for r in ALL_RULES])
def test_every_registered_rule_round_trips(r):
    text = format_rule(r)
    assert parse_rule(text) == r, text


def test_a_whole_rule_set_round_trips():
    rules = list(RULESETS["algebra"])
    assert parse_rules(format_rules(rules)) == rules


@pytest.fixture(scope="module")
def taso_rules():
    return parse_rules(TASO_RULES, dialect="taso")


def test_taso_operator_names_are_all_expressible(taso_rules):
    text = TASO_RULES
    for name in ("ewadd", "ewmul", "smul", "matmul", "transpose", "relu", "tanh", "sigmoid", "conv2d", "poolmax",
                 "concat", "split0", "split1", "noop"):
        assert f"({name} " in text
    enlarge = parse_rule('(rule e (enlarge ?w ?ref) => (enlarge ?w ?ref) :doc "pad a kernel")', dialect="taso")
    assert enlarge.pairs[0][0].fn == "pad"
    assert len(taso_rules) >= 12
    assert len(next(r for r in taso_rules if r.name == "add-mul-swap").pairs) == 2


def test_taso_rules_round_trip_through_superopts_own_syntax(taso_rules):
    for r in taso_rules:
        assert parse_rule(format_rule(r)) == r


@pytest.mark.slow
@pytest.mark.parametrize("name", [line.split()[1] for line in TASO_RULES.strip().splitlines()
                                  if line.startswith("(rule")])
def test_taso_rule_compiles_and_is_sound(taso_rules, name):
    r = next(r for r in taso_rules if r.name == name)
    assert r.egg
    result = check_rule(r, examples=40)
    assert result.sound, f"{name}: {result.counterexample or result.notes}"


def test_a_taso_rule_rewrites_a_real_program(taso_rules):
    from superopt import superopt
    from superopt.rewrites.rule import RuleSet
    mine = RuleSet("taso", [r for r in taso_rules if r.name == "relu-relu"])
    fast = superopt(lambda a: jnp.maximum(jnp.maximum(a, 0.0), 0.0) * 2.0, rulesets=[mine])
    a = jnp.asarray(np.linspace(-2, 2, 64, dtype=np.float32).reshape(8, 8))
    np.testing.assert_allclose(fast(a), np.maximum(a, 0) * 2)
    assert set(fast.report.run.fired) == {"relu-relu"}


@pytest.mark.parametrize("text, message", [
    ("(rule r (frobnicate ?a) => ?a)", "unknown operator 'frobnicate'"),
    ("(rule r (exp ?a) -> ?a)", "expected LHS => RHS"),
    ("(rule r (transpose ?a ?a) => ?a)", "used as a tensor and as a vec"),
    ("(rule r (exp ?a) => ?b)", "unbound variables"),
    ("(rule r (exp ?a) => ?a :when ((shiny ?a)))", "unknown predicate 'shiny'"),
    ("(rule r (exp ?a) => ?a", "unbalanced"),
])
def test_bad_text_is_a_clear_error(text, message):
    with pytest.raises((ParseError, ValueError, KeyError), match=message):
        parse_rules(text)


@pytest.mark.parametrize("numerics", ["exact", "rounding", "reals"])
def test_each_numerics_label_reads_and_prints(numerics):
    r = parse_rule(f'(rule r (exp ?a) => (exp ?a) :numerics {numerics} :doc "d")')
    assert r.numerics == numerics and f":numerics {numerics} " in format_rule(r)
    assert parse_rule(format_rule(r)) == r


def test_an_unknown_numerics_label_is_an_error():
    with pytest.raises(ValueError, match="numerics must be one of"):
        parse_rule('(rule r (exp ?a) => (exp ?a) :numerics fast :doc "d")')
