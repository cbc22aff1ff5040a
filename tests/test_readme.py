"""README's claims about behaviour hold: the first example under numerics="fast" and under the default."""
import re
from pathlib import Path

import jax.numpy as jnp
import pytest

from superopt import superopt

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def f(A, B, v):
    return (A @ B) @ v


@pytest.mark.e2e
def test_the_first_example_reassociates_under_fast_and_runs_guarded_under_strict():
    A = B = jnp.ones((256, 256))
    v = jnp.ones((256, 1))
    fast = superopt(f, target="cpu", numerics="fast")
    fast(A, B, v)
    line = "rewrites that can change overflow fired: matmul-assoc"
    assert line in str(fast.report) and line in README, str(fast.report)   # README quotes the report
    strict = superopt(f, target="cpu")
    strict(A, B, v)
    assert strict.report.optimized and strict.report.extraction.guarded, strict.report.extraction
    assert "matmul-assoc" in strict.report.extraction.reals_rules
    # what README says strict does here
    claim = re.search(r"Under the\s+default, `numerics=\"strict\"`, superopt (.*?)\.\n", README, flags=re.S)
    assert claim and "behind a check of its arguments" in claim.group(1), claim and claim.group(1)
