"""Reading rules in Tensat's published format (`rewrites/tensat.py`, `superopt rules import`) and judging
them by evaluating both sides on symbols (`rewrites/symbolic.py`). Tensat's files are not part of this
project; the lines here are written for these tests in their format, one per kind of verdict."""
from __future__ import annotations

from pathlib import Path

import jax
import pytest
import jax.numpy as jnp
import numpy as np

from superopt import superopt
from superopt.cli import main
from superopt.rewrites import symbolic
from superopt.rewrites.sexpr import format_rules, parse_rules
from superopt.rewrites.tensat import import_rules, looks_multi, parse, ruleset, summary

LINES = {
    "commute": "(ewadd ?input_1 ?input_2)=>(ewadd ?input_2 ?input_1)",
    "add-assoc": "(ewadd ?input_3 (ewadd ?input_1 ?input_2))=>(ewadd ?input_1 (ewadd ?input_2 ?input_3))",
    "matmul-assoc": "(matmul 0 (matmul 0 ?input_1 ?input_4) ?input_5)=>"
                    "(matmul 0 ?input_1 (matmul 0 ?input_4 ?input_5))",
    "wrong": "(ewadd ?input_1 ?input_2)=>(ewmul ?input_1 ?input_2)",
    "relu-fused": "(relu (matmul 0 ?input_1 ?input_4))=>(matmul 2 ?input_1 ?input_4)",
    "concat-of-adds": "(concat 1 2 (ewadd ?input_1 ?input_2) (ewadd ?input_3 ?input_4))=>"
                      "(ewadd (concat 1 2 ?input_1 ?input_3) (concat 1 2 ?input_2 ?input_4))",
    "split-k": "(ewadd (matmul 0 ?input_1 ?input_4) (matmul 0 ?input_2 ?input_5))=>"
               "(matmul 0 (concat 1 2 ?input_1 ?input_2) (concat 0 2 ?input_4 ?input_5))",
    "swapped": "(concat 1 2 (relu ?input_1) (relu ?input_2))=>(relu (concat 1 2 ?input_2 ?input_1))",
    "conv-relu": "(relu (conv2d 1 1 0 0 ?input_7 ?input_10))=>(conv2d 1 1 0 2 ?input_7 ?input_10)",
    "grouped-conv": "(concat 1 4 (conv2d 1 1 0 0 ?input_7 ?input_10) (conv2d 1 1 0 0 ?input_8 ?input_11))=>"
                    "(conv2d 1 1 0 0 (concat 1 4 ?input_7 ?input_8) (concat 0 4 ?input_10 ?input_11))",
    "unbound": "(relu ?input_1)=>(ewadd ?input_1 ?input_2)",
    "unknown-op": "(poolmax 3 3 1 1 0 0 ?input_1)=>(relu ?input_1)",
}
SPLIT = ("(matmul 0 ?input_1 ?input_4)=>(split_0 (split 1 (matmul 0 ?input_1 (concat 1 2 ?input_4 ?input_5))))\n"
         "(matmul 0 ?input_1 ?input_5)=>(split_1 (split 1 (matmul 0 ?input_1 (concat 1 2 ?input_4 ?input_5))))\n")


def verdicts():
    return dict(zip(LINES, import_rules("\n".join(LINES.values()))))


def test_each_rule_gets_the_verdict_its_arithmetic_deserves():
    v = verdicts()
    assert (v["commute"].status, v["commute"].numerics) == ("sound", "exact")
    # the same three terms added in another grouping: strict's "order"
    assert (v["add-assoc"].status, v["add-assoc"].numerics) == ("sound", "order")
    # re-associating a product holds over the reals only: a float32 counterexample shows it
    assert (v["matmul-assoc"].status, v["matmul-assoc"].numerics) == ("unsound", "reals")
    assert "differ" in v["matmul-assoc"].detail
    assert (v["wrong"].status, v["wrong"].numerics) == ("unsound", "")
    assert (v["relu-fused"].status, v["relu-fused"].numerics) == ("sound", "exact")
    assert (v["concat-of-adds"].status, v["concat-of-adds"].numerics) == ("sound", "exact")
    # one dot over K1 + K2 against two dots added: the same products, grouped otherwise
    assert (v["split-k"].status, v["split-k"].numerics) == ("sound", "order")
    assert v["swapped"].status == "unsound" and v["swapped"].numerics == ""
    assert (v["conv-relu"].status, v["conv-relu"].numerics) == ("sound", "exact")
    assert v["conv-relu"].rule is None and "NHWC" in v["conv-relu"].detail
    # TASO's grouped convolution equals the two convolutions only where both kernels have as many
    # output channels: the shapes drawn include ones where they do not
    assert v["grouped-conv"].status == "unsound" and v["grouped-conv"].numerics == ""
    assert v["unbound"].status == "unsupported" and "input_2" in v["unbound"].detail
    assert v["unknown-op"].status == "unsupported" and "poolmax is Tensat's, but" in v["unknown-op"].detail
    assert summary(list(v.values())) == "12 rules: parsed 10, sound 6, unsound 4, unsupported 2"


def test_labels_come_from_the_symbols_not_from_samples():
    """A label is the weakest over every output element and every drawn shape."""
    pairs = parse([LINES["add-assoc"]])
    draws = symbolic.shapes(pairs)
    assert len(draws) == 3 and len({tuple(sorted(d.items())) for d in draws}) == 3
    assert symbolic.label(pairs, draws) == "order"
    assert symbolic.float_counterexample(parse([LINES["commute"]]), symbolic.shapes(parse([LINES["commute"]]))) == ""


def test_a_multi_pattern_rule_is_two_lines_and_splits_where_its_concat_joins():
    (v,) = import_rules(SPLIT, multi=True)
    assert (v.status, v.numerics) == ("sound", "exact"), v
    assert len(v.rule.pairs) == 2 and v.rule.name == "tensat-multi-1"
    (alone,) = import_rules(SPLIT.splitlines()[0])   # alone, its right side names ?input_5
    assert alone.status == "unsupported" and "input_5" in alone.detail


def test_sound_imported_rules_join_a_schedule_and_round_trip_through_the_text_format():
    v = import_rules("\n".join([LINES["commute"], LINES["concat-of-adds"],
                                "(concat 1 2 (matmul 0 ?input_1 ?input_4) (matmul 0 ?input_1 ?input_5))=>"
                                "(matmul 0 ?input_1 (concat 1 2 ?input_4 ?input_5))"]))
    rules = ruleset(v)
    assert [r.name for r in rules] == ["tensat-1", "tensat-2", "tensat-3"]
    text = format_rules(list(rules))
    assert format_rules(parse_rules(text)) == text
    rng = np.random.default_rng(0)
    x, w1, w2 = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((8, 16), (16, 12), (16, 4)))
    fn = lambda x, w1, w2: jax.nn.relu(jnp.concatenate([x @ w1, x @ w2], axis=1))   # noqa: E731
    fast = superopt(fn, rulesets=("algebra", rules))
    spec = fast.compile(x, w1, w2)
    assert spec.report.run.matches.get("tensat-3", 0) > 0, spec.report.run.fired
    np.testing.assert_allclose(np.asarray(fast(x, w1, w2)), np.asarray(fn(x, w1, w2)), rtol=1e-5, atol=1e-5)


def test_the_command_prints_a_verdict_per_rule_and_the_counts(tmp_path, capsys):
    path = tmp_path / "rules.txt"
    path.write_text("\n".join([LINES["commute"], LINES["matmul-assoc"], LINES["unknown-op"]]) + "\n")
    out_rules = tmp_path / "sound.rules"
    assert main(["rules", "import", str(path), "--dialect", "tensat", "--write", str(out_rules)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "sound (exact)" in out[0] and "holds over the reals" in out[1]
    assert out[-2] == "3 rules: parsed 2, sound 1, unsound 1, unsupported 1"
    assert [r.name for r in parse_rules(out_rules.read_text())] == ["tensat-1"]
    assert main(["rules", "import", str(tmp_path / "missing.txt")]) == 2


# ---- Tensat's two published files (beside the project, in ../shared/data/tensat: not part of it) ----

TENSAT_FILES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tensat"


@pytest.mark.slow
@pytest.mark.parametrize("name, multi, rules", [("converted.txt", False, 120), ("converted_multi.txt", True, 13)])
def test_tensats_published_files_import_with_a_verdict_for_every_rule(name, multi, rules, capsys):
    """Every rule of both files gets a verdict (sound or unsound, none unsupported: every operator they use
    is modelled); the multi-pattern file is read as pairs without being told (`looks_multi`)."""
    path = TENSAT_FILES / name
    text = path.read_text(encoding="utf-8")
    assert looks_multi(text) is multi
    verdicts = import_rules(text)
    assert len(verdicts) == rules
    assert all(v.status in ("sound", "unsound") for v in verdicts), [v for v in verdicts if v.status == "unsupported"]
    assert sum(v.status == "sound" for v in verdicts) > rules // 2
    assert main(["rules", "import", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == summary(verdicts)
    assert ("read as multi-pattern rules" in "\n".join(out)) is multi


def test_a_multi_pattern_file_read_as_single_rules_says_to_pass_multi(tmp_path, capsys):
    """Told it is single rules (or a file whose pairs do not bind each other), the unbound lines are named
    and the last line before the summary says --multi is needed."""
    assert looks_multi(SPLIT) and not looks_multi("\n".join(LINES.values()))
    odd = tmp_path / "odd.txt"
    odd.write_text(SPLIT + LINES["commute"] + "\n")            # three lines: not pairs
    assert not looks_multi(odd.read_text())
    assert main(["rules", "import", str(odd)]) == 0
    out = capsys.readouterr().out
    assert "pass --multi" in out and "2 lines name variables" in out, out
