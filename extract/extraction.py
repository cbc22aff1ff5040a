"""What an extractor returns, and the cost of a captured program under the same model: plain data and the
cost model only, so that a call the cache answers (superopt/pipeline.py) loads neither egglog nor an
extractor."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from superopt.core.ir import Graph
from superopt.extract.cost import op_cost
from superopt.extract.loops import loop_costs
from superopt.extract.models.registry import model_of
from superopt.extract.target import Target


@dataclass(frozen=True)
class Method:
    """Which extractor chose a program and how its extraction ended, as fields; `str()` is the report's words
    after "extracted by". Tests and tools read the fields (`timed` says whether the machine's speed decided
    part of the result)."""
    extractor: str = "greedy"    # "greedy" or "ilp"; "none" (nothing to search), "reused" (chosen at other sizes)
    detail: str = ""             # the ILP's proof, or why greedy's program stands where the ILP was asked for
    growth_cut: int = 0          # kernels that grew less because the growth budget was spent (deterministic)
    trials_stopped: float = 0.0  # > 0: growth and sharing trials stopped at this share of the time left
    backstop: bool = False       # the ILP stopped at its time backstop
    pinned: int = 0              # nodes kept as captured: they feed a comparison, a rounding or an int conversion
    guard: str = ""              # a guarded program: what its check tests ("" where the program is not guarded)
    reals_rules: tuple = ()      # the guarded program's rules equal over the reals
    assuming_rules: tuple = ()   # the guarded program's rules assuming a domain condition
    no_guard: str = ""           # why no guarded program was looked for, or why the one found was not taken
    measured: str = ""           # tune=True: what timing both programs on this machine decided

    @property
    def timed(self) -> bool:
        """Whether a time limit (not a deterministic budget) cut part of the extraction."""
        return self.trials_stopped > 0 or self.backstop

    @property
    def guarded(self) -> bool:
        return bool(self.guard)

    def but(self, **changes) -> "Method":
        return replace(self, **changes)

    def to_data(self) -> dict:
        return asdict(self)

    @classmethod
    def from_data(cls, data: dict) -> "Method":
        return cls(**{k: tuple(v) if k.endswith("_rules") else v for k, v in data.items()})

    def __str__(self) -> str:
        inside = [self.detail] if self.detail else []
        if self.growth_cut:
            inside.append(f"{self.growth_cut} kernels grew less: growth budget spent")
        text = self.extractor + (f" ({'; '.join(inside)})" if inside else "")
        if self.trials_stopped:
            text += f"; kernel growth and sharing trials stopped at {self.trials_stopped:.0%} of the time left"
        if self.pinned:
            text += f"; {self.pinned} nodes feeding a step (comparison, rounding, int conversion) as captured"
        if self.no_guard:
            text += f"; {self.no_guard}"
        if self.guard:
            rules = [f"with rules {how}: {', '.join(names)}" for how, names in
                     (("equal over the reals", self.reals_rules), ("assuming it", self.assuming_rules)) if names]
            text += f"; guarded: runs where {self.guard} (else the original)"
            text += ", " + "; ".join(rules) if rules else ""
        if self.measured:
            text += f"; {self.measured}"
        return text


@dataclass
class Extraction:
    graph: Graph
    cost: float
    node_costs: list[float]  # per live node of `graph`, seconds per call (0 for hoisted constants)
    method: Method = field(default_factory=Method)   # which extractor produced it, and how it ended
    declined: list = field(default_factory=list)  # larger fusions that were available and not chosen, and why
    memory: str = ""         # what fitting a memory budget did, when one was given


def program_cost(graph: Graph, target: Target) -> tuple[float, list[float]]:
    """Cost of a program under the same model (constant sub-terms hoisted), per live node. Where the target's
    model `fuses` (the cpu: as XLA runs it, in its own fusions, extract/xla.py), as that model prices it;
    elsewhere each op or kernel node as one kernel. A loop
    (scan, fori_loop, while_loop) is priced as its trips times its body, a cond as its costliest branch
    (extract/loops.py)."""
    model = model_of(target)
    if model.fuses:
        return model.program_cost(graph, target)
    constant = graph.constant_nodes()
    live = graph.live()
    loops = loop_costs(graph, live, target)
    costs = []
    for i in live:
        node = graph.nodes[i]
        ins = [(graph.nodes[j].shape, graph.nodes[j].dtype) for j in node.inputs]
        costs.append(0.0 if i in constant else loops[i] if i in loops else
                     op_cost(node.op, node.attrs, ins, (node.shape, node.dtype), target))
    return sum(costs), costs


def as_run(chosen: Extraction, target: Target) -> Extraction:
    """`chosen` with its cost as the program runs (`program_cost`): where the model `fuses` (on a CPU, XLA
    fuses what extraction's kernels fuse and more), the price the decision to change the program compares."""
    if model_of(target).fuses:
        chosen.cost = program_cost(chosen.graph, target)[0]
    return chosen
