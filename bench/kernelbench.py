"""What the kernel benchmarks (bench/everyday.py, bench/loops.py) share: a kernel optimized by superopt under
each numerics mode with the optimization timed, callables timed interleaved sample by sample, and the compiled
executables of two callables compared.
"""
from __future__ import annotations

import math
import re
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


_METADATA = re.compile(r',?\s*metadata=\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\}')
_COMMENT = re.compile(r"/\*.*?\*/")
_REFERENCE = re.compile(r"%([\w.\-]+)")
_PARAMETER = re.compile(r"([(,]\s*)[\w.\-]+: ")
_HEADER = re.compile(r"^(ENTRY )?%([\w.\-]+) (.*) \{$")
_INSTRUCTION = re.compile(r"^\s*(ROOT )?%([\w.\-]+) = (.*)$")


def executable(jitted, args) -> str:
    """A digest of the optimized HLO that XLA compiles `jitted` (anything with jax.jit's `.lower`) to for
    `args`, blind to what does not change the program: the module's name and source-location tables, op
    metadata, the names of instructions, computations and parameters, and the order of independent
    instructions (each instruction is digested from its text with every operand and called computation
    replaced by that one's digest). Two callables compile to the same executable exactly when these are equal."""
    return hlo_digest(jitted.lower(*args).compile().as_text())


def hlo_digest(text: str) -> str:
    """`executable`'s digest of an HLO module's text: its entry computation's."""
    import hashlib

    def digest(s: str) -> str:
        return hashlib.sha1(s.encode()).hexdigest()[:16]

    text = _COMMENT.sub("", _METADATA.sub("", text))
    done: dict[str, str] = {}          # computation name -> digest (callees are printed before callers)
    entry, current = None, None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            current = dict(name=header.group(2), entry=bool(header.group(1)), root="", body=[], local={},
                           signature=_PARAMETER.sub(r"\1", header.group(3)))
            continue
        if current is None:
            continue
        if line.strip() == "}":
            key = digest("\n".join([current["signature"], current["root"], *sorted(current["body"])]))
            done[current["name"]] = key
            entry = key if current["entry"] else entry
            current = None
            continue
        instruction = _INSTRUCTION.match(line)
        if instruction:
            local = current["local"]
            rest = _REFERENCE.sub(lambda m: "%" + local.get(m.group(1), done.get(m.group(1), m.group(1))),
                                  instruction.group(3))
            local[instruction.group(2)] = key = digest(rest)
            current["body"].append(key)
            if instruction.group(1):
                current["root"] = key
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return entry

