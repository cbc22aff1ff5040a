"""Compiled rules kept in the persistent cache (egraph/saved.py, reuse.prepare_rules): a process that finds
them there builds no rule, its rules are the same egglog rules, and data that is not theirs is never used."""
import json
import pickle

import jax.numpy as jnp
import numpy as np
import pytest

from superopt import reuse, superopt
from superopt.cache import Store
from superopt.core.ir import pretty
from superopt.egraph import saved
from superopt.egraph.egglog_api import RewriteOrRule
from superopt.egraph.egglog_api import declarations as D
from superopt.stages import schedule_of
from superopt.rewrites.schedule import Schedule


@pytest.fixture(autouse=True)
def _no_rule_sets_yet(monkeypatch):
    """The process as another one starts: none of the rule sets earlier tests ran (egraph/runner.py, `ruleset_of`),
    whose compiled rules a rule equal to theirs would adopt."""
    from superopt import reuse
    from superopt.egraph import runner
    monkeypatch.setattr(runner, "_RULESETS", {})
    monkeypatch.setattr(runner, "_RAN", set())
    monkeypatch.setattr(reuse, "_as_data", {})


def fresh(schedule: Schedule) -> Schedule:
    """The schedule as another process gets it: the same rules, none built (a rule pickles without them)."""
    copy = pickle.loads(pickle.dumps(schedule))
    assert not any(r.compiled for p in copy.phases for r in p.rules)
    return copy


def no_compiling(monkeypatch):
    def refuse(rule):
        raise AssertionError(f"rule {rule.name} was built, not taken from the cache")
    monkeypatch.setattr("superopt.rewrites.compile.compile_rule", refuse)


@pytest.mark.slow
def test_compiled_rules_come_back_as_the_same_egglog_rules():
    schedule = Schedule.of("algebra", "casts")
    data = json.loads(json.dumps(_built(schedule)))
    copy = fresh(schedule)
    assert reuse.adopt_rules(copy, data)
    for original, back in zip(reuse._rules(schedule), reuse._rules(copy)):
        assert back.compiled and [e.decl for e in back.egg] == [e.decl for e in original.egg], original.name
        # egglog prints it the same: its declarations resolve (a rule whose domain condition no analysis proves
        # has no egglog rule outside a search that speculates)
        assert [str(e) for e in back.egg[:1]] == [str(e) for e in original.egg[:1]]


def _built(schedule):
    for r in reuse._rules(schedule):
        r.egg
    reuse.analysis.analysis()
    return reuse.compiled_rules(schedule)


@pytest.mark.slow
def test_a_new_optimization_takes_the_rules_from_the_cache_and_chooses_the_same(tmp_path, monkeypatch):
    schedule = Schedule.of("algebra", "fusion")
    a, b = jnp.linspace(-1, 1, 64).reshape(8, 8), jnp.linspace(-1, 1, 256).reshape(16, 16)

    def chain(x, y):
        return (x @ y) @ y

    # gpu-h100, whose model prices the GEMM chain fused (on cpu XLA runs the original as well: extract/xla.py)
    superopt(chain, rulesets=schedule, cache=tmp_path, target="gpu-h100").compile(a, a)
    ran, _ = schedule_of(schedule, "strict", "gpu")    # the rules strict numerics runs
    assert Store(tmp_path).get(reuse.rules_key(ran), reuse.RULES_KIND) is not None
    expected = superopt(chain, rulesets=schedule, cache=False, target="gpu-h100").compile(b, b)
    no_compiling(monkeypatch)
    copy = fresh(schedule)
    # the same program at other shapes (its result is not in the cache): it saturates with the rules read back
    second = superopt(chain, rulesets=copy, cache=tmp_path, target="gpu-h100").compile(b, b)
    assert second.report.cache.status == "miss" and "rules" in second.report.stage_seconds
    assert pretty(second.term) == pretty(expected.term) and second.report.optimized
    np.testing.assert_allclose(np.asarray(second.run(b, b)[0]), np.asarray((b @ b) @ b), rtol=1e-5)


@pytest.mark.slow
def test_the_cache_keeps_every_rule_a_process_built_and_a_later_one_builds_only_what_it_lacks(tmp_path, monkeypatch):
    """A saturation builds only the rules that can match its program (egraph/runner.py:reachable): the
    cache keeps those, a program that needs more builds only the others and the cache then holds both."""
    from superopt.rewrites import compile as compiler
    schedule = Schedule.of("algebra", "fusion")
    ran, _ = schedule_of(schedule, "strict", "gpu")
    a = jnp.linspace(-1, 1, 64).reshape(8, 8)
    # a copy whose rules are built here (the worker running this test may have built the schedule's rules before)
    superopt(lambda x, y: (x @ y) @ y, rulesets=fresh(schedule), cache=tmp_path, target="gpu-h100").compile(a, a)
    kept = set(Store(tmp_path).get(reuse.rules_key(ran), reuse.RULES_KIND)["names"])
    assert "lift-matmul" in kept and "lift-binary" not in kept and len(kept) < len(reuse._rules(ran))
    built = []
    real = compiler.compile_rule
    monkeypatch.setattr("superopt.rewrites.compile.compile_rule", lambda rule: built.append(rule.name) or real(rule))
    scaled = superopt(lambda x, y: (x @ y) @ y * 2.0 + x, rulesets=fresh(schedule), cache=tmp_path, target="gpu-h100")
    np.testing.assert_allclose(np.asarray(scaled(a, a)), np.asarray((a @ a) @ a * 2.0 + a), rtol=1e-5)
    assert built and "lift-binary" in built and not kept & set(built)
    grown = set(Store(tmp_path).get(reuse.rules_key(ran), reuse.RULES_KIND)["names"])
    # the strict rules under the strict schedule's key (a guarded search, speculation.guarded, built "reals" ones too)
    assert grown == kept | (set(built) & {r.name for r in reuse._rules(ran)})
    no_compiling(monkeypatch)
    again = superopt(lambda x, y: (x @ y) @ y * 3.0 + y, rulesets=fresh(schedule), cache=tmp_path, target="gpu-h100")
    np.testing.assert_allclose(np.asarray(again(a, a)), np.asarray((a @ a) @ a * 3.0 + a), rtol=1e-5)


@pytest.mark.parametrize("damage", ["class", "needs", "names", "format", "egglog", "shape"])
def test_rules_data_that_is_not_theirs_is_never_used(damage):
    schedule = Schedule.of("casts")
    data = json.loads(json.dumps(_built(schedule)))
    if damage == "class":      # a name that is not one of egglog's declarations: nothing is built from it
        item = next(i for i in data["rules"]["table"] if "d" in i)
        item["d"] = "Path"
    elif damage == "needs":    # rules naming a function this process does not declare
        data["rules"]["needs"].append("f:no_such_function")
    elif damage == "names":    # another schedule's rules, or these out of their order
        data["names"] = data["names"][::-1]
    elif damage == "format":
        data["rules"]["format"] = saved.FORMAT + 1
    elif damage == "egglog":   # written by another egglog release, whose declarations have other fields
        data["rules"]["egglog"] = "egglog 13.1.0"
    else:                      # a reference past the table
        data["rules"]["groups"][0][0] = {"r": 10**6}
    copy = fresh(schedule)
    assert not reuse.adopt_rules(copy, data)
    assert not any(r.compiled for r in reuse._rules(copy))


def test_floats_in_rules_come_back_bit_for_bit():
    # 0.0 and -0.0 (equal as floats, and so as egglog's literals) in one rule: each comes back as it was
    values = [0.1, 0.0, -0.0, float("inf"), float("-inf"), 5e-324, 1.7976931348623157e308]
    f64 = D.JustTypeRef(D.Ident("f64", "egglog.builtins"))
    decl = D.RuleDecl((), tuple(D.ExprFactDecl(D.TypedExprDecl(f64, D.LitDecl(v))) for v in values), None)
    rule = RewriteOrRule(saved.declarations(), decl)
    back = saved.rules_from_data(json.loads(json.dumps(saved.rules_to_data([(rule,), ()]))))
    assert back[1] == () and back[0][0].decl == decl
    got = [f.typed_expr.expr.value for f in back[0][0].decl.body]
    assert [np.float64(v).tobytes() for v in got] == [np.float64(v).tobytes() for v in values]
