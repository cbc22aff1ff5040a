"""Target kinds as registered cost models: one table from each kind (`core/kinds.py`) to its model
(`extract/models/<kind>.py`, a `base.KindModel`). A new kind is a TOML file naming it, a model and a line here
(or, from outside the package, a `register` call: tests/test_kinds.py registers a toy kind)."""
from __future__ import annotations

from superopt.core import kinds
from superopt.extract.models import cpu, gpu, npu
from superopt.extract.models.base import KindModel

MODELS: dict[str, KindModel] = {
    "cpu": cpu.MODEL,
    "gpu": gpu.MODEL,
    "npu": npu.MODEL,
}
assert set(MODELS) == set(kinds.KINDS), "every kind declared in core/kinds.py has a model, and only those"


def register(kind: str, model: KindModel) -> None:
    """Make `kind` a target kind whose programs `model` prices (a TOML file may then name it)."""
    if not isinstance(model, KindModel):
        raise TypeError(f"superopt: the model of kind {kind!r} must be a KindModel, got {type(model).__name__}")
    kinds.declare(kind)
    MODELS[kind] = model


def model_of(target) -> KindModel:
    """The cost model of a `Target` (or of a kind's name)."""
    kind = target if isinstance(target, str) else target.kind
    try:
        return MODELS[kind]
    except KeyError:
        raise ValueError(f"superopt: no cost model for target kind {kind!r}; registered: "
                         f"{', '.join(MODELS)}") from None
