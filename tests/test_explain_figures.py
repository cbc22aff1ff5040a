"""Every view of one result prints the same figures (issue 57, item 6): `optimize`'s report, `explain`'s text and
`explain --html` agree on the cost before and after, their tables of launches total those costs, the list of
programs starts with the one that runs at that cost, and a guarded program's guard is named with its check priced."""
import html
import re

import jax
import jax.numpy as jnp
import pytest

from superopt import superopt
from superopt.cli import main
from superopt.explain import alternatives, explain, launches, programs
from superopt.extract.target import load_target
from superopt.workloads import reassoc_chain

_TIME = r"(\d+(?:\.\d+)?) (us|ms|s)\b"
_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0}

ATTENTION = '''
import jax

def attention(q, k, v):
    return jax.nn.softmax(q @ k.T / 8.0, axis=-1) @ v
'''


def _time(number: str, unit: str) -> tuple[float, float]:
    """(seconds, half a unit of the last printed digit) of a time as `report._fmt_time` prints it."""
    decimals = len(number.partition(".")[2])
    return float(number) * _UNIT[unit], 0.5 * 10.0 ** -decimals * _UNIT[unit]


def _close(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return abs(a[0] - b[0]) <= a[1] + b[1]


def _total(times: list[tuple[float, float]]) -> tuple[float, float]:
    """The sum of printed times, within the rounding of each."""
    return sum(t for t, _ in times), sum(h for _, h in times)


def _costs(line: str) -> tuple[tuple, tuple]:
    """(before, after) of a `A -> B per call` cost line."""
    m = re.search(_TIME + " -> " + _TIME + " per call", line)
    assert m, line
    return _time(m[1], m[2]), _time(m[3], m[4])


def _section(text: str, start: str, end: str | None) -> str:
    assert start in text, f"no {start!r} in:\n{text}"
    body = text.split(start, 1)[1]
    return body.split(end, 1)[0] if end and end in body else body


def _table(text: str, title: str) -> tuple[int, tuple, list[tuple]]:
    """(launches, total, each row's time) of `explain`'s table whose title starts with `title`."""
    head = re.search(re.escape(title) + r" \((\d+) launch(?:es)?, " + _TIME, text)
    assert head, f"no table {title!r} in:\n{text}"
    rows = []
    for line in text[head.end():].splitlines()[2:]:
        row = re.match(r"\s+" + _TIME + r"\s+[\d.]+%\s+g?%\d+ ", line)
        if row:
            rows.append(_time(row[1], row[2]))
        elif not line.startswith(" " * 20):   # past the rows and their detail lines
            break
    return int(head[1]), _time(head[2], head[3]), rows


def _listing(text: str) -> list[str]:
    return [line for line in _section(text, "Programs in the e-graph", None).splitlines() if line.strip().startswith("#")]


def _check_explain(text: str, report: str) -> None:
    """`explain`'s text against itself and against `optimize`'s report of the same program."""
    before, after = _costs(_section(text, "cost (model):", "\n"))
    assert (before, after) == _costs(_section(report, "cost (model) :", "\n"))   # the same digits
    counts = re.search(r"(\d+) launch(?:es)? -> (\d+)", _section(text, "cost (model):", "\n"))
    n_after, total_after, rows_after = _table(text, "chosen program")
    assert _close(total_after, after) and _close(_total(rows_after), after), text
    assert n_after == len(rows_after) == int(counts[2])
    if "outcome     : optimized" in text:
        n_before, total_before, rows_before = _table(text, "original program")
        assert _close(total_before, before) and _close(_total(rows_before), before), text
        assert n_before == len(rows_before) == int(counts[1])
    first = _listing(text)[0]
    assert first.strip().startswith("#1 ") and "1.00x the one that runs" in first
    assert ("(chosen" if "outcome     : optimized" in text else "(the original, kept)") in first
    assert _close(_time(*re.search(_TIME, first).groups()), after), first
    # the report's costliest ops are the first rows of explain's table of the chosen program
    top = [_time(*re.match(r"\s+" + _TIME, line).groups())
           for line in _section(report, "costliest ops of the chosen program:", "  runs on").splitlines()
           if re.match(r"\s+" + _TIME + "  ", line)]
    assert top and all(_close(a, b) for a, b in zip(top, rows_after)), (top, rows_after)
    guard = re.search(r"guarded: .*", _section(report, "cost (model) :", "\n"))
    if guard:   # named in the same words, and its check's launches are rows of the chosen program's table
        assert guard[0] in text and "(chosen, guarded)" in first
        assert "guard check: " in _section(text, "chosen program (", "original program")
        assert "; g%k: the guard's check" in _section(text, "chosen program (", "\n")
    else:
        assert "guard check" not in text and "guarded" not in text


def _check_html(page: str, text: str) -> None:
    """The page's summary and cost tables against `explain`'s text."""
    page = html.unescape(page)
    cell = re.search(r"<th>cost \(model\)</th><td>([^<]*)</td>", page)
    assert cell and _costs(cell[1]) == _costs(_section(text, "cost (model):", "\n"))
    costs = _section(page, '<h2 id="costs">', '<h2 id="timeline">')
    for title in ("chosen program", "original program"):
        if f"{title} (" not in text.split("Programs in the e-graph")[0]:
            continue
        n, total, rows = _table(text, title)
        table = _section(costs, f"<h3>{title} (", "</table>")
        shown = [_time(a, b) for a, b in re.findall(r"<td class=num>" + _TIME + "</td>", table)]
        assert table.startswith(re.search(rf"{title} \(([^\n]*)\):", text)[1])   # the same title
        assert len(shown) == n and _close(_total(shown), total), (title, shown, total)


@pytest.mark.slow
def test_reassociated_chain_on_cpu_every_view_prints_the_same_figures(tmp_path, capsys):
    assert main(["optimize", "superopt.workloads:reassoc_chain"]) == 0
    report = capsys.readouterr().out
    assert "guarded: runs where" in report   # strict numerics: the re-association runs behind a check
    page = tmp_path / "explain.html"
    assert main(["explain", "superopt.workloads:reassoc_chain", "--html", str(page)]) == 0
    text = capsys.readouterr().out
    _check_explain(text, report)
    _check_html(page.read_text(), text)


@pytest.mark.slow
def test_attention_on_npu_every_view_prints_the_same_figures(tmp_path, capsys, monkeypatch):
    (tmp_path / "attention_figures.py").write_text(ATTENTION)
    monkeypatch.syspath_prepend(str(tmp_path))
    command = ["attention_figures:attention", "--target", "npu-910b", "--shapes", "128x64", "128x64", "128x64"]
    assert main(["optimize", *command]) == 0
    report = capsys.readouterr().out
    page = tmp_path / "explain.html"
    assert main(["explain", *command, "--html", str(page)]) == 0
    text = capsys.readouterr().out
    _check_explain(text, report)
    _check_html(page.read_text(), text)


def _attention_like(q, k, v):
    return (q @ k.T) @ v


def _scaled_sum(q, k, v):
    return q * k + v


@pytest.mark.parametrize("fn, target", [(_attention_like, "cpu"), (_attention_like, "npu-910b"),
                                        (_scaled_sum, "cpu")])
def test_launches_total_the_reports_costs_and_the_list_starts_with_what_runs(fn, target):
    """Fields first: `launches` of each program adds up to the report's cost of it (a guarded program's check
    included), and `programs` lists the program that runs first, at that cost; then the text built from them."""
    n, d = 256, 8
    args = tuple(jax.random.normal(jax.random.PRNGKey(i), (n, d), jnp.float32) for i in range(3))
    spec = superopt(fn, target=target).compile(*args)
    if fn is _attention_like:   # q @ (k.T @ v), under strict numerics behind a guard where XLA runs it
        assert spec.report.optimized and spec.report.guarded == (target == "cpu")
    else:                       # nothing to gain: the original runs
        assert not spec.report.optimized
    tgt = load_target(target)
    after, before = launches(spec.term, tgt), launches(spec.original, tgt)
    assert sum(r.seconds for r in after) == pytest.approx(spec.report.cost_after, rel=1e-9)
    assert sum(r.seconds for r in before) == pytest.approx(spec.report.cost_before, rel=1e-9)
    assert any(r.check for r in after) == (spec.term.guard is not None) == spec.report.guarded
    alts = alternatives(fn, args, target, limit=3, budget=10.0)
    (label, first), *others = programs(spec, alts)
    assert first.graph is spec.term and first.cost == pytest.approx(spec.report.cost_after, rel=1e-9)
    assert label == ("chosen, guarded" if spec.report.guarded else "chosen" if spec.report.optimized
                     else "the original, kept")
    assert [a.cost for _, a in others] == sorted(a.cost for _, a in others)
    _check_explain(explain(spec, alts), str(spec.report))


@pytest.mark.slow
def test_the_reassociated_chains_guard_is_priced_in_the_reports_cost():
    w = reassoc_chain()
    spec = superopt(w.fn, target="cpu").compile(*w.args)
    rows = launches(spec.term, load_target("cpu"))
    check = [r for r in rows if r.check]
    assert spec.report.guarded and check and all(r.node.startswith("g%") for r in check)
    assert sum(r.seconds for r in rows) == pytest.approx(spec.report.cost_after, rel=1e-9)
    # the report's costliest ops are the costliest of these rows: the check's pass over A and B among them
    assert [c for c, _ in spec.report.top_costs] == pytest.approx([r.seconds for r in rows][:len(spec.report.top_costs)])
    assert any(what.startswith("guard check: ") for _, what in spec.report.top_costs)
