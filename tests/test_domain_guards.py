"""Domain conditions (rewrites/functions.py `given`): a rule may assume that an operand is nonneg, positive, finite,
moderate or exp-moderate. The analysis proves it, or a search that speculates assumes it of the captured
program's node that operand matched, and the program it returns runs behind a check of that node's values
(extract/guard.py), the original where the check fails. The checker proves each such rule inside its domain
and finds a counterexample outside it."""
import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from superopt import superopt
from superopt import speculation
from superopt.core.ir import DOMAIN_CHECKS, Graph, Guard, Node
from superopt.core.serial import from_data, to_data
from superopt.egraph.capture import capture
from superopt.extract.guard import check_graph, unproven
from superopt.lowering.jax import evaluate as lowered, guard_passes
from superopt.rewrites.checker import check_rule
from superopt.rewrites.functions import PREDICATES, given
from superopt.rewrites.pattern import exp, log, tensors
from superopt.rewrites.rule import RuleSet, rule, speculating
from superopt.rewrites.sexpr import format_rule, parse_rules
from superopt.rulesets import DEFAULT as DEFAULT_RULESETS

x, y = tensors("x y")
N = 64


def _all_rules():
    from superopt.rewrites.schedule import resolve
    return [r for rs in resolve(DEFAULT_RULESETS) for r in rs]


GIVEN = [r for r in _all_rules() if r.given]


def test_a_domain_condition_names_a_known_condition_on_a_tensor_variable():
    with pytest.raises(KeyError, match="unknown domain condition 'even'"):
        given("even", x)
    with pytest.raises(TypeError, match="tensor variable"):
        given("positive", exp(x))
    with pytest.raises(ValueError, match="does not bind"):
        rule("r", log(x), x, given("positive", y), doc="")
    with pytest.raises(ValueError, match="cannot be two-way"):
        rule("r", exp(log(x)), x, given("positive", x), two_way=True, doc="")


def test_the_text_format_keeps_domain_conditions():
    r = rule("spec-exp-log", exp(log(x)), x, given("nonneg", x), numerics="rounding", doc="d")
    text = format_rule(r)
    assert ":given ((nonneg ?x))" in text
    (back,) = parse_rules(text)
    assert back.given == r.given and back.key()[:-1] == dataclasses.replace(r, source="<text>").key()[:-1]


def test_a_condition_no_analysis_proves_runs_only_where_a_search_speculates():
    r = rule("spec-exp-moderate", exp(x), x, given("moderate", x), doc="d")
    assert r.egg == ()                                    # strict search: never fires
    assert len(speculating(r).egg) == 1                   # speculating: records the assumption
    text = str(speculating(r).egg[0])
    assert "origin" in text and "assumed" in text
    proven = rule("proven-exp-log", exp(log(x)), x, given("nonneg", x), doc="d")
    assert "nonneg" in str(proven.egg[0]) and "origin" not in str(proven.egg[0])


@pytest.mark.parametrize("r", GIVEN, ids=lambda r: r.name)
def test_each_rule_holds_in_its_domain_and_fails_outside_it(r):
    assert check_rule(r, examples=60).counterexample is None
    outside = check_rule(dataclasses.replace(r, given=()), examples=200, shrink=False)
    assert outside.counterexample is not None, f"{r.name}: its domain condition excludes nothing the checker drew"


_VALUES = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1.2e-38, 1e-30, 1e-19, 1e-18, 0.5, 1.0, -1.0,
                    2.0, 43.0, 44.0, -43.0, 1e18, 1e19, 9.2e18, 9.3e18, 3.4e38, -3.4e38], np.float32)


@pytest.mark.parametrize("name", DOMAIN_CHECKS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_check_passes_exactly_where_the_condition_holds(name, dtype):
    """Each value alone: the run-time check (lowered as XLA runs it) passes exactly where the predicate the
    checker proves the rules with holds (the analysis's meaning: NaN passes nonneg and positive)."""
    values = _VALUES.astype(ml_dtypes.finfo(dtype).dtype if dtype == "bfloat16" else dtype)
    g = Graph(n_args=1)
    a = g.add(Node("arg", (), (0,), (1,), dtype))
    g.outputs = [a]
    check = check_graph(None, (), g, conditions=((name, a),), base=g)
    run = jax.jit(lambda v: lowered(check, [v])[check.outputs[0]])
    for v in values:
        element = np.asarray([v], values.dtype)
        # XLA's CPU flushes a subnormal argument to 0 (tests/test_guard.py): the predicate sees what XLA reads
        seen = element if abs(float(v)) >= ml_dtypes.finfo(dtype).smallest_normal or v == 0 or not np.isfinite(v) \
            else np.zeros_like(element)
        holds = PREDICATES[name].py(seen)
        assert (int(run(element)) == 0) == holds, (name, dtype, float(v))


def test_an_assumption_the_analysis_proves_of_the_captured_program_is_not_checked():
    g = capture(lambda a: jnp.exp(a) + a, (jax.ShapeDtypeStruct((N,), jnp.float32),)).graph
    arg = next(i for i, n in enumerate(g.nodes) if n.op == "arg")
    e = next(i for i, n in enumerate(g.nodes) if n.op == "exp")
    assert unproven(g, {("nonneg", e), ("nonneg", arg), ("finite", e)}) == (("finite", e), ("nonneg", arg))


def test_a_guard_with_conditions_is_stored_and_read_back():
    g = capture(lambda a: jnp.log(a) * 2.0, (jax.ShapeDtypeStruct((N,), jnp.float32),)).graph
    guarded = dataclasses.replace(g, guard=Guard(None, (), g, (("positive", 0), ("moderate", 0))))
    back = from_data(to_data(guarded))
    assert back.guard.conditions == (("positive", 0), ("moderate", 0)) and back.guard.exponent is None
    bad = to_data(guarded)
    bad["guard"]["conditions"] = [["even", 0]]
    with pytest.raises(Exception, match="condition it does not know"):
        from_data(bad)


def _positive(seed, n=200):
    return jnp.asarray(np.abs(np.random.default_rng(seed).standard_normal((n, n))) + 0.5, jnp.float32)


def sum_of_logs(a, b):
    return jnp.log(a) + jnp.log(b)


@pytest.fixture
def any_check(monkeypatch):
    """Guards taken whatever their check costs: the tests of their mechanics need one on a small program."""
    monkeypatch.setattr(speculation, "MAX_CHECK_SHARE", 10.0)


def test_by_default_a_check_that_costs_more_than_its_share_is_not_taken():
    fast = superopt(sum_of_logs, target="cpu", cache=False)
    fast(_positive(0), _positive(1))
    assert not fast.report.optimized
    # its least check alone would cost more than 5% of the program: the search that would find it is not run
    assert fast.report.extraction.no_guard.startswith("not looked for: a guarded program"), fast.report.extraction
    assert "at most 5%" in fast.report.extraction.no_guard


@pytest.mark.slow
def test_a_speculated_identity_runs_where_its_check_holds_and_the_original_elsewhere(any_check):
    a, b = _positive(0), _positive(1)
    fast = superopt(sum_of_logs, target="cpu", cache=False)
    got = fast(a, b)
    assert fast.report.optimized and "sum-of-logs" in fast.report.extraction.assuming_rules, fast.report.extraction
    assert "argument 0" in fast.report.extraction.guard and "runs behind a run-time check" in str(fast.report)
    term = fast._last.term
    assert term.guard is not None and term.guard.exponent is None
    assert {c for c, _ in term.guard.conditions} == {"positive", "moderate"}
    np.testing.assert_allclose(got, sum_of_logs(a, b), rtol=1e-5, atol=1e-6)
    assert guard_passes(term, a, b)
    ref = jax.jit(sum_of_logs)
    for bad in (-a, a.at[3, 4].set(0.0), a.at[0, 0].set(jnp.nan), a.at[1, 1].set(jnp.inf), a.at[2, 2].set(1e30),
                a.at[5, 5].set(1e-30)):
        assert not guard_passes(term, bad, b)
        np.testing.assert_array_equal(fast(bad, b), ref(bad, b))   # the original ran: jax.jit's values, bit for bit


@pytest.mark.slow
def test_a_speculated_program_works_under_jit_grad_vmap_export_and_the_cache(any_check, tmp_path):
    a, b = _positive(2), _positive(3)
    fast = superopt(sum_of_logs, target="cpu", cache=tmp_path)
    fast(a, b)
    assert fast.report.optimized and fast._last.term.guard is not None
    ref = jax.jit(sum_of_logs)
    np.testing.assert_allclose(jax.jit(fast)(a, b), ref(a, b), rtol=1e-5, atol=1e-6)
    for g, h in zip(jax.grad(lambda *v: fast(*v).sum(), argnums=(0, 1))(a, b),
                    jax.grad(lambda *v: ref(*v).sum(), argnums=(0, 1))(a, b)):
        np.testing.assert_allclose(g, h, rtol=1e-5)
    batch = jnp.stack([a, -a])
    got, want = jax.vmap(fast, (0, None))(batch, b), jax.vmap(ref, (0, None))(batch, b)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.isnan(got[1]), np.isnan(want[1]))
    restored = jax.export.deserialize(jax.export.export(jax.jit(fast))(a, b).serialize())
    np.testing.assert_array_equal(restored.call(-a, b), ref(-a, b))
    np.testing.assert_allclose(restored.call(a, b), ref(a, b), rtol=1e-5, atol=1e-6)
    again = superopt(sum_of_logs, target="cpu", cache=tmp_path)
    np.testing.assert_array_equal(again(-a, b), ref(-a, b))
    assert again.report.cache.status == "hit" and again._last.term.guard.conditions


@pytest.mark.slow
def test_an_assumption_cannot_prove_itself(any_check):
    """exp(log(x)) -> x assumed where x >= 0 joins x's class with exp(...), whose analysis says nonneg: were the
    facts read from the speculative e-graph, the assumption would prove itself and go unchecked, and a negative
    x would give x where the original gives NaN. The facts come from the captured program alone."""
    mine = RuleSet("mine", [rule("spec-exp-log", exp(log(x)), x, given("nonneg", x), numerics="rounding",
                                 doc="exp(log(x)) -> x where x >= 0")])
    fast = superopt(lambda a: jnp.exp(jnp.log(a)) * 3.0, target="cpu", rulesets=[mine], cache=False)
    a = _positive(4)
    fast(a)
    assert fast._last.term.guard is not None and fast._last.term.guard.conditions == (("nonneg", 0),)
    np.testing.assert_array_equal(np.isnan(fast(-a)), np.ones(a.shape, bool))


@pytest.mark.slow
@pytest.mark.parametrize("fn", [lambda a, b: a ** 1.5 * b, lambda a, b: a ** 2.5 + b, lambda a, b: a ** 0.25 - b],
                         ids=["power-one-and-a-half", "power-two-and-a-half", "quarter-power-as-roots"])
def test_a_power_runs_as_roots_behind_a_check_it_pays_for(fn):
    """XLA's pow costs about seven exps an element; x ** 1.5 as x * sqrt(x) costs a few multiplies, and a check
    that x is positive (NaN and +inf pass) costs less than 5% of the pow: the strict search takes it, behind
    that check, by default. Where the check fails (a negative, zero or subnormal element) the original runs."""
    a, b = _positive(5), _positive(6)
    fast = superopt(fn, target="cpu", cache=False)
    fast(a, b)
    term = fast._last.term
    assert fast.report.optimized and term.guard is not None, fast.report.extraction
    assert term.guard.conditions == (("positive", 0),) and "pow 1->0" in str(fast.report), str(fast.report)
    ref = jax.jit(fn)
    np.testing.assert_allclose(fast(a, b), ref(a, b), rtol=1e-5, atol=1e-6)
    specials = jnp.asarray(np.resize(_VALUES, a.shape))
    for args in ((-a, b), (specials, b), (a.at[0, 0].set(0.0), b), (a.at[0, 0].set(-1e-45), b)):
        assert not guard_passes(term, *args)
        np.testing.assert_array_equal(fast(*args), ref(*args))
    inside = (jnp.abs(specials).at[jnp.abs(specials) < 1.2e-38].set(1.0), b)   # NaN, +inf and huge pass
    assert guard_passes(term, *inside)
    want, got = np.asarray(ref(*inside), np.float64), np.asarray(fast(*inside), np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-6)
