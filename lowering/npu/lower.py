"""Lowering a whole program (`ir.Graph`) to the NPU: one or more emulator programs per kernel.

Every value outside a kernel lives in global memory under the name of its node. A kernel runs as
stages, each an `isa.Program` that reads and writes GM tensors:

- a body without a matrix op is one vector stage (`vector.py`);
- each matmul is a cube stage (`codegen.gemm_program`); a GEMM chain whose intermediate goes straight
  from the first product into the second is one cube stage (`codegen.chain_program`: the intermediate
  never leaves the chip), or its two GEMMs apart where the extractor's tiling says so (`Tiling.parts`).
  Either runs exactly the tiles the extractor chose with the NPU model (`extract/models/npu.py`: the
  busiest cube core's queues, L0C and the core count included). Where the kernel carries none for a
  product (a lone op, a fractal_matmul, the GEMMs of a chain whose product is computed on) or they
  cannot be placed, the tiles are that model's first that can be (`place_gemm`, `place_chain`: the
  function the extractor ranks tilings with, not a search on the emulator); the label says whose run;
- a matmul operand computed in the body (a normalisation before a projection, a softmax before the
  second GEMM of attention, a transposed load) and the ops after the last matmul (bias, activation,
  residual, layer norm) are vector stages that exchange data with the cube stage through GM workspace.
  That is the 910B's own path between its cube and vector cores; on the coupled 910 it is conservative
  (the hardware could also pass the tile through the UB), so the 910 figures are an upper bound;
- a convolution is an img2col stage (the patch matrix in GM) and a cube stage;
- a `fractal_matmul` (superopt/core/formats.py) is a cube stage whose operands and result stay in the cube's own
  fractal formats in GM (ZZ, ZN -> NZ), and a pack or unpack of a computed tensor is a format conversion
  on the vector unit (`transdata.py`); a pack of a constant is computed when the executable is built.

Sibling kernels (`egraph/siblings.py`: kernels of one output shape that read the same tensor, such as an
optimizer's parameter and moment updates, or the is-finite check and the squared norm of one gradient)
run as one kernel of several outputs where the emulator finds that faster: their bodies merged, a value
they compute alike (a recomputed matmul) computed once, and each shared operand loaded once per box.
Groups are chained: a member may read another (the moment updates read the clipped gradient; the rows of
a written gradient are checked and summed as they are written), which is then computed on chip, and
written only if something outside the group reads it.

Stages run one after another (each waits for the one before), so a kernel's cycles are the sum of its
stages'. A reshape is a view of its operand's GM tensor. Sub-terms of constants are computed once, when
the executable is built. An op the generator has no lowering for runs on the host (Ascend's AI CPU) and
is listed as such in `host_ops`; it costs no emulated cycles, which the report says.
"""
from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field

import numpy as np

from superopt.core import reference
from superopt.core.formats import CUBE_FORMATS, holds, packed_shape
from superopt.core.ir import Graph, Node, body_str
from superopt.core.ops import LAYOUT_OPS, REDUCTIONS, on_npu
from superopt.egraph.siblings import internal, merged_body, run_before, sibling_groups
from superopt.extract.cost import one_op_body, reduces_by_rows
from superopt.extract.models import npu as npu_model
from superopt.extract.target import Target
from superopt.extract.tiling import Tiling, cone, halo_pair, plain_conv, pointwise
from superopt.lowering import jax as jax_lowering
from superopt.lowering.npu.codegen import (
    CodegenError, chain_program, check_precision, cube_dtype, gemm_program, halo_chain_program,
)
from superopt.lowering.npu.emulator import (
    CapacityError, Result, check_buffers, chrome_trace, compute, emulate, write_gantt,
)
from superopt.lowering.npu.isa import Program
from superopt.lowering.npu.transdata import layout_program
from superopt.lowering.npu.vector import VECTOR_OPS, img2col_program, vector_program

VIEWS = on_npu("view")   # views of their operand's GM tensor


def _shared(operand: Node, reader: Node) -> bool:
    """Siblings are linked by a tensor operand they both read (a scalar costs nothing to read twice)."""
    return bool(operand.shape)


@dataclass
class Stage:
    label: str                 # what it computes, for reports and the timeline
    kernel: int                # the graph node it belongs to
    program: Program | None    # None: a host step
    host: Node | None = None   # the op a host step evaluates (inputs are (GM name, shape, dtype) in `host_inputs`:
    host_inputs: tuple = ()    # the shape the op reads, which a reshape (a view) makes differ from the GM tensor's)
    host_output: str = ""


@dataclass
class Run:
    """One execution: outputs and, per stage, the emulator's result (host steps have none)."""
    outputs: list
    results: list = field(default_factory=list)      # (stage label, Result | None)
    wall_seconds: float = 0.0

    @property
    def cycles(self) -> int:
        return sum(r.cycles for _, r in self.results if r is not None)

    @property
    def gm_bytes(self) -> int:
        return sum(r.gm_bytes for _, r in self.results if r is not None)

    def busy(self) -> dict:
        """Busy cycles per queue kind (cube, vector, MTE2, ...) over all stages and cores."""
        out: dict = {}
        for _, r in self.results:
            for name, b in (r.busy.items() if r else ()):
                q = name.rsplit(".", 1)[1]
                out[q] = out.get(q, 0) + b
        return out

    def utilisation(self, target: Target) -> dict:
        """Per queue kind, busy cycles over (total cycles x the cores that have such a queue)."""
        npu = target.npu
        cube = npu.cores
        vector = npu.cores * npu.vector_cores_per_cube if npu.separated else 0
        # a separated chip's cube cores have MTE1 and the cube, its vector cores the vector unit and MTE3,
        # and both have MTE2 and a scalar unit; a coupled core has all six
        have = {"cube": cube, "MTE1": cube, "vector": vector or cube, "MTE3": vector or cube,
                "MTE2": cube + vector, "scalar": cube + vector}
        total = self.cycles or 1
        return {q: b / (total * have.get(q, cube)) for q, b in sorted(self.busy().items())}

    def events(self) -> list:
        """Every stage's timeline, one after another: (core, queue, name, start, end, stage label)."""
        out, offset = [], 0
        for label, r in self.results:
            if r is None:
                continue
            out += [(core, queue, name, s + offset, e + offset, label) for core, queue, name, s, e in r.events]
            offset += r.cycles
        return out


def timeline_names(label: str) -> tuple[str, str]:
    """(kernel, stage) names of a stage label, short enough for the timeline's bars: the node and its body
    ("%4 add(matmul(in0, in1), in2)"), and what the stage does without the tiling details
    ("cube matmul (1,128,768)x(768,768)"); the report keeps the whole label."""
    depth, cut = 0, None
    for k, ch in enumerate(label):
        depth += (ch in "([{") - (ch in ")]}")
        if depth == 0 and label.startswith(": ", k):
            cut = k
            break
    if cut is None:     # a layout stage, "%3 pack ZZ (TransData)": the node and op, then the rest
        words = label.split(" ", 2)
        kernel, stage = " ".join(words[:2]), label
    else:
        kernel, stage = label[:cut], label[cut + 2:]
    kernel = re.sub(r"^(\S+) kernel\{(.*)\}$", r"\1 \2", kernel)
    stage = re.sub(r" \((?:the extractor's tiles|tiles of the NPU model).*$", "", stage)
    stage = re.sub(r",? order [a-z]+(?: T[A-Z]+=\d+)*", "", stage).replace(" (ZZ x ZN -> NZ)", "")
    stage = re.sub(r"\((\d+(?:, \d+)+)\)", lambda m: "(" + m.group(1).replace(" ", "") + ")", stage)
    return kernel, stage


class NpuExecutable:
    """A program lowered to NPU stages; calling it runs them on the emulator (numerically)."""

    def __init__(self, graph: Graph, target: Target, siblings: bool = True, precision: str = "fp16"):
        """`siblings`: run sibling kernels as one launch where the emulator finds it faster (`_group`).
        `precision`: the type the cube multiplies float32 operands in: "fp16" (rounded, the cube's full
        rate; every NPU) or "fp32" (as they are, at the cube's fp32 rate; a ValueError naming the target
        where the chip has none, `NpuSpec.cube_fp32`). fp16, bf16 and int8 operands are multiplied as they are."""
        if target.npu is None:
            raise CodegenError(f"target {target.name!r} is not an NPU; the emulator runs npu-910 and npu-910b")
        self.precision = check_precision(precision, target)
        self.graph, self.target, self.siblings = graph, target, siblings
        self.stages: list[Stage] = []
        self.tensors: dict[str, tuple] = {}       # GM name -> (shape, dtype)
        self.names: dict[int, str] = {}           # graph node -> GM name
        self.host_ops: list[str] = []
        self.preloaded: dict[str, np.ndarray] = {}
        self.groups: list[tuple] = []             # sibling kernels run as one launch (graph node ids)
        self.last: Run | None = None
        self._build()

    # ---- building ----
    def _tensor(self, name: str, shape, dtype) -> str:
        self.tensors[name] = (tuple(shape), dtype)
        return name

    def _build(self) -> None:
        g = self.graph
        constant = g.constant_nodes()
        hoisted = [i for i in g.live() if i in constant and g.nodes[i].op not in ("lit",)]
        values = {}
        if hoisted:
            values = jax_lowering.evaluate(g, (), only=[i for i in g.live() if i in constant])
        for i in g.live():     # arguments and constants are in GM from the start
            node = g.nodes[i]
            if node.op == "arg":
                self.names[i] = self._tensor(f"arg{node.attrs[0]}", node.shape, node.dtype)
            elif node.op == "lit" or i in constant:
                name = self.names[i] = self._tensor(f"t{i}", node.shape, node.dtype)
                value = values[i] if i in values else np.asarray(node.attrs[0])
                self.preloaded[name] = np.asarray(value).astype(node.dtype).reshape(node.shape)
        groups = sibling_groups(g, constant, self._groupable, _shared, chained=True) if self.siblings else []
        before = run_before(g, groups, constant)
        member = {i for grps in before.values() for grp in grps for i in grp}
        for i in g.live():
            node = g.nodes[i]
            for group in before.get(i, ()):
                for k in group:
                    self.names[k] = self._tensor(f"t{k}", g.nodes[k].shape, g.nodes[k].dtype)
                self._group(group)
            if node.op in ("arg", "lit") or i in constant:
                continue
            if node.op in VIEWS or (node.op in LAYOUT_OPS and node.attrs[0] == "ND"):
                self.names[i] = self.names[node.inputs[0]]
            elif i not in member:      # a member ran with its group
                self.names[i] = self._tensor(f"t{i}", node.shape, node.dtype)
                self._node(i, node)

    def _body(self, i: int) -> tuple[tuple, Tiling | None]:
        """(body, tiling) of node i: a kernel's own, or the kernel of one op."""
        g = self.graph
        node = g.nodes[i]
        if node.op == "kernel":
            return node.attrs[0], (node.attrs[1] if len(node.attrs) > 1 else None)
        ins = [(g.nodes[j].shape, g.nodes[j].dtype) for j in node.inputs]
        return one_op_body(node.op, node.attrs, ins, (node.shape, node.dtype)), None

    def _groupable(self, node: Node) -> bool:
        """A sibling-group member: a non-scalar kernel of vector ops and matmuls, or one such op (a
        reduction over several axes runs as two stages, `_reduce_by_rows`, and stays apart)."""
        if not node.shape:
            return False
        if node.op == "kernel":
            return all(n.op in VECTOR_OPS or n.op == "matmul" for n in node.attrs[0])
        if node.op in REDUCTIONS:
            return not (len(node.attrs[0]) > 1 and len(self.graph.nodes[node.inputs[0]].shape) - 1 in node.attrs[0])
        return node.op in VECTOR_OPS and node.op not in ("arg", "reshape")

    def _group(self, group: list[int]) -> None:
        """Sibling kernels (`egraph/siblings.py`) as one kernel of several outputs: their merged body, with
        the values they compute alike (a recomputed matmul, an unscale) computed once, and each shared
        operand loaded once per box. Kept when the emulator finds it faster than the members apart. A
        chained group whose first member (a producer the others read) does not lower with them, or not
        faster, runs that member apart and the rest as one launch, if that is faster."""
        g = self.graph
        start = len(self.stages)
        for i in group:
            self._node(i, g.nodes[i])
        apart = self.stages[start:]
        if any(stage.program is None for stage in apart):
            return

        def cycles(stages: list) -> int:
            return sum(emulate(s.program, self.target, symbolic=True, trace=False).cycles for s in stages)
        tries = [group]
        if len(group) > 2 and any(group[0] in g.nodes[i].inputs for i in group[1:]):
            tries.append(group[1:])
        for members in tries:
            on_chip = internal(g, members)      # read by members only: computed for them, never written
            if len(members) - len(on_chip) < 2:
                continue
            together = self._together(members, on_chip)
            alone = [s for s in apart if s.kernel in members]
            if together is not None and cycles(together) < cycles(alone):
                self.stages[start:] = [s for s in apart if s.kernel not in members] + together
                self.groups.append(tuple(members))
                return

    def _together(self, group: list[int], on_chip: list[int]) -> list[Stage] | None:
        """The stages of `group` merged into one kernel writing the members not in `on_chip`; None when
        the merged body does not lower."""
        g = self.graph
        own = {i: self._body(i) for i in group}
        body, roots, loads = merged_body(g, group, lambda i: own[i][0], share=True)
        tilings = {tiling for b, tiling in own.values() if any(n.op == "matmul" for n in b)}
        tiling = tilings.pop() if len(tilings) == 1 and sum(n.op == "matmul" for n in body) == 1 else None
        ins = [(self.names[j], g.nodes[j].shape, g.nodes[j].dtype) for j in loads]
        written = [k for k, i in enumerate(group) if i not in on_chip]
        roots = tuple(roots[k] for k in written)
        outs = [(self.names[group[k]], g.nodes[group[k]].shape, g.nodes[group[k]].dtype) for k in written]
        label = f"{'+'.join(f'%{i}' for i in group)} siblings"
        try:   # workspace names of their own: the members' stages above declared theirs
            return KernelLowering(body, ins, outs, tiling, self.target, group[-1], label,
                                  lambda name, shape, dtype: self._tensor(f"s{name}", shape, dtype), roots,
                                  precision=self.precision).stages()
        except CodegenError:
            return None

    def _node(self, i: int, node: Node) -> None:
        g = self.graph
        ins = [(self.names[j], g.nodes[j].shape, g.nodes[j].dtype) for j in node.inputs]
        out = (self.names[i], node.shape, node.dtype)
        body, tiling = self._body(i)
        label = f"%{i} kernel{{{body_str(body)}}}" if node.op == "kernel" else f"%{i} {node.op}"
        try:
            if node.op in LAYOUT_OPS:
                program = layout_program(ins[0], out, node.attrs[0], node.op == "pack", self.target)
                self.stages.append(Stage(f"%{i} {node.op} {node.attrs[0]} (TransData)", i, program))
            elif node.op == "fractal_matmul":
                self.stages.append(fractal_stage(ins, out, self.target, i, self.precision))
            elif reduces_by_rows(node.op, node.attrs, ins[0][1]):
                self._reduce_by_rows(i, node, ins[0], out)
            else:
                self.stages += KernelLowering(body, ins, out, tiling, self.target, i, label, self._tensor,
                                              precision=self.precision).stages()
        except CodegenError as exc:
            if node.op == "kernel":
                raise CodegenError(f"{label}: {exc}") from exc
            name = g.opaque[node.attrs[0]].name if node.op == "opaque" else node.op
            self.host_ops.append(f"{name} ({exc})" if node.op != "opaque" else f"{name} (a primitive superopt "
                                                                               f"does not model)")
            self.stages.append(Stage(f"%{i} {name} on the host", i, None, host=node,
                                     host_inputs=tuple(ins), host_output=out[0]))

    def _reduce_by_rows(self, i: int, node: Node, x: tuple, out: tuple) -> None:
        """A reduction over several axes, the last among them, as two vector stages: the rows (whose
        inputs stream through the UB a box at a time), then the rest over the row results. One stage
        would need every reduced axis in the UB at once."""
        name, shape, dtype = x
        last = len(shape) - 1
        rows = (self._tensor(f"t{i}_rows", shape[:-1], node.dtype), shape[:-1], node.dtype)
        rest = tuple(a for a in node.attrs[0] if a != last)
        for ins, result, axes in (([x], rows, (last,)), ([rows], out, rest)):
            body = one_op_body(node.op, (axes,), [(s, d) for _, s, d in ins], (result[1], result[2]))
            label = f"%{i} {node.op}[{','.join(map(str, axes))}]"
            self.stages += KernelLowering(body, ins, result, None, self.target, i, label, self._tensor,
                                          precision=self.precision).stages()

    # ---- running ----
    def run(self, *flat_args, symbolic: bool = False, trace: bool = True, timed: bool = True) -> Run:
        """Every stage on the emulator (`symbolic`: without data, for the cycles). `timed=False` computes the
        outputs alone (`emulator.compute`): the run has no stage results and is not the executable's `last`."""
        start = time.perf_counter()
        gm: dict = dict(self.preloaded)
        if not symbolic:
            for i in self.graph.live():
                node = self.graph.nodes[i]
                if node.op == "arg":
                    gm[self.names[i]] = np.asarray(flat_args[node.attrs[0]]).astype(node.dtype).reshape(node.shape)
        run = Run([])
        for stage in self.stages:
            if stage.program is None:
                run.results.append((stage.label, None))
                if not symbolic:
                    gm[stage.host_output] = self._host(stage, gm)
                continue
            inputs = None if symbolic else {n: gm[n] for n, _, _ in stage.program.inputs}
            if timed:
                result = emulate(stage.program, self.target, inputs, symbolic=symbolic, trace=trace)
                run.results.append((stage.label, result))
                outputs = result.outputs
            else:
                outputs = compute(stage.program, self.target, inputs)
            if not symbolic:
                for name, arr in outputs.items():
                    shape, _ = self.tensors[name]
                    gm[name] = arr.reshape(shape)
        if not symbolic:
            run.outputs = [gm[self.names[o]].reshape(self.graph.nodes[o].shape) for o in self.graph.results]
        run.wall_seconds = time.perf_counter() - start
        if timed:
            self.last = run
        return run

    def _host(self, stage: Stage, gm: dict) -> np.ndarray:
        node = stage.host
        args = [Node("arg", (), (k,), shape, dtype) for k, (_, shape, dtype) in enumerate(stage.host_inputs)]
        sub = Graph(nodes=args + [Node(node.op, tuple(range(len(args))), node.attrs, node.shape, node.dtype)],
                    outputs=[len(args)], consts=self.graph.consts, opaque=self.graph.opaque)
        ins = [gm[n].reshape(shape) for n, shape, _ in stage.host_inputs]
        return np.asarray(jax_lowering.evaluate(sub, ins)[len(args)])

    def write_timeline(self, run: Run, path: str):
        """The run's timeline (it must have been traced): Chrome-trace JSON when `path` ends in .json (opens
        in Perfetto), else a PNG Gantt chart with dotted lines between stages and rows naming the kernels
        and stages (`write_gantt`); for the PNG, the `GanttLabels` it wrote."""
        events = run.events()
        if path.endswith(".json"):
            whole = Result({}, run.cycles, {}, {}, [e[:5] for e in events], self.target.npu.clock_hz)
            with open(path, "w") as f:
                json.dump(chrome_trace(whole), f)
            return None
        spans, total = [], 0
        for label, r in run.results:
            if r is not None:
                spans.append((total, total + r.cycles, *timeline_names(label)))
                total += r.cycles
        return write_gantt(events, path, self.target.npu.clock_hz, stages=spans,
                           title=f"{self.target.name}: {run.cycles} cycles in {len(spans)} stages")

    def describe(self, run: Run, cycles_before: int | None = None) -> list[str]:
        """Report lines: cycles, utilisation and bytes of a run, and its costliest stages."""
        t = self.target
        us = run.cycles / t.npu.clock_hz * 1e6
        head = f"  npu emulator : {run.cycles} cycles ({us:.1f} us at {t.npu.clock_hz / 1e9:.2g} GHz) in " \
               f"{len(self.stages)} stages, GM {run.gm_bytes / 1e6:.2f} MB"
        if self.groups:
            head += f"; {sum(map(len, self.groups))} kernels as {len(self.groups)} sibling launches"
        if cycles_before:
            head += f"; original program {cycles_before} cycles ({cycles_before / max(run.cycles, 1):.2f}x)"
        util = ", ".join(f"{q} {u:.0%}" for q, u in sorted(run.utilisation(t).items(), key=lambda kv: -kv[1])
                         if u >= 0.005)
        lines = [head, f"    utilisation: {util or 'none'}"]
        if self.host_ops:
            lines.append(f"    on the host (not counted): {', '.join(self.host_ops)}")
        ranked = sorted(((r.cycles, label) for label, r in run.results if r is not None), reverse=True)
        for cycles, label in ranked[:5]:
            lines.append(f"    {cycles:>9} cycles  {label if len(label) <= 100 else label[:97] + '...'}")
        return lines

    def __call__(self, *flat_args) -> list:
        return self.run(*flat_args).outputs

    def outputs(self, *flat_args) -> list:
        """The outputs alone, without the cycles (`run(timed=False)`): for checks on inputs nobody asked the
        cycles of, once `estimate` has run the program's timing and race checks."""
        return self.run(*flat_args, timed=False).outputs

    def estimate(self) -> Run:
        """Cycles, bytes and utilisation without data (symbolic mode)."""
        return self.run(symbolic=True, trace=False)


class KernelLowering:
    """The stages of one kernel body (module doc)."""

    def __init__(self, body: tuple, ins: list, out, tiling: Tiling | None, target: Target, node: int,
                 label: str, declare, roots: tuple | None = None, precision: str = "fp16"):
        """`out` is the GM tensor of the body's last value; with `roots` (sibling kernels merged into one
        body, `egraph/siblings.py`), a list of GM tensors, one per root. `precision` as `NpuExecutable`'s."""
        self.precision = precision
        self.roots = (len(body) - 1,) if roots is None else tuple(roots)
        self.outs = [out] if roots is None else list(out)
        self.body, self.ins, self.tiling, self.target = body, ins, tiling, target
        self.node, self.label, self.declare = node, label, declare
        self.gm: dict[int, tuple] = {}    # body node -> (GM name, shape, dtype) once it is in GM
        for i, n in enumerate(body):
            if n.op == "arg":
                self.gm[i] = ins[n.attrs[0]]
        self.result: list[Stage] = []

    def stages(self) -> list[Stage]:
        body = self.body
        mats = [i for i, n in enumerate(body) if n.op in ("matmul", "conv")]
        chain = self._chain(mats)
        done = set()
        for m in mats:
            if m in done:
                continue
            if chain and m == chain[0]:
                self._chain_stage(*chain, final=self._final(chain[1]))
                done.update(chain)
            else:
                self._matrix_stage(m, final=self._final(m), tiles=self._extractor_tiles(m, mats))
                done.add(m)
        left = [(r, out) for r, out in zip(self.roots, self.outs) if r not in self.gm or self.gm[r][0] != out[0]]
        if left:
            copy = all(body[r].op == "arg" for r, _ in left)
            self._vector_stage([r for r, _ in left], [out for _, out in left],
                               "copy" if copy else ("epilogue" if mats else "vector"))
        return self.result

    # ---- pieces ----
    def _workspace(self, i: int, what: str) -> tuple:
        name = f"k{self.node}_{what}{i}"
        return (self.declare(name, self.body[i].shape, self.body[i].dtype), self.body[i].shape, self.body[i].dtype)

    def _in_gm(self, i: int, what: str) -> tuple:
        """Body value i in global memory: a loaded tensor (through views), or a vector stage's output."""
        if i in self.gm:
            return self.gm[i]
        node = self.body[i]
        if node.op in VIEWS and node.inputs[0] in self.gm:
            return self.gm[node.inputs[0]]
        self._vector_stage([i], [self._workspace(i, what)], what)
        return self.gm[i]

    def _vector_stage(self, roots: list, outs: list, what: str) -> None:
        """A vector program computing body values `roots` (one, or siblings of one shape) into `outs` from
        the values already in GM."""
        sub, ins, index = [], [], {}
        needed = set().union(*(cone(self.body, r, stop=lambda j: j in self.gm) for r in roots))
        # topological; a root is never in GM itself unless it is a loaded input
        for j in sorted(needed):
            n = self.body[j]
            if j in self.gm or (j in roots and n.op == "arg"):   # a root in GM already is copied
                name = self.gm[j]
                if name not in ins:
                    ins.append(name)
                index[j] = len(sub)
                sub.append(Node("arg", (), (ins.index(name),), n.shape, n.dtype))
            else:
                index[j] = len(sub)
                sub.append(Node(n.op, tuple(index[k] for k in n.inputs), n.attrs, n.shape, n.dtype))
        sub_roots = tuple(index[r] for r in roots)
        if len(roots) == 1:
            program = vector_program(tuple(sub), ins, outs[0], self.target)
            text = body_str(tuple(sub))
        else:
            program = vector_program(tuple(sub), ins, list(outs), self.target, roots=sub_roots)
            text = " | ".join(body_str(tuple(sub[:r + 1])) for r in sub_roots)
        self.result.append(Stage(f"{self.label}: {what} {text}", self.node, program))
        for r, out in zip(roots, outs):
            self.gm[r] = out

    def _chain(self, mats: list) -> tuple | None:
        """(first, second) when the second matmul's left operand is the first's product itself, or the
        second convolution (a pointwise one) reads the first's result."""
        if len(mats) != 2 or len({self.body[m].op for m in mats}) != 1:
            return None
        first, second = mats
        node = self.body[second]
        halo = node.op == "conv" and halo_pair(self.body, self.body[first], node)
        if node.op == "conv" and not halo and not (plain_conv(node, self.body[first].shape)
                                                   and pointwise(node, self.body[node.inputs[1]].shape)):
            return None
        left = self.body[second].inputs[0]
        while self.body[left].op == "convert" and left != first:
            left = self.body[left].inputs[0]
        t = self.tiling
        if left != first or t is None or t.parts or set(t.order[:2]) != ({"h", "n"} if halo else {"m", "l"}):
            return None      # the extractor's tiles run the chain's GEMMs apart (`_extractor_tiles`)
        return first, second

    @staticmethod
    def _gemm_views(a: Node, b: Node, c: Node) -> tuple:
        if len(b.shape) == 2:
            m = math.prod(a.shape[:-1])
            return (1, m, a.shape[-1]), tuple(b.shape), (1, m, b.shape[-1])
        batch = math.prod(c.shape[:-2])
        return (batch,) + tuple(a.shape[-2:]), (batch,) + tuple(b.shape[-2:]), (batch,) + tuple(c.shape[-2:])

    def _extractor_tiles(self, m: int, mats: list) -> tuple | None:
        """(order, tiles) the extractor chose for matrix op `m`: its tiling when it is a lone GEMM's (m, n,
        k), or this GEMM's part when the tiling runs a chain's two GEMMs apart; None when the kernel
        carries none for it."""
        t = self.tiling
        if t is None or t.online:
            return None
        if t.parts and len(mats) == len(t.parts):
            order, tiles = t.parts[mats.index(m)]
            return tuple(order), dict(tiles)
        if set(t.order) == {"m", "n", "k"}:
            return tuple(t.order), dict(t.tiles)
        return None

    def _final(self, i: int) -> tuple | None:
        """The output a product is written to straight from the cube: its own, when it is a root that no
        other body value reads (else it goes to GM workspace for the vector stages)."""
        if i in self.roots and not any(i in n.inputs for n in self.body):
            return self.outs[self.roots.index(i)]
        return None

    def _matrix_stage(self, m: int, final: tuple | None, tiles: tuple | None = None) -> None:
        """Matrix op `m` as a cube stage on `tiles` (the extractor's (order, tiles); `place_gemm`)."""
        node = self.body[m]
        a = self._in_gm(node.inputs[0], "lhs")
        b = self._in_gm(node.inputs[1], "rhs")
        c = final or self._workspace(m, "mm")
        if node.op == "conv":
            a, av, bv, cv = self._img2col(m, a)
        else:
            av, bv, cv = self._gemm_views(self.body[node.inputs[0]], self.body[node.inputs[1]], node)
        layouts = ("ND", "ND", "ND")
        nd_c, ncv = c, cv
        if not self.target.npu.nd_on_copy:
            (a, av), (b, bv) = self._pack(a, av, "ZZ", m, "lhs"), self._pack(b, bv, "ZN", m, "rhs")
            c, cv = self._packed_result(m, av, bv, c[2])
            layouts = CUBE_FORMATS
        whose, order, tiles, program = place_gemm(a, b, c, (av, bv, cv), self.target, tiles, layouts=layouts,
                                                  precision=self.precision)
        tiles_str = " ".join(f"T{x.upper()}={tiles[x]}" for x in order)
        on = " on fractals (ZZ x ZN -> NZ)" if layouts == CUBE_FORMATS else ""
        self.result.append(Stage(f"{self.label}: cube matmul {av}x{bv}{on} order {''.join(order)} {tiles_str}"
                                 f" ({whose})", self.node, program))
        if layouts == CUBE_FORMATS:
            self._unpack(c, nd_c, ncv)
        self.gm[m] = nd_c

    # ---- cube operands on a target without ND conversion on copy (the 910) ----
    def _pack(self, x: tuple, view: tuple, fmt: str, m: int, what: str) -> tuple:
        """(GM tensor, [batch, rows, columns] view) of matrix `x` (a view `view` of its GM tensor) packed
        into `fmt` by a TransData stage on the vector unit; the view is of the padded matrix it holds."""
        name, _, dtype = x
        view = tuple(view) if len(view) == 3 else (1,) + tuple(view)
        logical = _matrix(view)
        packed = packed_shape(fmt, logical)
        dst = (self.declare(f"k{self.node}_{fmt}{what}{m}", packed, dtype), packed, dtype)
        self.result.append(Stage(f"{self.label}: pack {what} {fmt} (TransData)", self.node,
                                 layout_program((name, logical, dtype), dst, fmt, True, self.target)))
        return dst, (view[0],) + holds(fmt, packed[-4:])

    def _packed_result(self, m: int, av: tuple, bv: tuple, dtype: str) -> tuple:
        """A GM workspace for the product of packed operands (NZ), and its [batch, rows, columns] view."""
        view = (av[0], av[1], bv[-1])
        packed = packed_shape("NZ", _matrix(view))
        return (self.declare(f"k{self.node}_NZmm{m}", packed, dtype), packed, dtype), view

    def _unpack(self, packed: tuple, nd: tuple, view: tuple) -> None:
        """`nd` (a view `view` of its GM tensor) = unpack(`packed`, NZ), a TransData stage."""
        self.result.append(Stage(f"{self.label}: unpack result NZ (TransData)", self.node,
                                 layout_program(packed, (nd[0], _matrix(view), nd[2]), "NZ", False, self.target)))

    def _img2col(self, m: int, lhs: tuple) -> tuple:
        """A convolution as a GEMM: the img2col stage writes the patch matrix (in the cube's operand type:
        fp16, fp32 under precision "fp32", int8 for an int8 conv) to GM; the weights [KH, KW, C, O] are its
        right operand as [KH * KW * C, O], the output [N * Ho * Wo, O] is NHWC. A 1x1 convolution with
        stride 1 is already a GEMM of its input's rows: no img2col stage, the input is the left operand."""
        node, x, wt = self.body[m], self.body[self.body[m].inputs[0]], self.body[self.body[m].inputs[1]]
        p = dict(node.attrs[0])
        if not plain_conv(node, x.shape):
            raise CodegenError("convolution: the cube lowering takes 2-D NHWC x HWIO -> NHWC convolutions "
                               "without dilation or groups")
        n, h, w, c = x.shape
        kh, kw, _, o = wt.shape
        _, ho, wo, _ = node.shape
        if pointwise(node, wt.shape):
            return lhs, (1, n * h * w, c), (c, o), (1, n * h * w, o)
        cube_dt = cube_dtype(x.dtype, self.precision, wt.dtype)    # int8 convs run on the int8 cube
        cube_dt = cube_dt if cube_dt in ("int8", "float32") else "float16"
        patches = (self.declare(f"k{self.node}_img2col{m}", (n * ho * wo, kh * kw * c), cube_dt),
                   (n * ho * wo, kh * kw * c), cube_dt)
        program = img2col_program(lhs, patches, (kh, kw), tuple(p["window_strides"]), tuple(p["padding"]),
                                  (ho, wo), self.target)
        self.result.append(Stage(f"{self.label}: img2col {kh}x{kw} stride {tuple(p['window_strides'])}",
                                 self.node, program))
        return patches, (1, n * ho * wo, kh * kw * c), (kh * kw * c, o), (1, n * ho * wo, o)

    def _chain_stage(self, first: int, second: int, final: tuple | None) -> None:
        """A GEMM chain as one cube stage on the extractor's tiles (`place_chain`)."""
        if self.tiling.order[0] == "h":
            return self._halo_stage(first, second, final)
        f, s = self.body[first], self.body[second]
        a = self._in_gm(f.inputs[0], "lhs")
        b = self._in_gm(f.inputs[1], "rhs")
        d = self._in_gm(s.inputs[1], "rhs")
        e = final or self._workspace(second, "mm")
        if f.op == "conv":    # the first's patch matrix (img2col) @ its weights, then the 1x1 weights
            a, av, bv, cv = self._img2col(first, a)
            dv, ev = tuple(self.body[s.inputs[1]].shape[-2:]), cv[:2] + (s.shape[-1],)
        else:
            av, bv, _ = self._gemm_views(self.body[f.inputs[0]], self.body[f.inputs[1]], f)
            _, dv, ev = self._gemm_views(self.body[s.inputs[0]], self.body[s.inputs[1]], s)
        t = self.tiling
        layouts, nd_e, nev = ("ND",) * 4, e, ev
        if not self.target.npu.nd_on_copy:
            (a, av), (b, bv) = self._pack(a, av, "ZZ", first, "lhs"), self._pack(b, bv, "ZN", first, "rhs")
            d, dv = self._pack(d, dv, "ZN", second, "rhs")
            e, ev = self._packed_result(second, av, dv, e[2])
            layouts = ("ZZ", "ZN", "ZN", "NZ")
        whose, order, tiles, program = place_chain(
            (a[0], av, a[2]), (b[0], bv, b[2]), (d[0], dv, d[2]), (e[0], ev, e[2]), self.target,
            (t.order, dict(t.tiles)), layouts, self.precision)
        on = " on fractals" if layouts[0] != "ND" else ""
        tiles_str = " ".join(f"T{x.upper()}={tiles[x]}" for x in order)
        kernel = self.body[f.inputs[1]].shape
        what = f"convolution chain {kernel[0]}x{kernel[1]} then 1x1" if f.op == "conv" else "GEMM chain"
        self.result.append(Stage(f"{self.label}: cube {what}{on}, order {''.join(order)} {tiles_str} "
                                 f"({whose})", self.node, program))
        if layouts[0] != "ND":
            self._unpack(e, nd_e, nev)
        self.gm[second] = nd_e


    def _halo_stage(self, first: int, second: int, final: tuple | None) -> None:
        """A pointwise convolution then a KH x KW one of stride 1 as one cube stage, by bands of output rows
        with the first's result over each band and its halo on chip (`place_halo`)."""
        f, s = self.body[first], self.body[second]
        x = self._in_gm(f.inputs[0], "lhs")
        w1, w2 = self._in_gm(f.inputs[1], "rhs"), self._in_gm(s.inputs[1], "rhs")
        y = final or self._workspace(second, "mm")
        kh, kw, l, n = self.body[s.inputs[1]].shape
        t = self.tiling
        whose, tiles, program = place_halo(x, (w1[0], (w1[1][-2], l), w1[2]),
                                           (w2[0], (kh * kw * l, n), w2[2]), y, (kh, kw),
                                           tuple(tuple(p) for p in dict(s.attrs[0])["padding"]), self.target,
                                           dict(t.tiles), self.precision)
        self.result.append(Stage(f"{self.label}: cube convolution chain 1x1 then {kh}x{kw}, bands of output rows "
                                 f"with their halo on chip, TH={tiles['h']} TN={tiles['n']} ({whose})",
                                 self.node, program))
        self.gm[second] = y


def place_halo(x: tuple, w1: tuple, w2: tuple, y: tuple, kernel: tuple, padding: tuple, target: Target,
               first: dict, precision: str = "fp16") -> tuple:
    """Y = conv(conv1x1(X, W1), W2) (`codegen.halo_chain_program`) on `first` (the extractor's tiles), as
    (whose, tiles, program); where they cannot be placed, the NPU model's (`models/npu.py:halo_tiles`),
    its first that can. `x`, `w1`, `w2`, `y` are GM tensors (name, shape, dtype), the weights as
    matrices [C, L] and [KH * KW * L, N]."""
    (_, (batch, h, w, c), xdt), (_, (_, _, wo, n), _) = x, y
    l = w1[1][-1]
    cube = cube_dtype(xdt, precision, w1[2])
    items = tuple(npu_model._item(t[2]) for t in (x, w1, w2, y))
    tries = [(EXTRACTORS, ("h", "n"), dict(first))]
    tries += [(MODEL, order, tiles) for _, order, tiles in npu_model.halo_tiles(
        batch, (h, w, c, l, wo), kernel, padding, n, items, "float16" if cube == "int8" else cube, target, keep=8)]

    def build(order, tiles):
        return halo_chain_program(x, w1, w2, y, kernel, padding, tiles, target, precision=precision)
    whose, _, tiles, program = _placed(tries, build, target)
    return whose, tiles, program


def _matrix(view: tuple) -> tuple:
    """The tensor a [batch, rows, columns] GEMM view packs as: the matrix alone for a batch of one."""
    return tuple(view[1:]) if view[0] == 1 else tuple(view)


EXTRACTORS = "the extractor's tiles"
MODEL = "tiles of the NPU model"


def _placed(tries: list, build, target: Target) -> tuple:
    """(whose, order, tiles, program) of the first of `tries` ((whose, order, tiles), in order) whose
    program can be placed; a CodegenError naming the first failure when none can."""
    errors = []
    for whose, order, tiles in tries:
        try:
            program = build(order, tiles)
            check_buffers(program, target)
        except (CodegenError, CapacityError) as exc:
            errors.append((whose, str(exc)))
            continue
        if errors and errors[0][0] == EXTRACTORS:
            whose = f"{whose}: the extractor's could not be placed ({errors[0][1]})"
        return whose, order, tiles, program
    raise CodegenError(f"no tiling could be placed: {errors[0][1]}" if errors else "no tiling to place")


def place_gemm(a: tuple, b: tuple, c: tuple, views: tuple, target: Target, first: tuple | None = None,
               layouts: tuple = ("ND", "ND", "ND"), precision: str = "fp16") -> tuple:
    """C = A @ B on `first` (the extractor's (order, tiles)), as (whose, order, tiles, program). Where the
    kernel carries no tiles for this product (a lone op, a fractal_matmul) or they cannot be placed,
    the tiles are the NPU model's (`extract.models.npu.gemm_tiles`, the function the extractor ranks a
    GEMM's tilings with), its first that can be placed; `whose` says which ran. `a`, `b`, `c` are GM
    tensors (name, shape, dtype), `views` their [batch, rows, columns] shapes, `layouts` their formats,
    `precision` the cube's type for float32 operands (`codegen.cube_dtype`)."""
    (av, bv, cv), tries = views, []
    batch, m, k = av
    if 0 in (batch, m, bv[-1], k):
        raise CodegenError(f"an empty matmul ({batch}x{m}x{bv[-1]}x{k}): no tiles for the cube")
    if first:
        tries.append((EXTRACTORS, tuple(first[0]), dict(first[1])))
    items = tuple(npu_model._item(x[2]) for x in (a, b, c))
    for _, order, tiles in npu_model.gemm_tiles(batch, m, bv[-1], k, items, cube_dtype(a[2], precision, b[2]),
                                                target, keep=8):
        if not first or (order, tiles) != (tries[0][1], tries[0][2]):
            tries.append((MODEL, order, tiles))

    def build(order, tiles):
        return gemm_program((a[0], av, a[2]), (b[0], bv, b[2]), (c[0], cv, c[2]), order, tiles, target,
                            layouts=layouts, precision=precision)
    return _placed(tries, build, target)


def place_chain(a: tuple, b: tuple, d: tuple, e: tuple, target: Target, first: tuple,
                layouts: tuple = ("ND",) * 4, precision: str = "fp16") -> tuple:
    """E = (A @ B) @ D on `first` (the extractor's order and tiles), as (whose, order, tiles, program);
    where they cannot be placed, the NPU model's (`extract.models.npu.chain_tiles`), its first that can.
    `a`, `b`, `d`, `e` are GM tensors (name, [batch, rows, columns] view, dtype) in `layouts`; packed
    operands take tiles of whole fractals."""
    batch, m, k = a[1]
    l, n = b[1][-1], d[1][-1]
    fractal = layouts[0] != "ND"
    cube = cube_dtype(a[2], precision, b[2])
    items = tuple(npu_model._item(x[2]) for x in (a, b, d, e))
    tries = [(EXTRACTORS, tuple(first[0]), dict(first[1]))]
    tries += [(MODEL, order, tiles) for _, order, tiles in npu_model.chain_tiles(
        batch, m, n, k, l, items, "float16" if cube == "int8" else cube, target, keep=8)]
    if fractal:      # windows of whole fractals
        tries = [(w, o, {x: -(-v // 16) * 16 for x, v in t.items()}) for w, o, t in tries]

    def build(order, tiles):
        return chain_program(a, b, d, e, order, tiles, target, layouts=layouts, precision=precision)
    return _placed(tries, build, target)


def fractal_stage(ins: list, out: tuple, target: Target, node: int, precision: str = "fp16") -> Stage:
    """A fractal_matmul as one cube stage: A (ZZ), B (ZN) and C (NZ) stay packed in GM, each tile moves
    as whole fractals; the fastest placeable tiling runs. The matrices are the padded ones the operands
    hold (their padding is zero where they were packed), with the batch of A's leading axes; the tiles
    are the NPU model's (`place_gemm`)."""
    (a, ashape, adt), (b, bshape, bdt) = ins
    batch = math.prod(ashape[:-4])
    (mp, kp), (_, np_) = holds("ZZ", ashape[-4:]), holds("ZN", bshape[-4:])
    views = ((batch, mp, kp), (math.prod(bshape[:-4]), kp, np_), (batch, mp, np_))
    whose, order, tiles, program = place_gemm(ins[0], ins[1], out, views, target, layouts=CUBE_FORMATS,
                                              precision=precision)
    tiles_str = " ".join(f"T{x.upper()}={tiles[x]}" for x in order)
    return Stage(f"%{node} fractal_matmul: cube {views[0]}x{views[1]} on fractals (ZZ x ZN -> NZ) order "
                 f"{''.join(order)} {tiles_str} ({whose})", node, program)


def _round_cube_operands(nodes: list, precision: str = "fp16") -> tuple[list, dict]:
    """`nodes` with every float operand of a matmul rounded to fp16 first (as the cube's copy-in does;
    bf16 and int8 operands are multiplied as they are; under `precision` "fp32" nothing is rounded),
    kernel bodies included; and the id map."""
    if precision == "fp32":
        return list(nodes), {i: i for i in range(len(nodes))}
    out, remap = [], {}
    for i, n in enumerate(nodes):
        ins = [remap[j] for j in n.inputs]
        attrs = n.attrs
        if n.op in ("matmul", "fractal_matmul"):
            rounded = []
            for j in ins:
                src = out[j]
                if src.dtype in ("float32", "float64"):
                    out.append(Node("convert", (j,), (), src.shape, "float16"))
                    out.append(Node("convert", (len(out) - 1,), (), src.shape, src.dtype))
                    j = len(out) - 1
                rounded.append(j)
            ins = rounded
        elif n.op == "kernel":
            attrs = (tuple(_round_cube_operands(list(n.attrs[0]))[0]),) + tuple(n.attrs[1:])
        out.append(Node(n.op, tuple(ins), attrs, n.shape, n.dtype))
        remap[i] = len(out) - 1
    return out, remap


def cube_reference(graph: Graph, args, precision: str = "fp16") -> list:
    """The program's outputs computed in numpy with the NPU's rounding: matmul operands in fp16 (as they
    are under `precision` "fp32"), the rest in the program's own types. The emulator's results differ
    from these only by summation order."""
    nodes, remap = _round_cube_operands(list(graph.nodes), precision)
    rounded = Graph(nodes=nodes, outputs=[remap[o] for o in graph.outputs], consts=graph.consts,
                    opaque=graph.opaque, n_args=graph.n_args, hidden_outputs=graph.hidden_outputs)
    return reference.evaluate(rounded, args)
