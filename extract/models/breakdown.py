"""What a cost model says of one kernel: its predicted time and what that time is made of.

Every target kind's model (`gpu.py`, `npu.py`, `cpu.py`) returns a `Breakdown` of its own type: the fields
all models share, and the factors of that model (registers and occupancy; the unit and its buffers; bytes
an unfused CPU loop moves again). Reports read `factors()` and `notes()`, never a model's field names.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Breakdown:
    time: float                 # seconds per call; inf when the kernel cannot run (see `overflow`)
    flops: float = 0.0
    bytes: float = 0.0
    overflow: str = ""          # why the kernel does not fit on chip ("" when it does)

    def factors(self) -> list[str]:
        """The model's own quantities, for reports."""
        return []

    def notes(self) -> list[str]:
        """The penalties a reader should know of."""
        return [f"does not fit: {self.overflow}"] if self.overflow else []


FREE = Breakdown(0.0)   # leaves, views and the identity layout: nothing runs
