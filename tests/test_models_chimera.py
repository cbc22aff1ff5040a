"""The Chimera data-movement model reproduces the thesis's Table 3.4 for the mlkn order."""
import itertools

import pytest

from superopt.extract.models.chimera import (
    data_movement, gemm_chain, gemm_chain_mlkn, optimal_dv_mlkn, optimal_tiles_mlkn,
)

pytestmark = pytest.mark.slow   # whole models, worker processes or long searches: make test, not test-fast

SHAPES = [(512, 64, 64, 512), (256, 64, 64, 256), (208, 80, 80, 208), (1024, 64, 64, 512), (100, 30, 70, 50)]


def divisors(x):
    return [d for d in range(1, x + 1) if x % d == 0][:6] + [x]


@pytest.mark.parametrize("m, n, k, l", SHAPES)
def test_algorithm_1_matches_table_3_4_for_mlkn(m, n, k, l):
    """The table's closed forms hold for tiles that divide the extents, as the table assumes."""
    ops, io, extents = gemm_chain(m, n, k, l)
    for tm, tn, tk, tl in itertools.product(divisors(m), divisors(n), divisors(k), divisors(l)):
        tiles = {"m": tm, "n": tn, "k": tk, "l": tl}
        assert data_movement(ops, io, list("mlkn"), extents, tiles) == gemm_chain_mlkn(m, n, k, l, tm, tn, tk, tl)


def test_tiles_that_do_not_divide_move_the_padded_volume():
    ops, io, extents = gemm_chain(100, 30, 70, 50)
    tm, tn, tk, tl = 16, 8, 32, 24
    c = lambda x, t: -(-x // t)  # noqa: E731
    padded = {"m": c(100, tm) * tm, "n": c(30, tn) * tn, "k": c(70, tk) * tk, "l": c(50, tl) * tl}
    expected = (padded["m"] * padded["k"] * c(50, tl) + padded["k"] * padded["l"] * c(100, tm)
                + padded["n"] * padded["l"] * c(100, tm) + padded["m"] * padded["n"] * c(50, tl))
    assert data_movement(ops, io, list("mlkn"), extents, {"m": tm, "n": tn, "k": tk, "l": tl})[0] == expected


def test_the_intermediate_costs_nothing_and_outer_loops_multiply():
    ops, io, extents = gemm_chain(64, 64, 64, 64)
    tiles = {"m": 16, "n": 16, "k": 16, "l": 16}
    dv_chain, _ = data_movement(ops, io, list("mlkn"), extents, tiles)
    dv_unfused, _ = data_movement(ops, io | {"C"}, list("mlkn"), extents, tiles)
    assert dv_unfused > dv_chain
    small, _ = data_movement(ops, io, list("mlkn"), extents, {"m": 8, "n": 16, "k": 16, "l": 8})
    assert small > dv_chain  # smaller tiles reload more


@pytest.mark.parametrize("m, n, k, l", SHAPES[:4])
def test_analytic_tiles_fit_and_come_close_to_the_optimum(m, n, k, l):
    capacity = 64 * 1024  # elements
    tiles = optimal_tiles_mlkn(m, n, k, l, capacity)
    dv, mu = gemm_chain_mlkn(m, n, k, l, tiles["m"], tiles["n"], tiles["k"], tiles["l"])
    assert mu <= capacity
    assert dv <= 1.5 * optimal_dv_mlkn(m, n, k, l, capacity) + 2 * m * l * (k + n)  # clamped at the extents
