"""Programs as plain data: a `Graph` to a JSON-safe dict and back, for the persistent cache.

The cache (`superopt/cache.py`) stores chosen programs between processes, so a program must survive a
round trip through JSON exactly: node for node, attribute for attribute, floats bit for bit (infinities and
NaN included). Attributes are ints, floats, strings, booleans, None, tuples, nested `Node`s (a kernel's
body), numpy dtypes, a convolution's `lax.ConvDimensionNumbers`, and the frozen dataclasses that upper layers register
with `register` (a kernel's `Tiling`, the NPU model's `CubeEstimate`); anything else, another tuple type
included, raises `NotSerializable`, and the caller does not cache that
program. An opaque primitive (a JAX primitive bound with its own params) has no data form at all.

`from_data` never trusts what it reads: a malformed document raises `NotSerializable`, never builds a
graph that `Graph.add` would refuse, and never evaluates code.
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import json

import numpy as np
from jax import lax

from superopt.core.ir import Graph, Guard, Node

_TYPES: dict[str, type] = {}


class NotSerializable(ValueError):
    """The program holds something with no data form (an opaque primitive, an unregistered attribute)."""


def register(cls: type) -> type:
    """Declare a frozen dataclass or a NamedTuple an attribute value the serializer may write and read (by its
    class name, field by field)."""
    if not (dataclasses.is_dataclass(cls) or (issubclass(cls, tuple) and hasattr(cls, "_fields"))):
        raise TypeError(f"serial.register: {cls.__name__} is neither a dataclass nor a NamedTuple")
    _TYPES[cls.__name__] = cls
    return cls


def _fields(cls: type) -> tuple[str, ...]:
    return cls._fields if issubclass(cls, tuple) else tuple(f.name for f in dataclasses.fields(cls))


def _encode(value):
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return {"i": int(value)} if isinstance(value, np.integer) else value
    if isinstance(value, (float, np.floating)):
        return {"f": float(value).hex()}
    name = type(value).__name__
    if _TYPES.get(name) is type(value):   # registered before plain tuples: a NamedTuple is one
        return {"data": name, "fields": {f: _encode(getattr(value, f)) for f in _fields(type(value))}}
    if type(value) is tuple:              # exactly: another tuple type must come back as itself
        return [_encode(v) for v in value]
    if isinstance(value, np.dtype):
        return {"dtype": value.str if value.kind not in "V" else str(value)}
    if isinstance(value, Node):
        return {"node": [value.op, list(value.inputs), _encode(value.attrs), list(value.shape), value.dtype]}
    raise NotSerializable(f"an attribute of type {type(value).__module__}.{name} has no data form")


def _decode(value):
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, list):
        return tuple(_decode(v) for v in value)
    if isinstance(value, dict):
        if "f" in value:
            return float.fromhex(value["f"])
        if "i" in value:
            return int(value["i"])
        if "dtype" in value:
            return np.dtype(str(value["dtype"]))
        if "node" in value:
            op, inputs, attrs, shape, dtype = value["node"]
            return Node(str(op), tuple(int(i) for i in inputs), _decode(attrs), tuple(int(d) for d in shape),
                        str(dtype))
        if "data" in value and value["data"] in _TYPES:
            cls = _TYPES[value["data"]]
            return cls(**{k: _decode(v) for k, v in value["fields"].items()})
    raise NotSerializable(f"not an attribute: {str(value)[:80]}")


def _array(a: np.ndarray) -> dict:
    a = np.ascontiguousarray(a)
    return {"dtype": str(a.dtype), "shape": list(a.shape), "data": base64.b64encode(a.tobytes()).decode("ascii")}


def _from_array(d: dict) -> np.ndarray:
    data = base64.b64decode(d["data"].encode("ascii"), validate=True)
    return np.frombuffer(data, dtype=np.dtype(d["dtype"])).reshape(tuple(d["shape"])).copy()


def to_data(graph: Graph) -> dict:
    """`graph` as a JSON-safe dict (`NotSerializable` if it has opaque primitives or unregistered attributes)."""
    if graph.opaque:
        raise NotSerializable(f"the program has {len(graph.opaque)} opaque primitive(s) "
                              f"({', '.join(sorted({o.name for o in graph.opaque}))})")
    data = {"nodes": [_encode(n)["node"] for n in graph.nodes], "outputs": list(graph.outputs),
            "consts": [_array(c) for c in graph.consts], "n_args": graph.n_args,
            "hidden_outputs": graph.hidden_outputs}
    if graph.guard is not None:   # only where there is one: an unguarded program's data (and key) stays as it was
        data["guard"] = {"exponent": graph.guard.exponent, "args": list(graph.guard.args),
                         "fallback": to_data(graph.guard.fallback)}
    return data


def from_data(data: dict) -> Graph:
    """The graph `to_data` wrote; `NotSerializable` for anything that is not one (checked, never trusted)."""
    try:
        graph = Graph(consts=[_from_array(c) for c in data["consts"]], n_args=int(data["n_args"]),
                      hidden_outputs=int(data["hidden_outputs"]))
        for entry in data["nodes"]:
            node = _decode({"node": entry})
            if any(i < 0 for i in node.inputs):
                raise NotSerializable("a node reads a negative id")
            graph.add(node)
        graph.outputs = [int(o) for o in data["outputs"]]
        if not all(0 <= o < len(graph.nodes) for o in graph.outputs):
            raise NotSerializable("an output is not a node")
        if data.get("guard") is not None:
            guard = data["guard"]
            args = tuple(int(k) for k in guard["args"])
            if not all(0 <= k < graph.n_args for k in args):
                raise NotSerializable("the guard checks an argument the program does not have")
            graph.guard = Guard(int(guard["exponent"]), args, from_data(guard["fallback"]))
        return graph
    except NotSerializable:
        raise
    except Exception as exc:   # noqa: BLE001  - a malformed document, whatever broke
        raise NotSerializable(f"not a program ({type(exc).__name__}: {str(exc)[:120]})") from None


def dumps(data) -> str:
    """Canonical JSON: the same data always gives the same text (what content hashes are taken of)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)


def digest(*parts: str) -> str:
    """sha256 hex digest of the parts, each length-prefixed (no two part lists share a digest)."""
    h = hashlib.sha256()
    for p in parts:
        b = p.encode()
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


register(lax.ConvDimensionNumbers)   # a convolution's attribute (core/ops.py)
