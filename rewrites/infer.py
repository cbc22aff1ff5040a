"""Result types of term constructors on concrete operands: the Python twin of `egraph/analysis.py`.

The soundness checker evaluates patterns on concrete bindings; each constructor application first gets
its result shape and dtype here, and an application that is not well typed raises `IllTyped`.
"""
from __future__ import annotations

import numpy as np

from superopt.core.ops import flagged
from superopt.core.formats import LayoutError, fractal_matmul_shape, packed_shape

Type = tuple[tuple[int, ...], str]


BOOL_RESULT = flagged("bool_result")


class IllTyped(ValueError):
    pass


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise IllTyped(what)


def _elementwise(op: str, ins: list[Type]) -> Type:
    shapes = [s for s, _ in ins if len(s)]
    # Operands of equal rank broadcast axes of size 1 (lax accepts this in the pinned JAX); rank 0 broadcasts anywhere.
    ok = all(len(s) == len(shapes[0]) and all(a == b or 1 in (a, b) for a, b in zip(s, shapes[0])) for s in shapes)
    _need(ok and op != "select" or all(s == shapes[0] for s in shapes),
          f"{op}: operand shapes {[s for s, _ in ins]} do not broadcast")
    shapes = [tuple(max(dims) for dims in zip(*shapes))] if shapes else []
    dtypes = {d for _, d in ins}
    _need(len(dtypes) == 1 or op == "select", f"{op}: operand dtypes {sorted(dtypes)} differ")
    shape = shapes[0] if shapes else ()
    return shape, ("bool" if op in BOOL_RESULT else ins[-1][1])


def _conv(params: dict, ins: list[Type]) -> Type:
    """conv_general_dilated's result shape; `prims[0]` carries the parameters themselves, not their id."""
    (lhs, ld), (rhs, rd) = ins
    lhs_spec, rhs_spec, out_spec = params["dimension_numbers"]
    _need(len(lhs) == len(rhs) == len(lhs_spec), "conv: operand ranks differ")
    groups, batch_groups = params["feature_group_count"], params["batch_group_count"]
    _need(lhs[lhs_spec[1]] == rhs[rhs_spec[1]] * groups, "conv: input features do not match the kernel")
    spatial = []
    for k, (li, ri) in enumerate(zip(lhs_spec[2:], rhs_spec[2:])):
        size = (lhs[li] - 1) * params["lhs_dilation"][k] + 1 + sum(params["padding"][k])
        window = (rhs[ri] - 1) * params["rhs_dilation"][k] + 1
        _need(size >= window, "conv: window larger than the padded input")
        spatial.append((size - window) // params["window_strides"][k] + 1)
    out = [0] * len(lhs)
    out[out_spec[0]] = lhs[lhs_spec[0]] // batch_groups
    out[out_spec[1]] = rhs[rhs_spec[0]]
    for k, oi in enumerate(out_spec[2:]):
        out[oi] = spatial[k]
    dtype = params.get("preferred_element_type")
    return tuple(out), str(np.dtype(dtype)) if dtype is not None else ld


def _packed(fn: str, prims: tuple, ins: list[Type]) -> Type:
    """Packed layouts (superopt/core/formats.py); a format that does not apply is ill typed."""
    try:
        if fn == "pack":
            return packed_shape(prims[0], ins[0][0]), ins[0][1]
        if fn == "unpack":
            (s, d), (name, shape) = ins[0], prims
            _need(packed_shape(name, tuple(shape)) == tuple(s), f"unpack {name}: {s} does not pack {tuple(shape)}")
            return tuple(shape), d
        (a, ad), (b, bd) = ins
        _need(ad == bd, "fractal_matmul: operand dtypes differ")
        return fractal_matmul_shape(a, b), prims[0]
    except LayoutError as exc:
        raise IllTyped(str(exc)) from exc


def infer(fn: str, prims: tuple, ins: list[Type]) -> Type:
    """(shape, dtype) of constructor `fn` applied to primitive arguments `prims` and tensor operands `ins`."""
    if fn == "lit":
        return (), prims[1]
    if fn in ("unary", "integer_pow"):
        return _elementwise(prims[0] if fn == "unary" else fn, ins)
    if fn == "binary":
        return _elementwise(prims[0], ins)
    if fn == "select":
        (ps, pd), f, t = ins
        _need(pd == "bool" and (ps == () or ps == f[0]), "select: predicate must be bool, rank 0 or shaped")
        _need(f == t, f"select: branches {f} and {t} differ")
        return f
    if fn == "convert":
        return ins[0][0], prims[0]
    if fn == "matmul":
        (a, ad), (b, bd) = ins
        _need(len(a) >= 2 and len(b) >= 2, "matmul: operands need rank >= 2")
        _need(len(b) == 2 or (len(a) == len(b) and a[:-2] == b[:-2]), "matmul: batch dimensions differ")
        _need(a[-1] == b[-2], f"matmul: contracting dimensions {a[-1]} and {b[-2]} differ")
        _need(ad == bd, "matmul: operand dtypes differ")
        return a[:-1] + (b[-1],), prims[0]
    if fn == "transpose":
        (s, d), perm = ins[0], prims[0]
        _need(sorted(perm) == list(range(len(s))), f"transpose: {perm} is not a permutation of rank {len(s)}")
        return tuple(s[p] for p in perm), d
    if fn == "reshape":
        (s, d), target = ins[0], tuple(prims[0])
        _need(int(np.prod(s)) == int(np.prod(target)), f"reshape: {s} -> {target} changes the element count")
        return target, d
    if fn == "broadcast":
        (s, d), (target, dims) = ins[0], prims
        _need(len(dims) == len(s) and list(dims) == sorted(set(dims)) and all(0 <= k < len(target) for k in dims),
              f"broadcast: dims {dims} do not place rank {len(s)} in rank {len(target)}")
        _need(all(s[i] in (1, target[k]) for i, k in enumerate(dims)), f"broadcast: {s} does not fit {target}")
        return tuple(target), d
    if fn == "reduce":
        (s, d), axes = ins[0], prims[1]
        _need(list(axes) == sorted(set(axes)) and all(0 <= a < len(s) for a in axes), f"reduce: bad axes {axes}")
        return tuple(n for i, n in enumerate(s) if i not in axes), d
    if fn == "pool":
        (s, d), (_, window, strides, low, high) = ins[0], prims
        _need(len(window) == len(strides) == len(low) == len(high) == len(s), "pool: attribute ranks differ")
        _need(all(w >= 1 and t >= 1 for w, t in zip(window, strides)), "pool: windows and strides must be positive")
        out = tuple((n + lo + hi - w) // t + 1 for n, w, t, lo, hi in zip(s, window, strides, low, high))
        _need(all(n >= 1 for n in out), f"pool: window larger than the padded input {s}")
        return out, d
    if fn == "scan":
        (s, d), (_, axis, reverse) = ins[0], prims
        _need(0 <= axis < len(s) and reverse in (0, 1), f"scan: bad axis {axis} or reverse {reverse}")
        return s, d
    if fn == "argreduce":
        (s, _), (_, axis, dtype) = ins[0], prims
        _need(0 <= axis < len(s), f"argreduce: bad axis {axis}")
        return tuple(n for i, n in enumerate(s) if i != axis), dtype
    if fn == "concat":
        dim = prims[0]
        _need(bool(ins) and all(len(s) == len(ins[0][0]) for s, _ in ins), "concat: ranks differ")
        _need(0 <= dim < len(ins[0][0]), f"concat: bad dimension {dim}")
        rest = [tuple(n for i, n in enumerate(s) if i != dim) for s, _ in ins]
        _need(all(r == rest[0] for r in rest) and len({d for _, d in ins}) == 1, "concat: operands differ")
        shape = list(ins[0][0])
        shape[dim] = sum(s[dim] for s, _ in ins)
        return tuple(shape), ins[0][1]
    if fn == "slice":
        (s, d), (start, limit, strides) = ins[0], prims
        _need(len(start) == len(limit) == len(strides) == len(s), "slice: index ranks differ")
        _need(all(0 <= a <= b <= n and c >= 1 for a, b, c, n in zip(start, limit, strides, s)), "slice: out of range")
        return tuple(-(-(b - a) // c) for a, b, c in zip(start, limit, strides)), d
    if fn == "pad":
        (s, d), (vs, vd) = ins
        lo, hi, interior = prims
        _need(vs == () and vd == d and len(lo) == len(hi) == len(interior) == len(s), "pad: bad operands")
        out = tuple(a + b + n + max(0, n - 1) * c for a, b, n, c in zip(lo, hi, s, interior))
        _need(all(n >= 0 for n in out) and all(c >= 0 for c in interior), "pad: negative size")
        return out, d
    if fn == "conv":
        return _conv(dict(prims[0]), ins)
    if fn in ("pack", "unpack", "fractal_matmul"):
        return _packed(fn, prims, ins)
    if fn == "iota":
        dim, shape, dtype = prims
        _need(0 <= dim < len(shape), "iota: bad dimension")
        return tuple(shape), dtype
    raise IllTyped(f"no type rule for constructor {fn!r}")
