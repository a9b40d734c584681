"""Generalised linear contextual instances (``glm_contextual``): the link's means by hand,
Bernoulli rewards drawn from the normal noise stream with exactly the mean's chance, the regret
on the true link, and the same draws as the linear instance of the same seed."""

import numpy as np
import pytest
from scipy.special import expit, ndtr

from fedbandit.config import validate_experiment
from fedbandit.contextual.instances import (
    ContextualParams,
    GLMContextualParams,
    contextual_instance,
    glm_contextual_instance,
    link_function,
)
from fedbandit.errors import ConfigError
from fedbandit.simulation import simulate


def test_links_by_hand():
    z = np.array([-2.0, 0.0, 1.0])
    np.testing.assert_allclose(
        link_function("logistic", z), [1 / (1 + np.e**2), 0.5, 1 / (1 + np.e**-1)]
    )
    np.testing.assert_allclose(link_function("probit", z), [0.0227501319, 0.5, 0.8413447461])
    with pytest.raises(ValueError, match="unknown link"):
        link_function("cloglog", z)


def test_means_are_the_link_of_the_scaled_linear_score():
    params = dict(setting="shared", num_clients=3, num_arms=4, dim=3, seed=7)
    linear = contextual_instance(ContextualParams(**params))
    for link, mu in (("logistic", expit), ("probit", ndtr)):
        glm = glm_contextual_instance(GLMContextualParams(**params, link=link, theta_norm=2.0))
        np.testing.assert_allclose(glm.thetas, 2.0 * linear.thetas)
        assert np.allclose(np.linalg.norm(glm.thetas, axis=1), 2.0)
        x = linear.expand(linear.sample_contexts(np.random.default_rng(0), 5))
        np.testing.assert_allclose(glm.means(x), mu(2.0 * linear.means(x)), rtol=1e-12)
        assert glm.name == f"glm_{link}_gaussian"


def test_rewards_are_bernoulli_with_the_means_chance():
    glm = glm_contextual_instance(GLMContextualParams(num_clients=2))
    # 1{z < Phi^-1(mu)}: mu = 0.5 -> threshold 0; mu = 0.8413 -> threshold 1
    means = np.array([0.5, 0.5, ndtr(1.0), ndtr(1.0)])
    noise = np.array([-0.1, 0.1, 0.99, 1.01])
    np.testing.assert_array_equal(glm.rewards(means, noise), [1.0, 0.0, 1.0, 0.0])
    rng = np.random.default_rng(3)
    for mu in (0.05, 0.3, 0.5, 0.9):
        draws = glm.rewards(np.full(200_000, mu), rng.standard_normal(200_000))
        assert set(np.unique(draws)) <= {0.0, 1.0}
        # five standard errors: fails if the chance were not mu
        assert abs(draws.mean() - mu) < 5 * np.sqrt(mu * (1 - mu) / 200_000)


@pytest.mark.parametrize("arrival", ["synchronous", "sequential"])
def test_regret_is_measured_on_the_true_link(arrival):
    """A greedy-by-truth run has zero regret; a run always pulling arm 0 has, per step, the
    link's best mean minus arm 0's (from the same contexts the environment drew)."""
    params = GLMContextualParams(
        setting="shared", num_clients=3, num_arms=3, dim=2, arrival=arrival, seed=4
    )
    instance = glm_contextual_instance(params)
    env = instance.make_environment(np.arange(3), 40, [1, 2])
    expected = 0.0
    while env.round < 40:
        contexts, active = env.observe()
        means = instance.means(np.array(contexts))
        expected += float(((means.max(axis=1) - means[:, 0]) * active).sum())
        rewards = env.pull(np.zeros(3, dtype=np.int64))
        assert set(np.unique(rewards)) <= {0.0, 1.0}
    assert env.record().client_regret.sum() == pytest.approx(expected, abs=1e-6)


def test_a_config_names_the_kind_and_a_wrong_link_is_one_clear_error():
    base = {
        "name": "glm",
        "horizon": 50,
        "seeds": 1,
        "algorithms": ["oful"],
        "instance": {"kind": "glm_contextual", "setting": "shared", "link": "probit"},
    }
    config = validate_experiment(base)
    assert isinstance(config.instance, GLMContextualParams)
    with pytest.raises(ConfigError, match="link"):
        validate_experiment({**base, "instance": {**base["instance"], "link": "cloglog"}})


def test_a_linear_learner_runs_on_a_logistic_instance():
    instance = glm_contextual_instance(
        GLMContextualParams(setting="shared", num_clients=4, num_arms=5, dim=3, seed=2)
    )
    oful = simulate(instance, "oful", 400, [0, 0])
    regret = oful.regret.client_regret.sum()
    assert 0 < regret < 400 * 4  # a Bernoulli mean gap is at most 1 per client-step


def test_the_authors_arm_pool_by_hand():
    """bias_coordinate and basis_points: the pool of ``RunSyntheticDataset.py`` (the first d
    arms eye(d) with its last column set to 1, the others a unit vector in d - 1 coordinates and
    a constant 1); the parameter is the plain instance's."""
    base = dict(setting="shared", contexts="points", num_points=40, num_arms=5, dim=4, seed=3)
    plain = glm_contextual_instance(GLMContextualParams(**base))
    pool = glm_contextual_instance(
        GLMContextualParams(**base, bias_coordinate=True, basis_points=True)
    )
    expected_basis = np.array([[1, 0, 0, 1], [0, 1, 0, 1], [0, 0, 1, 1], [0, 0, 0, 1.0]])
    np.testing.assert_array_equal(pool.points[:4], expected_basis)
    rest = pool.points[4:]
    np.testing.assert_array_equal(rest[:, 3], 1.0)
    np.testing.assert_allclose(np.linalg.norm(rest, axis=1), np.sqrt(2), rtol=1e-12)
    free = plain.points[4:, :3]  # the plain pool's first d - 1 coordinates, renormalised
    np.testing.assert_allclose(rest[:, :3], free / np.linalg.norm(free, axis=1, keepdims=True))
    np.testing.assert_array_equal(pool.thetas, plain.thetas)
    assert pool.name == "glm_logistic_points_bias"
    bias_only = glm_contextual_instance(GLMContextualParams(**base, bias_coordinate=True))
    np.testing.assert_array_equal(bias_only.points[4:], rest)
    np.testing.assert_allclose(np.linalg.norm(bias_only.points, axis=1), np.sqrt(2))
    # contexts are drawn from the pool, the bias coordinate always 1
    x = pool.expand(pool.sample_contexts(np.random.default_rng(0), 50))
    np.testing.assert_array_equal(x[..., 3], 1.0)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"bias_coordinate": True, "contexts": "sphere"}, "bias_coordinate"),
        ({"basis_points": True, "contexts": "gaussian"}, "basis_points"),
        ({"basis_points": True, "contexts": "points", "num_points": 3, "dim": 5}, "num_points"),
        ({"bias_coordinate": True, "contexts": "points", "dim": 1}, "dim"),
    ],
)
def test_the_arm_pool_options_need_a_points_pool(extra, match):
    base = {"name": "glm", "horizon": 10, "seeds": 1, "algorithms": ["fedglb_ucb"]}
    instance = {"kind": "glm_contextual", "setting": "shared", **extra}
    with pytest.raises(ConfigError, match=match):
        validate_experiment({**base, "instance": instance})
