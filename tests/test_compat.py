"""The version adapters (egraph/egglog_api.py, core/jax_compat.py): each branch runs here, the newer releases'
shapes of the API simulated where this environment has the older release, and the declared ranges agree."""
import tomllib
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend import core as jcore

from superopt.core import jax_compat
from superopt.core.verify import compare_outputs
from superopt.egraph import egglog_api as api
from superopt.egraph.capture import capture
from superopt.lowering.jax import lower

ROOT = Path(__file__).resolve().parents[1]


def _declared(name: str) -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(d for d in deps if d.split(">")[0].split("=")[0].split("[")[0].strip() == name)


@pytest.mark.parametrize("name, module", [("egglog", api), ("jax", jax_compat)])
def test_the_declared_range_is_the_adapters_and_admits_the_installed_release(name, module):
    low, high = module.SUPPORTED
    spec = _declared(name)
    assert f">={'.'.join(map(str, low))}" in spec and f"<{'.'.join(map(str, high))}" in spec, spec
    assert "[" not in spec, "no extra in the base dependency: a CUDA build of jax stays the user's"
    assert low <= module.VERSION < high


@pytest.mark.parametrize("text, want", [("13.2.0", (13, 2, 0)), ("14.0.0rc1", (14, 0, 0)),
                                        ("0.12.0.1", (0, 12, 0, 1)), ("0.10.2.dev20260601", (0, 10, 2))])
def test_release_strings_are_read_by_their_leading_numbers(text, want):
    assert api.parse_version(text) == want and jax_compat.parse_version(text) == want


# ---- egglog -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("report, matches, held", [
    (SimpleNamespace(updated=True), 0, True),                     # egglog 13.2: updated, no matches
    (SimpleNamespace(updated=False), 0, False),                   # 13.2: nothing to apply
    (SimpleNamespace(updated=True), 7, False),                    # 13.2: applied
    (SimpleNamespace(updated=False, can_stop=False), 0, True),    # egglog 14.0: not updated, cannot stop
    (SimpleNamespace(updated=False, can_stop=True), 0, False),    # 14.0: nothing to apply
    (SimpleNamespace(updated=True, can_stop=False), 7, False),    # 14.0: applied
])
def test_a_rule_the_back_off_scheduler_held_back_is_read_in_either_releases_report(report, matches, held):
    assert api.held_back(report, matches) is held


def test_names_the_expression_layer_never_declared_are_not_declared_and_not_added():
    from superopt.egraph.encode import encode
    egraph = encode(capture(lambda a: a * 2, (jnp.ones(3),)).graph).egraph
    refs = egraph._state.egg_fn_to_callable_refs
    before = dict(refs)
    assert api.declares(egraph, "binary") and not api.declares(egraph, "no_such_function")
    assert dict(refs) == before                 # 13.2's defaultdict gained no key; 14.0's dict raised none
    plain = SimpleNamespace(_state=SimpleNamespace(egg_fn_to_callable_refs=dict(before)))   # 14.0's shape
    assert api.declares(plain, "binary") and not api.declares(plain, "no_such_function")
    sizes = api.table_sizes(egraph)
    assert sizes["binary"] == 1 and "superopt_encode_ref" not in sizes


def test_rules_kept_as_data_name_their_egglog_release_and_another_release_is_refused():
    from superopt.egraph import saved
    from superopt.rulesets.algebra import ALGEBRA
    data = saved.rules_to_data([tuple(list(ALGEBRA)[0].egg)])
    assert data["egglog"] == api.DATA_FORM and saved.rules_from_data(data)
    with pytest.raises(ValueError, match="written by"):
        saved.rules_from_data({**data, "egglog": "egglog 99.0.0"})


# ---- JAX ----------------------------------------------------------------------------------------------------------

def test_scan_counts_from_either_releases_params():
    closed = jax.make_jaxpr(lambda c, xs, w: lax.scan(lambda c, x: (c + x * w, c), c, xs))(0.0, jnp.ones(3), 2.0)
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "scan"]
    assert jax_compat.scan_counts(eqn.params) == (1, 1)
    assert jax_compat.scan_counts({"num_consts": 2, "num_carry": 3}) == (2, 3)      # JAX 0.10 and 0.11
    tree = SimpleNamespace(unpack=lambda: ([None] * 2, [None] * 3, [None]))           # JAX 0.12's ft_in
    assert jax_compat.scan_counts({"ft_in": tree, "ft_out": None}) == (2, 3)


X = jnp.linspace(-0.95, 0.95, 24, dtype=jnp.float32).reshape(4, 6)


@pytest.mark.parametrize("name, params, args, want", [
    ("one_minus_square", {}, (X,), lambda x: 1 - x * x),
    ("log2", {"accuracy": None}, (jnp.abs(X) + 0.5,), np.log2),
    ("polynomial", {}, (X, 1.0, 5.0, 2.0), lambda x: 1 + 5 * x + 2 * x * x),
])
def test_the_expansions_compute_what_the_primitive_does(name, params, args, want):
    avals = [jax.typeof(a) for a in args]
    fn = jax_compat.expansion(name, params, avals)
    got = np.asarray(fn(*map(jnp.asarray, args)), np.float64)
    np.testing.assert_allclose(got, want(np.asarray(args[0], np.float64)), rtol=2e-6, atol=2e-6)


def test_an_expansion_is_only_where_the_lowering_computes_the_same():
    f32 = jax.typeof(X)
    assert jax_compat.expansion("log2", {"accuracy": "highest"}, [f32]) is None
    assert jax_compat.expansion("log2", {"accuracy": None}, [jax.typeof(X.astype(jnp.complex64))]) is None
    assert jax_compat.expansion("polynomial", {}, [f32] * 10) is None        # 9 terms: a scan in JAX's lowering
    assert jax_compat.expansion("polynomial", {"unroll": 2}, [f32] * 4) is None
    assert jax_compat.expansion("tanh", {}, [f32]) is None


def _standin(name):
    """A primitive named as JAX 0.12's, computing it, for a release that lacks it."""
    fns = {"one_minus_square": lambda x: 1 - x * x, "log2": jnp.log2}
    prim = jcore.Primitive(name)
    prim.def_impl(lambda x, **_: fns[name](x))
    prim.def_abstract_eval(lambda x, **_: jax.core.ShapedArray(x.shape, x.dtype))
    return prim


@pytest.mark.parametrize("name, params", [("one_minus_square", {}), ("log2", {"accuracy": None})])
def test_capture_models_a_newer_releases_primitive_through_its_expansion(name, params):
    prim = _standin(name) if not hasattr(lax, f"{name}_p") else getattr(lax, f"{name}_p")
    fn = lambda a: prim.bind(jnp.abs(a) + 0.25, **params) * 3    # noqa: E731
    graph = capture(fn, (X,)).graph
    assert "opaque" not in graph.op_counts()
    got = lower(graph)(X)
    assert compare_outputs([np.asarray(fn(X))], [np.asarray(g) for g in got]) is None
