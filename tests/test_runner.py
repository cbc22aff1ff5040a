"""The runner stops with a typed reason under every limit and reports what happened."""
import jax.numpy as jnp
import pytest

from superopt.egraph.capture import capture
from superopt.egraph.encode import encode
from superopt.egraph.runner import Limits, Phase, StopReason, saturate
from superopt.rulesets.algebra import ALGEBRA


def chain_egraph(n=12):
    mats = tuple(jnp.ones((4 + i % 3, 4 + (i + 1) % 3)) for i in range(n))
    def fn(*ms):
        out = ms[0]
        for m in ms[1:]:
            out = out @ m
        return out
    return encode(capture(fn, mats).graph).egraph


PHASES = [Phase("algebra", list(ALGEBRA))]


def test_saturates_small_program():
    report = saturate(encode(capture(lambda a: (a @ a) @ a[:, :1], (jnp.ones((4, 4)),)).graph).egraph, PHASES)
    assert report.stop_reason is StopReason.SATURATED
    assert report.fired.get("matmul-assoc", 0) > 0 and report.seconds > 0
    # Classes: a, a[:, :1], a@a, a@a[:, :1], and the root, which holds both associations.
    assert (report.enodes, report.eclasses) == (6, 5)


@pytest.mark.parametrize("limits, reason", [
    (Limits(iterations=2), StopReason.ITERATION_LIMIT),
    (Limits(nodes=400), StopReason.NODE_LIMIT),
    (Limits(seconds=1e-3), StopReason.TIME_LIMIT),
])
def test_each_limit_is_a_stop_reason(limits, reason):
    report = saturate(chain_egraph(), PHASES, limits)
    assert report.stop_reason is reason
    assert report.iterations >= 1 and report.error is None


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="Limits.nodes"):
        Limits(nodes=0)


def test_a_rule_that_breaks_shapes_is_an_error_not_a_wrong_program():
    from superopt.rewrites.pattern import tensors, transpose, vecs
    from superopt.rewrites.rule import rule
    (x,), (p,) = tensors("x"), vecs("p")
    bad = rule("drop-transpose", transpose(x, p), x, doc="wrong: transpose(x) -> x")
    egraph = encode(capture(lambda a: a.T * 2, (jnp.ones((3, 5)),)).graph).egraph
    report = saturate(egraph, [Phase("bad", [bad])])
    assert report.stop_reason is StopReason.ERROR
    assert "merge" in report.error.lower()


def test_a_rule_that_needs_a_constructor_the_egraph_lacks_is_passed_over_until_one_appears():
    """A rule whose left-hand side names a constructor with no e-node cannot match: it is neither compiled
    nor run (no time recorded), and it runs once a rule before it in the phase makes that constructor."""
    from superopt.egraph.runner import needs
    from superopt.rulesets.fusion import FUSION
    lift, inline = (next(r for r in FUSION.rules if r.name == name) for name in ("lift-unary", "inline-load"))
    assert needs(inline) == (frozenset({"sarg", "kernel"}),)
    assert len(needs(next(r for r in ALGEBRA.rules if r.two_way))) == 2     # either side may match

    def run(rules):
        enc = encode(capture(lambda a: jnp.exp(jnp.exp(a)), (jnp.ones((2, 2)),)).graph)
        return saturate(enc.egraph, [Phase("p", tuple(rules), Limits(iterations=4))])

    alone = run([inline])
    assert alone.matches["inline-load"] == 0 and alone.rule_seconds["inline-load"] == 0.0
    after = run([lift, inline])
    assert after.matches["inline-load"] > 0 and after.rule_seconds["inline-load"] > 0.0


def test_a_template_primed_with_the_rule_sets_saturates_to_the_same_egraph(monkeypatch):
    """`runner.prime` registers the rule sets of rules run before in an e-graph, for good (the template a search
    forks from): nothing is applied, and a program saturated from the primed template reaches the same e-graph,
    numbered alike, with the same matches, as from a template where each rule set is registered as it runs."""
    from superopt.egraph import encode as encoding
    from superopt.egraph.egglog_api import is_registered, table_sizes
    from superopt.egraph.frozen import freeze
    from superopt.egraph.isolate import portable
    from superopt.egraph import runner
    from superopt.egraph.runner import prime
    monkeypatch.setattr(encoding, "_template", {})   # a new template, which no earlier search primed
    program = capture(lambda a, b: (a @ b) @ (b * 2.0) + a, (jnp.ones((4, 4)), jnp.ones((4, 4)))).graph

    def searched(primer):
        with encoding.scratch(primer) as empty:
            eg = encode(program, egraph=empty).egraph
            report = saturate(eg, PHASES)
            return report, portable(freeze(eg)), [rs for _, rs in runner._RULESETS.values() if is_registered(eg, rs)]
    plain = searched(None)
    rules = plain[2]                               # the rule sets the search ran (the others cannot match)
    template = encoding._template["egraph"]
    rows = lambda: {name: n for name, n in table_sizes(template).items() if n}   # noqa: E731 - not declarations
    before = rows()
    assert rules and not any(is_registered(template, r) for r in rules)   # registered in the search, gone at its pop
    prime(template)
    assert all(is_registered(template, r) for r in rules) and rows() == before
    primed = searched(prime)
    assert all(is_registered(template, r) for r in rules)       # kept after the pop
    assert plain[0].stop_reason is primed[0].stop_reason is StopReason.SATURATED
    assert plain[0].matches == primed[0].matches and plain[1].classes == primed[1].classes
