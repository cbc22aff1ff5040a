"""One self-contained HTML page per optimization: the summary, the rules that fired, the term graph before
and after, the cost model's price of every launch, and the NPU timeline. Everything is inline (SVG, and
PNG as data URIs), so the file can be mailed or attached as it is.

The term graphs are laid out by graphviz (`dot -Tsvg`) when it is installed; otherwise by a small layered
layout here (longest path from the inputs, nodes ordered by their inputs' positions).
"""
from __future__ import annotations

import base64
import html
import re
import shutil
import subprocess
from html.parser import HTMLParser

from superopt.core.ir import Graph, body_str, pretty, type_str
from superopt.core.ops import flagged
from superopt.explain import launches, priced_title, rules_by_phase
from superopt.report import _fmt_time, fusion_lines, plural, stop_phrase

_LEAVES = flagged("leaf")
_COLOURS = {"arg": "#d4edda", "const": "#e2e3e5", "lit": "#e2e3e5", "iota": "#e2e3e5", "kernel": "#ffe5b4",
            "matmul": "#f8c9c4", "conv": "#f8c9c4", "fractal_matmul": "#f8c9c4", "opaque": "#f5c6cb"}
_WIDTH = 44   # characters of a label line


def _label(graph: Graph, k: int, i: int) -> tuple[str, str, str]:
    """(first line, second line, full text) of node `i`, named %k as in `pretty`."""
    node = graph.nodes[i]
    if node.op == "kernel":
        full = f"kernel{{{body_str(node.attrs[0])}}}"
    elif node.op in ("arg", "const"):
        full = f"{node.op} {node.attrs[0]}"
    else:
        full = node.op
    first = f"%{k} {full}"
    first = first if len(first) <= _WIDTH else first[:_WIDTH - 3] + "..."
    return first, type_str(node), f"%{k} = {full} : {type_str(node)}"


def dot_source(graph: Graph, uid: str = "g") -> str:
    """The live graph in graphviz's DOT language, inputs at the top; `uid` prefixes the SVG's ids."""
    live = graph.live()
    k = {i: n for n, i in enumerate(live)}
    lines = ["digraph term {", f'  id="{uid}"; rankdir=TB; bgcolor="transparent";',
             '  node [shape=box, style="rounded,filled", fontname="monospace", fontsize=10];',
             '  edge [color="#555555", arrowsize=0.6];']
    for i in live:
        first, second, full = _label(graph, k[i], i)
        esc = lambda t: t.replace("\\", "\\\\").replace('"', '\\"')  # noqa: E731
        colour = _COLOURS.get(graph.nodes[i].op, "#dbe9f6")
        lines.append(f'  n{i} [label="{esc(first)}\\n{esc(second)}", tooltip="{esc(full)}", fillcolor="{colour}"];')
        lines += [f"  n{j} -> n{i};" for j in graph.nodes[i].inputs]
    lines += [f'  out{n} [label="output {n}", shape=plaintext]; n{o} -> out{n};' for n, o in enumerate(graph.outputs)]
    return "\n".join(lines + ["}"])


def _svg_by_dot(graph: Graph, uid: str) -> str | None:
    dot = shutil.which("dot")
    if dot is None:
        return None
    try:
        done = subprocess.run([dot, "-Tsvg"], input=dot_source(graph, uid), capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or "<svg" not in done.stdout:
        return None
    return done.stdout[done.stdout.index("<svg"):]   # drop the XML prolog and doctype: inline SVG


def _layers(graph: Graph) -> dict[int, int]:
    """Layer of each live node: one below its deepest input; a leaf sits just above its first user."""
    live = graph.live()
    layer: dict[int, int] = {}
    for i in live:
        ins = graph.nodes[i].inputs
        layer[i] = 1 + max((layer[j] for j in ins), default=-1)
    users = graph.users()
    for i in live:
        if graph.nodes[i].op in _LEAVES and users.get(i):
            layer[i] = max(0, min(layer[u] for u in users[i]) - 1)
    return layer


def _svg_layered(graph: Graph, uid: str = "g") -> str:
    """A layered drawing of the live graph, for when graphviz is not installed; `uid` keeps its ids unique
    in a page with several drawings."""
    live = graph.live()
    k = {i: n for n, i in enumerate(live)}
    layer = _layers(graph)
    rows: dict[int, list[int]] = {}
    for i in live:
        rows.setdefault(layer[i], []).append(i)
    char, height, gap_x, gap_y, pad = 6.6, 34, 14, 46, 10
    width = {i: max(len(_label(graph, k[i], i)[0]), len(_label(graph, k[i], i)[1])) * char + 12 for i in live}
    x: dict[int, float] = {}
    for depth in sorted(rows):  # order each row by the mean position of its inputs, then pack it
        row = rows[depth]
        def centre(i: int) -> float:
            placed = [x[j] for j in graph.nodes[i].inputs if j in x]
            return sum(placed) / len(placed) if placed else float(k[i])
        row.sort(key=centre)
        pos = 0.0
        for i in row:
            x[i] = pos + width[i] / 2
            pos += width[i] + gap_x
    span = max(sum(width[i] for i in row) + gap_x * (len(row) - 1) for row in rows.values())
    for row in rows.values():  # centre each row
        used = sum(width[i] for i in row) + gap_x * (len(row) - 1)
        for i in row:
            x[i] += (span - used) / 2 + pad
    y = {i: pad + layer[i] * (height + gap_y) for i in live}
    total_w, total_h = span + 2 * pad, pad * 2 + (max(rows) + 1) * (height + gap_y)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w:.0f}" height="{total_h:.0f}" '
           f'viewBox="0 0 {total_w:.0f} {total_h:.0f}" font-family="monospace" font-size="11">',
           f'<defs><marker id="{uid}-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" '
           'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#555"/></marker></defs>']
    for i in live:
        for j in graph.nodes[i].inputs:
            x0, y0, x1, y1 = x[j], y[j] + height, x[i], y[i]
            mid = (y0 + y1) / 2
            out.append(f'<path d="M {x0:.1f} {y0:.1f} C {x0:.1f} {mid:.1f}, {x1:.1f} {mid:.1f}, {x1:.1f} {y1:.1f}" '
                       f'fill="none" stroke="#888" stroke-width="1" marker-end="url(#{uid}-arrow)"/>')
    outputs = set(graph.outputs)
    for i in live:
        first, second, full = _label(graph, k[i], i)
        colour = _COLOURS.get(graph.nodes[i].op, "#dbe9f6")
        stroke = ' stroke="#c0392b" stroke-width="2"' if i in outputs else ' stroke="#666"'
        left = x[i] - width[i] / 2
        out.append(f'<g><title>{html.escape(full)}</title>'
                   f'<rect x="{left:.1f}" y="{y[i]:.1f}" width="{width[i]:.1f}" height="{height}" rx="6" '
                   f'fill="{colour}"{stroke}/>'
                   f'<text x="{x[i]:.1f}" y="{y[i] + 14:.1f}" text-anchor="middle">{html.escape(first)}</text>'
                   f'<text x="{x[i]:.1f}" y="{y[i] + 27:.1f}" text-anchor="middle" fill="#555">'
                   f'{html.escape(second)}</text></g>')
    return "\n".join(out + ["</svg>"])


def graph_svg(graph: Graph, use_dot: bool = True, uid: str = "g") -> tuple[str, str]:
    """(inline SVG of the term graph, what drew it: graphviz's dot or the built-in layered layout)."""
    svg = _svg_by_dot(graph, uid) if use_dot else None
    return (svg, "graphviz (dot)") if svg else (_svg_layered(graph, uid), "the built-in layered layout")


def png_data_uri(path: str) -> str:
    with open(path, "rb") as f:
        return "data:image/png;base64," + base64.b64encode(f.read()).decode("ascii")


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1300px; color: #222; padding: 0 1em; }
nav a { margin-right: 1.2em; }
table { border-collapse: collapse; margin: 0.6em 0 1.4em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
code, pre { font-family: ui-monospace, monospace; font-size: 12px; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; }
.graph { overflow: auto; max-height: 760px; border: 1px solid #ddd; padding: 4px; margin-bottom: 1em; }
.muted { color: #666; }
"""


def _launch_table(rows) -> str:
    total = sum(r.seconds for r in rows) or 1.0
    head = ("<tr><th>node</th><th>launch</th><th>type</th><th>time (model)</th><th>share</th><th>FLOPs</th>"
            "<th>bytes</th><th>target factors</th><th>tiles</th></tr>")
    body = "".join(
        f"<tr><td><code>{r.node}</code></td><td><code>{html.escape(_short(r.what, 110))}</code></td>"
        f"<td><code>{r.type}</code></td><td class=num>{_fmt_time(r.seconds)}</td>"
        f"<td class=num>{r.seconds / total:.1%}</td><td class=num>{r.flops:.3g}</td><td class=num>{r.bytes:.3g}</td>"
        f"<td>{html.escape(', '.join(r.factors))}</td><td><code>{html.escape(r.tiles)}</code></td></tr>"
        for r in rows)
    return f"<table>{head}{body}</table>"


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def render(spec, title: str, timeline_png: str | None = None, note: str = "", use_dot: bool = True,
           explanation: str = "") -> str:
    """The page for one specialization (`Optimized.compile(...)`'s result) as an HTML string."""
    report = spec.report
    target = spec.options.target   # as superopt() loaded it
    before, after = launches(spec.original, target), launches(spec.term, target)
    svg_before, how = graph_svg(spec.original, use_dot, "before")
    svg_after, _ = graph_svg(spec.term, use_dot, "after")
    run = report.run
    summary = [("target", report.target), ("outcome", report.outcome),
               ("saturation", f"{stop_phrase(run.stop_reason)} after {plural(run.iterations, 'iteration')}, "
                              f"{_fmt_time(sum(ph.seconds for ph in run.phases))} in its phases"),
               ("e-graph", f"{run.enodes} e-nodes in {run.eclasses} e-classes"),
               ("cost (model)", report.cost_line),
               *([("extracted by", str(report.extraction))] if report.extraction else []),
               ("launches", f"{len(before)} → {len(after)}"), ("runs on", str(report.backend)),
               ("stages", ", ".join(f"{k} {_fmt_time(v)}" for k, v in report.stage_seconds.items()))]
    rules = []
    for phase, how_stopped, fired in rules_by_phase(run):
        cells = "".join(f"<tr><td>{html.escape(phase)}</td><td><code>{html.escape(n)}</code></td>"
                        f"<td class=num>{m}</td><td class=num>{_fmt_time(s)}</td><td><code>{html.escape(src)}</code>"
                        f"</td></tr>" for n, m, s, src in fired)
        rules.append(cells or f"<tr><td>{html.escape(phase)}</td><td colspan=4 class=muted>no rule matched "
                              f"({html.escape(how_stopped)})</td></tr>")
    declined = "".join(f"<li><code>{html.escape(t)}</code></li>" for t in fusion_lines(report.declined)) \
        or "<li>none</li>"
    if timeline_png:
        timeline = (f'<p>Emulated on {html.escape(report.target)}; bars are instructions per queue of the first '
                    f'cores of each kind, dotted lines separate stages.</p>'
                    f'<img alt="NPU emulator timeline" src="{png_data_uri(timeline_png)}" style="max-width:100%">')
    else:
        timeline = (f'<p class=muted>No timeline: {html.escape(note or "the program did not run on the NPU emulator")}'
                    f'.</p>')
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        '<nav><a href="#summary">summary</a><a href="#rules">rules fired</a><a href="#graphs">term graphs</a>'
        '<a href="#costs">cost table</a><a href="#timeline">timeline</a><a href="#text">report text</a></nav>',
        '<h2 id="summary">Summary</h2><table>'
        + "".join(f"<tr><th>{k}</th><td>{html.escape(str(v))}</td></tr>" for k, v in summary) + "</table>",
        '<h2 id="rules">Rules fired</h2><table><tr><th>phase</th><th>rule</th><th>matches</th><th>time</th>'
        "<th>declared at</th></tr>" + "".join(rules) + "</table>",
        f'<h2 id="graphs">Term graph before and after</h2><p class=muted>Drawn by {how}; hover a node for '
        "its full text. Kernels are orange, matrix ops red, arguments green, constants grey; outputs have a "
        "red border. Node names are those of the program listings (<code>pretty</code>).</p>"
        f'<h3>before ({plural(len(before), "launch")})</h3><div class="graph">{svg_before}</div>'
        f'<h3>after ({plural(len(after), "launch")})</h3><div class="graph">{svg_after}</div>',
        '<h2 id="costs">Cost table</h2><p>The cost model\'s price of each launch on '
        f"{html.escape(report.target)}, costliest first; they total the summary's costs.</p>"
        f"<h3>{html.escape(priced_title('chosen program', after))}</h3>{_launch_table(after)}",
        *([f"<h3>{html.escape(priced_title('original program', before))}</h3>{_launch_table(before)}"]
          if spec.term is not spec.original else []),
        f"<h3>larger fusions not chosen</h3><ul>{declined}</ul>",
        f'<h2 id="timeline">Timeline</h2>{timeline}',
        f'<h2 id="text">Report text</h2><pre>{html.escape(str(report))}</pre>',
        *([f"<h3>explanation</h3><pre>{html.escape(explanation)}</pre>"] if explanation else []),
        f"<h3>chosen program</h3><pre>{html.escape(pretty(spec.term))}</pre>",
        "</body></html>",
    ]
    return "\n".join(parts)


def write(path: str, spec, title: str, **kw) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(spec, title, **kw))


def check(text: str) -> list[str]:
    """Problems with a page: links to anchors that do not exist, images that are not inline PNG or SVG,
    anything loaded from outside the file. Empty when the page is self-contained and consistent."""

    class Collect(HTMLParser):
        def __init__(self):
            super().__init__()
            self.ids, self.links, self.images, self.external = set(), [], [], []

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if "id" in a:
                self.ids.add(a["id"])
            if tag == "a" and "href" in a:
                self.links.append(a["href"])
            if tag == "img":
                self.images.append(a.get("src", ""))
            if tag in ("script", "link", "iframe") and (a.get("src") or a.get("href")):
                self.external.append(f"<{tag}> loads {a.get('src') or a.get('href')}")

    c = Collect()
    c.feed(text)
    problems = [f"link {h!r} points nowhere" for h in c.links if not (h.startswith("#") and h[1:] in c.ids)]
    for src in c.images:
        if not src.startswith("data:image/png;base64,"):
            problems.append(f"image {src[:40]!r} is not an inline PNG")
        elif not base64.b64decode(src.split(",", 1)[1]).startswith(b"\x89PNG\r\n\x1a\n"):
            problems.append("an inline image is not a PNG")
    problems += c.external
    problems += [f"url({m}) outside the file" for m in re.findall(r"url\((?!#)([^)]*)\)", text)]
    return problems
