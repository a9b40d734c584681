"""Fed-PE math against hand-computed values."""

import math

import numpy as np
import pytest

from fedbandit.estimators import (
    aggregate_direction_sums,
    aggregate_directions,
    aggregate_least_squares,
    direction_estimates,
    eliminate_cumulative,
    eliminate_phase,
    enhanced_alpha,
    executed_counts,
    fedpe_alpha,
    last_phase,
    phase_length,
    pull_counts,
    scores_and_widths,
    unit_directions,
    weighted_direction_sums,
)


def test_alpha_matches_hand_computation():
    # M=100, K=10, P=17, d=3: base = 2 log(1700) = 14.878; k0 is the first grid point with
    # 3 k0 >= 14.877 + 3 log k0 + 3, i.e. k0 - log k0 >= 5.959 -> k0 = 8.1 (8.0 gives 5.921).
    base = 2 * math.log(10 * 10 * 17)
    for k0, ok in ((8.0, False), (8.1, True)):
        assert (k0 * 3 >= base + 3 * math.log(k0) + 3) is ok
    expected = min(2 * math.log(20 * 100 * 10 * 17), base + 3 * math.log(8.1) + 3)
    assert fedpe_alpha(100, 10, 17, 3) == pytest.approx(expected, rel=1e-6)
    assert expected == pytest.approx(24.152, abs=1e-3)


def test_alpha_takes_the_first_term_when_smaller():
    # d large: the second term grows with d, so 2 log(20 M K P) wins.
    assert fedpe_alpha(1, 2, 1, 50) == pytest.approx(2 * math.log(40))


def test_enhanced_alpha():
    assert enhanced_alpha(100, 10, 3) == pytest.approx(100 * (10 * 100 * 10) ** 2 / 30)


def test_phase_schedule():
    assert [phase_length(p) for p in range(5)] == [1, 2, 4, 8, 16]
    # K=10, T=2^17: 10 + 2 + 4 + ... + 2^P >= 131072 first at P = 16.
    assert last_phase(2**17, 10) == 16
    assert last_phase(10, 10) == 0
    assert last_phase(11, 10) == 1
    with pytest.raises(ValueError):
        phase_length(-1)


def test_pull_counts_ceil_and_floor():
    weights = np.array([[0.5, 0.25, 0.25, 0.0], [1e-12, 0.3, 0.7 - 1e-12, 0.0]])
    np.testing.assert_array_equal(pull_counts(weights, 8), [[4, 2, 2, 0], [0, 3, 6, 0]])


def test_direction_estimate_by_hand():
    features = np.array([[[3.0, 4.0], [1.0, 0.0]]])  # ||x||^2 = 25 and 1
    sums = np.array([[10.0, 6.0]])
    counts = np.array([[2, 0]])
    est = direction_estimates(sums, counts, features)
    np.testing.assert_allclose(est, [[[5 * 3 / 25, 5 * 4 / 25], [0.0, 0.0]]])


def test_aggregate_directions_recovers_theta_by_hand():
    # Two clients see arm 0 along e1 and e2 with means 2 and 3: theta = (2, 3).
    features = np.array([[[2.0, 0.0]], [[0.0, 1.0]]])
    counts = np.array([[4], [1]])
    sums = np.array([[4 * 2 * 2.0], [3.0]])  # x^T theta = 4 and 3
    est = direction_estimates(sums, counts, features)
    theta, cov, gram = aggregate_directions(est, counts, unit_directions(est), np.array([0]), 1)
    np.testing.assert_allclose(gram[0], np.diag([4.0, 1.0]))
    np.testing.assert_allclose(cov[0], np.diag([0.25, 1.0]))
    np.testing.assert_allclose(theta[0], [2.0, 3.0])


def test_aggregate_least_squares_by_hand():
    features = np.array([[[1.0, 0.0]], [[1.0, 1.0]]])
    counts = np.array([[2], [1]])
    sums = np.array([[2.0], [5.0]])  # mean 1 along e1, mean 5 along (1, 1)
    theta, _, gram = aggregate_least_squares(sums, counts, features, np.array([0]), 1)
    np.testing.assert_allclose(gram[0], [[3.0, 1.0], [1.0, 1.0]])
    np.testing.assert_allclose(theta[0], np.linalg.solve([[3, 1], [1, 1]], [7.0, 5.0]))
    np.testing.assert_allclose(theta[0], [1.0, 4.0])


def test_shared_group_pools_all_arms():
    features = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    counts = np.array([[1, 1]])
    sums = np.array([[0.5, -1.0]])
    theta, _, _ = aggregate_least_squares(sums, counts, features, np.array([0, 0]), 1)
    np.testing.assert_allclose(theta[0], [0.5, -1.0])


def test_rank_deficient_aggregation_uses_the_span():
    features = np.array([[[1.0, 1.0]], [[2.0, 2.0]]])  # one line
    counts = np.array([[1], [1]])
    sums = np.array([[2.0], [4.0]])
    theta, cov, _ = aggregate_least_squares(sums, counts, features, np.array([0]), 1)
    assert np.all(np.isfinite(theta)) and np.all(np.isfinite(cov))
    np.testing.assert_allclose(theta[0], [1.0, 1.0])  # minimum-norm solution on the line


def test_scores_and_widths_by_hand():
    features = np.array([[[1.0, 2.0]]])
    theta = np.array([[[3.0, -1.0]]])
    cov = np.array([[[[2.0, 0.5], [0.5, 1.0]]]])
    scores, widths = scores_and_widths(features, theta, cov)
    assert scores[0, 0] == pytest.approx(1.0)
    assert widths[0, 0] == pytest.approx(2 + 2 * 0.5 * 2 + 4)


def test_eliminate_phase_by_hand():
    scores = np.array([[1.0, 0.5, 0.9, 0.0]])
    widths = np.array([[0.01, 0.01, 0.01, 0.01]])
    active = np.array([[True, True, True, False]])
    # radius = sqrt(4 * 0.01 / 1) = 0.2; best 1.0: drop a if 1.0 - r_a > 0.4.
    keep = eliminate_phase(scores, widths, active, alpha=4.0, min_sq_norm=1.0)
    np.testing.assert_array_equal(keep, [[True, False, True, False]])
    # sigma = 3 widens the radius to 0.6: nothing with gap <= 1.2 is dropped.
    keep = eliminate_phase(scores, widths, active, alpha=4.0, min_sq_norm=1.0, noise_sigma=3.0)
    np.testing.assert_array_equal(keep, [[True, True, True, False]])


def test_eliminate_phase_never_drops_the_leader_and_ignores_inactive_leaders():
    scores = np.array([[5.0, 1.0, 0.0]])
    active = np.array([[False, True, True]])  # arm 0 is inactive despite the top score
    keep = eliminate_phase(scores, np.zeros((1, 3)), active, alpha=1.0, min_sq_norm=1.0)
    np.testing.assert_array_equal(keep, [[False, True, False]])


def test_eliminate_cumulative_by_hand():
    sums = np.array([[10.0, 4.0]])
    widths = np.array([[1.0, 1.0]])
    # N = 2: means 5 and 2, radius sqrt(1 * log(e^4)) / 2 = 1 each; 3 > 2 -> drop arm 1.
    keep = eliminate_cumulative(sums, widths, 2.0, np.ones((1, 2), bool), alpha=math.exp(4))
    np.testing.assert_array_equal(keep, [[True, False]])
    keep = eliminate_cumulative(sums, widths, 2.0, np.ones((1, 2), bool), alpha=math.exp(9))
    np.testing.assert_array_equal(keep, [[True, True]])  # radius 1.5 each: 3 <= 3 keeps it


def test_t_quantile_matches_scipy():
    from scipy import stats

    from fedbandit.analysis import t_quantile_975

    for nu in [*range(1, 60), 100, 1000, 10**6]:
        assert t_quantile_975(nu) == pytest.approx(float(stats.t.ppf(0.975, nu)), abs=2e-6)


def test_pooled_sums_equal_numpy_einsum_bit_for_bit():
    # the compiled sums replace einsum("mk,mkd,mke->mkde").sum(axis=0): same products, same order
    from fedbandit.estimators import _arm_sums

    rng = np.random.default_rng(3)
    counts = rng.integers(0, 1000, (5000, 4))
    vectors, targets = rng.standard_normal((5000, 4, 3)), rng.standard_normal((5000, 4, 3))
    gram, total = _arm_sums(counts, vectors, targets, False)
    np.testing.assert_array_equal(
        gram, np.einsum("mk,mkd,mke->mkde", counts, vectors, vectors).sum(axis=0)
    )
    np.testing.assert_array_equal(total, targets.sum(axis=0))
    _, weighted = _arm_sums(counts, vectors, targets, True)
    np.testing.assert_array_equal(weighted, (counts[..., None] * targets).sum(axis=0))


def test_direction_estimates_equal_the_numpy_expression():
    rng = np.random.default_rng(4)
    counts = rng.integers(0, 3, (400, 5))
    sums, features = rng.standard_normal((400, 5)), rng.standard_normal((400, 5, 3))
    mean = np.where(counts > 0, sums / np.maximum(counts, 1), 0.0)
    want = (mean / np.einsum("mkd,mkd->mk", features, features))[..., None] * features
    got = direction_estimates(sums, counts, features)
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))  # zeros keep NumPy's signs


def test_pull_counts_mask_inactive_arms_and_tiny_weights():
    weights = np.array([[0.5, 0.25, 0.25, 1e-11], [0.3, 0.7, 0.0, 0.2]])
    active = np.array([[True, True, False, True], [True, True, True, False]])
    # ceil(8 pi) on active arms with pi > 1e-10, else 0
    np.testing.assert_array_equal(pull_counts(weights, 8, active), [[4, 2, 0, 0], [3, 6, 0, 0]])


def test_fedpe_aggregate_from_summed_shares_by_hand():
    # Client 0: arm 0 pulled twice, estimate (1, 0); arm 1 once, (0, 2). Client 1: arm 0 once,
    # (3, 0); arm 1 not pulled. Directions: arm 0 along e1, arm 1 along e2.
    counts = np.array([[2, 1], [1, 0]])
    estimates = np.array([[[1.0, 0.0], [0.0, 2.0]], [[3.0, 0.0], [0.0, 0.0]]])
    directions = np.array([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]]])
    # Disjoint (one group per arm): s_0 = [(2, 0), (0, 2)], s_1 = [(3, 0), (0, 0)].
    shares = weighted_direction_sums(estimates, counts, np.array([0, 1]), 2)
    np.testing.assert_array_equal(shares, [[[2, 0], [0, 2]], [[3, 0], [0, 0]]])
    theta, cov, gram = aggregate_direction_sums(
        shares.sum(axis=0), counts, directions, np.array([0, 1]), 2
    )
    # V_0 = diag(3, 0), V_1 = diag(0, 1): theta_0 = (5/3, 0), theta_1 = (0, 2)
    np.testing.assert_allclose(gram, [np.diag([3.0, 0.0]), np.diag([0.0, 1.0])])
    np.testing.assert_allclose(theta, [[5 / 3, 0.0], [0.0, 2.0]])
    plain = aggregate_directions(estimates, counts, directions, np.array([0, 1]), 2)
    np.testing.assert_allclose(theta, plain[0])
    np.testing.assert_allclose(cov, plain[1])
    # Shared (one group): s_0 = (2, 2), s_1 = (3, 0); V = diag(3, 1): theta = (5/3, 2)
    shares = weighted_direction_sums(estimates, counts, np.array([0, 0]), 1)
    np.testing.assert_array_equal(shares, [[[2, 2]], [[3, 0]]])
    theta, _, _ = aggregate_direction_sums(
        shares.sum(axis=0), counts, directions, np.array([0, 0]), 1
    )
    np.testing.assert_allclose(theta, [[5 / 3, 2.0]])


def test_executed_counts_stop_at_each_clients_budget_in_arm_order():
    requested = np.array([[4, 2, 3], [1, 0, 5], [2, 2, 2]])
    remaining = np.array([5, 10, 0])
    # client 0: 4 of arm 0, then 1 of arm 1's 2, none of arm 2; client 1: everything (6 <= 10);
    # client 2: no budget left
    np.testing.assert_array_equal(
        executed_counts(requested, remaining), [[4, 1, 0], [1, 0, 5], [0, 0, 0]]
    )


def test_executed_counts_equal_the_environments_pulls():
    from fedbandit.environment import BanditEnvironment
    from fedbandit.instances import LinearBanditInstance

    rng = np.random.default_rng(3)
    features = rng.normal(size=(6, 5, 2))
    instance = LinearBanditInstance(features, rng.normal(size=(5, 2)), 1.0, shared_parameter=False)
    env = BanditEnvironment(instance, np.arange(6), horizon=40, entropy=[0, 0])
    for _ in range(4):
        requested = rng.integers(0, 6, size=(6, 5))
        expected = executed_counts(requested, env.remaining())
        executed, _ = env.pull_counts(requested)
        np.testing.assert_array_equal(executed, expected)
    assert (env.remaining() == 0).any()  # some budget ran out on the way
