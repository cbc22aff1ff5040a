"""A captured program saturated as superopt's search saturates it: written on the process's template e-graph
(egraph/encode.py, `scratch`), which holds the analyses and the rule sets earlier searches ran registered
(egraph/runner.py, `prime`), so a test that saturates many programs registers each rule set once, not once
per program (about a millisecond per egglog rule, most of a small program's saturation)."""
from superopt.egraph import encode as encoding
from superopt.egraph import runner
from superopt.egraph.frozen import freeze
from superopt.egraph.runner import Limits


def saturated(graph, schedule, limits: Limits = Limits(), origins: bool = False):
    """(the encoding, the run's report, the frozen e-graph). The e-graph itself is gone at the return (the
    template is popped): extraction needs only the frozen view and the encoding's tables."""
    with encoding.scratch(runner.prime) as empty:
        enc = encoding.encode(graph, origins=origins, egraph=empty)
        report = runner.saturate(enc.egraph, schedule, limits)
        return enc, report, freeze(enc.egraph)
