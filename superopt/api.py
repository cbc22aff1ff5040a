"""`superopt(fn, target)`: fn as a JAX transformation over the pipeline of `superopt/pipeline.py`."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import threading
import time
import warnings
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import SingleDeviceSharding

from superopt.cache import open_store, refused
from superopt.core import lazy
from superopt.core.modes import Numerics
from superopt.core.ir import pretty
from superopt.egraph.limits import Limits
from superopt.extract.memory import parse_bytes
from superopt.extract.models.registry import model_of
from superopt.extract.target import load_target
from superopt.options import Options
from superopt.pipeline import EXTRACTORS, optimize
from superopt.report import CacheUse, Report
from superopt.rewrites.rule import RuleSet
from superopt.rewrites.schedule import Schedule
from superopt.rulesets import DEFAULT, RULESETS
from superopt.sizes import Sizes
from superopt.stages import Specialization, is_key as _is_key
from superopt.workers import executor_name

npu = lazy.module("superopt.npu_backend")   # the NPU's lowering and emulator: loaded for an NPU target

BACKENDS = ("jax",)          # plus the target kind's own (its KindModel.backends): the NPU emulator, Pallas on a GPU


def _array_like(x) -> bool:
    """An argument superopt specializes on by type: an array, a Python scalar, or (for `.compile`) an
    abstract `jax.ShapeDtypeStruct`."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic, int, float, bool, complex, jax.ShapeDtypeStruct))


def _is_array(x) -> bool:
    """A leaf `superopt(fn, filter=True)` traces: an array (or an abstract one), as `equinox.is_array` says;
    Python scalars, strings and functions are static there."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct))


def _static_leaf(x, where: str):
    try:
        hash(x)
    except TypeError:
        raise TypeError(f"superopt: static argument {where} is a {type(x).__name__}, which is not hashable; "
                        "static values key the cache of specializations, as in jax.jit") from None
    return x


class _Static:
    """The non-array leaves of a call (functions, strings, a module's fields), made static as
    `equinox.filter_jit` makes them; equal and hashed by the leaves' own equality and hash."""

    def __init__(self, tree, items: tuple):
        self.tree, self.items, self.fixed = tree, items, dict(items)
        self._hash = hash((tree, items))

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return isinstance(other, _Static) and self.tree == other.tree and self.items == other.items

    def rebuild(self, dynamic) -> tuple:
        it = iter(dynamic)
        n = len(dynamic) + len(self.items)
        return jax.tree_util.tree_unflatten(self.tree, [self.fixed[k] if k in self.fixed else next(it)
                                                        for k in range(n)])


class Optimized:
    """`fn` as a JAX transformation, with `fn`'s signature (positional and keyword arguments, pytrees with
    None leaves, typed PRNG keys), specialized per argument shapes, dtypes, weak types and static values as
    `jax.jit` specializes.

    Called eagerly it is a `jax.jit` function: a call after the first dispatches through jax.jit's compiled
    fast path. Called under a trace (`jax.jit`, `jax.grad`, `jax.vmap`, `lax.scan`, `jax.export`) it binds
    the chosen program into that trace. Either way the first call for new types captures `fn` at the
    abstract values it sees (one trace of `fn`), optimizes, and verifies on superopt's own concrete
    inputs, never the caller's. On an NPU target an eager call runs the emulator; under a trace the
    extracted program runs as JAX, or through `jax.pure_callback` to the emulator with
    `npu_under_trace="callback"`."""

    def __init__(self, fn: Callable, target: str, rulesets, limits: Limits, verify: bool, extractor: str = "greedy",
                 backend: str | None = None, memory_budget: int | str | None = None, numerics: str = "strict",
                 precision: str | None = None, static_argnums=(), static_argnames=(), donate_argnums=(),
                 donate_argnames=(), npu_under_trace: str = "jax", filter: bool = False, cache=None,
                 executor: str | None = None, tune: bool = False, background: bool = False,
                 reuse_sizes: bool = True):
        # What rebuilds this object elsewhere (`__reduce__`): fn and the options, never a specialization.
        self._options = dict(rulesets=rulesets, limits=limits, verify=verify, extractor=extractor, backend=backend,
                             memory_budget=memory_budget, numerics=numerics, precision=precision,
                             static_argnums=static_argnums, static_argnames=static_argnames,
                             donate_argnums=donate_argnums, donate_argnames=donate_argnames,
                             npu_under_trace=npu_under_trace, filter=filter, cache=cache, executor=executor, tune=tune,
                             background=background, reuse_sizes=reuse_sizes)
        # Every misuse is one line naming the bad value and the valid ones, raised here, before any work.
        if not callable(fn):
            raise TypeError(f"superopt: fn must be callable, got {type(fn).__name__}")
        if not isinstance(target, str):
            raise TypeError(f"superopt: target must be a string such as 'cpu', got {type(target).__name__}")
        tgt = load_target(target)  # an unknown target fails here, listing the valid ones
        if not isinstance(tune, bool):
            raise TypeError(f"superopt: tune must be True or False, got {tune!r}")
        if not isinstance(background, bool):
            raise TypeError(f"superopt: background must be True or False, got {background!r}")
        if not isinstance(reuse_sizes, bool):
            raise TypeError(f"superopt: reuse_sizes must be True or False, got {reuse_sizes!r}")
        self._sizes = Sizes() if reuse_sizes else None   # decisions a call at other sizes may take
        numerics = Numerics.of(numerics)
        precision = None if precision is None else npu.check_precision(precision, tgt)
        if extractor not in EXTRACTORS:
            raise ValueError(f"superopt: unknown extractor {extractor!r}; valid: {', '.join(EXTRACTORS)}")
        model = model_of(tgt)
        backends = BACKENDS + model.backends
        backend = backend or model.default_backend
        if backend not in backends:
            raise ValueError(f"superopt: backend {backend!r} is not available for target {target!r}; "
                             f"valid: {', '.join(backends)}")
        if npu_under_trace not in UNDER_TRACE:
            raise ValueError(f"superopt: npu_under_trace must be one of {', '.join(UNDER_TRACE)}, "
                             f"got {npu_under_trace!r}")
        self.npu_under_trace = npu_under_trace
        memory_budget = None if memory_budget is None else parse_bytes(memory_budget)
        if memory_budget is not None and extractor != "greedy":
            raise ValueError(f"superopt: memory_budget works with the greedy extractor, not {extractor!r}")
        self.fn, self.target = fn, target
        self.cache, self.executor = _cache_option(cache), executor
        executor_name(executor)   # an unknown executor fails here, listing the valid ones
        # validated once, the target loaded once: every specialization and its report use these
        self.options = Options(tgt, _schedule(rulesets), _limits(limits), verify, extractor, backend, memory_budget,
                               numerics, precision, tune)
        self._cache: dict[tuple, Specialization] = {}
        self._last: Specialization | None = None
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", "optimized")
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)
        self.__doc__ = getattr(fn, "__doc__", None)
        self.static_argnums, self.static_argnames = _named_args(fn, static_argnums, static_argnames, "static")
        self.donate_argnums, self.donate_argnames = _named_args(fn, donate_argnums, donate_argnames, "donate")
        self.filter = filter
        if background and (backend == "emulator" or filter):
            raise ValueError(f"superopt: background=True runs jax.jit's program while the {backend} backend's is "
                             "made; it works with the jax and pallas backends, without filter")
        self._tiers = Tiers() if background else None

        def traced(*args, **kwargs):   # runs once per specialization, when jax.jit traces it
            leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
            dynamic = [isinstance(x, jax.core.Tracer) for x in leaves]
            if jax.config.jax_disable_jit or (not any(dynamic) and any(
                    _is_array(x) and not s for x, s in zip(leaves, self._static_mask(args, kwargs)))):
                # jax.jit runs fn itself here: under `jax.disable_jit()`, and on concrete arguments when
                # `jax_debug_nans` re-runs a call whose output has a NaN to find the op that made it
                return fn(*args, **kwargs)
            spec = self._specialize(leaves, tree, dynamic)
            flat = [x for x, d in zip(leaves, dynamic) if d]
            varying = sorted({a for x in flat for a in _varying_axes(x)})
            if not varying:
                return spec.bind(flat, self.npu_under_trace)
            # A `shard_map` body: values vary over manual mesh axes, which the program captured from abstract
            # arguments does not carry. superopt's program binds through lax's functions, which make a value
            # meeting a varying one varying too, but an equation bound as captured (the original program, an
            # opaque op) does not: where binding fails on that, fn is traced here as jax.jit traces it (the
            # equations bound before the failure are dead and dropped with the trace's dead code).
            try:
                return spec.bind(flat, self.npu_under_trace)
            except ValueError as exc:
                if "varying manual axes" not in str(exc):
                    raise
            spec.report.backend.note(f"in a shard_map body (varying over {', '.join(map(str, varying))}) fn runs "
                                     "as traced")
            return fn(*args, **kwargs)

        def filtered(dynamic, static):
            args, kwargs = static.rebuild(dynamic)
            return traced(*args, **kwargs)

        self._traced = functools.wraps(fn)(traced)   # jax.jit reads fn's signature for static_argnames
        self._filtered = filtered
        self._jit, self._filter_jit = self._jitted(filter=False), self._jitted(filter=True)
        self._pins: dict[tuple, Callable] = {}   # per layout of arguments over several devices (`_pinned`)
        self._call = self._emulate if backend == "emulator" else self._filter_call if filter else \
            self._background_call if background else self._first_call
        # A call costs what a jax.jit call costs: on the jax and pallas backends, from the second call on in a
        # process with one device, this object's class calls the jitted function itself (no Python frame of
        # superopt's in between).
        self.__class__ = type(type(self).__name__, (type(self),), {"__call__": staticmethod(self._call),
                                                                    "__module__": type(self).__module__})

    # ---- calling ----

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def _emulate(self, *args, **kwargs):
        """An NPU target's call: on the emulator when the arguments are concrete, else bound as `traced` binds."""
        if _under_trace((args, kwargs)):
            return self._jit(*args, **kwargs)
        spec, flat = self._concrete(args, kwargs)
        return spec.unflatten(spec.run(*flat))

    def _first_call(self, *args, **kwargs):
        """The first call on the jax and pallas backends. In a process with one device every later call is
        the jitted function's, jax.jit's C++ fast path; with several, a later call goes through `_spread`."""
        self._call = self._jit if jax.device_count() == 1 else self._spread
        type(self).__call__ = staticmethod(self._call)
        return self._call(*args, **kwargs)

    def _background_call(self, *args, **kwargs):
        """A call with `background=True`. Eager, for argument types whose program is not ready: jax.jit's program
        of fn runs now, and the first such call starts optimizing in a thread (`Tiers`); once that program is
        verified and compiled, calls run it. Under a trace: as without it (optimized where it is traced,
        waiting for a background optimization of the same types rather than starting another)."""
        if _under_trace((args, kwargs)) or _spread_out(jax.tree_util.tree_leaves((args, kwargs))):
            with self._tiers.lock:
                return self._jit(*args, **kwargs)
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        dynamic = self._dynamic(leaves, args, kwargs)
        key = self._signature(leaves, tree, dynamic)
        if self._tiers.ready(key):
            return self._jit(*args, **kwargs)
        abstract = [jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=jax.typeof(x).weak_type) if d else x
                    for x, d in zip(leaves, dynamic)]
        self._tiers.start(key, lambda: self._optimize_aside(abstract, tree, dynamic))
        self._tiers.failure(key)
        return self._tiers.original(self)(*args, **kwargs)

    def _optimize_aside(self, abstract: list, tree, dynamic: list[bool]) -> None:
        """What the background thread does for one set of argument types: the specialization (from abstract
        arguments: the caller's arrays are not kept), and the jitted program compiled for them."""
        with self._tiers.lock:
            spec = self._specialize(abstract, tree, dynamic)
        args, kwargs = jax.tree_util.tree_unflatten(tree, abstract)
        self._jit.lower(*args, **kwargs).compile()
        return spec

    def wait(self, timeout: float | None = None) -> bool:
        """With `background=True`: wait until every optimization started so far has ended (or `timeout`
        seconds); whether they all have. Calls never wait; this is for tests and for a program that wants
        the optimized tier before it measures. True at once without background."""
        return True if self._tiers is None else self._tiers.wait(timeout)

    def _spread(self, *args, **kwargs):
        """A call in a process with several devices (`_jitted_for`)."""
        return self._jitted_for(args, kwargs)(*args, **kwargs)

    def _jitted_for(self, args, kwargs) -> Callable:
        """What runs these arguments: where one (an array, a `jax.ShapeDtypeStruct`) is laid out over more
        than one device and none is traced, the program pinned to jax.jit's output shardings (`_pinned`);
        else the jitted function."""
        return self._pinned(args, kwargs) if _spread_out(jax.tree_util.tree_leaves((args, kwargs))) else self._jit

    def _filter_call(self, *args, **kwargs):
        """A call with `filter=True`: non-array leaves (an equinox module's activation function, a string)
        and every leaf of a static argument are static; the arrays are traced (as `equinox.filter_jit`)."""
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        static = self._static_mask(args, kwargs)
        items = tuple((k, _static_leaf(x, f"leaf {k}")) for k, (x, s) in enumerate(zip(leaves, static))
                      if s or not _is_array(x))
        fixed = {k for k, _ in items}
        dynamic = [x for k, x in enumerate(leaves) if k not in fixed]
        jitted = self._pinned(args, kwargs) if _spread_out(dynamic) else self._filter_jit
        return jitted(dynamic, _Static(tree, items))

    def _jitted(self, filter: bool, out_shardings=None):
        """jax.jit of what a call traces (with `filter`, the arrays apart from a static rest), its outputs
        laid out as `out_shardings` says (None: as XLA chooses for the program traced)."""
        pinned = {} if out_shardings is None else {"out_shardings": out_shardings}
        if filter:
            return jax.jit(self._filtered, static_argnums=1, **pinned)
        return jax.jit(self._traced, static_argnums=self.static_argnums, static_argnames=self.static_argnames,
                       donate_argnums=self.donate_argnums, donate_argnames=self.donate_argnames, **pinned)

    def _pinned(self, args, kwargs) -> Callable:
        """The jitted function for concrete arguments some of which span several devices. XLA chooses the
        output shardings of the program it compiles, so a changed program's can differ from those jax.jit
        gives fn (`P('data')` against `P()`). A changed program runs with the output shardings XLA chose for
        the user's program (captured, never traced again) at these arguments' shardings: one more compile
        of that program per distinct layout, abstract values and static values of the arguments. Where the
        original runs, its shardings are jax.jit's already, and the jitted function runs as it is."""
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        if all(isinstance(x, jax.Array) for x in leaves):   # never static (not hashable): the quick key
            key = (tree, tuple((x.aval, x.sharding) for x in leaves))
        else:
            key = (self._signature(leaves, tree, self._dynamic(leaves, args, kwargs)),
                   tuple(getattr(x, "sharding", None) for x in leaves))
        jitted = self._pins.get(key)
        if jitted is None:
            spec, flat = self._concrete(args, kwargs)
            if spec.report.optimized and spec.npu is None:
                users = jax.jit(spec.differentiated or spec.reference)
                chosen = users.lower(*flat).compile().output_shardings
                # a typed key result is its key data in the user's program: left to XLA
                chosen = [None if j in spec.out_keys else s for j, s in enumerate(chosen)]
                jitted = self._jitted(self.filter, jax.tree_util.tree_unflatten(spec.out_tree, chosen))
            else:
                jitted = self._filter_jit if self.filter else self._jit
            self._pins[key] = jitted
        return jitted

    def __reduce__(self):
        """Pickled (cloudpickle, Ray, multiprocessing) as fn and its options, as a jax.jit function pickles:
        the specializations made so far hold tracebacks and compiled programs, and are made again there."""
        return _rebuild, (self.fn, self.target, self._options)

    def __get__(self, obj, objtype=None):
        """As a method (`@superopt` on a method of a class): the instance is the first argument, as jax.jit binds it."""
        return self if obj is None else functools.partial(self, obj)

    def lower(self, *args, **kwargs):
        """As `jax.jit(fn).lower`: the optimized program lowered for these arguments (`.compile()`, `.as_text()`),
        its outputs laid out as jax.jit's where the arguments span several devices."""
        return (self._jit if self.filter else self._jitted_for(args, kwargs)).lower(*args, **kwargs)

    def compile(self, *args, **kwargs) -> Specialization:
        """Optimize for these arguments' types and static values (once; later calls hit the cache) and
        return the specialization: its report, chosen term and program. Array arguments may be
        `jax.ShapeDtypeStruct`s: a model is optimized from its shapes, its weights never materialized."""
        return self._concrete(args, kwargs)[0]

    # ---- specializations ----

    def _static_mask(self, args, kwargs) -> list[bool]:
        """Per leaf of (args, kwargs), whether it belongs to a static argument."""
        mask = []
        for i, a in enumerate(args):
            mask += [i in self.static_argnums] * len(jax.tree_util.tree_leaves(a))
        for name in sorted(kwargs):   # the order tree_flatten gives a dict's entries
            mask += [name in self.static_argnames] * len(jax.tree_util.tree_leaves(kwargs[name]))
        return mask

    def _dynamic(self, leaves: list, args, kwargs) -> list[bool]:
        """Per leaf of (args, kwargs), whether a call traces it (an array, or a Python scalar without `filter`)."""
        traced = _is_array if self.filter else _array_like
        return [not s and traced(x) for x, s in zip(leaves, self._static_mask(args, kwargs))]

    def _concrete(self, args, kwargs) -> tuple[Specialization, list]:
        """The specialization for concrete arguments, and the flat dynamic arguments its `run` takes."""
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        dynamic = self._dynamic(leaves, args, kwargs)
        spec = self._specialize(leaves, tree, dynamic)
        flat = [x for x, d in zip(leaves, dynamic) if d]
        return spec, [jax.random.key_data(x) if _is_key(jax.typeof(x).dtype) else x for x in flat]

    def _specialize(self, leaves: list, tree, dynamic: list[bool]) -> Specialization:
        """The cached or new specialization for these leaves: avals of the dynamic ones, values of the rest."""
        avals = [jax.typeof(x) if d else None for x, d in zip(leaves, dynamic)]
        key = self._signature(leaves, tree, dynamic, avals)
        spec = self._cache.get(key)
        if spec is None:
            with jax.core.eval_context():   # superopt's own arrays stay concrete under the caller's trace
                spec = self._cache[key] = self._build(leaves, tree, dynamic, avals)
        self._last = spec
        return spec

    @staticmethod
    def _signature(leaves: list, tree, dynamic: list[bool], avals: list | None = None) -> tuple:
        """What a specialization is made for: shape, dtype and weak type of each dynamic leaf, each static value."""
        avals = avals or [jax.typeof(x) if d else None for x, d in zip(leaves, dynamic)]
        return (tree, tuple((a.shape, a.dtype, a.weak_type) if d else ("static", _static_leaf(x, f"leaf {k}"))
                            for k, (x, a, d) in enumerate(zip(leaves, avals, dynamic))))

    def _build(self, leaves, tree, dynamic, avals) -> Specialization:
        template = [None if d else x for x, d in zip(leaves, dynamic)]   # static leaves only: no tracer kept
        positions = [k for k, d in enumerate(dynamic) if d]
        in_keys, abstract = {}, []
        for n, k in enumerate(positions):
            aval = avals[k]
            if _is_key(aval.dtype):   # a typed key enters as its key data; the program re-wraps it
                in_keys[n] = jax.random.key_impl(leaves[k])
                abstract.append(jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(aval.shape, aval.dtype)))
            else:
                abstract.append(jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type))
        out_keys: dict[int, Any] = {}

        def program(*flat):
            full = list(template)
            for n, (k, x) in enumerate(zip(positions, flat)):
                full[k] = jax.random.wrap_key_data(x, impl=in_keys[n]) if n in in_keys else x
            args, kwargs = jax.tree_util.tree_unflatten(tree, full)
            out = self.fn(*args, **kwargs)
            out_leaves, out_tree = jax.tree_util.tree_flatten(out)
            out_keys.clear()
            out_keys.update({j: jax.random.key_impl(o) for j, o in enumerate(out_leaves) if _is_key(jax.typeof(o).dtype)})
            return jax.tree_util.tree_unflatten(out_tree, [jax.random.key_data(o) if j in out_keys else o
                                                           for j, o in enumerate(out_leaves)])

        example = None
        if not any(isinstance(x, (jax.core.Tracer, jax.ShapeDtypeStruct)) for x in leaves):
            example = [jax.random.key_data(leaves[k]) if n in in_keys else leaves[k] for n, k in enumerate(positions)]
        store = open_store(self.cache)   # JAX's own compilation cache is the user's to turn on (superopt/cache.py)
        spec = optimize(program, tuple(abstract), self.options, example=example, store=store, executor=self.executor,
                        sizes=self._sizes)
        if store is None and refused(self.cache):
            spec.report.cache = CacheUse("unused", why=refused(self.cache))
        return dataclasses.replace(spec, out_keys=dict(out_keys))

    # ---- results ----

    def _specialization(self) -> Specialization:
        if self._last is None:
            if self._tiers is not None and self._tiers.wait(0) is False:
                raise RuntimeError("superopt: still optimizing in the background (.wait() waits for it)")
            raise RuntimeError("superopt: nothing compiled yet; call the function (or .compile(*args)) first")
        return self._last

    @property
    def report(self) -> Report:
        """The report of the latest specialization made or looked up (by a trace, `.compile` or an emulator call)."""
        return self._specialization().report

    @property
    def term(self) -> str:
        return pretty(self._specialization().term)

    @property
    def npu(self):
        """The NPU program (`lowering.npu.lower.NpuExecutable`) when this runs on the emulator, else None;
        `.last` is the latest call's emulation (cycles, utilisation, timeline)."""
        return self._specialization().npu


UNDER_TRACE = ("jax", "callback")


class Tiers:
    """The background optimizations of one `Optimized` (`background=True`): per set of argument types, the
    thread optimizing it, and how many calls ran jax.jit's program of fn meanwhile. A specialization is
    ready once it is built and its program compiled; its report's `tier` says what ran before."""

    def __init__(self):
        self.lock = threading.RLock()      # one specialization built at a time: the thread's, or a trace's
        self._jobs: dict[tuple, threading.Thread] = {}
        self._done: dict[tuple, Any] = {}  # key -> the Specialization, or the exception that ended the job
        self._early: dict[tuple, int] = {}
        self._jit_of_fn = None

    def ready(self, key) -> bool:
        return isinstance(self._done.get(key), Specialization)

    def start(self, key, job: Callable) -> None:
        self._early[key] = self._early.get(key, 0) + 1
        if key in self._jobs:
            return

        def run():
            try:
                spec = job()
            except BaseException as exc:   # noqa: BLE001 - reported by the next call; the original keeps running
                self._done[key] = exc
                return
            spec.report.tier = (f"background: {self._early[key]} call{'s' if self._early[key] != 1 else ''} ran "
                                "jax.jit's program of fn while this one was made; later calls run this one")
            self._done[key] = spec

        thread = threading.Thread(target=run, name="superopt-background", daemon=True)
        self._jobs[key] = thread
        thread.start()

    def failure(self, key) -> None:
        """Warn, once, on the caller's thread, where the optimization for `key` raised."""
        exc = self._done.get(key)
        if isinstance(exc, BaseException):
            self._done[key] = None
            warnings.warn(f"superopt: the background optimization failed ({type(exc).__name__}: {exc}); "
                          "jax.jit's program of fn keeps running for these argument types", stacklevel=3)

    def original(self, optimized: "Optimized") -> Callable:
        """jax.jit of fn, with the object's static and donated arguments: the first tier."""
        if self._jit_of_fn is None:
            self._jit_of_fn = jax.jit(optimized.fn, static_argnums=optimized.static_argnums,
                                      static_argnames=optimized.static_argnames,
                                      donate_argnums=optimized.donate_argnums,
                                      donate_argnames=optimized.donate_argnames)
        return self._jit_of_fn

    def wait(self, timeout: float | None = None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        for thread in list(self._jobs.values()):
            thread.join(None if end is None else max(0.0, end - time.monotonic()))
        return not any(t.is_alive() for t in self._jobs.values())


def _rebuild(fn, target, options) -> Optimized:
    return Optimized(fn, target, **options)


def _varying_axes(x) -> frozenset:
    """The manual mesh axes a traced value varies over in a `shard_map` body (`aval.vma`, or in JAX releases
    that keep them in a manual axis type, `aval.mat.varying`); empty elsewhere."""
    aval = jax.typeof(x)
    found = getattr(aval, "vma", None)
    if found is None:
        found = getattr(getattr(aval, "mat", None), "varying", None)
    return frozenset(found or ())


def _spread_out(leaves: list) -> bool:
    """Whether some leaf is laid out over more than one device (sharded, or replicated over a mesh: an array
    or a `jax.ShapeDtypeStruct` with a sharding) and none is traced (a tracer has no `sharding`)."""
    for x in leaves:   # a loop: this runs on every call in a process with several devices
        sharding = getattr(x, "sharding", None)
        if sharding is not None and type(sharding) is not SingleDeviceSharding and sharding.num_devices > 1:
            return not any(isinstance(y, jax.core.Tracer) for y in leaves)
    return False


def _under_trace(tree) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(tree))


def _argnums(value, what: str) -> tuple[int, ...]:
    value = (value,) if isinstance(value, int) else tuple(value or ())
    if not all(isinstance(i, int) for i in value):
        raise TypeError(f"superopt: {what} must be ints, got {value!r}")
    return value


def _named_args(fn, nums, names, what: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """static_argnums and static_argnames (`what` "static"; "donate": the donated ones), each completed from
    the other through fn's signature (as jax.jit completes them), so a static argument is static whether it
    is passed by position or by name."""
    nums = _argnums(nums, f"{what}_argnums")
    names = (names,) if isinstance(names, str) else tuple(names or ())
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return nums, names
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    nums = tuple(sorted({i % len(positional) if i < 0 and positional else i for i in nums}
                        | {positional.index(n) for n in names if n in positional}))
    names = tuple(dict.fromkeys(names + tuple(positional[i] for i in nums if 0 <= i < len(positional)
                                              and params[i].kind is not params[i].POSITIONAL_ONLY)))
    return nums, names


def _schedule(rulesets) -> Schedule:
    if isinstance(rulesets, Schedule):
        return rulesets
    if isinstance(rulesets, (str, RuleSet)):     # one rule set: rulesets="algebra"
        rulesets = (rulesets,)
    try:
        rulesets = tuple(rulesets)
    except TypeError:
        raise TypeError(f"superopt: rulesets must be rule set names, RuleSet objects or a Schedule, "
                        f"got {type(rulesets).__name__}; known rule sets: {', '.join(sorted(RULESETS))}") from None
    bad = [rs for rs in rulesets if not isinstance(rs, (str, RuleSet))]
    if bad:
        raise TypeError(f"superopt: rulesets must be rule set names or RuleSet objects, got "
                        f"{bad[0]!r} ({type(bad[0]).__name__}); known rule sets: {', '.join(sorted(RULESETS))}")
    return Schedule.of(*rulesets)


def _cache_option(cache):
    if cache is None or isinstance(cache, (bool, str, os.PathLike)):
        return cache
    raise TypeError(f"superopt: cache= must be None, True, False or a directory, got {type(cache).__name__}")


def _limits(limits) -> Limits:
    if isinstance(limits, dict):                      # limits={"seconds": 1}
        valid = [f.name for f in dataclasses.fields(Limits)]
        unknown = sorted(set(limits) - set(valid), key=str)
        if unknown:
            raise ValueError(f"superopt: unknown limit {unknown[0]!r}; valid: {', '.join(valid)}")
        return Limits(**limits)
    if not isinstance(limits, Limits):
        raise TypeError(f"superopt: limits must be a Limits or a dict of its fields, got {type(limits).__name__}")
    return limits


def superopt(fn: Callable | None = None, target: str = "cpu", *, rulesets: Sequence[Any] | Schedule = DEFAULT,
             limits: Limits | None = None, verify: bool = True, extractor: str = "greedy",
             backend: str | None = None, memory_budget: int | str | None = None, numerics: str = "strict",
             precision: str | None = None, static_argnums=(), static_argnames=(), donate_argnums=(),
             donate_argnames=(), npu_under_trace: str = "jax", filter: bool = False, cache=None,
             executor: str | None = None, tune: bool = False, background: bool = False, reuse_sizes: bool = True):
    """Optimize `fn` for `target`; usable as `superopt(fn, ...)` or as a decorator `@superopt(target=...)`.
    `target` names a target (`superopt.available_targets()`) or is the path of a target's `.toml` file (a chip
    of one's own, of a registered kind: docs/design.md, "Costs and extraction").

    The result is a JAX transformation of `fn` (`Optimized`): call it eagerly, or inside `jax.jit`,
    `jax.grad`, `jax.vmap` or `jax.export`, with `fn`'s positional and keyword arguments.
    `static_argnums`, `static_argnames`, `donate_argnums` and `donate_argnames` mean what they mean to
    `jax.jit`. With `filter=True` non-array leaves of the arguments (functions, strings, Python bools,
    ints and floats: an equinox module's static fields, Dropout's `inference`) are static, as `equinox.filter_jit` makes them (a call then flattens its arguments in Python); without
    it such a leaf is refused as jax.jit refuses it. `npu_under_trace` is what runs an NPU target's program under an
    outer trace: "jax" (the extracted program as JAX; the default) or "callback" (the emulator, through
    `jax.pure_callback`).

    `rulesets` names rule sets (or gives RuleSet objects), run as one phase each in order, or is a
    `Schedule` of phases with their own limits and back-off. `extractor` is "greedy" (DAG-aware, the
    default) or "ilp" (HiGHS; optimal on small graphs, never worse than greedy). `backend` is what runs
    the chosen program: "jax" (the default on CPU and GPU targets) or, on an NPU target, "emulator" (the
    default there: cube and vector programs on the cycle-counting emulator, `lowering/npu`) or, on a GPU
    target, "pallas" (one Pallas kernel per kernel of the term, `lowering/pallas`; interpret mode on a CPU).
    `memory_budget` (bytes, or a size such as "64MB") bounds the chosen program's peak memory under the
    model of `extract/memory.py`: intermediates are recomputed in their consumers instead of stored until
    the peak fits, and the report says whether it did. `numerics` is "strict" (the default: only rewrites
    that keep the numerics contract of README.md, finite and NaN results exactly where the original has
    them) or "fast" (also rewrites that are equal over the reals but may overflow where the original does
    not, such as re-associating a matrix product; the report lists each one that fired). `precision`, on
    an NPU target, is the type the cube multiplies float32 operands in: "fp16" (its full rate) or "fp32"
    (where the chip has an fp32 rate); None chooses per program (`npu_backend.default_precision`).

    `cache` is where results persist between processes (superopt/cache.py): None or True, the default
    directory ($SUPEROPT_CACHE_DIR, else $XDG_CACHE_HOME/superopt, else ~/.cache/superopt; none when
    $SUPEROPT_CACHE is "off"), a directory, or False (no cache). A large program is optimized in segments
    (superopt/segments.py), each distinct one once; `executor` is where distinct segments are optimized in
    parallel: "local" (worker processes on this machine) or "ray" (a Ray cluster: $RAY_ADDRESS, else a local
    Ray instance); None reads $SUPEROPT_EXECUTOR, else "local".

    `tune=True` is a measured choice where the cost model may be wrong: a verified program is also timed
    against the original on this machine (interleaved, medians of 7 samples on superopt's random inputs)
    and returned only if it is faster by the same 3% the model's prediction must clear; the report says
    what was measured, and the result is cached with the program (a tuned and an untuned result are
    different entries).

    `background=True` makes a first call cost what jax.jit's does: an eager call for new argument types runs
    jax.jit's program of fn at once and optimizes in a thread; later calls run the optimized program once it
    is verified and compiled (the switch happens between calls; `.wait()` waits for it). Under an outer trace
    it optimizes where it is traced, as without it. The report's `tier` line says how many calls ran the
    first tier.

    `reuse_sizes=True` (the default) spends one search on a program called at many sizes (superopt/sizes.py):
    a call at new argument shapes whose program is an earlier one with its extents renamed takes that
    decision at the new sizes (a changed program priced again and checked there; the report's `sizes` line
    says so), and `jax.export` with a symbolic dimension exports the program chosen at stand-in sizes.
    `reuse_sizes=False` searches every new shape on its own, so its result never depends on which sizes came
    first."""
    options = dict(rulesets=rulesets, limits=limits, verify=verify, extractor=extractor, backend=backend,
                   memory_budget=memory_budget, numerics=numerics, precision=precision, static_argnums=static_argnums,
                   static_argnames=static_argnames, donate_argnums=donate_argnums, donate_argnames=donate_argnames,
                   npu_under_trace=npu_under_trace,
                   filter=filter, cache=cache, executor=executor, tune=tune, background=background,
                   reuse_sizes=reuse_sizes)
    if fn is None:   # the decorator form: check the options now, not at the first call
        Optimized(lambda *args: None, target, **{**options, "limits": Limits() if limits is None else limits})
        return lambda f: superopt(f, target, **options)
    if not callable(fn):
        raise TypeError(f"superopt: fn must be callable, got {type(fn).__name__}")
    return Optimized(fn, target, **{**options, "limits": Limits() if limits is None else limits})
