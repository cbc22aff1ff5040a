"""The e-graph a search encodes its program on (egraph/encode.py, `scratch` and `template`): the main thread's
template, which holds the analyses' facts and the analysis rule set, pushed for one search and popped after
it, or left as it is where the program is encoded in saturation's child process (egraph/isolate.py)."""
import gc
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from superopt import superopt
from superopt.core.ir import pretty
from superopt.egraph import egglog_api as api
from superopt.egraph.analysis import analysis
from superopt.egraph.capture import capture
from superopt.egraph.encode import constructors, encode, scratch, template
from superopt.egraph.isolate import encode_and_saturate, saturate_isolated
from superopt.egraph.frozen import count
from superopt.egraph.limits import Limits
from superopt.egraph.runner import _census, saturate
from superopt.extract.greedy import extract
from superopt.extract.target import load_target
from superopt.egraph.frozen import freeze
from superopt.stages import schedule_of
from superopt.rulesets import DEFAULT

@pytest.fixture(autouse=True)
def _collected_here():
    """The e-graphs these tests leave are dropped on this (the main) thread, not by a later test's worker."""
    yield
    gc.collect()


X = jnp.asarray(np.random.default_rng(0).standard_normal((16, 16)), jnp.float32)
PROGRAMS = (lambda a: jnp.abs(jnp.exp(a)) + 1.0,
            lambda a: (a @ a.T) @ a + jnp.sum(a, axis=1, keepdims=True),
            lambda a: jnp.max(a, axis=0) - jnp.mean(a))


def chosen(graph, egraph=None):
    """(e-nodes, e-classes, the program greedy extraction chooses) of `graph` saturated by the default rule sets."""
    enc = encode(graph, egraph=egraph)
    run = saturate(enc.egraph, schedule_of(DEFAULT, "strict", "cpu")[0], Limits())
    frozen = freeze(enc.egraph)
    return run.enodes, run.eclasses, pretty(extract(frozen, enc, load_target("cpu")).graph)


def test_a_search_on_the_template_finds_what_it_finds_on_a_new_e_graph_and_leaves_it_empty():
    for fn in PROGRAMS:
        graph = capture(fn, (X,)).graph
        with scratch() as empty:
            assert count(empty) == (0, 0) and api.is_registered(empty, analysis())
            on_template = chosen(graph, empty)
        assert on_template == chosen(graph)
    with scratch() as empty:
        assert count(empty) == (0, 0)   # popped: no term of the programs above is left


def test_a_nested_or_concurrent_search_gets_an_e_graph_of_its_own(monkeypatch):
    with scratch() as outer:
        with scratch() as inner:
            assert inner is not outer and not api.is_registered(inner, analysis())

    class Made:   # a stand-in: a real e-graph made on the worker thread would be dropped on another one
        def register(self, *facts):
            pass
    import superopt.egraph.encode as encoding
    monkeypatch.setattr(encoding, "EGraph", Made)
    seen = []

    def search():   # a worker thread (background=True's) makes its own: an e-graph is dropped where it was made
        with scratch() as eg:
            seen.append(type(eg))
    thread = threading.Thread(target=search)
    thread.start()
    thread.join()
    assert seen == [Made]


def test_superopt_gives_the_same_program_with_the_template():
    fast = superopt(PROGRAMS[1], cache=False)
    np.testing.assert_allclose(np.asarray(fast(X)), np.asarray(PROGRAMS[1](X)), rtol=1e-5, atol=1e-5)
    assert fast.report.run.enodes == chosen(capture(PROGRAMS[1], (X,)).graph)[0]


def test_a_program_encoded_in_the_child_is_searched_as_one_encoded_here_and_leaves_the_template_as_it_was():
    schedule = schedule_of(DEFAULT, "strict", "cpu")[0]
    for fn in PROGRAMS:
        graph = capture(fn, (X,)).graph
        with scratch() as empty:
            here = saturate_isolated(encode(graph, egraph=empty).egraph, schedule, Limits())
        with template() as tpl:
            before = api.table_sizes(tpl)
            run, frozen, convs, seconds, facts = encode_and_saturate(graph, tpl, schedule, Limits())
            assert api.table_sizes(tpl) == before and seconds > 0 and facts is None
        assert (run.enodes, run.eclasses, run.iterations) == (here[0].enodes, here[0].eclasses, here[0].iterations)
        assert repr(list(frozen.classes.items())) == repr(list(here[1].classes.items()))


@pytest.mark.parametrize("fn", [*PROGRAMS, lambda a: jnp.concatenate([jnp.sort(a, axis=0), a.T], axis=1),
                                lambda a: jnp.argmax(jax.lax.reduce_window(a, -jnp.inf, jax.lax.max, (2, 2), (1, 1),
                                                                           "VALID"), axis=1),
                                lambda a: jnp.cumsum(a.astype(jnp.int32) ** 3, axis=0)[2:5]])
def test_the_constructors_known_before_encoding_are_those_the_encoded_e_graph_holds(fn):
    graph = capture(fn, (X,)).graph
    assert constructors(graph) == _census(encode(graph).egraph)[1]


def test_the_facts_read_where_a_speculative_search_encodes_are_those_of_the_program_alone():
    from superopt.extract.guard import _facts
    schedule, known = schedule_of(DEFAULT, "strict", "cpu")[0], set()
    for fn in (*PROGRAMS, lambda a: jnp.sqrt(jnp.exp(a) + 1.0) * jnp.log(jnp.abs(a) + 2.0)):
        graph = capture(fn, (X,)).graph
        with template() as tpl:
            *_, facts = encode_and_saturate(graph, tpl, schedule, Limits(), origins=True)
        assert facts == _facts(graph, None)
        known |= {name for names in facts.values() for name in names}
    assert known   # some node has a fact: the comparison is not of empty sets only
