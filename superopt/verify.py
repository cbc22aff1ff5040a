"""Verify: the optimized program against the original on random inputs, with tolerances per dtype."""
from __future__ import annotations

import numpy as np

# Floating-point outputs pass two checks (integers and bools must be equal):
#   elementwise |a - e| <= tol * (|e| + max|e|)   -- no element is wrong on the output's own scale;
#   normwise    ||a - e|| <= norm_tol * ||e||      -- the output as a whole is as accurate as rounding allows.
# Error is measured against the output's scale, not each element's, because a reassociated dot product
# errs relative to sum |a_i b_i|, which is large where the result cancels to near zero.
TOLERANCES = {"float64": (1e-9, 1e-10), "float32": (1e-3, 1e-4), "float16": (1e-2, 5e-3),
              "bfloat16": (5e-2, 2e-2)}


class VerificationWarning(UserWarning):
    """The optimized program differed from the original; the original was kept."""


def random_args(avals, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for shape, dtype in avals:
        dt = np.dtype(dtype)
        if dt == np.bool_:
            out.append(rng.random(shape) < 0.5)
        elif dt.kind in "iu":
            lo = 0 if dt.kind == "u" else -8
            out.append(rng.integers(lo, 9, size=shape).astype(dt))
        else:
            out.append(rng.standard_normal(shape).astype(np.float32).astype(dt))
    return out


def is_float(dtype) -> bool:
    """numpy's float kinds, and the ml_dtypes floats (bfloat16, float8), whose numpy kind is 'V'."""
    dtype = np.dtype(dtype)
    return dtype.kind in "fc" or dtype.name.startswith(("bfloat", "float8"))


def mismatch(expected, actual, as_dtype: str | None = None) -> str | None:
    """None if `actual` matches `expected` within the dtype's tolerance (or `as_dtype`'s, for a program
    that computes in a narrower type, as the NPU's cube does), else a description."""
    e, a = np.asarray(expected), np.asarray(actual)
    if e.shape != a.shape or e.dtype != a.dtype:
        return f"type {a.dtype}{list(a.shape)} != expected {e.dtype}{list(e.shape)}"
    if not is_float(e.dtype):
        bad = int(np.sum(e != a))
        return f"{bad} of {e.size} elements differ" if bad else None
    e64, a64 = e.astype(np.float64), a.astype(np.float64)
    if not np.array_equal(np.isnan(e64), np.isnan(a64)):
        return "NaN positions differ"
    inf = np.isinf(e64) | np.isinf(a64)
    if not np.array_equal(e64[inf], a64[inf]):
        return "Inf positions or signs differ"
    finite = ~(np.isnan(e64) | inf)
    if not finite.any():
        return None
    tol, norm_tol = TOLERANCES.get(str(e.dtype), TOLERANCES["float32"])
    if as_dtype:
        tol, norm_tol = (max(x, y) for x, y in zip((tol, norm_tol), TOLERANCES[as_dtype]))
    ef, af = e64[finite], a64[finite]
    scale = max(float(np.max(np.abs(ef))), np.finfo(np.float32).tiny)
    err = np.abs(ef - af)
    bound = tol * (np.abs(ef) + scale)
    if not np.all(err <= bound):
        worst = int(np.argmax(err - bound))
        return f"element error {err[worst]:.3g} over bound {bound[worst]:.3g} (dtype {e.dtype})"
    norm_err = float(np.linalg.norm(ef - af) / max(np.linalg.norm(ef), np.finfo(np.float32).tiny))
    if norm_err > norm_tol:
        return f"normwise relative error {norm_err:.3g} over {norm_tol:g} (dtype {e.dtype})"
    return None


def compare_outputs(expected: list, actual: list, as_dtype: str | None = None) -> str | None:
    if len(expected) != len(actual):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for k, (e, a) in enumerate(zip(expected, actual)):
        problem = mismatch(e, a, as_dtype)
        if problem:
            return f"output {k}: {problem}"
    return None


def as_accurate(expected, actual, truth, factor: float = 2.0) -> str | None:
    """None if `actual` is about as close to `truth` as `expected` is (normwise, on the finite elements
    where both agree on NaN and Inf), else a description. Used when two programs that round differently
    disagree with each other: what matters then is that the optimized one is not less accurate.

    Integer outputs are judged the same way with no floor: where the original is exact (its value equals
    the float64 program's) the optimized program must be too; where the original rounded a float to an
    integer (a requantized result), the optimized one may round differently but not more often."""
    e, a = np.asarray(expected), np.asarray(actual)
    if e.shape != a.shape or e.dtype != a.dtype or e.dtype == np.bool_ or not (is_float(e.dtype) or e.dtype.kind in "iu"):
        return mismatch(e, a)
    e64, a64, t64 = (np.asarray(v, dtype=np.float64) for v in (e, a, truth))
    if not np.array_equal(np.isnan(e64), np.isnan(a64)):
        return "NaN positions differ"
    inf = np.isinf(e64) | np.isinf(a64)
    if not np.array_equal(e64[inf], a64[inf]):
        return "Inf positions or signs differ"
    finite = ~(np.isnan(e64) | inf) & np.isfinite(t64)
    scale = float(np.linalg.norm(t64[finite]))
    err_expected = float(np.linalg.norm(e64[finite] - t64[finite]))
    err_actual = float(np.linalg.norm(a64[finite] - t64[finite]))
    # Within the dtype's normwise tolerance (the same bound the direct comparison uses) or within a
    # small factor of the original's own rounding error: a wrong program errs on the output's scale.
    floor = TOLERANCES.get(str(e.dtype), TOLERANCES["float32"])[1] * scale if is_float(e.dtype) else 0.0
    if err_actual <= factor * err_expected + floor:
        return None
    return (f"error against the float64 value {err_actual:.3g} exceeds {factor}x the original's "
            f"{err_expected:.3g} (normwise, dtype {e.dtype})")
