"""Tiling of matrix kernels: the loop nest of a kernel body, tile-size and loop-order alternatives per
target, and the data each alternative moves (the Chimera model, `models/chimera.py`).

A kernel whose body computes a matmul, a convolution (an implicit GEMM) or a GEMM chain runs as a loop
nest over tiles held on chip (shared memory on a GPU, L1 on an NPU, a core's cache on a CPU). Its
global-memory traffic is not its inputs plus its output: an operand is read again for every tile of a
loop that does not index it, unless an inner loop already forced the reload. A GEMM chain's
intermediate never leaves the chip. So the traffic depends on the tile sizes and the loop order, and
`tilings` offers alternatives generated from the analytic optimum (TM = TL = -a + sqrt(a^2 + MC),
TK = TN = a, thesis ch. 3), the neighbouring powers of two that fit the capacity and equal splits of
each extent, in every legal loop order; the extractor picks among them with the same data-movement model.
On an NPU target the alternatives are the NPU model's instead (`npu_tilings`, `models/npu.py`): ranked by
the cycles of the busiest cube core, with L0C and the core count counted, and carried out as given by
the lowering.

A row reduction behind a matmul needs whole rows of the loop it reduces (its tile is the extent),
except the softmax between the two GEMMs of attention, which can run over tiles of its row with running
maximum and sum (online softmax, the flash-attention schedule) at the price of rescaling the
accumulator once per tile.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import permutations, product

import numpy as np

from superopt.core.ir import Node

from superopt.core.ops import MATRIX_OPS, REDUCTIONS
from superopt.core.serial import register
from superopt.extract.models import npu as npu_model
from superopt.extract.models.chimera import data_movement, gemm, gemm_chain

MATRIX = MATRIX_OPS
KEEP = 4                      # alternatives offered per kernel: the best tiles of the best loop orders
SPLITS = 6                    # tile candidates that split a loop into this many equal parts or fewer


class Untileable(ValueError):
    """A body whose matrix ops do not form one matmul, one convolution or one two-GEMM chain."""


@dataclass(frozen=True)
class Nest:
    """What the data-movement model needs to know about a matrix kernel body."""
    kind: str                     # "gemm", "conv" or "chain"
    extents: tuple                # ((loop, extent), ...) per batch entry
    batch: int                    # independent repetitions of the nest (batched matmuls)
    weights: tuple                # ((tensor, bytes per element), ...) for A, B, C (chain: A, B, C, D, E)
    extra_bytes: float            # operands outside the matrix operands (bias, residual, mask): read once
    whole: frozenset              # loops a row reduction needs whole
    online: str = ""              # a loop of `whole` that online softmax may split anyway
    dtypes: tuple = ()            # ((tensor, dtype), ...) of the matrix operands and products (A, B, C; chain:
                                  # A, B, C, D, E), as they are in global memory between NPU stages
    direct: bool = True           # chain: the second GEMM reads the first's product as it is (through casts
                                  # only), so the NPU can keep it on chip (else its GEMMs run apart there)
    patches: bool = False         # chain of two convolutions (the second pointwise): A is the first's patch
                                  # matrix, which img2col writes and the input is read once per tile of it
    # kind "halo", a pointwise convolution then a KH x KW one of stride 1: ((H, W, C, L, Wo), (KH, KW),
    # ((top, bottom), (left, right)) of the second's padding); its loops are h (output rows) and n
    halo: tuple = ()

    def ops(self):
        ext = dict(self.extents)
        if self.kind == "chain":
            return gemm_chain(ext["m"], ext["n"], ext["k"], ext["l"])[:2]
        return gemm(ext["m"], ext["n"], ext["k"])[:2]

    @property
    def big_loops(self) -> tuple:
        """The loops the analytic optimum makes large (the others stay at the granule)."""
        return ("m", "l") if self.kind == "chain" else ("m", "n")


@register   # a kernel's attribute: chosen programs with tiles are cached (superopt/core/serial.py)
@dataclass(frozen=True)
class Tiling:
    """One tile-size and loop-order choice for a matrix kernel (an attribute of its e-node)."""
    order: tuple                  # loops, outermost first
    tiles: tuple                  # ((loop, tile), ...) in the nest's loop order
    online: bool                  # softmax over tiles of its row (flash attention)
    moved_bytes: float            # global-memory traffic under these tiles
    tile_bytes: int               # MU: on-chip bytes of one step's tiles
    extra_flops: float = 0.0      # online softmax: rescaling the accumulator per tile
    # NPU: a chain run as its two GEMMs apart (the product through global memory), where the NPU model
    # finds that faster: ((order, tiles), (order, tiles)) of each, `order` and `tiles` then the first's.
    parts: tuple = ()
    # NPU: the model's estimate for these tiles (`models/npu.py`, a CubeEstimate); not part of the choice's identity
    estimate: object = field(default=None, compare=False)

    def __str__(self) -> str:
        if self.parts:
            return "apart: " + "; ".join(f"order {''.join(o)}, " + " ".join(f"T{x.upper()}={v}" for x, v in t)
                                         for o, t in self.parts)
        tiles = " ".join(f"T{loop.upper()}={t}" for loop, t in self.tiles)
        return f"order {''.join(self.order)}, {tiles}" + (", online softmax" if self.online else "")


def _bytes(shape: tuple, dtype: str) -> int:
    return math.prod(shape) * (1 if dtype == "bool" else np.dtype(dtype).itemsize)


def _itemsize(node: Node) -> int:
    return _bytes((), node.dtype)


def _gemm_dims(a: Node, b: Node, out: Node) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of a numpy matmul: a rank-2 right operand folds the left's leading axes into M."""
    if len(b.shape) == 2:
        return 1, math.prod(a.shape[:-1]), out.shape[-1], a.shape[-1]
    return math.prod(out.shape[:-2]), a.shape[-2], out.shape[-1], a.shape[-1]


def cone(body: tuple, start: int, stop=None) -> set:
    """Nodes `start` is computed from, not looking past a node where `stop(i)` holds (default: a matrix op)."""
    stop = stop or (lambda i: body[i].op in MATRIX)
    seen, stack = set(), [start]
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        if not stop(i):
            stack.extend(body[i].inputs)
    return seen


@lru_cache(maxsize=65536)
def nest_of(body: tuple, ins: tuple, out: tuple) -> Nest | None:
    """The loop nest of a kernel body, None when it has no matrix op (raises Untileable when its matrix
    ops are not one matmul, one convolution or a chain of two matmuls)."""
    mats = [i for i, n in enumerate(body) if n.op in MATRIX]
    if not mats:
        return None
    if any(0 in body[j].shape for i in mats for j in (i, *body[i].inputs)):
        raise Untileable("a matrix op with an empty operand or result: nothing to tile")
    after = []                        # for each node, the matrix ops it is computed from
    for i, n in enumerate(body):
        deps = set()
        for j in n.inputs:
            deps |= after[j] | ({j} if body[j].op in MATRIX else set())
        after.append(frozenset(deps))
    out_bytes = _bytes(*out)
    first = body[mats[0]]
    if len(mats) == 1 and first.op == "conv":
        lhs, rhs = body[first.inputs[0]], body[first.inputs[1]]
        spec = dict(first.attrs[0])["dimension_numbers"]
        n = rhs.shape[spec.rhs_spec[0]]
        m, k = math.prod(first.shape) // n, math.prod(rhs.shape) // n
        kind, batch, ext = "conv", 1, {"m": m, "n": n, "k": k}
        # the input is read once per output-channel tile, not its img2col expansion
        weights = {"A": _itemsize(lhs) * math.prod(lhs.shape) / (m * k), "B": _itemsize(rhs)}
        operands = {"A": first.inputs[0], "B": first.inputs[1]}
        dtypes = {"A": lhs.dtype, "B": rhs.dtype, "C": first.dtype}
    elif len(mats) == 1:
        a, b = body[first.inputs[0]], body[first.inputs[1]]
        batch, m, n, k = _gemm_dims(a, b, first)
        kind, ext = "gemm", {"m": m, "n": n, "k": k}
        weights = {"A": _itemsize(a), "B": _itemsize(b)}
        operands = {"A": first.inputs[0], "B": first.inputs[1]}
        dtypes = {"A": a.dtype, "B": b.dtype, "C": first.dtype}
    elif len(mats) == 2 and body[mats[1]].op == first.op == "conv":
        second = body[mats[1]]
        if _strip(body, second.inputs[0], ("convert",)) != mats[0]:
            raise Untileable("a convolution reads a convolution's result through other ops: they run apart")
        x, w1, w2 = body[first.inputs[0]], body[first.inputs[1]], body[second.inputs[1]]
        if halo_pair(body, first, second):
            return _halo_nest(body, ins, out, first, second)
        if not (plain_conv(first, x.shape) and plain_conv(second, first.shape) and pointwise(second, w2.shape)):
            raise Untileable("a convolution chain fuses where both are NHWC x HWIO without dilation or groups and "
                             "the second is 1x1 with stride 1, or the first is 1x1 and the second has stride 1")
        m, k = math.prod(first.shape[:-1]), math.prod(w1.shape[:-1])
        kind, batch, ext = "chain", 1, {"m": m, "n": second.shape[-1], "k": k, "l": first.shape[-1]}
        weights = {"A": _itemsize(x) * math.prod(x.shape) / (m * k), "B": _itemsize(w1), "C": _itemsize(first),
                   "D": _itemsize(w2)}
        operands = {"A": first.inputs[0], "B": first.inputs[1], "D": second.inputs[1]}
        dtypes = {"A": x.dtype, "B": w1.dtype, "C": first.dtype, "D": w2.dtype, "E": second.dtype}
        direct = True
    elif len(mats) == 2 and body[mats[1]].op == "matmul" and first.op == "matmul" \
            and mats[0] in (after[body[mats[1]].inputs[0]] | {body[mats[1]].inputs[0]}):
        second = body[mats[1]]
        a, b, d = body[first.inputs[0]], body[first.inputs[1]], body[second.inputs[1]]
        batch1, m, l, k = _gemm_dims(a, b, first)
        batch, _, n, _ = _gemm_dims(body[second.inputs[0]], d, second)
        if batch1 != batch:
            raise Untileable("the two GEMMs of the chain have different batch shapes")
        kind, ext = "chain", {"m": m, "n": n, "k": k, "l": l}
        weights = {"A": _itemsize(a), "B": _itemsize(b), "C": _itemsize(first), "D": _itemsize(d)}
        operands = {"A": first.inputs[0], "B": first.inputs[1], "D": second.inputs[1]}
        dtypes = {"A": a.dtype, "B": b.dtype, "C": first.dtype, "D": d.dtype, "E": second.dtype}
        direct = _strip(body, second.inputs[0], ("convert",)) == mats[0]
    else:
        raise Untileable(f"{len(mats)} matrix ops that are not one chain of two matmuls or two convolutions")
    result = "E" if kind == "chain" else "C"
    rows = batch * ext["m"] * ext["n"]
    weights[result] = out_bytes / rows
    # Operands that reach the matrix ops through prologue ops are tiled with them; the rest is read once.
    tiled_loads = {body[i].attrs[0] for start in operands.values() for i in cone(body, start)
                   if body[i].op == "arg"}
    extra = sum(_bytes(*t) for k_, t in enumerate(ins) if k_ not in tiled_loads and t[0])
    whole, online = set(), ""
    direct = kind != "chain" or direct
    for i, node in enumerate(body):
        if node.op not in REDUCTIONS:
            continue
        x = node.inputs[0]
        made_of = after[x] | ({x} if body[x].op in MATRIX else set())
        if kind == "chain" and mats[1] not in made_of and mats[0] in made_of:
            whole.add("l")
            if _online_softmax(body, mats[1]):
                online = "l"
        elif made_of or not any(i in cone(body, s) for s in operands.values()):
            whole.add("n")                                   # a row of the result
        elif i in cone(body, operands["A"]):
            whole.add("k")                                   # a normalisation of the left operand's rows
        else:
            whole.add("l" if kind == "chain" else "n")
    return Nest(kind, tuple(sorted(ext.items())), batch, tuple(sorted(weights.items())), float(extra),
                frozenset(whole), online, tuple(sorted(dtypes.items())), direct, first.op == "conv" and kind == "chain")


def halo_pair(body: tuple, first: Node, second: Node) -> bool:
    """Whether convolution `second`, reading convolution `first`'s result, makes with it a pointwise
    convolution then a KH x KW one of stride 1 (both plain): a chain that runs by bands of output rows
    with the first's result and its halo on chip (kind "halo")."""
    w1, w2 = body[first.inputs[1]].shape, body[second.inputs[1]].shape
    return plain_conv(first, body[first.inputs[0]].shape) and pointwise(first, w1) \
        and plain_conv(second, first.shape) and not pointwise(second, w2) \
        and set(dict(second.attrs[0])["window_strides"]) == {1}


def _halo_nest(body: tuple, ins: tuple, out: tuple, first: Node, second: Node) -> Nest:
    """The nest of a pointwise convolution then a KH x KW one of stride 1 (kind "halo": per band of
    output rows, the first's result over the band and its halo stays on chip)."""
    x, w1, w2 = body[first.inputs[0]], body[first.inputs[1]], body[second.inputs[1]]
    batch, h, w, c = x.shape
    l, (kh, kw, _, n) = w1.shape[-1], w2.shape
    pads = tuple(tuple(p) for p in dict(second.attrs[0])["padding"])
    ho, wo = second.shape[1:3]
    weights = {"A": _itemsize(x), "B": _itemsize(w1), "C": _itemsize(first), "D": _itemsize(w2),
               "E": _bytes(*out) / (batch * ho * wo * n)}
    operands = (first.inputs[0], first.inputs[1], second.inputs[1])
    tiled = {body[i].attrs[0] for start in operands for i in cone(body, start) if body[i].op == "arg"}
    extra = sum(_bytes(*t) for k_, t in enumerate(ins) if k_ not in tiled and t[0])
    dtypes = {"A": x.dtype, "B": w1.dtype, "C": first.dtype, "D": w2.dtype, "E": second.dtype}
    return Nest("halo", (("h", ho), ("n", n)), batch, tuple(sorted(weights.items())), float(extra), frozenset(),
                "", tuple(sorted(dtypes.items())), True, False, ((h, w, c, l, wo), (kh, kw), pads))


def plain_conv(node: Node, lhs_shape: tuple) -> bool:
    """Whether convolution `node` is a 2-D NHWC x HWIO -> NHWC one without dilation or groups: the form
    img2col turns into a GEMM."""
    p = dict(node.attrs[0])
    spec = p["dimension_numbers"]
    layout = (tuple(spec.lhs_spec), tuple(spec.rhs_spec), tuple(spec.out_spec))
    return len(lhs_shape) == 4 and layout == ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2)) \
        and set(p["lhs_dilation"]) | set(p["rhs_dilation"]) == {1} and p["feature_group_count"] == 1 \
        and p["batch_group_count"] == 1


def pointwise(node: Node, rhs_shape: tuple) -> bool:
    """Whether a plain convolution is 1x1, stride 1, unpadded: a GEMM of its input's rows, no img2col."""
    p = dict(node.attrs[0])
    return tuple(rhs_shape[:2]) == (1, 1) and set(p["window_strides"]) == {1} \
        and all(tuple(pad) == (0, 0) for pad in p["padding"])


def _strip(body: tuple, i: int, ops=("convert", "stop_gradient", "broadcast", "reshape")) -> int:
    while body[i].op in ops and body[i].inputs:
        i = body[i].inputs[0]
    return i


def _online_softmax(body: tuple, second: int) -> bool:
    """Whether the left operand of the chain's second matmul is softmax(S) over the row loop: exp(S -
    max(S)) divided by its row sum (or by a per-row value it loads), with S free of reductions. Then
    (P / sum) @ V = (P @ V) / sum per row, and exp(S - m) rescales by exp(m_old - m_new) when the running
    maximum m grows: the flash-attention schedule computes the same values over tiles of the row."""
    p = body[_strip(body, body[second].inputs[0], ("convert", "reshape"))]
    if p.op != "div":
        return False
    num, den = _strip(body, p.inputs[0], ("convert",)), _strip(body, p.inputs[1])
    row_sum = body[den].op == "reduce_sum" and _strip(body, body[den].inputs[0], ("convert",)) == num
    loaded_per_row = body[den].op == "arg" and body[den].shape[-1:] == (1,)
    if not (row_sum or loaded_per_row):
        return False
    e = body[num]
    if e.op != "exp" or body[e.inputs[0]].op != "sub":
        return False
    s, m = body[e.inputs[0]].inputs
    maxes = [j for j in cone(body, m) if body[j].op in REDUCTIONS]
    return (all(body[j].op == "reduce_max" and body[j].inputs[0] == s for j in maxes) and len(maxes) == 1
            and not any(body[j].op in REDUCTIONS for j in cone(body, s)))


def legal_orders(kind: str, loops: list) -> list[tuple]:
    """Loop orders a kernel may run in. A single matmul or convolution: any (a reduction loop outside
    an output loop writes and re-reads partial sums, which the model counts). A chain: only the loops
    shared by both GEMMs, m and the second GEMM's reduction l, may enclose both; the first GEMM's
    reduction k and the second's private n stay inside, so each C tile is complete when the second GEMM
    takes it and is never recomputed (thesis ch. 3). Orders that differ only below the shared loops
    move the same data."""
    orders = list(permutations(loops))
    if kind == "chain":
        orders = [o for o in orders if set(o[:2]) == {"m", "l"}]
    return orders


def tilings(nest: Nest, capacity: int, granule: int) -> tuple[Tiling, ...]:
    """The best `KEEP` tilings of `nest` that fit `capacity` bytes, fewest bytes moved first; () if none fits."""
    return _tilings(nest, capacity, granule)


@lru_cache(maxsize=4096)
def _tilings(nest: Nest, capacity: int, granule: int) -> tuple[Tiling, ...]:
    ext, weights = dict(nest.extents), dict(nest.weights)
    ops, io = nest.ops()
    loops = [loop for loop in "mnkl" if loop in ext]
    t = -granule + math.sqrt(granule * granule + capacity / weights["B"])    # in elements of the operands
    p = 2 ** max(0, math.floor(math.log2(max(t, 1))))         # the power of two at or below the optimum
    choices = {}
    for loop in loops:
        if loop in nest.whole and loop != nest.online:
            choices[loop] = {ext[loop]}
            continue
        if loop in nest.big_loops:
            # the optimum rounded to the granule, the powers of two up to it and past it (smaller ones
            # fit beside a loop that must stay whole), and the whole extent
            ladder = [2 ** i for i in range(max(0, granule.bit_length() - 1), p.bit_length() + 1)]
            # and the extent split into 1..SPLITS equal tiles (rounded up to the granule): the tile
            # counts are integers, so 768 in four tiles of 192 can beat any power of two
            splits = [-(-math.ceil(ext[loop] / c) // granule) * granule for c in range(1, SPLITS + 1)]
            around = (max(granule, int(t) // granule * granule), *ladder, *splits, ext[loop])
        else:
            around = (granule, 2 * granule)
        choices[loop] = {min(max(1, v), ext[loop]) for v in around}
    best: dict = {}
    for order in legal_orders(nest.kind, loops):
        for sizes in product(*(sorted(choices[loop]) for loop in loops)):
            tiles = dict(zip(loops, sizes))
            dv, mu = data_movement(ops, io, list(order), ext, tiles, weights)
            if mu > capacity:
                continue
            online = bool(nest.online) and tiles[nest.online] < ext[nest.online]
            steps = math.ceil(ext["l"] / tiles["l"]) if online else 0
            extra_flops = 2.0 * nest.batch * ext["m"] * ext["n"] * steps
            key = (dv, mu, order)
            if order not in best or key < best[order][0]:
                best[order] = (key, Tiling(order, tuple(sorted(tiles.items(), key=lambda kv: loops.index(kv[0]))),
                                           online, nest.batch * dv + nest.extra_bytes, int(mu), extra_flops))
    ranked = sorted(best.values(), key=lambda kv: kv[0])
    return tuple(tiling for _, tiling in ranked[:KEEP])


def npu_tilings(nest: Nest, target) -> tuple[Tiling, ...]:
    """The best `KEEP` tilings of `nest` on an NPU target by the NPU model's cycles (`models/npu.py`: the
    busiest cube core's queues, with L1, L0A/L0B and L0C as the code generator fills them and the output
    tiles dealt to the cores), fastest first; () if none fits. A row reduction behind the cube, or an
    operand computed before it, runs as a vector stage on the NPU, so no loop need stay whole. A chain
    is also offered as its two GEMMs apart where the model finds that faster; one whose second GEMM
    does not read the first's product as it is is offered only apart."""
    return _npu_tilings(nest, target)


@lru_cache(maxsize=4096)
def _npu_tilings(nest: Nest, target) -> tuple[Tiling, ...]:
    ext, weights, dt = dict(nest.extents), dict(nest.weights), dict(nest.dtypes)
    item = npu_model._item
    cube = npu_model.cube_type(dt["A"], target, dt["B"])

    def tiling(order, tiles, est, l1):
        # the bytes the generator's copies move (a ragged last tile moves only its own rows); a
        # convolution's left operand is counted as the model for every target counts it (read once per
        # output-channel tile), not as the patch matrix img2col writes and the cube reads
        moved = est.bytes_moved
        if nest.kind == "conv" or nest.patches:
            moved = nest.batch * data_movement(*nest.ops(), list(order), ext, tiles, weights)[0]
        return Tiling(tuple(order), tuple((x, tiles[x]) for x in "mnkl" if x in tiles), False,
                      moved + nest.extra_bytes, int(l1), 0.0, (), est)

    def gemms(m, n, k, items, cube_dt):
        return npu_model.gemm_tiles(nest.batch, m, n, k, items, cube_dt, target, keep=KEEP)

    out = []
    if nest.kind == "halo":
        return _npu_halo_tilings(nest, target)
    if nest.kind in ("gemm", "conv"):
        m, n, k = ext["m"], ext["n"], ext["k"]
        # a convolution's left operand is the patch matrix img2col writes, in the cube's type
        a_item = item(cube) if nest.kind == "conv" else item(dt["A"])
        for est, order, tiles in gemms(m, n, k, (a_item, item(dt["B"]), item(dt["C"])), cube):
            l1 = npu_model.gemm_buffers(tiles["m"], tiles["n"], tiles["k"], k, cube, target)["l1_bytes"]
            out.append(tiling(order, tiles, est, l1))
        return tuple(out)
    m, n, k, l = (ext[x] for x in "mnkl")
    chain_cube = "float16" if cube == "int8" else cube      # the chain's intermediate is a float product
    a_item = item(cube) if nest.patches else item(dt["A"])  # a convolution chain reads img2col's patch matrix
    if nest.direct:
        items = (a_item,) + tuple(item(dt[x]) for x in "BDE")
        for est, order, tiles in npu_model.chain_tiles(nest.batch, m, n, k, l, items, chain_cube, target, keep=KEEP):
            l1 = npu_model.chain_buffers(tiles["m"], tiles["l"], tiles["n"], k, chain_cube, target,
                                         tiles["k"])["l1_bytes"]
            out.append(tiling(order, tiles, est, l1))
    cube2 = npu_model.cube_type(dt["C"], target, dt["D"])
    return _or_apart(out, nest, target, (nest.batch, m, l, k, (a_item, item(dt["B"]), item(dt["C"])), cube),
                     (nest.batch, m, n, l, (item(dt["C"]), item(dt["D"]), item(dt["E"])), cube2),
                     nest.batch * m * l * item(dt["C"]))


def _or_apart(fused: list, nest: Nest, target, first: tuple, second: tuple, product_bytes: float) -> tuple:
    """The best `KEEP` of `fused` (a chain's tilings with its intermediate on chip), after its two GEMMs
    apart where the NPU model finds that faster (`models/npu.py:apart`). `first` and `second` are each
    GEMM's (batch, M, N, K, bytes per element of its operands and result, cube type)."""
    best = [npu_model.gemm_tiles(b, m, n, k, items, cube, target, keep=KEEP)
            for b, m, n, k, items, cube in (first, second)]
    if not all(best):
        return tuple(fused[:KEEP])
    (e1, o1, t1), (e2, o2, t2) = best[0][0], best[1][0]
    est = npu_model.apart(e1, e2, product_bytes, target)
    if fused and est.cycles >= fused[0].estimate.cycles:
        return tuple(fused[:KEEP])
    parts = ((tuple(o1), tuple((x, t1[x]) for x in "mnk")), (tuple(o2), tuple((x, t2[x]) for x in "mnk")))
    l1 = max(npu_model.gemm_buffers(t["m"], t["n"], t["k"], gemm[3], gemm[5], target)["l1_bytes"]
             for t, gemm in ((t1, first), (t2, second)))
    apart = Tiling(tuple(o1), parts[0][1], False, est.bytes_moved + nest.extra_bytes, int(l1), 0.0, parts, est)
    return tuple([apart, *fused][:KEEP])


def _npu_halo_tilings(nest: Nest, target) -> tuple[Tiling, ...]:
    """A pointwise convolution then a KH x KW one: bands of output rows with the intermediate on chip
    (`models/npu.py:halo_tiles`, on a chip that converts ND matrices on copy), or the two convolutions
    apart (the second through img2col's patch matrix) where the model finds that faster."""
    ext, dt = dict(nest.extents), dict(nest.dtypes)
    item = npu_model._item
    image, kernel, pads = nest.halo
    h, w, c, l, wo = image
    ho, n = ext["h"], ext["n"]
    cube = npu_model.cube_type(dt["A"], target, dt["B"])
    chain_cube = "float16" if cube == "int8" else cube
    out = []
    if target.npu.nd_on_copy:
        items = tuple(item(dt[x]) for x in "ABDE")
        for est, order, tiles in npu_model.halo_tiles(nest.batch, image, kernel, pads, n, items, chain_cube, target,
                                                      keep=KEEP):
            l1 = npu_model.halo_buffers(tiles["h"], tiles["n"], image, kernel, chain_cube, target)["l1_bytes"]
            out.append(Tiling(tuple(order), tuple((x, tiles[x]) for x in order), False,
                              est.bytes_moved + nest.extra_bytes, int(l1), 0.0, (), est))
    m1, m2, k2 = nest.batch * h * w, nest.batch * ho * wo, kernel[0] * kernel[1] * l
    cube2 = npu_model.cube_type(dt["C"], target, dt["D"])
    # apart, the second convolution reads img2col's patch matrix, in the cube's type
    return _or_apart(out, nest, target, (1, m1, l, c, (item(dt["A"]), item(dt["B"]), item(dt["C"])), cube),
                     (1, m2, n, k2, (item(cube2), item(dt["D"]), item(dt["E"])), cube2), m1 * l * item(dt["C"]))
