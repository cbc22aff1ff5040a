"""Random well-typed JAX programs for fuzzing superopt, and the checks a program must pass.

A program is data: argument types and statements of Python source, each assigning one value `v<k>`
from earlier values, closed-over constants and literals. `Program.source` is a complete function, so
a failing example prints as code that can be pasted, unchanged, into tests/test_regressions.py.

The generator builds programs by construction, never by rejection: every op picks operands of the
types it needs among the values so far (recent ones first, for deep chains) and, where none fits,
adds a new argument of a fitting type. Result types come from `jax.eval_shape` of each statement, so
the generator never has to agree with JAX's type rules. Shapes use size-1 and odd dimensions, operands
broadcast against each other, and the dtypes are f32, f16, bf16, i32 and i8.

Besides these mixed programs, `programs(kind)` draws five kinds aimed at what random small values miss
(`KINDS`): "integer" programs (i32, i8, u8) that multiply by and square values near the square root of the
dtype's largest value, so products wrap, and feed them to the ops whose range facts wraparound breaks
(max with 0, min with 1, abs, x - max(x)); "histogram" programs that compare values against bin edges
computed in the program (`linspace`, `lo + i * w`, a lerp of the ends, the data's own min and max, a
sorted argument), count them with `(x[:, None] >= edges)` masks, bin indices and bincount-like
`idx[:, None] == arange`, weigh and normalize them; "float64" programs (run under `jax.enable_x64`,
`Program.context`); "loops" programs (`_Builder.loop`: scans, fori_loops, while loops, conds and switches,
loops nested in loops, carries of several dtypes, trip counts from 1 to 12, so that each loop pass and the
search of bodies run); and "custom" programs that call functions with their own derivative rules
(`CUSTOM_FUNCTIONS`: jax.nn's relu and relu6, and tests/custom_rules.py's gradient clipping,
straight-through round and floor, a safe norm, a relu whose derivative at 0 is 1 and a clip whose gradient
passes inside its bounds). Each kind draws its
inputs where its programs turn: integers near the square root of the dtype's largest value
(`root_args`), floats on a grid of quarters that holds the bin edges and the kinks (`grid_args`).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from jax import lax

from custom_rules import CUSTOM_VJP, RULES
from superopt.core.dtypes import is_float

FLOATS = ("float32", "float16", "bfloat16")
INTS = ("int32", "int8")
DTYPES = FLOATS + INTS
DIMS = (1, 2, 3, 4, 5, 7, 8, 16)
MAX_OUTPUTS = 6
MAX_ELEMENTS = 4096             # per value: keeps every program fast on the NPU emulator and the reference


# Elementwise ops of one operand, as source templates. Ops with a restricted domain get |x| first, so
# most values stay finite and a NaN, where it appears, is a real one.
_FLOAT_UNARY = (
    "-{x}", "jnp.abs({x})", "jnp.sign({x})", "jnp.floor({x})", "jnp.ceil({x})", "jnp.round({x})",
    "lax.round({x})", "jnp.exp({x})", "jnp.log(jnp.abs({x}))", "jnp.log1p(jnp.abs({x}))", "jnp.expm1({x})",
    "jnp.tanh({x})", "jax.nn.sigmoid({x})", "jnp.sqrt(jnp.abs({x}))", "lax.rsqrt(jnp.abs({x}) + 1)",
    "jnp.sin({x})", "jnp.cos({x})", "jnp.square({x})", "lax.erf({x})", "jnp.arctan({x})",
    "jax.nn.relu({x})", "{x} ** 2", "{x} ** 3", "jax.nn.gelu({x})", "jax.nn.softmax({x}, axis=-1)",
    "jax.nn.silu({x})", "lax.stop_gradient({x})",
)
_INT_UNARY = ("-{x}", "jnp.abs({x})", "jnp.sign({x})", "~{x}", "{x} ** 2", "jax.nn.relu({x})")
_FLOAT_BINARY = ("{x} + {y}", "{x} - {y}", "{x} * {y}", "{x} / {y}", "jnp.maximum({x}, {y})",
                 "jnp.minimum({x}, {y})", "jnp.arctan2({x}, {y})")
_INT_BINARY = ("{x} + {y}", "{x} - {y}", "{x} * {y}", "jnp.maximum({x}, {y})", "jnp.minimum({x}, {y})",
               "{x} & {y}", "{x} | {y}", "{x} ^ {y}")
# Products that wrap where {k} is near the square root of the dtype's largest value (`_Builder.wrap`), and
# the ops a range or sign fact of an integer operand would remove (`_Builder.fact`; the last two need an axis).
_WRAPS = ("{x} * {k}", "({x} + {k}) * ({y} + {k})", "({x} + {k}) * ({x} - {k})", "({x} + {k}) ** 2",
          "jnp.square({x} + {k})", "({x} * {k}) * {y}", "({x} + {k}) * {y}")
_FACTS = ("jnp.maximum({x}, 0)", "jnp.minimum({x}, 1)", "jnp.abs({x})", "jax.nn.relu({x})", "jnp.minimum(-{x}, 1)",
          "jnp.maximum(jnp.abs({x}), 1)", "jnp.clip({x}, 0, 1)", "jnp.where({x} >= 0, {x}, 0)",
          "({x} > 0).astype({x}.dtype)", "jnp.maximum({x} + {x}, 0)",
          "{x} - jnp.max({x}, axis=-1, keepdims=True)", "jnp.sum(jnp.maximum({x}, 0), axis=-1)")
_FLOAT_LITERALS = ("0.0", "1.0", "-1.0", "0.5", "2.0", "3.0")
_INT_LITERALS = ("0", "1", "-1", "2", "3")
_COMPARISONS = ("<", ">", "<=", ">=", "==", "!=")
# Primitives superopt does not model: they must pass through as opaque nodes.
_OPAQUE = ("jnp.cumsum({x}, axis=-1)", "jnp.flip({x}, axis=0)", "jnp.sort({x}, axis=-1)")


# Functions the "custom" kind calls: jax.nn's custom_jvp functions and the user-written rules of
# tests/custom_rules.py.
CUSTOM_FUNCTIONS = ("jax.nn.relu", "jax.nn.relu6", *RULES)
_NAMESPACE = {"jax": jax, "jnp": jnp, "lax": lax, "np": np, **RULES}


@dataclass(frozen=True)
class Value:
    name: str
    shape: tuple
    dtype: str

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Program:
    args: tuple                 # ((shape, dtype), ...) of the arguments a0, a1, ...
    lines: tuple                # statements "v<k> = <expression>" over arguments and earlier values
    outputs: tuple              # names of the returned values
    exact: bool = False         # every value is an integer (or bool): outputs must match exactly
    kind: str = "mixed"         # which of `KINDS` drew it

    @property
    def source(self) -> str:
        params = ", ".join(f"a{i}" for i in range(len(self.args)))
        body = "\n".join(f"    {line}" for line in self.lines)
        return f"def program({params}):\n{body}\n    return {', '.join(self.outputs)}\n"

    @property
    def n_ops(self) -> int:
        return len(self.lines)

    def function(self):
        """The program as a Python function (its source, executed; the functions the "custom" kind calls
        by name are tests/custom_rules.py's)."""
        scope = dict(_NAMESPACE)
        exec(compile(self.source, "<fuzzed program>", "exec"), scope)
        return scope["program"]

    def context(self):
        """What the program runs under (`Kind.context`: x64 for the float64 kind)."""
        return KINDS[self.kind].context()

    @property
    def forward_mode(self) -> bool:
        """Whether `jax.jvp` can differentiate it: a custom_vjp function has no forward mode."""
        return not any(f"{name}(" in line for line in self.lines for name in CUSTOM_VJP)

    def __repr__(self):  # what Hypothesis prints for a failing example
        under = " under jax.enable_x64(True)" if KINDS[self.kind].x64 else ""
        return f"Program(kind={self.kind!r}, args={self.args!r}){under}:\n{self.source}"


def _shape_str(shape: tuple) -> str:
    return repr(tuple(int(d) for d in shape))


class _Builder:
    """One program under construction; `draw` is Hypothesis's."""

    def __init__(self, draw, dtypes=DTYPES):
        self.draw = draw
        self.dtypes = dtypes                 # what new arguments and operands are drawn among
        self.floats = tuple(d for d in dtypes if is_float(d))
        self.ints = tuple(d for d in dtypes if not is_float(d))
        self.values: list[Value] = []
        self.args: list[tuple] = []
        self.lines: list[str] = []
        self.computed: list[Value] = []
        self.read: set = set()

    # ---- values ----
    def new_arg(self, shape: tuple, dtype: str) -> Value:
        v = Value(f"a{len(self.args)}", tuple(shape), dtype)
        self.values.append(v)
        self.args.append((tuple(shape), dtype))
        return v

    def emit(self, expression: str, operands: list[Value]) -> Value | None:
        """Append `v<k> = expression`, typed by tracing it; None (nothing appended) where it is too big."""
        name = f"v{len(self.computed)}"
        scope = dict(_NAMESPACE)
        structs = [jax.ShapeDtypeStruct(v.shape, jnp.dtype(v.dtype)) for v in operands]
        names = [v.name for v in operands]
        # the values as globals of the expression: a loop's lambda reads them as a closure does
        out = jax.eval_shape(lambda *xs: eval(expression, {**scope, **dict(zip(names, xs))}), *structs)
        v = Value(name, tuple(out.shape), str(jnp.dtype(out.dtype)))
        if v.size > MAX_ELEMENTS:
            return None
        self.values.append(v)
        self.computed.append(v)
        self.lines.append(f"{name} = {expression}")
        self.read.update(names)
        return v

    def pick(self, accept) -> Value | None:
        """An existing value satisfying `accept`, recent ones first (shrinks towards the newest), and
        half the time one that nothing reads yet, so that few values end up unused."""
        fits = [v for v in self.values if accept(v)]
        unread = [v for v in fits if v.name not in self.read]
        if unread and self.draw(st.booleans()):
            fits = unread
        if not fits:
            return None
        return fits[len(fits) - 1 - self.draw(st.integers(0, len(fits) - 1))]

    def shape(self, min_rank: int = 0, max_rank: int = 4) -> tuple:
        rank = self.draw(st.integers(min_rank, max_rank))
        return tuple(self.draw(st.lists(st.sampled_from(DIMS), min_size=rank, max_size=rank)))

    def dtype(self, among=None) -> str:
        return self.draw(st.sampled_from(among or self.dtypes))

    def operand(self, accept=lambda v: True, min_rank: int = 0, dtypes=None) -> Value:
        """A value to operate on: usually an existing one, sometimes a fresh argument."""
        dtypes = dtypes or self.dtypes
        ok = lambda v: v.dtype in dtypes and len(v.shape) >= min_rank and accept(v)
        found = self.pick(ok) if self.draw(st.integers(0, 4)) else None
        if found is not None:
            return found
        while True:
            shape, dtype = self.shape(min_rank), self.dtype(dtypes)
            candidate = Value("", shape, dtype)
            if ok(candidate) and candidate.size <= MAX_ELEMENTS:
                return self.new_arg(shape, dtype)

    def partner(self, x: Value) -> Value:
        """A value of x's dtype whose shape broadcasts with x's: x itself, an existing one, or a new
        argument with some of x's axes set to 1 and some leading axes dropped."""
        def broadcasts(v):
            try:
                return math.prod(np.broadcast_shapes(v.shape, x.shape)) <= MAX_ELEMENTS
            except ValueError:
                return False
        kind = self.draw(st.integers(0, 3))
        if kind == 0:
            return x
        if kind == 1:
            found = self.pick(lambda v: v.dtype == x.dtype and v is not x and broadcasts(v))
            if found is not None:
                return found
        drop = self.draw(st.integers(0, len(x.shape)))
        shape = tuple(1 if self.draw(st.booleans()) and d != 1 and kind == 3 else d for d in x.shape[drop:])
        return self.new_arg(shape, x.dtype)

    def constant(self, shape: tuple, dtype: str) -> str:
        seed = self.draw(st.integers(0, 99))
        if not is_float(dtype):
            low = 0 if dtype.startswith("u") else -8
            return f"np.random.default_rng({seed}).integers({low}, 9, {_shape_str(shape)}).astype(np.{dtype})"
        return f"np.random.default_rng({seed}).standard_normal({_shape_str(shape)}).astype(jnp.{dtype})"

    # ---- ops: each appends one statement (or none, where the result would be too large) ----
    def unary(self):
        x = self.operand()
        template = self.draw(st.sampled_from(_FLOAT_UNARY if is_float(x.dtype) else _INT_UNARY))
        if "axis" in template and not x.shape:
            template = "jnp.exp({x})"   # softmax needs an axis
        return self.emit(template.format(x=x.name), [x])

    def binary(self):
        x = self.operand()
        y = self.partner(x)
        table = _FLOAT_BINARY if is_float(x.dtype) else _INT_BINARY
        a, b = (x, y) if self.draw(st.booleans()) else (y, x)
        return self.emit(self.draw(st.sampled_from(table)).format(x=a.name, y=b.name), [a, b])

    def literal(self):
        x = self.operand()
        lit = self.draw(st.sampled_from(_FLOAT_LITERALS if is_float(x.dtype) else _INT_LITERALS))
        op = self.draw(st.sampled_from("+-*/" if is_float(x.dtype) else "+-*"))
        if op == "/" and float(lit) == 0:
            lit = "2.0"
        text = f"{x.name} {op} {lit}" if self.draw(st.booleans()) or op == "/" else f"{lit} {op} {x.name}"
        return self.emit(text, [x])

    def constant_operand(self):
        x = self.operand()
        shape = x.shape[self.draw(st.integers(0, len(x.shape))):]
        op = self.draw(st.sampled_from("+-*"))
        return self.emit(f"{x.name} {op} {self.constant(shape, x.dtype)}", [x])

    def select(self):
        x = self.operand()
        y = self.partner(x)
        cmp = self.draw(st.sampled_from(_COMPARISONS))
        a, b = (x, y) if self.draw(st.booleans()) else (y, x)
        return self.emit(f"jnp.where({x.name} {cmp} {y.name}, {a.name}, {b.name})", [x, y])

    def matmul(self):
        x = self.operand(min_rank=1)
        k = x.shape[-1]
        n = self.draw(st.sampled_from(DIMS))
        form = self.draw(st.integers(0, 3))
        if form == 3 and len(x.shape) == 3:   # batched: [b, m, k] @ [b, k, n]
            w = self.new_arg((x.shape[0], k, n), x.dtype)
            return self.emit(f"{x.name} @ {w.name}", [x, w])
        if form == 2 and len(x.shape) >= 2:   # x^T contracted on its second-to-last axis: [m', m] @ x
            w = self.new_arg((n, x.shape[-2]), x.dtype)
            return self.emit(f"{w.name} @ {x.name}", [x, w])
        if form == 1 and x.dtype in ("float16", "bfloat16", "int8"):   # widened operands (mixed precision)
            w = self.new_arg((k, n), x.dtype)
            return self.emit(f"{x.name}.astype(jnp.float32) @ {w.name}.astype(jnp.float32)", [x, w])
        found = self.pick(lambda v: v.dtype == x.dtype and len(v.shape) == 2 and v.shape[0] == k)
        if found is not None and self.draw(st.booleans()):
            return self.emit(f"{x.name} @ {found.name}", [x, found])
        if self.draw(st.booleans()):
            return self.emit(f"{x.name} @ {self.constant((k, n), x.dtype)}", [x])
        w = self.new_arg((k, n), x.dtype)
        return self.emit(f"{x.name} @ {w.name}", [x, w])

    def reduce(self):
        x = self.operand(min_rank=1)
        rank = len(x.shape)
        axes = tuple(sorted(self.draw(st.sets(st.integers(0, rank - 1), min_size=1, max_size=rank))))
        axis = axes[0] if len(axes) == 1 else axes
        fns = ["sum", "max", "min", "prod"] + (["mean"] if is_float(x.dtype) else [])
        fn = self.draw(st.sampled_from(fns + ["argmax", "argmin"]))
        if fn in ("argmax", "argmin"):
            return self.emit(f"jnp.{fn}({x.name}, axis={axes[0]})", [x])
        keep = self.draw(st.booleans())
        return self.emit(f"jnp.{fn}({x.name}, axis={axis}, keepdims={keep})", [x])

    def transpose(self):
        x = self.operand(min_rank=2)
        perm = tuple(self.draw(st.permutations(range(len(x.shape)))))
        return self.emit(f"jnp.transpose({x.name}, {perm})", [x])

    def reshape(self):
        x = self.operand(min_rank=1)
        shape = list(x.shape)
        kind = self.draw(st.integers(0, 3))
        if kind == 0:
            shape = [x.size]
        elif kind == 1 and len(shape) >= 2:
            i = self.draw(st.integers(0, len(shape) - 2))
            shape[i:i + 2] = [shape[i] * shape[i + 1]]
        elif kind == 2:
            i = self.draw(st.integers(0, len(shape)))
            shape.insert(i, 1)
        else:
            i = self.draw(st.integers(0, len(shape) - 1))
            factors = [f for f in range(2, shape[i]) if shape[i] % f == 0]
            if factors:
                f = self.draw(st.sampled_from(factors))
                shape[i:i + 1] = [f, shape[i] // f]
            elif shape[i] == 1:
                del shape[i]
        return self.emit(f"{x.name}.reshape({_shape_str(shape)})", [x])

    def broadcast(self):
        x = self.operand()
        lead = tuple(self.draw(st.lists(st.sampled_from(DIMS), max_size=2)))
        shape = lead + tuple(self.draw(st.sampled_from(DIMS)) if d == 1 else d for d in x.shape)
        if math.prod(shape) > MAX_ELEMENTS:
            shape = x.shape
        return self.emit(f"jnp.broadcast_to({x.name}, {_shape_str(shape)})", [x])

    def slice(self):
        x = self.operand(min_rank=1)
        index = []
        for d in x.shape:
            start = self.draw(st.integers(0, d - 1))
            stop = self.draw(st.integers(start + 1, d))
            step = self.draw(st.sampled_from((1, 1, 2, 3)))
            index.append(f"{start}:{stop}:{step}" if step != 1 else f"{start}:{stop}")
        return self.emit(f"{x.name}[{', '.join(index)}]", [x])

    def pad(self):
        x = self.operand(min_rank=1)
        widths = tuple((self.draw(st.integers(0, 2)), self.draw(st.integers(0, 2))) for _ in x.shape)
        if self.draw(st.booleans()):
            return self.emit(f"jnp.pad({x.name}, {widths})", [x])
        config = tuple((lo, hi, self.draw(st.integers(0, 1))) for lo, hi in widths)
        return self.emit(f"lax.pad({x.name}, jnp.zeros((), {x.name}.dtype), {config})", [x])

    def concat(self):
        x = self.operand(min_rank=1)
        axis = self.draw(st.integers(0, len(x.shape) - 1))
        same = lambda v: v.dtype == x.dtype and len(v.shape) == len(x.shape) and all(
            a == b for i, (a, b) in enumerate(zip(v.shape, x.shape)) if i != axis)
        y = self.pick(same) if self.draw(st.booleans()) else None
        if y is None:
            shape = list(x.shape)
            shape[axis] = self.draw(st.sampled_from(DIMS))
            y = self.new_arg(tuple(shape), x.dtype)
        if self.draw(st.integers(0, 3)) == 0 and y.shape == x.shape:
            return self.emit(f"jnp.stack([{x.name}, {y.name}], axis={axis})", [x, y])
        return self.emit(f"jnp.concatenate([{x.name}, {y.name}], axis={axis})", [x, y])

    def convert(self):
        x = self.operand()
        to = self.dtype(tuple(d for d in self.dtypes if d != x.dtype) or DTYPES)
        return self.emit(f"{x.name}.astype(jnp.{to})", [x])

    def iota(self):
        x = self.operand(min_rank=1)
        d = self.draw(st.integers(0, len(x.shape) - 1))
        return self.emit(f"{x.name} + lax.broadcasted_iota(jnp.{x.dtype}, {_shape_str(x.shape)}, {d})", [x])

    def pool(self):
        x = self.operand(min_rank=2, dtypes=self.floats or FLOATS)
        window = tuple(self.draw(st.integers(1, min(d, 3))) for d in x.shape)
        strides = tuple(self.draw(st.integers(1, 2)) for _ in x.shape)
        if self.draw(st.booleans()):
            init, fn = f"jnp.array(-jnp.inf, {x.name}.dtype)", "lax.max"
        else:
            init, fn = f"jnp.zeros((), {x.name}.dtype)", "lax.add"
        return self.emit(f"lax.reduce_window({x.name}, {init}, {fn}, {window}, {strides}, 'VALID')", [x])

    def conv(self):
        x = self.operand(min_rank=4, dtypes=self.floats or FLOATS, accept=lambda v: len(v.shape) == 4)
        kh, kw = (self.draw(st.integers(1, min(d, 3))) for d in x.shape[1:3])
        w = self.new_arg((kh, kw, x.shape[3], self.draw(st.sampled_from(DIMS))), x.dtype)
        padding = self.draw(st.sampled_from(("'SAME'", "'VALID'")))
        return self.emit(f"lax.conv_general_dilated({x.name}, {w.name}, (1, 1), {padding}, "
                         f"dimension_numbers=('NHWC', 'HWIO', 'NHWC'))", [x, w])

    def opaque(self):
        x = self.operand(min_rank=1)
        return self.emit(self.draw(st.sampled_from(_OPAQUE)).format(x=x.name), [x])

    # ---- the ops of the kinds ----
    def loop(self):
        """A loop or a branch (`_LOOP_FORMS`) whose body is elementwise ops of its carry and what it reads:
        a scan with a carry and ys (reversed or not), a fori_loop carrying a value from one iteration to the
        next, a row loop writing `.at[i].set`, a while loop with a counter, a fori_loop carrying a float and
        an integer, a cond, a switch of three branches, a loop nested in a loop, and a scan over x's rows
        12 times whose carry reads work that reads no carry (a loop to split). Trip counts of 1, 3, 9
        and 12 (short loops are written out, long ones stay loops whose bodies are searched)."""
        form = self.draw(st.sampled_from(_LOOP_FORMS))
        x = self.operand(min_rank=1 if form in ("scan", "rows") else 0)
        floats = is_float(x.dtype)

        def un(var: str) -> str:
            template = self.draw(st.sampled_from(_FLOAT_UNARY if floats else _INT_UNARY))
            return ("jnp.abs({x})" if "axis" in template else template).format(x=var)

        def bi(a: str, b: str) -> str:
            return self.draw(st.sampled_from(_FLOAT_BINARY if floats else _INT_BINARY)).format(x=a, y=b)

        trips = self.draw(st.sampled_from((1, 3, 9, 12)))
        y = self.partner(x)
        if np.broadcast_shapes(y.shape, x.shape) != x.shape:
            y = x                                   # what the body reads must not change the carry's shape
        operands = [x] if y is x else [x, y]
        if form == "scan":
            init = self.new_arg(x.shape[1:], x.dtype)
            reverse = ", reverse=True" if self.draw(st.booleans()) else ""
            text = (f"lax.scan(lambda c, r: ({bi('c', un('r'))}, {un('c')}), {init.name}, {x.name}{reverse})"
                    f"[{self.draw(st.integers(0, 1))}]")
            operands = [x, init]
        elif form == "fission":   # a recurrence beside work that reads no carry, 12 times x's rows: split
            init = self.new_arg(x.shape[1:], x.dtype)
            free = un("r")
            operands = [x, init]
            if floats and len(x.shape) >= 2 and self.draw(st.booleans()):
                w = self.new_arg((x.shape[-1], x.shape[-1]), x.dtype)
                free, operands = un(f"(r @ {w.name})"), [x, init, w]
            reps = ", ".join(["12"] + ["1"] * (len(x.shape) - 1))
            text = (f"lax.scan(lambda c, r: ({bi('c', free)}, {bi(un('c'), free)}), {init.name}, "
                    f"jnp.tile({x.name}, ({reps},)))[{self.draw(st.integers(0, 1))}]")
        elif form == "fori":
            text = f"lax.fori_loop(0, {trips}, lambda i, c: {bi(un('c'), y.name)}, {x.name})"
        elif form == "rows":
            text = (f"lax.fori_loop(0, {x.name}.shape[0], lambda i, c: c.at[i].set({un(x.name + '[i]')}), "
                    f"jnp.zeros_like({x.name}))")
        elif form == "while":
            text = (f"lax.while_loop(lambda s: s[0] < {trips}, lambda s: (s[0] + 1, {bi(un('s[1]'), y.name)}), "
                    f"(0, {x.name}))[1]")
        elif form == "carries":
            k = self.operand(dtypes=self.ints or INTS)
            f, g = (x, k) if floats else (self.operand(dtypes=self.floats or FLOATS), x)
            step = f"jnp.sum(s[1]).astype(s[0].dtype)"
            floats = True
            new_f = un("s[0]")
            floats = False
            text = (f"lax.fori_loop(0, {trips}, lambda i, s: ({new_f} + {step}, {un('s[1]')} + i.astype(s[1].dtype)), "
                    f"({f.name}, {g.name}))[{self.draw(st.integers(0, 1))}]")
            operands = [f, g]
        elif form in ("cond", "switch"):
            index = f"jnp.sum({x.name}) > 0" if form == "cond" else f"jnp.sum({x.name}).astype(jnp.int32) % 3"
            branches = [f"lambda a: {un('a')}" for _ in range(2 if form == "cond" else 3)]
            text = (f"lax.cond({index}, {branches[0]}, {branches[1]}, {x.name})" if form == "cond" else
                    f"lax.switch({index}, [{', '.join(branches)}], {x.name})")
        else:   # nested
            inner = self.draw(st.sampled_from((1, 3, 9, 12)))
            text = (f"lax.fori_loop(0, {trips}, lambda i, c: lax.fori_loop(0, {inner}, lambda j, d: "
                    f"{bi(un('d'), 'c')}, c), {x.name})")
        try:
            return self.emit(text, operands)
        except TypeError:   # a body whose result type is not its carry's (a promotion): drawn again
            return None

    def wrap(self):
        """A product of integers near the square root of the dtype's largest value (int32: 46341 ** 2 is
        negative), half the time fed straight to an op whose range fact wraparound breaks."""
        x = self.operand(dtypes=self.ints or INTS)
        k = math.isqrt(int(np.iinfo(x.dtype).max)) + self.draw(st.integers(-2, 2))
        if not x.dtype.startswith("u") and self.draw(st.booleans()):
            k = -k
        template = self.draw(st.sampled_from(_WRAPS))
        y = self.partner(x) if "{y}" in template else x
        v = self.emit(template.format(x=x.name, y=y.name, k=k), [x, y] if y is not x else [x])
        return self.fact(v) if v is not None and self.draw(st.booleans()) else v

    def fact(self, x: Value | None = None):
        """An op that a range or sign fact of its integer operand would remove (`_FACTS`)."""
        x = x or self.operand(dtypes=self.ints or INTS)
        template = self.draw(st.sampled_from(_FACTS if x.shape else _FACTS[:-2]))
        return self.emit(template.format(x=x.name), [x])

    def custom(self):
        """A call of a function with a derivative rule of its own (`CUSTOM_FUNCTIONS`)."""
        x = self.operand(dtypes=self.floats or FLOATS)
        fn = self.draw(st.sampled_from(CUSTOM_FUNCTIONS))
        return self.emit(f"{fn}({x.name})", [x])

    def histogram(self):
        """Values counted into bins whose edges the program computes (`edges`): `(x[:, None] >= edges)`
        masks summed, one-hot masks (weighed by a matmul), bin indices by comparison or floor and their
        bincount-like `idx[:, None] == arange` counts, weighted and normalized counts, and values compared
        with one edge. On `grid_args` inputs many values lie exactly on an edge."""
        x = self.operand(dtypes=self.floats or FLOATS, accept=lambda v: 0 < v.size <= 256)
        n = self.draw(st.integers(1, 8))
        lo = self.draw(st.sampled_from((-3.0, -2.0, -1.5, -1.0, -0.5, 0.0)))
        w = self.draw(st.sampled_from((0.25, 0.5, 0.75, 1.0, 1.5, 3.0)))
        edges = self.edges(x, n, lo, w)
        xs, e, dt = f"{x.name}.reshape(-1)", edges.name, x.dtype
        inside = f"({xs}[:, None] >= {e}[:-1]) & ({xs}[:, None] < {e}[1:])"
        form = self.draw(st.sampled_from(("cumulative", "counts", "index", "last closed", "floor", "one-hot",
                                          "weighted", "against one edge")))
        if form == "against one edge":
            k = self.draw(st.integers(0, n))
            return self.emit(f"jnp.where({x.name} >= {e}[{k}], {x.name}, -{x.name})", [x, edges])
        if form == "weighted":
            weights = self.new_arg((x.size,), dt)
            return self.emit(f"jnp.sum(jnp.where({inside}, {weights.name}[:, None], 0), axis=0)",
                             [x, edges, weights])
        if form == "one-hot":
            hot = self.emit(f"({inside}).astype(jnp.{dt})", [x, edges])
            if hot is None or self.draw(st.booleans()):
                return hot
            weights = self.new_arg((x.size, self.draw(st.sampled_from((1, 2, 3)))), dt)
            return self.emit(f"{hot.name}.T @ {weights.name}", [hot, weights])
        if form in ("cumulative", "counts"):
            counts = self.emit(f"jnp.sum({xs}[:, None] >= {e}, axis=0)" if form == "cumulative" else
                               f"jnp.sum({inside}, axis=0)", [x, edges])
        else:
            index = self.emit({
                "index": f"jnp.sum({x.name}[..., None] >= {e}[1:-1], axis=-1)",
                # np.histogram's last bin holds its right edge
                "last closed": f"jnp.minimum(jnp.sum({x.name}[..., None] >= {e}[1:], axis=-1), {n - 1})",
                "floor": f"jnp.clip(jnp.floor(({x.name} - {e}[0]) / ({e}[1] - {e}[0])), 0, {n - 1})"
                         f".astype(jnp.int32)"}[form], [x, edges])
            if self.draw(st.booleans()):
                return index
            counts = self.emit(f"jnp.sum({index.name}.reshape(-1)[:, None] == jnp.arange({n}), axis=0)", [index])
        normalize = self.draw(st.integers(0, 2))
        if normalize == 1:
            return self.emit(f"{counts.name} / jnp.sum({counts.name})", [counts])
        if normalize == 2:
            return self.emit(f"{counts.name}.astype(jnp.{dt}) / {x.size * w!r}", [counts])
        return counts

    def edges(self, x: Value, n: int, lo: float, w: float) -> Value:
        """n + 1 bin edges of x's dtype from lo, w apart, computed one of the ways programs compute them
        (all on the grid of `grid_args` in exact arithmetic, most of them rounded), or the data's own
        minimum and maximum as np.histogram's, or a sorted argument."""
        hi, dt = lo + n * w, x.dtype
        i = f"jnp.arange({n + 1}, dtype=jnp.{dt})"
        form = self.draw(st.sampled_from((
            f"jnp.linspace({lo!r}, {hi!r}, {n + 1}, dtype=jnp.{dt})",
            f"{lo!r} + {i} * {w!r}",
            f"{i} * {w!r} + {lo!r}",
            f"{lo!r} + ({hi!r} - {lo!r}) * ({i} / {n})",
            f"{lo!r} * (1 - {i} / {n}) + {hi!r} * ({i} / {n})",          # a lerp of the ends
            "the data's", "sorted")))
        if form == "sorted":
            bounds = self.new_arg((n + 1,), dt)
            return self.emit(f"jnp.sort({bounds.name})", [bounds])
        if form == "the data's":
            return self.emit(f"jnp.min({x.name}) + (jnp.max({x.name}) - jnp.min({x.name})) * ({i} / {n})", [x])
        return self.emit(form, [])


# Op kinds with their weights: elementwise ops dominate real programs.
_OPS = (("unary", 6), ("binary", 6), ("literal", 3), ("constant_operand", 1), ("select", 2), ("matmul", 3),
        ("reduce", 3), ("transpose", 2), ("reshape", 2), ("broadcast", 1), ("slice", 1), ("pad", 1),
        ("concat", 1), ("convert", 2), ("iota", 1), ("pool", 1), ("conv", 1), ("opaque", 1))
_INTEGER_OPS = (("wrap", 5), ("fact", 3), ("unary", 3), ("binary", 4), ("literal", 2), ("constant_operand", 1),
                ("select", 2), ("matmul", 2), ("reduce", 3), ("transpose", 1), ("reshape", 1), ("broadcast", 1),
                ("slice", 1), ("concat", 1), ("convert", 1), ("iota", 1))
_HISTOGRAM_OPS = (("histogram", 6), ("unary", 2), ("binary", 3), ("literal", 2), ("select", 1), ("matmul", 1),
                  ("reduce", 2), ("reshape", 1), ("slice", 1), ("concat", 1), ("convert", 1), ("opaque", 1))
_LOOP_OPS = (("loop", 6), ("unary", 2), ("binary", 3), ("literal", 2), ("select", 1), ("matmul", 1),
             ("reduce", 2), ("reshape", 1), ("convert", 1))
_LOOP_FORMS = ("scan", "fori", "rows", "while", "carries", "cond", "switch", "nested", "fission")
_CUSTOM_OPS = (("custom", 6), ("unary", 3), ("binary", 3), ("literal", 2), ("select", 1), ("matmul", 2),
               ("reduce", 2), ("transpose", 1), ("reshape", 1), ("broadcast", 1), ("slice", 1), ("concat", 1),
               ("convert", 1), ("opaque", 1))


@dataclass(frozen=True)
class Kind:
    """What a kind of program is drawn from."""
    dtypes: tuple               # argument and operand dtypes (a repeated one is drawn more often)
    ops: tuple                  # (op, weight)
    first: str                  # the inputs of its first call: "random", "roots" or "grid" (`first_args`)
    inputs: tuple               # the input sets `draw_inputs` draws among
    x64: bool = False           # runs under jax.enable_x64
    last: str | None = None     # an op every program ends with

    @property
    def op_names(self) -> tuple:
        return tuple(name for name, weight in self.ops for _ in range(weight))

    def context(self):
        """What its programs are drawn and run under: `jax.enable_x64(True)` for float64 (the flag is the
        calling thread's), nothing otherwise."""
        return jax.enable_x64(True) if self.x64 else contextlib.nullcontext()


INPUT_KINDS = ("random", "random", "zeros", "specials", "scaled", "scaled")
KINDS = {
    "mixed": Kind(DTYPES, _OPS, "random", INPUT_KINDS),
    "integer": Kind(("int32", "int32", "int8", "uint8", "float32"), _INTEGER_OPS, "roots",
                    ("roots", "roots", "random", "zeros", "specials")),
    "histogram": Kind(("float32", "float32", "float16", "bfloat16", "int32"), _HISTOGRAM_OPS, "grid",
                      ("grid", "grid", "random", "zeros", "specials", "scaled")),
    "float64": Kind(("float64", "float64", "float64", "float32", "int64", "int32"), _OPS, "random", INPUT_KINDS,
                    x64=True),
    "loops": Kind(("float32", "float32", "float16", "bfloat16", "int32", "int8"), _LOOP_OPS, "random", INPUT_KINDS),
    "custom": Kind(("float32", "float32", "float32", "int32"), _CUSTOM_OPS, "grid",
                   ("grid", "grid", "random", "zeros", "specials"), last="custom"),
}


@st.composite
def programs(draw, kind: str = "mixed", min_ops: int = 1, max_ops: int = 60) -> Program:
    """A random program of `kind` (`KINDS`) of `min_ops` to `max_ops` statements (one more for a kind
    with a `last` op)."""
    spec = KINDS[kind]
    with spec.context():        # typed as it will run
        b = _Builder(draw, spec.dtypes)
        n_ops = draw(st.integers(min_ops, max_ops))
        while len(b.lines) < n_ops:
            getattr(b, draw(st.sampled_from(spec.op_names)))()
        if spec.last:
            getattr(b, spec.last)()
    # Every value no later statement reads is an output (the newest MAX_OUTPUTS of them), so no
    # statement is dead code.
    sinks = [v.name for v in b.computed if v.name not in b.read]
    outputs = tuple(sinks[-MAX_OUTPUTS:])
    exact = all(not is_float(v.dtype) for v in b.values)
    return Program(tuple(b.args), tuple(b.lines), outputs, exact, kind)


# ---- inputs ----

KINKS = (0.0, -0.0, 0.5, -0.5, 1.0, -1.0)


def grid_args(avals, seed: int) -> list[np.ndarray]:
    """Floats on the grid of quarters in [-4, 4], exact in every float dtype, on which the histogram kind's
    edges lie in exact arithmetic; a third of them the custom rules' kinks (`KINKS`: relu's 0, the clip
    bounds +-1, round's +-0.5). Integers and bools as `random_args`."""
    from superopt.core.verify import random_args
    rng = np.random.default_rng([seed, 4])
    out = []
    for (shape, dtype), a in zip(avals, random_args(avals, seed)):
        if is_float(dtype):
            n = a.size
            vals = np.where(rng.random(n) < 1 / 3, np.array(KINKS)[rng.integers(0, len(KINKS), n)],
                            rng.integers(-16, 17, n) / 4)
            a = vals.astype(np.dtype(dtype)).reshape(shape)
        out.append(a)
    return out


def root_args(avals, seed: int) -> list[np.ndarray]:
    """Integers near the square root of their dtype's largest value (+-(root - 2) to +-(root + 2), where a
    product of two wraps), a third of them `random_args`' small ones. Floats and bools as `random_args`."""
    from superopt.core.verify import random_args
    rng = np.random.default_rng([seed, 52])
    out = []
    for (shape, dtype), a in zip(avals, random_args(avals, seed)):
        dt = np.dtype(dtype)
        if dt.kind in "iu":
            info, n = np.iinfo(dt), a.size
            near = math.isqrt(int(info.max)) + rng.integers(-2, 3, n)
            if dt.kind == "i":
                near = np.where(rng.random(n) < 0.5, -near, near)
            vals = np.where(rng.random(n) < 2 / 3, near, a.reshape(-1).astype(np.int64))
            a = np.clip(vals, int(info.min), int(info.max)).astype(dt).reshape(shape)
        out.append(a)
    return out


def first_args(program: Program, seed: int) -> list[np.ndarray]:
    """The inputs of a program's first call, as its kind draws them (`Kind.first`)."""
    from superopt.core.verify import random_args
    return {"random": random_args, "roots": root_args, "grid": grid_args}[KINDS[program.kind].first](
        program.args, seed)


def draw_inputs(draw, avals, reference=None, kinds: tuple = INPUT_KINDS) -> tuple[str, list]:
    """(a description, arguments) for a fuzzed program, one of `kinds`: random normal, or one of
    superopt.core.verify's adversarial sets with a drawn seed, so never the inputs superopt verified with:
    "zeros" (+-0, subnormals, the smallest normal; integer extremes, int8 -128/127, int32 min/max),
    "specials" (NaN, +-inf, +-max and -0 among random values; integers over their whole range) or
    "scaled" (float arguments per a drawn `scale_patterns` pattern: near the dtype's overflow, near its
    smallest normal, or a mix; calibrated against `reference`, the original under jax.jit, to just below
    where it overflows, or at a drawn exponent without one); or a kind's own: "roots" (`root_args`) or
    "grid" (`grid_args`)."""
    from superopt.core.verify import calibrated, random_args, scale_patterns, scaled_args, special_args
    avals = [(tuple(shape), np.dtype(dtype)) for shape, dtype in avals]
    kind = draw(st.sampled_from(kinds))
    seed = draw(st.integers(2, 2**16))
    patterns = scale_patterns(avals, limit=1000)
    if kind == "scaled" and not patterns:
        kind = "zeros"                  # no float arguments: integer extremes instead
    if kind == "random":
        return f"random inputs (seed {seed})", random_args(avals, seed)
    if kind in ("roots", "grid"):
        return f"{kind} inputs (seed {seed})", (root_args if kind == "roots" else grid_args)(avals, seed)
    if kind in ("zeros", "specials"):
        return f"{kind} inputs (seed {seed})", [_flush_subnormals(a) for a in special_args(avals, kind, seed)]
    name, pattern = draw(st.sampled_from(patterns))
    if reference is not None:
        s, args, _ = calibrated(reference, avals, pattern, seed)
    else:
        s = draw(st.sampled_from((0.25, 0.5, 0.75, 1.0)))
        args = scaled_args(avals, pattern, s, seed)
    return f"scaled inputs ({name}, s={s:.3g}, seed {seed})", args


def _flush_subnormals(a: np.ndarray) -> np.ndarray:
    """`a` with its subnormal floats as zeros of their sign. XLA flushes subnormals to zero in some
    kernels and not in others, as fusion decides, so two programs that compute the same thing (the
    captured program lowered without a single rewrite, against jax.jit of the function) can differ on
    them by a discontinuity at zero (atan2 of a subnormal and 0: +-pi/2 against 0). README.md's contract
    leaves that to XLA; superopt's own verification still draws subnormals and keeps the original
    where they make the programs differ."""
    if not is_float(a.dtype) or a.ndim == 0 and not np.isfinite(np.float64(a)):
        return a
    import ml_dtypes
    wide = np.asarray(a, np.float64)
    sub = (wide != 0) & (np.abs(wide) < float(ml_dtypes.finfo(a.dtype).tiny))
    return np.where(sub, np.copysign(0.0, wide), wide).astype(a.dtype) if sub.any() else a


# ---- the checks ----

def agrees(expected: list, actual: list, original, args, exact: bool, as_dtype: str | None = None,
           numerics: str = "strict") -> str | None:
    """None if `actual` (the optimized program's outputs) keeps the numerics contract against the original's
    `expected`, as superopt's own verification judges it (`superopt.core.verify.judge`): NaN and +-inf in the
    same places (up to the range edge), finite values within the dtype's tolerance (or `as_dtype`'s, for
    a program that computes in a narrower type), or as accurate as the original against the float64 value
    of the original graph. Integer programs must match exactly."""
    from superopt.core.reference import evaluate
    from superopt.core.verify import compare_outputs, judge
    if exact:
        for k, (e, a) in enumerate(zip(expected, actual)):
            if np.asarray(e).dtype != np.asarray(a).dtype or not np.array_equal(e, a):
                return f"output {k}: an integer program's output differs"
        return compare_outputs(expected, actual)
    return judge(expected, actual, lambda: evaluate(original, args, precise=True), numerics, as_dtype)


def same_value(original, candidate, args) -> str | None:
    """None if two graphs compute the same outputs in exact arithmetic: both evaluated by the numpy
    reference in float64 (`evaluate(precise=True)`), where rounding differences between equal programs
    are far below float64's tolerance, so a difference is a wrong rewrite, not rounding."""
    from superopt.core.reference import evaluate
    from superopt.core.verify import compare_outputs
    return compare_outputs(evaluate(original, args, precise=True), evaluate(candidate, args, precise=True))


def narrowest_float(graph) -> str | None:
    """The float type with the widest tolerance that a graph computes in, if narrower than f32: XLA keeps
    more precision than a bf16 or f16 intermediate declares (it drops f32 -> bf16 -> f32 round trips),
    so a program that rounds at the declared type is judged at that type's tolerance."""
    dtypes = {graph.nodes[i].dtype for i in graph.live()}
    return next((d for d in ("bfloat16", "float16") if d in dtypes), None)
