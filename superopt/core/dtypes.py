"""Dtype facts every layer shares."""
from __future__ import annotations

import ml_dtypes  # also makes np.dtype('bfloat16') and the float8 names resolve
import numpy as np


def smallest_normal(dtype) -> float:
    """The smallest positive normal number of a float dtype (ml_dtypes' included)."""
    return float(ml_dtypes.finfo(np.dtype(dtype)).smallest_normal)


def is_float(dtype) -> bool:
    """numpy's float kinds, and the ml_dtypes floats (bfloat16, float8), whose numpy kind is 'V'."""
    dtype = np.dtype(dtype)
    return dtype.kind in "fc" or dtype.name.startswith(("bfloat", "float8"))
