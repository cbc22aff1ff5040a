"""Programs as plain data: a `Graph` to a JSON-safe dict and back, for the persistent cache.

The cache (`superopt/cache.py`) stores chosen programs between processes, so a program must survive a
round trip through JSON exactly: node for node, attribute for attribute, floats bit for bit (infinities and
NaN included). Attributes are ints, floats, strings, booleans, None, tuples, nested `Node`s (a kernel's
body), numpy dtypes, a convolution's `lax.ConvDimensionNumbers`, and the frozen dataclasses that upper layers register
with `register` (a kernel's `Tiling`, the NPU model's `CubeEstimate`); anything else, another tuple type
included, raises `NotSerializable`, and the caller does not cache that
program. An opaque primitive (a JAX primitive bound with its own params: a `while` loop, a sort) is written
as its fingerprint (`opaque_fingerprint`: the primitive's name and a digest of params that are data, jaxprs
included, their constants by their bytes); reading the program back takes the primitive with that fingerprint
from the program being answered (`from_data(..., opaque=)`), so a cached program binds the caller's own
primitives, never one rebuilt from the cache. A primitive whose params hold anything else (a host callback,
a Python function, an effect) has no fingerprint: that program is not cached.

`from_data` never trusts what it reads: a malformed document raises `NotSerializable`, never builds a
graph that `Graph.add` would refuse, and never evaluates code.
"""
from __future__ import annotations

import base64
import dataclasses
import enum
import hashlib
import json

import numpy as np
from jax import lax

from superopt.core.ir import DOMAIN_CHECKS, Graph, Guard, Node, Opaque

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


def array_digest(value) -> str:
    """An array's dtype, shape and the sha256 of its bytes: equal digests, equal arrays."""
    a = np.ascontiguousarray(np.asarray(value))
    return f"{a.dtype.str}{list(a.shape)}:{hashlib.sha256(a.tobytes()).hexdigest()}"


def _param_text(value, owner: str) -> str:
    """A canonical text of one param of an opaque primitive: equal texts, equal params. `NotSerializable` for
    a value that is not data (a callable, an object that prints its address)."""
    from jax.extend import core as jcore   # noqa: PLC0415 - only for programs with opaque primitives
    if value is None or isinstance(value, (bool, str)):
        return repr(value)
    if isinstance(value, (int, np.integer)):
        return f"i{int(value)}"
    if isinstance(value, (float, np.floating)):
        return f"f{float(value).hex()}"
    if isinstance(value, enum.Enum):
        return f"{type(value).__module__}.{type(value).__qualname__}.{value.name}"
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return f"dtype:{np.dtype(value).str}"
    if isinstance(value, tuple) and hasattr(value, "_fields"):   # a NamedTuple (dimension numbers)
        return f"{type(value).__qualname__}(" + ",".join(f"{f}={_param_text(getattr(value, f), owner)}"
                                                         for f in value._fields) + ")"
    if isinstance(value, (tuple, list)):
        return "(" + ",".join(_param_text(v, owner) for v in value) + ")"
    if isinstance(value, dict) or type(value).__name__ == "FrozenDict":
        return "{" + ",".join(f"{k!r}:{_param_text(v, owner)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, (np.ndarray, np.generic)) or type(value).__module__.startswith("jaxlib"):
        return f"array:{array_digest(value)}"
    if type(value).__module__ == "jax._src.flattree":   # JAX 0.12's scan describes its operands as a flat tree
        if hasattr(value, "elts"):
            return "ft(" + ",".join(_param_text(e, owner) for e in value.elts) + ")"
        if hasattr(value, "val"):
            return "fs(" + _param_text(value.val, owner) + ")"
    if isinstance(value, jcore.ClosedJaxpr):
        return "closed(" + _jaxpr_text(value.jaxpr, owner) + ";" + \
            ",".join(_param_text(c, owner) for c in value.consts) + ")"
    if isinstance(value, jcore.Jaxpr):
        return "jaxpr(" + _jaxpr_text(value, owner) + ")"
    raise NotSerializable(f"the opaque primitive {owner} holds a {type(value).__module__}.{type(value).__qualname__}, "
                          "which has no data form")


def _jaxpr_text(jaxpr, owner: str) -> str:
    """The jaxpr's printed form, once every equation's params (nested jaxprs included) are known to be data:
    the printing is then a function of the data (variables are named in order, no addresses)."""
    for eqn in jaxpr.eqns:
        if not isinstance(eqn.primitive, _primitive_type()):
            raise NotSerializable(f"the opaque primitive {owner} runs a {type(eqn.primitive).__name__}")
        for v in eqn.params.values():
            _param_text(v, f"{owner}/{eqn.primitive.name}")
    return str(jaxpr)


def _primitive_type():
    from jax.extend import core as jcore   # noqa: PLC0415
    return jcore.Primitive


def opaque_fingerprint(opaque: Opaque) -> str:
    """What identifies an opaque primitive across processes (module doc); `NotSerializable` where its params
    are not data. A capture stand-in for a group of equations (`Subprogram`) is its jaxpr; an effect has none."""
    prim = opaque.primitive
    if isinstance(prim, _primitive_type()):
        head = f"primitive:{type(prim).__module__}.{type(prim).__qualname__}:{prim.name}"
    elif type(prim).__name__ == "Subprogram" and not opaque.effectful:
        head = f"subprogram:{prim.name}:{_param_text(prim.closed, prim.name)}"
    else:
        raise NotSerializable(f"the opaque primitive {opaque.name} is an effect or a stand-in with no data form")
    text = f"{head};{opaque.n_outputs};{opaque.effectful};{_param_text(dict(opaque.params), opaque.name)}"
    return hashlib.sha256(text.encode()).hexdigest()


def to_data(graph: Graph) -> dict:
    """`graph` as a JSON-safe dict (`NotSerializable` if it has unregistered attributes, or an opaque primitive
    with no fingerprint)."""
    data = {"nodes": [_encode(n)["node"] for n in graph.nodes], "outputs": list(graph.outputs),
            "consts": [_array(c) for c in graph.consts], "n_args": graph.n_args,
            "hidden_outputs": graph.hidden_outputs}
    if graph.opaque:   # only where there are some: a program's data (and key) without them stays as it was
        data["opaque"] = [opaque_fingerprint(o) for o in graph.opaque]
    if graph.guard is not None:   # only where there is one: an unguarded program's data (and key) stays as it was
        data["guard"] = {"exponent": graph.guard.exponent, "args": list(graph.guard.args),
                         "fallback": to_data(graph.guard.fallback)}
        if graph.guard.conditions:
            data["guard"]["conditions"] = [[name, int(i)] for name, i in graph.guard.conditions]
    return data


def from_data(data: dict, opaque: dict | None = None) -> Graph:
    """The graph `to_data` wrote; `NotSerializable` for anything that is not one (checked, never trusted).
    `opaque`: fingerprint -> the `Opaque` of the program being answered, for a graph with opaque primitives."""
    try:
        graph = Graph(consts=[_from_array(c) for c in data["consts"]], n_args=int(data["n_args"]),
                      hidden_outputs=int(data["hidden_outputs"]))
        for fingerprint in data.get("opaque", ()):
            if fingerprint not in (opaque or {}):
                raise NotSerializable("the program's opaque primitives are not the caller's")
            graph.opaque.append(opaque[fingerprint])
        for entry in data["nodes"]:
            node = _decode({"node": entry})
            if any(i < 0 for i in node.inputs):
                raise NotSerializable("a node reads a negative id")
            graph.add(node)
        for node in graph.nodes:
            if node.op == "opaque" and not (0 <= node.attrs[0] < len(graph.opaque)
                                            and 0 <= node.attrs[1] < graph.opaque[node.attrs[0]].n_outputs):
                raise NotSerializable("a node reads an opaque primitive the program does not have")
        graph.outputs = [int(o) for o in data["outputs"]]
        if not all(0 <= o < len(graph.nodes) for o in graph.outputs):
            raise NotSerializable("an output is not a node")
        if data.get("guard") is not None:
            guard = data["guard"]
            args = tuple(int(k) for k in guard["args"])
            if not all(0 <= k < graph.n_args for k in args):
                raise NotSerializable("the guard checks an argument the program does not have")
            fallback = from_data(guard["fallback"], opaque)
            conditions = tuple((str(name), int(i)) for name, i in guard.get("conditions", ()))
            if not all(name in DOMAIN_CHECKS and 0 <= i < len(fallback.nodes) for name, i in conditions):
                raise NotSerializable("the guard checks a condition it does not know, or a node the program lacks")
            exponent = None if guard["exponent"] is None else int(guard["exponent"])
            graph.guard = Guard(exponent, args, fallback, conditions)
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
