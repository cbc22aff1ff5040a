"""User errors, on the command line and in the API: one clear line naming the bad value and the valid
ones, raised before any expensive work (CLI: exit status 2 and the line on stderr, no traceback)."""
import subprocess
import sys

import pytest

from superopt import Limits, superopt
from superopt.cli import main
from superopt.extract import calibrate
from test_cli import program  # noqa: F401 -- the fixture: a module file of two functions


@pytest.fixture
def no_optimizing(monkeypatch):
    """Fail the test if the pipeline starts: the error must come first."""
    def boom(*args, **kwargs):
        raise AssertionError("the optimization ran before the input error was reported")
    monkeypatch.setattr("superopt.api.optimize", boom)


def _one_line_error(capsys, *needles) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err and "\n" not in err and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


# ---- the command line ----

def test_too_few_shapes_name_the_parameter_count(program, capsys, no_optimizing):
    assert main(["optimize", program + ":chain", "--shapes", "4x4", "4x4"]) == 2
    _one_line_error(capsys, "chain takes 3 arguments (A, B, v), got 2 shapes", "--shapes 4x4 4x4")


def test_too_many_shapes_name_the_parameter_count(program, capsys, no_optimizing):
    assert main(["explain", program + ":layer", "--shapes", "4x4", "4x4", "4", "4"]) == 2
    _one_line_error(capsys, "layer takes 3 arguments (x, w, b), got 4 shapes")


def test_shapes_that_do_not_fit_name_the_shapes_and_the_error(program, capsys, no_optimizing):
    assert main(["optimize", program + ":chain", "--shapes", "4x4", "5x4", "4x1"]) == 2
    err = _one_line_error(capsys, "--shapes 4x4 5x4 4x1 do not fit chain:")
    assert "TypeError" in err or "ValueError" in err           # jax's own reason, its first line


def test_an_unwritable_html_path_is_reported_before_optimizing(program, tmp_path, capsys, no_optimizing):
    missing = tmp_path / "no-such-dir" / "r.html"
    assert main(["optimize", program + ":chain", "--shapes", "4x4", "4x4", "4x1", "--html", str(missing)]) == 2
    _one_line_error(capsys, f"cannot write --html {str(missing)!r}", "no directory")
    assert main(["optimize", program + ":chain", "--shapes", "4x4", "4x4", "4x1", "--html", str(tmp_path)]) == 2
    _one_line_error(capsys, "must end in .html or .htm")
    folder = tmp_path / "x.html"
    folder.mkdir()
    assert main(["explain", program + ":chain", "--shapes", "4x4", "4x4", "4x1", "--html", str(folder)]) == 2
    _one_line_error(capsys, "it is a directory")


def test_an_unwritable_timeline_path_is_reported_before_emulating(program, tmp_path, capsys, no_optimizing):
    missing = tmp_path / "nowhere" / "t.png"
    assert main(["emulate", program + ":layer", "--shapes", "4x4", "4x4", "4", "--timeline", str(missing)]) == 2
    _one_line_error(capsys, "cannot write --timeline", "no directory")
    assert main(["emulate", program + ":layer", "--shapes", "4x4", "4x4", "4", "--timeline",
                 str(tmp_path / "t.txt")]) == 2
    _one_line_error(capsys, "--timeline", "must end in .png or .json")


def test_unknown_target_and_negative_alternatives(program, capsys, no_optimizing):
    assert main(["optimize", program + ":chain", "--shapes", "4x4", "4x4", "4x1", "--target", "npu-9000"]) == 2
    _one_line_error(capsys, "unknown target 'npu-9000'; valid targets:", "cpu")
    assert main(["explain", program + ":chain", "--shapes", "4x4", "4x4", "4x1", "--alternatives", "-1"]) == 2
    _one_line_error(capsys, "--alternatives must be 0 or more, got -1")


@pytest.mark.slow
def test_the_command_exits_2_with_one_line_and_no_traceback(program):
    result = subprocess.run([sys.executable, "-m", "superopt.cli", "optimize", program + ":chain", "--shapes", "4x4"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert "chain takes 3 arguments (A, B, v), got 1 shape (--shapes 4x4)" in result.stderr


# ---- calibrate: refuses figures from a loaded machine, and can be reset ----

def _measurement(scale: float, rounds=None) -> calibrate.Measurement:
    figures = {k: v * scale for k, v in calibrate.shipped_defaults().items()}
    return calibrate.Measurement(figures, rounds or {k: [v] * 3 for k, v in figures.items()})


def test_calibrate_refuses_figures_far_below_the_defaults(monkeypatch, capsys):
    calibrate.reset()
    monkeypatch.setattr(calibrate, "measure", lambda **sizes: _measurement(0.09))
    assert main(["calibrate", "--quick"]) == 1
    captured = capsys.readouterr()
    assert "not stored: the machine looks loaded" in captured.err and "--force" in captured.err
    assert "peak f32 matmul: 10.8 GFLOP/s is less than 0.25 of the shipped default (120.0 GFLOP/s)" in captured.err
    assert "shipped defaults" in captured.out and "(0.09x)" in captured.out     # old and new figures
    assert calibrate.cached_calibration() is None
    assert main(["calibrate", "--quick", "--force"]) == 0
    assert calibrate.cached_calibration()["matrix_flops"] == pytest.approx(10.8e9)
    capsys.readouterr()
    assert main(["calibrate", "--reset"]) == 0
    out = capsys.readouterr().out
    assert f"removed {calibrate.cache_path()}" in out and "shipped defaults" in out
    assert calibrate.cached_calibration() is None
    assert main(["calibrate", "--reset"]) == 0
    assert "no calibration stored at" in capsys.readouterr().out


def test_calibrate_warns_when_its_runs_disagree(monkeypatch, capsys):
    calibrate.reset()
    m = _measurement(1.0)
    m.rounds["mem_bandwidth"] = [8.5e9, 3.0e9, 4.0e9]
    monkeypatch.setattr(calibrate, "measure", lambda **sizes: m)
    try:
        assert main(["calibrate", "--quick"]) == 0
        err = capsys.readouterr().err
        assert "warning: memory bandwidth: runs disagree by 2.8x (more than 1.5x" in err
        assert calibrate.cached_calibration()["mem_bandwidth"] == pytest.approx(8.5e9)
    finally:
        calibrate.reset()


def test_calibrate_help_says_where_the_figures_live(capsys):
    with pytest.raises(SystemExit):
        main(["calibrate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "cpu-calibration.toml in $SUPEROPT_CACHE_DIR, else $XDG_CACHE_HOME/superopt, else ~/.cache/superopt" in out
    assert "--reset" in out


# ---- the API ----

def chain(a, b, v):
    return (a @ b) @ v


def _message(exc_info) -> str:
    text = str(exc_info.value)
    assert "\n" not in text
    return text


def test_fn_must_be_callable():
    with pytest.raises(TypeError) as exc:
        superopt(42)
    assert _message(exc) == "superopt: fn must be callable, got int"


def test_one_rule_set_name_is_one_rule_set():
    fast = superopt(chain, rulesets="algebra")
    assert [ph.name for ph in fast.options.rulesets.phases] == ["algebra"]
    with pytest.raises(ValueError) as exc:
        superopt(chain, rulesets="nope")
    assert "unknown rule set 'nope'; known: algebra, casts, fusion, layout, quant" in _message(exc)
    with pytest.raises(TypeError) as exc:
        superopt(chain, rulesets=["algebra", 3])
    assert "rulesets must be rule set names or RuleSet objects, got 3 (int); known rule sets:" in _message(exc)


def test_limits_may_be_a_dict_of_its_fields():
    assert superopt(chain, limits={"seconds": 1}).options.limits == Limits(seconds=1)
    with pytest.raises(ValueError) as exc:
        superopt(chain, limits={"secs": 1})
    assert _message(exc) == ("superopt: unknown limit 'secs'; valid: iterations, nodes, seconds, saturation_seconds, "
                             "segment_seconds, memory, work")
    with pytest.raises(TypeError) as exc:
        superopt(chain, limits=5)
    assert "limits must be a Limits or a dict of its fields, got int" in _message(exc)


def test_the_decorator_form_checks_its_options_at_once():
    with pytest.raises(ValueError) as exc:
        superopt(target="npu-9000")
    assert "unknown target 'npu-9000'; valid targets:" in _message(exc)
    with pytest.raises(ValueError) as exc:
        superopt(extractor="best")
    assert "unknown extractor 'best'; valid: greedy, ilp" in _message(exc)
    with pytest.raises(ValueError) as exc:
        superopt(chain, backend="pallas")
    assert "backend 'pallas' is not available for target 'cpu'; valid: jax" in _message(exc)
