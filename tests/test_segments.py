"""Segments (superopt/segments.py) and the persistent cache in the pipeline (superopt/pipeline.py, reuse.py):
a repeated model is optimized once per distinct segment, results come back from the cache in a new
optimization, and whatever is wrong with an entry makes it a miss, never a wrong program."""
import sqlite3

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import ray

from superopt import Limits, StopReason, npu_backend, reuse, superopt
from superopt.cache import Store
from superopt.core.ir import pretty, unfused
from superopt.core.serial import NotSerializable, dumps, from_data, to_data
from superopt.egraph.capture import capture
from superopt.lowering.jax import lower
from superopt.report import SeamsUse
from superopt.segments import MIN_SEGMENT, SEAM_NODES, seam_windows, split, stitch

pytestmark = pytest.mark.slow   # whole models, worker processes or long searches: make test, not test-fast


def layer(p, x):
    h = x @ p["w1"] + p["b1"]
    h = jax.nn.gelu(h, approximate=True) @ p["w2"] + p["b2"]
    x = x + h
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(v + 1e-5) * p["g"]


def model(ps, x):
    for p in ps:
        x = layer(p, x)
    return x


# Where a test needs segments superopt changes, it names a GPU target: on cpu XLA fuses these layers by
# itself (extract/xla.py) and folds their transposes into the dots, so the original runs; the machinery
# under test (splitting, the cache, seams, workers, limits) is the same for every target.
CHANGED = "gpu-h100"


def params(n, seed=0, d=32, f=64):
    k = jax.random.PRNGKey(seed)
    return [dict(w1=jax.random.normal(jax.random.fold_in(k, i), (d, f)) / 8, b1=jnp.full(f, 0.1, jnp.float32),
                 w2=jax.random.normal(jax.random.fold_in(k, 100 + i), (f, d)) / 8, b2=jnp.zeros(d), g=jnp.ones(d))
            for i in range(n)], jax.random.normal(k, (8, d))


def outputs(fn, *args):
    return [np.asarray(o) for o in jax.tree_util.tree_leaves(fn(*args))]


# ---- splitting ----

def test_a_repeated_model_splits_into_its_layers_one_distinct():
    ps, x = params(5)
    graph = capture(model, (ps, x)).graph
    segments = split(graph)
    assert segments is not None and len(segments) == 5
    assert len({s.key for s in segments}) == 1            # different weights, one canonical segment
    assert all(len(s.nodes) >= MIN_SEGMENT for s in segments)
    # Stitching the segments as they are gives back the program, bit for bit.
    same = stitch(graph, segments, {s.key: s.graph for s in segments})
    flat = jax.tree_util.tree_leaves((ps, x))
    for a, b in zip(lower(graph)(*flat), lower(same)(*flat)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_loop_unrolled_over_the_rows_of_an_argument_is_one_segment_a_step():
    """Each step reads xs[t]: the slices are computed before the segments, so the steps are one segment."""
    def rnn(xs, h, w, u):
        for t in range(xs.shape[0]):
            z = jnp.tanh(xs[t] @ w + h @ u)
            h = jax.nn.sigmoid(z) * h + (1 - jax.nn.sigmoid(z)) * jnp.tanh(z @ u)
            h = h / (1 + jnp.abs(h).sum(-1, keepdims=True)) + jnp.exp(-h * h) * 0.1 - jnp.log1p(h * h)
        return h
    args = (jax.random.normal(jax.random.PRNGKey(1), (6, 4, 16)), jnp.zeros((4, 16)),
            jnp.eye(16) * 0.5, jnp.eye(16) * 0.25)
    graph = capture(rnn, args).graph
    segments = split(graph)
    assert segments is not None and len(segments) == 6 and len({s.key for s in segments}) == 1
    same = stitch(graph, segments, {s.key: s.graph for s in segments})
    for a, b in zip(lower(graph)(*args), lower(same)(*args)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_small_program_is_not_split():
    assert split(capture(lambda a, b: (a @ b) * 2 + 1, (jnp.ones((4, 4)), jnp.ones((4, 4)))).graph) is None
    ps, x = params(1)
    assert split(capture(model, (ps, x)).graph) is None   # one layer: nothing repeats, not large


def test_seam_windows_cover_the_stitched_program_and_stitch_back_exactly():
    """Around each cut a window of both segments' ends; the windows and the middles between them cover the
    stitched program's computed nodes once each, in order, and stitching them as they are changes nothing."""
    ps, x = params(4)
    graph = capture(model, (ps, x)).graph
    segments = split(graph)
    starts: list = []
    stitched = stitch(graph, segments, {s.key: s.graph for s in segments}, starts)
    assert len(starts) == len(segments) and starts == sorted(starts)
    seams = seam_windows(stitched, starts)
    windows = [p for p in seams.pieces if p.key in seams.windows]
    assert len(windows) == len(segments) - 1 and len(seams.windows) == 1   # one distinct seam
    side = min(SEAM_NODES, len(segments[1].nodes) // 3)   # each op its own node: no kernel in these programs
    assert side > 0 and all(len(w.nodes) == 2 * side for w in windows)
    covered = [i for p in seams.pieces for i in p.nodes]
    assert covered == sorted(covered) and len(covered) == sum(len(s.nodes) for s in segments)
    for w, start in zip(windows, starts[1:]):   # each window straddles its cut
        assert w.nodes[0] < start <= w.nodes[-1]
    again = stitch(stitched, seams.pieces, {p.key: p.graph for p in seams.pieces})
    flat = jax.tree_util.tree_leaves((ps, x))
    for a, b in zip(lower(graph)(*flat), lower(again)(*flat)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_chosen_program_unfused_has_no_kernel_and_computes_the_same(tmp_path):
    ps, x = params(1)
    spec = superopt(model, CHANGED, cache=False).compile(ps, x)
    assert "kernel" in spec.report.ops_after, spec.report.ops_after
    plain = unfused(spec.term)
    assert not any(n.op == "kernel" for n in plain.nodes)
    flat = jax.tree_util.tree_leaves((ps, x))
    for a, b in zip(lower(spec.term)(*flat), lower(plain)(*flat)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


def test_a_rewrite_across_a_seam_is_found_in_its_window(tmp_path):
    """Each layer transposes its input and its result: the two transposes meeting at a cut cancel, which
    no segment can see alone. The window around the seam finds it, and a new optimization reads it back."""
    def layer(x, w):
        h = x.T @ w
        for _ in range(12):
            h = jnp.tanh(h) * 0.5 + h
        return h.T

    def chain(ws, x):
        for w in ws:
            x = layer(x, w)
        return x
    ws = [jax.random.normal(jax.random.PRNGKey(i), (16, 16)) / 4 for i in range(4)]
    x = jax.random.normal(jax.random.PRNGKey(9), (16, 16))
    fast = superopt(chain, CHANGED, cache=tmp_path, rulesets=("algebra", "layout"))
    got = outputs(fast, ws, x)
    report = fast.report
    assert report.ops_before["transpose"] == 8 and report.ops_after.get("transpose", 0) == 2, report.ops_after
    assert report.segments.seams == SeamsUse(seams=3, windows=1, optimized=1, from_cache=0, changed=1), report.segments
    for a, b in zip(got, outputs(jax.jit(chain), ws, x)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
    again = superopt(chain, CHANGED, cache=tmp_path, rulesets=("algebra", "layout")).compile(ws, x)
    assert again.report.segments.seams == SeamsUse(seams=3, windows=1, optimized=0, from_cache=1, changed=1)
    assert not any(k.startswith("saturate") for k in again.report.stage_seconds)
    assert pretty(again.term) == fast.term


def test_a_segments_search_is_bounded_in_cpu_time_and_keeps_the_best_it_found(tmp_path):
    """Limits.segment_seconds bounds each segment's search in CPU time; saturation_seconds, for a segment,
    is CPU time too. A search cut short yields the best program found, verified and stored; a budget spent
    before the search starts leaves the segment as captured, and the report says which limit ran out."""
    ps, x = params(4)
    spent = superopt(model, CHANGED, cache=False, limits=Limits(segment_seconds=1e-3)).compile(ps, x).report
    assert spent.segments.timed_out == spent.segments.optimized == 1, spent.segments
    assert "of CPU time ran out" in spent.outcome, spent.outcome
    # 0.05 s: a few of the algebra phase's iterations here, of a saturation that takes 0.15 to 0.3 s
    fast = superopt(model, CHANGED, cache=tmp_path, limits=Limits(saturation_seconds=0.05))
    got = outputs(fast, ps, x)
    report = fast.report
    assert report.optimized and report.run.stop_reason is StopReason.TIME_LIMIT, (report.outcome, report.run)
    for a, b in zip(got, outputs(jax.jit(model), ps, x)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
    again = superopt(model, CHANGED, cache=tmp_path, limits=Limits(saturation_seconds=0.05)).compile(ps, x)
    used = again.report.segments
    assert (used.count, used.distinct, used.optimized, used.from_cache) == (4, 1, 0, 1), used
    assert pretty(again.term) == fast.term


def test_programs_round_trip_through_data_exactly():
    graph = capture(lambda a: jnp.where(a > 0, a * jnp.inf, -0.0) + jnp.nan, (jnp.ones(3),)).graph
    back = from_data(to_data(graph))
    assert dumps(to_data(back)) == dumps(to_data(graph))   # floats by their bits: NaN, inf and -0 kept
    assert [repr(n) for n in back.nodes] == [repr(n) for n in graph.nodes]
    assert pretty(back) == pretty(graph)
    for bad in ({}, {"nodes": [["add", [5], [], [3], "float32"]], "outputs": [0], "consts": [], "n_args": 0,
                     "hidden_outputs": 0}):
        with pytest.raises(NotSerializable):
            from_data(bad)


# ---- the pipeline in segments, and the cache ----

def test_each_distinct_segment_is_optimized_once_and_then_comes_from_the_cache(tmp_path):
    ps, x = params(4)
    fast = superopt(model, CHANGED, cache=tmp_path)
    got = outputs(fast, ps, x)
    report = fast.report
    assert report.optimized, report
    assert (report.segments.count, report.segments.distinct, report.segments.optimized) == (4, 1, 1), report.segments
    for a, b in zip(got, outputs(jax.jit(model), ps, x)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
    # A new optimization of the same model (another process would see the same) reads the result back:
    # no saturation, the same program.
    again = superopt(model, CHANGED, cache=tmp_path)
    spec = again.compile(ps, x)
    used = spec.report.segments
    assert (used.optimized, used.from_cache, used.seams) == (0, 1, None), used
    assert not any(k.startswith("saturate") for k in spec.report.stage_seconds)
    assert pretty(spec.term) == fast.term
    assert spec.report.cost_after == report.cost_after


def test_a_whole_program_result_is_cached_and_a_rule_or_version_change_misses(tmp_path, monkeypatch):
    fn = lambda a, b: (a @ b) @ b
    a = b = jnp.eye(64) * 0.5
    first = superopt(fn, cache=tmp_path).compile(a, b)
    assert first.report.cache.status == "miss", first.report.cache
    hit = superopt(fn, cache=tmp_path).compile(a, b)
    assert hit.report.cache.status == "hit" and "saturate" not in hit.report.stage_seconds
    assert pretty(hit.term) == pretty(first.term) and hit.report.outcome == first.report.outcome
    other_rules = superopt(fn, cache=tmp_path, rulesets=("algebra",)).compile(a, b)
    assert other_rules.report.cache.status == "miss"
    monkeypatch.setattr(reuse, "code_version", lambda: "superopt 9.9 (another build)")
    assert superopt(fn, cache=tmp_path).compile(a, b).report.cache.status == "miss"
    assert superopt(fn, cache=False).compile(a, b).report.cache is None


def test_a_wrong_entry_is_recomputed_never_run(tmp_path):
    """An entry that decodes and passes its checksum but is no result for the program (another program's
    term, results of other types) is a miss: the program is optimized again and is right."""
    fn = lambda a: jnp.exp(a) * 2 + jnp.exp(a)
    a = jnp.linspace(-2, 2, 16).reshape(4, 4)
    store = Store(tmp_path)
    superopt(fn, cache=tmp_path).compile(a)
    other = capture(lambda a: a[:2], (a,)).graph          # a real program, of the wrong result type
    for key in _keys(store, "program"):
        entry = store.get(key, "program")
        store.put(key, "program", dict(entry, term=to_data(other), outcome="OPTIMIZED"))
    spec = superopt(fn, cache=tmp_path).compile(a)
    assert spec.report.cache.status == "miss", spec.report.cache
    np.testing.assert_allclose(np.asarray(spec.run(a)[0]), np.asarray(jax.jit(fn)(a)), rtol=1e-6)


def _keys(store: Store, kind: str) -> list[str]:
    db = sqlite3.connect(store.directory / "terms.sqlite3")
    try:
        return [k for (k,) in db.execute("SELECT key FROM entries WHERE kind = ?", (kind,))]
    finally:
        db.close()


def test_compile_takes_shapes_only(tmp_path):
    ps, x = params(3)
    shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (ps, x))
    fast = superopt(model, CHANGED, cache=tmp_path)
    spec = fast.compile(*shapes)
    assert spec.report.optimized and (spec.report.segments.count, spec.report.segments.distinct) == (3, 1)
    # The call with arrays of those shapes is the same specialization: nothing is optimized again.
    assert fast.compile(ps, x) is spec
    for a, b in zip(outputs(fast, ps, x), outputs(jax.jit(model), ps, x)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_the_ray_executor_chooses_the_same_programs_as_local_workers(tmp_path):
    """The segments optimized as Ray tasks on a local Ray instance give the very terms the local path gives.
    The call's wall-clock limit is raised for both: starting Ray on a loaded machine (CI runs four test
    workers on two cores) once took enough of the default 60 s that a segment's saturation, whose share
    is of the time left, stopped early and ran as captured."""
    ps, x = params(3)
    roomy = Limits(seconds=600.0)
    local = superopt(model, CHANGED, cache=False, limits=roomy).compile(ps, x)
    started = not ray.is_initialized()
    try:
        remote = superopt(model, CHANGED, cache=False, executor="ray", limits=roomy).compile(ps, x)
    finally:
        if started:
            ray.shutdown()
    assert remote.report.optimized and pretty(remote.term) == pretty(local.term)
    assert remote.report.cost_after == local.report.cost_after


def test_on_the_npu_each_distinct_segment_is_lowered_and_checked_once():
    ps, x = params(4)
    fast = superopt(model, "npu-910b", cache=False)
    got = outputs(fast, ps, x)
    report = fast.report
    assert report.backend.detail.startswith("npu emulator (npu-910b, numeric), in segments"), report.backend
    assert "in 4 segments, 1 of 1 distinct on the NPU" in "\n".join(report.npu_lines)
    assert 0 < fast.npu.cycles < fast.npu.cycles_before
    for a, b in zip(got, outputs(jax.jit(model), ps, x)):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)
    # Under an outer trace the stitched program runs as JAX.
    traced = jax.jit(lambda ps, x: fast(ps, x))(ps, x)
    np.testing.assert_allclose(np.asarray(traced), got[0], rtol=1e-3, atol=1e-3)


def test_the_npu_check_takes_the_originals_outputs_from_the_segments_verification(monkeypatch):
    """The segment's verification ran the original on the random inputs the NPU check draws (seeds 0 and
    1), in this process: the check compares with those outputs instead of running the original again,
    two runs fewer than when it has none, and it accepts the same program."""
    runs, asked = [], []
    real_lower, real_remembered = npu_backend.lower, npu_backend.verification.remembered

    def counted(graph, *args, **kwargs):
        program = real_lower(graph, *args, **kwargs)
        return lambda *flat: runs.append(graph) or program(*flat)

    def remembered(key):
        asked.append(sorted(real_remembered(key)))
        return real_remembered(key)
    monkeypatch.setattr(npu_backend, "lower", counted)
    monkeypatch.setattr(npu_backend.verification, "remembered", remembered)
    ps, x = params(3)
    spec = superopt(model, "npu-910b", cache=False).compile(ps, x)
    with_known = len(runs)
    assert asked == [[0, 1]] and spec.report.backend.runs == "npu emulator", (asked, spec.report.backend)
    monkeypatch.setattr(npu_backend.verification, "remembered", lambda key: {})
    runs.clear()
    again = superopt(model, "npu-910b", cache=False).compile(ps, x)
    assert len(runs) == with_known + 2 and again.report.backend == spec.report.backend


def test_a_segment_checked_on_the_npu_is_not_checked_again_from_the_cache(tmp_path):
    ps, x = params(3)
    first = superopt(model, "npu-910b", cache=tmp_path).compile(ps, x)
    again = superopt(model, "npu-910b", cache=tmp_path).compile(ps, x)
    assert "from the cache" not in first.report.backend.detail
    assert "(1 of 1 checked in an earlier run: from the cache)" in again.report.backend.detail, again.report.backend
    assert again.npu.cycles == first.npu.cycles and again.npu.cycles_before == first.npu.cycles_before
    np.testing.assert_allclose(np.asarray(again.run(*jax.tree_util.tree_leaves((ps, x)))[0]),
                               np.asarray(jax.jit(model)(ps, x)), rtol=1e-3, atol=1e-3)


def test_attributes_come_back_as_their_own_types_and_a_cached_conv_runs(tmp_path):
    """A convolution's dimension numbers are a NamedTuple and an int8 product's result type a numpy dtype:
    read back from the cache they must be those, not plain tuples or strings."""
    def conv(x, w):
        y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jax.nn.relu(y * 0.5 + 1.0)
    x, w = jnp.ones((1, 8, 8, 4)), jnp.full((3, 3, 4, 8), 0.1)
    graph = capture(conv, (x, w)).graph
    for a, b in zip(graph.nodes, from_data(to_data(graph)).nodes):
        assert a == b and [type(v) for v in a.attrs] == [type(v) for v in b.attrs]
    first = superopt(conv, cache=tmp_path).compile(x, w)
    again = superopt(conv, cache=tmp_path).compile(x, w)
    assert again.report.cache.status == "hit" and pretty(again.term) == pretty(first.term)
    np.testing.assert_allclose(np.asarray(again.run(x, w)[0]), np.asarray(jax.jit(conv)(x, w)), rtol=1e-5)
    i8 = capture(lambda a, b: jax.lax.dot(a, b, preferred_element_type=jnp.int32),
                 (jnp.ones((4, 4), jnp.int8), jnp.ones((4, 4), jnp.int8))).graph
    assert dumps(to_data(from_data(to_data(i8)))) == dumps(to_data(i8))


def test_a_cached_npu_segment_is_built_at_its_first_use_and_a_wrong_entry_falls_back(tmp_path, monkeypatch):
    """From the cache, the NPU program is built again when first called (a compile from shapes pays
    nothing for it); an entry whose cycles the rebuilt program does not give runs on JAX, with a warning."""
    import superopt.npu_backend as npu_backend
    ps, x = params(3)
    first = superopt(model, "npu-910b", cache=tmp_path).compile(ps, x)
    built = []
    real = npu_backend.NpuExecutable
    monkeypatch.setattr(npu_backend, "NpuExecutable", lambda *a, **k: built.append(1) or real(*a, **k))
    again = superopt(model, "npu-910b", cache=tmp_path).compile(ps, x)
    assert "from the cache" in again.report.backend.detail and built == []
    flat = jax.tree_util.tree_leaves((ps, x))
    np.testing.assert_allclose(np.asarray(again.run(*flat)[0]), np.asarray(jax.jit(model)(ps, x)),
                               rtol=1e-3, atol=1e-3)
    assert built == [1]
    (stored,) = again.npu.executables.values()
    assert stored.cycles == first.npu.cycles // 3 and stored.last is not None     # the run's, on the emulator
    wrong = npu_backend.StoredExecutable(stored.term, stored.target, stored.precision, stored.cycles + 1)
    with pytest.raises(npu_backend.EmulatorError, match="its cache entry holds"):
        wrong(*flat)
    with pytest.raises(npu_backend.EmulatorError, match="its cache entry holds"):   # remembered, not rebuilt
        wrong.describe


@pytest.mark.parametrize("mask", ["in every layer", "computed once"])
def test_identical_decoder_blocks_are_one_distinct_segment_however_many(mask):
    """12 pre-norm decoder blocks (weights as a list of per-block dicts, a causal mask, jnp.var, whose NaN
    fallback literal hashed apart by identity) are as many distinct segments as 2 blocks: one."""
    from bench.loops import in_turn, layer_stack, per_layer, transformer_layer
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((8, 32)), jnp.float32)
    causal = jnp.tril(jnp.ones((8, 8), bool))

    def block(h, p):
        if mask == "in every layer":
            return transformer_layer(h, p)
        a = (h - h.mean(-1, keepdims=True)) / jnp.sqrt(h.var(-1, keepdims=True) + 1e-5)
        s = jnp.where(causal, (a @ p["wq"]) @ (a @ p["wk"]).T, -1e9)
        return h + jax.nn.softmax(s, axis=-1) @ (a @ p["wv"]) @ p["wo"]

    distinct = {}
    for layers in (2, 12):
        params = per_layer(layer_stack(rng, layers, 32, 64), layers)
        segments = split(capture(in_turn(block), (params, x)).graph)
        assert segments is not None and len(segments) == layers
        distinct[layers] = {s.key for s in segments}
    assert len(distinct[12]) == len(distinct[2]) == 1 and distinct[12] == distinct[2]
