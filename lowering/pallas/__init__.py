"""Pallas lowering: the extracted term as Pallas kernels, one template per kernel kind (`kernels.py`).

`program.PallasProgram` runs a whole term; the Pallas backend of `superopt/backends.py` is what
`superopt(fn, target="gpu-h100", backend="pallas")` calls. On a CPU the kernels run in interpret mode, on a GPU they compile (Triton).
"""
