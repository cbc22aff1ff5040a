"""`make demo`: optimize a function as a user writes it, under the default numerics, and time the result.

The function scores each of N queries against its own key by cosine similarity, written the way it often
is: the diagonal of the all-pairs similarity matrix `q @ k.T`, divided by the norms read off the diagonals
of the Gram matrices `q @ q.T` and `k @ k.T`. That computes 3 N^2 dot products and keeps 3 N of them, and
XLA compiles it as written. superopt's rule `diagonal-of-matmul` rewrites `diag(a @ b.T)` to the row sums
of `a * b`: the same products, added in another order (an `"order"` rule, which the default
`numerics="strict"` runs: README, "Numerics contract"), so the program it returns never builds the
N x N matrices. Everything is checked against the original before it is returned.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from superopt import superopt
from superopt.timing import interleaved_medians

N, D = 1024, 256


def matched_similarity(queries, keys):
    """Cosine similarity of query i with key i, for every i."""
    scores = jnp.diag(queries @ keys.T)
    norms = jnp.sqrt(jnp.diag(queries @ queries.T) * jnp.diag(keys @ keys.T))
    return scores / norms


def example_inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.standard_normal((N, D), dtype=np.float32)) for _ in range(2))


def main() -> None:
    queries, keys = example_inputs()
    print(f"matched_similarity: cosine similarity of each of {N} queries with its own key ({D} features), "
          f"written as diag(q @ k.T) / sqrt(diag(q @ q.T) * diag(k @ k.T))\n")
    fast = superopt(matched_similarity, target="cpu")      # the default numerics: strict
    baseline = jax.jit(matched_similarity)
    got, want = np.asarray(fast(queries, keys)), np.asarray(baseline(queries, keys))
    print(fast.report)
    print()
    times = interleaved_medians({"jax.jit": lambda: baseline(queries, keys),
                                 "superopt": lambda: fast(queries, keys)})
    print(f"measured on this machine, median of 9 interleaved runs: jax.jit {times['jax.jit'] * 1e3:.2f} ms, "
          f"superopt {times['superopt'] * 1e3:.2f} ms, speedup {times['jax.jit'] / times['superopt']:.2f}x; "
          f"largest difference from jax.jit's values {float(np.max(np.abs(got - want))):.1e}")
    if fast.report.optimized:
        print("why: each diag(a @ b.T) became the row sums of a * b (rule diagonal-of-matmul): the N dot "
              "products the function keeps, without the N x N matrices it threw away")


if __name__ == "__main__":
    main()
