"""The kinds of target superopt prices, declared once: a chip of a known kind is one TOML file
(`extract/targets/<name>.toml`, its `kind` one of these), and each kind is a cost model in the model registry
(`extract/models/registry.py`), which declares here a kind it registers later (a plug-in's, a test's toy kind).
Rules name the kinds whose cost model they are written for (`rule(..., targets=("gpu",))`)."""
from __future__ import annotations

KINDS: list[str] = ["cpu", "gpu", "npu"]


def declare(kind: str) -> None:
    """Add `kind` to the kinds targets and rules may name (the model registry's `register` calls it)."""
    if not kind or not kind.replace("-", "").isalnum():
        raise ValueError(f"superopt: a target kind is a lowercase word such as 'cpu', got {kind!r}")
    if kind not in KINDS:
        KINDS.append(kind)


def check_kind(kind: str, where: str) -> str:
    """`kind`, or a ValueError naming `where` it was given and the valid kinds."""
    if kind not in KINDS:
        raise ValueError(f"superopt: {where}: unknown target kind {kind!r}; valid: {', '.join(KINDS)}")
    return kind
