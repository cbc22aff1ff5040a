"""The numerics contract's modes (README, "Numerics contract"; superopt/numerics.py says which rules each runs).
A `StrEnum`: a mode compares, hashes and prints as its name."""
from __future__ import annotations

from enum import StrEnum


class Numerics(StrEnum):
    STRICT = "strict"   # every program keeps the contract: no rule that can change overflow runs unguarded
    FAST = "fast"       # rules equal over the reals run too; the report lists each one that fired

    @classmethod
    def of(cls, value) -> "Numerics":
        """The mode named `value`, or a one-line error naming the bad value and the valid ones."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"superopt: unknown numerics mode {value!r}; valid: "
                             f"{', '.join(m.value for m in cls)}") from None
