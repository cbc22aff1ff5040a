"""Loop kernels: JAX functions that do their work in `lax.fori_loop`, `lax.scan`, `lax.while_loop` and
`lax.cond`, written the way people write loops in JAX (row loops with `.at[i].set`, scan accumulations, while
loops to convergence, stencil time loops, a triangular solve, histogram and sparse row loops, loops with
loop-invariant work, two loops over one range (batched, and running statistics that do not batch), a short loop worth unrolling, a scanned stack of transformer
layers, a cond inside a loop, nested loops), each run by superopt on cpu and by jax.jit, interleaved in one
process (issue 54).

    python -m bench.loops [--samples S] [--only NAME[,NAME]] [--small] [--stack LAYERS] [--output BENCHMARKS.md]

Arguments are float32 (the sparse kernel's row and column indices int32), normal-distributed, weights scaled
by 1/sqrt(fan-in); sizes are chosen so that one jax.jit call takes about 0.1 to 20 ms on the 2-core
development machine (`--small`: reduced sizes and trip counts, for tests). Timing is bench/everyday.py's
(bench/kernelbench.py): per-call medians of samples of about 20 ms of back-to-back calls, jax.jit and
superopt under numerics="strict" (the default) and "fast" alternating sample by sample; the optimization
itself (a fresh cache: `cache=False`) is timed apart. A kernel counts as changed only where XLA compiles
superopt's program to a different executable than jax.jit's (`kernelbench.executable`). Every output of
superopt's program is checked against jax.jit's; a mismatch is printed and marked in the table. Replaces
its section of BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

SECTION = "## Loop kernels"
LOOPS = ("scan", "while", "cond")
RTOL = 1e-4       # superopt's output against jax.jit's: |a - b| <= RTOL * (|b| + max |b|)


def kernels(small: bool = False):
    """(name, fn, args): the suite, written for this benchmark; `small`: reduced sizes and trip counts."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    rng = np.random.default_rng(0)

    def z(full, reduced):
        return reduced if small else full

    def m(*shape, scale=1.0):
        return jnp.asarray(rng.standard_normal(shape) * scale, jnp.float32)

    def w(*shape):       # a weight that multiplies from the right (x @ w): its fan-in is shape[-2]
        return m(*shape, scale=1 / math.sqrt(shape[-2]))

    def spd(n):          # a symmetric positive definite matrix, well conditioned
        a = rng.standard_normal((n, n)) / math.sqrt(n)
        return jnp.asarray(a @ a.T + np.eye(n), jnp.float32)

    # ---- independent iterations: each writes its own row ----
    def row_map(x):
        def body(i, y):
            return y.at[i].set(jnp.tanh(x[i]) * 0.5 + 0.5)
        return lax.fori_loop(0, x.shape[0], body, jnp.zeros_like(x))

    def row_layernorm(x, g, b):
        def body(i, y):
            r = x[i]
            mu = jnp.mean(r)
            var = jnp.mean((r - mu) ** 2)
            return y.at[i].set((r - mu) / jnp.sqrt(var + 1e-5) * g + b)
        return lax.fori_loop(0, x.shape[0], body, jnp.zeros_like(x))

    def per_example_dense(x, wt, b):
        def body(i, y):
            return y.at[i].set(jax.nn.relu(wt @ x[i] + b))
        return lax.fori_loop(0, x.shape[0], body, jnp.zeros((x.shape[0], wt.shape[0]), x.dtype))

    # ---- scan accumulations ----
    def scan_sum_squares(xs):
        total, _ = lax.scan(lambda c, x: (c + x * x, None), jnp.zeros(xs.shape[1:], xs.dtype), xs)
        return total

    def minibatch_loss(wt, xs, ys):
        def step(loss, batch):
            x, y = batch
            return loss + jnp.mean((x @ wt - y) ** 2), None
        loss, _ = lax.scan(step, jnp.float32(0), (xs, ys))
        return loss / xs.shape[0]

    def running_sum(xs):
        def step(c, x):
            c = c + x
            return c, c
        return lax.scan(step, jnp.zeros(xs.shape[1:], xs.dtype), xs)[1]

    def running_max(xs):
        def step(c, x):
            c = jnp.maximum(c, x)
            return c, c
        return lax.scan(step, jnp.full(xs.shape[1:], -jnp.inf, xs.dtype), xs)[1]

    def discounted_returns(rewards):
        def step(g, r):
            g = r + 0.99 * g
            return g, g
        return lax.scan(step, jnp.zeros(rewards.shape[1:], rewards.dtype), rewards, reverse=True)[1]

    def online_logsumexp(xs):
        def step(carry, x):
            mx, s = carry
            new = jnp.maximum(mx, x)
            return (new, s * jnp.exp(mx - new) + jnp.exp(x - new)), None
        init = (jnp.full(xs.shape[1:], -jnp.inf, xs.dtype), jnp.zeros(xs.shape[1:], xs.dtype))
        (mx, s), _ = lax.scan(step, init, xs)
        return mx + jnp.log(s)

    # ---- while loops to convergence ----
    def jacobi(a, b):
        d = jnp.diag(a)
        r = a - jnp.diag(d)

        def cond(state):
            _, err, k = state
            return (err > 1e-5) & (k < 500)

        def body(state):
            x, _, k = state
            new = (b - r @ x) / d
            return new, jnp.max(jnp.abs(new - x)), k + 1
        return lax.while_loop(cond, body, (jnp.zeros_like(b), jnp.float32(jnp.inf), 0))[0]

    def newton_sqrt(a):
        a = jnp.abs(a) + 0.1

        def cond(state):
            _, err, k = state
            return (err > 1e-6) & (k < 50)

        def body(state):
            y, _, k = state
            new = 0.5 * (y + a / y)
            return new, jnp.max(jnp.abs(new - y) / new), k + 1
        return lax.while_loop(cond, body, (a, jnp.float32(jnp.inf), 0))[0]

    def power_iteration(a, v0):
        def cond(state):
            _, lam, prev, k = state
            return (jnp.abs(lam - prev) > 1e-6 * jnp.abs(lam)) & (k < 300)

        def body(state):
            v, lam, _, k = state
            u = a @ v
            u = u / jnp.linalg.norm(u)
            return u, u @ (a @ u), lam, k + 1
        v, lam, _, _ = lax.while_loop(cond, body, (v0 / jnp.linalg.norm(v0), jnp.float32(0), jnp.float32(jnp.inf), 0))
        return lam, v

    def conjugate_gradient(a, b):
        def cond(state):
            _, r, _, k = state
            return (jnp.sqrt(r @ r) > 1e-5 * jnp.linalg.norm(b)) & (k < 200)

        def body(state):
            x, r, p, k = state
            ap = a @ p
            alpha = (r @ r) / (p @ ap)
            x = x + alpha * p
            new = r - alpha * ap
            p = new + (new @ new) / (r @ r) * p
            return x, new, p, k + 1
        return lax.while_loop(cond, body, (jnp.zeros_like(b), b, b, 0))[0]

    # ---- stencils, solves, histograms, sparse rows ----
    def heat_2d(u):
        def step(_, u):
            inner = u[1:-1, 1:-1] + 0.2 * (u[2:, 1:-1] + u[:-2, 1:-1] + u[1:-1, 2:] + u[1:-1, :-2]
                                           - 4 * u[1:-1, 1:-1])
            return u.at[1:-1, 1:-1].set(inner)
        return lax.fori_loop(0, z(200, 10), step, u)

    def forward_substitution(lower, b):
        def body(i, x):
            return x.at[i].set((b[i] - jnp.dot(lower[i], x)) / lower[i, i])
        return lax.fori_loop(0, b.shape[0], body, jnp.zeros_like(b))

    def histogram(values, weights):
        bins = z(64, 8)
        idx = jnp.clip(jnp.floor((values + 4.0) / 8.0 * bins), 0, bins - 1).astype(jnp.int32)

        def body(k, h):
            return h.at[k].set(jnp.sum(jnp.where(idx == k, weights, 0.0)))
        return lax.fori_loop(0, bins, body, jnp.zeros(bins, weights.dtype))

    def kmeans_update(points, centroids):
        dist = jnp.sum((points[:, None, :] - centroids[None, :, :]) ** 2, axis=-1)
        labels = jnp.argmin(dist, axis=1)

        def body(k, c):
            mask = labels == k
            total = jnp.sum(jnp.where(mask[:, None], points, 0.0), axis=0)
            return c.at[k].set(total / jnp.maximum(jnp.sum(mask), 1))
        return lax.fori_loop(0, centroids.shape[0], body, centroids)

    def csr_matvec(vals, cols, row_ids, x):
        def body(r, y):
            return y.at[r].set(jnp.sum(jnp.where(row_ids == r, vals * x[cols], 0.0)))
        return lax.fori_loop(0, x.shape[0], body, jnp.zeros_like(x))

    # ---- loop-invariant work in the body ----
    def invariant_gram(h, wt, b):
        return lax.fori_loop(0, z(16, 3), lambda _, h: jnp.tanh(h @ (wt @ wt.T) + b), h)

    def invariant_exp_rnn(log_w, xs):
        def step(h, x):
            h = jnp.tanh(jnp.exp(log_w) @ h + x)
            return h, h
        return lax.scan(step, jnp.zeros(xs.shape[1:], xs.dtype), xs)[1]

    def rnn_input_projection(wh, wx, b, xs):
        def step(h, x):
            h = jnp.tanh(h @ wh + x @ wx + b)
            return h, h
        return lax.scan(step, jnp.zeros((xs.shape[1], wh.shape[0]), xs.dtype), xs)[1]

    def stacked_rnn(w1, u1, w2, u2, xs):   # two recurrent layers, the second reading the first's states
        def layer(w, u):
            return lambda h, x: (jnp.tanh(h @ w + x @ u),) * 2
        h0 = jnp.zeros((xs.shape[1], w1.shape[0]), xs.dtype)
        hs = lax.scan(layer(w1, u1), h0, xs)[1]
        return lax.scan(layer(w2, u2), h0, hs)[1]

    # ---- two loops over one range; short loops ----
    def two_loops(x):
        n = x.shape[0]
        s1 = lax.fori_loop(0, n, lambda i, s: s + x[i], jnp.zeros(x.shape[1:], x.dtype))
        s2 = lax.fori_loop(0, n, lambda i, s: s + x[i] * x[i], jnp.zeros(x.shape[1:], x.dtype))
        mean = s1 / n
        return mean, s2 / n - mean * mean

    def running_stats(xs):   # a running mean and a running maximum, as two loops over the same rows
        total = lax.scan(lambda c, x: (c + x, c + x), jnp.zeros(xs.shape[1:], xs.dtype), xs)[1]
        peak = lax.scan(lambda c, x: (jnp.maximum(c, x), jnp.maximum(c, x)),
                        jnp.full(xs.shape[1:], -jnp.inf, xs.dtype), xs)[1]
        return total / jnp.arange(1, xs.shape[0] + 1, dtype=xs.dtype)[:, None], peak

    def horner(coeffs, x):
        return lax.fori_loop(0, coeffs.shape[0], lambda i, acc: acc * x + coeffs[i], jnp.zeros_like(x))

    def matrix_power(a):
        return lax.fori_loop(0, 8, lambda _, p: p @ a, jnp.eye(a.shape[0], dtype=a.dtype))

    # ---- a scanned stack of transformer layers ----
    seq, dim, ffn, layers = z(64, 8), z(128, 32), z(512, 64), z(6, 2)
    stack = layer_stack(rng, layers, dim, ffn)

    def transformer_stack(params, x):
        return lax.scan(lambda h, p: (transformer_layer(h, p), None), x, params)[0]

    # ---- cond inside a loop; nested loops ----
    def clipped_descent(a, b):
        def step(_, x):
            g = a.T @ (a @ x - b)
            norm = jnp.linalg.norm(g)
            g = lax.cond(norm > 1.0, lambda g: g / norm, lambda g: g, g)
            return x - 0.1 * g
        return lax.fori_loop(0, z(100, 5), step, jnp.zeros(a.shape[1], a.dtype))

    def pairwise_distances(x):
        n = x.shape[0]

        def row(i, d):
            def col(j, d):
                return d.at[i, j].set(jnp.sqrt(jnp.sum((x[i] - x[j]) ** 2)))
            return lax.fori_loop(0, n, col, d)
        return lax.fori_loop(0, n, row, jnp.zeros((n, n), x.dtype))

    n_sys = z(256, 16)
    a_jacobi = m(n_sys, n_sys, scale=1 / math.sqrt(n_sys)) + 2.0 * jnp.eye(n_sys)   # Jacobi's iteration matrix: radius ~1/2
    n_tri = z(1024, 16)
    lower = jnp.tril(m(n_tri, n_tri, scale=1 / math.sqrt(n_tri)), -1) + jnp.diag(1.0 + jnp.abs(m(n_tri)))
    rows, nnz = z(512, 32), z(16384, 256)
    row_ids = jnp.asarray(np.sort(rng.integers(0, rows, nnz)), jnp.int32)
    cols = jnp.asarray(rng.integers(0, rows, nnz), jnp.int32)
    nb, bs, fi, fo = z(64, 4), z(32, 8), z(128, 16), z(16, 4)
    t, hid = z(256, 8), z(256, 16)
    return [
        ("row-map", row_map, (m(z(512, 16), z(256, 32)),)),
        ("row-layernorm", row_layernorm, (m(z(512, 16), z(256, 32)), 1 + m(z(256, 32), scale=0.02),
                                          m(z(256, 32), scale=0.02))),
        ("per-example-dense", per_example_dense, (m(z(256, 16), z(256, 32)), w(z(256, 32), z(256, 32)),
                                                  m(z(256, 32), scale=0.02))),
        ("scan-sum-of-squares", scan_sum_squares, (m(z(4096, 16), z(256, 32)),)),
        ("minibatch-loss", minibatch_loss, (w(fi, fo), m(nb, bs, fi), m(nb, bs, fo))),
        ("running-sum", running_sum, (m(z(2048, 16), z(64, 8)),)),
        ("running-max", running_max, (m(z(2048, 16), z(64, 8)),)),
        ("discounted-returns", discounted_returns, (m(z(2048, 16), z(128, 8)),)),
        ("online-logsumexp", online_logsumexp, (m(z(1024, 16), z(256, 32)),)),
        ("jacobi-while", jacobi, (a_jacobi, m(n_sys))),
        ("newton-sqrt-while", newton_sqrt, (m(z(65536, 256)),)),
        ("power-iteration-while", power_iteration, (spd(n_sys), m(n_sys))),
        ("conjugate-gradient-while", conjugate_gradient, (spd(z(512, 16)), m(z(512, 16)))),
        ("heat-2d", heat_2d, (m(z(128, 16), z(128, 16)),)),
        ("forward-substitution", forward_substitution, (lower, m(z(1024, 16)))),
        ("histogram", histogram, (m(z(65536, 256)), jnp.abs(m(z(65536, 256))))),
        ("kmeans-update", kmeans_update, (m(z(8192, 64), z(16, 4)), m(z(32, 4), z(16, 4)))),
        ("csr-matvec", csr_matvec, (m(nnz), cols, row_ids, m(rows))),
        ("invariant-gram", invariant_gram, (m(z(32, 4), z(256, 16)), w(z(256, 16), z(256, 16)),
                                            m(z(256, 16), scale=0.02))),
        ("invariant-exp-rnn", invariant_exp_rnn, (m(hid, hid, scale=0.1) - math.log(hid), m(t, hid))),
        ("rnn-input-projection", rnn_input_projection, (w(hid, hid), w(z(64, 8), hid), m(hid, scale=0.02),
                                                        m(t, z(16, 2), z(64, 8)))),
        ("stacked-rnn", stacked_rnn, (w(z(64, 8), z(64, 8)), w(z(64, 8), z(64, 8)), w(z(64, 8), z(64, 8)),
                                      w(z(64, 8), z(64, 8)), m(z(512, 16), z(8, 2), z(64, 8)))),
        ("two-loops", two_loops, (m(z(2048, 16), z(128, 8)),)),
        ("running-stats", running_stats, (m(z(2048, 16), z(64, 8)),)),
        ("horner", horner, (m(6), m(z(1024, 32), z(1024, 32)))),
        ("matrix-power", matrix_power, (w(z(256, 16), z(256, 16)),)),
        ("transformer-scan", transformer_stack, (stack, m(seq, dim))),
        ("clipped-descent-cond", clipped_descent, (w(z(512, 16), z(128, 8)), m(z(512, 16)))),
        ("pairwise-nested", pairwise_distances, (m(z(128, 6), z(32, 4)),)),
    ]


HEADS = 4


def transformer_layer(h, p):
    """A pre-norm decoder layer (causal attention of `HEADS` heads, a GELU MLP) on one sequence h: [seq, dim]."""
    import jax
    import jax.numpy as jnp
    seq, dim = h.shape

    def layer_norm(h, g, b):
        mu = jnp.mean(h, -1, keepdims=True)
        return (h - mu) / jnp.sqrt(jnp.var(h, -1, keepdims=True) + 1e-5) * g + b

    causal = jnp.tril(jnp.ones((seq, seq), bool))
    a = layer_norm(h, p["ln1_g"], p["ln1_b"])
    q, k, v = (jnp.transpose((a @ p[n]).reshape(seq, HEADS, dim // HEADS), (1, 0, 2)) for n in ("wq", "wk", "wv"))
    s = jnp.einsum("hqd,hkd->hqk", q, k) / math.sqrt(dim // HEADS)
    att = jax.nn.softmax(jnp.where(causal, s, -1e9), axis=-1)
    o = jnp.transpose(jnp.einsum("hqk,hkd->hqd", att, v), (1, 0, 2)).reshape(seq, dim)
    h = h + o @ p["wo"]
    f = layer_norm(h, p["ln2_g"], p["ln2_b"])
    return h + jax.nn.gelu(f @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def layer_stack(rng, layers: int, dim: int, ffn: int) -> dict:
    """The weights of `layers` transformer layers, stacked on a leading axis (normal, scaled by 1/sqrt(fan-in))."""
    import jax.numpy as jnp

    def m(*shape, scale=1.0):
        return jnp.asarray(rng.standard_normal(shape) * scale, jnp.float32)

    def w(*shape):
        return m(*shape, scale=1 / math.sqrt(shape[-2]))
    return {"wq": w(layers, dim, dim), "wk": w(layers, dim, dim), "wv": w(layers, dim, dim),
            "wo": w(layers, dim, dim), "w1": w(layers, dim, ffn), "w2": w(layers, ffn, dim),
            "b1": m(layers, ffn, scale=0.02), "b2": m(layers, dim, scale=0.02),
            "ln1_g": 1 + m(layers, dim, scale=0.02), "ln1_b": m(layers, dim, scale=0.02),
            "ln2_g": 1 + m(layers, dim, scale=0.02), "ln2_b": m(layers, dim, scale=0.02)}


def per_layer(stack: dict, layers: int) -> list[dict]:
    """`layer_stack`'s weights as a list of per-layer dicts, as a model written with a Python loop takes them."""
    import jax
    return [jax.tree_util.tree_map(lambda a, i=i: a[i], stack) for i in range(layers)]


def in_turn(block):
    """A model applying `block(h, p)` for each per-layer dict p of its weights: layers unrolled by Python."""
    def model(params, h):
        for p in params:
            h = block(h, p)
        return h
    return model


def stack_comparison(layers: int = 12, small: bool = False) -> list[dict]:
    """One transformer layer, `layers` of them in a `lax.scan`, and the same layers unrolled by a Python loop,
    each optimized cold (a fresh cache) under both numerics modes: the first call's seconds, the modelled
    cost of the program as traced and of the one that runs, and the rules that fired (in the scan: in its
    body)."""
    import jax
    import numpy as np
    from jax import lax
    from superopt import superopt
    rng = np.random.default_rng(1)
    seq, dim, ffn = (8, 32, 64) if small else (64, 128, 512)
    stack = layer_stack(rng, layers, dim, ffn)
    x = jax.numpy.asarray(rng.standard_normal((seq, dim)), jax.numpy.float32)
    one = jax.tree_util.tree_map(lambda a: a[0], stack)

    def scanned(params, h):
        return lax.scan(lambda h, p: (transformer_layer(h, p), None), h, params)[0]
    unrolled = in_turn(transformer_layer)

    superopt(lambda h: h * 2.0, cache=False)(x)   # the first optimization in a process loads what all share
    rows = []
    for mode in ("strict", "fast"):
        for name, fn, args in (("one layer", transformer_layer, (x, one)), (f"{layers} layers, lax.scan", scanned, (stack, x)),
                               (f"{layers} layers, unrolled", unrolled, (per_layer(stack, layers), x))):
            f = superopt(fn, cache=False, numerics=mode)
            start = time.perf_counter()
            jax.block_until_ready(f(*args))
            seconds = time.perf_counter() - start
            r = f.report
            fired = sorted(r.run.fired)
            if "rules fired in them: " in r.loops:
                fired = sorted(set(fired) | set(r.loops.split("rules fired in them: ")[1].rstrip(")").split(", ")))
            rows.append(dict(mode=mode, name=name, seconds=seconds, before=r.cost_before, after=r.cost_after,
                             outcome=r.outcome, fired=fired, segments=r.segments, loops=r.loops))
            print(f"{mode:6s} {name:24s} {seconds:6.1f} s  {r.cost_before * 1e6:9.1f} -> {r.cost_after * 1e6:9.1f} us  "
                  f"{len(fired)} rules fired  {r.outcome[:60]}", flush=True)
    return rows


def render_stacks(rows: list[dict], layers: int) -> list[str]:
    from bench.kernelbench import short
    lines = [f"A scanned stack of {layers} transformer layers (`python -m bench.loops --stack`: the layer of "
             "`transformer-scan` at seq 64, dim 128, 4 heads, ffn 512), optimized cold in one process against one "
             "layer and the same layers unrolled by a Python loop. Modelled costs are the cpu model's "
             "(program as traced -> program that runs); the rules are those that fired (for the scan, in "
             "its body's search).", "",
             "| numerics | program | first call | modelled cost | outcome | rules fired |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['name']} | {r['seconds']:.1f} s | {r['before'] * 1e6:.0f} us -> "
                     f"{r['after'] * 1e6:.0f} us | {short(r['outcome'], 60)} | {len(r['fired'])} |")
    lines.append("")
    return lines


def loop_shape(fn, args) -> str:
    """The loops of `fn`'s jaxpr after tracing, nested ones in parentheses: `scan×N` (fori_loop with static
    bounds traces to a scan), `while`, `cond` (not counting the platform switches jnp inserts)."""
    import jax
    return ", ".join(_loops(jax.make_jaxpr(fn)(*args).jaxpr)) or "none"


def _loops(jaxpr) -> list[str]:
    found = []
    for eqn in jaxpr.eqns:
        inner = [shape for sub in _subjaxprs(eqn.params.values()) for shape in _loops(sub)]
        name, params = eqn.primitive.name, eqn.params
        if name == "scan":
            head = f"scan×{params['length']}" + (" reversed" if params["reverse"] else "")
        elif name == "while" or (name == "cond" and not params.get("branches_platforms")):
            head = name
        else:
            found += inner
            continue
        found.append(head + (f"({', '.join(inner)})" if inner else ""))
    return found


def _subjaxprs(values):
    for v in values:
        if hasattr(v, "eqns"):
            yield v
        elif hasattr(getattr(v, "jaxpr", None), "eqns"):
            yield v.jaxpr
        elif isinstance(v, (tuple, list)):
            yield from _subjaxprs(v)


def opaque_to_superopt(fn, args) -> str:
    """The primitives superopt's capture keeps as opaque nodes (never searched), in program order."""
    from superopt.egraph.capture import capture
    names = [getattr(o.primitive, "name", type(o.primitive).__name__) for o in capture(fn, args).graph.opaque]
    return ", ".join(names) or "none"


def deviation(got, want) -> float:
    """The largest |got - want| / (|want| + max |want|) over the outputs' elements (inf where finiteness or
    NaN differ): superopt's outputs against jax.jit's."""
    import jax
    import numpy as np
    worst = 0.0
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape or not np.array_equal(np.isfinite(a), np.isfinite(b)) \
                or not np.array_equal(np.isnan(a), np.isnan(b)):
            return math.inf
        fin = np.isfinite(b)
        if not fin.any():
            continue
        if not np.array_equal(a[~fin], b[~fin]):
            return math.inf
        diff = np.abs(a[fin] - b[fin]) / (np.abs(b[fin]) + np.abs(b[fin]).max() + 1e-30)
        worst = max(worst, float(diff.max()))
    return worst


def measure(samples: int = 21, only: tuple[str, ...] = (), small: bool = False) -> list[dict]:
    """Per kernel: jax.jit, superopt under numerics="strict" and "fast", alternating sample by sample; whether
    each superopt program compiles to jax.jit's executable; how far its outputs are from jax.jit's."""
    import jax
    from bench.kernelbench import interleaved, optimized
    from superopt.lowering.hlo import executable
    from superopt.report import Outcome
    suite = kernels(small)
    unknown = set(only) - {name for name, _, _ in suite}
    if unknown:
        raise SystemExit(f"no loop kernel named {', '.join(sorted(unknown))}")
    rows = []
    for name, fn, args in suite:
        if only and name not in only:
            continue
        jitted = jax.jit(fn)
        want = jax.block_until_ready(jitted(*args))
        modes, seconds = optimized(fn, args)
        med, calls = interleaved({"jit": jitted, **modes}, args, samples)
        reference = executable(jitted, args)
        done = modes["strict"].report.loops.removeprefix("loops before the search: ")
        row = dict(name=name, loops=loop_shape(fn, args), opaque=opaque_to_superopt(fn, args), jit=med["jit"],
                   calls=calls, lifted=done or "left as loops")
        for mode, f in modes.items():
            r = f.report
            dev = deviation(f(*args), want)
            row[mode] = dict(time=med[mode], speedup=med["jit"] / med[mode], optimize=seconds[mode],
                             changed=executable(f, args) != reference, optimized=r.kind is Outcome.OPTIMIZED,
                             why=r.reason or "", deviation=dev, agrees=dev <= RTOL)
            if not row[mode]["agrees"]:
                print(f"MISMATCH: {name} under numerics={mode!r}: superopt's output is {dev:.3g} from jax.jit's "
                      f"(allowed {RTOL:g})", file=sys.stderr, flush=True)
        rows.append(row)
        st, fa = row["strict"], row["fast"]
        print(f"{name:26s} jit {med['jit'] * 1e3:8.3f} ms  strict {st['time'] * 1e3:8.3f} ms {st['speedup']:5.2f}x"
              f"  fast {fa['time'] * 1e3:8.3f} ms {fa['speedup']:5.2f}x  executable "
              f"{'different' if st['changed'] else 'same'}/{'different' if fa['changed'] else 'same'}  "
              f"({st['optimize']:.1f} s, {fa['optimize']:.1f} s)  {row['loops']}", flush=True)
    return rows


def render(rows: list[dict], samples: int, load: tuple[str, str], small: bool = False) -> list[str]:
    from bench.kernelbench import geomean, short
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    lines = [SECTION, "",
             f"Run: {when} (UTC), `python -m bench.loops{' --small' if small else ''}`, on the 2-core development "
             f"machine (load average from `uptime`: {load[0]} at the start, {load[1]} at the end), cpu target. {len(rows)} kernels that do their work in "
             "`lax.fori_loop`, `lax.scan`, `lax.while_loop` and `lax.cond`, written the way people write loops "
             "in JAX (module doc of `bench/loops.py`), float32. Timed as the everyday kernels are "
             f"(bench/kernelbench.py): per-call medians of {samples} samples, each about 20 ms of back-to-back "
             "calls, jax.jit and superopt's callables alternating sample by sample; speedup = jax.jit's time "
             "over superopt's; optimizing = the first call, on a fresh cache. A program counts as changed only "
             "where XLA compiles it to a different executable than jax.jit's (`kernelbench.executable`: the optimized "
             "HLO compared blind to names, metadata and the order of independent instructions). \"Loops after tracing\" is the jaxpr's loop structure (a "
             "`fori_loop` with static bounds traces to a scan); \"opaque to superopt\" is what its capture "
             "keeps as opaque nodes; \"loop pass\" is what superopt/loops.py did to them before the search "
             "(the strict report's loops line: batched where the iterations are independent, written out where "
             "a loop is short, work that reads no carry done ahead of the loop, batched, loop-invariant work moved out, "
             "loops over one range fused; the bodies the search of bodies changed, "
             "superopt/regions.py; a while loop's assumed trip count).", ""]
    for mode in ("strict", "fast"):
        changed = [r for r in rows if r[mode]["changed"]]
        slower = [r["name"] for r in changed if r[mode]["speedup"] < 1 / 1.03]
        claimed = [r["name"] for r in rows if r[mode]["optimized"] and not r[mode]["changed"]]
        wrong = [r["name"] for r in rows if not r[mode]["agrees"]]
        lines.append(f"- `{mode}`: geometric-mean speedup over jax.jit **{geomean(r[mode]['speedup'] for r in rows):.2f}x**; "
                     f"{len(changed)} of the {len(rows)} compile to a different executable than jax.jit's"
                     + (f" ({', '.join(r['name'] for r in changed)})" if changed else "")
                     + f", {len(slower)} of those more than 3% slower"
                     + (f" ({', '.join(slower)})" if slower else "")
                     + (f"; reported optimized but compiled to jax.jit's executable: {', '.join(claimed)}" if claimed else "")
                     + "; outputs " + (f"**DIFFER from jax.jit's** (beyond {RTOL:g}): {', '.join(wrong)}" if wrong
                                       else f"all within {RTOL:g} of jax.jit's") + ".")
    opaque = [r for r in rows if r["opaque"] != "none"]
    changed = [r for r in rows if r["strict"]["changed"] or r["fast"]["changed"]]
    if not changed and len(opaque) == len(rows):
        what = ("What superopt does to these loops today: nothing. Each loop reaches it as an opaque node that no "
                "rule looks inside, so under either numerics mode it runs jax.jit's executable, and the speedups "
                "above are the noise of timing one program against itself.")
    else:
        lifted = [r["name"] for r in rows if "batched" in r["lifted"] or "written out" in r["lifted"]
                  or "fused" in r["lifted"]]
        hoisted = [r["name"] for r in rows if "moved out" in r["lifted"]]
        bodies = [r["name"] for r in rows if "bodies optimized" in r["lifted"]]
        what = (f"{len(opaque)} of the {len(rows)} reach superopt with their loops as opaque nodes; the loop pass "
                f"batched (whole, or the work done ahead of a split loop), wrote out or fused the loops of {len(lifted)} ({', '.join(lifted) or 'none'}) and moved "
                f"loop-invariant work out of {len(hoisted)} ({', '.join(hoisted) or 'none'}); the search of bodies "
                f"changed the bodies of {len(bodies)} ({', '.join(bodies) or 'none'}) under strict; "
                f"{len(changed)} compile to a different executable in at least one mode"
                + (f" ({', '.join(r['name'] for r in changed)})" if changed else "") + ".")
    lines += [f"- {what}", "",
              "| kernel | loops after tracing | opaque to superopt | loop pass | jax.jit | strict | speedup "
              "| executable (strict) | optimizing | fast | speedup | executable (fast) | optimizing | largest deviation |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        st, fa = r["strict"], r["fast"]
        dev = max(st["deviation"], fa["deviation"])
        lines.append(f"| {r['name']} | {r['loops']} | {r['opaque']} | {short(r['lifted'], 60)} | {r['jit'] * 1e3:.3f} ms | {st['time'] * 1e3:.3f} ms | "
                     f"{st['speedup']:.2f}x | {_what(st, short)} | {st['optimize']:.1f} s | {fa['time'] * 1e3:.3f} ms | "
                     f"{fa['speedup']:.2f}x | {_what(fa, short)} | {fa['optimize']:.1f} s | "
                     f"{'0' if dev == 0 else f'{dev:.1e}'}{'' if dev <= RTOL else ' **MISMATCH**'} |")
    lines.append("")
    return lines


def _what(result: dict, short) -> str:
    exe = "**different**" if result["changed"] else "same"
    return f"{exe} ({'optimized' if result['optimized'] else short(result['why'], 50)})"


def main(argv=None) -> int:
    import os
    from bench.scale import replace_section
    ap = argparse.ArgumentParser(prog="python -m bench.loops", description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=21)
    ap.add_argument("--only", default="", help="comma-separated kernel names (default: all)")
    ap.add_argument("--small", action="store_true", help="reduced sizes and trip counts")
    ap.add_argument("--output", default="BENCHMARKS.md")
    ap.add_argument("--stack", type=int, default=12, help="layers of the scanned stack compared (0: none)")
    ns = ap.parse_args(argv)
    start = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = measure(ns.samples, tuple(n for n in ns.only.split(",") if n), ns.small)
    stacks = stack_comparison(ns.stack, ns.small) if ns.stack else []
    lines = render(rows, ns.samples, (start, ", ".join(f"{x:.2f}" for x in os.getloadavg())), ns.small)
    lines += render_stacks(stacks, ns.stack) if stacks else []
    print("\n".join(lines))
    replace_section(ns.output, lines, SECTION)
    return 0


if __name__ == "__main__":
    sys.exit(main())
