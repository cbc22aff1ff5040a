"""Dtype facts every layer shares."""
from __future__ import annotations

import math

import ml_dtypes  # also makes np.dtype('bfloat16') and the float8 names resolve
import numpy as np


def smallest_normal(dtype) -> float:
    """The smallest positive normal number of a float dtype (ml_dtypes' included)."""
    return float(ml_dtypes.finfo(np.dtype(dtype)).smallest_normal)


def is_float(dtype) -> bool:
    """numpy's float kinds, and the ml_dtypes floats (bfloat16, float8), whose numpy kind is 'V'."""
    dtype = np.dtype(dtype)
    return dtype.kind in "fc" or dtype.name.startswith(("bfloat", "float8"))


def moderate_bounds(dtype) -> tuple[float, float]:
    """(least, largest) magnitude of an element `moderate` admits in a float dtype: the square roots of its
    smallest normal number and of its largest finite value, rounded inward to powers of two."""
    info = ml_dtypes.finfo(np.dtype(dtype))
    least = 2.0 ** math.ceil(math.log2(float(info.smallest_normal)) / 2)
    return least, 2.0 ** math.floor(math.log2(float(info.max)) / 2)


# exp_moderate admits |x| <= floor(log(largest) / 2) - EXP_MARGIN: float32 43, float16 4, float64 353
EXP_MARGIN = 1


def exp_moderate_bound(dtype) -> float:
    """The largest magnitude `exp_moderate` admits in a float dtype."""
    return float(math.floor(math.log(float(ml_dtypes.finfo(np.dtype(dtype)).max)) / 2) - EXP_MARGIN)
