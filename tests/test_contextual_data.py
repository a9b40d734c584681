"""Classification data as a contextual bandit: Dirichlet and k-means partitions, sampling from a
client's own partition, one-hot means and mistake-counting regret, grouping invariance, errors,
and the experiments that use the kind."""

import json

import numpy as np
import pytest
from pydantic import ValidationError

from fedbandit.config import available_experiments, load_experiment
from fedbandit.contextual.environment import CHUNK, ContextualEnvironment
from fedbandit.datasets import ClassificationContextualParams, DatasetError
from fedbandit.datasets.contextual import contextual_from_data, dirichlet_partition
from fedbandit.datasets.tables import bundled_dataset
from fedbandit.errors import DataError
from fedbandit.registry import build_instance
from fedbandit.rng import REWARD_DOMAIN, client_generators
from fedbandit.runner import run_experiment
from fedbandit.simulation import simulate


def make(dataset="wine", **changes):
    """Built directly (not through the per-process memo), so every call partitions afresh."""
    params = ClassificationContextualParams(dataset=dataset, **changes)
    return contextual_from_data(bundled_dataset(dataset), params, f"contextual_{dataset}")


WINE = make(num_clients=6, concentration=0.5, seed=3)


# ------------------------------------------------------------------------------ partitions
def split_deviation(alpha, seeds=20, clients=10, classes=10, per_class=2000):
    """Mean over seeds and classes of sum_i (share of class k at client i - 1/M)^2, divided by
    its Dirichlet(alpha 1_M) expectation (1 - 1/M) / (M alpha + 1)."""
    y = np.repeat(np.arange(classes), per_class)
    total = []
    for seed in range(seeds):
        owner, _ = dirichlet_partition(y, clients, alpha, np.random.default_rng(seed))
        shares = np.stack(
            [np.bincount(owner[y == k], minlength=clients) / per_class for k in range(classes)]
        )
        total.append(((shares - 1 / clients) ** 2).sum(axis=1))
    return float(np.mean(total)) / ((1 - 1 / clients) / (clients * alpha + 1))


@pytest.mark.parametrize("alpha", [0.1, 1.0, 100.0])
def test_dirichlet_split_matches_its_concentration(alpha):
    # 200 class splits per alpha: the ratio's standard error is about 0.035.
    assert split_deviation(alpha) == pytest.approx(1.0, abs=0.15)


def test_concentration_controls_the_reported_heterogeneity():
    skewed = [make("digits", num_clients=10, concentration=0.1, seed=s).info for s in range(3)]
    mixed = [make("digits", num_clients=10, concentration=100.0, seed=s).info for s in range(3)]
    for low, high in zip(skewed, mixed, strict=True):
        assert low["heterogeneity"] > 0.4 > 0.05 > high["heterogeneity"]
        assert low["largest_class_share_mean"] > 0.45 > 0.15 > high["largest_class_share_mean"]
        assert low["classes_per_client_mean"] < 7 < 10 == high["classes_per_client_mean"]
    # Dirichlet(100 1_10): every client has close to the global label mix (shares near 0.1).
    assert np.mean([m["largest_class_share_mean"] for m in mixed]) < 0.14


def test_partition_is_a_seeded_deterministic_split_of_all_samples():
    again = make(num_clients=6, concentration=0.5, seed=3)
    other = make(num_clients=6, concentration=0.5, seed=4)
    for mine, same in zip(WINE.members, again.members, strict=True):
        np.testing.assert_array_equal(mine, same)
    assert any(
        len(a) != len(b) or np.any(a != b) for a, b in zip(WINE.members, other.members, strict=True)
    )
    joined = np.sort(np.concatenate(WINE.members))
    np.testing.assert_array_equal(joined, np.arange(178))
    counts = WINE.client_label_counts()
    assert counts.sum() == 178 and counts.sum(axis=0).tolist() == WINE.info["class_counts"]
    assert WINE.info == again.info


def test_cluster_partition_gives_every_client_whole_clusters():
    instance = make("iris", num_clients=4, partition="clusters", num_clusters=8, seed=1)
    sizes = [len(m) for m in instance.members]
    assert min(sizes) >= 1 and sum(sizes) == 150
    # Feature skew implies label skew on iris: the clusters are far from the global mix.
    assert instance.info["heterogeneity"] > 0.2
    again = make("iris", num_clients=4, partition="clusters", num_clusters=8, seed=1)
    assert [m.tolist() for m in again.members] == [m.tolist() for m in instance.members]


def test_empty_partition_is_a_clear_error():
    with pytest.raises(DatasetError, match=r"client\(s\) \[.*fewer than min_client_samples.*"):
        make("iris", num_clients=60, concentration=0.01, max_draws=3)
    with pytest.raises(DatasetError, match=r"raise instance\.concentration, lower"):
        make("iris", num_clients=60, concentration=0.01, max_draws=3)
    with pytest.raises(DatasetError, match="150 samples, num_clients = 200"):
        make("iris", num_clients=200)
    # Through the registry the same error (a FedbanditError: one line on the command line).
    with pytest.raises(DataError, match="load_iris: client"):
        build_instance(
            ClassificationContextualParams(
                dataset="iris", num_clients=60, concentration=0.01, max_draws=2
            )
        )


def test_redraws_are_reported_and_deterministic():
    first = make("iris", num_clients=12, concentration=0.2, seed=0, max_draws=500)
    second = make("iris", num_clients=12, concentration=0.2, seed=0, max_draws=500)
    assert first.info["partition_draws"] == second.info["partition_draws"] > 1
    assert first.info["client_samples_min"] >= 1


def test_params_name_the_bad_key():
    with pytest.raises(ValidationError, match=r"exactly one of instance\.dataset"):
        ClassificationContextualParams()
    with pytest.raises(ValidationError, match=r"exactly one of instance\.dataset"):
        ClassificationContextualParams(dataset="wine", path="x.csv")
    with pytest.raises(ValidationError, match="num_clusters = 3 < num_clients = 5"):
        ClassificationContextualParams(
            dataset="wine", num_clients=5, partition="clusters", num_clusters=3
        )
    with pytest.raises(ValidationError, match="concentraton"):
        ClassificationContextualParams(dataset="wine", concentraton=1.0)


# ------------------------------------------------------------------------------ sampling
def test_draws_come_only_from_the_clients_own_partition_with_one_hot_means():
    for client, own in enumerate(WINE.members):
        rng = np.random.default_rng(client)
        index = WINE.sample_indices(rng, 500, client)
        assert set(index.tolist()) <= set(own.tolist())
        contexts, means = WINE.sample_contexts_and_means(np.random.default_rng(client), 500, client)
        assert contexts.shape == (500, 1, WINE.dim) and means.shape == (500, 3)
        np.testing.assert_array_equal(contexts[:, 0], WINE.features[index])
        np.testing.assert_array_equal(means, np.eye(3)[WINE.labels[index]])
        # Uniform with replacement: every sample of a small partition shows up in 500 draws.
        if len(own) <= 20:
            assert set(index.tolist()) == set(own.tolist())
    assert np.all(WINE.features[:, 0] == 1.0)  # the intercept coordinate
    with pytest.raises(ValueError, match=r"client_id must lie in \[0, 6\)"):
        WINE.sample_indices(np.random.default_rng(0), 1, 6)


def test_regret_counts_mistakes():
    horizon, entropy, clients = 300, [5, 1], np.arange(WINE.num_clients)
    # The labels each client will see: its reward stream's first chunk of draws.
    truth = [
        WINE.labels[WINE.sample_indices(rng, CHUNK, int(c))]
        for c, rng in zip(clients, client_generators(entropy, clients, REWARD_DOMAIN), strict=True)
    ]
    truth = np.stack(truth, axis=1)[:horizon]  # (T, M)
    oracle = ContextualEnvironment(WINE, clients, horizon, entropy)
    fixed = ContextualEnvironment(WINE, clients, horizon, entropy)
    zero_rewards = np.zeros(WINE.num_clients)
    for t in range(horizon):
        oracle.observe()
        assert np.all(oracle.pull(truth[t]) == 1.0)
        contexts, _ = fixed.observe()
        assert contexts.shape == (WINE.num_clients, 3, WINE.dim)
        rewards = fixed.pull(np.zeros(WINE.num_clients, dtype=np.int64))
        np.testing.assert_array_equal(rewards, (truth[t] == 0).astype(float))
        zero_rewards += rewards == 0
    assert np.all(oracle.record().client_regret == 0.0)
    np.testing.assert_array_equal(fixed.record().client_regret, (truth != 0).sum(axis=0))
    np.testing.assert_array_equal(fixed.record().client_regret, zero_rewards)


@pytest.mark.parametrize("algorithm", ["linucb_d", "greedy", "dislinucb", "fedlinucb"])
def test_results_do_not_depend_on_grouping(algorithm):
    instance = make(num_clients=5, concentration=0.5, participation=0.7, noise_sigma=0.1)
    runs = [simulate(instance, algorithm, 200, [2, 0], group_size=g) for g in (None, 1)]
    np.testing.assert_array_equal(runs[0].regret.increment_diff, runs[1].regret.increment_diff)
    np.testing.assert_array_equal(runs[0].regret.client_regret, runs[1].regret.client_regret)
    assert runs[0].totals == runs[1].totals


def test_tables_use_the_same_pipeline(tmp_path):
    data = bundled_dataset("wine")
    file = tmp_path / "wine.npz"
    np.savez(file, X=data.X, y=data.labels)
    table = build_instance(
        ClassificationContextualParams(path=str(file), num_clients=6, concentration=0.5, seed=3)
    )
    assert table.name == "contextual_table_wine.npz" and table.num_arms == 3
    np.testing.assert_array_equal(table.features, WINE.features)
    assert [m.tolist() for m in table.members] == [m.tolist() for m in WINE.members]


# ------------------------------------------------------------------------------ experiments
CONTEXTUAL_DATA = [
    name
    for name, path in available_experiments().items()
    if 'kind = "classification_contextual"' in path.read_text()
]


def test_contextual_data_experiments_exist():
    assert {"contextual_digits", "contextual_wine", "contextual_iris_tiny"} <= set(CONTEXTUAL_DATA)


@pytest.mark.parametrize("name", CONTEXTUAL_DATA)
def test_contextual_data_experiments_run_a_few_rounds(name):
    config = load_experiment(name, ["horizon=48"])
    instance = build_instance(config.instance)
    assert instance.contextual and not instance.shared_parameter
    for algorithm in config.algorithms:
        result = simulate(instance, algorithm, config.horizon, [0, 0])
        curve = result.regret.mean_cumulative_regret()
        assert len(curve) == 48 and np.all(np.diff(curve) >= 0)
        # Regret counts mistakes: integers, at most one per client and round.
        regret = result.regret.client_regret
        assert np.all(regret == np.round(regret)) and np.all(regret <= 48)


def test_harness_records_the_partition_facts(tmp_path):
    config = load_experiment("contextual_iris_tiny", ["horizon=64", "seeds=1"])
    out = run_experiment(config, tmp_path / "run", workers=1, progress=False)
    facts = json.loads((out / "manifest.json").read_text())["instance"]
    assert facts["name"] == "contextual_iris" and facts["num_clients"] == 5
    assert facts["kind"] == "classification_contextual" and facts["concentration"] == 0.5
    assert facts["classes"] == ["setosa", "versicolor", "virginica"]
    assert 0 < facts["heterogeneity"] < 1 and 1 <= facts["classes_per_client_mean"] <= 3
    assert 1 / 3 <= facts["largest_class_share_mean"] <= 1
    assert facts["class_counts"] == [50, 50, 50] and facts["class_balance"] == 1.0
    summary = json.loads((out / "summary.json").read_text())
    assert set(config.algorithms) <= set(summary)
