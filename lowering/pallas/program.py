"""A whole program (`ir.Graph`) on Pallas: every node that computes runs inside a pallas_call.

The walk mirrors `lowering/jax.py` and composes into one `jax.jit`:

- a `kernel` node runs its kind's template (`kernels.py`) with the term's tile sizes;
- a plain op that computes (an elementwise op, a reduction, a matmul, a transpose or broadcast that
  materialises, a cast) runs as the kernel of that one op, through the same templates;
- sibling elementwise kernels (an optimizer's parameter and moment updates) run as one launch
  (`optimizer.py`);
- a `reshape` is a view (a bitcast of a dense array) and stays a JAX reshape; leaves are arguments and
  literals; sub-terms of constants are computed once, when the program is built (as `lowering/jax.py`
  does), so they are no work per call;
- what no template takes (convolutions, concatenations, slices, padding, layout packing, opaque
  primitives) runs with the JAX lowering and is listed in `in_jax`, so a report never hides it.

On a CPU the kernels run in interpret mode; on a GPU they compile with Triton, whose blocks must have
power-of-two edges (`Options.pow2`: every block is rounded up and the padding masked).
"""
from __future__ import annotations


import jax
import numpy as np
from jax import lax

from superopt.core import verify as verification
from superopt.core.ir import Graph
from superopt.core.ops import flagged, on_pallas
from superopt.egraph.siblings import merged_body, run_before
from superopt.extract.cost import one_op_body, tiling_options
from superopt.lowering.jax import evaluate as jax_evaluate
from superopt.lowering.pallas.blocks import Options
from superopt.lowering.pallas.kernels import Launch, kind_of, run_kernel
from superopt.lowering.pallas.labels import NoTemplate
from superopt.lowering.pallas.optimizer import update_groups

VIEWS = flagged("view")
BODY_OPS = on_pallas("body") - VIEWS   # the ops a kernel of one op runs; the others run in JAX


SMEM_PER_BLOCK = 101376   # shared memory a block may have where the target does not say (the least of
                          # recent NVIDIA GPUs, 99 KiB: sm_86 and sm_89)


def default_options(target=None) -> Options:
    """Interpret mode where there is no GPU; Triton with power-of-two blocks where there is one, its
    matrix tiles within the target's shared memory per block."""
    if jax.default_backend() != "gpu":
        return Options(interpret=True)
    return compiled_options(target)


def compiled_options(target=None) -> Options:
    """The options of kernels compiled with Triton (what `default_options` gives on a GPU)."""
    from jax.experimental.pallas import triton as pltriton
    limit = getattr(getattr(target, "gpu", None), "smem_per_block", 0) or SMEM_PER_BLOCK
    return Options(interpret=False, pow2=True, compiler_params=pltriton.CompilerParams(), smem_limit=limit)


class PallasProgram:
    """The graph lowered to Pallas kernels; calling it runs them (flat arguments -> flat outputs)."""

    def __init__(self, graph: Graph, target, options: Options | None = None):
        self.graph, self.target = graph, target
        self.options = options or default_options(target)
        self.launches: list[Launch] = []
        self.in_jax: list[str] = []          # nodes run by the JAX lowering, and why
        self.groups: list[tuple] = []        # sibling kernels run as one launch (graph node ids)
        self._steps: list = []
        self._build()
        self._run = jax.jit(self._evaluate)

    # ---- building ----
    def _build(self) -> None:
        g = self.graph
        constant = g.constant_nodes()
        live = g.live()
        needed = sorted({j for i in live if i not in constant for j in g.nodes[i].inputs if j in constant}
                        | {o for o in g.outputs if o in constant})
        self._hoisted_ids = [i for i in needed if g.nodes[i].op != "lit"]
        order = [i for i in live if i in constant]
        values = jax.jit(lambda: [jax_evaluate(g, (), only=order)[i] for i in self._hoisted_ids])() \
            if self._hoisted_ids else []
        self._hoisted = list(values)
        self._known = {i: np.asarray(v) for i, v in zip(self._hoisted_ids, self._hoisted) if not v.shape}
        self._known.update({i: np.asarray(g.nodes[i].attrs[0], np.dtype(g.nodes[i].dtype))
                            for i in needed if g.nodes[i].op == "lit"})
        groups = update_groups(g, constant)
        before = run_before(g, groups, constant)
        member = {i for grps in before.values() for grp in grps for i in grp}
        for i in live:
            for group in before.get(i, ()):
                self._group(group)
            node = g.nodes[i]
            if i in constant or node.op in ("arg", "const", "lit"):
                continue
            if node.op in VIEWS:
                self._steps.append(self._view(i))
            elif i not in member:      # a member ran with its group
                self._node(i)

    def _body(self, i: int) -> tuple[tuple, object]:
        """(body, tiling) of node i: a kernel's own, or the kernel of one op."""
        g = self.graph
        node = g.nodes[i]
        ins = [(g.nodes[j].shape, g.nodes[j].dtype) for j in node.inputs]
        if node.op == "kernel":
            body, tiling = node.attrs[0], (node.attrs[1] if len(node.attrs) > 1 else None)
        elif node.op in BODY_OPS:
            body, tiling = one_op_body(node.op, node.attrs, ins, (node.shape, node.dtype)), None
        else:
            raise NoTemplate(f"no template: {node.op} runs in JAX")
        if tiling is None and any(n.op == "matmul" for n in body):
            options, _ = tiling_options(body, ins, (node.shape, node.dtype), self.target)
            tiling = options[0] if options else None
        return body, tiling

    def _scalars(self, loads: list[int]) -> dict:
        """Operand positions whose values are rank-0 and known now: they become literals in the body."""
        return {k: self._known[j].item() for k, j in enumerate(loads)
                if j in self._known and self._known[j].shape == ()}

    def _node(self, i: int) -> None:
        g = self.graph
        try:
            body, tiling = self._body(i)
            self._kernel((i,), body, list(g.nodes[i].inputs), tiling, kind_of(body, tiling), None)
        except NoTemplate as exc:
            self.in_jax.append(f"%{i} {g.nodes[i].op}: {exc}")
            self._steps.append(self._jax(i))

    def _group(self, group: list[int]) -> None:
        body, roots, loads = merged_body(self.graph, group, lambda i: self._body(i)[0])
        try:
            self._kernel(tuple(group), body, loads, None, "fused update", roots)
            self.groups.append(tuple(group))
        except NoTemplate:
            for i in group:
                self._node(i)

    def _kernel(self, ids: tuple, body: tuple, loads: list[int], tiling, kind: str, roots) -> None:
        g, options = self.graph, self.options
        scalars = self._scalars(loads)
        name = f"superopt_{kind.replace(' ', '_')}_{ids[-1]}"
        seen: list[Launch] = []

        def fn(*xs):
            outs, launch = run_kernel(body, list(xs), tiling, options, name, kind, roots, scalars)
            seen.append(launch)
            return outs
        jax.eval_shape(fn, *[jax.ShapeDtypeStruct(g.nodes[j].shape, np.dtype(g.nodes[j].dtype)) for j in loads])
        launch = seen[0]
        launch.nodes = ids
        self.launches.append(launch)

        def step(env, args):
            for k, out in zip(ids, fn(*[env[j] for j in loads])):
                env[k] = out
        self._steps.append(step)

    def _view(self, i: int):
        node = self.graph.nodes[i]

        def step(env, args):
            env[i] = lax.reshape(env[node.inputs[0]], node.shape)
        return step

    def _jax(self, i: int):
        g, only = self.graph, [i]
        node = g.nodes[i]
        if node.op == "opaque":   # every result of one opaque equation from one bind (its later steps find them)
            only = [j for j in g.live() if g.nodes[j].op == "opaque" and g.nodes[j].attrs[0] == node.attrs[0]
                    and g.nodes[j].inputs == node.inputs]

        def step(env, args):
            env.update(jax_evaluate(g, args, env, only=[j for j in only if j not in env]))
        return step

    # ---- running ----
    def _evaluate(self, flat_args, hoisted):
        g = self.graph
        env = dict(zip(self._hoisted_ids, hoisted))
        for i in g.live():
            node = g.nodes[i]
            if node.op == "arg":
                env[i] = flat_args[node.attrs[0]]
            elif node.op == "lit" and i not in env:
                env[i] = np.asarray(node.attrs[0], np.dtype(node.dtype))
        for step in self._steps:
            step(env, flat_args)
        return [env[o] for o in g.results]     # a hidden output (the effects' token) is not fn's

    def __call__(self, *flat_args) -> list:
        return self._run(list(flat_args), self._hoisted)

    # ---- reporting ----
    def kinds(self) -> dict[str, int]:
        out: dict = {}
        for launch in self.launches:
            out[launch.kind] = out.get(launch.kind, 0) + 1
        return out

    def summary(self) -> str:
        mode = "interpret mode" if self.options.interpret else "compiled with Triton"
        kinds = ", ".join(f"{k} x{n}" for k, n in sorted(self.kinds().items(), key=lambda kv: (-kv[1], kv[0])))
        text = f"pallas ({mode}): {len(self.launches)} kernels" + (f" [{kinds}]" if kinds else "")
        return text + (f"; {len(self.in_jax)} ops in JAX" if self.in_jax else "")

    def describe(self) -> list[str]:
        lines = [f"    {launch}" for launch in self.launches]
        lines += [f"    in JAX: {what}" for what in self.in_jax]
        return lines


LEAF_OPS = flagged("leaf") & flagged("graph")   # arg, const, lit
NARROW_FLOATS = ("bfloat16", "float16")      # widest tolerance first


def narrowest_floats(graph: Graph) -> list[str | None]:
    """Per output: the float type narrower than float32 (bfloat16 before float16: the widest tolerance)
    of a value it is computed through, kernel bodies included, or None. Leaves do not count: both
    programs take the same arguments and constants."""
    narrow: dict[int, set] = {}
    for i in range(len(graph.nodes)):
        node = graph.nodes[i]
        own = set()
        if node.op not in LEAF_OPS:
            own.add(node.dtype)
            if node.op == "kernel":
                own |= {n.dtype for n in node.attrs[0] if n.op not in LEAF_OPS}
        narrow[i] = (own & set(NARROW_FLOATS)).union(*(narrow[j] for j in node.inputs))
    return [next((d for d in NARROW_FLOATS if d in narrow[o]), None) for o in graph.results]


def compare(graph: Graph, expected: list, actual: list) -> str | None:
    """The Pallas program's outputs against the JAX program's (None: they agree). Each output within its
    type's tolerance, or within that of the narrowest float type it is computed through: a Pallas kernel
    writes every value at the type the term declares, while XLA drops float32 -> bfloat16 -> float32
    round trips inside a fusion (it keeps an intermediate's excess precision), so where an output depends
    on a bfloat16 or float16 intermediate the two programs differ by that type's rounding."""
    if len(expected) != len(actual):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for k, (e, a, narrow) in enumerate(zip(expected, actual, narrowest_floats(graph))):
        problem = verification.mismatch(e, a, narrow)
        if problem:
            return f"output {k}: {problem}"
    return None
