"""`superopt calibrate`: measure this machine's CPU and cache the figures the `cpu` target uses.

Peak FLOP/s is a large f32 matmul under jax.jit (what XLA's CPU GEMM reaches, not the datasheet peak);
memory bandwidth is a streaming elementwise op over an array much larger than the caches, counting the
bytes read and written, and cache bandwidth the same op over a few MiB. Each figure is the best of several timed runs after a warm-up. The cache is a
small TOML file keyed to the machine (processor and core count), in $SUPEROPT_CACHE_DIR or
~/.cache/superopt.
"""
from __future__ import annotations

import os
import platform
import time
import tomllib
from pathlib import Path

CACHE_ENV = "SUPEROPT_CACHE_DIR"
FIELDS = ("peak_flops", "matrix_flops", "mem_bandwidth", "cache_bandwidth")


def cache_path() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "superopt")
    return Path(root) / "cpu-calibration.toml"


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


def _best_time(fn, args, repeats: int) -> float:
    import jax
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return min(times)


def calibrate(matmul_size: int = 2048, stream_mib: int = 256, cache_mib: int = 4, repeats: int = 5) -> dict:
    """Measure, cache and return {peak_flops, matrix_flops, mem_bandwidth, cache_bandwidth} for this machine
    (the last on a `cache_mib` array, which stays in the caches)."""
    import jax
    import jax.numpy as jnp
    a = jnp.ones((matmul_size, matmul_size), jnp.float32)
    flops = 2.0 * matmul_size ** 3 / _best_time(jax.jit(lambda x, y: x @ y), (a, a), repeats)
    x = jnp.ones((stream_mib * 1024 * 1024 // 4,), jnp.float32)
    stream = jax.jit(lambda v: v * 1.5)
    bandwidth = 2.0 * x.nbytes / _best_time(stream, (x,), repeats)
    small = jnp.ones((cache_mib * 1024 * 1024 // 4,), jnp.float32)
    cached = 2.0 * small.nbytes / _best_time(stream, (small,), 3 * repeats)
    figures = {"peak_flops": flops, "matrix_flops": flops, "mem_bandwidth": bandwidth, "cache_bandwidth": cached}
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f'machine = "{machine_key()}"', f'measured = "{time.strftime("%Y-%m-%d %H:%M:%S")}"',
             f"matmul_size = {matmul_size}", f"stream_mib = {stream_mib}", f"cache_mib = {cache_mib}"]
    lines += [f"{k} = {v:.6g}" for k, v in figures.items()]
    path.write_text("\n".join(lines) + "\n")
    return figures
