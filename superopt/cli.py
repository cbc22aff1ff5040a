"""The `superopt` command.

    superopt optimize MODULE:FN [--target T] [--shapes 128x768 768x768:f16 ...] [--html FILE]
    superopt explain  MODULE:FN [--target T] [--shapes ...] [--alternatives N] [--html FILE]
    superopt emulate  MODULE:FN --target npu-910b [--shapes ...] [--timeline FILE.png|.json] [--html FILE]
    superopt rules list [--ruleset NAME] | superopt rules check [NAME ...] [--thorough] [--jobs N]
    superopt rules import FILE [--dialect tensat] [--multi] [--write RULES]
    superopt rules synthesize [--size N] [--write RULES] [--jobs N] [--verbose]
    superopt calibrate [--quick] [--force] [--reset] | superopt demo
    superopt cache stats [--dir DIR] | superopt cache clear [--dir DIR]

MODULE is a module name (importable from the current directory) or a path to a .py file; FN is a function
in it. Without --shapes, FN may be a workload: a `superopt.workloads.Workload`, or a function of no arguments
returning one (e.g. `superopt.workloads:bert_encoder_layer`), whose example arguments are used. Progress bars
show on a terminal and nowhere else. A mistyped argument is refused in one line before JAX is imported
(`check_arguments`).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import multiprocessing
import os
import sqlite3
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from importlib import resources
from pathlib import Path

import ml_dtypes  # noqa: F401  (registers bfloat16, int4, float8_* with numpy, as JAX does: --shapes' dtypes)
import numpy as np

from superopt.core import lazy, progress
from superopt.egraph.limits import Limits
from superopt.workers import ExecutorError

# What the commands run loads when one runs, after `check_arguments`: JAX and the modules built on it take
# seconds to import (22 s on a loaded machine), too long to wait for a mistyped argument to be refused.
jax = lazy.module("jax")
api = lazy.module("superopt.api")
html = lazy.module("superopt.html")
store_cache = lazy.module("superopt.cache")
ir = lazy.module("superopt.core.ir")
verify = lazy.module("superopt.core.verify")
demo = lazy.module("superopt.demo")
explaining = lazy.module("superopt.explain")
cal = lazy.module("superopt.extract.calibrate")
targets = lazy.module("superopt.extract.target")
npu_lower = lazy.module("superopt.lowering.npu.lower")
synthesis = lazy.module("superopt.rewrites.synthesis")
checker = lazy.module("superopt.rewrites.checker")
schedule = lazy.module("superopt.rewrites.schedule")
rule = lazy.module("superopt.rewrites.rule")
sexpr = lazy.module("superopt.rewrites.sexpr")
tensat = lazy.module("superopt.rewrites.tensat")
rulesets = lazy.module("superopt.rulesets")

# --shapes' dtype suffixes: superopt's short names count bits (f16, i8, u8); numpy's one-letter codes count
# bytes (its f8 is float64, its i8 int64), so those are refused rather than guessed. Full names (float64,
# bfloat16, int4, float8_e4m3fn: numpy's and JAX's) are accepted as they are.
DTYPES = {"f16": "float16", "f32": "float32", "f64": "float64", "bf16": "bfloat16",
          "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
          "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
          "c64": "complex64", "c128": "complex128", "bool": "bool"}


def dtype_name(text: str) -> str:
    """A --shapes dtype suffix as its full name: a short name of DTYPES, or a full dtype name."""
    if text in DTYPES:
        return DTYPES[text]
    try:
        name = np.dtype(text).name
    except (TypeError, ValueError):
        name = None
    if name != text:   # numpy's byte codes (f8, u4, i8, <f4) and unknown words
        raise ValueError(f"superopt: unknown dtype {text!r}; write a short name ({', '.join(DTYPES)}: bits, "
                         f"not numpy's bytes) or a full name (float64, bfloat16, int4, float8_e4m3fn, ...)")
    return name


# ---- rules, calibrate, demo ----

def _rules_list(args) -> int:
    sets = schedule.resolve([args.ruleset]) if args.ruleset else list(rulesets.RULESETS.values())
    for rs in sets:
        print(f"{rs.name} ({len(rs)} rules)")
        for r in rs:
            only = f" (on {', '.join(r.targets)} only)" if r.targets else ""
            print(f"  {r.name:<34} {r.numerics:<6} {r.doc}{only}  [{r.source}]")
    return 0


RULES_CHECK_EXAMPLES = 60      # bindings per rule by default: above the test suite's 50 (tests/test_soundness.py)
RULES_CHECK_THOROUGH = 10      # --thorough multiplies the default by this


def _check_one(ruleset: str, name: str, examples: int) -> tuple:
    """Check one registered rule; runs in a worker process, so the rule is looked up by name (rules hold
    functions that need not pickle) and the result comes back as the plain fields that are printed."""
    found = [r for r in rulesets.RULESETS[ruleset] if r.name == name] if ruleset in rulesets.RULESETS else []
    if not found:
        raise ValueError(f"superopt: rule {ruleset}/{name} is not registered in a fresh process "
                         f"(registered at run time?); check it with --jobs 1")
    return _verdict(checker.check_rule(found[0], examples=examples))


def _verdict(result) -> tuple:
    status = "sound" if result.sound else ("UNSOUND" if result.counterexample else "UNCHECKED")
    detail = None if result.sound else (
        str(result.counterexample) if result.counterexample
        else "  no binding satisfied the left-hand side: " + "; ".join(result.notes))
    return status, result.cases, detail


def _check_results(rules, examples: int, jobs: int):
    """(status, cases, detail) for each rule, in order, as soon as it and the rules before it are done.
    The rules are independent and the checker is single-threaded numpy, so they are spread over worker
    processes, each a fresh interpreter (`spawn`): forking a process that has started JAX's or egglog's
    threads can deadlock."""
    jobs = min(jobs, len(rules))
    if jobs <= 1:   # no process to start for one rule; also checks rules registered at run time
        for r in rules:
            yield _verdict(checker.check_rule(r, examples=examples))
        return
    # fresh interpreters: a fork server that has imported the rule sets has egglog's thread pool, which its
    # forked workers lack, and a worker dropping an e-graph (the fact checks) waited on it forever
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        futures = [pool.submit(_check_one, r.ruleset, r.name, examples) for r in rules]
        try:
            for f in futures:
                yield f.result()
        except BaseException as exc:
            pool.shutdown(wait=False, cancel_futures=True)
            if isinstance(exc, BrokenProcessPool):   # out of memory, or a __main__ it cannot import (stdin)
                raise ValueError("superopt: a worker process checking rules died; run with --jobs 1") from exc
            raise


def load_rule_file(path: str) -> rule.RuleSet:
    """A user's rules: a Python module (its module-level RuleSets, else its module-level Rules, as one set
    named after the file) or a file in superopt's text format (docs/rule-authoring.md, section 5)."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"superopt: no rule file {path!r}")
    if file.suffix == ".py":
        spec = importlib.util.spec_from_file_location(f"superopt_user_rules_{file.stem}", file)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise ValueError(f"superopt: cannot load rule file {path!r}: {type(exc).__name__}: {exc}") from None
        values = [v for k, v in vars(module).items() if not k.startswith("_")]
        sets = [v for v in values if isinstance(v, rule.RuleSet)]
        if len(sets) > 1:
            merged = {f"{rs.name}/{cat or 'rules'}": [r for r in rs if r.category == cat]
                      for rs in sets for cat in dict.fromkeys(r.category for r in rs)}
            return rule.RuleSet(file.stem, merged)
        if sets:
            return sets[0]
        rules = [v for v in values if isinstance(v, rule.Rule)]
    else:
        try:
            rules = sexpr.parse_rules(file.read_text(encoding="utf-8"))
        except Exception as exc:   # the text format's parse errors name the line
            raise ValueError(f"superopt: cannot read rule file {path!r}: {exc}") from None
    if not rules:
        raise ValueError(f"superopt: rule file {path!r} defines no rule (a RuleSet or Rules at module level, "
                         f"or rules in the text format)")
    return rule.RuleSet(file.stem, rules)


def _is_rule_file(name: str) -> bool:
    return name.endswith((".py", ".rules", ".txt")) or os.sep in name


def _rules_check(args) -> int:
    if args.names and _is_rule_file(args.names[0]):
        user = load_rule_file(args.names[0])
        args.names, args.jobs = args.names[1:], 1   # a user's rules are checked here: workers know only ours
        rules = list(user)
    else:
        rules = [r for rs in rulesets.RULESETS.values() for r in rs]
    if args.names:
        known = {r.name for r in rules}
        missing = [n for n in args.names if n not in known]
        if missing:
            raise ValueError(f"superopt: no rule named {', '.join(missing)}; see `superopt rules list`")
        rules = [r for r in rules if r.name in args.names]
    examples = args.examples or RULES_CHECK_EXAMPLES * (RULES_CHECK_THOROUGH if args.thorough else 1)
    unsound, cases = [], 0
    for r, (status, n, detail) in zip(rules, _check_results(rules, examples, args.jobs or os.cpu_count() or 1)):
        cases += n
        print(f"{status:<9} {r.ruleset}/{r.name:<40} {n:>4} cases  [{r.source}]", flush=True)
        if detail is not None:
            unsound.append(r.name)
            print(detail, flush=True)
    print(f"checked {len(rules)} rules on {cases} cases: "
          + ("all sound" if not unsound else f"{len(unsound)} failed: {', '.join(unsound)}"))
    return 1 if unsound else 0


def _rules_import(args) -> int:
    """A verdict for every rule of a peer's rule file, and the counts (`rewrites/tensat.py`)."""
    try:
        with open(args.file, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ValueError(f"superopt: cannot read rule file {args.file!r}: {exc.strerror}") from None
    multi = True if args.multi else None
    if multi is None and tensat.looks_multi(text):
        multi = True
        print(f"{args.file}: read as multi-pattern rules (every two lines one rule, as Tensat's "
              "converted_multi.txt; the two lines bind each other's variables)", flush=True)
    verdicts = tensat.import_rules(text, multi=bool(multi))
    unbound = sum("which no left side binds" in v.detail for v in verdicts if v.status == "unsupported")
    if unbound:
        print(f"{unbound} lines name variables their own left side does not bind: if every two lines are "
              "one multi-pattern rule, pass --multi", flush=True)
    for v in verdicts:
        print(v, flush=True)
    print(tensat.summary(verdicts))
    if args.write:
        rules = [v.rule for v in verdicts if v.rule is not None]
        with open(args.write, "w", encoding="utf-8") as f:
            f.write(sexpr.format_rules(rules))
        print(f"wrote {len(rules)} sound rules in superopt's text format to {args.write}")
    return 0


def _rules_synthesize(args) -> int:
    """Rules found by enumeration and proven by the checker; how many hand-written algebra rules they derive."""
    layers = ((synthesis.ALL, args.size),) + tuple((ops, args.size + 1) for ops, _ in synthesis.LAYERS[1:])
    found = synthesis.synthesize(layers, jobs=args.jobs or os.cpu_count() or 1,
                                 progress=(lambda line: print(line, flush=True)) if args.verbose else None)
    print(f"enumerated {found.terms} terms in {found.classes} classes; {found.candidates} candidate equalities, "
          f"{found.derivable} derivable from the rules kept before them, {found.refuted} refuted by the checker")
    labels = {label: sum(r[2] == label for r in found.rules) for label in ("exact", "rounding", "reals")}
    print(f"kept {len(found.rules)} rules (" + ", ".join(f"{n} {k}" for k, n in labels.items()) +
          f") in {found.seconds:.1f} s")
    derived = synthesis.rediscovered(found, synthesis.hand_written_in_language(rulesets.ALGEBRA))
    missing = sorted(k for k, v in derived.items() if not v)
    print(f"rediscovered {sum(derived.values())} of the {len(derived)} rules of rulesets/algebra.py in the language"
          + (f"; not: {', '.join(missing)}" if missing else ""))
    if args.write:
        with open(args.write, "w", encoding="utf-8") as f:
            f.write(sexpr.format_rules([r for *_, r in found.rules]))
        print(f"wrote {len(found.rules)} rules in superopt's text format to {args.write}")
    return 0


CALIBRATE_HELP = """Measure this machine's f32 matmul FLOP/s and memory and cache bandwidth for the cpu target: each
figure in 3 rounds of timed runs, the best kept. A figure whose rounds disagree by more than 1.5x is
reported (a busy machine); figures below a quarter of the shipped defaults (extract/targets/cpu.toml) are
not stored without --force. The figures are stored in cpu-calibration.toml in $SUPEROPT_CACHE_DIR, else
$XDG_CACHE_HOME/superopt, else ~/.cache/superopt (keyed to the machine), and every later report for
target cpu uses them; --reset deletes that file and the shipped defaults apply again."""


def _calibration_table(old: dict, old_source: str, new: dict | None = None) -> list[str]:
    head = f"  {'':<17} {old_source:>22}" + (f"   {'measured now':>16}" if new is not None else "")
    lines = [head]
    for name, label, scale, unit in cal.SHOWN:
        row = f"  {label:<17} {old[name] / scale:>14.1f} {unit:<7}"
        if new is not None:
            row += f" -> {new[name] / scale:>8.1f} {unit:<7} ({new[name] / old[name]:.2f}x)"
        lines.append(row.rstrip())
    return lines


def _calibrate(args) -> int:
    defaults = cal.shipped_defaults()
    path = cal.cache_path()
    if args.reset:
        had = cal.reset()
        print(f"removed {path}" if had else f"no calibration stored at {path}")
        print("the cpu target uses its shipped defaults (extract/targets/cpu.toml):")
        print("\n".join(_calibration_table(defaults, "shipped defaults")[1:]))
        return 0
    cached = cal.cached_calibration()
    old = {**defaults, **(cached or {})}
    sizes = {"matmul_size": 512, "stream_mib": 32} if args.quick else {}
    print(f"measuring ({'quick: ' if args.quick else ''}3 rounds; the best of each figure is kept)...",
          file=sys.stderr, flush=True)
    m = cal.measure(**sizes)
    print("\n".join(_calibration_table(old, "stored now" if cached else "shipped defaults", m.figures)))
    warnings, refusals = cal.check(m, defaults)
    for w in warnings:
        print(f"superopt calibrate: warning: {w}", file=sys.stderr)
    if refusals and not args.force:
        for r in refusals:
            print(f"superopt calibrate: {r}", file=sys.stderr)
        print(f"superopt calibrate: not stored: the machine looks loaded (run it again when it is idle, or give "
              f"--force to store these figures); {'the stored figures stay' if cached else 'the shipped defaults stay'}"
              f" in use", file=sys.stderr)
        return 1
    stored = cal.store(m)
    print(f"stored in {stored}; every report for target cpu uses these figures from now on "
          f"(`superopt calibrate --reset` goes back to the shipped defaults)")
    return 0


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024


def _cache_directory(args) -> Path:
    return Path(args.dir).expanduser() if args.dir else store_cache.default_directory()


def _cache_stats(args) -> int:
    directory = _cache_directory(args)
    print(f"cache directory: {directory}")
    if not (directory / store_cache.DATABASE).exists():
        print(f"  no term store ({store_cache.DATABASE}) there yet")
    else:
        stats = store_cache.Store(directory).stats()
        print(f"  {store_cache.DATABASE}: {_size(stats.file_bytes)}, {stats.total} "
              f"entr{'y' if stats.total == 1 else 'ies'}")
        if stats.entries:
            width = max(len("kind"), *(len(k) for k in stats.entries))
            print(f"    {'kind':<{width}}  {'entries':>8}")
            for kind, count in stats.entries.items():
                print(f"    {kind:<{width}}  {count:>8}")
    jax_dir, ours, files = store_cache.jax_cache_files(directory)
    if jax_dir.is_dir():
        print(f"  JAX compilation cache {jax_dir}: {len(files)} files, {_size(sum(p.stat().st_size for p in files))}"
              f"{'' if ours else ' (not made by superopt: `cache clear` leaves it)'}")
    return 0


def _cache_clear(args) -> int:
    directory = _cache_directory(args)
    database = directory / store_cache.DATABASE
    if not database.exists():
        print(f"no term store at {database}: nothing to remove")
    else:
        try:
            removed = store_cache.Store(directory).clear()
        except sqlite3.Error as exc:
            raise ValueError(f"superopt: cannot clear the cache {database}: {exc}") from None
        print(f"removed {removed} entr{'y' if removed == 1 else 'ies'} from {database}")
    jax_dir, ours, files = store_cache.jax_cache_files(directory)
    if jax_dir.is_dir():
        if ours:
            print(f"removed {store_cache.clear_jax_cache(directory)} JAX compilation cache files from {jax_dir}")
        else:
            print(f"left {jax_dir} alone: superopt did not create it ({len(files)} files)")
    return 0


def _demo(args) -> int:
    demo.main()
    return 0


# ---- loading a function and its example arguments ----

def parse_shape(text: str, default_dtype: str = "float32") -> tuple[tuple, str]:
    """`128x768`, `128x768:f16`, `scalar:i32` or `()` -> (shape, dtype name)."""
    dims, _, dtype = text.partition(":")
    try:
        shape = () if dims in ("", "()", "scalar") else tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        raise ValueError(f"superopt: cannot read the shape {text!r}; write e.g. 128x768 or 128x768:f16") from None
    try:
        name = dtype_name(dtype or default_dtype)
    except ValueError as exc:
        raise ValueError(f"{exc} (in --shapes {text})") from None
    return shape, name


def _wide(shapes) -> bool:
    """Whether --shapes names a 64-bit dtype, which JAX keeps only with x64 on (main turns it on for the
    command, as a context, so a caller of main keeps its own setting)."""
    return any(dtype_name(s.partition(":")[2] or "float32") in ("float64", "int64", "uint64", "complex128")
               for s in shapes or ())


def function_source(target_spec: str) -> tuple[str, str, Path | None]:
    """`MODULE:FN` (or `path/file.py:FN`) -> (module name, FN, the file or None), refused in one line where
    it is malformed or names no file or module; nothing of it is run."""
    module_name, _, attr = target_spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"superopt: expected MODULE:FN (e.g. superopt.workloads:reassoc_chain or model.py:forward), "
                         f"got {target_spec!r}")
    if module_name.endswith(".py") or os.sep in module_name:
        if not Path(module_name).is_file():
            raise ValueError(f"superopt: no file {module_name}")
        return module_name, attr, Path(module_name)
    if os.getcwd() not in sys.path:      # as `python -m` does: modules beside the caller import
        sys.path.insert(0, os.getcwd())
    try:
        found = importlib.util.find_spec(module_name)   # runs the parent packages only, as importing would
    except ModuleNotFoundError as exc:
        raise ValueError(f"superopt: cannot import {module_name!r} ({exc})") from None
    if found is None:
        raise ValueError(f"superopt: cannot import {module_name!r} (No module named {module_name!r})")
    return module_name, attr, None


def load_function(target_spec: str):
    """`MODULE:FN` (or `path/file.py:FN`) -> the object named."""
    module_name, attr, path = function_source(target_spec)
    if path is not None:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            raise ValueError(f"superopt: cannot import {module_name!r} ({exc})") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"superopt: {module_name} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def _is_workload(obj) -> bool:
    return all(hasattr(obj, a) for a in ("fn", "args", "name"))


def _arity(fn) -> tuple[int, float, list[str]] | None:
    """(fewest, most positional arguments, their names) of `fn`, or None when it has no signature."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    fewest = sum(1 for p in positional if p.default is p.empty)
    most = float("inf") if any(p.kind == p.VAR_POSITIONAL for p in params) else len(positional)
    return fewest, most, [p.name for p in positional]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _check_shapes(fn, name: str, shapes: list[str], example: tuple) -> None:
    """One line, before any work, when --shapes has the wrong count or does not fit `fn`."""
    arity = _arity(fn)
    if arity is not None:
        fewest, most, names = arity
        if not fewest <= len(shapes) <= most:
            takes = (f"{fewest}" if fewest == most else f"{fewest} or more" if most == float("inf")
                     else f"{fewest} to {most}")
            raise ValueError(f"superopt: {name} takes {takes} argument{'' if takes == '1' else 's'} "
                             f"({', '.join(names)}), got {len(shapes)} shape{'' if len(shapes) == 1 else 's'} "
                             f"(--shapes {' '.join(shapes)})")
    try:
        jax.eval_shape(fn, *example)
    except Exception as exc:   # a shape or dtype error while tracing: the user's shapes, not superopt
        raise ValueError(f"superopt: --shapes {' '.join(shapes)} do not fit {name}: {_first_line(exc)}") from None


def function_and_args(target_spec: str, shapes: list[str] | None, dtype: str = "float32", seed: int = 0):
    """(fn, example args, a name for titles) for a command's MODULE:FN and --shapes."""
    obj = load_function(target_spec)
    name = target_spec.partition(":")[2]
    if shapes:
        if not callable(obj):
            raise ValueError(f"superopt: {target_spec} is not a function")
        example = tuple(verify.random_args([parse_shape(s, dtype) for s in shapes], seed))
        _check_shapes(obj, name, shapes, example)
        return obj, example, name
    if not _is_workload(obj) and callable(obj):
        params = inspect.signature(obj).parameters.values()
        if all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            obj = obj()
    if _is_workload(obj):
        return obj.fn, tuple(obj.args), obj.name
    raise ValueError(f"superopt: give the argument shapes of {target_spec} with --shapes (e.g. --shapes 128x768 "
                     "768x768:f16), or name a workload builder such as superopt.workloads:reassoc_chain")


def check_writable(path: str, option: str, suffixes: tuple = ()) -> None:
    """One line, before any work, when `path` (the value of `option`) cannot be written."""
    if suffixes and not path.lower().endswith(suffixes):
        raise ValueError(f"superopt: {option} {path!r} must end in {' or '.join(suffixes)}")
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise ValueError(f"superopt: cannot write {option} {path!r}: it is a directory")
    if not parent.is_dir():
        raise ValueError(f"superopt: cannot write {option} {path!r}: no directory {str(parent)!r}")
    if not os.access(target if target.exists() else parent, os.W_OK):
        raise ValueError(f"superopt: cannot write {option} {path!r}: permission denied")


def _compile(args, backend: str | None = None, timed: bool = False):
    fn, example, name = function_and_args(args.function, args.shapes, args.dtype)
    fast = api.superopt(fn, target=args.target, extractor=args.extractor, verify=not args.no_verify,
                        backend=backend, memory_budget=args.memory_budget, numerics=args.numerics,
                        precision=getattr(args, "precision", None), limits=limits_of(args),
                        rulesets=tuple(rulesets.DEFAULT) + tuple(load_rule_file(f) for f in args.rules or ()))
    start = time.perf_counter()
    spec = fast.compile(*example)
    if timed:
        return fast, spec, example, name, time.perf_counter() - start
    return fast, spec, example, name


def _timeline(spec, example, path: str) -> str | None:
    """Run the NPU program numerically on `example` with tracing and write its timeline; None off the NPU."""
    if spec.npu is None:
        return None
    run = spec.npu.run(*jax.tree_util.tree_leaves(example))
    spec.npu.write_timeline(run, path)
    return path


def _html(args, spec, example, name: str, explanation: str = "", png: str | None = None) -> None:
    """The --html page; the NPU timeline is `png`, or drawn from a run on `example` when not given."""
    with tempfile.TemporaryDirectory() as tmp:
        png = png or _timeline(spec, example, os.path.join(tmp, "timeline.png"))
        note = str(spec.report.backend) if args.target.startswith("npu") else \
            f"target {args.target} runs through JAX; timelines are drawn for NPU targets (--target npu-910b)"
        html.write(args.html, spec, f"superopt: {name} on {args.target}", timeline_png=png, note=note,
                   explanation=explanation)
    print(f"wrote {args.html}", file=sys.stderr)


# ---- optimize, explain, emulate ----

def _optimize(args) -> int:
    _, spec, example, name = _compile(args)
    print(spec.report)
    if args.print_term:
        print()
        print(ir.pretty(spec.term))
    if args.html:
        _html(args, spec, example, name)
    return 0


def _explain(args) -> int:
    fast, spec, example, name, seconds = _compile(args, timed=True)
    # the alternatives saturate again; they get as long as optimizing took, so explain costs about twice optimize
    options = fast.options
    alts = explaining.alternatives(fast.fn, example, options.target, rulesets=options.rulesets, limits=options.limits,
                                   limit=args.alternatives, numerics=args.numerics, budget=max(seconds, 1.0)) \
        if args.alternatives else []
    text = explaining.explain(spec, alts)
    print(text)
    if args.html:
        _html(args, spec, example, name, explanation=text)
    return 0


def _emulate(args) -> int:
    if targets.load_target(args.target).npu is None:
        raise ValueError(f"superopt: emulate runs NPU targets (npu-910, npu-910b), not {args.target!r}")
    timeline = args.timeline or f"{args.function.partition(':')[2].replace('.', '-')}-{args.target}.png"
    check_writable(timeline, "--timeline", (".png", ".json"))
    _, spec, example, name = _compile(args, backend="emulator")
    if spec.npu is None:
        print(f"superopt: the program does not run on the emulator: {spec.report.backend}", file=sys.stderr)
        return 1
    timeline = args.timeline or f"{name.replace('.', '-')}-{args.target}.png"
    _timeline(spec, example, timeline)
    run = spec.npu.last
    before = npu_lower.NpuExecutable(spec.original, spec.options.target, precision=spec.npu.precision).estimate().cycles
    print(f"superopt emulate ({args.target}): {name}, {spec.report.outcome}")
    print(f"  runs on: {spec.report.backend}")
    print("\n".join(spec.npu.describe(run, before)))
    print(f"  emulated in {run.wall_seconds:.2f} s (numeric, traced); timeline written to {timeline}")
    if args.html:
        _html(args, spec, example, name, png=timeline if timeline.endswith(".png") else None)
    return 0


def _add_program_options(p, target: str = "cpu", html: bool = True) -> None:
    p.add_argument("function", metavar="MODULE:FN", help="the function, e.g. superopt.workloads:reassoc_chain")
    p.add_argument("--target", default=target, help=f"cpu, gpu-a100, gpu-h100, npu-910, npu-910b (default {target})")
    p.add_argument("--shapes", nargs="+", metavar="SHAPE",
                   help="one per positional argument: 128x768, 128x768:f16, scalar:i32 (random inputs)")
    p.add_argument("--dtype", default="float32", help="dtype of --shapes without one (default float32)")
    p.add_argument("--extractor", default="greedy", choices=("greedy", "ilp"))
    p.add_argument("--no-verify", action="store_true", help="skip the check against the original")
    p.add_argument("--numerics", default="strict", choices=("strict", "fast"),
                   help="strict (default): only rewrites that keep the numerics contract; fast: also rewrites "
                        "equal over the reals that may overflow where the original does not")
    p.add_argument("--memory-budget", metavar="SIZE",
                   help="peak memory to fit, e.g. 64MB or 1.5GiB: reorder, then recompute intermediates (greedy only)")
    p.add_argument("--rules", action="append", metavar="FILE",
                   help="also run the rules of FILE (a Python module or superopt's text format) after the default "
                        "rule sets, as one more phase; repeatable")
    defaults = Limits()
    for flag, field, kind, text in LIMIT_OPTIONS:
        p.add_argument(flag, type=kind, metavar="N", dest=field,
                       help=f"{text} (default {getattr(defaults, field):g})")
    if html:
        p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report")


# The search's limits (superopt.Limits) as options: a report's "kept original: time limit (...)" has a remedy.
LIMIT_OPTIONS = (
    ("--seconds", "seconds", float, "the whole call's time limit, in seconds"),
    ("--saturation-seconds", "saturation_seconds", float, "the most saturation may take, in seconds"),
    ("--segment-seconds", "segment_seconds", float, "CPU seconds for one segment's search"),
    ("--iterations", "iterations", int, "saturation's iterations at most"),
    ("--nodes", "nodes", int, "rows in the e-graph's tables at most"),
    ("--work", "work", int, "saturation's work at most: rows searched plus matches applied"),
)


def limits_of(args) -> Limits:
    """The Limits the command's options ask for (the defaults where none is given)."""
    given = {field: getattr(args, field) for _, field, _, _ in LIMIT_OPTIONS if getattr(args, field, None) is not None}
    try:
        return Limits(**given)
    except ValueError as exc:
        raise ValueError(f"superopt: {exc}") from None


class _Parser(argparse.ArgumentParser):
    """argparse's parser, but a usage error is one line saying where the usage is, as superopt's own errors
    are (argparse prints the whole usage first). Its subcommands' parsers are of this class too."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="superopt", description="equality-saturation superoptimizer for JAX")
    sub = ap.add_subparsers(dest="command", required=True)

    opt = sub.add_parser("optimize", help="optimize a function and print the report")
    _add_program_options(opt)
    opt.add_argument("--print-term", action="store_true", help="also print the chosen program")
    opt.set_defaults(run=_optimize)

    exp = sub.add_parser("explain", help="which rules fired and why this program won (cost per kernel)")
    _add_program_options(exp)
    exp.add_argument("--alternatives", type=int, default=4, metavar="N",
                     help="price up to N distinct programs of the e-graph (saturates again, for at most as long "
                          "as optimizing took; 0: skip)")
    exp.set_defaults(run=_explain)

    emu = sub.add_parser("emulate", help="run the program on the NPU emulator and write its timeline")
    _add_program_options(emu, target="npu-910b")
    emu.add_argument("--timeline", metavar="FILE", help="PNG Gantt chart, or Chrome-trace JSON if FILE ends in "
                                                        ".json (default FN-TARGET.png)")
    emu.add_argument("--precision", choices=("fp16", "fp32"),
                     help="the type the cube multiplies float32 operands in (default: fp32 where the chip has an "
                          "fp32 rate and the program multiplies float32, else fp16)")
    emu.set_defaults(run=_emulate)


    rules = sub.add_parser("rules", help="inspect the registered rewrite rules")
    rules_sub = rules.add_subparsers(dest="rules_command", required=True)
    listing = rules_sub.add_parser("list", help="list rules with their rule set, numerics and source")
    listing.add_argument("--ruleset", help="only this rule set")
    listing.set_defaults(run=_rules_list)
    check = rules_sub.add_parser("check", help="check rules for soundness on random bindings (all by default)")
    check.add_argument("names", nargs="*", help="rule names to check; or a rule file of yours (FILE.py, FILE.rules, or a path), then names in it")
    check.add_argument("--examples", type=int, help=f"bindings per rule (default {RULES_CHECK_EXAMPLES}; "
                                                    f"overrides --thorough)")
    check.add_argument("--thorough", action="store_true",
                       help=f"{RULES_CHECK_THOROUGH}x the bindings per rule, for a deep run "
                            f"(about 5 minutes on 2 cores)")
    check.add_argument("--jobs", type=int, help="worker processes (default: one per core)")
    check.set_defaults(run=_rules_check)
    imp = rules_sub.add_parser("import", help="read a peer's rule file as it is and give each rule a verdict: "
                                              "sound (with its numerics label), unsound, or unsupported")
    imp.add_argument("file", help="the rule file, e.g. Tensat's converted.txt")
    imp.add_argument("--dialect", choices=["tensat"], default="tensat", help="the file's format (default tensat)")
    imp.add_argument("--multi", action="store_true",
                     help="every two lines are one multi-pattern rule (Tensat's converted_multi.txt); without it, a file whose pairs of lines bind each other's variables is read so")
    imp.add_argument("--write", metavar="FILE", help="also write the sound rules superopt can state in its "
                                                       "text format (rewrites/sexpr.py)")
    imp.set_defaults(run=_rules_import)
    syn = rules_sub.add_parser("synthesize", help="enumerate terms, group them by their values, prove the "
                                                  "equalities with the checker and keep a minimal set")
    syn.add_argument("--size", type=int, default=4, help="largest term, in ops and leaves, over the whole language "
                                                          "(default 4; two smaller sets of ops go one further)")
    syn.add_argument("--write", metavar="FILE", help="write the rules in superopt's text format")
    syn.add_argument("--jobs", type=int, help="checker processes (default: one per core)")
    syn.add_argument("--verbose", action="store_true", help="print each rule as it is kept")
    syn.set_defaults(run=_rules_synthesize)

    calibrate = sub.add_parser("calibrate", help="measure this machine's FLOP/s and bandwidth for the cpu target",
                               description=CALIBRATE_HELP)
    calibrate.add_argument("--quick", action="store_true", help="small sizes: seconds instead of tens of seconds")
    calibrate.add_argument("--force", action="store_true",
                           help="store the figures even when they are far below the shipped defaults")
    calibrate.add_argument("--reset", action="store_true",
                           help="delete the stored figures: the cpu target goes back to the shipped defaults")
    calibrate.set_defaults(run=_calibrate)
    cache = sub.add_parser("cache", help="inspect or empty the cache of optimized programs",
                           description="superopt keeps optimized programs in terms.sqlite3 in $SUPEROPT_CACHE_DIR, "
                                       "else $XDG_CACHE_HOME/superopt, else ~/.cache/superopt (and JAX's compiled "
                                       "programs in its jax/ folder)")
    cache_sub = cache.add_subparsers(dest="cache_command", required=True)
    for name, run, text in (("stats", _cache_stats, "the directory, the database's size, entries per kind"),
                            ("clear", _cache_clear, "remove every entry (and JAX's compiled programs when "
                                                    "superopt made their folder)")):
        c = cache_sub.add_parser(name, help=text)
        c.add_argument("--dir", metavar="DIR", help="this cache directory instead of the default")
        c.set_defaults(run=run)
    demo_command = sub.add_parser("demo", help="optimize the embedded transformer block and time it")
    demo_command.set_defaults(run=_demo)
    return ap


# ---- arguments, checked before JAX is imported ----

def target_names() -> list[str]:
    """The targets, a TOML file each, as `superopt.extract.target.available_targets` lists them, read
    without importing that module (it imports JAX)."""
    files = resources.files("superopt.extract").joinpath("targets").iterdir()
    return sorted(f.name.removesuffix(".toml") for f in files if f.name.endswith(".toml"))


# Counts that a command refuses below their least: (option's dest, the option, the least).
LEAST = (("jobs", "--jobs", 1), ("examples", "--examples", 1), ("size", "--size", 2), ("alternatives",
         "--alternatives", 0))


def check_arguments(args) -> None:
    """Refuse a bad argument in one line before the command imports JAX (seconds; more on a loaded machine):
    the target, --shapes and --dtype, the function's module or file, rule files, where --html goes, the
    search limits and the counts. What needs the program (its arity, whether it fits the shapes) is checked
    once it is loaded, still before any work."""
    if getattr(args, "target", None) is not None and args.target not in target_names():
        raise ValueError(f"superopt: unknown target {args.target!r}; valid targets: {', '.join(target_names())}")
    if getattr(args, "dtype", None) is not None:
        try:
            dtype_name(args.dtype)
        except ValueError as exc:
            raise ValueError(f"{exc} (in --dtype)") from None
    for shape in getattr(args, "shapes", None) or ():
        parse_shape(shape, args.dtype)
    if getattr(args, "function", None) is not None:   # optimize, explain, emulate
        function_source(args.function)
        limits_of(args)
    rule_files = list(getattr(args, "rules", None) or ())
    names = getattr(args, "names", None)
    rule_files += [names[0]] if names and _is_rule_file(names[0]) else []
    rule_files += [args.file] if getattr(args, "rules_command", None) == "import" else []
    for path in rule_files:
        if not Path(path).is_file():
            raise ValueError(f"superopt: no rule file {path!r}")
    if getattr(args, "html", None):
        check_writable(args.html, "--html", (".html", ".htm"))
    for dest, option, least in LEAST:
        value = getattr(args, dest, None)
        if value is not None and value < least:
            more = "0 or more" if least == 0 else f"at least {least}"
            raise ValueError(f"superopt: {option} must be {more}, got {value}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_args(argv)
    try:
        check_arguments(args)
        with progress.bars(), jax.enable_x64(_wide(getattr(args, "shapes", None))):
            return args.run(args)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    except ExecutorError as exc:   # Ray missing or its cluster unreachable ($SUPEROPT_EXECUTOR=ray)
        print(exc, file=sys.stderr)
        return 1
    except KeyboardInterrupt:   # one line, the shell's status for SIGINT; the cache commits whole entries only
        print("superopt: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:     # `superopt ... | head`: the reader left; say nothing more, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
