"""`make demo`: optimize an embedded transformer block for the CPU, print the report and the speedup.

The block uses linear attention (Katharopoulos et al., 2020: softmax replaced by a positive feature map)
written the direct way, (phi(Q) phi(K)^T) V, which costs O(N^2 d). superopt re-associates it to
phi(Q) (phi(K)^T V), which costs O(N d^2), and does the same for the normalizer; the layer norms and
the GELU MLP go through unchanged. Everything is checked against the original before it is returned.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from superopt import superopt
from superopt.timing import interleaved_medians

SEQ, HIDDEN, FFN = 1024, 256, 1024


def layer_norm(x, gamma, beta, eps=1e-5):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * gamma + beta


def feature_map(x):
    return jax.nn.elu(x) + 1.0


def transformer_block(p, x):
    h = layer_norm(x, p["ln1_g"], p["ln1_b"])
    q, k, v = feature_map(h @ p["wq"]), feature_map(h @ p["wk"]), h @ p["wv"]
    scores = q @ k.T                                    # (SEQ, SEQ)
    attn = (scores @ v) / (scores @ jnp.ones((SEQ, 1)))
    x = x + attn @ p["wo"]
    h = layer_norm(x, p["ln2_g"], p["ln2_b"])
    return x + jax.nn.gelu(h @ p["w1"] + p["b1"]) @ p["w2"]


def example_inputs(seed: int = 0):
    rng = np.random.default_rng(seed)

    def w(*shape):
        return jnp.asarray(rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[0]))

    params = {"wq": w(HIDDEN, HIDDEN), "wk": w(HIDDEN, HIDDEN), "wv": w(HIDDEN, HIDDEN), "wo": w(HIDDEN, HIDDEN),
              "w1": w(HIDDEN, FFN), "b1": jnp.zeros(FFN), "w2": w(FFN, HIDDEN),
              "ln1_g": jnp.ones(HIDDEN), "ln1_b": jnp.zeros(HIDDEN), "ln2_g": jnp.ones(HIDDEN), "ln2_b": jnp.zeros(HIDDEN)}
    return params, jnp.asarray(rng.standard_normal((SEQ, HIDDEN), dtype=np.float32))


def main() -> None:
    params, x = example_inputs()
    fast = superopt(transformer_block, target="cpu")
    baseline = jax.jit(transformer_block)
    fast(params, x)
    print(fast.report)
    print()
    times = interleaved_medians({"jax.jit": lambda: baseline(params, x), "superopt": lambda: fast(params, x)})
    print(f"measured on this machine, median of 9 interleaved runs: jax.jit {times['jax.jit'] * 1e3:.2f} ms, "
          f"superopt {times['superopt'] * 1e3:.2f} ms, speedup {times['jax.jit'] / times['superopt']:.2f}x")


if __name__ == "__main__":
    main()
