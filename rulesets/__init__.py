"""Rule sets, one table per concern. `RULESETS` names every registered set; the default schedule runs
`DEFAULT`."""
from superopt.rulesets.algebra import ALGEBRA
from superopt.rulesets.fusion import FUSION

RULESETS = {rs.name: rs for rs in (ALGEBRA, FUSION)}
DEFAULT = ("algebra", "fusion")


def resolve(rulesets) -> list:
    """Rule sets from names or RuleSet objects; an unknown name is an error listing the known ones."""
    out = []
    for rs in rulesets:
        if isinstance(rs, str):
            if rs not in RULESETS:
                raise ValueError(f"superopt: unknown rule set {rs!r}; known: {', '.join(sorted(RULESETS))}")
            rs = RULESETS[rs]
        out.append(rs)
    return out
