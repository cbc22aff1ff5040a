"""The layer contract (.importlinter) covers what `lint-imports` cannot see: imports made by
`lazy.module("superopt.X")`, which load on first use. Each must point at a module the contract would let
its importer import (a lower layer, or a sibling of the same layer), and every module of the package must
sit in a layer."""
import configparser
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDERS = ("egraph", "rewrites", "rulesets", "extract", "lowering")   # sub-packages of superopt once installed


def _layers() -> list[list[str]]:
    """The contract's layers, top first, each a list of module prefixes."""
    parser = configparser.ConfigParser()
    parser.read(ROOT / ".importlinter")
    text = parser["importlinter:contract:layers"]["layers"]
    return [[m.strip() for m in re.split(r"[:|]", line)] for line in text.strip().splitlines() if line.strip()]


def _layer_of(module: str, layers) -> int | None:
    best = None
    for i, group in enumerate(layers):
        for prefix in group:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (i, len(prefix))
    return None if best is None else best[0]


def _modules():
    """(dotted name, path) of every module of the installed package."""
    for path in sorted((ROOT / "superopt").rglob("*.py")):
        yield "superopt." + ".".join(path.relative_to(ROOT / "superopt").with_suffix("").parts), path
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield "superopt." + ".".join(path.relative_to(ROOT).with_suffix("").parts), path


def _named(module: str) -> str:
    return module.removesuffix(".__init__")


def test_every_module_of_the_package_is_in_a_layer():
    layers = _layers()
    outside = [_named(m) for m, _ in _modules() if _named(m) != "superopt" and _named(m) != "superopt.__main__"
               and _layer_of(_named(m), layers) is None]
    assert not outside, f"modules in no layer of .importlinter: {outside}"


def _upward(module: str, text: str, layers) -> list[str]:
    """The lazy imports in `text` (module `module`'s source) that the contract would refuse."""
    importer = _layer_of(module, layers)
    wrong = []
    for target in re.findall(r'lazy\.module\("(superopt\.[\w.]+)"\)', text):
        imported = _layer_of(target, layers)
        if imported is None or importer is None or imported < importer:
            wrong.append(f"{module} (layer {importer}) lazily imports {target} (layer {imported})")
    return wrong


def test_lazy_imports_keep_the_layer_contract():
    layers = _layers()
    texts = {_named(m): p.read_text(encoding="utf-8") for m, p in _modules()}
    assert sum(t.count("lazy.module(\"superopt.") for t in texts.values()) >= 10   # the scan sees them
    wrong = [w for m, t in texts.items() for w in _upward(m, t, layers)]
    assert not wrong, wrong


def test_the_check_catches_an_upward_lazy_import():
    layers = _layers()
    assert _upward("superopt.core.verify", 'api = lazy.module("superopt.api")', layers)
    assert _upward("superopt.report", 'x = lazy.module("superopt.pipeline")', layers)
    assert not _upward("superopt.api", 'x = lazy.module("superopt.extract.greedy")', layers)


def test_each_top_module_imports_first_in_a_fresh_interpreter():
    """A worker process unpickles its job from superopt.segmented, so that module is the first it imports.
    `from superopt import numerics` there went through the package's lazy names, which imported the API
    first, which imports the pipeline back: every worker died of the circular import."""
    import subprocess
    import sys
    for module in ("superopt.segmented", "superopt.pipeline", "superopt.segments", "superopt.backends"):
        done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"import {module}: {done.stderr[-1500:]}"
