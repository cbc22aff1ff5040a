"""superopt: an equality-saturation superoptimizer for tensor programs.

    fast = superopt(fn, target="cpu")
    y = fast(x, w)
    print(fast.report)

The names below load at their first use: importing a module of the package (the `superopt` command's
`superopt.cli`) does not import JAX, so a command refuses a bad argument before paying for it.
"""
from importlib import import_module
from importlib.util import find_spec

_HOMES = {"superopt": "superopt.api", "Optimized": "superopt.api", "Limits": "superopt.egraph.limits",
          "StopReason": "superopt.egraph.limits", "available_targets": "superopt.extract.target",
          "VerificationWarning": "superopt.core.verify"}

__all__ = ["superopt", "Optimized", "Limits", "StopReason", "available_targets", "VerificationWarning"]


def __getattr__(name: str):
    if name in _HOMES:
        value = getattr(import_module(_HOMES[name]), name)
        globals()[name] = value
        return value
    if not name.startswith("__"):
        spec = find_spec(f"superopt.{name}")
        if spec is not None and spec.submodule_search_locations is None:
            # a module of the package (`from superopt import numerics`): itself, never the API first, which
            # imports it back (a worker that unpickles a job from superopt.segmented imports that first)
            return import_module(f"superopt.{name}")
        # what `import superopt` loaded when it imported the API: `superopt.core.progress` after it
        import_module("superopt.api")
        if name in globals():
            return globals()[name]
        try:
            return import_module(f"superopt.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"superopt.{name}":
                raise
    raise AttributeError(f"module 'superopt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
