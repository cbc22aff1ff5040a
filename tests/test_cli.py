"""The `superopt` command line."""
import subprocess
import sys

import pytest

from superopt.cli import main
from bench.run import main as bench_main


def test_rules_list(capsys):
    assert main(["rules", "list", "--ruleset", "algebra"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("algebra (") and "matmul-assoc" in out and "rulesets/algebra.py:" in out


def test_rules_list_unknown_ruleset(capsys):
    assert main(["rules", "list", "--ruleset", "nope"]) == 2
    assert "unknown rule set 'nope'; known: algebra" in capsys.readouterr().err


@pytest.mark.slow
def test_rules_check_named_rules(capsys):
    assert main(["rules", "check", "matmul-assoc", "neg-neg", "--examples", "20"]) == 0
    out = capsys.readouterr().out
    assert "checked 2 rules on 40 cases: all sound" in out


@pytest.mark.slow
def test_rules_check_fails_on_an_unsound_rule(monkeypatch, capsys):
    from superopt import rulesets
    from superopt.rewrites.pattern import exp, tensors
    from superopt.rewrites.rule import RuleSet, rule
    x, = tensors("x")
    bad = RuleSet("bad", [rule("exp-is-identity", exp(x), x, doc="wrong")])
    monkeypatch.setitem(rulesets.RULESETS, "bad", bad)
    assert main(["rules", "check", "exp-is-identity", "--examples", "20"]) == 1
    out = capsys.readouterr().out
    assert "UNSOUND" in out and "problem:" in out and "1 failed: exp-is-identity" in out


def test_rules_check_unknown_rule(capsys):
    assert main(["rules", "check", "no-such-rule"]) == 2
    assert "no rule named no-such-rule" in capsys.readouterr().err


@pytest.mark.slow
def test_console_script_is_installed():
    result = subprocess.run([sys.executable, "-m", "superopt.cli", "rules", "list"], capture_output=True, text=True)
    assert result.returncode == 0 and "transpose-of-transpose" in result.stdout


# ---- optimize, explain, emulate, bench, --html ----

import base64  # noqa: E402
import json  # noqa: E402
import xml.etree.ElementTree as ET  # noqa: E402
from html.parser import HTMLParser  # noqa: E402

import re  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

from superopt import html as html_report  # noqa: E402
from superopt.cli import function_and_args, parse_shape  # noqa: E402

PROGRAM = '''
import jax

def chain(A, B, v):
    return (A @ B) @ v

def layer(x, w, b):
    return jax.nn.relu(x @ w + b)
'''


@pytest.fixture
def program(tmp_path):
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM)
    return str(path)


def test_shapes_are_read_with_their_dtypes():
    assert parse_shape("128x768") == ((128, 768), "float32")
    assert parse_shape("4x8:f16") == ((4, 8), "float16")
    assert parse_shape("scalar:i32") == ((), "int32")
    with pytest.raises(ValueError, match="cannot read the shape"):
        parse_shape("4xq")


@pytest.mark.parametrize("suffix, name", [("f64", "float64"), ("float64", "float64"), ("c64", "complex64"),
                                          ("complex64", "complex64"), ("c128", "complex128"), ("u16", "uint16"),
                                          ("i8", "int8"), ("bf16", "bfloat16"), ("bfloat16", "bfloat16"),
                                          ("int4", "int4"), ("float8_e4m3fn", "float8_e4m3fn")])
def test_shape_dtypes_are_short_names_in_bits_or_full_names(suffix, name):
    assert parse_shape(f"2x3:{suffix}") == ((2, 3), name)


@pytest.mark.parametrize("suffix", ["f8", "u4", "i4", "<f4", "float", "f99"])
def test_numpys_byte_codes_and_unknown_dtypes_are_refused_in_one_line(suffix):
    """numpy's f8 is float64 and its u4 uint32 (bytes), superopt's short names count bits: such a code is
    refused, not guessed (f8 had become float32 and u4 uint32)."""
    with pytest.raises(ValueError, match=rf"unknown dtype '{re.escape(suffix)}'") as err:
        parse_shape(f"2x3:{suffix}")
    assert "\n" not in str(err.value) and "f16" in str(err.value) and "float64" in str(err.value)


@pytest.mark.slow
def test_a_float64_shape_runs_in_float64(program, capsys):
    """--shapes ...:f64 turns on x64 for the command (not for its caller) and the program runs in float64."""
    assert main(["optimize", program + ":chain", "--shapes", "8x8:f64", "8x8:f64", "8x8:f64"]) == 0
    out = capsys.readouterr().out
    assert "f64[8,8]" in out or "float64" in out, out
    assert not jax.config.jax_enable_x64


@pytest.mark.slow
def test_a_function_needs_shapes_unless_it_is_a_workload(program):
    with pytest.raises(ValueError, match="--shapes"):
        function_and_args(program + ":chain", None)
    fn, args, name = function_and_args("superopt.workloads:reassoc_chain", None)
    assert name == "reassoc-chain" and [a.shape for a in args] == [(1024, 1024), (1024, 1024), (1024, 1)]
    with pytest.raises(ValueError, match="expected MODULE:FN"):
        function_and_args("no_colon_here", None)


@pytest.mark.slow
def test_optimize_prints_the_report_and_the_chosen_program(program, capsys):
    assert main(["optimize", program + ":chain", "--shapes", "256x256", "256x256", "256x1", "--print-term",
                 "--numerics", "fast"]) == 0
    out = capsys.readouterr().out
    assert "superopt report (target cpu)" in out and "outcome      : optimized" in out
    assert "matmul-assoc" in out and "numerics     : fast; rewrites that can change overflow fired" in out
    # the chosen program multiplies B @ v first: a matmul whose result is a 256x1 column, fed to the second
    assert out.count("matmul(") >= 2 and "f32[256,1]" in out.split("return")[0]


@pytest.mark.slow
def test_optimize_is_strict_by_default_and_says_what_it_left_out(program, capsys):
    assert main(["optimize", program + ":chain", "--shapes", "256x256", "256x256", "256x1"]) == 0
    out = capsys.readouterr().out
    assert "numerics     : strict;" in out and "rules that can change overflow left out" in out
    # re-associating runs only behind a check of the arguments (extract/guard.py), and the report says so
    assert "matmul-assoc" not in out.replace("with rules equal over the reals: matmul-assoc", "")
    assert "guarded: runs where every element of arguments 0, 1, 2 is finite" in out
    with pytest.raises(SystemExit) as exit_:
        main(["optimize", program + ":chain", "--shapes", "4x4", "4x4", "4x1", "--numerics", "loose"])
    assert exit_.value.code == 2 and "invalid choice: 'loose'" in capsys.readouterr().err


@pytest.mark.slow
def test_optimize_takes_a_memory_budget_and_says_what_it_did(program, capsys):
    assert main(["optimize", program + ":chain", "--shapes", "256x256", "256x256", "256x1",
                 "--memory-budget", "1KB"]) == 0
    out = capsys.readouterr().out
    assert "memory budget: budget of 1.0 KB is below the" in out
    assert main(["optimize", program + ":chain", "--shapes", "4x4", "4x4", "4x1", "--memory-budget", "lots"]) == 2
    assert "cannot read memory_budget 'lots'" in capsys.readouterr().err


def test_optimize_reports_an_unknown_module(capsys):
    assert main(["optimize", "no_such_module_xyz:f", "--shapes", "2x2"]) == 2
    assert "cannot import 'no_such_module_xyz'" in capsys.readouterr().err


@pytest.mark.slow
def test_explain_names_rules_with_sources_and_prices_every_launch(program, capsys):
    assert main(["explain", program + ":layer", "--shapes", "64x128", "128x256", "256", "--target", "gpu-h100",
                 "--alternatives", "3"]) == 0
    out = capsys.readouterr().out
    assert "Rules that fired, by phase" in out and "phase fusion:" in out
    assert "rulesets/fusion.py:" in out          # where each rule that fired is declared
    chosen = out.split("chosen program (")[1].split("original program")[0]
    assert "kernel{" in chosen and "regs" in chosen and "occupancy" in chosen   # the GPU model's own factors
    # the program that runs is listed first, at 1.00x, then the e-graph's others, cheapest first
    listing = out.split("Programs in the e-graph")[1].splitlines()[1:]
    assert listing[0].strip().startswith("#1") and "1.00x the one that runs" in listing[0]
    assert listing[0].endswith(("(chosen)", "(chosen, guarded)", "(the original, kept)"))
    ratios = [float(line.split("x the one that runs")[0].split()[-1]) for line in listing
              if "x the one that runs" in line]
    assert ratios[1:] == sorted(ratios[1:]) and len(ratios) >= 2
    shown = [line.split(None, 1)[1] for line in listing if "x the one that runs" in line]
    assert len(set(shown)) == len(shown)        # distinct programs only, each with its launches by op
    assert all("launch" in line and ": " in line for line in shown)


@pytest.mark.slow
def test_emulate_writes_the_timeline(program, tmp_path, capsys):
    png, trace = tmp_path / "t.png", tmp_path / "t.json"
    assert main(["emulate", program + ":layer", "--shapes", "64x128", "128x256", "256", "--timeline", str(png)]) == 0
    out = capsys.readouterr().out
    assert "superopt emulate (npu-910b)" in out and "cycles" in out and "original program" in out
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert main(["emulate", program + ":layer", "--shapes", "64x128", "128x256", "256", "--dtype", "float16",
                 "--timeline", str(trace)]) == 0
    assert "fp16 cube operands" in capsys.readouterr().out
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("ph") == "X" and e["dur"] > 0 for e in events)


@pytest.mark.slow
def test_emulate_says_why_a_program_does_not_run_on_the_emulator(program, capsys):
    """npu-910's cube multiplies float32 operands in fp16 only, beyond float32's tolerance of the program."""
    assert main(["emulate", program + ":layer", "--shapes", "64x128", "128x256", "256", "--target", "npu-910"]) == 1
    assert "the npu-910 cube takes no fp32 operands" in capsys.readouterr().err


def test_emulate_refuses_a_target_that_is_not_an_npu(program, capsys):
    assert main(["emulate", program + ":layer", "--shapes", "4x4", "4x4", "4", "--target", "cpu"]) == 2
    assert "emulate runs NPU targets" in capsys.readouterr().err


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.hrefs, self.imgs, self.tables, self.stack = set(), [], [], 0, []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.ids.add(a.get("id"))
        self.hrefs += [a["href"]] if tag == "a" and "href" in a else []
        self.imgs += [a["src"]] if tag == "img" else []
        self.tables += tag == "table"


def _svgs(text: str) -> list:
    """Each inline SVG, parsed as XML (it must be well formed)."""
    chunks = text.split("<svg")[1:]
    return [ET.fromstring("<svg" + c.split("</svg>")[0] + "</svg>") for c in chunks]


@pytest.mark.slow
@pytest.mark.parametrize("drawn_by", ["built-in layout", "graphviz"])
def test_the_html_report_is_self_contained_with_graphs_costs_and_timeline(drawn_by, program, tmp_path, capsys,
                                                                          monkeypatch):
    import shutil
    if drawn_by == "graphviz" and shutil.which("dot") is None:
        pytest.skip("graphviz is not installed (the built-in layout is tested without it)")
    if drawn_by == "built-in layout":
        monkeypatch.setattr(html_report.shutil, "which", lambda name: None)
    page = tmp_path / "report.html"
    assert main(["emulate", program + ":layer", "--shapes", "64x128", "128x256", "256", "--timeline",
                 str(tmp_path / "t.png"), "--html", str(page)]) == 0
    text = page.read_text()
    assert html_report.check(text) == []
    parsed = _Page()
    parsed.feed(text)
    # every link is an anchor of the page, and every section the navigation names exists
    assert parsed.hrefs and all(h.startswith("#") and h[1:] in parsed.ids for h in parsed.hrefs)
    assert {"summary", "rules", "graphs", "costs", "timeline"} <= parsed.ids
    # the timeline is an inline PNG that decodes to an image
    (src,) = parsed.imgs
    import io
    import matplotlib.image
    image = matplotlib.image.imread(io.BytesIO(base64.b64decode(src.split(",", 1)[1])), format="png")
    assert image.shape[0] > 100 and image.shape[1] > 100
    # the term graphs before and after, one drawn box per live node of each program
    before, after = _svgs(text)
    assert "matmul" in "".join(before.itertext()) and "kernel{" in "".join(after.itertext())
    assert ("graphviz (dot)" if drawn_by == "graphviz" else "built-in layered layout") in text
    assert "cost table" in text.lower() and parsed.tables >= 3
    assert "rulesets/fusion.py:" in text


def test_the_fallback_graph_drawing_has_a_box_per_node_and_an_arrow_per_edge():
    import jax.numpy as jnp
    from superopt.egraph.capture import capture
    graph = capture(lambda x, w: jnp.tanh(x @ w) + x @ w, (jnp.ones((4, 8)), jnp.ones((8, 4)))).graph
    svg, how = html_report.graph_svg(graph, use_dot=False, uid="t")
    assert how == "the built-in layered layout"
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    live = graph.live()
    assert len(list(root.iter(ns + "rect"))) == len(live)
    assert len(list(root.iter(ns + "path"))) - 1 == sum(len(graph.nodes[i].inputs) for i in live)  # - the marker


def test_the_page_checker_finds_broken_links_and_outside_images():
    bad = '<a href="#nowhere">x</a><img src="figure.png"><script src="https://example.invalid/x.js"></script>'
    problems = html_report.check(bad)
    assert len(problems) == 3 and "points nowhere" in problems[0] and "not an inline PNG" in problems[1]


@pytest.mark.slow
def test_bench_regenerates_its_markdown_and_plots(tmp_path, capsys):
    out, figures = tmp_path / "B.md", tmp_path / "figs"
    assert bench_main(["--filter", "^gemm-chain-g10$", "--sections", "table,tiling", "--repeats", "1",
                 "--rounds", "1", "--output", str(out), "--figures", str(figures)]) == 0
    text = out.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| gemm-chain-g10 | GEMM chain"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "optimized" and int(cells[5]) > 0 and float(cells[6]) > 0     # outcome, e-nodes, seconds
    run_row = next(line for line in text.splitlines() if line.startswith("| gemm-chain-g10 | ") and line is not row
                   and "GEMM chain" not in line)
    assert float(run_row.split("|")[4]) > 0                                           # the measured ratio
    assert "| npu-910 | G10 |" in text and "| gpu-a100 | G10 |" in text              # the tiling section
    links = [part.split(")")[0] for part in text.split("](")[1:]]
    assert len(links) == 2
    for link in links:                                                                 # every plot exists
        assert (out.parent / link).read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_a_partial_bench_run_leaves_benchmarks_md_alone_and_says_what_it_does(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)                 # where BENCHMARKS.md and docs/figures would be
    assert bench_main(["--filter", "^gemm-chain-g10$", "--sections", "tiling", "--repeats", "1",
                 "--rounds", "1"]) == 0
    err = capsys.readouterr().err               # not a terminal: one line per step on stderr
    assert "bench: 0 workload(s) in the main table, sections tiling; a partial run, writing " \
           "build/bench/BENCHMARKS.partial.md" in err
    assert "bench: section tiling" in err
    assert "wrote build/bench/BENCHMARKS.partial.md and plots in build/bench/figures (a partial run:" in err
    assert not (tmp_path / "BENCHMARKS.md").exists() and not (tmp_path / "docs").exists()
    text = (tmp_path / "build" / "bench" / "BENCHMARKS.partial.md").read_text()
    assert "| npu-910 | G10 |" in text
    link = text.split("](")[1].split(")")[0]
    assert (tmp_path / "build" / "bench" / link).read_bytes().startswith(b"\x89PNG")


def test_bench_rejects_what_matches_nothing(capsys):
    assert bench_main(["--filter", "^no-such-workload$", "--output", "/dev/null"]) == 2
    assert "nothing matches" in capsys.readouterr().err
    assert bench_main(["--sections", "table,nonsense"]) == 2
    assert "unknown section(s) nonsense" in capsys.readouterr().err


@pytest.mark.slow
def test_saturation_shows_progress_on_a_terminal_and_nothing_otherwise(program, capsys, monkeypatch):
    from superopt import superopt
    from superopt.core import progress
    import jax.numpy as jnp
    args = (jnp.ones((32, 32)), jnp.ones((32, 32)), jnp.ones((32, 1)))
    fn, _, _ = function_and_args(program + ":chain", ["32x32", "32x32", "32x1"])
    with progress.bars():                       # stderr is captured here, not a terminal: quiet
        superopt(fn, target="cpu").compile(*args)
    assert capsys.readouterr().err == ""
    seen = []
    with progress.bars(enabled=True) as live:   # as on a terminal
        monkeypatch.setattr(live, "update", lambda task, **kw: seen.append(kw.get("description")))
        superopt(fn, target="cpu", cache=False).compile(*args)   # the cache would skip saturating again
    assert "saturate: phase algebra, iteration 1" in seen


@pytest.mark.slow
def test_rules_check_in_worker_processes(capsys):
    assert main(["rules", "check", "--jobs", "2", "fold-max", "matmul-int8"]) == 0
    out = capsys.readouterr().out
    assert out.index("algebra/fold-max") < out.index("quant/matmul-int8")   # printed in registered order
    assert out.splitlines()[-1] == "checked 2 rules on 120 cases: all sound"


def test_rules_check_bad_arguments_are_one_line_errors(capsys):
    for argv, message in [(["--jobs", "2", "neg-neg", "no-such-rule"],
                           "superopt: no rule named no-such-rule; see `superopt rules list`"),
                          (["--jobs", "0", "neg-neg"], "superopt: --jobs must be at least 1, got 0")]:
        assert main(["rules", "check", *argv]) == 2
        assert capsys.readouterr().err == message + "\n"


def test_the_search_limits_are_options(program, capsys):
    """optimize, explain and emulate take the limits a report's "time limit" outcome names."""
    from superopt.cli import limits_of, parser
    args = parser().parse_args(["optimize", program + ":chain", "--shapes", "8x8", "8x8", "8x8", "--seconds", "5",
                                "--saturation-seconds", "0.5", "--iterations", "3", "--nodes", "2000"])
    limits = limits_of(args)
    assert (limits.seconds, limits.saturation_seconds, limits.iterations, limits.nodes) == (5, 0.5, 3, 2000)
    for command in ("explain", "emulate"):
        assert limits_of(parser().parse_args([command, program + ":chain", "--iterations", "2"])).iterations == 2
    assert main(["optimize", program + ":chain", "--shapes", "8x8", "8x8", "8x8", "--iterations", "0"]) == 2
    assert "Limits.iterations must be positive, got 0" in capsys.readouterr().err
    assert main(["optimize", program + ":chain", "--shapes", "64x64", "64x64", "64x1", "--saturation-seconds",
                 "0.000001"]) == 0
    assert "time limit" in capsys.readouterr().out


@pytest.mark.slow
def test_ctrl_c_is_one_line_and_status_130(tmp_path):
    """Ctrl-C while a command works prints one line (no traceback) and exits 130, as shells expect."""
    import signal
    import time
    marker = tmp_path / "started"
    (tmp_path / "slow.py").write_text(
        "import pathlib, time\n"
        f"def slow(x):\n    pathlib.Path({str(marker)!r}).touch()\n    time.sleep(120)\n    return x\n")
    # started as a shell starts a foreground command, SIGINT handled: a process that inherits SIGINT ignored
    # keeps it ignored (Python then installs no KeyboardInterrupt), and a library in this worker may have set
    # that before (seen in the full suite: the command never heard the Ctrl-C)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "superopt", "optimize", str(tmp_path / "slow.py") + ":slow",
                                 "--shapes", "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, inherited)
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert marker.exists(), proc.communicate()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert err.strip() == "superopt: interrupted", err


USER_RULES = '''
from superopt.rewrites.pattern import dtypes, matmul, neg, tensors
from superopt.rewrites.rule import RuleSet, rule, when

x, y = tensors("x y")
d, = dtypes("d")

MINE = RuleSet("mine", [rule("my-neg-through-matmul", matmul(neg(x), y, d), neg(matmul(x, y, d)),
                             when("has_dtype", x, d), two_way=True, numerics="rounding", doc="(-x)@y <-> -(x@y)")])
'''


def test_a_users_rule_file_is_checked_and_used_from_the_command_line(tmp_path, monkeypatch, capsys):
    """`rules check FILE` checks a researcher's rules (Python or the text format), naming each rule's source
    as a path the reader can open; `optimize --rules FILE` runs them after the default rule sets."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_rules.py").write_text(USER_RULES)
    assert main(["rules", "check", "my_rules.py", "--examples", "20"]) == 0
    out = capsys.readouterr().out
    assert "sound     mine/my-neg-through-matmul" in out and "[my_rules.py:8]" in out, out
    assert out.strip().endswith("checked 1 rules on 20 cases: all sound"), out
    (tmp_path / "mine.rules").write_text('(rule my-double-neg (neg (neg ?x)) => ?x :doc "twice negated")\n')
    assert main(["rules", "check", "mine.rules", "--examples", "20"]) == 0
    assert "my-double-neg" in capsys.readouterr().out
    (tmp_path / "prog.py").write_text("def f(x, w):\n    return (-x) @ w\n")
    assert main(["optimize", "prog.py:f", "--shapes", "64x8", "8x64", "--rules", "my_rules.py"]) == 0
    assert "my-neg-through-matmul" in capsys.readouterr().out
    (tmp_path / "empty.py").write_text("x = 1\n")
    assert main(["rules", "check", "empty.py"]) == 2
    assert "defines no rule" in capsys.readouterr().err


def test_a_reader_that_leaves_early_is_no_error(program):
    """`superopt optimize ... | head -1`, or a reader gone before the first line: the closed pipe ends the command quietly (status 141, as SIGPIPE
    would), with no traceback."""
    done = subprocess.run(f"{sys.executable} -m superopt optimize {program}:chain --shapes 8x8 8x8 8x1 | true",
                          shell=True, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr


# ---- arguments are refused before JAX is imported ----

REFUSED = [
    (["optimize", "superopt.workloads:reassoc_chain", "--target", "nosuch"],
     "superopt: unknown target 'nosuch'; valid targets: cpu, gpu-a100, gpu-h100, npu-910, npu-910b"),
    (["explain", "superopt.workloads:reassoc_chain", "--shapes", "4x4:f8"], "unknown dtype 'f8'"),
    (["emulate", "superopt.workloads:reassoc_chain", "--dtype", "float"], "unknown dtype 'float'"),
    (["optimize", "no_such_file.py:f", "--shapes", "4"], "superopt: no file no_such_file.py"),
    (["optimize", "no_such_module_xyz:f"], "cannot import 'no_such_module_xyz'"),
    (["optimize", "superopt.workloads:reassoc_chain", "--rules", "no_such_rules.py"],
     "superopt: no rule file 'no_such_rules.py'"),
    (["optimize", "superopt.workloads:reassoc_chain", "--numerics", "loose"],
     "invalid choice: 'loose' (choose from 'strict', 'fast')"),
    (["rules", "check", "no_such_rules.py"], "superopt: no rule file 'no_such_rules.py'"),
    (["rules", "synthesize", "--size", "1"], "superopt: --size must be at least 2, got 1"),
]


def test_bad_arguments_are_refused_in_one_line_before_jax_is_imported(tmp_path):
    """A mistyped argument is refused at once: JAX takes seconds to import (a bad --target took 22 s to be
    refused on a loaded machine). Each command runs in a fresh interpreter, through `superopt.cli.main`."""
    probe = ("import json, sys\nfrom superopt.cli import main\ntry:\n    code = main(sys.argv[1:])\n"
             "except SystemExit as exc:\n    code = exc.code\n"
             "print(json.dumps([code, 'jax' in sys.modules]))\n")
    for argv, message in REFUSED:
        done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120,
                              cwd=tmp_path)
        assert json.loads(done.stdout) == [2, False], (argv, done.stdout, done.stderr)
        assert message in done.stderr and done.stderr.count("\n") == 1, (argv, done.stderr)


def test_the_targets_are_listed_without_importing_their_module():
    from superopt import available_targets
    from superopt.cli import target_names
    assert target_names() == available_targets()


def test_an_executor_that_cannot_start_is_one_line(monkeypatch, capsys):
    """$SUPEROPT_EXECUTOR=ray without Ray, or its cluster unreachable: one line (workers.ExecutorError), status 1."""
    from superopt import cli, workers

    def unreachable(args, **kwargs):
        raise workers.ExecutorError("superopt: cannot connect to the Ray cluster at RAY_ADDRESS=x (...)")
    monkeypatch.setattr(cli, "_compile", unreachable)
    assert main(["optimize", "superopt.workloads:reassoc_chain"]) == 1
    assert capsys.readouterr().err == "superopt: cannot connect to the Ray cluster at RAY_ADDRESS=x (...)\n"


@pytest.mark.slow
def test_rules_check_on_worker_processes_checks_rules_guarded_by_facts():
    """Found running `rules check --thorough`: with two workers it hung for good at the first rule guarded by
    a fact. The workers were forked from a fork server that had imported the rule sets (and egglog's thread
    pool with them); a worker dropping the e-graph of the fact checks waited on pool threads it did not have."""
    done = subprocess.run([sys.executable, "-m", "superopt", "rules", "check", "--examples", "3", "--jobs", "2",
                           "exp-of-log-of-nonneg", "abs-of-nonneg"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "checked 2 rules on 6 cases: all sound" in done.stdout, done.stdout[-2000:]
