"""The instruction set of a cube/vector AI core, as frozen dataclasses.

A program is a list of instructions, each issued to one queue of one core. Queues run in parallel and
in order; they synchronise only through flags (`SetFlag` on the producing queue, `WaitFlag` on the
consuming one) and `Barrier`. Operands are on-chip buffers (`Buf`, a region of L1, L0A, L0B, L0C or the
Unified Buffer) or windows of global memory (`Gm`). Data paths and their queues:

    MTE2   GM -> L1, GM -> UB            (copy in)
    MTE1   L1 -> L0A / L0B               (ND -> fractal; img2col for a convolution)
    cube   L0A x L0B -> L0C              (MMAD on 16x16x16 fp16 fractals, 16x32x16 int8, 16x8x16 fp32 where the
                                          chip takes fp32 operands; fp32 / int32 accumulation)
           L0C -> GM / L1 / UB           (FIXPIPE: cast, relu, requantize; drains the cube, on its queue)
    vector UB -> UB                      (elementwise, row reductions, casts, select; 256-byte repeats)
    MTE3   UB -> GM                      (copy out; atomic add into GM for partial sums)
    scalar                               (loop bookkeeping)

On a coupled core (npu-910) the six queues belong to one core; on a separated one (npu-910b) the cube
core ("aic") and the vector core ("aiv") each have their own queues and exchange data through GM.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

SPACES = ("L1", "L0A", "L0B", "L0C", "UB")
QUEUES = ("scalar", "vector", "cube", "MTE1", "MTE2", "MTE3")
ALIGNMENT = {"UB": 32, "L1": 32, "L0A": 512, "L0B": 512, "L0C": 512}   # bytes (reference facts: UB 32, L0A/B 512)

# `precision` of an NPU program: the type the cube multiplies float32 operands in.
PRECISIONS = ("fp16", "fp32")


@dataclass(frozen=True)
class Buf:
    """A region of an on-chip buffer: `space` at byte `offset`, holding a `shape` array of `dtype`."""
    name: str
    space: str
    offset: int
    shape: tuple
    dtype: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    def __str__(self) -> str:
        return f"{self.space}:{self.name}{list(self.shape)}"


@dataclass(frozen=True)
class Gm:
    """A window of a global-memory tensor: `start` and `size` per axis (a tile, or the whole array)."""
    tensor: str
    start: tuple
    size: tuple

    def __str__(self) -> str:
        window = ",".join(f"{s}:{s + n}" for s, n in zip(self.start, self.size))
        return f"GM:{self.tensor}[{window}]"


@dataclass(frozen=True)
class Instr:
    core: str
    queue: str

    def reads(self) -> tuple:
        return ()

    def writes(self) -> tuple:
        return ()


@dataclass(frozen=True)
class _Move(Instr):
    """An instruction that reads `src` and writes `dst`."""
    src: object = None
    dst: object = None

    def reads(self):
        return (self.src,)

    def writes(self):
        return (self.dst,)


@dataclass(frozen=True)
class CopyIn(_Move):
    """MTE2: a GM window into L1 or the UB (zeros where it lies outside the tensor, on either side: the
    padding of a convolution's input), cast to the buffer's dtype
    when the window's dtype differs (the cube's operands become fp16). `src` is a Gm, `dst` a Buf. With
    `at`, the window fills only its own region of `dst`, from that row and column. With `layout`, the
    window is a block of whole fractals of a packed tensor in that format (superopt/core/formats.py: ZZ, ZN) and
    lands as the matrix it holds (the cube's operands are fractal on chip anyway)."""
    at: tuple = ()
    layout: str = ""


@dataclass(frozen=True)
class LoadL0(_Move):
    """MTE1: a block of an L1 matrix, from row and column `at`, into L0A (left operand) or L0B (right
    operand), converted ND -> fractal and to the buffer's dtype; `transpose` reads the block transposed
    (the fractal load does this for free)."""
    at: tuple = (0, 0)        # the block's first row and column in `src`
    transpose: bool = False


@dataclass(frozen=True)
class Mmad(Instr):
    """Cube: C (+)= A @ B on fractals; A [m,k] in L0A, B [k,n] in L0B, C [m,n] fp32 in L0C."""
    a: Buf = None
    b: Buf = None
    c: Buf = None
    accumulate: bool = False

    def reads(self):
        return (self.a, self.b) + ((self.c,) if self.accumulate else ())

    def writes(self):
        return (self.c,)


@dataclass(frozen=True)
class FixPipe(_Move):
    """L0C -> GM, L1 or UB, cast to the destination's dtype, with an optional relu; `atomic_add` adds
    into GM (partial sums of a reduction split across tiles). `dst` is a Buf or a Gm. With `layout` (NZ,
    L0C's own format), the block is written into a packed GM tensor as whole fractals. With `at`, the
    block fills only its own region of an L1 matrix `dst`, from that row and column. A GM window of as
    many elements as the block takes it in the window's shape (rows of an image, say), the part inside
    the tensor."""
    relu: bool = False
    atomic_add: bool = False
    layout: str = ""
    at: tuple = ()


@dataclass(frozen=True)
class VecOp(Instr):
    """Vector unit on UB buffers: `op` is an elementwise IR op (unary, binary, select, convert) with
    operands broadcast to the destination's shape, or a reduction of the last axis ("row_sum",
    "row_max", kept as a size-1 axis). `attrs` carries the op's attributes (e.g. an integer power)."""
    op: str = ""
    dst: Buf = None
    srcs: tuple = ()
    attrs: tuple = ()

    def reads(self):
        return tuple(self.srcs)

    def writes(self):
        return (self.dst,)


@dataclass(frozen=True)
class CopyOut(_Move):
    """MTE3: a UB buffer into a GM window (the part inside the tensor); `atomic_add` adds into GM. With
    `at`, only the block of `src` from that row and column, of the window's size, is copied (a strided
    read of the UB, as DataCopy's source stride gives)."""
    atomic_add: bool = False
    at: tuple = ()


@dataclass(frozen=True)
class ScalarOp(Instr):
    """Scalar unit: loop bookkeeping and address arithmetic for one tile step."""
    cycles: int = 0
    note: str = ""


@dataclass(frozen=True)
class SetFlag(Instr):
    """Issued on `queue` once the instructions before it on that queue are done; releases one WaitFlag
    on (`dst_core`, `dst_queue`) with the same `event`."""
    dst_core: str = ""
    dst_queue: str = ""
    event: int = 0


@dataclass(frozen=True)
class WaitFlag(Instr):
    """Holds `queue` until the matching SetFlag from (`src_core`, `src_queue`) with `event` has fired."""
    src_core: str = ""
    src_queue: str = ""
    event: int = 0


@dataclass(frozen=True)
class Barrier(Instr):
    """Every queue of `core` waits until all of them are done with what came before (queue is "all")."""


@dataclass
class Program:
    """Instructions in issue order, the on-chip buffers they use, and the GM tensors they name:
    `inputs` and `outputs` are (name, shape, dtype); `workspace` are GM scratch tensors (e.g. the
    910B's cube-to-vector exchange), zero-initialised like outputs that take atomic adds."""
    instrs: list = field(default_factory=list)
    buffers: list = field(default_factory=list)
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    workspace: list = field(default_factory=list)
    cores: tuple = ("core",)

    def emit(self, instr: Instr) -> Instr:
        self.instrs.append(instr)
        return instr


def img2col(block: np.ndarray, kh: int, kw: int, sh: int, sw: int, top: int, left: int, rows: int,
            cols: int) -> np.ndarray:
    """The patches of `rows` x `cols` output positions, from an input block [1, r, q, C] whose first row
    is `top` rows below the box's first (padded) input row and whose first column is `left` columns right
    of its first (padded) input column; zeros elsewhere (the padding)."""
    _, r, q, c = block.shape
    padded = np.zeros(((rows - 1) * sh + kh, (cols - 1) * sw + kw, c), block.dtype)
    padded[top:top + r, left:left + q] = block[0]
    win = np.lib.stride_tricks.sliding_window_view(padded, (kh, kw), axis=(0, 1))   # [R', W', C, kh, kw]
    win = win[::sh, ::sw][:rows, :cols]
    return win.transpose(0, 1, 3, 4, 2).reshape(rows * cols, kh * kw * c)
