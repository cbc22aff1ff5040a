"""Targets as data: hardware figures read from `extract/targets/<name>.toml`."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

_DIR = Path(__file__).parent / "targets"


@dataclass(frozen=True)
class Target:
    name: str
    kind: str                 # "cpu", "gpu" or "npu"
    peak_flops: float         # FLOP/s
    mem_bandwidth: float      # bytes/s between memory and the compute units
    launch_overhead: float    # seconds per kernel
    transcendental_flops: float = 20.0


def available_targets() -> list[str]:
    return sorted(p.stem for p in _DIR.glob("*.toml"))


def load_target(name: str) -> Target:
    path = _DIR / f"{name}.toml"
    if not path.exists():
        raise ValueError(f"superopt: unknown target {name!r}; valid targets: {', '.join(available_targets())}")
    with path.open("rb") as f:
        data = tomllib.load(f)
    return Target(**data)
