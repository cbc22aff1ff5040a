"""Code generation: from a kernel's loop nest and tiles to an NPU program (`isa.Program`).

Programs are written as sequential code, one instruction per queue step in the order a single core
would run them; `insert_flags` then adds a SetFlag/WaitFlag pair wherever one queue reads what another
wrote or overwrites what another still reads. Two slots per staged operand (ping-pong) let the next
tile's copy overlap the current tile's compute: the flags make the copy wait only for the tile two
steps back.

The tiled GEMM follows the Chimera model exactly (`extract/models/chimera.py`): the loops run in the
tiling's order, and an operand tile is copied in again only when a loop that indexes it, or one
outside such a loop, moves on; so the bytes moved between GM and the chip are the model's DV. The
output tile accumulates in L0C while the reduction loop runs inside it; if a reduction step lies
outside the output tile's lifetime, each partial tile is added into GM (atomic add), which is the
model's count as well. The output tiles of the loops outside the reduction (and the batch) are dealt to
the cores in turn.
"""
from __future__ import annotations

import itertools
import math
from collections import defaultdict

import numpy as np

from superopt.core.formats import CUBE_L0_BLOCK, FORMATS, FRACTAL, packed_shape
from superopt.extract.models import npu as npu_model
from superopt.extract.target import Target
from superopt.lowering.npu.isa import (
    ALIGNMENT, PRECISIONS, Buf, CopyIn, FixPipe, Gm, LoadL0, Mmad, Program, ScalarOp, SetFlag, WaitFlag,
)

EVENTS = 8              # event ids per pair of queues


class CodegenError(ValueError):
    """A kernel the generator cannot place on the target as tiled."""


def check_precision(precision: str, target: Target) -> str:
    """`precision` if `target`'s cube takes it, else a one-line ValueError naming the target: "fp16" (the
    cube multiplies float32 operands rounded to fp16, at its full rate) everywhere, "fp32" (float32
    operands as they are, at half that rate) where the chip's cube takes fp32 (`NpuSpec.cube_fp32`)."""
    if precision not in PRECISIONS:
        raise ValueError(f"superopt: unknown NPU precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    if precision == "fp32" and not target.npu.cube_fp32:
        raise ValueError(f"superopt: precision 'fp32' is not available on {target.name}: its cube declares no "
                         f"fp32 rate (fp16 and int8 operands only); valid: fp16")
    return precision


def cube_dtype(dtype: str, precision: str = "fp16", other: str | None = None) -> str:
    """The type the cube multiplies a matmul whose left operand is `dtype` (and right `other`) in: int8 and
    bf16 as they are, float32 (or float64) operands as fp32 under `precision` "fp32" and as fp16 under "fp16"."""
    if dtype == "int8":
        return "int8"
    if precision == "fp32" and {dtype, other or dtype} & {"float32", "float64"}:
        return "float32"
    return "bfloat16" if dtype == "bfloat16" else "float16"


def _depth_block(dtype: str) -> int:
    """The K edge of an L0 block: 128 fp16 (128x128 fp16 = 32 KB, two slots fit L0A), 64 fp32 (the same bytes)."""
    return CUBE_L0_BLOCK * 2 // max(2, np.dtype(dtype).itemsize)


def _up(n: int, m: int = FRACTAL) -> int:
    return -(-n // m) * m


def _as3(shape: tuple) -> tuple:
    return (1,) * (3 - len(shape)) + tuple(shape)


def _view(buf: Buf, shape: tuple) -> Buf:
    """The first `shape` of an allocated buffer (a smaller block in the same place)."""
    return Buf(buf.name, buf.space, buf.offset, tuple(shape), buf.dtype)


class Allocator:
    """Static, aligned allocation per on-chip space; every buffer lives for the whole program."""

    def __init__(self, program: Program):
        self.program, self.top = program, defaultdict(int)

    def __call__(self, name: str, space: str, shape: tuple, dtype: str) -> Buf:
        offset = _up(self.top[space], ALIGNMENT[space])
        buf = Buf(name, space, offset, tuple(shape), dtype)
        self.top[space] = offset + buf.nbytes
        self.program.buffers.append(buf)
        return buf


def cube_cores(target: Target) -> list[str]:
    """The cores a cube program's tiles are dealt to: the AI cores of a coupled chip (npu-910), the cube
    cores ("aic") of a separated one (npu-910b)."""
    prefix = "aic" if target.npu.separated else "core"
    return [f"{prefix}{i}" for i in range(target.npu.cores)]


def vector_cores(target: Target) -> list[str]:
    """The cores a vector program's boxes are dealt to: the AI cores of a coupled chip (npu-910), the
    vector cores ("aiv", several per cube core) of a separated one (npu-910b)."""
    npu = target.npu
    if not npu.separated:
        return [f"core{i}" for i in range(npu.cores)]
    return [f"aiv{i}" for i in range(npu.cores * npu.vector_cores_per_cube)]


def insert_flags(instrs: list) -> list:
    """The sequential program with the flags a parallel machine needs: before an instruction that reads
    a buffer another queue wrote (or writes one another queue reads or wrote), a SetFlag on that queue
    and a WaitFlag on this one; none where an earlier flag already covers it."""
    out: list = []
    position: dict = defaultdict(int)      # (core, queue) -> instructions issued so far
    last_write: dict = {}                  # operand key -> (core, queue, position)
    readers: dict = defaultdict(dict)      # operand key -> {(core, queue): position}
    synced: dict = {}                      # (producer queue, consumer queue) -> position covered
    events: dict = defaultdict(int)

    def key(core, operand):
        return (core, operand.space, operand.name) if isinstance(operand, Buf) else \
            ("GM", operand.tensor, operand.start, operand.size)

    for ins in instrs:
        me = (ins.core, ins.queue)
        reads = [key(ins.core, operand) for operand in ins.reads()]
        writes = [key(ins.core, operand) for operand in ins.writes()]
        needs: dict = {}
        for k in reads:
            w = last_write.get(k)
            if w and w[:2] != me:
                needs[w[:2]] = max(needs.get(w[:2], -1), w[2])
        for k in writes:
            deps = list(readers[k].items()) + ([(last_write[k][:2], last_write[k][2])] if k in last_write else [])
            for q, pos in deps:
                if q != me:
                    needs[q] = max(needs.get(q, -1), pos)
        for src, pos in sorted(needs.items()):
            if synced.get((src, me), -1) >= pos:
                continue
            event = events[(src, me)] % EVENTS
            events[(src, me)] += 1
            out.append(SetFlag(src[0], src[1], dst_core=me[0], dst_queue=me[1], event=event))
            out.append(WaitFlag(me[0], me[1], src_core=src[0], src_queue=src[1], event=event))
            synced[(src, me)] = position[src] - 1
        out.append(ins)
        pos = position[me]
        position[me] += 1
        for k in reads:
            readers[k][me] = pos
        for k in writes:
            last_write[k] = (*me, pos)
            readers[k] = {}
    return out


def _products(instrs: list, core: str, l0: tuple, slot, shape: tuple, blocks: list, acc: Buf,
              fresh: bool = True) -> None:
    """acc (+)= the sum over `blocks` ((left buffer, at, right buffer, at, depth), ...) of left @ right,
    each block loaded into the L0A and L0B slots `l0` = (slots of A, slots of B) that `slot()` gives in
    turn; the first block starts from zero when `fresh`."""
    for q, (lsrc, lat, rsrc, rat, depth) in enumerate(blocks):
        s = slot()
        la, lb = _view(l0[0][s], (shape[0], depth)), _view(l0[1][s], (depth, shape[1]))
        instrs.append(LoadL0(core, "MTE1", src=lsrc, dst=la, at=lat))
        instrs.append(LoadL0(core, "MTE1", src=rsrc, dst=lb, at=rat))
        instrs.append(Mmad(core, "cube", a=la, b=lb, c=acc, accumulate=q > 0 or not fresh))


def _gm_shape(shape3: tuple, layout: str) -> tuple:
    """The GM tensor that holds a [batch, rows, columns] matrix in `layout` (superopt/core/formats.py)."""
    if layout == "ND":
        return shape3
    if not FORMATS[layout].fills_blocks(shape3[1:]):
        raise CodegenError(f"gemm: a {layout} operand is a padded matrix, not {shape3[1:]}")
    return (shape3[0],) + packed_shape(layout, shape3[1:])


def _gm_window(tensor: str, layout: str, start: tuple, size: tuple) -> Gm:
    """A (batch, row, column) window of a GM matrix; in a packed layout, the same window as whole fractals
    of the packed tensor [batch, ..., 16, 16]."""
    if layout == "ND":
        return Gm(tensor, start, size)
    f = FORMATS[layout]
    first, count = [0, 0, 0, 0], [FRACTAL] * 4
    for axis, at, n in ((f.outer_axis(2, 0), start[1], size[1]), (f.outer_axis(2, 1), start[2], size[2])):
        if at % FRACTAL:
            raise CodegenError(f"gemm: a {layout} window starts inside a fractal (at {at})")
        first[axis], count[axis] = at // FRACTAL, -(-n // FRACTAL)
    return Gm(tensor, (start[0], *first), (size[0], *count))


def gemm_program(a: tuple, b: tuple, c: tuple, order: tuple, tiles: dict, target: Target,
                 relu: bool = False, layouts: tuple = ("ND", "ND", "ND"), precision: str = "fp16") -> Program:
    """C = A @ B (relu optional) tiled as the Chimera model counts it. `a`, `b`, `c` are (name, shape,
    dtype) of GM tensors: A [batch, M, K], B [K, N] or [batch, K, N], C [batch, M, N] (a leading batch
    of 1 may be left out). `order` names the loops m, n, k outermost first; `tiles` their tile sizes.
    `layouts` are the GM formats of A, B and C: ND, or the cube's own (ZZ, ZN, NZ: superopt/core/formats.py), in
    which case the shapes are those of the padded matrices they hold and tiles move as whole fractals (the
    same bytes; the conversions to and from ND that MTE1 and FixPipe do are not needed). `precision`
    is the type float32 operands are multiplied in (`cube_dtype`: "fp16", or "fp32" where the chip takes it)."""
    (an, ashape, adt), (bn_, bshape, bdt), (cn, cshape, cdt) = a, b, c
    a3, b3, c3 = _as3(ashape), _as3(bshape), _as3(cshape)
    batch, m, k = a3
    n = b3[2]
    if b3[1] != k or c3 != (batch, m, n) or b3[0] not in (1, batch):
        raise CodegenError(f"gemm: shapes {ashape} @ {bshape} -> {cshape} do not match")
    if sorted(order) != ["k", "m", "n"]:
        raise CodegenError(f"gemm: loop order {order} is not a permutation of m, n, k")
    ext = {"m": m, "n": n, "k": k}
    tile = {loop: max(1, min(int(tiles[loop]), ext[loop])) for loop in "mnk"}
    steps = {loop: math.ceil(ext[loop] / tile[loop]) for loop in "mnk"}
    tm, tn, tk = (_up(tile[x]) for x in "mnk")
    npu = target.npu
    la_, lb_, lc_ = layouts
    _check_nd(layouts, ("A", "B", "C"), target, "gemm")
    program = Program(inputs=[(an, _gm_shape(a3, la_), adt), (bn_, _gm_shape(b3, lb_), bdt)],
                      outputs=[(cn, _gm_shape(c3, lc_), cdt)])
    alloc = Allocator(program)
    cube_dt = cube_dtype(adt, check_precision(precision, target), bdt)
    acc_dt = "int32" if cube_dt == "int8" else "float32"
    depth_block = _depth_block(cube_dt)
    bm, bn, bk = min(tm, CUBE_L0_BLOCK), min(tn, CUBE_L0_BLOCK), min(tk, depth_block)
    acc_bytes = tm * tn * np.dtype(acc_dt).itemsize
    # An output tile larger than L0C cannot accumulate across k steps. With k innermost it need not: the
    # k tiles of one (m, n) step gather in L1 (the same bytes, each copied in once) and the tile is then
    # multiplied one L0C block at a time over the whole K.
    whole_k = acc_bytes > npu.l0c_bytes
    if whole_k and order[-1] != "k":
        raise CodegenError(f"gemm: the output tile {tile['m']}x{tile['n']} needs {acc_bytes} bytes of L0C "
                           f"({acc_dt}), capacity {npu.l0c_bytes} ({target.name}), and the reduction is not the "
                           f"innermost loop of order {''.join(order)}; use smaller TM or TN")
    kk = _up(k) if whole_k else tk
    a_l1 = [alloc(f"A{s}", "L1", (tm, kk), cube_dt) for s in range(1 if whole_k else 2)]
    b_l1 = [alloc(f"B{s}", "L1", (kk, tn), cube_dt) for s in range(1 if whole_k else 2)]
    if whole_k:
        bk = min(kk, depth_block)
        acc_slots = 2
        acc = [{(0, 0): alloc(f"c{s}", "L0C", (bm, bn), acc_dt)} for s in range(2)]
    else:
        acc_slots = 2 if 2 * acc_bytes <= npu.l0c_bytes else 1
        blocks = [(i, j) for i in range(0, tm, bm) for j in range(0, tn, bn)]
        acc = [{(i, j): alloc(f"c{s}_{i}_{j}", "L0C", (min(bm, tm - i), min(bn, tn - j)), acc_dt) for i, j in blocks}
               for s in range(acc_slots)]
    l0a = [alloc(f"a{s}", "L0A", (bm, bk), cube_dt) for s in range(2)]
    l0b = [alloc(f"b{s}", "L0B", (bk, bn), cube_dt) for s in range(2)]

    index_loops = {"A": "mk", "B": "kn", "C": "mn"}
    reload_at = {t: max(order.index(x) for x in loops) for t, loops in index_loops.items()}
    cores = cube_cores(target)
    instrs: list = []
    state = {c_: {"A": None, "B": None, "C": None, "at": None, "a": -1, "b": -1, "acc": -1, "l0": 0, "ks": set()}
             for c_ in cores}

    def drain(core, st):
        """Write the live output tile: final tiles plainly (with relu), partial ones added into GM."""
        if st["C"] is None:
            return
        complete = len(st["ks"]) == steps["k"]
        if relu and not complete:
            raise CodegenError("gemm: a relu after a reduction split outside the output tile needs a second pass")
        bt, mi, ni = st["at"]
        for (i, j), buf in acc[st["acc"]].items():
            size = (1, min(buf.shape[0], tile["m"] - i), min(buf.shape[1], tile["n"] - j))
            if size[1] > 0 and size[2] > 0:
                window = _gm_window(cn, lc_, (bt, mi * tile["m"] + i, ni * tile["n"] + j), size)
                instrs.append(FixPipe(core, "cube", src=buf, dst=window, relu=relu, atomic_add=not complete,
                                      layout=_packed(lc_)))

    def whole_k_tile(core, st, bt, idx):
        """The (m, n) tile from A and B rows gathered over all of K: one L0C block at a time, drained at once."""
        for i in range(0, min(tm, tile["m"]), bm):
            for j in range(0, min(tn, tile["n"]), bn):
                rows, cols = min(bm, tm - i), min(bn, tn - j)
                st["acc"] = (st["acc"] + 1) % acc_slots
                cbuf = _view(acc[st["acc"]][(0, 0)], (rows, cols))
                for z in range(0, kk, bk):
                    depth = min(bk, kk - z)
                    slot = st["l0"] = (st["l0"] + 1) % 2
                    la = _view(l0a[slot], (rows, depth))
                    lb = _view(l0b[slot], (depth, cols))
                    instrs.append(LoadL0(core, "MTE1", src=a_l1[0], dst=la, at=(i, z)))
                    instrs.append(LoadL0(core, "MTE1", src=b_l1[0], dst=lb, at=(z, j)))
                    instrs.append(Mmad(core, "cube", a=la, b=lb, c=cbuf, accumulate=z > 0))
                size = (1, min(rows, tile["m"] - i), min(cols, tile["n"] - j))
                window = _gm_window(cn, lc_, (bt, idx["m"] * tile["m"] + i, idx["n"] * tile["n"] + j), size)
                instrs.append(FixPipe(core, "cube", src=cbuf, dst=window, relu=relu, layout=_packed(lc_)))

    # Cores take turns over the loops outside the reduction (the outermost other loop when the
    # reduction is outermost): every operand is reloaded when such a loop moves anyway, so the bytes do
    # not change, and no two cores add into one tile.
    par = list(order[:order.index("k")]) or [next(x for x in order if x != "k")]
    for it in itertools.product(range(batch), *(range(steps[x]) for x in order)):
        bt, idx = it[0], dict(zip(order, it[1:]))
        turn = bt
        for x in par:
            turn = turn * steps[x] + idx[x]
        core = cores[turn % len(cores)]
        st = state[core]
        instrs.append(ScalarOp(core, "scalar", cycles=8, note="tile step"))
        keys = {t: (bt,) + tuple(idx[x] for x in order[:reload_at[t] + 1]) for t in index_loops}
        if not whole_k and keys["C"] != st["C"]:
            drain(core, st)
            st.update(C=keys["C"], at=(bt, idx["m"], idx["n"]), ks=set(), acc=(st["acc"] + 1) % acc_slots)
        k0 = idx["k"] * tile["k"]
        if keys["A"] != st["A"]:
            st["a"], st["A"] = (st["a"] + 1) % len(a_l1), keys["A"]
            window = _gm_window(an, la_, (bt if a3[0] > 1 else 0, idx["m"] * tile["m"], k0), (1, tile["m"], tile["k"]))
            instrs.append(CopyIn(core, "MTE2", src=window, dst=a_l1[st["a"]], at=(0, k0) if whole_k else (),
                                 layout=_packed(la_)))
        if keys["B"] != st["B"]:
            st["b"], st["B"] = (st["b"] + 1) % len(b_l1), keys["B"]
            window = _gm_window(bn_, lb_, (bt if b3[0] > 1 else 0, k0, idx["n"] * tile["n"]), (1, tile["k"], tile["n"]))
            instrs.append(CopyIn(core, "MTE2", src=window, dst=b_l1[st["b"]], at=(k0, 0) if whole_k else (),
                                 layout=_packed(lb_)))
        if whole_k:
            if idx["k"] == steps["k"] - 1:
                whole_k_tile(core, st, bt, idx)
            continue
        fresh = not st["ks"]          # the first reduction step of this output tile starts from zero
        st["ks"].add(idx["k"])
        for (i, j), cbuf in acc[st["acc"]].items():
            for kk in range(0, tk, bk):
                rows, cols, depth = cbuf.shape[0], cbuf.shape[1], min(bk, tk - kk)
                slot = st["l0"] = (st["l0"] + 1) % 2
                la = _view(l0a[slot], (rows, depth))
                lb = _view(l0b[slot], (depth, cols))
                instrs.append(LoadL0(core, "MTE1", src=a_l1[st["a"]], dst=la, at=(i, kk)))
                instrs.append(LoadL0(core, "MTE1", src=b_l1[st["b"]], dst=lb, at=(kk, j)))
                instrs.append(Mmad(core, "cube", a=la, b=lb, c=cbuf, accumulate=not (fresh and kk == 0)))
    for core in cores:
        drain(core, state[core])
    program.instrs = insert_flags(instrs)
    program.cores = tuple(c_ for c_ in cores if any(i.core == c_ for i in program.instrs))
    return program


def _packed(layout: str) -> str:
    """The `layout` field of a move: empty for ND."""
    return "" if layout == "ND" else layout


def _check_nd(layouts: tuple, names: tuple, target: Target, what: str) -> None:
    """A target without ND conversion on copy (`NpuSpec.nd_on_copy`: the 910) takes cube operands and
    results only in the cube's own formats."""
    plain = [n for n, lay in zip(names, layouts) if lay == "ND"]
    if plain and not target.npu.nd_on_copy:
        raise CodegenError(f"{what}: {target.name} converts no ND matrix on copy to or from the cube; "
                           f"{', '.join(plain)} must be packed (ZZ / ZN in, NZ out) by TransData first")


def chain_program(a: tuple, b: tuple, d: tuple, e: tuple, order: tuple, tiles: dict, target: Target,
                  layouts: tuple = ("ND", "ND", "ND", "ND"), precision: str = "fp16") -> Program:
    """E = (A @ B) @ D with the intermediate C never leaving the chip. `a`, `b`, `d`, `e` are (name, shape,
    dtype) of GM tensors: A [batch, M, K], B [K, L], D [L, N], E [batch, M, N] (B and D may be batched).
    `order` starts with m and l (the loops both GEMMs share); per (m, l) tile the chip takes the A rows
    and B columns over the whole K (the same bytes as one TK tile at a time: k is the first GEMM's
    innermost loop), or, where K streams (`models/npu.py:streams`: TK < K and the C tile is one L0C
    block), one K tile of each at a time in two L1 slots in turn, accumulating the C block over them;
    computes the C tile block by block in L0C and keeps it in L1 in the cube's operand
    type (fp16, or fp32 under `precision` "fp32": `cube_dtype`), then streams
    D tiles over n and adds each E tile into GM (atomic add; a plain write when one l tile covers L).
    So the bytes moved are the Chimera model's DV for these tiles, except where one l tile covers L in a
    chain of one batch entry: then each core copies B (and D, with one n tile) once and keeps it in L1
    for all its m tiles (`models/npu.py:resident`). `layouts` are the GM formats of A, B,
    D and E: ND, or the cube's own (ZZ, ZN, ZN, NZ), as in `gemm_program`."""
    (an, ashape, adt), (bname, bshape, bdt), (dname, dshape, ddt), (en, eshape, edt) = a, b, d, e
    la_, lb_, ld_, le_ = layouts
    _check_nd(layouts, ("A", "B", "D", "E"), target, "chain")
    a3, b3, d3, e3 = _as3(ashape), _as3(bshape), _as3(dshape), _as3(eshape)
    batch, m, k = a3
    l, n = b3[2], d3[2]
    if b3[1] != k or d3[1] != l or e3 != (batch, m, n) or b3[0] not in (1, batch) or d3[0] not in (1, batch):
        raise CodegenError(f"chain: shapes {ashape} @ {bshape} @ {dshape} -> {eshape} do not match")
    if set(order[:2]) != {"m", "l"} or sorted(order) != ["k", "l", "m", "n"]:
        raise CodegenError(f"chain: loop order {order} must start with m and l (the loops both GEMMs share)")
    ext = {"m": m, "n": n, "k": k, "l": l}
    tile = {x: max(1, min(int(tiles[x]), ext[x])) for x in ext}
    steps = {x: math.ceil(ext[x] / tile[x]) for x in ext}
    tm, tl, tn, kk = _up(tile["m"]), _up(tile["l"]), _up(tile["n"]), _up(k)
    program = Program(inputs=[(an, _gm_shape(a3, la_), adt), (bname, _gm_shape(b3, lb_), bdt),
                              (dname, _gm_shape(d3, ld_), ddt)], outputs=[(en, _gm_shape(e3, le_), edt)])
    alloc = Allocator(program)
    cube_dt = cube_dtype(adt, check_precision(precision, target), bdt)
    if cube_dt == "int8":
        cube_dt = "float16"         # the chain's intermediate is a float product
    blk, dblk = CUBE_L0_BLOCK, _depth_block(cube_dt)
    stream = npu_model.streams(tile["m"], tile["l"], tile["k"], k)
    depth_k = _up(tile["k"]) if stream else kk          # the K extent an L1 slot of A and B holds
    a_l1 = [alloc(f"A{s}", "L1", (tm, depth_k), cube_dt) for s in range(2 if stream else 1)]
    b_l1 = [alloc(f"B{s}", "L1", (depth_k, tl), cube_dt) for s in range(2 if stream else 1)]
    c_l1 = {(i, j): alloc(f"C_{i}_{j}", "L1", (min(blk, tm - i), min(blk, tl - j)), cube_dt)
            for i in range(0, tm, blk) for j in range(0, tl, blk)}
    d_l1 = [alloc(f"D{s}", "L1", (tl, tn), cube_dt) for s in range(2)]
    l0a = [alloc(f"a{s}", "L0A", (blk, dblk), cube_dt) for s in range(2)]
    l0b = [alloc(f"b{s}", "L0B", (dblk, blk), cube_dt) for s in range(2)]
    acc = [alloc(f"c{s}", "L0C", (blk, blk), "float32") for s in range(2)]
    cores = cube_cores(target)
    instrs: list = []
    slots = defaultdict(int)
    keep_b, keep_d = npu_model.resident(batch, steps, stream)
    holds: set = set()      # (core, "B" / "D") copied into L1 and kept there

    def nxt(core, what, count=2):
        slots[(core, what)] = (slots[(core, what)] + 1) % count
        return slots[(core, what)]

    def product(core, out_shape, depth_blocks, acc_buf, fresh=True):
        _products(instrs, core, (l0a, l0b), lambda: nxt(core, "l0"), out_shape, depth_blocks, acc_buf, fresh)

    def whole_c(core, bt, mi, li):
        """The C tile from the A rows and B columns over the whole K (B kept where it is resident), one L0C
        block at a time, each kept in L1."""
        for ki in range(steps["k"]):   # the first GEMM's k tiles, each into its place in L1
            k0 = ki * tile["k"]
            depth = min(tile["k"], k - k0)
            instrs.append(CopyIn(core, "MTE2", dst=a_l1[0], at=(0, k0), layout=_packed(la_),
                                 src=_gm_window(an, la_, (bt if a3[0] > 1 else 0, mi * tile["m"], k0),
                                                (1, tile["m"], depth))))
            if (core, "B") not in holds:
                instrs.append(CopyIn(core, "MTE2", dst=b_l1[0], at=(k0, 0), layout=_packed(lb_),
                                     src=_gm_window(bname, lb_, (bt if b3[0] > 1 else 0, k0, li * tile["l"]),
                                                    (1, depth, tile["l"]))))
        if keep_b:
            holds.add((core, "B"))
        for (i, j), cbuf in c_l1.items():
            cacc = _view(acc[nxt(core, "acc")], cbuf.shape)
            depth = [(a_l1[0], (i, z), b_l1[0], (z, j), min(dblk, kk - z)) for z in range(0, kk, dblk)]
            product(core, cbuf.shape, depth, cacc)
            instrs.append(FixPipe(core, "cube", src=cacc, dst=cbuf))

    def streamed_c(core, bt, mi, li):
        """The C tile (one L0C block) accumulated over K tiles copied into the two L1 slots in turn."""
        cbuf = c_l1[(0, 0)]
        cacc = _view(acc[nxt(core, "acc")], cbuf.shape)
        for ki in range(steps["k"]):
            s, k0 = nxt(core, "AB"), ki * tile["k"]
            depth = min(tile["k"], k - k0)
            instrs.append(CopyIn(core, "MTE2", dst=a_l1[s], layout=_packed(la_),
                                 src=_gm_window(an, la_, (bt if a3[0] > 1 else 0, mi * tile["m"], k0),
                                                (1, tile["m"], depth))))
            instrs.append(CopyIn(core, "MTE2", dst=b_l1[s], layout=_packed(lb_),
                                 src=_gm_window(bname, lb_, (bt if b3[0] > 1 else 0, k0, li * tile["l"]),
                                                (1, depth, tile["l"]))))
            blocks = [(a_l1[s], (0, z), b_l1[s], (z, 0), min(dblk, _up(depth) - z))
                      for z in range(0, _up(depth), dblk)]
            product(core, cbuf.shape, blocks, cacc, fresh=ki == 0)
        instrs.append(FixPipe(core, "cube", src=cacc, dst=cbuf))

    outer = list(order[:2])
    for it in itertools.product(range(batch), *(range(steps[x]) for x in outer)):
        bt, idx = it[0], dict(zip(outer, it[1:]))
        mi, li = idx["m"], idx["l"]
        # (m, l) tiles dealt to the cores in turn: the l tiles of one E tile may be added into it by
        # different cores (GM atomic add, in whatever order they finish: a sum's order, as in split-K)
        core = cores[((bt * steps["m"] + mi) * steps["l"] + li) % len(cores)]
        instrs.append(ScalarOp(core, "scalar", cycles=8, note="chain tile step"))
        (streamed_c if stream else whole_c)(core, bt, mi, li)
        for ni in range(steps["n"]):   # E += C @ D over n tiles
            ds = 0 if keep_d else nxt(core, "D")
            if (core, "D") not in holds:
                instrs.append(CopyIn(core, "MTE2", dst=d_l1[ds], layout=_packed(ld_),
                                     src=_gm_window(dname, ld_, (bt if d3[0] > 1 else 0, li * tile["l"],
                                                                 ni * tile["n"]), (1, tile["l"], tile["n"]))))
            if keep_d:
                holds.add((core, "D"))
            for i in range(0, tm, blk):
                for j in range(0, tn, blk):
                    rows, cols = min(blk, tm - i), min(blk, tn - j)
                    if i >= tile["m"] or j >= tile["n"]:
                        continue
                    s = nxt(core, "acc")
                    eacc = _view(acc[s], (rows, cols))
                    depth = [(c_l1[(i, z)], (0, y), d_l1[ds], (z + y, j), min(dblk, c_l1[(i, z)].shape[1] - y))
                             for z in range(0, tl, blk) for y in range(0, c_l1[(i, z)].shape[1], dblk)]
                    product(core, (rows, cols), depth, eacc)
                    size = (1, min(rows, tile["m"] - i), min(cols, tile["n"] - j))
                    window = _gm_window(en, le_, (bt, mi * tile["m"] + i, ni * tile["n"] + j), size)
                    instrs.append(FixPipe(core, "cube", src=eacc, dst=window, atomic_add=steps["l"] > 1,
                                          layout=_packed(le_)))
    program.instrs = insert_flags(instrs)
    program.cores = tuple(c_ for c_ in cores if any(i.core == c_ for i in program.instrs))
    return program


def halo_chain_program(x: tuple, w1: tuple, w2: tuple, y: tuple, kernel: tuple, padding: tuple, tiles: dict,
                       target: Target, precision: str = "fp16") -> Program:
    """Y = conv(conv1x1(X, W1), W2), a pointwise convolution then a KH x KW one of stride 1, with the
    intermediate T never leaving the chip. `x`, `w1`, `w2`, `y` are (name, shape, dtype) of GM tensors:
    X [batch, H, W, C], W1 [C, L], W2 [KH * KW * L, N] (HWIO, flattened), Y [batch, Ho, Wo, N]; `padding`
    is the second convolution's ((top, bottom), (left, right)). `tiles` are {"h": output rows per band,
    "n": output channels per tile}.

    Per band of output rows the chip copies the input rows it needs (the band and its halo of KH - 1
    rows) as one window of the padded image, Wp = Wo + KW - 1 columns wide: the parts outside the image
    are zeros, and so is T there (a 1x1 convolution of zeros), which is the second convolution's zero
    padding. T = X @ W1 over those rows goes block by block from L0C into L1. The second convolution is
    then KH x KW shifted GEMMs over T in L1 (the implicit GEMM that the cube's img2col load does): output
    position q of the band's padded grid adds T[q + dy * Wp + dx] @ W2[dy, dx] for each tap. A grid row's
    last KW - 1 positions are not output positions (their sums mix two rows) and fall outside Y when a
    block is written, as whole grid rows (or, in a grid row wider than an L0C block, parts of one). W1
    and W2 are copied once per core and kept (W2 per output-channel tile where N is split). The (batch,
    band, n) tiles are dealt to the cube cores in turn; a band's halo rows are computed by both bands.
    Where W1 holds an inf, T's padding is 0 * inf = NaN rather than 0, so an output the program makes
    +-inf may be NaN here: the numerics contract's sum edge (inf and NaN trade places where the value is
    not finite), which the NPU backend's check allows as verification does."""
    (xn, xshape, xdt), (w1n, w1shape, w1dt), (w2n, w2shape, w2dt), (yn, yshape, ydt) = x, w1, w2, y
    batch, h, w, c = xshape
    kh, kw = kernel
    (pt, pb), (pl, pr) = padding
    ho, wo = h + pt + pb - kh + 1, w + pl + pr - kw + 1
    l, n = w1shape[-1], yshape[-1]
    if tuple(w1shape) != (c, l) or tuple(w2shape) != (kh * kw * l, n) or tuple(yshape) != (batch, ho, wo, n):
        raise CodegenError(f"halo chain: shapes {xshape}, {w1shape}, {w2shape} -> {yshape} do not match a 1x1 "
                           f"then {kh}x{kw} convolution with padding {padding}")
    if min(pt, pb, pl, pr) < 0 or ho < 1 or wo < 1:
        raise CodegenError(f"halo chain: padding {padding} leaves no output of {h}x{w}")
    th, tn = max(1, min(int(tiles["h"]), ho)), max(1, min(int(tiles["n"]), n))
    steps_h, steps_n = math.ceil(ho / th), math.ceil(n / tn)
    wp, rb = wo + kw - 1, th + kh - 1            # the padded grid's width, the input rows of a band
    program = Program(inputs=[(xn, tuple(xshape), xdt), (w1n, tuple(w1shape), w1dt), (w2n, tuple(w2shape), w2dt)],
                      outputs=[(yn, tuple(yshape), ydt)])
    alloc = Allocator(program)
    cube_dt = cube_dtype(xdt, check_precision(precision, target), w1dt)
    if cube_dt == "int8":
        cube_dt = "float16"         # the intermediate is a float product
    blk, dblk = CUBE_L0_BLOCK, _depth_block(cube_dt)
    x_l1 = [alloc(f"X{s}", "L1", (rb, wp, c), cube_dt) for s in range(2)]
    t_l1 = alloc("T", "L1", (_up(rb * wp + kw - 1), l), cube_dt)    # the taps of a grid row's last block read past it
    w1_l1 = alloc("W1", "L1", (c, l), cube_dt)
    w2_l1 = alloc("W2", "L1", (kh * kw * l, tn), cube_dt)
    l0a = [alloc(f"a{s}", "L0A", (blk, dblk), cube_dt) for s in range(2)]
    l0b = [alloc(f"b{s}", "L0B", (dblk, blk), cube_dt) for s in range(2)]
    acc = [alloc(f"c{s}", "L0C", (blk, blk), "float32") for s in range(2)]
    # output blocks of the grid: whole grid rows where they fit in an L0C block, else parts of one
    rows_per_block = max(1, blk // wp)
    grid_blocks = [(r, 0, min(rows_per_block, th - r), wp) for r in range(0, th, rows_per_block)] if wp <= blk else \
        [(r, c0, 1, min(blk, wp - c0)) for r in range(th) for c0 in range(0, wp, blk)]
    cores = cube_cores(target)
    instrs: list = []
    slots: dict = defaultdict(int)
    held: dict = {}          # core -> the n tile of W2 it holds

    def nxt(core, what):
        slots[(core, what)] = (slots[(core, what)] + 1) % 2
        return slots[(core, what)]

    def product(core, shape, blocks, acc_buf):
        _products(instrs, core, (l0a, l0b), lambda: nxt(core, "l0"), shape, blocks, acc_buf)

    for turn, (bt, band, ni) in enumerate(itertools.product(range(batch), range(steps_h), range(steps_n))):
        core = cores[turn % len(cores)]
        r0, n0 = band * th, ni * tn
        cols_n = min(tn, n - n0)
        instrs.append(ScalarOp(core, "scalar", cycles=8, note="halo chain tile step"))
        if core not in held:
            instrs.append(CopyIn(core, "MTE2", src=Gm(w1n, (0, 0), (c, l)), dst=w1_l1))
        if held.get(core) != ni:
            instrs.append(CopyIn(core, "MTE2", src=Gm(w2n, (0, n0), (kh * kw * l, tn)), dst=w2_l1))
            held[core] = ni
        xb = x_l1[nxt(core, "X")]
        instrs.append(CopyIn(core, "MTE2", src=Gm(xn, (bt, r0 - pt, -pl, 0), (1, rb, wp, c)), dst=xb))
        xm = _view(xb, (rb * wp, c))
        for i in range(0, rb * wp, blk):          # T = X @ W1 over the band and its halo, into L1
            for j in range(0, l, blk):
                shape = (min(blk, rb * wp - i), min(blk, l - j))
                cacc = _view(acc[nxt(core, "acc")], shape)
                product(core, shape, [(xm, (i, z), w1_l1, (z, j), min(dblk, c - z)) for z in range(0, c, dblk)],
                        cacc)
                instrs.append(FixPipe(core, "cube", src=cacc, dst=t_l1, at=(i, j)))
        for r, c0, grid_rows, width in grid_blocks:    # Y = the taps' shifted GEMMs over T
            q0 = r * wp + c0
            for j in range(0, cols_n, blk):
                shape = (grid_rows * width, min(blk, cols_n - j))
                eacc = _view(acc[nxt(core, "acc")], shape)
                taps = [(t_l1, (q0 + dy * wp + dx, z), w2_l1, ((dy * kw + dx) * l + z, j), min(dblk, l - z))
                        for dy in range(kh) for dx in range(kw) for z in range(0, l, dblk)]
                product(core, shape, taps, eacc)
                window = Gm(yn, (bt, r0 + r, c0, n0 + j), (1, grid_rows, width, shape[1]))
                instrs.append(FixPipe(core, "cube", src=eacc, dst=window))
    program.instrs = insert_flags(instrs)
    program.cores = tuple(c_ for c_ in cores if any(i.core == c_ for i in program.instrs))
    return program
