"""Exact, hand-computed values of fed_ucb's index and aggregation math (free functions)."""

import math

import numpy as np
import pytest
from fedbandit_example_plugin.algorithm import (
    count_index,
    exploration_radius,
    phase_length,
    pool,
    ridge_estimate,
    ridge_index,
    ridge_mean_width,
    row_dot,
    select_arms,
)


def test_phase_lengths_double_and_stop_at_the_horizon():
    assert [phase_length(p, 1, 2**p - 1, 4096) for p in range(13)] == [2**p for p in range(12)] + [
        1
    ]
    assert phase_length(2, 3, 9, 20) == 11  # 3 * 2^2 = 12 steps, only 11 left
    assert phase_length(5, 1, 4096, 4096) == 0


def test_exploration_radius():
    # alpha sigma sqrt(2 log(2 + n)): n = 0 -> sqrt(2 log 2); n = e^2 - 2 -> 1 * sqrt(2 * 2) = 2
    got = exploration_radius(2.0, 0.5, np.array([0.0, math.e**2 - 2]))
    np.testing.assert_allclose(got, [math.sqrt(2 * math.log(2)), 2.0], rtol=1e-15)


def test_count_index():
    counts = np.array([[2, 0, 1, 4], [1, 1, 1, 1]])
    sums = np.array([[1.0, 0.0, 3.0, -2.0], [0.0, 1.0, 2.0, 3.0]])
    got = count_index(counts, sums, np.array([1.0, 0.0]))
    expected = [[0.5 + 1 / math.sqrt(2), math.inf, 3.0 + 1.0, -0.5 + 0.5], [0.0, 1.0, 2.0, 3.0]]
    np.testing.assert_array_equal(got, expected)


def test_ridge_estimate_diagonal():
    inverse, theta = ridge_estimate(np.diag([1.0, 3.0]), np.array([2.0, 8.0]), ridge=1.0)
    np.testing.assert_array_equal(inverse, np.diag([0.5, 0.25]))
    np.testing.assert_array_equal(theta, [1.0, 2.0])


def test_ridge_estimate_and_index_by_hand():
    # V = I + [[1, 1], [1, 1]] = [[2, 1], [1, 2]], V^-1 = [[2, -1], [-1, 2]] / 3,
    # theta = V^-1 (3, 0) = (2, -1); x = (1, 1): x^T theta = 1, x^T V^-1 x = 2/3.
    gram = np.ones((2, 2))
    inverse, theta = ridge_estimate(gram, np.array([3.0, 0.0]), ridge=1.0)
    np.testing.assert_allclose(inverse, np.array([[2.0, -1.0], [-1.0, 2.0]]) / 3, rtol=1e-15)
    np.testing.assert_allclose(theta, [2.0, -1.0], rtol=1e-15)
    x = np.array([1.0, 1.0])
    mean, width = ridge_mean_width(x, inverse, theta)
    assert mean == pytest.approx(1.0, rel=1e-15)
    assert width == pytest.approx(math.sqrt(2 / 3), rel=1e-15)
    assert ridge_index(x, inverse, theta, 3.0) == pytest.approx(1 + math.sqrt(6), rel=1e-15)


def test_ridge_estimate_is_per_arm_over_stacks():
    grams = np.stack([np.diag([1.0, 3.0]), np.ones((2, 2))])
    xys = np.array([[2.0, 8.0], [3.0, 0.0]])
    _, theta = ridge_estimate(grams, xys, ridge=1.0)
    np.testing.assert_allclose(theta, [[1.0, 2.0], [2.0, -1.0]], rtol=1e-15)


def test_row_dot_adds_in_index_order():
    a = np.array([[1.0, 2.0, 3.0], [1e16, 1.0, -1e16]])
    b = np.ones((2, 3))
    # (1e16 + 1) - 1e16 = 0 in float64 when added left to right
    np.testing.assert_array_equal(row_dot(a, b), [6.0, 0.0])


def test_select_arms_breaks_ties_in_each_clients_cyclic_order():
    index = np.array(
        [[1.0, 5.0, 5.0, 0.0], [1.0, 5.0, 5.0, 0.0], [7.0, 7.0, 7.0, 7.0], [np.inf] * 4]
    )
    # client 0: order 0,1,2,3 -> arm 1; client 2: order 2,3,0,1 -> arm 2;
    # client 5: 5 mod 4 = 1, order 1,2,3,0 -> arm 1; client 7: order 3,0,1,2 -> arm 3
    np.testing.assert_array_equal(select_arms(index, np.array([0, 2, 5, 7])), [1, 2, 1, 3])


def test_pool_adds_every_upload_to_the_total():
    total = np.array([1, 2])
    uploads = np.array([[1, 0], [2, 3], [0, 1]])
    np.testing.assert_array_equal(pool(total, uploads), [4, 6])
    grams = np.arange(8.0).reshape(2, 2, 2)
    np.testing.assert_array_equal(pool(np.eye(2), grams), [[5.0, 6.0], [8.0, 11.0]])
