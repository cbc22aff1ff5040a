"""`superopt calibrate`: measure this machine's CPU and cache the figures the `cpu` target uses.

Matrix FLOP/s is a large f32 matmul under jax.jit (what XLA's CPU GEMM reaches, not the datasheet peak);
peak FLOP/s, the general units' rate, is a chain of multiply-adds over a cache-resident array, as XLA's
elementwise loops reach it;
memory bandwidth is a streaming elementwise op over an array much larger than the caches, counting the
bytes read and written, and cache bandwidth the same op over a few MiB. Each figure is measured in
`rounds` rounds of `repeats` timed runs after a warm-up, and the best is kept; `check` names the figures
whose rounds disagree by more than `DISAGREE` (a busy machine) and those below `TOO_LOW` of the shipped
defaults (`extract/targets/cpu.toml`), which `superopt calibrate` refuses to store without --force.

The cache is a small TOML file keyed to the machine (processor and core count): `cpu-calibration.toml`
in $SUPEROPT_CACHE_DIR, else $XDG_CACHE_HOME/superopt, else ~/.cache/superopt. `superopt calibrate
--reset` deletes it, and the `cpu` target goes back to the shipped defaults.
"""
from __future__ import annotations

import os
import platform
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp

CACHE_ENV = "SUPEROPT_CACHE_DIR"
FIELDS = ("peak_flops", "matrix_flops", "mem_bandwidth", "cache_bandwidth")
DISAGREE = 1.5    # rounds whose best and worst differ by more than this factor: the machine was busy
TOO_LOW = 1 / 4   # a figure below this fraction of the shipped default is not stored without --force
SHOWN = (("matrix_flops", "peak f32 matmul", 1e9, "GFLOP/s"),
         ("peak_flops", "elementwise multiply-adds", 1e9, "GFLOP/s"),
         ("mem_bandwidth", "memory bandwidth", 1e9, "GB/s"),
         ("cache_bandwidth", "cache bandwidth", 1e9, "GB/s"))


def cache_dir() -> Path:
    """superopt's cache directory: $SUPEROPT_CACHE_DIR, else $XDG_CACHE_HOME/superopt, else ~/.cache/superopt.
    The one rule for it: the calibration lives here, and so does the term store (`superopt/cache.py`)."""
    root = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "superopt")
    return Path(root)


def cache_path() -> Path:
    return cache_dir() / "cpu-calibration.toml"


def machine_key() -> str:
    return f"{platform.machine()} {platform.processor() or 'unknown'} x{os.cpu_count()}"


def cached_calibration() -> dict | None:
    """The cached figures for this machine, or None."""
    path = cache_path()
    if not path.exists():
        return None
    with path.open("rb") as f:
        data = tomllib.load(f)
    if data.get("machine") != machine_key():
        return None
    return {k: float(data[k]) for k in FIELDS if k in data}


def shipped_defaults() -> dict:
    """The figures of `extract/targets/cpu.toml`, which the cpu target uses when nothing is cached."""
    with (Path(__file__).parent / "targets" / "cpu.toml").open("rb") as f:
        data = tomllib.load(f)
    return {k: float(data[k]) for k in FIELDS if k in data}


@dataclass
class Measurement:
    figures: dict                                  # field -> the best of its rounds
    rounds: dict = field(default_factory=dict)     # field -> [the best of each round]
    sizes: dict = field(default_factory=dict)

    def spread(self, name: str) -> float:
        """Best over worst round of a figure (1.0: the rounds agree)."""
        runs = self.rounds.get(name) or [self.figures[name]]
        return max(runs) / min(runs) if min(runs) > 0 else float("inf")


def _best_time(fn, args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return min(times)


CHAIN = 16   # multiply-adds per element in the elementwise rate's chain


def _multiply_adds(v):
    for _ in range(CHAIN):
        v = v * 1.0001 + 0.5
    return v


def measure(matmul_size: int = 2048, stream_mib: int = 256, cache_mib: int = 4, repeats: int = 5,
            rounds: int = 3) -> Measurement:
    """Measure {peak_flops, matrix_flops, mem_bandwidth, cache_bandwidth} in `rounds` interleaved rounds
    (the last on a `cache_mib` array, which stays in the caches); each figure is its best round."""
    a = jnp.ones((matmul_size, matmul_size), jnp.float32)
    matmul = jax.jit(lambda x, y: x @ y)
    x = jnp.ones((stream_mib * 1024 * 1024 // 4,), jnp.float32)
    small = jnp.ones((cache_mib * 1024 * 1024 // 4,), jnp.float32)
    stream = jax.jit(lambda v: v * 1.5)
    chain = jax.jit(_multiply_adds)
    runs: dict[str, list] = {k: [] for k in FIELDS}
    for _ in range(max(1, rounds)):
        runs["matrix_flops"].append(2.0 * matmul_size ** 3 / _best_time(matmul, (a, a), repeats))
        # the chain's time beyond a plain pass over the same array: its arithmetic. A difference of two
        # timings is noise where it is small, so it counts at least half the chain's own time, and no
        # elementwise rate is above the matrix rate this round measured (what the machine can do at all)
        chained = _best_time(chain, (small,), 3 * repeats)
        extra = max(chained - _best_time(stream, (small,), 3 * repeats), chained / 2)
        runs["peak_flops"].append(min(2.0 * CHAIN * small.size / extra, runs["matrix_flops"][-1]))
        runs["mem_bandwidth"].append(2.0 * x.nbytes / _best_time(stream, (x,), repeats))
        runs["cache_bandwidth"].append(2.0 * small.nbytes / _best_time(stream, (small,), 3 * repeats))
    return Measurement({k: max(v) for k, v in runs.items()}, runs,
                       dict(matmul_size=matmul_size, stream_mib=stream_mib, cache_mib=cache_mib, repeats=repeats,
                            rounds=max(1, rounds)))


def check(m: Measurement, defaults: dict | None = None) -> tuple[list[str], list[str]]:
    """(warnings, refusals): figures whose rounds disagree by more than DISAGREE, and figures below TOO_LOW
    of the shipped defaults, each one line."""
    defaults = shipped_defaults() if defaults is None else defaults
    warnings, refusals = [], []
    for name, label, scale, unit in SHOWN:
        if name not in m.figures:
            continue
        spread = m.spread(name)
        if spread > DISAGREE:
            runs = ", ".join(f"{v / scale:.1f}" for v in m.rounds[name])
            warnings.append(f"{label}: runs disagree by {spread:.1f}x (more than {DISAGREE}x: {runs} {unit}); "
                            "the machine is busy, the best run is kept")
        if name in defaults and m.figures[name] < TOO_LOW * defaults[name]:
            refusals.append(f"{label}: {m.figures[name] / scale:.1f} {unit} is less than "
                            f"{TOO_LOW:.2g} of the shipped default ({defaults[name] / scale:.1f} {unit})")
    return warnings, refusals


def store(m: Measurement) -> Path:
    """Write the figures to the cache for this machine."""
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f'machine = "{machine_key()}"', f'measured = "{time.strftime("%Y-%m-%d %H:%M:%S")}"']
    lines += [f"{k} = {v}" for k, v in m.sizes.items()]
    lines += [f"{k} = {v:.6g}" for k, v in m.figures.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def reset() -> bool:
    """Delete the cached figures (the cpu target goes back to the shipped defaults); whether there were any."""
    path = cache_path()
    if not path.exists():
        return False
    path.unlink()
    return True


def calibrate(matmul_size: int = 2048, stream_mib: int = 256, cache_mib: int = 4, repeats: int = 5,
              rounds: int = 3) -> dict:
    """Measure, cache and return {peak_flops, matrix_flops, mem_bandwidth, cache_bandwidth} for this machine
    (no checks: `superopt calibrate` checks before it stores)."""
    m = measure(matmul_size, stream_mib, cache_mib, repeats, rounds)
    store(m)
    return m.figures
