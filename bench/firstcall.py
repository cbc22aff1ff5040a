"""First calls: what superopt's first call costs over jax.jit's, cold, in one process (issue 56).

    python -m bench.firstcall [--output BENCHMARKS.md]

Four measurements, each superopt's first call (`cache=False`: nothing from an earlier process) against
jax.jit's first call of the same function on the same arguments (trace, compile and run), in one process
after one warm-up of each (imports, XLA's backend, and every rule of the default rule sets compiled and
registered: a process pays that once, whichever program comes first), float32 on the cpu target:

1. **Programs superopt keeps**: every kernel of the everyday and loop benchmarks (bench/everyday.py,
   bench/loops.py) whose strict first call keeps the original; the median extra seconds over jax.jit's
   first call (the goal: at most 0.3 s), and the stages that took them.
2. **A transformer LM's loss and gradient**: token embedding, two pre-norm decoder layers (causal attention,
   GELU MLP), a tied LM head and a cross-entropy loss, written in plain JAX (flax is not among superopt's
   dependencies), `jax.jit(jax.value_and_grad(superopt(loss)))` against `jax.jit(jax.value_and_grad(loss))`
   (the goal: at most 2x).
3. **New batch sizes**: two functions (a two-layer MLP with layer norm, which superopt keeps, and a Gram
   matrix times a vector, which it changes) each called at 5 batch sizes in turn; each new size's first call
   (the goal: at most 1.5x jax.jit's compile at that size).
4. **Identical blocks**: 2 and 12 decoder blocks of bench/loops.py's layer unrolled in Python (weights as a
   list of per-block dicts): the distinct segments and the cold first call (the goal: 12 blocks at most
   1.5x 2 blocks').

The load average is stated with the figures: the machine is shared.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

SECTION = "## First calls against jax.jit"


def _first(fn, args) -> float:
    import jax
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def warm_up() -> None:
    """What a process pays once, before its first call: imports, XLA's backend, and the default rule sets
    compiled (every rule of both numerics modes' schedules on a cpu; a process adopts them from the
    persistent store where an earlier one built them, superopt/reuse.py) and registered in the template
    e-graph every search starts from (egraph/runner.py, `prime`: after the first search that runs a rule,
    later searches in the process find it registered), so that no figure below depends on which rules an
    earlier program happened to reach."""
    import jax.numpy as jnp
    from superopt import superopt
    from superopt.egraph import runner
    from superopt.stages import schedule_of
    from superopt.rulesets import DEFAULT
    x = jnp.ones((8, 8), jnp.float32)
    rules = [rule for numerics in ("strict", "fast") for phase in schedule_of(DEFAULT, numerics, "cpu")[0].phases
             for rule in phase.rules]
    for rule in rules:
        rule.egg   # noqa: B018 - compiled once per process (rewrites/rule.py)
    runner.ran(rules)   # as after searches that ran them all: the next search's template registers them
    superopt(lambda a: jnp.exp(a) * 2.0 + a @ a, cache=False)(x)


def kept_programs() -> list[dict]:
    import jax
    from bench import everyday, loops
    from superopt import superopt
    rows = []
    for name, fn, args in everyday.kernels() + loops.kernels():
        jitted = _first(jax.jit(fn), args)
        fast = superopt(fn, cache=False)
        ours = _first(fast, args)
        report = fast.report
        if report.optimized:
            continue
        top = sorted(report.stage_seconds.items(), key=lambda kv: -kv[1])[:3]
        rows.append(dict(name=name, jit=jitted, superopt=ours, extra=ours - jitted, why=report.outcome,
                         stages=", ".join(f"{k} {v:.2f} s" for k, v in top)))
        print(f"kept {name:28s} jit {jitted:5.2f} s  superopt {ours:5.2f} s  extra {ours - jitted:5.2f} s", flush=True)
    return rows


def language_model(vocab: int = 512, seq: int = 64, dim: int = 128, layers: int = 2):
    """(loss, params, tokens): a small decoder-only LM in plain JAX."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from bench.loops import layer_stack, per_layer, transformer_layer
    rng = np.random.default_rng(0)
    params = {"embed": jnp.asarray(rng.standard_normal((vocab, dim)) * 0.02, jnp.float32),
              "blocks": per_layer(layer_stack(rng, layers, dim, 4 * dim), layers)}
    tokens = jnp.asarray(rng.integers(0, vocab, seq + 1), jnp.int32)

    def loss(params, tokens):
        h = params["embed"][tokens[:-1]]
        for block in params["blocks"]:
            h = transformer_layer(h, block)
        logits = h @ params["embed"].T
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, tokens[1:, None], axis=-1))
    return loss, params, tokens


def lm_first_call() -> dict:
    import jax
    from superopt import superopt
    loss, params, tokens = language_model()
    jitted = _first(jax.jit(jax.value_and_grad(loss)), (params, tokens))
    fast = superopt(loss, cache=False)
    ours = _first(jax.jit(jax.value_and_grad(fast)), (params, tokens))
    return dict(jit=jitted, superopt=ours, outcome=fast.report.outcome, segments=str(fast.report.segments or ""))


def batch_sizes(sizes=(32, 48, 64, 96, 128)) -> dict:
    """Each function's first calls at `sizes` rows in turn: the MLP (a program superopt keeps) and a Gram
    matrix times a vector (one it changes: re-associated behind a check of its arguments' range)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from superopt import superopt
    rng = np.random.default_rng(0)
    w1 = jnp.asarray(rng.standard_normal((256, 512)) / 16, jnp.float32)
    w2 = jnp.asarray(rng.standard_normal((512, 256)) / 22, jnp.float32)
    v = jnp.asarray(rng.standard_normal((256,)), jnp.float32)

    def mlp(x, w1, w2):
        h = jax.nn.gelu(x @ w1)
        h = (h - h.mean(-1, keepdims=True)) / jnp.sqrt(h.var(-1, keepdims=True) + 1e-5)
        return jnp.sum((h @ w2) ** 2, axis=-1)

    def gram(x, v):
        return (x.T @ x) @ v
    out = {}
    for name, fn, rest, rows in (("an MLP with layer norm", mlp, (w1, w2), sizes),
                                 ("(x.T @ x) @ v", gram, (v,), tuple(4 * n for n in sizes))):
        fast, jitted = superopt(fn, cache=False), jax.jit(fn)
        out[name] = []
        for n in rows:
            x = jnp.asarray(rng.standard_normal((n, 256)), jnp.float32)
            out[name].append(dict(batch=n, jit=_first(jitted, (x, *rest)), superopt=_first(fast, (x, *rest)),
                                  outcome=fast.report.outcome, renamed=bool(fast.report.sizes)))
            r = out[name][-1]
            print(f"{name}: batch {n:4d}  jit {r['jit']:5.2f} s  superopt {r['superopt']:5.2f} s  {r['outcome']}"
                  f"{'  (renamed)' if r['renamed'] else ''}", flush=True)
    return out


def blocks(counts=(2, 12)) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from bench.loops import in_turn, layer_stack, per_layer, transformer_layer
    from superopt import superopt
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((64, 128)), jnp.float32)
    model = in_turn(transformer_layer)
    rows = []
    for count in counts:
        params = per_layer(layer_stack(rng, count, 128, 512), count)
        fast = superopt(model, cache=False)
        rows.append(dict(blocks=count, superopt=_first(fast, (params, x)), jit=_first(jax.jit(model), (params, x)),
                         segments=str(fast.report.segments or "")))
        print(f"blocks {count:3d}  superopt {rows[-1]['superopt']:5.2f} s  {rows[-1]['segments']}", flush=True)
    return rows


def render(kept, lm, sizes, stacks, load) -> list[str]:
    from bench.kernelbench import short
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    extra = statistics.median(r["extra"] for r in kept) if kept else float("nan")
    lines = [SECTION, "",
             f"Run: {when} (UTC), `python -m bench.firstcall`, on the 2-core development machine (load average "
             f"from `uptime`: {load[0]} at the start, {load[1]} at the end), cpu target. Each figure is one first "
             "call, superopt's (`cache=False`) against jax.jit's of the same function in the same process, after "
             "one warm-up of each (module doc of `bench/firstcall.py`).", "",
             f"- Programs superopt keeps ({len(kept)} of the everyday and loop kernels): median extra over jax.jit's "
             f"first call **{extra:.2f} s** (goal: at most 0.3 s).",
             f"- A transformer LM's loss and gradient (plain JAX; 2 decoder layers, seq 64, dim 128, vocabulary 512): "
             f"superopt {lm['superopt']:.2f} s against jax.jit's {lm['jit']:.2f} s, **{lm['superopt'] / lm['jit']:.2f}x** "
             f"(goal: at most 2x); {short(lm['outcome'], 80)}.",
             *(f"- New batch sizes of {name} ({short(rows[0]['outcome'], 60)}): "
               + ", ".join(f"{r['batch']}: {r['superopt']:.2f} s against {r['jit']:.2f} s" for r in rows)
               + f" (superopt against jax.jit; {sum(r['renamed'] for r in rows[1:])} of {len(rows) - 1} later sizes "
                 f"took the first size's decision, superopt/sizes.py; goal: at most 1.5x jax.jit's at each new size; "
                 f"the worst here **{max(r['superopt'] / r['jit'] for r in rows[1:]):.2f}x**, the median "
                 f"{statistics.median(r['superopt'] / r['jit'] for r in rows[1:]):.2f}x, after the first)."
               for name, rows in sizes.items()),
             "- Identical decoder blocks: " + "; ".join(f"{r['blocks']} blocks, {r['superopt']:.2f} s (jax.jit "
                                                       f"{r['jit']:.2f} s), segments {r['segments']}" for r in stacks)
             + (f"; 12 against 2 blocks: **{stacks[-1]['superopt'] / stacks[0]['superopt']:.2f}x** (goal: at most 1.5x)."
                if len(stacks) > 1 else "."), "",
             "| kept program | jax.jit | superopt | extra | outcome | costliest stages |", "|---|---|---|---|---|---|"]
    for r in sorted(kept, key=lambda r: -r["extra"]):
        lines.append(f"| {r['name']} | {r['jit']:.2f} s | {r['superopt']:.2f} s | {r['extra']:.2f} s | "
                     f"{short(r['why'], 60)} | {r['stages']} |")
    lines.append("")
    return lines


def main(argv=None) -> int:
    from bench.scale import replace_section
    ap = argparse.ArgumentParser(prog="python -m bench.firstcall", description=__doc__.splitlines()[0])
    ap.add_argument("--output", default="BENCHMARKS.md")
    ns = ap.parse_args(argv)
    start = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    warm_up()
    kept = kept_programs()
    lm = lm_first_call()
    print(f"LM loss and gradient: jit {lm['jit']:.2f} s, superopt {lm['superopt']:.2f} s", flush=True)
    sizes = batch_sizes()
    stacks = blocks()
    lines = render(kept, lm, sizes, stacks, (start, ", ".join(f"{x:.2f}" for x in os.getloadavg())))
    print("\n".join(lines))
    replace_section(ns.output, lines, SECTION)
    return 0


if __name__ == "__main__":
    sys.exit(main())
