"""Whole models in seconds: optimizing in segments and from the persistent cache, each case in fresh processes.

`python -m bench.scale` (run by `make bench` after `bench.run`) replaces its section of BENCHMARKS.md.
Every figure is a fresh Python process's, so it includes what a user's first call pays: importing superopt,
compiling the rules, the fork of saturation's child process, verification and XLA's compilation:

- 12 BERT-base layers (seq 128, f32, one set of weights per call passed as arguments) on cpu: cold (an
  empty cache directory) and warm (a new process over the cache the cold run filled), to the first result
  of a call with real arrays; the model gain per layer against one layer optimized whole.
- A Llama-style decoder (d 4096, 32 query / 8 key-value heads, SwiGLU 11008, RMSNorm; seq 128) given by its
  shapes only (`fast.compile` of `jax.ShapeDtypeStruct`s: no weight is materialized), at 8 and 32 layers,
  on cpu and npu-910b (the emulator lowers and checks each distinct segment), cold and warm: wall time and
  the process's peak RSS (`ru_maxrss`), which is superopt's own (verification's random inputs of one
  segment's shapes, the largest part).
- The first call of a 3-op function in a process whose cache holds it: the time beyond importing JAX
  (importing superopt, capture, the cache lookup, lowering, XLA's compilation and the call), median of 5,
  with superopt's modules compiled to bytecode first, as an installed wheel has them.
"""
from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

SECTION = "## Whole models: segments and the cache"
OUTPUT = "BENCHMARKS.md"

_BERT = """
import time, json, resource
t0 = time.perf_counter()
import jax, jax.numpy as jnp
from superopt import superopt
from superopt.workloads import bert_encoder_layer
wl = bert_encoder_layer(128)
params, x, mask = wl.args
LAYERS = {layers}
def model(layers, x, mask):
    for p in layers:
        x = wl.fn(p, x, mask)
    return x
layers = [params] * LAYERS
fast = superopt(model, cache={cache!r})
start = time.perf_counter()
jax.block_until_ready(fast(layers, x, mask))
r = fast.report
print(json.dumps(dict(seconds=time.perf_counter() - start, total=time.perf_counter() - t0, segments=str(r.segments),
                      cache=str(r.cache), gain=r.cost_before / r.cost_after, outcome=r.outcome, backend=r.backend,
                      rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)))
"""

_LLAMA = """
import time, json, math, resource
import jax, jax.numpy as jnp
from superopt import superopt
LAYERS, D, HEADS, KV, FFN, SEQ = {layers}, 4096, 32, 8, 11008, 128
HEAD, GROUP = D // HEADS, HEADS // KV

def rms(x, g):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g

def block(p, x, mask):
    h = rms(x, p["n1"])
    q = (h @ p["wq"]).reshape(1, SEQ, KV, GROUP, HEAD)
    k = (h @ p["wk"]).reshape(1, SEQ, KV, HEAD)
    v = (h @ p["wv"]).reshape(1, SEQ, KV, HEAD)
    s = jnp.einsum("bqkgd,bskd->bkgqs", q, k) / math.sqrt(HEAD) + mask
    ctx = jnp.einsum("bkgqs,bskd->bqkgd", jax.nn.softmax(s, axis=-1), v).reshape(1, SEQ, D)
    x = x + ctx @ p["wo"]
    h = rms(x, p["n2"])
    return x + (jax.nn.silu(h @ p["wg"]) * (h @ p["wu"])) @ p["wd"]

def model(layers, x, mask):
    for p in layers:
        x = block(p, x, mask)
    return x

f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
layer = dict(n1=f32(D), wq=f32(D, D), wk=f32(D, KV * HEAD), wv=f32(D, KV * HEAD), wo=f32(D, D), n2=f32(D),
             wg=f32(D, FFN), wu=f32(D, FFN), wd=f32(FFN, D))
start = time.perf_counter()
spec = superopt(model, {target!r}, cache={cache!r}).compile([layer] * LAYERS, f32(1, SEQ, D), f32(SEQ, SEQ))
r = spec.report
print(json.dumps(dict(seconds=time.perf_counter() - start, segments=str(r.segments), cache=str(r.cache),
                      gain=r.cost_before / r.cost_after, outcome=r.outcome, backend=r.backend,
                      rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)))
"""

_SMALL = """
import time, json
t0 = time.perf_counter()
import jax, jax.numpy as jnp
t1 = time.perf_counter()
from superopt import superopt
f = superopt(lambda x: x * 2 + 1, cache={cache!r})
jax.block_until_ready(f(jnp.ones((4, 4))))
t2 = time.perf_counter()
print(json.dumps(dict(jax_import=t1 - t0, beyond_jax=t2 - t1, cache=str(f.report.cache))))
"""


def child(code: str, timeout: float = 900) -> dict:
    """Run `code` in a fresh Python process; the JSON line it prints last, or an error."""
    try:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(error=f"did not finish within {timeout:g} s")
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode or not lines:
        return dict(error=(out.stderr.strip().splitlines() or ["no output"])[-1][:200])
    return json.loads(lines[-1])


def _short(text: str, width: int = 160) -> str:
    text = text.replace("|", "/").replace("\n", " ")
    return text if len(text) <= width else text[:width - 3] + "..."


def _mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MB"


# The folders of superopt's modules (its sub-packages map to the checkout's top-level folders: pyproject.toml).
_FOLDERS = ("superopt", "superopt.egraph", "superopt.rewrites", "superopt.rulesets", "superopt.extract",
            "superopt.lowering")


def compile_bytecode() -> None:
    """Compile superopt's modules to bytecode, as installing the wheel does: a checkout whose environment sets
    PYTHONDONTWRITEBYTECODE would otherwise compile every source file again in every process (0.25 s here)."""
    for name in _FOLDERS:
        for folder in importlib.util.find_spec(name).submodule_search_locations:
            compileall.compile_dir(folder, quiet=1)


def measure(llama_targets=("cpu", "npu-910b"), small_runs: int = 5) -> list[str]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        one = child(_BERT.format(layers=1, cache=False))
        cache = os.path.join(tmp, "bert")
        cold = child(_BERT.format(layers=12, cache=cache))
        warm = child(_BERT.format(layers=12, cache=cache))
        rows.append(("12 BERT-base layers, cpu", cold, warm, one))
        for target in llama_targets:
            for layers in (8, 32):
                cache = os.path.join(tmp, f"llama-{target}-{layers}")
                cold = child(_LLAMA.format(layers=layers, target=target, cache=cache))
                warm = child(_LLAMA.format(layers=layers, target=target, cache=cache))
                rows.append((f"Llama-style decoder, {layers} layers (shapes only), {target}", cold, warm, None))
        cache = os.path.join(tmp, "small")
        compile_bytecode()
        first = child(_SMALL.format(cache=cache))
        small = [child(_SMALL.format(cache=cache)) for _ in range(small_runs)]
    return render(rows, first, small)


def _cell(r: dict, key: str, fmt) -> str:
    return f"error: {r['error']}" if "error" in r else fmt(r[key])


def render(rows, first: dict, small: list[dict]) -> list[str]:
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    lines = [SECTION, "",
             f"Run: {when} (UTC), `python -m bench.scale`, on the 2-core development machine. Each figure is one "
             "fresh process (module doc of `bench/scale.py`): cold is an empty cache directory, warm a new process "
             "over the directory the cold run filled. Programs are optimized in segments, each distinct segment once "
             "(docs/design.md, \"Segments and the cache\").", "",
             "| program | cold | warm | segments (cold) | model gain | runs on (cold) | peak RSS cold / warm |",
             "|---|---|---|---|---|---|---|"]
    for name, cold, warm, one in rows:
        gain = _cell(cold, "gain", lambda g: f"{g:.2f}x" if math.isfinite(g) else "- (the model prices the "
                                                                                 "original at inf)")
        if one is not None and "error" not in one:
            gain += f" (one layer whole: {one['gain']:.2f}x)"
        rss = "error" if "error" in cold or "error" in warm else f"{_mb(cold['rss'])} / {_mb(warm['rss'])}"
        lines.append(f"| {name} | {_cell(cold, 'seconds', lambda s: f'{s:.1f} s')} | "
                     f"{_cell(warm, 'seconds', lambda s: f'{s:.2f} s')} | {_cell(cold, 'segments', str)} | "
                     f"{gain} | {_cell(cold, 'backend', _short)} | {rss} |")
    ok = [r for r in small if "error" not in r]
    lines += [""]
    if ok:
        beyond = statistics.median(r["beyond_jax"] for r in ok)
        lines.append(f"The first call of `x * 2 + 1` (4x4) in a new process whose cache holds it, superopt's "
                     f"modules compiled to bytecode as an installed wheel has them: "
                     f"{beyond:.2f} s beyond importing JAX (median of {len(ok)} processes; range "
                     f"{min(r['beyond_jax'] for r in ok):.2f} to {max(r['beyond_jax'] for r in ok):.2f} s; "
                     f"importing JAX took {statistics.median(r['jax_import'] for r in ok):.2f} s). "
                     f"With an empty cache the same call took "
                     f"{_cell(first, 'beyond_jax', lambda s: f'{s:.2f} s')} beyond importing JAX.")
    lines.append("")
    return lines


def replace_section(path: str, lines: list[str], section: str = SECTION) -> None:
    """Replace `section` (this benchmark's, by default) of the markdown file `path` with `lines` (appended where
    it has none; the file is created where there is none)."""
    old = ""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            old = f.read()
    start = old.find(section)
    new = "\n".join(lines).rstrip("\n") + "\n"
    if start < 0:
        text = (old.rstrip("\n") + "\n\n" if old.strip() else "") + new
    else:
        end = old.find("\n## ", start + len(section))
        text = old[:start] + new + (old[end + 1:] if end >= 0 else "")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.splitlines()[0])
    ap.add_argument("--llama-targets", default="cpu,npu-910b",
                    help="comma-separated targets of the Llama rows (default cpu,npu-910b)")
    ap.add_argument("--output", default=OUTPUT)
    ns = ap.parse_args(argv)
    lines = measure(tuple(t for t in ns.llama_targets.split(",") if t))
    print("\n".join(lines))
    replace_section(ns.output, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
