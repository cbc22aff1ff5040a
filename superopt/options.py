"""The options of one `superopt()` call, validated once (`api.Optimized` checks each and names the bad value)
into one frozen record that the pipeline, the search and the backends take whole."""
from __future__ import annotations

from dataclasses import dataclass

from superopt.core.modes import Numerics
from superopt.egraph.limits import Limits
from superopt.extract.target import Target
from superopt.rewrites.schedule import Schedule


@dataclass(frozen=True)
class Options:
    target: Target                    # as loaded once, from its name or its TOML file's path
    rulesets: Schedule                # the rule sets, one phase each, or the caller's schedule
    limits: Limits
    verify: bool = True               # check a changed program against the original before it runs
    extractor: str = "greedy"         # "greedy" or "ilp"
    backend: str = "jax"              # what runs the chosen program: "jax", or the target kind's own
    memory_budget: int | None = None  # bytes of peak memory the program must fit (greedy extraction only)
    numerics: Numerics = Numerics.STRICT
    precision: str | None = None      # an NPU target's cube type for float32 operands ("fp16" or "fp32")
    tune: bool = False                # time a verified program against the original here before it runs
