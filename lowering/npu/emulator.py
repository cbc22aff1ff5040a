"""Executes an NPU program (`isa.Program`): numerically with numpy, or shape-only (symbolic).

Every buffer is checked against its space's capacity and alignment before anything runs. Each queue
of each core runs its instructions in order; an instruction starts when its queue is free, a WaitFlag
when its SetFlag has fired. An instruction that reads a buffer (or GM window) another queue writes, or
overwrites one another queue still reads, before the flags order them is a race, and an error: the
numbers are computed in issue order, so a program without races gives them exactly as the timed,
overlapped schedule would. Durations come from the target (`NpuSpec`): GM transfers at one core's
share of the chip's bandwidth plus a start-up latency, L1 -> L0 and L0C drains at their path widths,
the cube at one 16x16x16 fractal per cycle (16x32x16 for int8, 16x8x16 for fp32), the vector unit at one 256-byte
repeat per cycle (several passes for transcendental functions).
"""
from __future__ import annotations

import json
import math
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field

import numpy as np

from superopt.core.formats import CUBE_K_PER_CYCLE, FRACTAL, holds, pack_np, unpack_np
from superopt.core.ops import ELEMENTWISE, TRANSCENDENTAL
from superopt.core.reference import evaluate_node
from superopt.extract.target import Target
from superopt.lowering.npu.isa import (
    ALIGNMENT,
    Barrier,
    Buf,
    CopyIn,
    CopyOut,
    FixPipe,
    Gm,
    LoadL0,
    Mmad,
    Program,
    ScalarOp,
    SetFlag,
    VecOp,
    WaitFlag,
    img2col,
)



class EmulatorError(RuntimeError):
    """A program the hardware could not run as written."""


class CapacityError(EmulatorError):
    pass


class AlignmentError(EmulatorError):
    pass


class RaceError(EmulatorError):
    pass


class DeadlockError(EmulatorError):
    pass


class NumericOverflow(EmulatorError):
    """A finite value too large for the narrower type it is converted to (fp16 tops out at 65504)."""


@dataclass
class Result:
    outputs: dict                      # name -> array (None in symbolic mode)
    cycles: int                        # from the first issue to the last instruction done, over all cores
    busy: dict                         # "core.queue" -> busy cycles
    bytes_by_path: dict                # e.g. "GM->L1" -> bytes
    events: list = field(default_factory=list)   # (core, queue, name, start, end)
    clock_hz: float = 1e9
    wall_seconds: float = 0.0

    @property
    def utilisation(self) -> dict:
        return {q: (b / self.cycles if self.cycles else 0.0) for q, b in sorted(self.busy.items())}

    @property
    def queue_utilisation(self) -> dict:
        """Per queue kind, busy cycles over the cycles of the cores that used it."""
        busy, cores = defaultdict(int), defaultdict(set)
        for name, b in self.busy.items():
            core, queue = name.rsplit(".", 1)
            busy[queue] += b
            cores[queue].add(core)
        return {q: busy[q] / (self.cycles * len(cores[q])) if self.cycles else 0.0 for q in sorted(busy)}

    @property
    def gm_bytes(self) -> int:
        """Bytes moved between global memory and the chip, both ways."""
        return sum(b for path, b in self.bytes_by_path.items() if "GM" in path)

    @property
    def seconds(self) -> float:
        return self.cycles / self.clock_hz

    def summary(self) -> str:
        lines = [f"{self.cycles} cycles ({self.seconds * 1e6:.1f} us at {self.clock_hz / 1e9:.2f} GHz), "
                 f"emulated in {self.wall_seconds:.2f} s"]
        cores = len({name.rsplit(".", 1)[0] for name in self.busy})
        busiest = sorted(self.queue_utilisation.items(), key=lambda kv: -kv[1])
        lines.append(f"  utilisation ({cores} cores): " + ", ".join(f"{q} {u:.0%}" for q, u in busiest if u > 0))
        lines.append("  bytes: " + ", ".join(f"{p} {b}" for p, b in sorted(self.bytes_by_path.items())))
        return "\n".join(lines)


def check_buffers(program: Program, target: Target) -> None:
    """Capacity and alignment of every on-chip buffer; buffers of one space must not overlap."""
    npu = target.npu
    capacity = {"L1": npu.l1_bytes, "L0A": npu.l0a_bytes, "L0B": npu.l0b_bytes, "L0C": npu.l0c_bytes,
                "UB": npu.ub_bytes}
    by_space = defaultdict(list)
    for buf in program.buffers:
        if buf.space not in capacity:
            raise EmulatorError(f"buffer {buf.name!r}: unknown space {buf.space!r}")
        if buf.offset % ALIGNMENT[buf.space]:
            raise AlignmentError(f"buffer {buf.name!r} in {buf.space} at offset {buf.offset}: not "
                                 f"{ALIGNMENT[buf.space]}-byte aligned")
        end = buf.offset + buf.nbytes
        if end > capacity[buf.space]:
            raise CapacityError(f"buffer {buf.name!r} needs {buf.nbytes} bytes of {buf.space} at offset "
                                f"{buf.offset} (ends at {end}), capacity {capacity[buf.space]} bytes ({target.name})")
        by_space[buf.space].append((buf.offset, end, buf.name))
    for space, spans in by_space.items():
        spans.sort()
        for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
            if start < end:
                raise CapacityError(f"buffers {a!r} and {b!r} overlap in {space}")


class _Machine:
    def __init__(self, program: Program, target: Target, inputs: dict | None, symbolic: bool):
        self.p, self.t, self.npu, self.symbolic = program, target, target.npu, symbolic
        # Each core's share of the chip's bandwidth (a program on more cores than the cube count, the
        # 910B's vector cores, shares it among all of them).
        self.gm_bpc = target.mem_bandwidth / max(self.npu.cores, len(program.cores)) / self.npu.clock_hz
        self.gm: dict = {}
        if not symbolic:
            for name, shape, dtype in program.inputs:
                arr = np.asarray(inputs[name])
                if arr.size == math.prod(shape):   # the program may view an input with unit axes added
                    arr = arr.reshape(shape)
                if arr.shape != tuple(shape):
                    raise EmulatorError(f"input {name!r} has shape {arr.shape}, the program expects {tuple(shape)}")
                self.gm[name] = arr.astype(dtype)
            for name, shape, dtype in program.outputs + program.workspace:
                self.gm[name] = np.zeros(shape, dtype)
        self.gm_shape = {name: (tuple(shape), dtype) for name, shape, dtype in
                         program.inputs + program.outputs + program.workspace}
        self.mem: dict = {}                       # (core, buffer name) -> array
        self.free: dict = defaultdict(int)        # (core, queue) -> cycle it is free
        self.busy: dict = defaultdict(int)
        self.flags: dict = defaultdict(deque)
        self.written: dict = {}                   # key -> (end, core.queue, instr index)
        self.read: dict = defaultdict(dict)       # key -> {core.queue: (end, instr index)} of its readers
        self.bytes = defaultdict(int)
        self.events: list = []

    # ---- operands ----
    def _key(self, core: str, operand) -> tuple:
        if isinstance(operand, Buf):
            return (core, operand.space, operand.name)
        return ("GM", operand.tensor, operand.start, operand.size)

    def _inside(self, g: Gm) -> tuple:
        shape, _ = self.gm_shape[g.tensor]
        return tuple(slice(max(0, min(s, d)), max(0, min(s + n, d))) for s, n, d in zip(g.start, g.size, shape))

    @staticmethod
    def _before(g: Gm) -> tuple:
        """Per axis, how far window `g` starts before its tensor (zeros there)."""
        return tuple(max(0, -s) for s in g.start)

    def _gm_bytes(self, g: Gm) -> int:
        shape, dtype = self.gm_shape[g.tensor]
        inside = self._inside(g)
        return math.prod(max(0, sl.stop - sl.start) for sl in inside) * np.dtype(dtype).itemsize

    # ---- durations ----
    def _duration(self, ins) -> int:
        npu = self.npu
        if isinstance(ins, (CopyIn, CopyOut)):
            g = ins.src if isinstance(ins, CopyIn) else ins.dst
            return npu.dma_latency_cycles + math.ceil(self._gm_bytes(g) / self.gm_bpc)
        if isinstance(ins, LoadL0):
            return math.ceil(ins.dst.nbytes / npu.mte1_bytes_per_cycle)
        if isinstance(ins, Mmad):
            (m, k), n = ins.a.shape, ins.b.shape[1]
            kstep = CUBE_K_PER_CYCLE.get(str(ins.a.dtype), FRACTAL)
            return math.ceil(m / FRACTAL) * math.ceil(n / FRACTAL) * math.ceil(k / kstep)
        if isinstance(ins, FixPipe):
            drain = math.ceil(ins.src.nbytes / npu.fixpipe_bytes_per_cycle)
            if isinstance(ins.dst, Gm):
                return max(drain, npu.dma_latency_cycles + math.ceil(self._gm_bytes(ins.dst) / self.gm_bpc))
            return drain
        if isinstance(ins, VecOp):
            widest = max([ins.dst.nbytes] + [s.nbytes for s in ins.srcs])
            repeats = math.ceil(widest / npu.vector_bytes_per_cycle)
            passes = int(self.t.transcendental_flops) if ins.op in TRANSCENDENTAL else 1
            return repeats * passes
        if isinstance(ins, ScalarOp):
            return ins.cycles
        return 0

    def _path(self, ins) -> tuple[str, int] | None:
        if isinstance(ins, CopyIn):
            return f"GM->{ins.dst.space}", self._gm_bytes(ins.src)
        if isinstance(ins, CopyOut):
            return "UB->GM", self._gm_bytes(ins.dst)
        if isinstance(ins, LoadL0):
            return f"L1->{ins.dst.space}", ins.dst.nbytes
        if isinstance(ins, FixPipe):
            if isinstance(ins.dst, Gm):
                return "L0C->GM", self._gm_bytes(ins.dst)
            return f"L0C->{ins.dst.space}", ins.dst.nbytes
        return None

    # ---- numerics ----
    def _value(self, core: str, operand):
        if isinstance(operand, Buf):
            value = self.mem[(core, operand.name)]
            if value.shape != tuple(operand.shape) and value.size == math.prod(operand.shape):
                value = value.reshape(operand.shape)    # a view that adds or drops unit axes
            return value
        return self.gm[operand.tensor][self._inside(operand)]

    def _cast(self, value, dtype, where) -> np.ndarray:
        """`value` as `dtype`; a finite value that overflows the narrower type is an error naming the
        instruction (the hardware would saturate or give Inf silently; a program should not rely on it)."""
        value, dt = np.asarray(value), np.dtype(dtype)
        if dt.kind == "f" and value.dtype.kind == "f" and value.dtype.itemsize > dt.itemsize:
            big = np.isfinite(value) & (np.abs(value) > np.finfo(dt).max)
            if big.any():
                index, ins = self.current
                raise NumericOverflow(f"instruction #{index} ({ins.core}.{ins.queue} {type(ins).__name__}) converts "
                                      f"{int(big.sum())} finite values up to {float(np.abs(value[big]).max()):.4g} "
                                      f"to {dt.name} for {where}: they overflow (largest {np.finfo(dt).max:g})")
        if dt.kind in "iu" and value.dtype.kind == "f":
            return _saturated(value, dt)
        return value.astype(dt)

    def _store(self, core: str, dst, value, add: bool = False):
        if isinstance(dst, Buf):
            self.mem[(core, dst.name)] = self._cast(value, dst.dtype, dst).reshape(dst.shape)
            return
        inside = self._inside(dst)
        value = np.asarray(value)
        if value.size == math.prod(dst.size):
            value = value.reshape(dst.size)
        value = value.reshape((1,) * (len(dst.size) - value.ndim) + value.shape)
        part = value[tuple(slice(b, b + sl.stop - sl.start) for b, sl in zip(self._before(dst), inside))]
        target = self.gm[dst.tensor]
        target[inside] = self._cast(target[inside] + part if add else part, target.dtype, dst)

    def _execute(self, core: str, ins) -> None:
        with np.errstate(all="ignore"):   # NaN and Inf propagate silently, as on the hardware and in XLA
            self._step(core, ins)

    def _step(self, core: str, ins) -> None:
        if isinstance(ins, CopyIn):
            got = self._value(core, ins.src)
            if ins.layout:   # whole fractals of a packed tensor: the matrix they hold
                got = got.reshape(got.shape[-4:])
                got = unpack_np(got, ins.layout, holds(ins.layout, got.shape))
            size = got.shape if ins.layout else ins.src.size[len(ins.src.size) - len(ins.dst.shape):]
            got = got.reshape(got.shape[got.ndim - len(size):])   # without leading unit axes
            region = np.zeros(size, ins.dst.dtype)                           # zeros outside the tensor
            before = (0,) * len(size) if ins.layout else self._before(ins.src)[len(ins.src.size) - len(size):]
            region[tuple(slice(b, b + d) for b, d in zip(before, got.shape))] = self._cast(got, ins.dst.dtype, ins.dst)
            if ins.at:
                whole = self.mem.get((core, ins.dst.name))
                whole = np.zeros(ins.dst.shape, ins.dst.dtype) if whole is None else whole.copy()
                whole[tuple(slice(o, o + d) for o, d in zip(ins.at, size))] = region
            else:
                whole = np.zeros(ins.dst.shape, ins.dst.dtype)
                whole[tuple(slice(0, d) for d in size)] = region
            self._store(core, ins.dst, whole)
        elif isinstance(ins, LoadL0):
            rows, cols = ins.dst.shape[::-1] if ins.transpose else ins.dst.shape
            (r, c), v = ins.at, self._value(core, ins.src)
            if r + rows > v.shape[0] or c + cols > v.shape[1]:
                raise EmulatorError(f"LoadL0 reads {rows}x{cols} at {ins.at} of {ins.src}: outside the buffer")
            block = v[r:r + rows, c:c + cols]
            self._store(core, ins.dst, block.T if ins.transpose else block)
        elif isinstance(ins, Mmad):
            a = self._value(core, ins.a).astype(np.float32)
            b = self._value(core, ins.b).astype(np.float32)
            acc = np.int32 if ins.c.dtype == "int32" else np.float32
            product = (a @ b).astype(acc)
            self._store(core, ins.c, self._value(core, ins.c) + product if ins.accumulate else product)
        elif isinstance(ins, FixPipe):
            v = self._value(core, ins.src)
            if ins.relu:
                v = np.maximum(v, 0)
            dtype = ins.dst.dtype if isinstance(ins.dst, Buf) else self.gm_shape[ins.dst.tensor][1]
            if ins.layout:   # into a packed GM tensor, as whole fractals
                v = pack_np(v, ins.layout)
            if ins.at:       # a block of an L1 matrix
                whole = self.mem.get((core, ins.dst.name))
                whole = np.zeros(ins.dst.shape, ins.dst.dtype) if whole is None else whole.copy()
                if any(o + d > n for o, d, n in zip(ins.at, v.shape, whole.shape)):
                    raise EmulatorError(f"FixPipe writes {v.shape} at {ins.at} of {ins.dst}: outside the buffer")
                whole[tuple(slice(o, o + d) for o, d in zip(ins.at, v.shape))] = self._cast(v, dtype, ins.dst)
                v = whole
            # into GM, only the part inside the tensor is cast (and checked for overflow) as it is stored
            self._store(core, ins.dst, v, add=ins.atomic_add)
        elif isinstance(ins, VecOp):
            self._store(core, ins.dst, self._vector(core, ins))
        elif isinstance(ins, CopyOut):
            value = self._value(core, ins.src)
            if ins.at:   # a block of the buffer: its trailing axes from `at`, of the window's trailing sizes
                size = ins.dst.size[len(ins.dst.size) - len(ins.at):]
                if any(o + d > n for o, d, n in zip(ins.at, size, value.shape[value.ndim - len(ins.at):])):
                    raise EmulatorError(f"CopyOut reads {size} at {ins.at} of {ins.src}: outside the buffer")
                value = value[(...,) + tuple(slice(o, o + d) for o, d in zip(ins.at, size))]
            self._store(core, ins.dst, value, add=ins.atomic_add)

    def _vector(self, core: str, ins: VecOp):
        """An IR op on the operands' buffers, with the destination's shape: elementwise ops broadcast
        rank-0 or size-1 operands, reductions reduce the axes in `attrs`, data movement (transpose,
        broadcast) permutes or repeats the block."""
        srcs = [self._value(core, s) for s in ins.srcs]
        shape = tuple(ins.dst.shape)
        if ins.op == "img2col":
            return img2col(srcs[0], *ins.attrs)
        if ins.op in ELEMENTWISE:
            srcs = [np.broadcast_to(s, shape) if s.shape != shape else s for s in srcs]
        return evaluate_node(ins.op, ins.attrs, srcs, shape, ins.dst.dtype)

    # ---- the run ----
    def compute(self) -> None:
        """The instructions' numerics alone, in program order (as `run` executes them)."""
        for index, ins in enumerate(self.p.instrs):
            if not isinstance(ins, (SetFlag, WaitFlag, Barrier)):
                self.current = (index, ins)
                self._execute(ins.core, ins)

    def run(self) -> None:
        for index, ins in enumerate(self.p.instrs):
            q = (ins.core, ins.queue)
            if isinstance(ins, SetFlag):
                self.flags[(ins.core, ins.queue, ins.dst_core, ins.dst_queue, ins.event)].append(self.free[q])
                continue
            if isinstance(ins, WaitFlag):
                pending = self.flags[(ins.src_core, ins.src_queue, ins.core, ins.queue, ins.event)]
                if not pending:
                    raise DeadlockError(f"instruction #{index}: {ins.core}.{ins.queue} waits for event {ins.event} "
                                        f"from {ins.src_core}.{ins.src_queue}, which no earlier SetFlag raises")
                self.free[q] = max(self.free[q], pending.popleft())
                continue
            if isinstance(ins, Barrier):
                mine = [k for k in self.free if k[0] == ins.core]
                t = max((self.free[k] for k in mine), default=0)
                for k in mine:
                    self.free[k] = t
                continue
            start = self.free[q]
            who = f"{ins.core}.{ins.queue}"
            for operand in ins.reads():
                key = self._key(ins.core, operand)
                w = self.written.get(key)
                if w and w[1] != who and w[0] > start:
                    raise RaceError(f"instruction #{index} ({who} {type(ins).__name__}) reads {operand} at cycle "
                                    f"{start}, before instruction #{w[2]} ({w[1]}) finishes writing it at {w[0]}: "
                                    f"a flag is missing")
            for operand in ins.writes():
                key = self._key(ins.core, operand)
                w = self.written.get(key)
                users = [(until, other, i, "reading") for other, (until, i) in self.read[key].items()]
                for until, other, i, what in users + ([(*w, "writing")] if w else []):
                    if other != who and until > start:
                        raise RaceError(f"instruction #{index} ({who} {type(ins).__name__}) overwrites {operand} "
                                        f"at cycle {start} while instruction #{i} ({other}) is still "
                                        f"{what} it (until {until}): a flag is missing")
            end = start + self._duration(ins)
            self.free[q] = end
            self.busy[who] += end - start
            for operand in ins.reads():
                key = self._key(ins.core, operand)
                self.read[key][who] = (end, index)
            for operand in ins.writes():
                self.written[self._key(ins.core, operand)] = (end, who, index)
            path = self._path(ins)
            if path:
                self.bytes[path[0]] += path[1]
            self.events.append((ins.core, ins.queue, type(ins).__name__ if not isinstance(ins, VecOp) else ins.op,
                                start, end))
            if not self.symbolic:
                self.current = (index, ins)
                self._execute(ins.core, ins)


def _saturated(value: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Floats converted to the integer dtype `dt` as XLA converts them (and the hardware): toward zero,
    beyond the range to its nearest end, NaN to 0. numpy's cast leaves those to the C compiler (int32's
    smallest value for all of them on x86) and warns."""
    info = np.iinfo(dt)
    wide = np.nan_to_num(np.asarray(value, np.float64), nan=0.0)
    high, low = wide >= float(info.max), wide <= float(info.min)
    inside = np.where(high | low, 0.0, wide).astype(dt)
    return np.where(high, info.max, np.where(low, info.min, inside)).astype(dt)


def compute(program: Program, target: Target, inputs: dict) -> dict:
    """`program`'s outputs on `inputs`, without `emulate`'s timing, race and deadlock bookkeeping: those
    depend on the program, not on its data, so a program `emulate` has run once (symbolically, as an
    estimate does) computes the same outputs here, in the same order, faster. Buffer capacity and overflow
    on conversion are checked as there."""
    m = _machine(program, target, inputs, symbolic=False)
    m.compute()
    return {name: m.gm[name] for name, _, _ in program.outputs}


def _machine(program: Program, target: Target, inputs: dict | None, symbolic: bool) -> _Machine:
    """A machine loaded with `program` once its target and buffers check out."""
    if target.npu is None:
        raise EmulatorError(f"target {target.name!r} is not an NPU; the emulator runs npu-910 and npu-910b")
    check_buffers(program, target)
    return _Machine(program, target, inputs, symbolic)


def emulate(program: Program, target: Target, inputs: dict | None = None, symbolic: bool = False,
            trace: bool = True) -> Result:
    """Run `program` on `target` (an npu target); `inputs` maps GM input names to arrays (not needed when
    `symbolic`). Raises CapacityError / AlignmentError before running, RaceError / DeadlockError while."""
    start = time.perf_counter()
    m = _machine(program, target, inputs, symbolic)
    m.run()
    cycles = max(m.free.values(), default=0)
    outputs = {name: (None if symbolic else m.gm[name]) for name, _, _ in program.outputs}
    return Result(outputs, cycles, dict(m.busy), dict(m.bytes), m.events if trace else [], target.npu.clock_hz,
                  time.perf_counter() - start)


def chrome_trace(result: Result) -> dict:
    """The timeline as Chrome trace-event JSON (opens in Perfetto): one track per core and queue,
    timestamps in microseconds."""
    us = 1e6 / result.clock_hz
    tracks = sorted({(core, queue) for core, queue, *_ in result.events})
    tid = {t: i for i, t in enumerate(tracks)}
    events = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": tid[t], "args": {"name": f"{t[0]}.{t[1]}"}}
              for t in tracks]
    events += [{"name": name, "ph": "X", "pid": 0, "tid": tid[(core, queue)], "ts": start * us,
                "dur": max(end - start, 0) * us} for core, queue, name, start, end in result.events]
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def write_trace(result: Result, path) -> None:
    with open(path, "w") as f:
        json.dump(chrome_trace(result), f)


COLOURS = {"CopyIn": "#4e79a7", "CopyOut": "#59a14f", "LoadL0": "#76b7b2", "Mmad": "#e15759", "FixPipe": "#f28e2b",
           "ScalarOp": "#bab0ac"}


@dataclass
class GanttLabels:
    """What `write_gantt` wrote, so a caller (or a test) can check that the chart names its kernels and
    stages without reading pixels: `inside` the texts drawn in the kernel and stage bars, `listed` the
    lines listed under the chart for the kernels and stages not named in full in their bars."""
    inside: list = field(default_factory=list)
    listed: list = field(default_factory=list)


def _fitted(text: str, room: float, width, keep: int = 0) -> str | None:
    """`text` if it is at most `room` wide, else its longest start cut at a space (and at least `keep`
    characters long) with an ellipsis that is; None when neither fits. Cutting at spaces keeps words and
    shapes whole ("1 cube matmul…", not "1 cube matmul (1,…")."""
    if width(text) <= room:
        return text
    cuts = [k for k in range(keep, len(text)) if text[k] == " "]
    fits = [k for k in cuts if width(text[:k].rstrip() + "…") <= room]
    return text[:max(fits)].rstrip() + "…" if fits else None


def write_gantt(events: list, path, clock_hz: float, title: str = "", cores: int = 2,
                boundaries: list | None = None, stages: list | None = None) -> GanttLabels:
    """The timeline as a PNG Gantt chart (matplotlib): one row per queue of the first `cores` cores of
    each kind (the others run the same kind of work), bars coloured by instruction (vector ops in
    purple), and vertical lines at `boundaries` (cycles where a stage ends; by default the ends of
    `stages`). `events` are (core, queue, name, start, end, ...) as in `Result.events` or `Run.events()`.

    `stages`, (start, end, kernel, stage) in cycles, add two rows on top so a reader can tell which bars
    are which kernel: a bar per kernel and a bar per stage (numbered in order), each named inside where
    the name fits (measured in the font drawn, cut at a space with an ellipsis where only a part fits).
    The kernels and stages not named in full are listed under the chart, stages by number and start."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.font_manager import FontProperties
    from matplotlib.patches import Patch
    from matplotlib.textpath import TextToPath

    def kind(core: str) -> str:
        return core.rstrip("0123456789")
    shown = {}
    for core, *_ in events:
        shown.setdefault(kind(core), set()).add(core)
    keep = {c for cs in shown.values() for c in sorted(cs, key=lambda c: int(c[len(kind(c)):] or 0))[:cores]}
    order = ["MTE2", "MTE1", "cube", "vector", "MTE3", "scalar"]
    rows = sorted({(core, queue) for core, queue, *_ in events if core in keep},
                  key=lambda r: (r[0].rstrip("0123456789"), int(r[0][len(kind(r[0])):] or 0),
                                 order.index(r[1]) if r[1] in order else 99))
    stages = [s for s in stages or () if s[1] > s[0]]
    bands = ["kernel", "stage"] if stages else []
    index = {r: i + len(bands) for i, r in enumerate(rows)}
    us = 1e6 / clock_hz
    total = max([s[1] for s in stages] + [e[4] for e in events] + [1]) * us

    # Fixed margins (inches), so the plot's width, and the room in each bar, is known before drawing.
    # Widths are of the glyphs' outlines (TextToPath), the same at any dpi.
    width, left, right, row, pad = 12.0, 1.0, 0.25, 0.3, 0.08
    inch_per_us = (width - left - right) / total
    small, mono = FontProperties(size=6.5), FontProperties(family="monospace", size=6.5)
    outline = TextToPath()

    def inches(text: str, prop=small) -> float:
        return outline.get_text_width_height_descent(text, prop, ismath=False)[0] / 72

    labels = GanttLabels()
    bars_on_top = []                           # (row, start, end, colour, text)
    kernels: list = []                         # consecutive stages of one kernel make one kernel bar
    for start, end, kernel, _ in stages:
        if kernels and kernels[-1][2] == kernel and kernels[-1][1] == start:
            kernels[-1][1] = end
        else:
            kernels.append([start, end, kernel])
    kernel_lines, stage_lines = [], []
    for k, (start, end, kernel) in enumerate(kernels):
        text = _fitted(kernel, (end - start) * us * inch_per_us - pad, inches, len(kernel.split(" ", 1)[0]))
        bars_on_top.append((0, start, end, "#c6d2e1" if k % 2 == 0 else "#dde3ec", text))
        if text != kernel:
            kernel_lines.append((end - start, f"  {kernel}"))
    for n, (start, end, kernel, stage) in enumerate(stages, 1):
        full, room = f"{n} {stage}", (end - start) * us * inch_per_us - pad
        text = _fitted(full, room, inches, len(str(n)) + 1) or _fitted(str(n), room + pad / 2, inches)
        bars_on_top.append((1, start, end, "#e2e2e2" if n % 2 else "#f2f2f2", text))
        if text != full:
            stage_lines.append((end - start, f"{n:>3} @{start * us:7.2f} us  {kernel.split(' ', 1)[0]} {stage}"))

    # The listing: kernels one a line, then stages in up to three columns; lines cut to their room. A
    # program of hundreds of stages lists its longest (the Chrome trace has them all), in order.
    per_line = int((width - left - right) / inches("0", mono)) - 1
    cols = 1 if len(stage_lines) <= 4 else 2 if len(stage_lines) <= 16 else 3

    def longest(lines: list, most: int, n: int) -> list:
        kept = sorted(sorted(range(len(lines)), key=lambda i: -lines[i][0])[:most])
        out = [t if len(t) <= n else t[:n - 1] + "…" for t in (lines[i][1] for i in kept)]
        return out + ([f"  … and {len(lines) - most} shorter"] if len(lines) > most else [])
    kernel_lines = longest(kernel_lines, 20, per_line)
    stage_lines = longest(stage_lines, 3 * 20 - 1, per_line // cols - 3)
    labels.listed = kernel_lines + stage_lines
    depth = -(-len(stage_lines) // cols)
    heads = bool(kernel_lines) + bool(stage_lines)
    gap = 0.5 if kernel_lines and stage_lines else 0      # half a line between the two lists
    line = 6.5 * 1.2 / 72                      # inches a listed line takes at linespacing 1.2
    listing = (len(kernel_lines) + depth + heads + gap) * line + (0.2 if heads else 0)
    top, bottom = 0.45, 0.42 if heads else 0.5
    plot = row * (len(rows) + len(bands)) + 0.1
    height = top + plot + bottom + listing
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes((left / width, (bottom + listing) / height, (width - left - right) / width, plot / height))

    bars: dict = {}
    for core, queue, name, start, end, *_ in events:
        if (core, queue) in index and end > start:
            colour = COLOURS.get(name, "#b07aa1")
            bars.setdefault(colour, []).append((index[(core, queue)], start * us, (end - start) * us))
    for colour, spans in bars.items():
        for y, x, w in spans:
            ax.barh(y, w, left=x, height=0.8, color=colour, linewidth=0)
    for y, start, end, colour, text in bars_on_top:
        ax.barh(y, (end - start) * us, left=start * us, height=0.8, color=colour, edgecolor="white", linewidth=0.6)
        if text:
            ax.text((start + end) / 2 * us, y, text, ha="center", va="center", fontproperties=small)
            labels.inside.append(text)
    for b in boundaries if boundaries is not None else [s[1] for s in stages[:-1]]:
        ax.axvline(b * us, color="#999999", linewidth=0.5, linestyle=":")
    ax.set_yticks(range(len(bands) + len(rows)), bands + [f"{c}.{q}" for c, q in rows], fontsize=7)
    ax.set_ylim(len(bands) + len(rows) - 0.5, -0.5)
    ax.set_xlim(0, total)
    ax.set_xlabel(f"microseconds (at {clock_hz / 1e9:.3g} GHz)", fontsize=8)
    ax.set_ylabel("core.queue", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title(title or "NPU emulator timeline", fontsize=9, loc="left")
    legend = [Patch(color=c, label=n) for n, c in COLOURS.items()] + [Patch(color="#b07aa1", label="vector op")]
    ax.legend(handles=legend, fontsize=6, loc="lower right", bbox_to_anchor=(1, 1), ncol=len(legend),
              frameon=False, borderaxespad=0.2)
    y = listing - 0.05
    if kernel_lines:
        fig.text(left / width, y / height, "\n".join(["kernels not named in full above:"] + kernel_lines),
                 fontproperties=mono, va="top", linespacing=1.2)
        y -= (len(kernel_lines) + 1 + gap) * line
    if stage_lines:
        fig.text(left / width, y / height, "stages not named in full above (number @ start):", fontproperties=mono,
                 va="top")
        for c in range(cols):
            fig.text((left + c * (width - left - right) / cols) / width, (y - line) / height,
                     "\n".join(stage_lines[c * depth:(c + 1) * depth]), fontproperties=mono, va="top",
                     linespacing=1.2)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return labels
