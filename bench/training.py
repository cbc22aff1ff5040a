"""The training steps (superopt/workloads.py `train_step`, `sgd_step`): dynamic loss scaling, global-norm
clipping and Adam, or SGD with momentum, on a two-layer MLP, before and after superopt.

- npu-910b: the captured program lowered op by op ("before") against the program superopt chose
  ("after"), both through the NPU lowering (which runs sibling kernels of either as one launch where
  that is faster) and the emulator in symbolic mode: cycles and global-memory bytes moved; and the
  passes over gradient memory (`extract/traffic.py`) of the two programs.
- cpu: superopt's program against jax.jit of the same function, timed interleaved in one process
  (`superopt.timing.interleaved_medians`), medians of several rounds, each of several runs.
"""
from __future__ import annotations

import statistics

import jax

from superopt.workloads import sgd_step, train_step
from superopt import superopt
from superopt.core import progress
from superopt.extract.target import load_target
from superopt.lowering.npu.lower import NpuExecutable
from superopt.npu_backend import default_precision
from superopt.timing import interleaved_medians


def npu_row(w, target_name: str = "npu-910b") -> dict:
    fast = superopt(w.fn, target=target_name)
    spec = fast.compile(*w.args)
    target = load_target(target_name)
    precision = spec.npu.precision if spec.npu is not None else default_precision(spec.original, target)
    before = NpuExecutable(spec.original, target, precision=precision).estimate()
    after = spec.npu.estimate() if spec.npu is not None else None
    apart = NpuExecutable(spec.term, target, siblings=False, precision=precision).estimate() \
        if spec.npu is not None else None
    grads_before, grads_after = spec.report.gradient_traffic
    return {"target": target_name, "backend": str(spec.report.backend), "cycles": (before.cycles, after and after.cycles),
            "gm": (before.gm_bytes, after and after.gm_bytes), "grads": (grads_before, grads_after),
            "host": len(spec.npu.host_ops) if spec.npu is not None else None,
            "groups": spec.npu.groups if spec.npu is not None else [],
            "apart": (apart.cycles, apart.gm_bytes) if apart is not None else None}


def cpu_row(w, rounds: int = 3, repeats: int = 9) -> dict:
    flat, tree = jax.tree_util.tree_flatten(w.args)
    fast = superopt(w.fn, target="cpu")
    spec = fast.compile(*w.args)
    jitted = jax.jit(w.fn)
    thunks = {"jax.jit": lambda: jitted(*w.args), "superopt": lambda: spec.run(*flat)}
    samples = [interleaved_medians(thunks, repeats=repeats) for _ in range(rounds)]
    jit_s = statistics.median(s["jax.jit"] for s in samples)
    opt_s = statistics.median(s["superopt"] for s in samples)
    return {"jit_ms": jit_s * 1e3, "opt_ms": opt_s * 1e3, "ratio": jit_s / opt_s,
            "ratios": [s["jax.jit"] / s["superopt"] for s in samples], "grads": spec.report.gradient_traffic,
            "outcome": spec.report.outcome, "optimize_s": sum(spec.report.stage_seconds.values())}


STEPS = {"train-step": ("Adam", train_step), "train-step-sgd": ("SGD with momentum", sgd_step)}


def _rows(name: str, npu: dict, cpu: dict) -> list[str]:
    """The table rows of one step: npu-910b cycles, bytes and gradient passes, then the CPU time."""
    (cb, ca), (gb, ga), (tb, ta) = npu["cycles"], npu["gm"], npu["grads"]
    if ca is None:
        rows = [f"| {name} | npu-910b | not on the emulator: {npu['backend']} | | |"]
    else:
        rows = [f"| {name} | npu-910b emulator cycles | {cb:,} | {ca:,} | {cb / ca:.2f}x |",
                f"| {name} | npu-910b GM bytes moved | {gb / 1e6:.1f} MB | {ga / 1e6:.1f} MB | {gb / ga:.2f}x |"]
    return rows + [
        f"| {name} | passes over gradient memory (npu-910b program) | {tb.passes} | {ta.passes} | |",
        f"| {name} | gradient bytes read and written (npu-910b program) | {tb.bytes / 1e6:.2f} MB | "
        f"{ta.bytes / 1e6:.2f} MB | {tb.bytes / max(ta.bytes, 1):.2f}x |",
        f"| {name} | passes over gradient memory (cpu program) | {cpu['grads'][0].passes} | "
        f"{cpu['grads'][1].passes} | |",
        f"| {name} | cpu time per step, jax.jit -> superopt | {cpu['jit_ms']:.2f} ms | {cpu['opt_ms']:.2f} ms | "
        f"{cpu['ratio']:.2f}x |"]


def main(names=tuple(STEPS)) -> list[str]:
    results = []
    for name in names:
        optimizer, build = STEPS[name]
        w = build()
        progress.note(f"[training] {name} on npu-910b")
        npu = npu_row(w)
        progress.note(f"[training] {name} on cpu")
        results.append((optimizer, w, npu, cpu_row(w)))
    lines = ["", "## Training step: loss scaling, clipping and Adam or SGD with momentum", "",
             *[line.strip() for line in __doc__.split("\n\n", 1)[1].splitlines()], "",
             "Workloads:", *[f"- `{w.name}`: {w.description}." for _, w, _, _ in results], "",
             "| step | measure | before | after | ratio |", "|---|---|---|---|---|"]
    for optimizer, _, npu, cpu in results:
        lines += _rows(optimizer, npu, cpu)
    lines.append("")
    for optimizer, _, npu, cpu in results:
        lines.append(f"{optimizer}: CPU ratio per round (jax.jit / superopt) "
                     f"{', '.join(f'{r:.2f}' for r in cpu['ratios'])}; superopt's outcome: {cpu['outcome']}, "
                     f"optimize time {cpu['optimize_s']:.1f} s; ops left on the host in the npu-910b program: "
                     f"{npu['host']}.")
    lines += ["", "Reproduce with `python -m bench.training`."]
    for optimizer, _, npu, _ in results:
        if npu["apart"] is not None:
            kernels = sum(len(g) for g in npu["groups"])
            lines += ["", f"{optimizer}: on npu-910b the lowering runs {kernels} kernels of superopt's program as "
                      f"{len(npu['groups'])} sibling launches (`egraph/siblings.py`: the is-finite check and "
                      "squared norm of a gradient, a weight's clipped gradient with its parameter and optimizer "
                      "state updates, chained so that values only the launch reads stay on chip); run apart, the "
                      f"same program takes {npu['apart'][0]:,} cycles and moves {npu['apart'][1] / 1e6:.1f} MB."]
    lines += ["", "The passes above count a sibling launch as one, for both programs (the captured one is grouped "
              "too)."]
    return lines


if __name__ == "__main__":
    print("\n".join(main()))
