"""Packed layouts: the formats `pack(x, format)` and `unpack(x, format, shape)` convert between.

A format is data: the block size of each of the tensor's last axes it splits, and the order of the
split axes. Packing is pad -> split -> transpose; unpacking is the inverse transpose -> merge -> slice.
Where an axis does not divide into its blocks, packing pads it with zeros to the next multiple, and
unpacking drops the padding (whatever it holds). Axes before the formatted ones (a batch) stay in
front, in order. With the 2-D matrix [..., M, N], M1 = ceil(M / 16), N1 = ceil(N / 16) and Mp, Np the
padded sizes, the formats are exactly:

  ND       the identity: pack(x, "ND") is x, any rank.
  ZZ       [..., M, N] -> [..., M1, N1, 16, 16], packed[.., i, j, a, b] = x[.., 16 i + a, 16 j + b]:
           fractals in row-major order, each row-major. Ascend's L0A (the cube's left operand).
  ZN       [..., M, N] -> [..., M1, N1, 16, 16], packed[.., i, j, b, a] = x[.., 16 i + a, 16 j + b]:
           fractals in row-major order, each transposed (column-major). Ascend's L0B (right operand).
  NZ       [..., M, N] -> [..., N1, M1, 16, 16], packed[.., j, i, a, b] = x[.., 16 i + a, 16 j + b]:
           fractals in column-major order, each row-major. Ascend's L0C (the cube's result) and
           FRACTAL_NZ in GM.
  B32      [..., M, N] -> [..., ceil(M/32), ceil(N/32), 32, 32]: 32x32 blocks in row-major order,
           each row-major (ZZ with 32x32 blocks).
  VNNI     [..., K, N] -> [..., ceil(K/4), N, 4], packed[.., i, n, a] = x[.., 4 i + a, n]: groups of
           four consecutive K values of one column stored together (the int8 dot-product layout of
           x86 VNNI / AMX).
  NC1HWC0  [N, H, W, C] (NHWC, rank 4 only) -> [N, ceil(C/16), H, W, 16],
           packed[n, c1, h, w, c0] = x[n, h, w, 16 c1 + c0]. Ascend's 5-D feature-map format, C0 = 16.

These are the Ascend formats of `../shared/reference/hardware-and-jax-facts.md` (L0A ZZ, L0B ZN, L0C NZ,
16x16 fp16 fractals, NC1HWC0 with C0 = 16). `fractal_matmul` multiplies a ZZ left operand by a ZN right
one into an NZ result: the cube's own contraction, without the ND conversions around it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

FRACTAL = 16
# The cube multiplies 16 x K x 16 fractals per cycle with 32 bytes of K for every operand type (the C0 of the
# fractal formats): 16 fp16 or bf16, 32 int8, 8 fp32 (fp32 halves the fp16 rate; which chips take fp32 at
# all is `NpuSpec.cube_fp32`). Tiles are multiplied in L0 blocks of 128 x 128 fp16 (32 KB: two fit L0A).
CUBE_K_PER_CYCLE = {"float16": 16, "bfloat16": 16, "int8": 32, "float32": 8}
CUBE_L0_BLOCK = 128


class LayoutError(ValueError):
    """A format that does not apply to a shape (a rank it cannot pack, or an unknown name)."""


@dataclass(frozen=True)
class Format:
    name: str
    blocks: tuple[int, ...]      # block size of each of the last len(blocks) axes (1: not split)
    perm: tuple[int, ...]        # order of the split axes: each blocked axis is (outer, inner), in axis order
    rank: int | None = None      # the only rank it packs; None: any rank >= len(blocks)

    def fits(self, rank: int) -> bool:
        return rank == self.rank if self.rank is not None else rank >= len(self.blocks)

    def check(self, shape: tuple) -> None:
        if not self.fits(len(shape)):
            need = f"rank {self.rank}" if self.rank is not None else f"rank >= {len(self.blocks)}"
            raise LayoutError(f"format {self.name} packs {need}, not shape {tuple(shape)}")

    def batch(self, rank: int) -> int:
        """How many leading axes the format leaves alone."""
        return rank - len(self.blocks)

    def split_dims(self, dims: list, ceil_div: Callable) -> list:
        """The padded shape with each blocked axis split into (outer, inner), before the transpose.
        Generic over the number type (`ceil_div` says how to divide), so egglog shapes use it too."""
        lead = list(dims[:self.batch(len(dims))])
        tail = []
        for n, b in zip(dims[self.batch(len(dims)):], self.blocks):
            tail += [ceil_div(n, b), b] if b > 1 else [n]
        return lead + tail

    def packed_dims(self, dims: list, ceil_div: Callable) -> list:
        split = self.split_dims(dims, ceil_div)
        return [split[p] for p in self.full_perm(len(dims))]

    def full_perm(self, rank: int) -> tuple:
        """The transpose from the split shape to the packed one, batch axes included."""
        lead = self.batch(rank)
        return tuple(range(lead)) + tuple(lead + p for p in self.perm)

    def packed_shape(self, shape: tuple) -> tuple:
        self.check(shape)
        return tuple(int(d) for d in self.packed_dims(list(shape), lambda n, b: -(-n // b)))

    def padded_shape(self, shape: tuple) -> tuple:
        lead = self.batch(len(shape))
        return tuple(shape[:lead]) + tuple(-(-n // b) * b for n, b in zip(shape[lead:], self.blocks))

    def fills_blocks(self, shape: tuple) -> bool:
        """Whether packing `shape` adds no padding (so unpacking then packing again is the identity)."""
        return self.fits(len(shape)) and tuple(shape) == self.padded_shape(shape)

    def outer_axis(self, rank: int, axis: int) -> int:
        """The packed axis that holds logical `axis` (its outer part when the axis is blocked)."""
        lead = self.batch(rank)
        if axis < lead:
            return axis
        position = lead + sum(2 if b > 1 else 1 for b in self.blocks[:axis - lead])
        return self.full_perm(rank).index(position)


FORMATS: dict[str, Format] = {f.name: f for f in [
    Format("ND", (), ()),
    Format("ZZ", (FRACTAL, FRACTAL), (0, 2, 1, 3)),
    Format("ZN", (FRACTAL, FRACTAL), (0, 2, 3, 1)),
    Format("NZ", (FRACTAL, FRACTAL), (2, 0, 1, 3)),
    Format("B32", (32, 32), (0, 2, 1, 3)),
    Format("VNNI", (4, 1), (0, 2, 1)),
    Format("NC1HWC0", (1, 1, 1, FRACTAL), (0, 3, 1, 2, 4), rank=4),
]}
# The cube's formats: left operand, right operand, result.
CUBE_FORMATS = ("ZZ", "ZN", "NZ")


def format_of(name: str) -> Format:
    if name not in FORMATS:
        raise LayoutError(f"unknown format {name!r}; known: {', '.join(FORMATS)}")
    return FORMATS[name]


def packed_shape(name: str, shape: tuple) -> tuple:
    return format_of(name).packed_shape(tuple(shape))


def _inverse(perm: tuple) -> tuple:
    return tuple(int(i) for i in np.argsort(perm))


# ---- numpy: the reference semantics (superopt/core/reference.py) and the emulator's UB conversions ----

def pack_np(x: np.ndarray, name: str) -> np.ndarray:
    f = format_of(name)
    f.check(x.shape)
    padded = f.padded_shape(x.shape)
    if padded != tuple(x.shape):
        x = np.pad(x, [(0, p - n) for n, p in zip(x.shape, padded)])   # with zeros
    split = f.split_dims(list(padded), lambda n, b: n // b)
    return np.transpose(x.reshape(split), f.full_perm(x.ndim))


def unpack_np(y: np.ndarray, name: str, shape: tuple) -> np.ndarray:
    f = format_of(name)
    shape = tuple(shape)
    if tuple(y.shape) != f.packed_shape(shape):
        raise LayoutError(f"unpack {name}: a {tuple(y.shape)} tensor does not pack shape {shape}")
    padded = f.padded_shape(shape)
    split = np.transpose(y, _inverse(f.full_perm(len(shape))))
    return split.reshape(padded)[tuple(slice(0, n) for n in shape)]


def holds(name: str, packed: tuple) -> tuple:
    """The padded logical shape a packed array holds (its logical shape when it fills whole blocks)."""
    f = format_of(name)
    rank = len(packed) - sum(b > 1 for b in f.blocks)
    split = [0] * len(packed)
    for axis, src in enumerate(f.full_perm(rank)):
        split[src] = packed[axis]
    dims, i = list(split[:f.batch(rank)]), f.batch(rank)
    for b in f.blocks:
        dims.append(split[i] * (split[i + 1] if b > 1 else 1))
        i += 2 if b > 1 else 1
    return tuple(dims)


# ---- the cube's contraction on fractals ----

def fractal_matmul_shape(a: tuple, b: tuple) -> tuple:
    """Result shape of fractal_matmul: a ZZ [..., M1, K1, 16, 16] by a ZN [K1, N1, 16, 16] (or with a's
    batch) gives NZ [..., N1, M1, 16, 16]; raises LayoutError otherwise."""
    cube = (FRACTAL, FRACTAL)
    if len(a) < 4 or len(b) < 4 or tuple(a[-2:]) != cube or tuple(b[-2:]) != cube:
        raise LayoutError(f"fractal_matmul: operands {tuple(a)} and {tuple(b)} are not 16x16 fractal arrays")
    if len(b) != 4 and tuple(a[:-4]) != tuple(b[:-4]):
        raise LayoutError(f"fractal_matmul: batch dimensions of {tuple(a)} and {tuple(b)} differ")
    if a[-3] != b[-4]:
        raise LayoutError(f"fractal_matmul: contracting fractal counts {a[-3]} and {b[-4]} differ")
    return tuple(a[:-4]) + (b[-3], a[-4], FRACTAL, FRACTAL)


def fractal_einsum(batched_rhs: bool) -> str:
    """out[.., n1, m1, i, j] = sum over k1, k0 of a[.., m1, k1, i, k0] * b[(..,) k1, n1, j, k0]."""
    return "...mkip,...knjp->...nmij" if batched_rhs else "...mkip,knjp->...nmij"


def as_matmul(a: tuple, b: tuple, out: tuple) -> tuple[tuple, tuple, tuple]:
    """The ND shapes (padded to 16) of the matmul a fractal_matmul computes: ([.., Mp, Kp], [.., Kp, Np],
    [.., Mp, Np]); a cost model charges it as that matmul."""
    m1, k1 = a[-4], a[-3]
    n1 = b[-3]
    rhs = tuple(b[:-4]) + (k1 * FRACTAL, n1 * FRACTAL)
    return tuple(a[:-4]) + (m1 * FRACTAL, k1 * FRACTAL), rhs, tuple(out[:-4]) + (m1 * FRACTAL, n1 * FRACTAL)
