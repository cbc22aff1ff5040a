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


class _Table:
    """The distinct nodes of every decl encoded in this process, each once, in the order first met (a node's
    children before it). A process encodes its rules again whenever it has compiled more of them (each
    cache directory gets them once: `superopt/reuse.py:save_rules`); those it encoded before are found by
    identity (the rules and their decls live as long as the process), not hashed again, which is what
    encoding a tree of frozen dataclasses by value costs."""

    def __init__(self):
        self.items: list = []      # [(data form, indices of the nodes it refers to)]
        self.index: dict = {}      # a node's data form -> position, for equal nodes that are not the same object
        self.by_id: dict = {}      # id(node) -> position
        self.kept: list = []       # the nodes by_id names, kept alive so that their ids are not reused

    def ref(self, x) -> int:
        at = self.by_id.get(id(x))
        if at is not None:
            return at
        refs: list = []
        if type(x) is tuple:
            item = {"t": [self.value(v, refs) for v in x]}
            values = item["t"]
        elif dataclasses.is_dataclass(x) and type(x).__module__ == D.__name__:
            item = {"d": type(x).__name__, "a": [self.value(getattr(x, f.name), refs) for f in dataclasses.fields(x)]}
            values = item["a"]
        else:
            raise TypeError(f"an egglog declaration holds a {type(x).__name__}, which has no data form")
        # Equal nodes by their data form, which tells -0.0 from 0.0 and True from 1 (equality does not).
        key = (item.get("d"), tuple(tuple(v.items())[0] if isinstance(v, dict) else (type(v).__name__, v)
                                    for v in values))
        at = self.index.get(key)
        if at is None:
            at = self.index[key] = len(self.items)
            self.items.append((item, refs))
        self.by_id[id(x)] = at
        self.kept.append(x)
        return at

    def value(self, x, refs: list):
        if x is None or isinstance(x, (bool, str, int)):
            return x
        if isinstance(x, float):
            return {"f": x.hex()}
        at = self.ref(x)
        refs.append(at)
        return {"r": at}

    def subset(self, roots: list[int]) -> tuple[list, dict]:
        """The nodes `roots` reach, children first, renumbered from 0, and the renumbering."""
        seen: set = set()
        todo = list(roots)
        while todo:
            at = todo.pop()
            if at not in seen:
                seen.add(at)
                todo.extend(self.items[at][1])
        order = sorted(seen)
        new = {old: i for i, old in enumerate(order)}

        def renumber(v):
            return {"r": new[v["r"]]} if isinstance(v, dict) and "r" in v else v
        table = []
        for at in order:
            item = self.items[at][0]
            table.append({"t": [renumber(v) for v in item["t"]]} if "t" in item
                         else {"d": item["d"], "a": [renumber(v) for v in item["a"]]})
        return table, new


_table = _Table()


def rules_to_data(groups: list[tuple]) -> dict:
    """Groups of egglog rules (each a tuple, e.g. one superopt rule's expansions) as a JSON-safe dict."""
    roots = [[_table.ref(r.decl) for r in group] for group in groups]
    table, new = _table.subset([at for group in roots for at in group])
    rules = [r for group in groups for r in group]
    needed = Declarations.create(*rules) if rules else Declarations()
    return {"format": FORMAT, "egglog": DATA_FORM, "groups": [[{"r": new[at]} for at in group] for group in roots],
            "table": table, "needs": _names(needed)}


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
