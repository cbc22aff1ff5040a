"""The Chimera data-movement model (thesis ch. 3; ../shared/reference/thesis-digest.md).

A chain of ops shares one loop nest: `perm` orders the loops outermost first, `tiles` gives each loop's
tile size. Algorithm 1 gives the data volume DV moved between memory and the chip and the memory use MU
of one tile step: a loop that does not index a tensor reuses it, until an inner loop has already forced
a reload; intermediates of the chain stay on chip; an op's private loops leave the nest after it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    name: str
    loops: tuple[str, ...]                     # loops of this op
    tensors: dict                              # tensor name -> the loops that index it


def footprint(index_loops, tiles: dict) -> int:
    size = 1
    for loop in index_loops:
        size *= tiles[loop]
    return size


def data_movement(ops: list[Op], io_tensors: set, perm: list[str], extents: dict, tiles: dict,
                  weights: dict | None = None) -> tuple[int, int]:
    """(DV, MU) in elements by Algorithm 1; in bytes when `weights` gives each tensor's bytes per element.
    (The tiling search calls it for every order and tile size it tries: written to do no work twice.)"""
    dv, mu, order = 0, 0, list(perm)
    for n, op in enumerate(ops):
        total_df = 0
        own = op.loops
        for tensor, index in op.tensors.items():
            df = footprint(index, tiles) * (weights[tensor] if weights else 1)
            total_df += df
            if tensor not in io_tensors:
                continue                       # an intermediate stays on chip
            dm, keep_reuse = df, True
            for loop in reversed(order):       # innermost to outermost
                if loop not in own:
                    continue
                if keep_reuse and loop in index:
                    keep_reuse = False
                if not keep_reuse:
                    dm *= math.ceil(extents[loop] / tiles[loop])
            dv += dm
        if n + 1 < len(ops):                   # an op's private loops leave the nest after it
            later = {l for o in ops[n + 1:] for l in o.loops}
            order = [l for l in order if l not in own or l in later]
        mu = max(mu, total_df)
    return dv, mu


def gemm_chain(m: int, n: int, k: int, l: int) -> tuple[list[Op], set, dict]:
    """C[m,l] = A[m,k] B[k,l]; E[m,n] = C[m,l] D[l,n] (thesis Table 3.5's order: batch, M, N, K, L)."""
    ops = [Op("gemm1", ("m", "l", "k"), {"A": ("m", "k"), "B": ("k", "l"), "C": ("m", "l")}),
           Op("gemm2", ("m", "n", "l"), {"C": ("m", "l"), "D": ("l", "n"), "E": ("m", "n")})]
    return ops, {"A", "B", "D", "E"}, {"m": m, "n": n, "k": k, "l": l}


def gemm(m: int, n: int, k: int) -> tuple[list[Op], set, dict]:
    """C[m,n] = A[m,k] B[k,n]: one matmul (or a convolution as an implicit GEMM)."""
    ops = [Op("gemm", ("m", "n", "k"), {"A": ("m", "k"), "B": ("k", "n"), "C": ("m", "n")})]
    return ops, {"A", "B", "C"}, {"m": m, "n": n, "k": k}


def gemm_chain_mlkn(m, n, k, l, tm, tn, tk, tl) -> tuple[int, int]:
    """Table 3.4's closed forms for the mlkn order."""
    c = math.ceil
    dv = m * k * c(l / tl) + k * l * c(m / tm) + n * l * c(m / tm) + m * n * c(l / tl)
    mu = max(tm * tk + tk * tl + tm * tl, tm * tl + tl * tn + tm * tn)
    return dv, mu


def optimal_tiles_mlkn(m, n, k, l, capacity: int, a: int = 1) -> dict:
    """The analytic optimum for mlkn (Lagrange over the reals, then clamped): TM = TL = -a + sqrt(a^2 + MC),
    TN = TK = a; `a` is the micro-kernel granule (1 on a CPU, 16 for a tensor core or cube)."""
    t = -a + math.sqrt(a * a + capacity)
    return {"m": min(max(a, math.floor(t)), m), "l": min(max(a, math.floor(t)), l), "n": min(a, n), "k": min(a, k)}


def optimal_dv_mlkn(m, n, k, l, capacity: int, a: int = 1) -> float:
    """DV* = 2ML(K+N)/TM* at the real-valued optimum."""
    return 2 * m * l * (k + n) / (-a + math.sqrt(a * a + capacity))


def optimal_dv_clamped(m, n, k, l, capacity: int, a: int = 1, steps: int = 4096) -> float:
    """The real-valued optimum of the mlkn volume MK*L/TL + (K+N)L*M/TM + MN*L/TL (no rounding) with
    TK = TN = a, MU <= capacity and tiles no larger than their extents. Equals `optimal_dv_mlkn` when the
    optimum lies inside the extents; below it when a whole extent fits (each tensor then moves once)."""
    best = math.inf
    for i in range(1, steps + 1):
        tm = a + (m - a) * i / steps
        # MU = TM*a + a*TL + TM*TL (the first GEMM's footprint dominates at TK = TN = a); the largest TL that fits
        tl = min(l, (capacity - tm * a) / (a + tm))
        if tl < a:
            break
        best = min(best, m * k * l / tl + (k + n) * l * m / tm + m * n * l / tl)
    return best


def optimal_dv_tiles(m, n, k, l, capacity: int, a: int = 1) -> tuple[int, int, int]:
    """(DV, TM, TL): the exact minimum of the mlkn volume (with its ceilings) over integer tiles, TM and
    TL multiples of `a` or whole extents, TK = TN = a, MU <= capacity. For each TM the largest TL that
    fits is best (DV never grows with TL), so one pass over TM suffices. Unlike the real-valued optimum
    this one is attainable: a tile count is an integer."""
    best = (math.inf, 0, 0)
    tk, tn = min(a, k), min(a, n)
    for tm in sorted({*range(a, m + 1, a), m}):
        fit = [tl for tl in sorted({*range(a, l + 1, a), l}, reverse=True)
               if gemm_chain_mlkn(m, n, k, l, tm, tn, tk, tl)[1] <= capacity]
        if fit:
            best = min(best, (gemm_chain_mlkn(m, n, k, l, tm, tn, tk, fit[0])[0], tm, fit[0]))
    return best
