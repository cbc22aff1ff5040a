"""Rule sets, one table per concern. `RULESETS` names every registered set; the default schedule runs
`DEFAULT`."""
from superopt.rewrites.schedule import register
from superopt.rulesets.algebra import ALGEBRA
from superopt.rulesets.casts import CASTS
from superopt.rulesets.fusion import FUSION
from superopt.rulesets.packing import LAYOUT
from superopt.rulesets.quant import QUANT

RULESETS = {rs.name: rs for rs in (ALGEBRA, CASTS, QUANT, FUSION, LAYOUT)}
register(*RULESETS.values())
# layout joins the default: its packed alternatives cost more than the ND matmul and elementwise ops on
# every target's model (an NPU's cube converts ND tiles to fractals on chip for free, rulesets/packing.py),
# so they are only chosen where the model says they pay, and they add little to saturation.
DEFAULT = ("algebra", "casts", "quant", "layout", "fusion")
