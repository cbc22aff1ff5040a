"""The term language's signatures: each constructor's argument sorts and result sort, for the pattern language
(rewrites/pattern.py) and the runner. Plain data, apart from the egglog declarations of `terms.py` that they
describe, so that defining rules does not import egglog."""
from __future__ import annotations

# Sorts of pattern variables and constants.
TENSOR, LIST, VEC, DTYPE, OP, FLOAT, INT = "tensor", "list", "vec", "dtype", "op", "float", "int"
SCALAR = "scalar"  # a kernel body's value (egraph/terms.py `Scalar`)
FORMAT = "format"  # a packed layout's name (superopt/core/formats.py)
SORTS = (TENSOR, LIST, VEC, DTYPE, OP, FLOAT, INT, SCALAR, FORMAT)

# Term constructors: name -> (argument sorts, result sort). `vec` is Vec[i64]: shapes, perms, axes.
CONSTRUCTORS: dict[str, tuple[tuple[str, ...], str]] = {
    "arg": ((INT,), TENSOR), "const": ((INT,), TENSOR), "lit": ((FLOAT, DTYPE), TENSOR),
    "iota": ((INT, VEC, DTYPE), TENSOR),
    "unary": ((OP, TENSOR), TENSOR), "binary": ((OP, TENSOR, TENSOR), TENSOR),
    "integer_pow": ((TENSOR, INT), TENSOR), "select": ((TENSOR, TENSOR, TENSOR), TENSOR),
    "convert": ((TENSOR, DTYPE), TENSOR), "matmul": ((TENSOR, TENSOR, DTYPE), TENSOR),
    "conv": ((TENSOR, TENSOR, INT), TENSOR), "reduce": ((OP, TENSOR, VEC), TENSOR),
    "argreduce": ((OP, TENSOR, INT, DTYPE), TENSOR), "scan": ((OP, TENSOR, INT, INT), TENSOR),
    "pool": ((OP, TENSOR, VEC, VEC, VEC, VEC), TENSOR), "transpose": ((TENSOR, VEC), TENSOR),
    "reshape": ((TENSOR, VEC), TENSOR), "broadcast": ((TENSOR, VEC, VEC), TENSOR),
    "concat": ((LIST, INT), TENSOR), "slice": ((TENSOR, VEC, VEC, VEC), TENSOR),
    "pad": ((TENSOR, TENSOR, VEC, VEC, VEC), TENSOR),
    "tnil": ((), LIST), "tcons": ((TENSOR, LIST), LIST),
    # packed layouts
    "pack": ((TENSOR, FORMAT), TENSOR), "unpack": ((TENSOR, FORMAT, VEC), TENSOR),
    "fractal_matmul": ((TENSOR, TENSOR, DTYPE), TENSOR),
    # kernels and the Scalar body language
    "kernel": ((SCALAR,), TENSOR), "sarg": ((TENSOR, VEC), SCALAR),
    "sunary": ((OP, SCALAR), SCALAR), "sbinary": ((OP, SCALAR, SCALAR), SCALAR),
    "sselect": ((SCALAR, SCALAR, SCALAR), SCALAR), "sconvert": ((SCALAR, DTYPE), SCALAR),
    "spow": ((SCALAR, INT), SCALAR), "sbcast": ((SCALAR, VEC), SCALAR), "srow": ((OP, SCALAR), SCALAR),
    "sperm": ((SCALAR, VEC), SCALAR), "smm": ((TENSOR, TENSOR, DTYPE), SCALAR),
    "sconv": ((TENSOR, TENSOR, INT), SCALAR), "schain": ((SCALAR, TENSOR, DTYPE), SCALAR),
    "sconvchain": ((SCALAR, TENSOR, INT), SCALAR),
}
# The tensor constructor each Scalar constructor applies on chip, with the same primitive arguments in
# the same order (sarg, sbcast and srow load, broadcast and reduce-keeping-the-axis instead).
SCALAR_AS_TENSOR = {"sunary": "unary", "sbinary": "binary", "sselect": "select", "sconvert": "convert",
                    "spow": "integer_pow", "sperm": "transpose", "smm": "matmul", "sconv": "conv",
                    "schain": "matmul", "sconvchain": "conv"}
SCALAR_FNS = frozenset(fn for fn, (_, sort) in CONSTRUCTORS.items() if sort == SCALAR)
