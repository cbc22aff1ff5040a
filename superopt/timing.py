"""Side-by-side timing: candidates measured interleaved in one process, medians reported."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import jax


def interleaved_medians(fns: dict[str, Callable[[], object]], repeats: int = 9, warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each thunk, alternating between them so drift hits all alike."""
    for _ in range(warmup):
        for fn in fns.values():
            jax.block_until_ready(fn())
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) for name, s in samples.items()}
