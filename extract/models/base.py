"""What a target kind's cost model answers: the protocol each `extract/models/<kind>.py` implements, with the
defaults most kinds share. `extract/cost.py` describes a kernel once (`KernelShape`: its FLOPs, bytes, live
values, what surrounds its matmuls) and asks the target's model for the rest; `extract/extraction.py` asks it how
a whole program is priced. The registry (`registry.py`) maps each kind to its model.
"""
from __future__ import annotations

from superopt.extract.models.breakdown import Breakdown
from superopt.extract.target import Target


class KindModel:
    """A target kind's cost model. Class attributes say what the kind is; methods price what it runs."""
    kind: str = ""
    # The JAX platforms (`jax.default_backend()`) whose XLA compiles for this kind: only there is what XLA
    # compiles in this process the program the target runs (`stages.runs_here`).
    platforms: tuple[str, ...] = ()
    # The backends besides jax a program for this kind may run on, and the one it runs on by default.
    backends: tuple[str, ...] = ()
    default_backend: str = "jax"
    # The micro-kernel's edge of the Chimera optimum (extract/tiling.py): a 16x16 fractal on tensor cores and
    # the cube, one element on a CPU.
    tile_granule: int = 16
    # A program is priced in the compiler's fusions (`program_cost`), not as one kernel a node: then a scalar
    # op in a loop body costs what its fusion costs (extract/loops.py) and a chosen program is priced again as
    # it runs (`extraction.as_run`).
    fuses: bool = False
    # A reduction over several axes, the last among them, runs as two kernels (over rows, then the rest:
    # `cost.row_stages`), as the NPU's lowering runs it.
    rows_first: bool = False

    def matrix_unit(self, ins: list) -> bool:
        """Whether a matmul of operands `ins` ((shape, dtype) pairs) runs at the target's `matrix_flops`
        (where it has any); else at `peak_flops`."""
        return True

    def tiled_bytes(self, tiling, body: tuple, ins: list, out: tuple, target: Target) -> tuple[float, float]:
        """(bytes from global memory, bytes from the next level of cache) of a kernel tiled as `tiling`."""
        return tiling.moved_bytes, 0.0

    def kernel(self, k, moved: float, matrix_rate: float, body: tuple, ins: list, out: tuple, target: Target,
               tiling=None, l2_moved: float = 0.0, packed: bool = False) -> Breakdown:
        """One kernel's breakdown: `k` its `cost.KernelShape`, `moved` the bytes it moves (as tiled, where
        `tiling` is given), `matrix_rate` its matmuls' FLOP/s. `packed`: its matrix operands and result are in
        the matrix unit's own formats already."""
        raise NotImplementedError(f"the {self.kind} cost model prices no kernel")

    def program_cost(self, graph, target: Target) -> tuple[float, list[float]]:
        """A whole program's cost and its live nodes' costs, where the model `fuses`."""
        raise NotImplementedError(f"the {self.kind} cost model prices a program a kernel a node")
