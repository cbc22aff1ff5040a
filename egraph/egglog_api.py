"""egglog's private and version-sensitive API, in one place: every other module of superopt uses egglog's
public API only (`EGraph`, `ruleset`, `rule`, `function`, the builtin sorts) and comes here for the rest.

superopt supports egglog 13.2 to 14.x (pyproject.toml). What it needs beyond the public API:

- the bindings object of an `EGraph` (`EGraph._egraph`), to run egglog commands directly (the encoder writes
  its nodes as command objects; the runner saturates a registered rule set without the expression layer),
  to read table sizes (`PrintSize`) and to read the frozen tables (`bindings.EGraph.freeze()`);
- the expression layer's state (`EGraph._state`): which egglog names it declared, the sorts it named, the
  rule sets it registered;
- `egglog.declarations` (rules kept as data by `egraph/saved.py`) and `egglog.egraph.RewriteOrRule`.

What differs between the releases, as superopt uses it (read from egglog-python's source at each release;
each branch below names the release):

- egglog 14.0 reports a run whose only rule the back-off scheduler held back (more matches than its limit)
  as not updated, and says so in the report's new `can_stop` (False); 13.2 reported it as updated with no
  matches. `held_back` reads either.
- egglog 14.0 keeps `EGraphState.egg_fn_to_callable_refs` as a plain dict (13.2: a `defaultdict(set)`), so
  a name it never declared is not a key: read it with `.get` (`declares`).
- egglog 14.0 adds optional fields to command objects (`bindings.Rule`: `eval_mode`, `no_decomp`,
  `include_subsumed`; `bindings.FunctionCommand`: `term_constructor`, `unextractable`, `hidden`,
  `let_binding`) and to declarations (`RuleDecl.eval_mode` and `no_decomp`, `ValueDecl.owner`), reorders
  `FunctionDecl`'s fields (`egg_name` before `builtin`, then a new `body`), and drops `Declarations` from
  `egglog.declarations.__all__` (the class is still there). The command objects are built here with the
  fields both releases take, by position; rules kept as data carry the egglog release that wrote them
  (`DATA_FORM`), and data of another release is not read.
- The rest of what superopt reads is the same in both: `bindings.EGraph.run_program`, `freeze()` and its
  `FrozenFunction` (`input_sorts`, `output_sort`, `is_let_binding`, `rows`) and `FrozenRow` (`inputs`,
  `output`, `subsumed`), the `value_to_*` decoders, `PrintSize` and its `sizes`, the expression-level
  nodes (`Call`, `Lit`, `Var`, `Let`, `Set`, `Eq`, `Expr_`, `Change`, `Delete`), `RunSchedule`, `Saturate`,
  `Run`, `RunConfig`, `AddRuleset`, `RuleCommand`, `Schema`, `TimeOnly`, `EGraph._callable_to_egg`,
  `EGraphState.rulesets` and `type_ref_to_egg_sort`, a rule set's `__egg_ident__`, and the egglog names of
  functions with an explicit `egg_fn` and of rule sets (`str(ident)`).
"""
from __future__ import annotations

import importlib.metadata
import re
from typing import Any

import egglog.declarations as declarations  # noqa: F401  - egraph/saved.py builds rules from these by name
from egglog import EGraph, bindings
from egglog.declarations import Declarations, HasDeclarations  # noqa: F401
from egglog.egraph import RewriteOrRule  # noqa: F401

# The expression-level command objects the encoder writes most, the same in 13.2 and 14.x (their
# constructors compared); the others are `bindings.<name>`.
from egglog.bindings import Call, Lit, Var  # noqa: F401


def parse_version(text: str) -> tuple[int, ...]:
    """The leading numbers of a release string: '14.0.0' -> (14, 0, 0); '13.2.0rc1' -> (13, 2, 0)."""
    return tuple(int(m) for m in re.findall(r"\d+", re.match(r"[\d.]*", text).group(0)))


RELEASE = importlib.metadata.version("egglog")
VERSION = parse_version(RELEASE)
SUPPORTED = ((13, 2), (15,))           # [lowest, first unsupported): pyproject.toml declares the same range
DATA_FORM = f"egglog {RELEASE}"        # rules kept as data (egraph/saved.py) are read by the release that wrote them

SPAN = bindings.RustSpan("", 0, 0)     # where a command came from: nowhere in a source file


# ---- the bindings object ------------------------------------------------------------------------------------

def run_commands(egraph: EGraph, *commands) -> list:
    """Run egglog command objects on `egraph`'s bindings object, past the expression layer."""
    return egraph._egraph.run_program(*commands)


def frozen_tables(egraph: EGraph) -> dict:
    """egglog's frozen tables of `egraph`: name -> FrozenFunction (`input_sorts`, `output_sort`,
    `is_let_binding`, `rows` of FrozenRow: `inputs`, `output`, `subsumed`)."""
    return egraph._egraph.freeze().functions


def decoders(egraph: EGraph) -> dict[str, Any]:
    """The decoders of primitive values of `egraph`, by sort: i64, String, f64, and Vec (a list of values)."""
    raw = egraph._egraph
    return {"i64": raw.value_to_i64, "String": raw.value_to_string, "f64": raw.value_to_f64,
            "Vec": raw.value_to_vec}


def table_sizes(egraph: EGraph) -> dict[str, int]:
    """Rows per table of the functions and relations the expression layer declared, by egglog name."""
    (output,) = run_commands(egraph, bindings.PrintSize(SPAN, None))
    return {name: n for name, n in output.sizes if declares(egraph, name)}


def run_once(egraph: EGraph, rules) -> tuple[bool, dict[str, int]]:
    """Run the rule set `rules` (an egglog `Ruleset`) once: (whether the e-graph changed, matches per egglog rule
    name). Through the bindings, past the expression layer: its run report keys its maps by rule declarations,
    whose hashes are computed over each whole rule again at every run, which took two thirds of a small
    program's saturation (one run per rule per step). A rule set it has not registered is registered first by
    a run of zero iterations, which applies nothing. `rule_declaration` reads a name's rule."""
    if not is_registered(egraph, rules):
        egraph.run(rules * 0)
    (output,) = run_commands(egraph, run_schedule(ruleset_name(rules)))
    report = output.report
    return report.updated, report.num_matches_per_rule


def rule_declaration(egraph: EGraph, name: str):
    """The declaration of the egglog rule named `name` in `egraph` (the `decl` of a compiled rule)."""
    return egraph._state.rule_name_to_command_decl[name]


def time_only_reports(egraph: EGraph) -> None:
    """Have egglog's run reports record times only (no query plans)."""
    egraph.set_report_level(bindings.TimeOnly())


# ---- the expression layer's state ------------------------------------------------------------------------------

def declares(egraph: EGraph, name: str) -> bool:
    """Whether the expression layer of `egraph` declared the egglog function or relation `name`."""
    # egglog 14.0: a plain dict (13.2: defaultdict(set), where indexing would have added the name).
    return bool(egraph._state.egg_fn_to_callable_refs.get(name))


def egg_name(egraph: EGraph, fn) -> str:
    """The egglog name of the expression-layer function `fn`, declaring it in `egraph` first if it is not."""
    return egraph._callable_to_egg(fn)[1]


def sort_names(egraph: EGraph) -> list[str]:
    """The egglog names of the sorts the expression layer declared in `egraph` (module-qualified for
    superopt's own: `superopt.egraph.terms.Tensor`)."""
    return list(egraph._state.type_ref_to_egg_sort.values())


def ruleset_name(rules) -> str:
    """The egglog name of the rule set `rules` (an egglog `Ruleset`)."""
    return str(rules.__egg_ident__)


def is_registered(egraph: EGraph, rules) -> bool:
    """Whether `rules` (an egglog `Ruleset`) is registered in `egraph`, by a run of it."""
    return rules.__egg_ident__ in egraph._state.rulesets


# ---- run reports ----------------------------------------------------------------------------------------------

def held_back(result, matches: int) -> bool:
    """Whether the run that reported `result` (an `EGraph.run` of one rule under a back-off scheduler, which
    matched it `matches` times) applied nothing because the rule had more matches than the scheduler's limit."""
    if matches:
        return False
    can_stop = getattr(result, "can_stop", None)
    if can_stop is not None:     # egglog 14.0: not updated, and the scheduler cannot stop (a rule is banned)
        return not can_stop
    return bool(result.updated)  # egglog 13.2: updated, with no matches


# ---- command objects ------------------------------------------------------------------------------------------

def add_ruleset(name: str):
    """The command that declares an empty rule set `name`."""
    return bindings.AddRuleset(SPAN, name)


def rule_command(actions: list, query: list, name: str, ruleset: str):
    """The command that adds a rule named `name` to the rule set `ruleset`. egglog 14.0 adds optional fields to
    `bindings.Rule` after these (`eval_mode`, `no_decomp`, `include_subsumed`): their defaults are what 13.2
    does, a seminaive rule over rows that are not subsumed."""
    return bindings.RuleCommand(bindings.Rule(SPAN, actions, query, name, ruleset))


def run_schedule(ruleset: str, saturate: bool = False):
    """The command that runs the rule set `ruleset` once, or to its fixpoint with `saturate`."""
    run = bindings.Run(SPAN, bindings.RunConfig(ruleset, None))
    return bindings.RunSchedule(bindings.Saturate(SPAN, run) if saturate else run)


def function_command(name: str, inputs: list[str], output: str):
    """A `bindings.FunctionCommand` declaring the function `name` (no merge: two values for a key are an
    error); egglog 14.0's optional fields keep their defaults."""
    return bindings.FunctionCommand(SPAN, name, bindings.Schema(inputs, output), None)


# ---- declarations ---------------------------------------------------------------------------------------------

def declared_names(decls: Declarations) -> list[str]:
    """Every function (`f:`), class (`c:`) and constant (`k:`) `decls` declares, by identifier, sorted."""
    return sorted(f"f:{i}" for i in decls._functions) + sorted(f"c:{i}" for i in decls._classes) + \
        sorted(f"k:{i}" for i in decls._constants)
