"""Pallas kernels on a GPU: each template, and the BERT-base layer, against jax.jit of the same function.

Usage (from the repository root; ``make bench-gpu`` runs it)::

    python -m bench.gpu [--filter REGEX] [--repeats N] [--rounds R] [--output BENCHMARKS.md]

Needs a GPU that JAX sees (a CUDA build of jax); without one it refuses and exits with status 2, writing
nothing. The target is gpu-h100 on a Hopper GPU and gpu-a100 otherwise. For each workload, in one process:
``superopt(fn, target=..., backend="pallas")`` compiles its kernels with Triton, then the Pallas program
and ``jax.jit(fn)`` are timed interleaved (``superopt.timing.interleaved_medians``), the median of R
rounds of medians of N runs. The kernels each workload ran are listed by kind, so a row says which
templates it timed. The figures go into BENCHMARKS.md as the section "Pallas kernels on a GPU", with the
device named (an earlier such section is replaced, the rest of the file kept).
"""
from __future__ import annotations

import argparse
import datetime
import math
import re
import statistics
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from superopt import superopt
from superopt.timing import interleaved_medians

SECTION = "## Pallas kernels on a GPU"
HOPPER = ("H100", "H200", "H800", "GH200")


SHRINK = 1   # --dry-run divides every dimension by 16 (interpret mode on a CPU cannot run the real sizes)


def _normal(key: int, shape, dtype=jnp.float32, scale=1.0):
    shape = tuple(max(1, d // SHRINK) for d in shape)
    return (scale * jax.random.normal(jax.random.PRNGKey(key), shape, jnp.float32)).astype(dtype)


def elementwise():
    def fn(x, b, s):
        return jnp.tanh((x + b) * s) - jax.nn.relu(x)
    return fn, (_normal(0, (8192, 4096)), _normal(1, (4096,)), jnp.float32(0.5))


def softmax():
    return (lambda x: jax.nn.softmax(x, axis=-1)), (_normal(2, (8192, 2048)),)


def layer_norm():
    def fn(x, g, b):
        m = x.mean(-1, keepdims=True)
        v = jnp.square(x - m).mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(v + 1e-5) * g + b
    return fn, (_normal(3, (8192, 1024)), _normal(4, (1024,)), _normal(5, (1024,)))


def rms_norm():
    def fn(x, g):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g
    return fn, (_normal(6, (8192, 1024)), _normal(7, (1024,)))


def matmul_epilogue():
    def fn(x, w, b):
        return jax.nn.gelu(x @ w + b, approximate=True)
    bf = jnp.bfloat16
    return fn, (_normal(8, (4096, 1024), bf), _normal(9, (1024, 4096), bf, 1 / 32), _normal(10, (4096,), bf))


def gemm_chain():
    def fn(a, b, d):
        return (a @ b) @ d
    bf = jnp.bfloat16
    return fn, (_normal(11, (16, 512, 64), bf), _normal(12, (16, 64, 512), bf, 1 / 8),
                _normal(13, (16, 512, 64), bf, 1 / 22))


def attention():
    def fn(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)
    bf = jnp.bfloat16
    return fn, tuple(_normal(14 + i, (1, 12, 4096, 64), bf) for i in range(3))


def adam_update():
    def fn(p, m, v, g, c1, c2):
        m2 = 0.9 * m + 0.1 * g
        v2 = 0.999 * v + 0.001 * g * g
        return p - 1e-3 * (m2 / c1) / (jnp.sqrt(v2 / c2) + 1e-8), m2, v2
    shape = (4096, 4096)
    return fn, (_normal(20, shape), _normal(21, shape), jnp.abs(_normal(22, shape)), _normal(23, shape),
                jnp.float32(0.1), jnp.float32(0.001))


def bert_layer():
    from superopt.workloads import bert_encoder_layer
    wl = bert_encoder_layer(128)
    return wl.fn, wl.args


WORKLOADS = {
    "elementwise": ("tanh((x + b) * s) - relu(x), 8192x4096 f32", elementwise),
    "softmax": ("row softmax, 8192x2048 f32", softmax),
    "layernorm": ("layer norm, 8192x1024 f32", layer_norm),
    "rmsnorm": ("RMS norm, 8192x1024 f32", rms_norm),
    "matmul-epilogue": ("gelu(x @ W + b), 4096x1024 @ 1024x4096 bf16", matmul_epilogue),
    "gemm-chain": ("(A @ B) @ D, chain G3 (16x512x64x512) bf16", gemm_chain),
    "attention": ("softmax(QK^T/8) V, 12 heads, seq 4096, d 64, bf16", attention),
    "adam-update": ("Adam update of a 4096x4096 parameter and its moments, f32", adam_update),
    "bert-encoder-128": ("BERT-base encoder layer, batch 1, seq 128 (f32)", bert_layer),
}


def measure(name: str, target: str, repeats: int, rounds: int) -> dict:
    description, build = WORKLOADS[name]
    fn, args = build()
    base = jax.jit(fn)
    fast = superopt(fn, target=target, backend="pallas")
    spec = fast.compile(*args)
    program = spec.run
    kinds = program.kinds() if hasattr(program, "kinds") else {}
    thunks = {"jax.jit": lambda: base(*args), "pallas": lambda: fast(*args)}
    samples = [interleaved_medians(thunks, repeats=repeats) for _ in range(rounds)]
    jit_s = statistics.median(s["jax.jit"] for s in samples)
    pallas_s = statistics.median(s["pallas"] for s in samples)
    return {"name": name, "description": description, "backend": str(spec.report.backend).splitlines()[0],
            "kinds": kinds, "in_jax": len(getattr(program, "in_jax", [])), "jit_ms": jit_s * 1e3,
            "pallas_ms": pallas_s * 1e3, "ratio": pallas_s / jit_s}


def render(rows: list[dict], device: str, target: str, repeats: int, rounds: int) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    lines = [SECTION, "",
             f"Run: {when} (UTC) on {device}, jax {jax.__version__}, target `{target}`, kernels compiled with "
             f"Triton. `superopt(fn, target=\"{target}\", backend=\"pallas\")` against `jax.jit(fn)`, timed "
             f"interleaved in one process: the median over {rounds} rounds of the median of {repeats} runs. "
             "Reproduce with `make bench-gpu` (`python -m bench.gpu`).", "",
             "| workload | description | kernels by kind | ops in JAX | jax.jit (ms) | pallas (ms) | "
             "ratio pallas/jax.jit |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['description']} | error: {r['error']} | — | — | — | — |")
            continue
        kinds = ", ".join(f"{k} x{n}" for k, n in sorted(r["kinds"].items(), key=lambda kv: (-kv[1], kv[0])))
        lines.append(f"| {r['name']} | {r['description']} | {kinds or r['backend']} | {r['in_jax']} | "
                     f"{r['jit_ms']:.3f} | {r['pallas_ms']:.3f} | {r['ratio']:.3f} |")
    return "\n".join(lines + [""])


def write_section(path: Path, section: str) -> None:
    """Put `section` into the markdown file at `path`, replacing an earlier one (up to the next heading)."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    start = text.find(SECTION)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + ("\n" + text[end + 1:] if end >= 0 else "")
    path.write_text(text, encoding="utf-8")


def dry_run(pattern: str | None) -> int:
    """Each workload, shrunk, through `superopt(..., backend="pallas")` on whatever JAX runs here, its
    outputs compared with jax.jit's: the benchmark cannot rot between the times a GPU is available."""
    global SHRINK
    SHRINK = 16
    failed = 0
    for name, (description, build) in WORKLOADS.items():
        if pattern and not re.search(pattern, name):
            continue
        fn, args = build()
        try:
            fast = superopt(fn, target="gpu-h100", backend="pallas")
            got, want = fast(*args), jax.jit(fn)(*args)
            for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
                g, w = (jnp.asarray(v, jnp.float32) for v in (g, w))
                tol = 2e-2 if w.dtype != jnp.float32 or any(
                    a.dtype == jnp.bfloat16 for a in jax.tree.leaves(args)) else 1e-4
                if not bool(jnp.allclose(g, w, rtol=tol, atol=tol * float(jnp.max(jnp.abs(w))))):
                    raise AssertionError(f"outputs differ from jax.jit's (max |diff| "
                                         f"{float(jnp.max(jnp.abs(g - w))):.3g})")
            print(f"dry run: {name}: {str(fast.compile(*args).report.backend).splitlines()[0]}", file=sys.stderr)
        except Exception as exc:  # every workload is tried; the exit status says whether any failed
            failed += 1
            print(f"dry run: {name} FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.splitlines()[0])
    ap.add_argument("--filter", help="regex over the workload names (default: all)")
    ap.add_argument("--repeats", type=int, default=20, help="timed runs per round after warm-up")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    ap.add_argument("--output", default="BENCHMARKS.md", help="markdown file to put the section in")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU needed: every workload at 1/16 of its size in interpret mode, checked against "
                         "jax.jit, nothing timed or written (what `.ci/gpu-run --dry-run` runs)")
    ns = ap.parse_args(argv)
    if ns.dry_run:
        return dry_run(ns.filter)
    if jax.default_backend() != "gpu":
        print(f"bench-gpu: no GPU: JAX's backend here is {jax.default_backend()!r}. The Pallas kernels only "
              "compile on a GPU (on a CPU they run in interpret mode, which says nothing about speed), so "
              "nothing was timed and BENCHMARKS.md is unchanged. Run this on a machine with an NVIDIA GPU "
              "and a CUDA build of jax.", file=sys.stderr)
        return 2
    device = jax.devices()[0].device_kind
    target = "gpu-h100" if any(h in device for h in HOPPER) else "gpu-a100"
    names = [n for n in WORKLOADS if not ns.filter or re.search(ns.filter, n)]
    rows = []
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {name} on {device} ...", file=sys.stderr, flush=True)
        try:
            row = measure(name, target, ns.repeats, ns.rounds)
        except Exception as exc:  # report the failure in the table and carry on
            row = {"name": name, "description": WORKLOADS[name][0], "error": f"{type(exc).__name__}: {exc}"}
            print(f"    FAILED: {row['error']}", file=sys.stderr, flush=True)
        else:
            print(f"    jax.jit {row['jit_ms']:.3f} ms, pallas {row['pallas_ms']:.3f} ms, ratio {row['ratio']:.3f}",
                  file=sys.stderr, flush=True)
        rows.append(row)
    write_section(Path(ns.output), render(rows, device, target, ns.repeats, ns.rounds))
    print(f"wrote the section to {ns.output}", file=sys.stderr)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
