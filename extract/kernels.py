"""Kernel variants: from `kernel(body)` e-nodes to concrete kernels the extractors can cost.

After fusion saturates, a kernel's body is an e-class of the Scalar language in which every load of an
intermediate (`sarg`) sits next to that intermediate's own body (inlined). Which of them a kernel
recomputes on chip and which it reads from global memory decides how much it fuses, and the cost of
that depends on the whole body (registers, buffer capacity), not on a sum over nodes. So before
extraction each `kernel` e-node is replaced by a short list of concrete variants, grown from the root:
the first computes only the kernel's own op and loads every operand; each next one also inlines the
nearest still-loaded producer (breadth first), until nothing is left to inline, the target's limits
are exceeded, or `MAX_VARIANTS` is reached. A variant is an ordinary e-node whose children are the
tensors it loads and whose one argument is its body (IR nodes), so greedy and ILP extraction, DAG-aware
cost sets and cycle checks apply unchanged, and a producer that several kernels inline is computed in
each of them while one that they load is computed once: the cost decides.
"""
from __future__ import annotations

import math
from collections import deque
from types import SimpleNamespace

from superopt.core.deadline import Deadline
from superopt.egraph.encode import decode
from superopt.egraph.frozen import ENode, FrozenEGraph
from superopt.core.ir import CycleError, Node, hoistable, postorder
from superopt.extract.cost import nbytes, op_cost, tiling_options
from superopt.extract.target import Target
from superopt.rewrites.infer import IllTyped, infer
from superopt.rewrites.pattern import SCALAR_AS_TENSOR, SCALAR_FNS

MAX_VARIANTS = 12                           # per growth; past it only the largest body is kept
# compute-heavy: recomputing one in two kernels doubles it
PRODUCERS = frozenset({"smm", "sconv", "schain", "sconvchain"})
# children loaded, not computed
TENSOR_OPERANDS = {"sarg": (0,), "smm": (0, 1), "sconv": (0, 1), "schain": (1,), "sconvchain": (1,)}
CHAINED = frozenset({"schain", "sconvchain"})  # a product whose left operand may come from the body
LOOKAHEAD = 8                               # inlining candidates compared at each growth step
# Work bound: body nodes built while growing the kernels of one program. In a long elementwise chain every
# op is the root of a kernel that could grow through the whole chain, rebuilding its body at each step
# (cubic work: a 200-op chain took a minute to extract). Each kernel may build its share of what is left,
# and at least KERNEL_FLOOR while the budget lasts, so programs of a few hundred ops are expanded as if
# there were no budget; past it, kernels grow less (each keeps its first variant), and the extraction
# says how many were cut.
GROWTH_BUDGET = 300_000
KERNEL_FLOOR = 6_000


class GrowthBudget:
    """Body nodes that kernel growth may still build in one expansion (`GROWTH_BUDGET`)."""

    def __init__(self, kernels: int, total: int | None = None, stop: Deadline | None = None):
        self.left, self.kernels, self.cut = GROWTH_BUDGET if total is None else total, kernels, 0
        self.stop = stop   # growth stops at this deadline (a part of the search's: superopt/core/deadline.py)
        self.timed_out = False

    def out_of_time(self) -> bool:
        if not self.timed_out and self.stop is not None and self.stop.expired():
            self.timed_out = True
        return self.timed_out

    def share(self) -> int:
        """What the next kernel may build."""
        share = max(self.left // max(self.kernels, 1), min(KERNEL_FLOOR, self.left))
        self.kernels -= 1
        return share


class BodyError(ValueError):
    """A choice of loads that does not make a well-typed, acyclic body."""


def _broadcast_dims(src: tuple, dst: tuple) -> tuple:
    if len(src) == 0:
        return ()
    if len(src) != len(dst) or any(a not in (1, b) for a, b in zip(src, dst)):
        raise BodyError(f"{src} does not broadcast to {dst}")
    return tuple(range(len(dst)))


# (constructor, its typed primitive arguments, operand types) -> (shape, dtype, op, attrs) of the IR node, or the
# reason it is ill-typed: `infer` and `decode` are pure, and a kernel's growth builds the same ops again and again.
# The scalar language's arguments are strings, integers and shapes, never floats: equal keys are the same op.
_TYPED: dict = {}
_TYPED_LIMIT = 1 << 16


class _Builder:
    """Builds one body: IR nodes in topological order, with the loaded tensor classes as inputs."""

    def __init__(self, fz: FrozenEGraph, conv_params):
        self.fz, self.conv_params = fz, conv_params
        self._tables = SimpleNamespace(conv_params=conv_params)  # what `decode` reads of an encoding
        self.nodes: list[Node] = []
        self.inputs: list = []          # tensor e-classes, in order of first load
        self._memo: dict = {}

    def _add(self, node: Node) -> int:
        key = (node.op, node.inputs, node.attrs)
        if key not in self._memo:
            self.nodes.append(node)
            self._memo[key] = len(self.nodes) - 1
        return self._memo[key]

    def load(self, cls) -> int:
        if cls not in self.fz.shapes or cls not in self.fz.dtypes:   # the analyses could not type it
            raise BodyError(f"tensor class {cls} has no type to load")
        if cls not in self.inputs:
            self.inputs.append(cls)
        k = self.inputs.index(cls)
        return self._add(Node("arg", (), (k,), self.fz.shapes[cls], self.fz.dtypes[cls]))

    def apply(self, fn: str, prims: tuple, operands: list[int]) -> int:
        ins = tuple((self.nodes[i].shape, self.nodes[i].dtype) for i in operands)
        typed = (self.conv_params[prims[0]],) if fn == "conv" else prims
        key = (fn, typed, ins)
        found = _TYPED.get(key)
        if found is None:   # the same op on the same operand types recurs in most bodies a growth builds
            try:
                found = (*infer(fn, typed, list(ins)), *decode(fn, prims, (), self._tables))
            except IllTyped as exc:
                found = str(exc)
            if len(_TYPED) >= _TYPED_LIMIT:
                _TYPED.clear()
            _TYPED[key] = found
        if isinstance(found, str):
            raise BodyError(found)
        shape, dtype, op, attrs = found
        return self._add(Node(op, tuple(operands), attrs, shape, dtype))

    def broadcast(self, i: int, shape: tuple) -> int:
        src = self.nodes[i].shape
        if tuple(src) == tuple(shape):
            return i
        return self.apply("broadcast", (tuple(shape), _broadcast_dims(src, tuple(shape))), [i])


def build_body(fz: FrozenEGraph, conv_params, root, inline: dict) -> tuple[tuple, list]:
    """(body nodes, loaded tensor classes) for a kernel whose Scalar classes in `inline` are computed by
    the chosen node and every other one is loaded with its `sarg` node."""
    b = _Builder(fz, conv_params)
    def chosen(cls) -> ENode:
        node = inline.get(cls) or _load_node(fz, cls)
        if node is None:
            raise BodyError(f"Scalar class {cls} has nothing to load")
        return node

    kids: dict = {}   # class -> its body children: the order's walk and the emission both ask

    def scalar_kids(cls) -> list:
        found = kids.get(cls)
        if found is None:
            found = kids[cls] = _scalar_children(chosen(cls))
        return found

    try:
        order = postorder([root], scalar_kids)
    except CycleError as exc:
        raise BodyError("the inlined body is cyclic") from exc
    value: dict = {}
    for cls in order:
        value[cls] = _emit(b, chosen(cls), [value[c] for c in scalar_kids(cls)])
    return tuple(b.nodes), b.inputs


def _scalar_children(node: ENode) -> list:
    """The children of a Scalar node that are body values (the others are tensors it loads)."""
    loaded = TENSOR_OPERANDS.get(node.fn, ())
    return [c for i, c in enumerate(node.children) if i not in loaded]


def _emit(b: _Builder, node: ENode, kids: list[int]) -> int:
    fn, a = node.fn, node.args
    if fn == "sarg":
        return b.broadcast(b.load(node.children[0]), a[0])
    if fn in CHAINED:
        return b.apply(SCALAR_AS_TENSOR[fn], a, [kids[0], b.load(node.children[1])])
    if fn in PRODUCERS:
        return b.apply(SCALAR_AS_TENSOR[fn], a, [b.load(c) for c in node.children])
    if fn == "sbcast":
        return b.broadcast(kids[0], a[0])
    if fn == "srow":
        x = b.nodes[kids[0]]
        if not x.shape:
            raise BodyError("a row reduction of a rank-0 value")
        reduced = b.apply("reduce", (a[0], (len(x.shape) - 1,)), kids)
        return b.apply("reshape", (x.shape[:-1] + (1,),), [reduced])
    ctor, prims = SCALAR_AS_TENSOR[fn], a
    if ctor == "binary" and b.nodes[kids[0]].shape != b.nodes[kids[1]].shape:
        raise BodyError("operands of a body op have different shapes")
    return b.apply(ctor, prims, kids)


def _load_node(fz: FrozenEGraph, cls):
    return next((n for n in fz.classes.get(cls, []) if n.fn == "sarg"), None)


def inline_order(fz: FrozenEGraph, tensor_types) -> dict:
    """For every Scalar class, the nodes that compute it in place, best first: by what the body would
    read if everything below the node were computed in place too (bytes of the tensors it loads), then
    by body ops, then by fewest operands and by name. A constant (computed once when the program is
    built) is counted as loaded where that reads less, and then it is never inlined at all. So of two
    equal forms the one that reads less comes first: (conv - mean) * scale as conv(x, w * scale) minus
    the constant mean * scale once the scale is folded into the weights. The volumes are a fixpoint over
    the (possibly cyclic) e-graph; a class reached only through cycles costs its load."""
    scalar = {cls: nodes for cls, nodes in fz.classes.items() if nodes and nodes[0].fn in SCALAR_FNS}

    def loaded(n: ENode) -> int:
        kids = n.children if n.fn == "sarg" else [n.children[i] for i in TENSOR_OPERANDS.get(n.fn, ())]
        return sum(nbytes(tensor_types[c]) if c in tensor_types else math.inf for c in kids)

    def node_cost(n: ENode, best: dict):
        kids = [best.get(c) for c in _scalar_children(n)]
        if any(k is None for k in kids):
            return None
        if n.fn in CHAINED:  # a product that may take its left operand from the body: never worse than loading it
            load = _load_node(fz, n.children[0])
            kids = [min(kids[0], (loaded(load), 0))] if load is not None else kids
        return (loaded(n) + sum(k[0] for k in kids), 1 + sum(k[1] for k in kids))

    parents: dict = {}
    for nodes in scalar.values():
        for n in nodes:
            if n.fn != "sarg":
                for c in _scalar_children(n):
                    parents.setdefault(c, []).append(n)
    best: dict = {}   # class -> (bytes, ops) of its cheapest fully inlined form

    def settle(seeds: dict) -> None:
        best.update(seeds)
        queue = deque(n for c in seeds for n in parents.get(c, ()))
        while queue:
            n = queue.popleft()
            c = node_cost(n, best)
            if c is not None and (n.eclass not in best or c < best[n.eclass]):
                best[n.eclass] = c
                queue.extend(parents.get(n.eclass, ()))

    # Leaves first (classes that can only be loaded, and constants), then classes left out by cycles
    # fall back to a load.
    constant = _constant_classes(fz)
    leaves = {cls: (loaded(load), 0) for cls, nodes in scalar.items()
              if (load := _load_node(fz, cls)) is not None
              and (all(n.fn == "sarg" for n in nodes) or load.children[0] in constant)}
    settle(leaves)
    settle({n.eclass: node_cost(n, best) for nodes in scalar.values() for n in nodes
            if n.fn != "sarg" and not _scalar_children(n)})
    settle({cls: (loaded(load), 0) for cls in scalar
            if cls not in best and (load := _load_node(fz, cls)) is not None})
    order = {}
    for cls, nodes in scalar.items():
        hoisted = cls in leaves and best[cls] == leaves[cls]  # a constant that is cheapest loaded
        inline = [] if hoisted else [n for n in nodes if n.fn != "sarg"]
        order[cls] = sorted(inline, key=lambda n: (node_cost(n, best) or (math.inf, math.inf), len(n.children),
                                                  n.fn, repr(n.args)))
    return order


def _constant_classes(fz: FrozenEGraph) -> set:
    """Tensor classes with a term over constants only (hoisted: computed when the program is built)."""
    parents: dict = {}
    for nodes in fz.classes.values():
        for n in nodes:
            for c in n.children:
                parents.setdefault(c, []).append(n)
    constant: set = set()
    queue = deque(n for nodes in fz.classes.values() for n in nodes if not n.children)
    while queue:
        n = queue.popleft()
        if n.eclass not in constant and n.fn not in SCALAR_FNS and n.fn != "kernel" \
                and hoistable(n.fn, [c in constant for c in n.children]):
            constant.add(n.eclass)
            queue.extend(parents.get(n.eclass, ()))
    return constant


def variants(fz: FrozenEGraph, conv_params, own, root, target: Target, tensor_types, order: dict,
             budget: GrowthBudget | None = None, recomputes: dict | None = None) -> list[ENode]:
    """Concrete kernels for `kernel(root)` in tensor class `own`, growing from the root (module doc).
    Three growths: one never takes in a matmul or convolution (elementwise and row fusion only); one may,
    from the root (a matmul with a short epilogue); and one may, from the largest body of the first
    (a matmul with everything after it that fits). Each starts from the root's own op (and one other form
    of it), and, where a class the body loads is both computed by an op and a transpose of its transposed
    copy, from the other orientation too (`_turned`). Growth stops where `budget`'s share is spent.
    `recomputes`, when given, is filled with the producers each variant recomputes (`_recomputed`)."""
    out: list[ENode] = []
    seen: set = set()
    built: dict = {}
    allowance = budget.share() if budget is not None else math.inf
    spent, cut = 0, False

    def build(inline: dict):
        """(body, loaded classes) for an inline set, or None if it makes no valid body; each set once."""
        nonlocal spent
        key = frozenset(inline.items())
        if key not in built:
            try:
                built[key] = build_body(fz, conv_params, root, inline)
            except BodyError:
                built[key] = None
            spent += len(built[key][0]) if built[key] is not None else 1
        return built[key]

    def tiled(body: tuple, loaded: list, inline: dict) -> list[ENode]:
        """The kernel as e-nodes: one per tiling offered when the body has matrix ops (`extract/tiling.py`)."""
        children = tuple(loaded)
        options, _ = tiling_options(body, [tensor_types[c] for c in loaded], tensor_types[own], target)
        nodes = [ENode("kernel", (body,), children, own)] if not options else \
            [ENode("kernel", (body, t), children, own) for t in options]
        redone = _recomputed(fz, inline, own)
        if redone and recomputes is not None:
            recomputes.update((n, redone) for n in nodes)
        return nodes

    def grow(inline: dict, producers: bool) -> dict:
        """Append the bodies of one growth to `out`; returns the largest inline set within the limits."""
        nonlocal cut
        kept, largest, fits = 0, None, inline
        while inline is not None:
            if build(inline) is None:
                break
            body, loaded = build(inline)
            if own in loaded:
                break   # the kernel would read its own result
            if (body, tuple(loaded)) not in seen:
                seen.add((body, tuple(loaded)))
                nodes = tiled(body, loaded, inline)
                cost = min(op_cost("kernel", n.args, [tensor_types[c] for c in loaded], tensor_types[own], target)
                           for n in nodes)
                if math.isinf(cost) and (out or largest):
                    out.append(nodes[0])   # never chosen; kept so the report can say why fusion stopped
                    break                  # past the target's limits: growing further only adds to the body
                if kept < MAX_VARIANTS:
                    out.extend(nodes)
                    kept += 1
                else:
                    largest = nodes        # past the cap, only the largest body is kept
            fits = inline
            if spent >= allowance or (budget is not None and budget.out_of_time()):
                cut = True
                break
            inline = _next_to_inline(fz, order, build, root, inline, producers)
        if largest is not None:
            out.extend(largest)
        return fits

    forms = order.get(root, [])[:2]   # the root's own op (and one other form of it, if any)
    starts = [_close(fz, order, root, {root: first}) for first in forms]
    if starts and not any(_permutes(n) for n in forms):
        # The root reads its operands in one orientation; the other one too (`_turned`).
        turned = _turned(fz, order, root, starts[0])
        if turned is not None:
            starts.append(turned)
    for start in starts:
        widest = grow(start, producers=False)
        grow(start, producers=True)
        if widest is not start:
            grow(widest, producers=True)
    if budget is not None:
        budget.left = max(budget.left - spent, 0)
        budget.cut += cut
    return out


def _permutes(node: ENode) -> bool:
    """Whether a Scalar node computes its class as a transpose of another value (not the identity)."""
    return node.fn == "sperm" and tuple(node.args[0]) != tuple(range(len(node.args[0])))


def _turned(fz: FrozenEGraph, order: dict, root, inline: dict) -> dict | None:
    """`inline` with the nearest loaded class that can be computed both by an op and as a transpose of
    its transposed copy computed the other way: the start of the growths that read the other orientation.
    Each growth follows the first form of every class it inlines, so all the kernels of one root read
    their operands in one orientation, and where the program stores the other one (a weight gradient
    kept transposed) none of them could read what is stored: a row reduction of a gradient would need the
    gradient written again, or its own copy of the matmul. Which orientation is stored is extraction's
    choice, so the kernels offer both. None when no loaded class has both forms."""
    for cls in _frontier(root, inline):
        forms = order.get(cls, [])
        turned = [n for n in forms if _permutes(n)]
        plain = [n for n in forms if not _permutes(n)]
        if turned and plain:
            other = plain[0] if _permutes(forms[0]) else turned[0]
            return _close(fz, order, root, {**inline, cls: other})
    return None


def _recomputed(fz: FrozenEGraph, inline: dict, own) -> frozenset:
    """The tensor classes other than `own` whose matmul or convolution the body computes in place: an
    inlined producer whose Scalar class can also be loaded names the tensor it would load."""
    out = set()
    for cls, node in inline.items():
        if node.fn in PRODUCERS and (load := _load_node(fz, cls)) is not None and load.children[0] != own:
            out.add(load.children[0])
    return frozenset(out)


def _frontier(root, inline: dict):
    """The Scalar classes the body loads (not inlined), nearest the root first."""
    queue, seen = deque([root]), {root}
    while queue:
        cls = queue.popleft()
        node = inline.get(cls)
        if node is None:
            yield cls
        else:
            for c in _scalar_children(node):
                if c not in seen:
                    seen.add(c)
                    queue.append(c)


def _close(fz: FrozenEGraph, order: dict, root, inline: dict) -> dict:
    """`inline`, plus every class the body reaches that cannot be loaded (it must be computed in place)."""
    inline = dict(inline)
    while True:
        forced = next((c for c in _frontier(root, inline) if _load_node(fz, c) is None and order.get(c)), None)
        if forced is None:
            return inline
        inline[forced] = order[forced][0]


def _next_to_inline(fz: FrozenEGraph, order: dict, build, root, inline: dict, producers: bool):
    """Among the loaded Scalar classes nearest the root (breadth first, `LOOKAHEAD` of them) that can be
    computed in place, the one whose inlining leaves the kernel reading the fewest bytes: a mean or a
    variance over rows the kernel already reads comes before a producer that brings new operands.
    Matmuls and convolutions only when `producers`."""
    found = []
    for cls in _frontier(root, inline):
        options = [n for n in order.get(cls, []) if producers or n.fn not in PRODUCERS]
        if options:
            found.append((cls, options[0]))
            if len(found) == LOOKAHEAD:
                break
    best, best_bytes = None, math.inf
    for cls, node in found:
        grown = _close(fz, order, root, {**inline, cls: node})
        if build(grown) is None:
            continue
        _, loaded = build(grown)
        read = sum(nbytes((fz.shapes[c], fz.dtypes[c])) for c in loaded)
        if read < best_bytes:
            best, best_bytes = grown, read
    return best


def expand(fz: FrozenEGraph, conv_params, target: Target, stop: Deadline | None = None) -> FrozenEGraph:
    """A view of `fz` where every `kernel` e-node is replaced by its concrete variants and the Scalar
    classes are gone (the variants carry their bodies). Views without kernels are returned as they are.
    At `stop` (a deadline) growth stops: each kernel left keeps the bodies grown so far, at least its
    root's own op, and counts in `growth_cut`."""
    scalar = {cls for cls, nodes in fz.classes.items() if nodes and nodes[0].fn in SCALAR_FNS}
    if not scalar:
        return fz
    types = {cls: (fz.shapes[cls], fz.dtypes[cls]) for cls in fz.classes if cls in fz.shapes and cls in fz.dtypes}
    view = FrozenEGraph(shapes=fz.shapes, dtypes=fz.dtypes, outputs=fz.outputs)
    order = inline_order(fz, types)
    budget = GrowthBudget(sum(1 for nodes in fz.classes.values() for n in nodes if n.fn == "kernel" and not n.args),
                          total=target.kernel_growth or None, stop=stop)
    for cls, nodes in fz.classes.items():
        if cls in scalar:
            continue
        kept: dict = {}                  # in order, without repeats (a variant can repeat another's)
        for n in nodes:
            if n.fn == "kernel" and not n.args:
                if cls in types:
                    kept.update(dict.fromkeys(variants(fz, conv_params, cls, n.children[0], target, types, order,
                                                       budget, view.recomputes)))
            else:
                kept[n] = None
        view.classes[cls] = list(kept)
    view.growth_cut = budget.cut
    return view
