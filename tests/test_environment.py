"""The environment: exact regret, the horizon, and block sampling with the right distribution."""

import numpy as np
import pytest
from scipy import stats

from fedbandit.environment import BanditEnvironment, RegretRecord
from fedbandit.instances import LinearBanditInstance


def two_arm_instance(sigma: float = 1.0) -> LinearBanditInstance:
    # Client 0: means (1.0, 0.5); client 1: means (0.2, 0.8). theta = e1 for both arms.
    features = np.array([[[1.0, 0.0], [0.5, 0.3]], [[0.2, 0.1], [0.8, 0.0]]])
    thetas = np.array([[1.0, 0.0], [1.0, 0.0]])
    return LinearBanditInstance(features, thetas, sigma, shared_parameter=True)


def test_regret_is_exact_at_every_step_in_blocks():
    env = BanditEnvironment(two_arm_instance(), [0, 1], horizon=6, entropy=[0, 0])
    env.pull_counts(np.array([[1, 2], [3, 0]]))  # client 0: 0 then 0.5, 0.5; client 1: 0.6 x3
    env.pull_counts(np.array([[0, 1], [1, 1]]))  # client 0: 0.5; client 1: 0.6 then 0
    record = env.record()
    per_step = np.cumsum(record.increment_diff)[:-1] / record.scale
    np.testing.assert_allclose(per_step, [0.6, 1.1, 1.1, 0.5 + 0.6, 0.0, 0.0])
    np.testing.assert_allclose(
        record.mean_cumulative_regret(), np.cumsum([0.6, 1.1, 1.1, 1.1, 0.0, 0.0]) / 2
    )
    np.testing.assert_allclose(record.client_regret, [1.5, 2.4])
    np.testing.assert_array_equal(record.client_pulls, [4, 5])


def test_horizon_truncates_in_arm_order():
    env = BanditEnvironment(two_arm_instance(), [0, 1], horizon=4, entropy=[0, 0])
    executed, _ = env.pull_counts(np.array([[3, 3], [0, 9]]))
    np.testing.assert_array_equal(executed, [[3, 1], [0, 4]])
    executed, sums = env.pull_counts(np.array([[1, 1], [1, 1]]))
    np.testing.assert_array_equal(executed, 0)
    np.testing.assert_array_equal(sums, 0)
    np.testing.assert_array_equal(env.pulls, [4, 4])


def test_noiseless_sums_are_exact():
    env = BanditEnvironment(two_arm_instance(sigma=0.0), [0, 1], horizon=100, entropy=[0, 0])
    _, sums = env.pull_counts(np.array([[3, 2], [1, 4]]))
    np.testing.assert_allclose(sums, [[3.0, 1.0], [0.2, 3.2]])


@pytest.mark.parametrize("pulls", [1, 7, 50])
def test_block_sums_have_the_distribution_of_pull_by_pull_sums(pulls):
    """Sampling the sum of n rewards directly must match summing n single pulls."""
    reps = 3000  # 3000 identical clients, each with its own stream
    base = two_arm_instance(sigma=1.5)
    instance = LinearBanditInstance(
        np.repeat(base.features[:1], reps, axis=0), base.thetas, 1.5, shared_parameter=True
    )
    block = BanditEnvironment(instance, np.arange(reps), horizon=pulls, entropy=[1, 0])
    _, sums = block.pull_counts(np.tile([[pulls, 0]], (reps, 1)))
    single = BanditEnvironment(instance, np.arange(reps), horizon=pulls, entropy=[2, 0])
    total = np.zeros(reps)
    for _ in range(pulls):
        total += single.pull_arms(np.zeros(reps, dtype=int))
    # Both estimate the mean 1.0 with variance 1.5^2 / n; a KS test compares the laws.
    assert stats.ks_2samp(sums[:, 0] / pulls, total / pulls).pvalue > 1e-3
    assert np.var(sums[:, 0] / pulls) == pytest.approx(1.5**2 / pulls, rel=0.1)
    np.testing.assert_allclose(block.record().client_regret, single.record().client_regret)


def test_wrong_variance_would_be_caught():
    """The KS check above has power: a block sum with variance n^2 sigma^2 is rejected."""
    rng = np.random.default_rng(0)
    right = 1.0 + rng.standard_normal(3000) * 1.5 / np.sqrt(7)
    wrong = 1.0 + rng.standard_normal(3000) * 1.5
    assert stats.ks_2samp(right, wrong).pvalue < 1e-6


def test_streams_do_not_depend_on_grouping():
    instance = two_arm_instance()
    counts = np.array([[2, 3], [4, 1]])
    together = BanditEnvironment(instance, [0, 1], horizon=50, entropy=[3, 1])
    alone = [BanditEnvironment(instance, [i], horizon=50, entropy=[3, 1]) for i in (0, 1)]
    for _ in range(3):
        _, joint = together.pull_counts(counts)
        split = np.concatenate([env.pull_counts(counts[[i]])[1] for i, env in enumerate(alone)])
        np.testing.assert_array_equal(joint, split)
    merged = RegretRecord.merge([env.record() for env in alone])
    np.testing.assert_allclose(merged.increment_diff, together.record().increment_diff)


def test_step_pulls_do_not_depend_on_grouping():
    instance = two_arm_instance()
    together = BanditEnvironment(instance, [0, 1], horizon=5000, entropy=[3, 2])
    alone = [BanditEnvironment(instance, [i], horizon=5000, entropy=[3, 2]) for i in (0, 1)]
    for step in range(5000):  # crosses a noise-chunk boundary
        arms = np.array([step % 2, (step // 3) % 2])
        joint = together.pull_arms(arms)
        split = [env.pull_arms(arms[[i]])[0] for i, env in enumerate(alone)]
        np.testing.assert_array_equal(joint, split)


def test_invalid_input():
    instance = two_arm_instance()
    with pytest.raises(ValueError, match="client ids"):
        BanditEnvironment(instance, [0, 5], horizon=3, entropy=[0, 0])
    env = BanditEnvironment(instance, [0, 1], horizon=3, entropy=[0, 0])
    with pytest.raises(ValueError, match="shape"):
        env.pull_counts(np.ones((1, 2), dtype=int))
    with pytest.raises(ValueError, match="non-negative"):
        env.pull_counts(-np.ones((2, 2), dtype=int))
    with pytest.raises(ValueError, match="nonzero"):
        LinearBanditInstance(np.zeros((1, 2, 2)), np.ones((2, 2)), 1.0, False)
