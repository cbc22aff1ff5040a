"""Every ```python block in the docs and the README runs, in order, in one namespace per file."""
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # whole models, worker processes or long searches: make test, not test-fast

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_code_blocks_run(page, capsys):
    code = blocks(page)
    assert code, f"{page.name} has no python blocks"
    namespace: dict = {"__name__": f"doc_{page.stem}"}
    for i, block in enumerate(code):
        exec(compile(block, f"{page.name}[block {i}]", "exec"), namespace)
