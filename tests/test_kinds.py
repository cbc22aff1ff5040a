"""Target kinds as registered cost models: a toy kind is a TOML file, a model and a registry line, and superopt
prices, chooses and reports with it like any built-in kind (issue 59: "a new kind touches only those")."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from superopt import superopt
from superopt.core import kinds
from superopt.extract.models import registry
from superopt.extract.models.base import KindModel
from superopt.extract.models.breakdown import Breakdown
from superopt.extract.target import load_target

TOY_TOML = """
name = "toy-chip"
kind = "toy"
peak_flops = 1.0e11
mem_bandwidth = 5.0e10
launch_overhead = 2.0e-6
"""


class ToyModel(KindModel):
    """A roofline and nothing else: each kernel is its FLOPs at peak or its bytes at bandwidth, plus a launch."""
    kind = "toy"

    def __init__(self):
        self.kernels = 0

    def kernel(self, k, moved, matrix_rate, body, ins, out, target, tiling=None, l2_moved=0.0, packed=False):
        self.kernels += 1
        return Breakdown(max(k.flops / target.peak_flops, moved / target.mem_bandwidth) + target.launch_overhead,
                         k.flops, moved)


@pytest.fixture
def toy(tmp_path):
    model = ToyModel()
    registry.register("toy", model)
    path = tmp_path / "toy-chip.toml"
    path.write_text(TOY_TOML)
    yield model, str(path)
    registry.MODELS.pop("toy")
    kinds.KINDS.remove("toy")


def test_a_toy_kind_is_a_toml_a_model_and_a_registry_line(toy):
    model, path = toy
    target = load_target(path)
    assert (target.name, target.kind) == ("toy-chip", "toy") and registry.model_of(target) is model

    def fn(a, b):
        return jnp.diag(a @ b)   # the diagonal of a product, without the product: cheaper under any roofline

    a, b = (np.random.default_rng(k).standard_normal((128, 128)).astype(np.float32) for k in (0, 1))
    fast = superopt(fn, target=path, cache=False)
    out = fast(a, b)
    np.testing.assert_allclose(out, jax.jit(fn)(a, b), rtol=1e-5, atol=1e-5)
    assert model.kernels > 0                       # the toy model priced the kernels
    report = fast.report
    assert report.optimized, report.outcome
    assert report.target == "toy-chip" and report.target_spec.kind == "toy"
    assert report.cost_after < report.cost_before
    assert fast.options.backend == "jax"   # the kind declares no backend of its own


def test_a_rule_may_name_a_registered_kind_and_no_other(toy):
    from superopt.rewrites.pattern import unary
    from superopt.rewrites.rule import rule
    from superopt.rulesets.algebra import x
    twice = unary("neg", unary("neg", x))
    written = rule("toy-only-double-negation", twice, x, doc="--x is x", targets=("toy",))
    assert written.targets == ("toy",)
    with pytest.raises(ValueError, match="unknown target kinds"):
        rule("nowhere-double-negation", twice, x, doc="--x is x", targets=("tpu",))


def test_a_target_of_an_unregistered_kind_is_refused_naming_the_valid_ones(tmp_path):
    path = tmp_path / "tpu-chip.toml"
    path.write_text(TOY_TOML.replace('"toy"', '"tpu"').replace("toy-chip", "tpu-chip"))
    with pytest.raises(ValueError, match=r"unknown target kind 'tpu'; valid: cpu, gpu, npu"):
        load_target(str(path))
    with pytest.raises(TypeError, match="must be a KindModel"):
        registry.register("tpu", object())
    assert "tpu" not in kinds.KINDS


def test_every_declared_kind_has_a_model_that_prices_its_targets():
    from superopt.extract.cost import op_cost
    from superopt.extract.target import available_targets
    for name in available_targets():
        target = load_target(name)
        assert target.kind in kinds.KINDS and registry.model_of(target).kind == target.kind
        assert 0 < op_cost("exp", (), [((256, 256), "float32")], ((256, 256), "float32"), target) < 1
