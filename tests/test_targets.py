"""Targets as data, and calibration of the cpu target."""
import re
from pathlib import Path

import pytest

from superopt.cli import main
from superopt.extract import calibrate
from superopt.extract.target import available_targets, load_target

TARGETS = ["cpu", "gpu-a100", "gpu-h100", "npu-910", "npu-910b"]


def test_all_targets_load_with_their_kind_specific_figures():
    assert set(TARGETS) <= set(available_targets())
    for name in TARGETS:
        t = load_target(name)
        assert t.peak_flops > 0 and t.mem_bandwidth > 0 and t.launch_overhead > 0
        assert (t.gpu is not None) == (t.kind == "gpu") and (t.npu is not None) == (t.kind == "npu")
    assert load_target("npu-910b").npu.separated and not load_target("npu-910").npu.separated
    assert load_target("npu-910b").npu.ub_bytes == 192 * 1024
    assert load_target("gpu-h100").gpu.smem_per_sm > load_target("gpu-a100").gpu.smem_per_sm


@pytest.mark.parametrize("name", TARGETS)
def test_every_number_carries_its_source(name):
    lines = (Path(calibrate.__file__).parent / "targets" / f"{name}.toml").read_text().splitlines()
    for previous, line in zip([""] + lines, lines):
        bare_number = re.match(r"\s*\w+\s*=\s*[-0-9.e]+\s*$", line)
        if bare_number and not previous.lstrip().startswith("#"):
            pytest.fail(f"{name}: '{line.strip()}' has no source comment, inline or on the line above")


@pytest.mark.timing
def test_calibration_is_measured_cached_and_used(capsys):
    """--force: a busy machine's figures are stored too (calibrate refuses figures far below the defaults
    without it), so what this asserts does not depend on the machine's load."""
    assert not load_target("cpu").calibrated
    assert main(["calibrate", "--quick", "--force"]) == 0
    out = capsys.readouterr().out
    assert "GFLOP/s" in out and "GB/s" in out
    cpu = load_target("cpu")
    assert cpu.calibrated
    cached = calibrate.cached_calibration()
    assert cpu.peak_flops == cached["peak_flops"] > 1e8 and cpu.mem_bandwidth == cached["mem_bandwidth"] > 1e8
    calibrate.cache_path().unlink()
    assert not load_target("cpu").calibrated


def test_a_calibration_from_another_machine_is_ignored():
    path = calibrate.cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('machine = "some other machine"\npeak_flops = 1.0\nmatrix_flops = 1.0\nmem_bandwidth = 1.0\n')
    try:
        assert calibrate.cached_calibration() is None and not load_target("cpu").calibrated
    finally:
        path.unlink()


def test_the_elementwise_rate_is_bounded_by_what_the_machine_can_do(monkeypatch):
    """The elementwise rate is a difference of two timings; where they are nearly equal (noise), it counts at
    least half the chain's time and never exceeds the matrix rate of the same round (578.6 GFLOP/s had been
    reported on 2 cores)."""
    times = {"chain": 1.0e-3, "stream": 0.999e-3, "matmul": 1.0}
    monkeypatch.setattr(calibrate, "_best_time", lambda fn, args, repeats: (
        times["matmul"] if len(args) == 2 else times["chain"] if fn is chain_of[0] else times["stream"]))
    chain_of = []
    real_jit = calibrate.jax.jit

    def jit(f):
        compiled = real_jit(f)
        if f is calibrate._multiply_adds:
            chain_of.append(compiled)
        return compiled
    monkeypatch.setattr(calibrate.jax, "jit", jit)
    m = calibrate.measure(matmul_size=64, stream_mib=1, cache_mib=1, repeats=1, rounds=1)
    n = 1024 * 1024 // 4
    assert m.figures["peak_flops"] == min(2.0 * calibrate.CHAIN * n / (times["chain"] / 2), m.figures["matrix_flops"])
    assert m.figures["peak_flops"] <= m.figures["matrix_flops"]


def test_superopt_loads_its_target_once_and_the_report_keeps_it(monkeypatch):
    """The target travels as the Target `superopt()` loaded: no specialization loads it again, and the
    report holds it for explain and html."""
    import numpy as np
    from superopt import api, superopt as so
    from superopt.extract import target as target_module
    loads, load = [], target_module.load_target

    def counting(name):
        loads.append(name)
        return load(name)
    monkeypatch.setattr(api, "load_target", counting)
    monkeypatch.setattr(target_module, "load_target", counting)   # and any module that would look it up there
    fast = so(lambda x: x * 2.0 + 1.0, target="cpu", cache=False)
    fast(np.ones(4, np.float32))
    first = fast.report.target_spec
    fast(np.ones((2, 3), np.float32))
    assert loads == ["cpu"]
    assert first is fast.report.target_spec is fast.options.target
    assert first.name == fast.report.target == "cpu"
