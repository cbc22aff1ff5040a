"""A module imported at the first use of one of its attributes.

egglog takes a third of a second to import, and the modules built on it (the term language, encoding, the
analyses) more. A call the persistent cache answers needs none of them, so the modules on that path (rule
definitions, the cache, the pipeline's driver, the backends) name them through `module(...)` and pay the
import only where a program is actually saturated or run there.
"""
from __future__ import annotations

import importlib


class _Lazy:
    def __init__(self, name: str):
        self._name, self._module = name, None

    def __getattr__(self, attr: str):   # only for names not set in __init__: the module's own
        if attr in ("_name", "_module"):   # not set yet (a copy being built): not the module's
            raise AttributeError(attr)
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)   # read each time: a patched module attribute is seen

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


def module(name: str):
    """`name`, imported when one of its attributes is first read (an ImportError surfaces there)."""
    return _Lazy(name)
