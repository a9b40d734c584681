"""Tests of the multi-client G-optimal design (fedbandit.design).

Oracles: hand-computed G-values, the classical Kiefer-Wolfowitz theorem (single client, single
group: min G = dim of the span), the identity sum_{i,a} pi u^T V^+ u = D, numpy's pinv, and the
cvxpy + Clarabel log-det program.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedbandit.bench.design import bench_design, paper_design_problem, random_design_problem
from fedbandit.design import (
    DesignResult,
    certificate,
    g_value,
    log_pdet,
    solve_design_cvxpy,
    solve_design_fast,
    span_bases,
    variances,
)

SQ2 = math.sqrt(2.0)


def _pinv_variances(weights, vectors, active, group):
    """Oracle: u^T V_g^+ u with V_g built in R^d and numpy's pinv (tolerance on the span)."""
    num_clients, num_arms, dim = vectors.shape
    out = np.zeros((num_clients, num_arms))
    for g in np.unique(group):
        mat = np.zeros((dim, dim))
        for i in range(num_clients):
            for a in range(num_arms):
                if active[i, a] and group[a] == g:
                    mat += weights[i, a] * np.outer(vectors[i, a], vectors[i, a])
        pinv = np.linalg.pinv(mat, rcond=1e-10, hermitian=True)
        for i in range(num_clients):
            for a in range(num_arms):
                if active[i, a] and group[a] == g:
                    out[i, a] = vectors[i, a] @ pinv @ vectors[i, a]
    return out


def _random_feasible(rng, active):
    w = rng.dirichlet(np.ones(active.shape[1]), size=active.shape[0]) * active
    w = np.where(active, w + 1e-3, 0.0)
    return w / w.sum(axis=1, keepdims=True)


def _assert_feasible(weights, active):
    assert weights.dtype == np.float64
    assert np.all(weights >= 0.0)
    assert np.all(weights[~active] == 0.0)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------
# Hand-computed values
# ------------------------------------------------------------------------------------------

E1, E2 = np.array([1.0, 0.0]), np.array([0.0, 1.0])
DIAG = np.array([1.0, 1.0]) / SQ2


def test_hand_computed_single_client_shared_group():
    # pi = (1/2, 1/4, 1/4) on e1, e2, (e1+e2)/sqrt2: V = [[5/8, 1/8], [1/8, 3/8]], det = 7/32,
    # V^{-1} = [[12/7, -4/7], [-4/7, 20/7]] -> variances 12/7, 20/7, 12/7; G = 20/7, D = 2.
    vectors = np.stack([E1, E2, DIAG])[None]
    active = np.ones((1, 3), dtype=bool)
    weights = np.array([[0.5, 0.25, 0.25]])
    group = np.zeros(3, dtype=int)
    np.testing.assert_allclose(
        variances(weights, vectors, active, group), [[12 / 7, 20 / 7, 12 / 7]], rtol=1e-12
    )
    assert g_value(weights, vectors, active, group) == pytest.approx(20 / 7, rel=1e-12)
    cert, rank = certificate(weights, vectors, active, group)
    assert rank == 2
    assert cert == pytest.approx(3 / 7, rel=1e-12)
    assert log_pdet(weights, vectors, active, group) == pytest.approx(math.log(7 / 32), rel=1e-12)


def test_hand_computed_single_client_disjoint_groups():
    # one 1-dim group per arm: variance 1/pi_a, G = max 1/pi_a = 4, D = 3, certificate 1/3.
    vectors = np.stack([E1, E2, DIAG])[None]
    active = np.ones((1, 3), dtype=bool)
    weights = np.array([[0.5, 0.25, 0.25]])
    np.testing.assert_allclose(variances(weights, vectors, active), [[2.0, 4.0, 4.0]], rtol=1e-12)
    assert certificate(weights, vectors, active) == (pytest.approx(1 / 3, rel=1e-12), 3)
    assert log_pdet(weights, vectors, active) == pytest.approx(math.log(1 / 32), rel=1e-12)
    result = solve_design_fast(vectors, active, tol=1e-9)
    np.testing.assert_allclose(result.weights, [[1 / 3, 1 / 3, 1 / 3]], atol=1e-12)
    assert result.g_value == pytest.approx(3.0, rel=1e-12)


def test_hand_computed_two_clients_scalar_arms():
    # d = 1, V_0 = pi00 * 1 + pi10 * 9 = 5, V_1 = pi01 * 4 + pi11 * 1 = 2.5 at pi = 1/2:
    # variances u^2 / V = [[0.2, 1.6], [1.8, 0.4]] -> G = 1.6 + 1.8 = 3.4, D = 2.
    vectors = np.array([[[1.0], [2.0]], [[3.0], [1.0]]])
    active = np.ones((2, 2), dtype=bool)
    weights = np.full((2, 2), 0.5)
    np.testing.assert_allclose(
        variances(weights, vectors, active), [[0.2, 1.6], [1.8, 0.4]], rtol=1e-12
    )
    assert certificate(weights, vectors, active) == (pytest.approx(0.7, rel=1e-12), 2)
    # optimum: G = D = 2 (equivalence theorem); both solvers find it
    assert solve_design_fast(vectors, active, tol=1e-8).g_value == pytest.approx(2.0, abs=2e-8)


def test_standard_basis_optimum_is_uniform():
    dim = 4
    vectors = np.eye(dim)[None]
    active = np.ones((1, dim), dtype=bool)
    group = np.zeros(dim, dtype=int)
    uniform = np.full((1, dim), 1 / dim)
    assert certificate(uniform, vectors, active, group) == (pytest.approx(0.0, abs=1e-14), dim)
    result = solve_design_fast(vectors, active, group)
    assert result.iterations == 0
    np.testing.assert_allclose(result.weights, uniform, atol=1e-15)
    assert result.g_value == pytest.approx(dim, rel=1e-14)
    assert result.certificate == pytest.approx(0.0, abs=1e-14)


# ------------------------------------------------------------------------------------------
# Classical Kiefer-Wolfowitz and the equivalence bound
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("span_dim", [4, 2])
def test_kiefer_wolfowitz_single_client(span_dim):
    rng = np.random.default_rng(11 + span_dim)
    dim, num_arms = 4, 12
    basis = np.linalg.qr(rng.standard_normal((dim, span_dim)))[0]
    vectors = (rng.standard_normal((num_arms, span_dim)) @ basis.T)[None]
    active = np.ones((1, num_arms), dtype=bool)
    group = np.zeros(num_arms, dtype=int)
    result = solve_design_fast(vectors, active, group, tol=1e-8)
    assert result.rank_total == span_dim
    assert result.converged
    assert result.g_value == pytest.approx(span_dim, rel=1e-7)
    assert result.g_value >= span_dim * (1 - 1e-12)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**31 - 1),
    num_clients=st.integers(1, 6),
    num_arms=st.integers(1, 5),
    dim=st.integers(1, 4),
    shared=st.booleans(),
)
def test_certificate_nonnegative_and_weighted_identity(seed, num_clients, num_arms, dim, shared):
    rng = np.random.default_rng(seed)
    vectors, active = random_design_problem(
        rng, num_clients, num_arms, dim, rank_deficient_arms=min(1, num_arms), deficient_rank=1
    )
    group = np.zeros(num_arms, dtype=int) if shared else np.arange(num_arms)
    weights = _random_feasible(rng, active)
    var = variances(weights, vectors, active, group)
    cert, rank = certificate(weights, vectors, active, group)
    # sum_{i,a} pi u^T V^+ u = sum_g rank(V_g) = D, and G >= D (max >= weighted mean per client)
    assert np.sum(weights * var) == pytest.approx(rank, rel=1e-9)
    assert cert >= -1e-12
    np.testing.assert_allclose(var, _pinv_variances(weights, vectors, active, group), rtol=1e-7)


def test_certificate_of_fast_solution_within_tolerance():
    rng = np.random.default_rng(3)
    vectors, active = random_design_problem(rng, 40, 8, 4)
    for tol in (1e-2, 1e-4, 1e-7):
        result = solve_design_fast(vectors, active, tol=tol)
        assert result.converged
        assert 0.0 <= result.certificate <= tol
        _assert_feasible(result.weights, active)
        assert certificate(result.weights, vectors, active) == (
            pytest.approx(result.certificate, abs=1e-12),
            result.rank_total,
        )


def test_interior_point_iteration_counts():
    # guards the convergence speed: 3 multiplicative steps + 6 / 16 / 3 interior-point ones
    vectors, active = random_design_problem(np.random.default_rng(0), 100, 30, 5)
    assert solve_design_fast(vectors, active, tol=1e-3).iterations <= 10
    assert solve_design_fast(vectors, active, tol=1e-8).iterations <= 21
    vectors, active = paper_design_problem(np.random.default_rng(0))
    assert solve_design_fast(vectors, active, tol=1e-2).iterations <= 7


# ------------------------------------------------------------------------------------------
# Fast solver vs cvxpy + Clarabel
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seed", "grouping"),
    [(0, "disjoint"), (1, "disjoint"), (2, "shared"), (3, "mixed")],
)
def test_solvers_agree(seed, grouping):
    rng = np.random.default_rng(100 + seed)
    num_clients, num_arms, dim = 25, 6, 4
    vectors, active = random_design_problem(rng, num_clients, num_arms, dim, rank_deficient_arms=2)
    group = {
        "disjoint": np.arange(num_arms),
        "shared": np.zeros(num_arms, dtype=int),
        "mixed": np.array([0, 1, 1, 0, 2, 2]),
    }[grouping]
    fast = solve_design_fast(vectors, active, group, tol=1e-8)
    ref = solve_design_cvxpy(vectors, active, group)
    assert isinstance(ref, DesignResult)
    assert (fast.solver, ref.solver) == ("fast", "cvxpy")
    assert fast.rank_total == ref.rank_total
    assert fast.converged
    assert 0.0 <= ref.certificate <= 1e-3
    _assert_feasible(ref.weights, active)
    f_fast = log_pdet(fast.weights, vectors, active, group)
    f_ref = log_pdet(ref.weights, vectors, active, group)
    # the fast optimum is at least as good and both agree tightly on the concave objective
    assert f_fast >= f_ref - 1e-7
    assert f_fast - f_ref <= 1e-5
    assert fast.g_value == pytest.approx(ref.g_value, rel=1e-3)
    assert fast.g_value == pytest.approx(fast.rank_total, rel=1e-8)


# ------------------------------------------------------------------------------------------
# Rank deficiency, spans, degenerate cases
# ------------------------------------------------------------------------------------------


def test_arm_on_a_line_counts_rank_one():
    rng = np.random.default_rng(5)
    num_clients, num_arms, dim = 10, 3, 3
    vectors = rng.standard_normal((num_clients, num_arms, dim))
    direction = np.array([1.0, 2.0, 2.0]) / 3.0
    vectors[:, 1] = rng.choice([-2.0, 0.5, 1.0], size=(num_clients, 1)) * direction
    active = np.ones((num_clients, num_arms), dtype=bool)
    bases, ranks = span_bases(vectors, active)
    np.testing.assert_array_equal(ranks, [3, 1, 3])
    np.testing.assert_allclose(np.abs(bases[1][:, 0]), np.abs(direction), atol=1e-12)
    assert np.all(bases[1][:, 1:] == 0.0)
    result = solve_design_fast(vectors, active, tol=1e-6)
    assert result.rank_total == 7
    assert np.isfinite(result.g_value) and result.converged
    var = variances(result.weights, vectors, active)
    assert np.all(np.isfinite(var))
    # shared group: the line lies inside the full span, D = 3
    shared = solve_design_fast(vectors, active, np.zeros(num_arms, dtype=int), tol=1e-6)
    assert shared.rank_total == 3 and shared.converged


def test_span_bases_orthonormal_and_spanning():
    rng = np.random.default_rng(8)
    vectors, active = random_design_problem(rng, 30, 5, 5, rank_deficient_arms=3, deficient_rank=2)
    group = np.array([0, 1, 1, 2, 3])
    bases, ranks = span_bases(vectors, active, group)
    assert bases.shape == (4, 5, 5)
    for g, rank in enumerate(ranks):
        q = bases[g][:, :rank]
        np.testing.assert_allclose(q.T @ q, np.eye(rank), atol=1e-12)
        stacked = vectors[:, group == g][active[:, group == g]]
        assert rank == np.linalg.matrix_rank(stacked)
        np.testing.assert_allclose(stacked @ q @ q.T, stacked, atol=1e-10)


def test_group_without_active_arm_and_single_arm_clients():
    rng = np.random.default_rng(9)
    vectors, active = random_design_problem(rng, 12, 4, 3, rank_deficient_arms=0)
    active[:] = True
    active[:, 2] = False  # arm 2 eliminated everywhere: its group has rank 0
    active[:4] = False
    active[:4, 0] = True  # clients 0..3 have a single active arm (weight fixed at 1)
    result = solve_design_fast(vectors, active, tol=1e-7)
    assert result.rank_total == 3 + 0 + 3 + 3
    assert result.converged
    _assert_feasible(result.weights, active)
    np.testing.assert_array_equal(result.weights[:4, 0], 1.0)
    ref = solve_design_cvxpy(vectors, active)
    assert ref.certificate <= 1e-3


def test_uncovered_direction_gives_infinite_g():
    vectors = np.stack([E1, E2])[None].repeat(2, axis=0)
    active = np.ones((2, 2), dtype=bool)
    weights = np.array([[1.0, 0.0], [1.0, 0.0]])  # nobody pulls arm 1
    assert g_value(weights, vectors, active) == math.inf
    assert certificate(weights, vectors, active)[0] == math.inf
    assert log_pdet(weights, vectors, active) == -math.inf
    assert np.all(np.isfinite(variances(weights, vectors, active)))


# ------------------------------------------------------------------------------------------
# Warm start
# ------------------------------------------------------------------------------------------


def test_warm_start_refines_in_fewer_iterations():
    vectors, active = paper_design_problem(np.random.default_rng(21))
    coarse = solve_design_fast(vectors, active, tol=1e-2)
    cold = solve_design_fast(vectors, active, tol=1e-6)
    warm = solve_design_fast(vectors, active, tol=1e-6, initial=coarse.weights)
    assert warm.converged and cold.converged
    assert warm.iterations < cold.iterations
    _assert_feasible(warm.weights, active)


def test_warm_start_after_elimination_is_feasible_and_faster():
    # as between Fed-PE phases: a few (client, arm) pairs are eliminated
    rng = np.random.default_rng(20)
    vectors, active = random_design_problem(rng, 60, 12, 4)
    previous = solve_design_fast(vectors, active, tol=1e-6)
    reduced = active & (rng.random(active.shape) >= 0.01)
    reduced[np.arange(60), np.argmax(active, axis=1)] = True
    assert (active & ~reduced).sum() == 5
    # exact zeros on active arms exercise the floor
    initial = np.where(previous.weights > 1e-3, previous.weights, 0.0)
    assert np.any((initial == 0.0) & reduced)
    cold = solve_design_fast(vectors, reduced, tol=1e-4)
    warm = solve_design_fast(vectors, reduced, tol=1e-4, initial=initial)
    assert warm.converged and warm.certificate <= 1e-4
    assert warm.iterations < cold.iterations
    _assert_feasible(warm.weights, reduced)
    assert np.all(warm.weights[reduced] > 0.0)


def test_warm_start_meets_the_cold_certificate_bound_on_the_benchmark_instance():
    """The benchmark instance (M=100, K=30, d=5) through Fed-PE-like phases: each design is
    warm-started from the previous one, as the Fed-PE server does, and meets the same
    certificate bound G/D - 1 <= 1e-3 as a cold solve of the same active sets."""
    rng = np.random.default_rng(0)
    vectors, active = random_design_problem(rng, 100, 30, 5)
    previous = solve_design_fast(vectors, active, tol=1e-3)
    for _ in range(3):
        reduced = active & (rng.random(active.shape) >= 0.05)
        reduced[np.arange(100), np.argmax(active, axis=1)] = True
        cold = solve_design_fast(vectors, reduced, tol=1e-3)
        warm = solve_design_fast(vectors, reduced, tol=1e-3, initial=previous.weights)
        assert cold.converged and 0.0 <= cold.certificate <= 1e-3
        assert warm.converged and 0.0 <= warm.certificate <= 1e-3
        assert warm.g_value == pytest.approx(cold.g_value, rel=2e-3)
        _assert_feasible(warm.weights, reduced)
        previous, active = warm, reduced


def test_poor_warm_start_is_discarded():
    vectors, active = paper_design_problem(np.random.default_rng(24), 30, 5, 3)
    bad = np.zeros(active.shape)
    bad[:, 0] = 1.0  # floored to 1e-6 elsewhere: far worse than uniform
    cold = solve_design_fast(vectors, active, tol=1e-5)
    warm = solve_design_fast(vectors, active, tol=1e-5, initial=bad)
    assert warm.iterations == cold.iterations
    np.testing.assert_array_equal(warm.weights, cold.weights)


def test_warm_start_ignores_inactive_entries_and_zero_rows():
    vectors, active = paper_design_problem(np.random.default_rng(23), 20, 4, 3)
    initial = np.zeros(active.shape)
    initial[:, 0] = np.nan  # inactive below: must be ignored
    active[:, 0] = False
    result = solve_design_fast(vectors, active, initial=initial, tol=1e-6)
    assert result.converged
    _assert_feasible(result.weights, active)


# ------------------------------------------------------------------------------------------
# Input validation
# ------------------------------------------------------------------------------------------


def _small():
    vectors, active = paper_design_problem(np.random.default_rng(30), 4, 3, 2)
    return vectors, active


def test_client_without_active_arm_is_named():
    vectors, active = _small()
    active[2] = False
    with pytest.raises(ValueError, match="client 2 has no active arm"):
        solve_design_fast(vectors, active)
    with pytest.raises(ValueError, match="client 2"):
        solve_design_cvxpy(vectors, active)


def test_zero_vector_rejected_only_when_active():
    vectors, active = _small()
    vectors[1, 2] = 0.0
    with pytest.raises(ValueError, match="client 1, arm 2 is zero"):
        solve_design_fast(vectors, active)
    active[1, 2] = False
    assert solve_design_fast(vectors, active).converged


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_vector_rejected(bad):
    vectors, active = _small()
    vectors[3, 1, 0] = bad
    with pytest.raises(ValueError, match="non-finite"):
        solve_design_fast(vectors, active)


def test_shape_and_group_errors():
    vectors, active = _small()
    with pytest.raises(ValueError, match="shape"):
        solve_design_fast(vectors[0], active)
    with pytest.raises(ValueError, match="active must have shape"):
        solve_design_fast(vectors, active[:, :2])
    with pytest.raises(ValueError, match="group must have shape"):
        solve_design_fast(vectors, active, np.zeros(2, dtype=int))
    with pytest.raises(ValueError, match=">= 0"):
        solve_design_fast(vectors, active, np.array([0, -1, 0]))
    with pytest.raises(ValueError, match="integers"):
        solve_design_fast(vectors, active, np.zeros(3))
    with pytest.raises(ValueError, match="boolean"):
        solve_design_fast(vectors, np.full(active.shape, 0.5))
    with pytest.raises(ValueError, match="initial must have shape"):
        solve_design_fast(vectors, active, initial=np.ones((2, 2)))


def test_weight_errors():
    vectors, active = _small()
    with pytest.raises(ValueError, match="sum to"):
        certificate(np.full(active.shape, 0.5), vectors, active)
    with pytest.raises(ValueError, match="non-negative"):
        g_value(np.full(active.shape, -1.0), vectors, active)
    with pytest.raises(ValueError, match="weights must have shape"):
        variances(np.ones((1, 1)), vectors, active)


# ------------------------------------------------------------------------------------------
# Benchmark helpers
# ------------------------------------------------------------------------------------------


def test_random_design_problem_properties():
    rng = np.random.default_rng(40)
    vectors, active = random_design_problem(rng, 50, 10, 5, rank_deficient_arms=3)
    assert vectors.shape == (50, 10, 5) and active.shape == (50, 10)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=2), 1.0)
    assert active.any(axis=1).all()
    assert len(set(active.sum(axis=1))) > 3  # differing active-set sizes
    _, ranks = span_bases(vectors, np.ones_like(active))
    assert sorted(ranks) == [2, 2, 2] + [5] * 7


def test_bench_design_keys_and_targets():
    out = bench_design(seed=0, repeats=1)
    assert set(out) == {
        "fast_seconds",
        "cvxpy_seconds",
        "fast_certificate",
        "cvxpy_certificate",
        "speedup",
        "fast_seconds_median",
        "cvxpy_seconds_median",
        "speedup_median",
        "M",
        "K",
        "d",
        "fast_iterations",
        "next_phase_cold_seconds",
        "next_phase_cold_iterations",
        "next_phase_cold_certificate",
        "next_phase_warm_seconds",
        "next_phase_warm_iterations",
        "next_phase_warm_certificate",
        "next_phase_warm_speedup_vs_cvxpy",
    }
    assert (out["M"], out["K"], out["d"]) == (100, 30, 5)
    assert 0.0 <= out["fast_certificate"] <= 1e-3
    assert 0.0 <= out["cvxpy_certificate"] <= 1e-3
    assert out["fast_iterations"] <= 15
    assert out["speedup"] == pytest.approx(out["cvxpy_seconds"] / out["fast_seconds"])
    assert 0.0 <= out["next_phase_warm_certificate"] <= 1e-3
    assert 0.0 <= out["next_phase_cold_certificate"] <= 1e-3


def test_log_pdet_is_the_objective_of_the_vectors_as_given():
    """f(pi) = sum_g log pdet V_g(pi) with V built from the given vectors: scaling every u by c
    adds 2 D log c (D = sum_g dim S_g), and it matches a direct eigenvalue computation."""
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((3, 4, 3)) * 5.0
    active = np.ones((3, 4), dtype=bool)
    weights = np.full((3, 4), 0.25)
    direct = sum(
        weights[i, a] * np.outer(vectors[i, a], vectors[i, a]) for i in range(3) for a in range(4)
    )
    expected = float(np.linalg.slogdet(direct)[1])
    group = np.zeros(4, dtype=int)
    assert log_pdet(weights, vectors, active, group) == pytest.approx(expected, rel=1e-12)
    scaled = log_pdet(weights, 0.1 * vectors, active, group)
    assert scaled == pytest.approx(expected + 2 * 3 * math.log(0.1), rel=1e-12)


@pytest.mark.parametrize("shared", [False, True])
def test_pooling_single_arm_clients_keeps_the_design(shared):
    # 300 clients, most with one active arm: the pooled problem (stand-ins for the fixed clients)
    # has the same V, G and D, hence the same optimum, as the full one.
    rng = np.random.default_rng(5)
    vectors, active = random_design_problem(rng, 300, 6, 4)
    single = rng.random(300) < 0.8
    first = np.argmax(active, axis=1)
    active[single] = False
    active[single, first[single]] = True
    group = np.zeros(6, dtype=int) if shared else None
    full = solve_design_fast(vectors, active, group, tol=1e-8, pool_fixed=False)
    pooled = solve_design_fast(vectors, active, group, tol=1e-8)
    assert pooled.rank_total == full.rank_total
    assert pooled.g_value == pytest.approx(full.g_value, rel=1e-7)
    assert pooled.certificate <= 1e-8
    exact = g_value(pooled.weights, vectors, active, group)
    assert pooled.g_value == pytest.approx(exact, rel=1e-9)
    np.testing.assert_array_equal(pooled.weights[single], active[single])
    np.testing.assert_allclose(pooled.weights, full.weights, atol=1e-4)
