"""Verify: the optimized program against the original under the numerics contract (README.md), on random
inputs and on adversarial ones built per argument dtype (near overflow, zeros, infinities, NaN, integer
extremes), with tolerances per dtype. `verify` is what superopt runs on every specialization."""
from __future__ import annotations

import math
from typing import Iterator

import ml_dtypes
import numpy as np

from superopt.core.dtypes import is_float
from superopt.core.ir import Graph, Node, unfused
from superopt.core.modes import Numerics
from superopt.core.reference import evaluate

# Floating-point outputs pass two checks (integers and bools must be equal):
#   elementwise |a - e| <= tol * (|e| + max|e|)   -- no element is wrong on the output's own scale;
#   normwise    ||a - e|| <= norm_tol * ||e||      -- the output as a whole is as accurate as rounding allows.
# Error is measured against the output's scale, not each element's, because a reassociated dot product
# errs relative to sum |a_i b_i|, which is large where the result cancels to near zero.
TOLERANCES = {"float64": (1e-9, 1e-10), "float32": (1e-3, 1e-4), "float16": (1e-2, 5e-3),
              "bfloat16": (5e-2, 2e-2)}


class VerificationWarning(UserWarning):
    """The optimized program differed from the original; the original was kept."""


# Inputs of a large argument: drawing 10^8 random values takes seconds (a d=4096 decoder layer's weights
# are 1.8e8 of them), longer than running the program. An argument of more than BLOCK elements repeats one
# block of BLOCK values, drawn as a small argument's are; each argument has its own block. BLOCK is a
# prime: two elements are equal only where their flat positions differ by a multiple of it, so no two in
# one row or one column of a matrix whose sides are shorter than BLOCK. The arrays are aligned to ALIGN
# bytes where large: JAX on the CPU reads such a numpy argument in place and copies any other, which for a
# model's weights costs more than the program, on each of a verification's dozens of calls. `verify`
# takes them from `Buffers`, which hands a finished set's memory to the next: memory a process has not
# touched before costs more to fill (the kernel's page faults; seconds a gigabyte on a fresh virtual
# machine) than computing the values, and a verification runs some twenty sets.
BLOCK = 1_048_573
ALIGN = 64
ALIGN_FROM = 1 << 20           # bytes: smaller arrays are cheap to copy and are left as numpy made them


def _drawn(n: int) -> int:
    """How many values are drawn for an argument of n elements."""
    return min(n, BLOCK)


def empty_aligned(shape: tuple, dtype) -> np.ndarray:
    """An uninitialized array whose data starts at a multiple of `ALIGN` bytes."""
    return _aligned_in(np.empty(int(np.prod(shape)) * np.dtype(dtype).itemsize + ALIGN, np.uint8), shape, dtype)


def _aligned_in(raw: np.ndarray, shape: tuple, dtype) -> np.ndarray:
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dt.itemsize
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes].view(dt).reshape(shape)


class Buffers:
    """Aligned arrays for input sets, taken back (`release`) when a set is done and handed out again."""

    def __init__(self):
        self._free: dict[int, list[np.ndarray]] = {}
        self._lent: dict[int, np.ndarray] = {}       # id -> the raw buffer of each array handed out

    def empty(self, shape: tuple, dtype) -> np.ndarray:
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize + ALIGN
        free = self._free.get(size)
        raw = free.pop() if free else np.empty(size, np.uint8)
        out = _aligned_in(raw, shape, dtype)
        self._lent[id(out)] = raw
        return out

    def holds(self, array) -> bool:
        """Whether `array` is out on loan from these buffers (handed out and not taken back)."""
        return id(array) in self._lent

    def release(self, arrays) -> None:
        """Take back the arrays of a finished set: nothing may read them afterwards (an output that
        aliases an input included); arrays this did not hand out are ignored."""
        for a in arrays:
            raw = self._lent.pop(id(a), None)
            if raw is not None:
                self._free.setdefault(raw.size, []).append(raw)


def _filled(block: np.ndarray, shape: tuple, dtype, buffers: Buffers | None = None) -> np.ndarray:
    """The flat `block` (`_drawn` values) as `dtype`, repeated to fill `shape`; aligned where large (from
    `buffers` where given)."""
    dt = np.dtype(dtype)
    block = np.asarray(block).astype(dt, copy=False).reshape(-1)
    n = int(np.prod(shape))
    if n == block.size and n * dt.itemsize < ALIGN_FROM:
        return block.reshape(shape)
    out = (buffers.empty if buffers is not None else empty_aligned)(tuple(shape), dt)
    flat = out.reshape(-1)
    for start in range(0, n, block.size):
        chunk = min(block.size, n - start)
        flat[start:start + chunk] = block[:chunk]
    return out


def _random_blocks(avals, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for shape, dtype in avals:
        dt = np.dtype(dtype)
        m = _drawn(int(np.prod(shape)))
        if dt == np.bool_:
            out.append(rng.random(m) < 0.5)
        elif dt.kind in "iu":
            lo = 0 if dt.kind == "u" else -8
            out.append(rng.integers(lo, 9, size=m).astype(dt))
        else:
            out.append(rng.standard_normal(m).astype(np.float32).astype(dt, copy=False))
    return out


def random_args(avals, seed: int, buffers: Buffers | None = None) -> list[np.ndarray]:
    """Arguments of the given (shape, dtype)s: standard normal floats, integers in [-8, 8] ([0, 8] unsigned),
    bools at even odds."""
    return [_filled(block, shape, dtype, buffers) for block, (shape, dtype) in zip(_random_blocks(avals, seed), avals)]


def mismatch(expected, actual, as_dtype: str | None = None) -> str | None:
    """None if `actual` matches `expected` within the dtype's tolerance (or `as_dtype`'s, for a program
    that computes in a narrower type, as the NPU's cube does), else a description."""
    e, a = np.asarray(expected), np.asarray(actual)
    if e.shape != a.shape or e.dtype != a.dtype:
        return f"type {a.dtype}{list(a.shape)} != expected {e.dtype}{list(e.shape)}"
    if not is_float(e.dtype):
        bad = int(np.sum(e != a))
        return f"{bad} of {e.size} elements differ" if bad else None
    if e.size == 0:
        return None
    e64, a64 = np.asarray(e, np.float64), np.asarray(a, np.float64)
    e_finite, a_finite = np.isfinite(e64), np.isfinite(a64)
    if e_finite.all() and a_finite.all():    # the common case: no NaN or Inf to place
        ef, af = e64.ravel(), a64.ravel()
    else:
        if not np.array_equal(np.isnan(e64), np.isnan(a64)):
            return "NaN positions differ"
        inf = np.isinf(e64) | np.isinf(a64)
        if not np.array_equal(e64[inf], a64[inf]):
            return "Inf positions or signs differ"
        finite = e_finite & a_finite
        if not finite.any():
            return None
        ef, af = e64[finite], a64[finite]
    tol, norm_tol = TOLERANCES.get(str(e.dtype), TOLERANCES["float32"])
    if as_dtype:
        tol, norm_tol = (max(x, y) for x, y in zip((tol, norm_tol), TOLERANCES[as_dtype]))
    # Below the dtype's smallest normal number rounding is absolute (a subnormal's ulp), so the scale
    # is at least that: float16 values near 1e-7 differ by whole subnormal steps.
    tiny = max(float(ml_dtypes.finfo(e.dtype).tiny), float(np.finfo(np.float32).tiny))
    # Two values that are both subnormal (or zero) agree: XLA's kernels may flush subnormals to zero in
    # one program and not in the other, as fusion decides.
    magnitude = np.abs(ef)
    af = np.where((magnitude < tiny) & (np.abs(af) < tiny), ef, af)
    scale = max(float(np.max(magnitude)), tiny)
    with np.errstate(over="ignore"):    # float64 values near its largest: a difference past it is inf
        diff = ef - af
    err = np.abs(diff)
    bound = tol * magnitude + tol * scale
    if not np.all(err <= bound):
        worst = int(np.argmax(err - bound))
        return f"element error {err[worst]:.3g} over bound {bound[worst]:.3g} (dtype {e.dtype})"
    with np.errstate(over="ignore"):
        norm_err = _norm(diff) / max(_norm(ef), tiny)
    if norm_err > norm_tol:
        return f"normwise relative error {norm_err:.3g} over {norm_tol:g} (dtype {e.dtype})"
    return None


def _norm(v) -> float:
    """The 2-norm of `v`, computed on its own scale: numpy's sums the squares, which overflows (with a
    warning to the caller) for float64 values past the square root of its largest, and then compares inf
    with inf, which is no comparison at all. inf where `v` has an infinite element."""
    v = np.asarray(v, np.float64)
    m = float(np.max(np.abs(v), initial=0.0))
    if m == 0.0 or not math.isfinite(m):
        return m
    with np.errstate(over="ignore"):
        return float(m * np.linalg.norm(v / m))


def compare_outputs(expected: list, actual: list, as_dtype: str | None = None) -> str | None:
    if len(expected) != len(actual):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for k, (e, a) in enumerate(zip(expected, actual)):
        problem = mismatch(e, a, as_dtype)
        if problem:
            return f"output {k}: {problem}"
    return None


def as_accurate(expected, actual, truth, factor: float = 2.0, slack: float = 0.0) -> str | None:
    """None if `actual` is about as close to `truth` as `expected` is (normwise, on the finite elements
    where both agree on NaN and Inf; `slack` more, an absolute normwise error), else a description. Used
    when two programs that round differently disagree with each other: what matters then is that the
    optimized one is not less accurate.

    Integer outputs are judged the same way with no floor: where the original is exact (its value equals
    the float64 program's) the optimized program must be too; where the original rounded a float to an
    integer (a requantized result), the optimized one may round differently but not more often."""
    e, a = np.asarray(expected), np.asarray(actual)
    if e.shape != a.shape or e.dtype != a.dtype or e.dtype == np.bool_ or not (is_float(e.dtype) or e.dtype.kind in "iu"):
        return mismatch(e, a)
    e64, a64, t64 = (np.asarray(v, dtype=np.float64) for v in (e, a, truth))
    if not np.array_equal(np.isnan(e64), np.isnan(a64)):
        return "NaN positions differ"
    inf = np.isinf(e64) | np.isinf(a64)
    if not np.array_equal(e64[inf], a64[inf]):
        return "Inf positions or signs differ"
    finite = ~(np.isnan(e64) | inf) & np.isfinite(t64)
    scale = _norm(t64[finite])
    with np.errstate(over="ignore"):
        err_expected = _norm(e64[finite] - t64[finite])
        err_actual = _norm(a64[finite] - t64[finite])
    # Within the dtype's normwise tolerance (the same bound the direct comparison uses) or within a
    # small factor of the original's own rounding error: a wrong program errs on the output's scale.
    floor = TOLERANCES.get(str(e.dtype), TOLERANCES["float32"])[1] * scale if is_float(e.dtype) else 0.0
    if err_actual <= factor * err_expected + floor + slack:
        return None
    return (f"error against the float64 value {err_actual:.3g} exceeds {factor}x the original's "
            f"{err_expected:.3g} (normwise, dtype {e.dtype})")


# ---- adversarial inputs and the numerics contract (README.md, "Numerics contract") ----
#
# Random normal inputs never reach the values where rewrites differ: a re-associated matrix product
# overflows only where one operand is huge and another tiny, `x*0 -> 0` differs only at inf and NaN, a
# cast rule only past the narrow type's range. Next to the random trials, verification runs a small
# deterministic family of input sets built per argument dtype (`input_sets`, `calibrated`):
#
#   "zeros"     floats: +0, -0, subnormals, the smallest normal, +-1 (divisions by zero, signed zeros,
#               flushing); ints: their extremes (int8 -128/127, int32 min/max), 0, +-1;
#   "specials"  floats: random normal with NaN, +inf, -inf, +-max, -0 and a subnormal at a few seeded
#               positions of every tensor (NaN and inf propagation; few, so that the patterns say
#               something); ints: values over the whole range mixed with small ones;
#   scaled      float arguments scaled per a pattern, one of "up" (magnitude max**s), "one" (left at
#               magnitudes 0.5-1), "down" (a few times the smallest normal) or "mixed" (each element up
#               or down), with s in [0, 1] calibrated on the original (`calibrated`): the largest s,
#               found by bisection, at which the original program has no more non-finite outputs than
#               at s = 0. There the original is finite but close to overflowing, so a rewritten program
#               whose intermediates are larger than any of the original's (x@y where the original
#               computes x@(y@z) with z tiny, x@y where it scales x down first, y+z where it computes
#               x@y + x@z with x tiny) overflows. Patterns (`scale_patterns`): every float argument up;
#               every element up or down; each argument up with the others at magnitude one, and down
#               with the others up (the first and last arguments first); every argument up with random
#               signs. Up to MAX_PATTERNS of them. Values are positive except in the last pattern, so
#               that a sum overflows in every order or in none (the order in which XLA sums a reduction
#               is outside the contract). Each costs one call of the original where it is finite at
#               s = 1, else CALIBRATION_STEPS + 2, and one call of the optimized program.
#
# Integer arguments of the scaled sets keep random small values; bools are random everywhere.
# Under numerics="fast" only the random and zeros sets run (finite inputs; see `verify`).
MAX_PATTERNS = 8
CALIBRATION_STEPS = 5          # bisection steps on s: a factor of max**(1/32) (f16: 1.4x, f32: 16x)
STRICT_SETS = ("zeros", "specials")
FAST_SETS = ("zeros",)


def _finfo(dtype):
    return ml_dtypes.finfo(np.dtype(dtype))


def _as(values: np.ndarray, dtype) -> np.ndarray:
    """float64 values as `dtype`: float64 as they are, the narrower floats through float32 (as random_args
    does, for the ml_dtypes floats); the values are the dtype's own, so no cast overflows."""
    dt = np.dtype(dtype)
    values = np.asarray(values, np.float64)
    return values.astype(dt, copy=False) if dt.itemsize >= 8 else values.astype(np.float32).astype(dt, copy=False)


def integer_edges(dtype) -> list[int]:
    """An integer dtype's extremes: the values around the square root of its largest (where a square wraps:
    int32's 46341 ** 2 is negative), its smallest and largest values and their neighbours (where a sum or
    difference wraps), 0, +-1 and 2; verification's and the rule checker's (rewrites/checker.py)."""
    info = np.iinfo(np.dtype(dtype))
    lo, hi, root = int(info.min), int(info.max), math.isqrt(int(info.max))
    return [e for e in (root + 1, lo, hi, -root - 1, root, lo + 1, hi - 1, -root, 0, 1, -1, 2) if lo <= e <= hi]


def int_extremes(rng, n: int, dt: np.dtype) -> np.ndarray:
    """n integers, about half of them `integer_edges`, the rest drawn from the whole range."""
    info = np.iinfo(dt)
    edges = np.array(integer_edges(dt), dtype=np.int64)
    pick = rng.integers(0, 2, n).astype(bool)
    wide = rng.integers(int(info.min), int(info.max), n, endpoint=True, dtype=np.int64)
    out = np.where(pick, edges[rng.integers(0, edges.size, n)], wide)
    out[: min(n, edges.size)] = edges[: min(n, edges.size)]          # every extreme where there is room
    return out.astype(dt)


def special_args(avals, kind: str, seed: int = 0, buffers: Buffers | None = None) -> list[np.ndarray]:
    """One adversarial input set: `kind` is "zeros" or "specials" (see above); `seed` varies the values
    and positions (verification uses seed 0; the fuzzer others)."""
    out = []
    for index, (shape, dtype) in enumerate(avals):
        dt = np.dtype(dtype)
        rng = np.random.default_rng([seed, index, 1 + STRICT_SETS.index(kind)])
        m = _drawn(int(np.prod(shape)))
        if dt == np.bool_:
            block = rng.random(m) < 0.5
        elif dt.kind in "iu":
            if kind == "zeros":
                block = int_extremes(rng, m, dt)
            else:
                wide = rng.integers(np.iinfo(dt).min, np.iinfo(dt).max, m, endpoint=True, dtype=np.int64)
                small = rng.integers(-8 if dt.kind == "i" else 0, 9, m)
                block = np.where(rng.random(m) < 0.5, wide, small).astype(dt)
        elif kind == "zeros":
            info = _finfo(dt)
            sub, tiny = float(info.smallest_subnormal), float(info.tiny)
            choices = np.array([0.0, -0.0, 0.0, -0.0, sub, -sub, 3 * sub, tiny, -tiny, 1.0, -1.0, 0.5])
            vals = choices[rng.integers(0, choices.size, m)]
            vals[: min(m, 2)] = [0.0, -0.0][: min(m, 2)]
            block = _as(vals, dt)
        else:
            info = _finfo(dt)
            big = float(info.max)
            specials = np.array([np.nan, np.inf, -np.inf, big, -big, -0.0, float(info.smallest_subnormal)])
            specials = np.roll(specials, -index)            # a one-element tensor gets a different one per argument
            vals = rng.standard_normal(m)
            room = min(specials.size, max(1, m // 4)) if m else 0
            vals[rng.choice(m, room, replace=False)] = specials[:room]
            block = _as(vals, dt)
        out.append(_filled(block, shape, dt, buffers))
    return out


# Magnitudes the domain sets move float arguments to (`domain_args`): ordinary values, and values near each end
# of the float32 range, where a domain rewrite that squares or divides would overflow or underflow first
DOMAIN_SCALES = (1.0, 1e-3, 1e3, 1e-30, 1e30)


def domain_args(avals, seed: int, scale: float, buffers: Buffers | None = None) -> list[np.ndarray]:
    """A set of arguments in the domain most domain rewrites want (rewrites/functions.py `given`): random
    floats made positive, (|x| + 0.5) * scale, drawn from the random set of `seed`; other arguments as drawn.
    A guarded program's rewritten side runs where its check passes, which superopt's random and adversarial
    sets (normal draws, NaN, -0) mostly fail: these give it inputs on which it runs."""
    out = []
    for block, (shape, dtype) in zip(_random_blocks(avals, seed), avals):
        if is_float(dtype) and np.dtype(dtype).kind != "c":
            big = float(_finfo(np.dtype(dtype)).max)
            block = _as(np.minimum((np.abs(block.astype(np.float64)) + 0.5) * scale, big / 4), np.dtype(dtype))
        out.append(_filled(block, shape, dtype, buffers))
    return out


def scale_patterns(avals, limit: int = MAX_PATTERNS) -> list[tuple[str, tuple]]:
    """(name, per-argument scale) for the scaled input sets, most telling first (see above)."""
    floats = [i for i, (_, dtype) in enumerate(avals) if is_float(dtype)]
    if not floats:
        return []

    def pattern(default, **at):
        return tuple(at.get(f"a{i}", default) if i in floats else None for i in range(len(avals)))
    found = [("all up", pattern("up")), ("elements up or down", pattern("mixed"))]
    order = []
    lo, hi = 0, len(floats) - 1
    while lo <= hi:                      # the ends first: a chain's first and last operands
        order += [floats[lo]] + ([floats[hi]] if hi != lo else [])
        lo, hi = lo + 1, hi - 1
    if len(floats) > 1:
        for i in order:
            found.append((f"argument {i} up, the others one", pattern("one", **{f"a{i}": "up"})))
            found.append((f"argument {i} down, the others up", pattern("up", **{f"a{i}": "down"})))
    else:
        found.append(("the argument down", pattern("down")))
    found.append(("all up, random signs", pattern("up+-")))
    if len(found) > limit:
        found = found[:limit - 1] + [found[-1]]
    return found


class Scaler:
    """Builds the scaled input sets of one argument list: the random parts (magnitudes, signs, which
    elements are up or down, integer and bool values) are drawn once per seed, so the calibration's
    bisection only multiplies."""

    def __init__(self, avals, seed: int = 0, buffers: Buffers | None = None):
        self.avals, self.seed, self.buffers = list(avals), seed, buffers
        self._base: list | None = None      # random_args' blocks, for the arguments a pattern leaves alone
        self._parts: dict = {}
        # The "one" arguments of the pattern being calibrated: their values do not depend on s, so every
        # step of its bisection reads the same arrays (a model's weights: filling them was a third of the
        # verification). `release` keeps them; they go back to the buffers at the next pattern, or when
        # the caller hands the pattern's last set back to the buffers itself.
        self._ones: dict = {}
        self._ones_of: tuple | None = None

    def _part(self, index: int):
        if index not in self._parts:
            n = _drawn(int(np.prod(self.avals[index][0])))   # the scaled values are a block too
            rng = np.random.default_rng([self.seed, index, 7])
            self._parts[index] = (rng.uniform(0.5, 1.0, n).astype(np.float32),
                                  np.where(rng.random(n) < 0.5, -1, 1).astype(np.float32), rng.random(n) < 0.5)
        return self._parts[index]

    def __call__(self, pattern: tuple, s: float) -> list[np.ndarray]:
        out = []
        if pattern != self._ones_of:
            if self.buffers is not None:
                self.buffers.release(list(self._ones.values()))
            self._ones, self._ones_of = {}, pattern
        for index, ((shape, dtype), kind) in enumerate(zip(self.avals, pattern)):
            kept = self._ones.get(index) if kind == "one" else None
            if kept is not None and (self.buffers is None or self.buffers.holds(kept)):
                out.append(kept)
                continue
            if kind is None:
                if self._base is None:
                    self._base = _random_blocks(self.avals, 1000 + self.seed)
                out.append(_filled(self._base[index], shape, dtype, self.buffers))
                continue
            dt = np.dtype(dtype)
            info = _finfo(dt)
            mag, sign, pick = self._part(index)
            big = float(info.max)
            if dt.itemsize > 4 or big > np.finfo(np.float32).max:    # float64: scale in float64
                mag, sign = mag.astype(np.float64), sign.astype(np.float64)
                up, down = np.float64(big ** s), np.float64(4 * float(info.tiny))
            else:       # only here: float64's max ** s would overflow a cast to float32, warning the caller
                up, down = np.float32(min(big ** s, big)), np.float32(4 * float(info.tiny))
            if kind == "up":
                vals = mag * up
            elif kind == "up+-":
                vals = mag * up * sign
            elif kind == "down":
                vals = mag * down
            elif kind == "mixed":
                vals = mag * np.where(pick, up, down)
            else:
                vals = mag
            if dt != np.float32:   # in float32, |mag| < 1 times at most max: within range already
                vals = np.clip(vals, -big, big)
            out.append(_filled(vals, shape, dt, self.buffers))
            if kind == "one":
                self._ones[index] = out[-1]
        return out

    def release(self, args: list) -> None:
        """Hand a set back to the buffers, but for the pattern's "one" arguments (the next step reads them)."""
        if self.buffers is not None:
            kept = {id(a) for a in self._ones.values()}
            self.buffers.release([a for a in args if id(a) not in kept])


def scaled_args(avals, pattern: tuple, s: float, seed: int = 0) -> list[np.ndarray]:
    """Arguments scaled per `pattern` (from `scale_patterns`) at exponent s in [0, 1]: an "up" element
    has magnitude between max**s / 2 and max**s of its dtype, a "down" one 2 to 4 times the smallest
    normal, a "one" one between 0.5 and 1; positive but in the "up+-" pattern. Integers and bools are
    random_args' values."""
    return Scaler(avals, seed)(pattern, s)


def _outputs(fn, args) -> list[np.ndarray]:
    return [np.asarray(o) for o in fn(*args)]


def _nonfinite(outputs) -> int:
    return sum(int(np.sum(~np.isfinite(np.asarray(o, np.float64)))) for o in outputs if is_float(np.asarray(o).dtype))


def calibrated(reference, avals, pattern: tuple, seed: int = 0, steps: int = CALIBRATION_STEPS,
               scaler: Scaler | None = None):
    """(s, args, the reference's outputs) for the largest s in [0, 1] found by bisection at which
    `reference` has no more non-finite float outputs than at s = 0 (see above): one call where the
    original is finite at s = 1, at most steps + 2 otherwise."""
    scaler = scaler or Scaler(avals, seed)
    at = lambda s: (lambda args: (s, args, _outputs(reference, args)))(scaler(pattern, s))
    top = at(1.0)
    worst = _nonfinite(top[2])
    if worst == 0:
        return top
    scaler.release(top[1])       # a model's arguments are large: at most two sets are held at once
    top = None
    low = at(0.0)
    allowed = _nonfinite(low[2])
    if worst <= allowed:
        scaler.release(low[1])
        return at(1.0)
    lo, hi = 0.0, 1.0
    for _ in range(steps):
        mid = at((lo + hi) / 2)
        if _nonfinite(mid[2]) <= allowed:
            scaler.release(low[1])
            lo, low = mid[0], mid
        else:
            hi = mid[0]
            scaler.release(mid[1])
        mid = None
    return low


# ---- the contract's comparison ----

def range_edge(expected, actual) -> np.ndarray:
    """`actual`, with each element where one program has +-inf and the other a finite value of the same
    sign within the output dtype's rounding tolerance of its largest finite value replaced by the
    expected one: the contract's one allowed difference in where results are finite."""
    e, a = np.asarray(expected), np.asarray(actual)
    if e.shape != a.shape or e.dtype != a.dtype or not is_float(e.dtype) or e.size == 0:
        return a
    tol = TOLERANCES.get(str(e.dtype), TOLERANCES["float32"])[0]
    big = float(_finfo(e.dtype).max) * (1 - tol)
    e64, a64 = e.astype(np.float64), a.astype(np.float64)
    with np.errstate(invalid="ignore"):
        edge = ((np.isinf(e64) & np.isfinite(a64) & (np.abs(a64) >= big)) |
                (np.isinf(a64) & np.isfinite(e64) & (np.abs(e64) >= big))) & (np.sign(e64) == np.sign(a64))
    return np.where(edge, e, a) if edge.any() else a


def _patterns_differ(e, a) -> bool:
    e64, a64 = np.asarray(e, np.float64), np.asarray(a, np.float64)
    return not (np.array_equal(np.isnan(e64), np.isnan(a64)) and
                np.array_equal(np.where(np.isinf(e64), e64, 0), np.where(np.isinf(a64), a64, 0)))


def overflowed(expected: list, actual: list) -> bool:
    """Under numerics="fast": the two programs differ in where their float outputs are finite and one of
    them has an infinite output, i.e. (the inputs being finite) one of them overflowed."""
    floats = [(np.asarray(e), np.asarray(a)) for e, a in zip(expected, actual)
              if is_float(np.asarray(e).dtype) and np.shape(e) == np.shape(a)]
    return any(_patterns_differ(e, a) for e, a in floats) and \
        any(np.isinf(np.asarray(x, np.float64)).any() for pair in floats for x in pair)


# ---- the bound on a sum added in another order ----
#
# Two programs that compute the same products and add them in another order or grouping (an "order" rewrite, a
# guarded "reals" rewrite: extract/guard.py) differ at each float output element by at most
#     2 [((1 + u)**K - 1) T + (1 + u)**K ((1 + l)**N - 1) W],   K = n - 1 + m,  N = n + 2 m,
# n the number of the element's terms (every sum and reuse expanded), T the sum of their magnitudes, W the sum
# of their products with each factor below 1 in magnitude raised to 1, m the most multiplications, quotients and
# conversions in one term, u the largest unit roundoff and l the largest underflow step among the program's float
# dtypes (`underflow_step`: XLA's CPU kernels flush float32, bfloat16 and float64 subnormals to zero). The first
# term is the standard bound for a sum in any order (Higham, Accuracy and Stability of Numerical Algorithms,
# section 4.2), about 2 (n + m - 1) u T; the second, about 2 (n + 2 m) l W, is what values too small to matter
# can do when they underflow in one order and not in the other. The proof is extract/guard.py's module doc.
# Where the terms cancel, the relative error of the result can be large (sum(a @ b) with terms 2**27, 7 and
# -2**27 is 7 in one order and 0 in another). README's contract states this bound; `judge` applies it where
# `verify` has it.

_MAGNITUDE_OPS = frozenset({"add", "sub", "mul", "neg", "abs", "matmul", "reduce_sum", "transpose", "reshape",
                            "broadcast", "slice", "concat", "pad", "convert", "square", "stop_gradient"})


def underflow_step(dtype) -> float:
    """What one rounding of a value of `dtype` may lose besides its relative error (the bound above): the
    smallest normal number where XLA may flush subnormals to zero (float32, bfloat16, float64 on its CPU
    kernels, results and arguments alike), half the smallest subnormal for float16, which XLA computes in
    float32 and rounds with gradual underflow."""
    info = ml_dtypes.finfo(np.dtype(dtype))
    return float(info.smallest_subnormal) / 2 if np.dtype(dtype) == np.float16 else float(info.tiny)


def _magnitude_graph(graph: Graph, mode: str) -> Graph | None:
    """`graph` as the sum of its terms' magnitudes ("magnitude": evaluated on the arguments' magnitudes), as the
    number of its terms ("count": on ones) or as the sum of its terms with every factor below 1 raised to 1
    ("raised": on max(1, |argument|)), where it is a polynomial program (sums, products, positive integer powers,
    contractions, moves, quotients by a constant); None elsewhere."""
    flat = unfused(graph)
    constant = {i for i, n in enumerate(flat.nodes) if n.op in ("lit", "const")}
    consts = [np.ones_like(c) if mode == "count" else np.abs(c) for c in flat.consts]
    if mode == "raised":
        consts = [np.maximum(c, 1) for c in consts]

    def leaf(value: float) -> float:
        return 1.0 if mode == "count" else max(abs(value), 1.0) if mode == "raised" else abs(value)

    nodes, ids = [], {}
    for i, n in enumerate(flat.nodes):
        if n.op == "lit" and is_float(n.dtype):
            n = Node("lit", (), (leaf(float(n.attrs[0])),), n.shape, n.dtype)
        elif n.op == "sub":
            n = Node("add", n.inputs, n.attrs, n.shape, n.dtype)
        elif n.op == "neg":
            n = Node("abs", n.inputs, (), n.shape, n.dtype)
        elif n.op == "div" and n.inputs[1] in constant:   # a mean's quotient by its count
            if mode == "raised":   # the factor 1 / |c| raised to 1: divide by min(|c|, 1), its own node
                d = flat.nodes[n.inputs[1]]
                if d.op == "lit":
                    divisor = Node("lit", (), (min(abs(float(d.attrs[0])), 1.0),), d.shape, d.dtype)
                else:
                    consts.append(np.minimum(np.abs(flat.consts[d.attrs[0]]), 1))
                    divisor = Node("const", (len(consts) - 1,), (), d.shape, d.dtype)
                nodes.append(divisor)
                n = Node("div", (ids[n.inputs[0]], len(nodes) - 1), n.attrs, n.shape, n.dtype)
                ids[i] = len(nodes)
                nodes.append(n)
                continue
        elif not (n.op in _MAGNITUDE_OPS or n.op in ("arg", "lit", "const")
                  or (n.op == "integer_pow" and n.attrs[0] >= 1)):
            return None
        ids[i] = len(nodes)
        nodes.append(Node(n.op, tuple(ids[j] for j in n.inputs), n.attrs, n.shape, n.dtype))
    return Graph(nodes=nodes, outputs=[ids[o] for o in flat.results], consts=consts, n_args=flat.n_args)


def _roundings(graph: Graph) -> tuple[list[int], float, float]:
    """Per output of a polynomial `graph`, the most multiplications, quotients and conversions in one of its
    terms (m above); and the largest unit roundoff and underflow step among its float values."""
    flat = unfused(graph)
    most: dict[int, int] = {}
    u = step = 0.0
    for i in flat.live():
        n = flat.nodes[i]
        if is_float(n.dtype):
            step = max(step, underflow_step(n.dtype))
            if n.op not in ("arg", "lit", "const"):
                u = max(u, float(ml_dtypes.finfo(np.dtype(n.dtype)).eps) / 2)
        ins = [most[j] for j in n.inputs]
        if n.op in ("mul", "matmul", "div"):
            most[i] = sum(ins) + 1
        elif n.op == "square":
            most[i] = 2 * ins[0] + 1
        elif n.op == "integer_pow":   # k copies of the operand joined by k - 1 products, however XLA groups them
            most[i] = n.attrs[0] * ins[0] + n.attrs[0] - 1
        elif n.op == "convert":
            most[i] = ins[0] + 1
        else:   # a leaf, a move, a sum: a term takes one operand's
            most[i] = max(ins, default=0)
    return [most[o] for o in flat.results], u, step


def reordered_sum_bound(graph: Graph, args) -> list | None:
    """Per output of `graph` on `args`, how far a float result may move when its sums are added in another
    order: the bound above, elementwise, in float64 (inf where it overflows); None where the program is not
    polynomial or an argument is not finite (no such bound is claimed). Integer outputs get 0."""
    graphs = {mode: _magnitude_graph(graph, mode) for mode in ("magnitude", "count", "raised")}
    if any(g is None for g in graphs.values()) or any(not np.isfinite(np.asarray(a, np.float64)).all()
                                                    for a in args if is_float(np.asarray(a).dtype)):
        return None
    absolute = [np.abs(np.asarray(a)) for a in args]
    inputs = {"magnitude": absolute, "count": [np.ones_like(np.asarray(a)) for a in args],
              "raised": [np.maximum(x, 1) if is_float(x.dtype) else x for x in absolute]}
    with np.errstate(over="ignore", invalid="ignore"):
        mags, counts, raised = (evaluate(graphs[k], inputs[k], precise=True) for k in ("magnitude", "count", "raised"))
        most, u, step = _roundings(graph)
        bounds = []
        for out, t, n, w, m in zip(graph.results, mags, counts, raised, most):
            if not is_float(graph.nodes[out].dtype):
                bounds.append(np.zeros(np.shape(t)))
                continue
            n = np.asarray(n, np.float64)
            relative = np.expm1((n - 1 + m) * math.log1p(u))             # (1 + u)**K - 1
            absolute_part = np.expm1((n + 2 * m) * math.log1p(step))     # (1 + l)**N - 1
            bound = 2.0 * (relative * np.asarray(t, np.float64)
                           + (1.0 + relative) * absolute_part * np.asarray(w, np.float64))
            bounds.append(np.where(np.isnan(bound), np.inf, bound))   # inf times a zero sum: no claim
    return bounds


def within_reordering(expected, actual, bound) -> np.ndarray:
    """`actual`, with each finite element within `bound` of `expected`'s (finite too) taken from it."""
    e, a = np.asarray(expected), np.asarray(actual)
    if bound is None or e.shape != a.shape or not is_float(e.dtype) or np.shape(bound) != e.shape:
        return a
    e64, a64 = e.astype(np.float64), a.astype(np.float64)
    close = np.isfinite(e64) & np.isfinite(a64) & (np.abs(a64 - e64) <= bound)
    return np.where(close, e, a) if close.any() else a


def judge(expected: list, actual: list, truth, numerics: str = "strict", as_dtype: str | None = None,
          reordering=None) -> str | None:
    """None if `actual` (the optimized program's outputs) keeps the contract against `expected` (the
    original's) on one input set, else a description. Integers and bools equal; floats NaN and +-inf
    exactly where the original has them (up to `range_edge`) and finite values within the dtype's
    tolerance (`mismatch`) or, failing that, as close to the float64 value as the original (`as_accurate`;
    for integer outputs rounded from floats, rounding differently no more often). `truth` is the
    original's float64 outputs or a callable that computes them (called only when needed), or None (no
    fallback). Under "fast", an input set on which one program overflowed (`overflowed`) is not
    compared. `as_dtype` widens the tolerance to a narrower type's, as `mismatch` does. `reordering` (the
    bounds of `reordered_sum_bound`, or a callable giving them or None) accepts an element within the bound on
    a sum added in another order, which the contract allows."""
    if len(expected) != len(actual):
        return f"{len(actual)} outputs, expected {len(expected)}"
    if numerics == "fast" and overflowed(expected, actual):
        return None
    values = None
    for k, (e, a) in enumerate(zip(expected, actual)):
        e, a = np.asarray(e), range_edge(e, a)
        problem = mismatch(e, a, as_dtype)
        if problem is None:
            continue
        if values is None and truth is not None:
            values = truth() if callable(truth) else truth
        if values is not None:
            a = sum_edge(e, a, values[k])
            problem = mismatch(e, a, as_dtype) and as_accurate(e, a, values[k])
        if problem and reordering is not None and is_float(e.dtype):
            if callable(reordering):
                reordering = reordering()
            if reordering is not None and mismatch(e, within_reordering(e, a, reordering[k]), as_dtype) is None:
                problem = None
        if problem:
            return f"output {k}: {problem}"
    return None


def sum_edge(expected, actual, truth) -> np.ndarray:
    """`actual`, with each element where one program is infinite and the other NaN and the program's float64
    value is infinite, NaN or beyond the dtype's largest finite value, taken from `expected`: the
    contract's sum edge (README.md), where terms adding up past the range make a partial sum overflow in one
    order of adding and not another (a dot multiplies and adds in separate roundings, a fused loop may not),
    so inf and NaN may trade places."""
    e, a = np.asarray(expected), np.asarray(actual)
    if e.shape != a.shape or e.dtype != a.dtype or not is_float(e.dtype) or np.shape(truth) != e.shape:
        return a
    t = np.asarray(truth, dtype=np.float64)
    beyond = ~np.isfinite(t) | (np.abs(t) > float(ml_dtypes.finfo(e.dtype).max))
    e64, a64 = e.astype(np.float64), a.astype(np.float64)
    edge = ((np.isnan(e64) & np.isinf(a64)) | (np.isinf(e64) & np.isnan(a64))) & beyond   # never -inf for +inf
    return np.where(edge, e, a) if edge.any() else a


def input_sets(avals, numerics: str = "strict", trials: int = 2,
               buffers: Buffers | None = None) -> Iterator[tuple[str, list]]:
    """The fixed input sets of a verification, one at a time (a model's are large): `trials` random ones,
    then the adversarial ones of the mode ("strict": zeros and specials; "fast": zeros only, no NaN or
    inf); the scaled ones are built against the original (`calibrated`)."""
    for seed in range(trials):
        yield f"random inputs (seed {seed})", random_args(avals, seed, buffers)
    for kind in STRICT_SETS if numerics == "strict" else FAST_SETS:
        yield f"{kind} inputs", special_args(avals, kind, buffers=buffers)


# The original's outputs on the random sets of the last few verifications, by the key of the program
# verified (`verify(remember=)`): the NPU check of a segment runs the same sets (random_args, seeds 0
# and 1) against the same original in this process, and takes them from here rather than run it again.
REMEMBERED = 4
_remembered: dict[str, dict[int, list]] = {}


def remembered(key: str | None) -> dict[int, list]:
    """{seed: the original's outputs on random_args(avals, seed)} of the verification of `key`, or {}."""
    return dict(_remembered.get(key, {})) if key else {}


def _remember(key: str, seed: int, outputs: list) -> None:
    if key not in _remembered and len(_remembered) >= REMEMBERED:
        del _remembered[next(iter(_remembered))]
    _remembered.setdefault(key, {})[seed] = outputs


def verify(reference, candidate, avals, original, numerics: str = "strict", trials: int = 2,
           remember: str | None = None, extra=()) -> str | None:
    """None if `candidate` keeps the numerics contract against `reference` (the original program, as
    jax.jit runs it) on every input set of the mode, else a description naming the set.

    "strict" (README.md's contract for every input): `trials` random sets, the zeros and specials sets,
    and the scaled sets of `scale_patterns`, each calibrated to where the original is close to
    overflowing. "fast" (rewrites equal over the reals, which may overflow where the original does not):
    the random sets and the zeros set, whose inputs are finite (+-0, subnormals, +-1): NaN and inf inputs
    and near-overflow ones are left out, since a re-associated or factored product may turn an inf into a
    NaN or overflow where the original does not; and a set on which one program overflowed is skipped
    (`judge`). NaN positions, zeros, subnormals and finite values are still compared. With `remember`
    (a key of the original program), its outputs on the random sets are kept for `remembered`. `extra`: more
    (where, arguments) sets, checked before those (a guarded program's domain sets: `domain_args`)."""
    numerics = Numerics.of(numerics)

    def check(where: str, args, expected=None) -> str | None:
        expected = _outputs(reference, args) if expected is None else expected
        problem = judge(expected, _outputs(candidate, args), lambda: evaluate(original, args, precise=True),
                        numerics, reordering=lambda: reordered_sum_bound(original, args))
        return f"{problem}, on {where}" if problem else None

    buffers = Buffers()          # a set's memory goes to the next once it is judged
    for where, args in extra:
        problem = check(where, args)
        if problem:
            return problem
    for n, (where, args) in enumerate(input_sets(avals, numerics, trials, buffers)):
        expected = _outputs(reference, args)
        if remember is not None and n < trials:   # the random sets come first, seed n
            _remember(remember, n, expected)
        problem = check(where, args, expected)
        if problem:
            return problem
        buffers.release(args)
    if numerics == "strict":
        scaler = Scaler(avals, buffers=buffers)
        for name, pattern in scale_patterns(avals):
            s, args, expected = calibrated(reference, avals, pattern, scaler=scaler)
            problem = check(f"scaled inputs ({name}, s={s:.3g})", args, expected)
            if problem:
                return problem
            buffers.release(args)
    return None
