"""Compiled egglog rules as plain data, so a process can take them from the cache instead of building them.

Building superopt's egglog rules through egglog's Python API is most of a cold call's cost (about a second
for the default schedule: every rule is expanded per rank and predicate alternative, and each expression is
type-checked as it is built). What the API builds is a tree of egglog's own frozen dataclasses (a rule's
`RuleDecl`: facts, actions, typed expressions, references to functions by name) beside the declarations of
the sorts and functions it uses, which are the same for every rule: those of `superopt/egraph/terms.py`
and egglog's builtins. So a rule is kept as its `RuleDecl` alone, and rebuilt as an egglog rule with the
declarations of this process.

`rules_to_data` writes the decls as a table of distinct nodes (each written once: a rule's decls repeat
the same references and types thousands of times), JSON-safe, floats bit for bit. `rules_from_data` reads
them back and never evaluates code: it builds only dataclasses of `egglog.declarations`, by name, and
checks that every function and sort the rules name is declared in this process. Anything else is
`ValueError`, and the caller builds the rules as usual. The decls' fields differ between egglog releases
(`egraph/egglog_api.py`), so the data names the release that wrote it and only that release reads it.
"""
from __future__ import annotations

import dataclasses
import functools

from egglog import Bool, String, Vec, f64, i64

from superopt.egraph import terms
from superopt.egraph.egglog_api import DATA_FORM, Declarations, HasDeclarations, RewriteOrRule, declared_names
from superopt.egraph.egglog_api import declarations as D

FORMAT = 1     # bump when the data form changes


@functools.cache
def declarations() -> Declarations:
    """The sorts and functions superopt's rules may name: terms.py's and the builtins they use."""
    objs = [v for v in vars(terms).values() if isinstance(v, HasDeclarations)]
    return Declarations.create(*objs, String, i64, f64, Bool, Vec[i64])


def _names(decls: Declarations) -> list[str]:
    return declared_names(decls)


def rules_to_data(groups: list[tuple]) -> dict:
    """Groups of egglog rules (each a tuple, e.g. one superopt rule's expansions) as a JSON-safe dict."""
    table: list = []
    index: dict = {}

    def enc(x):
        if x is None or isinstance(x, (bool, str, int)):
            return x
        if isinstance(x, float):
            return {"f": x.hex()}
        key = (type(x), x)
        if key not in index:
            if type(x) is tuple:
                item = {"t": [enc(v) for v in x]}
            elif dataclasses.is_dataclass(x) and type(x).__module__ == D.__name__:
                item = {"d": type(x).__name__, "a": [enc(getattr(x, f.name)) for f in dataclasses.fields(x)]}
            else:
                raise TypeError(f"an egglog declaration holds a {type(x).__name__}, which has no data form")
            index[key] = len(table)
            table.append(item)
        return {"r": index[key]}

    rules = [r for group in groups for r in group]
    needed = Declarations.create(*rules) if rules else Declarations()
    return {"format": FORMAT, "egglog": DATA_FORM, "groups": [[enc(r.decl) for r in group] for group in groups], "table": table,
            "needs": _names(needed)}


def rules_from_data(data: dict) -> list[tuple]:
    """The groups `rules_to_data` wrote, as egglog rules with this process's declarations; ValueError for
    anything that is not such data or names a function or sort this process does not declare."""
    try:
        if data["format"] != FORMAT:
            raise ValueError(f"data form {data['format']!r}, not {FORMAT}")
        if data.get("egglog") != DATA_FORM:
            raise ValueError(f"rules written by {data.get('egglog')!r}, not {DATA_FORM}")
        shared = declarations()
        missing = set(data["needs"]) - set(_names(shared))
        if missing:
            raise ValueError(f"the rules name what this process does not declare: {sorted(missing)[:3]}")
        objs: list = []

        def dec(x):
            if isinstance(x, dict):
                if "r" in x:
                    return objs[x["r"]]
                if "f" in x:
                    return float.fromhex(x["f"])
                raise ValueError(f"not a reference: {str(x)[:60]}")
            if isinstance(x, list):
                raise ValueError("a list where a value belongs")
            return x
        for item in data["table"]:
            if "t" in item:
                objs.append(tuple(dec(v) for v in item["t"]))
                continue
            cls = getattr(D, str(item["d"]), None)
            if not (isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == D.__name__):
                raise ValueError(f"{item['d']!r} is not one of egglog's declarations")
            objs.append(cls(*(dec(v) for v in item["a"])))
        groups = []
        for group in data["groups"]:
            decls = tuple(dec(r) for r in group)
            if not all(isinstance(d, D.RuleDecl) for d in decls):
                raise ValueError("an entry of a group is not a rule")
            groups.append(tuple(RewriteOrRule(shared, d) for d in decls))
        return groups
    except ValueError:
        raise
    except Exception as exc:   # noqa: BLE001  - malformed data, whatever broke
        raise ValueError(f"not compiled rules ({type(exc).__name__}: {str(exc)[:120]})") from None
