"""What the kernel benchmarks (bench/everyday.py, bench/loops.py) share: a kernel optimized by superopt under
each numerics mode with the optimization timed, and callables timed interleaved sample by sample. Whether two
callables compile to one executable is superopt's own `superopt.lowering.hlo.executable`.
"""
from __future__ import annotations

import math
import statistics
import time

MODES = ("strict", "fast")


def optimized(fn, args, modes=MODES) -> tuple[dict, dict]:
    """Per numerics mode, superopt's callable for `fn` (a fresh cache: `cache=False`), optimized by its first
    call on `args`, and the seconds that first call took."""
    import jax
    from superopt import superopt
    callables, seconds = {}, {}
    for mode in modes:
        callables[mode] = superopt(fn, cache=False, numerics=mode)
        start = time.perf_counter()
        jax.block_until_ready(callables[mode](*args))
        seconds[mode] = time.perf_counter() - start
    return callables, seconds


def interleaved(callables: dict, args, samples: int, sample_s: float = 0.02) -> tuple[dict, int]:
    """Median per-call seconds of each callable: each sample times enough back-to-back calls to take about
    `sample_s` (counted from the first callable's cost) and divides, the callables alternating sample by
    sample, so drift hits all alike. Returns the medians and the calls per sample."""
    import jax
    from bench.callcost import per_call
    first = next(iter(callables.values()))
    jax.block_until_ready(first(*args))
    one = max(per_call(first, args, 3), 1e-7)
    calls = max(1, int(sample_s / one))
    times = {k: [] for k in callables}
    for _ in range(samples):
        for k, f in callables.items():
            times[k].append(per_call(f, args, calls))
    return {k: statistics.median(v) for k, v in times.items()}, calls


def geomean(values) -> float:
    values = list(values)
    return math.exp(statistics.fmean(math.log(v) for v in values))


def short(text: str, width: int = 80) -> str:
    """`text` on one line for a markdown table cell, cut to `width` characters."""
    text = text.replace("|", "/").replace("\n", " ")
    return text if len(text) <= width else text[:width - 3] + "..."





