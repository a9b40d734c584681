"""Replay of logged events (``kind = "replay"``) and the MovieLens-20M preprocessing, on tiny
generated files of the authors' formats (never real data).

- the reward is the logged-choice indicator; always picking the logged choice earns 1 per event;
  uniform play earns mean 1/|pool|; events, clients and pools are those of the file;
- the authors' replay loop (``cyrilli/FedGLB-UCB``, ``RunRealworldDataset.py``, with
  ``lib/DisLinUCB.py`` and ``lib/FedGLB_UCB.py``), transcribed in plain Python below, gives the
  rewards and communication of our ``dislinucb`` (``fidelity = "authors_code"``) and the rewards,
  syncs and AGD iterations of our ``fedglb_ucb``; both servers' ``authors_comm_cost`` is the
  loop's ``totalCommCost``;
- ``getProcessedEvents.py`` and ``getMovieLensArmFeature.py`` transcribed line by line below give
  the event lines and features of ``fedbandit.datasets.movielens20m`` on a generated miniature of
  the raw files;
- results files, plots, runtimes (in-process and flower-sim give identical files), errors.
"""

from __future__ import annotations

import csv
import json
import math
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from step_recorder import record_steps

from fedbandit.cli import main as cli_main
from fedbandit.config import load_experiment, shipped_folder, validate_experiment
from fedbandit.datasets import movielens20m
from fedbandit.datasets.replay import (
    AUTHORS_HEADER,
    ReplayEnvironment,
    ReplayParams,
    build_replay,
    write_example,
)
from fedbandit.errors import ConfigError, DataError, MissingDataError
from fedbandit.federation.runtime import InProcessRuntime, run_federation
from fedbandit.registry import build_instance
from fedbandit.results import load_results
from fedbandit.results.replay import hit_curve
from fedbandit.runner import run_experiment
from fedbandit.runs.report import summary_table
from fedbandit.runspec import RuntimeOptions
from fedbandit.simulation import SeedResult, build_federation, simulate
from fedbandit.sweep import expand

# --------------------------------------------------------------------------- generated files


def example(folder: Path, **changes) -> Path:
    """Generated authors'-format files in ``folder`` (``write_example``); returns the folder."""
    settings = {"users": 5, "events": 600, "items": 80, "dim": 4, "pool_size": 10, "seed": 1}
    write_example(folder, **{**settings, **changes})
    return folder


def read_file_events(folder: Path) -> list[tuple[str, list[str]]]:
    """(user, pool item ids with the logged choice first) per event, straight from the file."""
    lines = (folder / "events.dat").read_text().splitlines()[1:]
    out = []
    for line in lines:
        user, _, pool = line.split("\t")
        out.append((user, [item.strip() for item in pool.strip("[]").split(",")]))
    return out


def read_file_features(folder: Path) -> dict[str, np.ndarray]:
    lines = (folder / "Arm_FeatureVectors_2.dat").read_text().splitlines()[1:]
    return {
        line.split("\t")[0]: np.array(line.split("\t")[1].split(";"), dtype=float) for line in lines
    }


def params(folder: Path, **changes) -> ReplayParams:
    return ReplayParams(path=str(folder), **changes)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    return example(tmp_path_factory.mktemp("replay"))


# --------------------------------------------------------------------------- the protocol


def play(instance, horizon: int, choose) -> tuple[list[float], ReplayEnvironment]:
    """Play every client in one group; ``choose(step, contexts_row)`` gives the arm."""
    env = instance.make_environment(np.arange(instance.num_clients), horizon, [0, 0])
    rewards = []
    for step in range(horizon):
        contexts, active = env.observe()
        (row,) = np.flatnonzero(active)
        arms = np.zeros(instance.num_clients, dtype=np.int64)
        arms[row] = choose(step, contexts[row])
        got = env.pull(arms)
        assert np.count_nonzero(got[np.arange(len(got)) != row]) == 0
        rewards.append(float(got[row]))
    return rewards, env


def test_reward_is_exactly_the_logged_choice_indicator(files):
    instance = build_replay(params(files))
    rng = np.random.default_rng(3)
    picks = rng.integers(0, instance.num_arms, size=instance.num_events)
    rewards, env = play(instance, instance.num_events, lambda s, _: picks[s])
    logged = [pool[0] for _, pool in read_file_events(files)]
    shown = [instance.item_ids[instance.items[s, picks[s]]] for s in range(instance.num_events)]
    assert rewards == [1.0 if a == b else 0.0 for a, b in zip(shown, logged, strict=True)]
    assert 0 < sum(rewards) < len(rewards)
    record = env.record()  # the regret counts the misses
    assert record.client_regret.sum() == len(rewards) - sum(rewards)
    np.testing.assert_array_equal(
        hit_curve(record, instance.num_events), np.cumsum(rewards, dtype=float)
    )


def test_always_picking_the_logged_choice_earns_one_per_event(files):
    instance = build_replay(params(files))
    rewards, env = play(instance, 500, lambda s, _: instance.chosen[s])
    assert rewards == [1.0] * 500
    assert env.record().client_regret.sum() == 0
    assert env.record().client_pulls.sum() == 500


@pytest.mark.slow
def test_uniform_play_earns_the_mean_of_one_over_the_pool_size(tmp_path):
    folder = example(tmp_path, events=6000, pool_size=12)
    instance = build_replay(params(folder, pool_size=5))
    rng = np.random.default_rng(11)
    rewards, _ = play(instance, instance.num_events, lambda s, _: rng.integers(5))
    expected = instance.random_reward(instance.num_events) / instance.num_events
    assert expected == 1 / 5 == instance.info["random_reward_per_event"]
    spread = math.sqrt(expected * (1 - expected) / len(rewards))
    assert abs(np.mean(rewards) - expected) < 4 * spread  # about 0.02 either way


def test_events_clients_and_pools_are_those_of_the_file(files):
    events = read_file_events(files)
    features = read_file_features(files)
    for shuffle in (False, True):
        instance = build_replay(params(files, shuffle_pools=shuffle))
        users = list(dict.fromkeys(user for user, _ in events))
        assert list(instance.users) == users and instance.num_clients == len(users)
        env = instance.make_environment(np.arange(instance.num_clients), len(events), [0, 0])
        for step, (user, pool) in enumerate(events):
            contexts, active = env.observe()
            assert np.flatnonzero(active).tolist() == [users.index(user)]
            row = contexts[users.index(user)]
            shown = [instance.item_ids[i] for i in instance.items[step]]
            assert sorted(shown) == sorted(pool)
            if not shuffle:
                assert shown == pool and instance.chosen[step] == 0
            assert shown[instance.chosen[step]] == pool[0]
            expected = np.array([[*features[item], 1.0] for item in shown])
            np.testing.assert_array_equal(row, expected)  # the features, bias appended
            env.pull(np.zeros(instance.num_clients, dtype=np.int64))
    shuffled = build_replay(params(files))
    assert len(set(shuffled.chosen.tolist())) > 5  # the logged choice is no longer always first


def test_a_group_sees_only_its_own_clients_events(files):
    instance = build_replay(params(files))
    env = instance.make_environment([1, 3], 50, [0, 0])
    for step in range(50):
        _, active = env.observe()
        client = int(instance.clients[step])
        assert active.tolist() == [client == 1, client == 3]
        env.pull(np.zeros(2, dtype=np.int64))
    assert env.pulls.sum() == np.isin(instance.clients[:50], [1, 3]).sum()


def test_caps_pool_size_and_client_mapping(files):
    events = read_file_events(files)
    users = list(dict.fromkeys(user for user, _ in events))
    capped = build_replay(params(files, max_events=40))
    assert capped.num_events == 40
    two = build_replay(params(files, max_users=2))
    assert list(two.users) == users[:2]
    assert two.num_events == sum(user in users[:2] for user, _ in events)
    shared = build_replay(params(files, num_clients=2))
    expected = [users.index(user) % 2 for user, _ in events]
    assert shared.clients.tolist() == expected and shared.num_clients == 2
    small = build_replay(params(files, pool_size=3, shuffle_pools=False))
    for step, (_, pool) in enumerate(events[:20]):
        assert [small.item_ids[i] for i in small.items[step]] == pool[:3]
    assert small.num_arms == 3 and small.dim == 5
    no_bias = build_replay(params(files, bias=False))
    assert no_bias.dim == 4


def test_the_csv_format_gives_the_same_events(tmp_path):
    authors = build_replay(params(example(tmp_path / "a", events=200)))
    plain_folder = example(tmp_path / "c", events=200, fmt="csv")
    plain = build_replay(params(plain_folder, features="features.csv"))
    assert plain.info["format"] == "csv" and authors.info["format"] == "authors"
    assert plain.users == authors.users and plain.num_arms == authors.num_arms
    for step in range(200):
        ours = {plain.item_ids[i]: plain.features[i] for i in plain.items[step]}
        theirs = {authors.item_ids[i]: authors.features[i] for i in authors.items[step]}
        assert ours.keys() == theirs.keys()
        for item in ours:
            np.testing.assert_array_equal(ours[item], theirs[item])
        chosen = (plain.items[step, plain.chosen[step]], authors.items[step, authors.chosen[step]])
        assert plain.item_ids[chosen[0]] == authors.item_ids[chosen[1]]


def test_state_saved_mid_run_continues_identically(files):
    instance = build_replay(params(files))
    env = instance.make_environment(np.arange(instance.num_clients), 100, [0, 0])
    arms = np.zeros(instance.num_clients, dtype=np.int64)
    for _ in range(37):
        env.observe()
        env.pull(arms)
    state = env.state_dict()
    fresh = instance.make_environment(np.arange(instance.num_clients), 100, [0, 0])
    fresh.load_state_dict(state)
    for _ in range(63):
        a, b = env.observe(), fresh.observe()
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(env.pull(arms), fresh.pull(arms))
    np.testing.assert_array_equal(env.record().increment_diff, fresh.record().increment_diff)


@pytest.mark.slow
def test_results_do_not_depend_on_client_grouping(files):
    instance = build_replay(params(files))
    for algorithm in ("dislinucb", "fedigw"):
        runs = [simulate(instance, algorithm, 300, [0, 1], group_size=g) for g in (None, 2, 1)]
        for other in runs[1:]:
            np.testing.assert_array_equal(
                other.regret.increment_diff, runs[0].regret.increment_diff
            )
            assert other.totals == runs[0].totals


# ------------------------------------------------------------------------ every algorithm runs

ALGORITHMS = [
    ("dislinucb", {}),
    ("dislinucb", {"fidelity": "authors_code"}),
    ("async_linucb", {}),
    ("async_linucb", {"fidelity": "authors_code"}),
    ("fedlinucb", {}),
    ("fedlinucb", {"fidelity": "authors_code"}),
    ("central_linucb", {}),
    ("oful", {}),
    ("fedglb_ucb", {}),
    ("ons_glm", {}),
    ("hlinucb", {}),
    ("fedigw", {}),
    ("batched_fedlinucb", {}),
    (
        "private_fedlinucb",
        {"epsilon": 5.0, "delta": 0.01, "feature_bound": 3.0, "reward_bound": 1.0},
    ),
]


@pytest.mark.parametrize(("algorithm", "hyper"), ALGORITHMS)
def test_every_single_choice_contextual_algorithm_runs_on_a_replay(files, algorithm, hyper):
    instance = build_replay(params(files))
    result = simulate(instance, algorithm, 40, [0, 0], hyper)
    hits = hit_curve(result.regret, 40)
    assert hits is not None and hits[-1] == 40 - result.regret.client_regret.sum()
    assert 0 <= hits[-1] <= 40 and result.regret.client_pulls.sum() == 40


# ---------------------------------------------------- the authors' replay loop, transcribed


def authors_read_features(path: Path) -> dict[int, np.ndarray]:
    """``dataset_utils/LastFM_util_functions_2.py``, ``readFeatureVectorFile``."""
    vectors = {}
    with open(path) as f:
        f.readline()
        for line in f:
            line = line.split("\t")
            vec = line[1].strip("[]").strip("\n").split(";")
            vectors[int(line[0])] = np.array(vec)
    return vectors


def authors_parse_line(line: str):
    """``parseLine``."""
    user, tim, pool = line.split("\t")
    return int(user), int(tim), np.array(pool.strip("[").strip("]").strip("\n").split(","))


def authors_events(folder: Path, bias: bool = True):
    """``RunRealworldDataset.runAlgorithms``' loop up to the decision: per line, the user, the
    logged item, the pool's item ids and ``candidateArticleFeatureMatrix``."""
    vectors = authors_read_features(folder / "Arm_FeatureVectors_2.dat")
    with open(folder / "events.dat") as f:
        f.readline()
        for line in f:
            user, _, pool = authors_parse_line(line)
            chosen = int(pool[0])
            ids, rows = [], []
            for article in pool:
                article_id = int(article.strip("]"))
                vector = np.array(vectors[article_id], dtype=float)
                if bias:
                    vector = np.concatenate((vector, [1.0]))
                ids.append(article_id)
                rows.append(vector)
            yield user, chosen, ids, np.array(rows)


def authors_dislinucb(
    folder: Path, lam: float, delta: float, R: float, threshold: float, alpha: float | None = None
):
    """``lib/DisLinUCB.py`` (FedGLB-UCB) with ``alpha=None`` (its ``alpha_t``,
    ``alpha_t_scaling`` 1) or a fixed ``alpha`` (``RunRealworldDataset.py`` sets
    ``alpha_linear = 0.3``), in ``RunRealworldDataset.py``'s loop. Returns the rewards, the
    script's ``totalCommCost``, per sync the clients known and those with buffered data, and the
    arm (pool position) picked at every event."""
    clients: dict[int, dict] = {}
    A_agg, b_agg, n_agg = None, None, 0
    total, rewards, syncs, arms = 0, [], [], []
    ties = np.random.default_rng(0)
    for step, (user, chosen, ids, arm_matrix) in enumerate(authors_events(folder)):
        d = arm_matrix.shape[1]
        if A_agg is None:
            A_agg, b_agg = np.zeros((d, d)), np.zeros(d)

        def alpha_t(n, d=d):
            return R * np.sqrt(d * np.log(1 + n / (d * lam)) + 2 * np.log(1 / delta)) + np.sqrt(lam)

        if user not in clients:  # decide() registers the client
            clients[user] = {
                "A": np.zeros((d, d)), "b": np.zeros(d), "n": 0,
                "A_up": np.zeros((d, d)), "b_up": np.zeros(d), "n_up": 0,
                "AInv": np.linalg.inv(lam * np.identity(d)), "theta": np.zeros(d),
                "alpha_t": alpha_t(0),
            }  # fmt: skip
        c = clients[user]
        ucbs = np.sqrt((np.matmul(arm_matrix, c["AInv"]) * arm_matrix).sum(axis=1))
        alpha_now = c["alpha_t"] * 1.0 if alpha is None else alpha
        mu = np.matmul(arm_matrix, c["theta"]) + alpha_now * ucbs
        arm = int(ties.choice(np.flatnonzero(mu == mu.max())))
        arms.append(arm)
        reward = 1 if ids[arm] == chosen else 0
        rewards.append(reward)
        x = arm_matrix[arm]
        # localUpdate
        c["A"] += np.outer(x, x)
        c["b"] += x * reward
        c["n"] += 1
        c["A_up"] += np.outer(x, x)
        c["b_up"] += x * reward
        c["n_up"] += 1
        c["AInv"] = np.linalg.inv(c["A"] + lam * np.identity(d))
        c["theta"] = np.dot(c["AInv"], c["b"])
        c["alpha_t"] = alpha_t(c["n"])
        # syncRoundTriggered
        numerator = np.linalg.det(c["A"] + lam * np.identity(d))
        denominator = np.linalg.det(c["A"] - c["A_up"] + lam * np.identity(d))
        if np.log(numerator / denominator) * c["n_up"] >= threshold:
            with_data = {u for u, m in clients.items() if m["n_up"] > 0}
            syncs.append((step, set(clients), with_data))
            for model in clients.values():
                total += d**2 + d + 1
                A_agg += model["A_up"]
                b_agg += model["b_up"]
                n_agg += model["n_up"]
                model["A_up"], model["b_up"], model["n_up"] = np.zeros((d, d)), np.zeros(d), 0
            for model in clients.values():
                total += d**2 + d + 1
                model["A"], model["b"], model["n"] = A_agg.copy(), b_agg.copy(), n_agg
    return rewards, total, syncs, arms


def our_rewards(result, horizon: int) -> list[int]:
    return np.diff(hit_curve(result.regret, horizon), prepend=0).astype(int).tolist()


@pytest.mark.parametrize("width", ["adaptive", 0.3])
def test_dislinucb_gives_the_authors_rewards_and_communication(tmp_path, width):
    folder = example(tmp_path, users=4, events=400, items=60, dim=4, pool_size=8, temperature=0.3)
    lam, delta, R, D = 0.2, 0.01, 0.5, 2.0
    alpha = None if width == "adaptive" else width
    rewards, authors_total, syncs, arms = authors_dislinucb(folder, lam, delta, R, D, alpha)
    instance = build_replay(params(folder, shuffle_pools=False))
    hyper = {
        "fidelity": "authors_code", "regularization": lam, "delta": delta, "noise_sigma": R,
        "threshold": D, "width": width,
    }  # fmt: skip
    server, groups = build_federation(instance, "dislinucb", 400, [0, 0], hyper)
    steps = record_steps(groups)
    outcome = run_federation(server, InProcessRuntime(groups))
    result = SeedResult.of("dislinucb", [0, 0], outcome, 0.0)
    assert [steps[s]["arm"] for s in range(400)] == arms
    assert our_rewards(result, 400) == rewards
    assert 40 < sum(rewards) < 400 and len(syncs) >= 5
    # Communication: both count d^2 + d + 1 scalars per client and direction in a sync; the
    # script counts every client it knows, we count a client's upload only when it has data.
    size = instance.dim**2 + instance.dim + 1
    totals = result.totals
    up = totals["uplink_scalars"] - totals["uplink_bookkeeping_scalars"]
    down = totals["downlink_scalars"] - totals["downlink_bookkeeping_scalars"]
    assert up == size * sum(len(with_data) for _, _, with_data in syncs)
    # a download decided after the last event is never sent (the run is over)
    assert down == size * sum(len(known) for step, known, _ in syncs if step < 399)
    assert totals["statistics_rounds"] == 2 * len(syncs) - (syncs[-1][0] == 399)
    empty = sum(len(known - with_data) for _, known, with_data in syncs)
    last = len(syncs[-1][1]) if syncs[-1][0] == 399 else 0
    assert authors_total == up + down + size * (empty + last)
    # the authors' units, counted by our server (``report``): the script's totalCommCost exactly
    assert result.report["authors_comm_cost"] == authors_total > up + down
    assert "lib/DisLinUCB.py" in result.report["authors_comm_cost_rule"]
    # ... and as a series: the script's running totalCommCost after each sync, in order
    series = result.communication["authors_comm_cost"]
    running = np.cumsum([2 * size * len(known) for _, known, _ in syncs]).tolist()
    assert sorted(set(series) - {0}) == running and series.iloc[-1] == authors_total


def test_the_dislinucb_comparison_fails_on_a_changed_rule(tmp_path):
    folder = example(tmp_path, users=4, events=300, items=60, dim=4, pool_size=8, temperature=0.3)
    rewards, _, _, _ = authors_dislinucb(folder, 0.2, 0.01, 0.5, 2.0)
    instance = build_replay(params(folder, shuffle_pools=False))
    hyper = {"fidelity": "paper", "regularization": 0.2, "delta": 0.01, "threshold": 2.0}
    assert our_rewards(simulate(instance, "dislinucb", 300, [0, 0], hyper), 300) != rewards


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def authors_qp_projection(x: np.ndarray, M: np.ndarray) -> np.ndarray:
    """``lib/FedGLB_UCB.py``'s ``projection_in_norm``: the QP min y^T M y - 2 x^T M y over
    y >= 0, sum y = 1 (cvxopt's ``solvers.qp(2 M, -2 M x, -I, 0, 1^T, 1)``), solved by cvxpy."""
    import cvxpy as cp

    y = cp.Variable(len(x))
    objective = cp.Minimize(cp.quad_form(y - x, cp.psd_wrap(M)))
    cp.Problem(objective, [y >= 0, cp.sum(y) == 1]).solve(
        solver="CLARABEL", tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12
    )
    return np.asarray(y.value)


def authors_fedglb_ucb(
    folder: Path, users: list[int] | None, lam=0.2, threshold=2.0, alpha=0.3, projection="ball"
):  # fmt: skip
    """``lib/FedGLB_UCB.py`` with ``RunRealworldDataset.py``'s constants (lambda 0.2, c_mu =
    dsigmoid(1), S 1, a fixed alpha 0.3, init_x None: the AGD starts at the last global model,
    max_iters 1000), in the script's loop; ``decide`` registers a client at its first event
    (with ``users``, every one of them is registered before the first event instead: the paper
    mode's federation). ``projection = "simplex"``: the code's QP onto the simplex
    (``authors_qp_projection``); ``"ball"``: our paper mode's change, ||theta|| <= S
    (``project_to_ball``). With a fixed alpha the confidence parts never enter a decision: left
    out. ``totalCommCost`` as the code counts it: d^2 + 1 per client other than the triggering
    one at the collect, ``iter`` (the AGD loop's last index) (clients - 1) 2 d, and d^2 + d + 1
    per client at the download if ``clientID`` (left by the collect loop: the last client
    created) is not the triggering one. Returns the rewards, the sync steps, the AGD iterations
    per sync, the picks and the ``totalCommCost``."""
    from fedbandit.algorithms.glm_ucb import project_to_ball

    S, max_iters = 1.0, 1000
    c_mu = _sigmoid(1.0) * (1 - _sigmoid(1.0))
    clients: dict[int, dict] = {}
    A_g, theta_global, n_g = None, None, 0
    rewards, syncs, iterations, arms = [], [], [], []
    total = 0
    ties = np.random.default_rng(0)
    for step, (user, chosen, ids, arm_matrix) in enumerate(authors_events(folder)):
        d = arm_matrix.shape[1]
        shift = lam / c_mu * np.identity(d)
        if A_g is None:
            A_g, theta_global = lam / c_mu * np.identity(d), np.zeros(d)
        for uid in users or [user]:
            if uid not in clients:
                clients[uid] = {
                    "A": np.zeros((d, d)), "b": np.zeros(d), "X": np.zeros((0, d)),
                    "y": np.zeros(0), "A_buf": np.zeros((d, d)), "n_buf": 0,
                    "AInv": c_mu / lam * np.identity(d), "ONS": np.zeros(d), "ridge": np.zeros(d),
                }  # fmt: skip
        c = clients[user]
        ucbs = np.sqrt((np.matmul(arm_matrix, c["AInv"]) * arm_matrix).sum(axis=1))
        mu = np.matmul(arm_matrix, c["ridge"]) + alpha * ucbs
        arm = int(ties.choice(np.flatnonzero(mu == mu.max())))
        arms.append(arm)
        click = 1 if ids[arm] == chosen else 0
        rewards.append(click)
        x = arm_matrix[arm]
        c["n_buf"] += 1
        c["A"] += np.outer(x, x)
        c["A_buf"] += np.outer(x, x)
        c["X"] = np.concatenate((c["X"], x.reshape(1, d)), axis=0)
        c["y"] = np.concatenate((c["y"], np.array([click])), axis=0)
        numerator = np.linalg.det(c["A"] + shift)
        denominator = np.linalg.det(c["A"] - c["A_buf"] + shift)
        if not np.log(numerator / denominator) * c["n_buf"] >= threshold:
            z = x.dot(c["ONS"])  # localUpdate_ONSStep
            c["b"] += z * x
            tmp = c["AInv"].dot(x)
            c["AInv"] -= np.outer(tmp, tmp) / (1 + x.dot(tmp))
            grad = -click + _sigmoid(z)
            theta_prime = c["ONS"] - grad / c_mu * c["AInv"].dot(x)
            if projection == "simplex":
                c["ONS"] = authors_qp_projection(theta_prime, c["A"] + shift)
            else:
                c["ONS"] = project_to_ball(theta_prime[None], (c["A"] + shift)[None], S)[0]
            c["ridge"] = np.dot(c["AInv"], c["b"])
            continue
        syncs.append(step)
        for client_id, model in clients.items():
            if client_id != user:
                total += d * d + 1
            A_g += model["A_buf"]
            n_g += model["n_buf"]
            model["A_buf"], model["n_buf"] = np.zeros((d, d)), 0
        x_agd = theta_global  # init_x is None: the last global model
        lambda_prev, lambda_curr, gamma, y_prev = 0, 1, 1, x_agd
        step_size = 1 / (0.25 + lam / n_g) * 0.1
        done = 0
        for iteration in range(max_iters):  # noqa: B007 (read after the loop, as the code's iter)
            gradient = np.zeros(d)
            for model in clients.values():
                zz = np.dot(model["X"], x_agd)
                gradient += np.dot(np.transpose(model["X"]), -model["y"] + _sigmoid(zz))
            gradient += lam * x_agd
            gradient = gradient / n_g
            done += 1
            if np.linalg.norm(gradient) <= np.sqrt((2 * lam) / n_g**3):
                break
            y_curr = x_agd - step_size * gradient
            x_agd = (1 - gamma) * y_curr + gamma * y_prev
            y_prev = y_curr
            lambda_tmp = lambda_curr
            lambda_curr = (1 + np.sqrt(1 + 4 * lambda_prev * lambda_prev)) / 2
            lambda_prev = lambda_tmp
            gamma = (1 - lambda_prev) / lambda_curr
        iterations.append(done)
        total += iteration * (len(clients) - 1) * 2 * d
        b_g = np.dot(A_g - shift, x_agd)
        AInv_g = np.linalg.inv(A_g)
        theta_global = x_agd
        for model in clients.values():
            if client_id != user:  # the collect loop's last client_id, as the code's clientID
                total += d * d + d + 1
            model["A"] = A_g - shift
            model["b"] = b_g.copy()
            model["AInv"] = AInv_g.copy()
            model["ridge"] = np.dot(AInv_g, b_g)
            model["ONS"] = x_agd.copy()
    return rewards, syncs, iterations, arms, total


@pytest.mark.parametrize(
    "fidelity, projection",
    [("paper", "ball"), ("authors_code", "ball"), ("authors_code", "simplex")],
)
def test_fedglb_ucb_gives_the_authors_rewards_syncs_and_agd_iterations(
    tmp_path, fidelity, projection
):
    # d = 4 + bias: a log on which the simplex and the ball give different picks
    size = {"events": 200, "dim": 4} if projection == "simplex" else {"events": 200, "dim": 3}
    folder = example(tmp_path, users=3, items=50, pool_size=6, temperature=0.3, **size)
    T = size["events"]
    instance = build_replay(params(folder, shuffle_pools=False))
    users = [int(u) for u in instance.users] if fidelity == "paper" else None
    rewards, syncs, iterations, arms, authors_total = authors_fedglb_ucb(
        folder, users, projection=projection
    )
    hyper = {
        "regularization": 0.2, "delta": 0.01, "width": 0.3, "threshold": 2.0,
        "warm_start": True, "max_iterations": 1000, "fidelity": fidelity,
        "projection": projection,
    }  # fmt: skip
    server, groups = build_federation(instance, "fedglb_ucb", T, [0, 0], hyper)
    steps = record_steps(groups)
    ours_syncs, ours_iterations = [], []
    runtime = InProcessRuntime(groups)

    class Recording:
        def exchange(self, message):
            if message.kind == "collect":
                ours_syncs.append(groups[0].env.round - 1)
                ours_iterations.append(0)
            if message.kind == "gradient":
                ours_iterations[-1] += 1
            return runtime.exchange(message)

        def __getattr__(self, name):
            return getattr(runtime, name)

    outcome = run_federation(server, Recording())
    assert [steps[s]["arm"] for s in range(T)] == arms
    hits = hit_curve(outcome.regret, T)
    assert np.diff(hits, prepend=0).astype(int).tolist() == rewards
    assert ours_syncs == syncs and ours_iterations == iterations
    # the authors' units, counted by our server (``report``): the code's totalCommCost exactly
    assert outcome.report["authors_comm_cost"] == authors_total
    assert "lib/FedGLB_UCB.py" in outcome.report["authors_comm_cost_rule"]
    assert outcome.ledger.frame()["authors_comm_cost"].iloc[-1] == authors_total  # the series
    assert len(syncs) >= 5 and max(iterations) > 5 and 10 < sum(rewards) < T
    if (
        fidelity == "authors_code"
    ):  # the joining rules differ on this log: the test tells them apart
        everyone = authors_fedglb_ucb(
            folder, [int(u) for u in instance.users], projection=projection
        )
        assert everyone[3] != arms
    if projection == "simplex":  # and so do the projections
        assert authors_fedglb_ucb(folder, users)[3] != arms


# ----------------------------------------------------------------- results, runtimes, plots


def config(folder: Path, **changes):
    data = {
        "name": "replay_tiny",
        "horizon": 300,
        "seeds": 2,
        "algorithms": ["dislinucb", "fedigw"],
        "instance": {"kind": "replay", "path": str(folder)},
    }
    return validate_experiment({**data, **changes})


def test_results_report_reward_random_reward_and_their_ratio(files, tmp_path):
    out = run_experiment(
        config(files, horizon=150), tmp_path / "run", workers=1, progress=False, plots=False
    )
    summary = json.loads((out / "summary.json").read_text())
    instance = build_replay(params(files))
    results = load_results(out)
    for algorithm in ("dislinucb", "fedigw"):
        entry = summary[algorithm]
        assert entry["random_reward"] == 150 / instance.num_arms  # exact: T / K
        finals = results.final_reward()
        rows = finals[finals.algorithm == algorithm]
        misses = results.final_regret()
        misses = misses[misses.algorithm == algorithm]["regret"].to_numpy()
        # reward = T - misses (the regret is the per-client misses R(T)/M)
        np.testing.assert_allclose(rows["reward"], 150 - misses * instance.num_clients)
        assert entry["final_reward_mean"] == pytest.approx(rows["reward"].mean())
        assert entry["reward_ratio_mean"] == pytest.approx(
            (rows["reward"] / entry["random_reward"]).mean()
        )
        assert entry["hit_rate_mean"] == pytest.approx(entry["final_reward_mean"] / 150)
    assert summary["dislinucb"]["reward_ratio_mean"] > 2  # the learners beat random choice
    # the authors' units: the seeds' reports, averaged, beside our own scalars; in the table's note
    seeds = [
        json.loads((out / "runs" / "dislinucb" / f"seed_{s}.json").read_text()) for s in (0, 1)
    ]
    costs = [seed["report"]["authors_comm_cost"] for seed in seeds]
    assert costs[0] > 0 and summary["dislinucb"]["authors_comm_cost"] == sum(costs) / 2
    assert (
        summary["dislinucb"]["authors_comm_cost_rule"]
        == seeds[0]["report"]["authors_comm_cost_rule"]
    )
    assert "authors_comm_cost" not in summary["fedigw"]
    table = summary_table(summary)
    shown = f"{summary['dislinucb']['authors_comm_cost']:,.0f}"
    assert "authors' units: totalCommCost of the authors' code" in table
    assert table.splitlines()[-1].endswith(
        "fedbandit plot --comm-units authors on the results folder"
    )
    assert f"dislinucb {shown}" in table and "fedigw " not in table.splitlines()[-1]
    assert "misses" in summary["units"]["final_regret"]
    curve = pd.read_csv(out / "runs" / "dislinucb" / "seed_0.regret.csv")
    assert list(curve.columns) == ["t", "regret", "reward"]


def test_plots_refuse_a_reward_curve_without_a_replay(tmp_path):
    data = {
        "name": "plain", "horizon": 32, "seeds": 1, "algorithms": ["oful"],
        "instance": {"kind": "contextual", "num_clients": 2},
    }  # fmt: skip
    out = run_experiment(
        validate_experiment(data), tmp_path / "run", workers=1, progress=False, plots=False
    )
    results = load_results(out)
    assert not results.replay and "reward" not in results.curves
    with pytest.raises(ConfigError, match="not a replay"):
        results.plot_reward()
    assert "final_reward_mean" not in json.loads((out / "summary.json").read_text())["oful"]


def _result_files(run_dir: Path) -> dict[str, object]:
    files = {}
    for path in sorted((run_dir / "runs").rglob("*")):
        if path.is_file():
            key = str(path.relative_to(run_dir))
            if path.suffix == ".json":
                data = json.loads(path.read_text())
                data.pop("seconds"), data.pop("compile_seconds", None)
                files[key] = data
            else:
                files[key] = path.read_text()
    return files


@pytest.mark.slow
def test_in_process_and_flower_sim_give_identical_files(files, tmp_path):
    """About 40 s: Flower's simulation engine starts Ray."""
    experiment = config(files, horizon=120, seeds=1)
    local = run_experiment(experiment, tmp_path / "local", workers=1, progress=False)
    assert {p.name for p in (local / "plots").iterdir()} >= {"reward.png", "regret.png"}
    flower = run_experiment(
        experiment,
        tmp_path / "flower",
        progress=False,
        options=RuntimeOptions(runtime="flower-sim", nodes=2),
        plots=False,
    )
    ours, theirs = _result_files(local), _result_files(flower)
    assert ours.keys() == theirs.keys() and len(ours) == 8
    assert ours == theirs


# ------------------------------------------------------------------- experiment and errors


def test_experiment_validates_but_asks_for_the_data(tmp_path, capsys):
    experiment = load_experiment("fed_contextual_movielens20m")
    assert experiment.instance.kind == "replay" and experiment.instance.path == ""
    out = tmp_path / "r"
    code = cli_main(["sweep", "fed_contextual_movielens20m", "--out", str(out), "--quiet"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "instance.path is empty" in err
    assert "fedbandit sweep fed_contextual_movielens20m" in err and not out.exists()
    code = cli_main(["run", "fed_contextual_movielens20m", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "is a study" in err


#: The study's two points, spelled out: the papers' rules and the authors' scripts' (the
#: experiment's single configuration before it became a study).
POINT_SETTINGS = {
    "p000": [
        "params.dislinucb.fidelity=paper",
        "params.dislinucb.width=adaptive",
        "params.async_linucb.fidelity=paper",
        "params.async_linucb.width=adaptive",
        "params.fedglb_ucb.fidelity=paper",
        "params.fedglb_ucb.projection=ball",
        "params.ons_glm.fidelity=paper",
        "params.ons_glm.projection=ball",
    ],
    "p001": [
        "params.dislinucb.fidelity=authors_code",
        "params.dislinucb.width=0.3",
        "params.async_linucb.fidelity=authors_code",
        "params.async_linucb.width=0.3",
        "params.fedglb_ucb.fidelity=authors_code",
        "params.fedglb_ucb.projection=simplex",
        "params.ons_glm.fidelity=authors_code",
        "params.ons_glm.projection=simplex",
    ],
}


def test_experiment_runs_on_supplied_files(files, tmp_path):
    sets = [f"instance.path={files}", "horizon=60", "instance.bias=true"]
    experiment = load_experiment("fed_contextual_movielens20m", sets)
    points = expand(experiment)
    assert [point.id for point in points] == list(POINT_SETTINGS)
    for point in points:
        alone = load_experiment(str(plain_movielens20m(tmp_path)), sets + POINT_SETTINGS[point.id])
        assert point.config.params == alone.params  # nothing else differs between the points
        instance = build_instance(point.config.instance)
        for algorithm in point.config.algorithms:
            hyper = point.config.hyperparameters(algorithm)
            result = simulate(instance, algorithm, 60, [0, 0], hyper)
            assert result.regret.client_pulls.sum() == 60


def plain_movielens20m(folder: Path) -> Path:
    """The shipped study without its [sweep] table: one configuration, for ``fedbandit run``."""
    text = (shipped_folder("experiments") / "fed_contextual_movielens20m.toml").read_text()
    path = folder / "movielens20m_alone.toml"
    path.write_text(text.split("\n[sweep")[0])
    return path


def test_each_point_of_the_study_is_its_configuration_run_alone(files, tmp_path, capsys):
    """``fedbandit sweep fed_contextual_movielens20m --algorithms ...`` (the documented quick
    run) writes at each point exactly the files of ``fedbandit run`` of that configuration
    alone; the two points differ (the rules matter on this log)."""
    sets = [f"instance.path={files}", "horizon=200"]
    chosen = "dislinucb,async_linucb,fedglb_ucb,oful"
    study = tmp_path / "study"
    common = ["--quiet", "--workers", "2", "--algorithms", chosen]
    command = ["sweep", "fed_contextual_movielens20m", *_sets(sets), "--out", str(study)]
    assert cli_main([*command, *common]) == 0
    plain = plain_movielens20m(tmp_path)
    hits = {}
    for point, settings in POINT_SETTINGS.items():
        alone = tmp_path / f"alone-{point}"
        command = ["run", str(plain), *_sets(sets + settings), "--out", str(alone)]
        assert cli_main([*command, *common]) == 0
        for algorithm in chosen.split(","):
            name = f"runs/{algorithm}/seed_0"
            ours = study / "points" / point / name
            theirs = alone / name
            regret = ours.with_suffix(".regret.csv").read_text()
            assert regret == theirs.with_suffix(".regret.csv").read_text(), (point, algorithm)
            timing = ("seconds", "compile_seconds")
            ours_info, theirs_info = (
                {k: v for k, v in json.loads(path.with_suffix(".json").read_text()).items()
                 if k not in timing}
                for path in (ours, theirs)
            )  # fmt: skip
            assert ours_info == theirs_info, (point, algorithm)  # totals, report, reward
            hits[point, algorithm] = pd.read_csv(ours.with_suffix(".regret.csv"))["reward"].iloc[-1]
    capsys.readouterr()
    for algorithm in ("dislinucb", "async_linucb", "fedglb_ucb"):
        assert hits["p000", algorithm] != hits["p001", algorithm], algorithm
    assert hits["p000", "oful"] == hits["p001", "oful"]


def _sets(settings: list[str]) -> list[str]:
    return [part for setting in settings for part in ("--set", setting)]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


FEATURES = "ArticleID\tFeatureVector\n1\t0.1;0.2\n2\t0.3;0.4\n3\t-1;2\n"
BAD_EVENTS = [
    ("1\t10\t[1, 2, 3]\n", "line 1: an event where the format has a header"),
    (f"{AUTHORS_HEADER}\n1\t10\t1, 2, 3\n", "line 2: expected 'user id<TAB>timestamp"),
    (f"{AUTHORS_HEADER}\n1\t10\t[1, 2, x]\n", "line 2: an item id must be an integer"),
    (f"{AUTHORS_HEADER}\nu\t10\t[1, 2, 3]\n", "line 2: the user id must be an integer"),
    (f"{AUTHORS_HEADER}\n1\t10\t[1, 2, 3]\n\n", "line 3: blank line"),
    (f"{AUTHORS_HEADER}\n1\t10\t[1, 2, 9]\n", "line 2: item 9 has no feature vector"),
    (f"{AUTHORS_HEADER}\n1\t10\t[1, 2, 2]\n", "line 2: item 2 is twice in the pool"),
    (f"{AUTHORS_HEADER}\n1\t10\t[1, 2, 3]\n1\t11\t[1, 2]\n", "pools have 2 to 3 items"),
    (f"{AUTHORS_HEADER}\n1\t10\t[]\n", "line 2: empty pool"),
    (f"{AUTHORS_HEADER}\n", "no events"),
]


@pytest.mark.parametrize(("text", "message"), BAD_EVENTS)
def test_malformed_event_files_are_one_line_errors_naming_file_and_line(tmp_path, text, message):
    events = write(tmp_path / "events.dat", text)
    write(tmp_path / "Arm_FeatureVectors_2.dat", FEATURES)
    with pytest.raises(DataError) as err:
        build_replay(params(tmp_path))
    assert str(events) in str(err.value) and message in str(err.value)
    assert "\n" not in str(err.value)


BAD_FEATURES = [
    ("ArticleID\tFeatureVector\n1\t0.1;0.2\n2\t0.3\n", "line 3: 1 feature values"),
    ("ArticleID\tFeatureVector\n1\t0.1;zz\n", "line 2: feature values must be numbers"),
    ("ArticleID\tFeatureVector\n1\t0.1;0.2\n1\t0.3;0.4\n", "line 3: item 1 is listed twice"),
    ("ArticleID\tFeatureVector\n1\t0.1;nan\n", "line 2: a feature value is not finite"),
    ("ArticleID\tFeatureVector\n", "expected a header line and at least one item"),
]


@pytest.mark.parametrize(("text", "message"), BAD_FEATURES)
def test_malformed_feature_files_are_one_line_errors(tmp_path, text, message):
    write(tmp_path / "events.dat", f"{AUTHORS_HEADER}\n1\t10\t[1, 2]\n")
    features = write(tmp_path / "Arm_FeatureVectors_2.dat", text)
    with pytest.raises(DataError) as err:
        build_replay(params(tmp_path))
    assert str(features) in str(err.value) and message in str(err.value)


def test_malformed_csv_events(tmp_path):
    write(tmp_path / "features.csv", "item,f1\na,1\nb,2\nc,3\n")
    cases = [
        ("user,pool,chosen\n", "expected the columns user,time,pool,chosen"),
        ("user,time,pool,chosen\nu,1,a b,c\n", "line 2: the chosen item 'c' is not in the pool"),
        ("user,time,pool,chosen\nu,1,a b\n", "line 2: expected 4 fields"),
    ]
    for text, message in cases:
        events = write(tmp_path / "events.csv", text)
        with pytest.raises(DataError, match=message) as err:
            build_replay(params(events, features="features.csv"))
        assert str(events) in str(err.value)
    write(tmp_path / "events.csv", "time,chosen,pool,user\n5,b,a b c,u1\n6,a,c a b,u2\n")
    instance = build_replay(params(tmp_path / "events.csv", features="features.csv"))
    assert instance.users == ("u1", "u2") and instance.num_arms == 3


def test_missing_files_and_folders_name_what_was_expected(tmp_path, files):
    with pytest.raises(MissingDataError, match=r"instance\.path is empty"):
        build_replay(ReplayParams())
    with pytest.raises(MissingDataError, match=f"expected {tmp_path / 'nope.dat'}"):
        build_replay(params(tmp_path / "nope.dat"))
    with pytest.raises(MissingDataError, match="no event file in"):
        build_replay(params(tmp_path))
    with pytest.raises(MissingDataError, match="item-feature file not found"):
        build_replay(params(files, features="other.dat"))
    write(tmp_path / "two" / "events.dat", "x")
    write(tmp_path / "two" / "processed_events.dat", "x")
    with pytest.raises(DataError, match="several event files"):
        build_replay(params(tmp_path / "two"))


def test_too_long_a_horizon_is_refused_with_the_event_count(files, tmp_path, capsys):
    instance = build_replay(params(files))
    with pytest.raises(ConfigError, match=f"set horizon <= {instance.num_events}"):
        simulate(instance, "oful", instance.num_events + 1, [0, 0])
    toml = write(
        tmp_path / "long.toml",
        f'horizon = 5000\nseeds = 1\nalgorithms = ["oful"]\n[instance]\nkind = "replay"\n'
        f'path = "{files}"\n',
    )
    assert cli_main(["run", str(toml), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "600 events" in err
    assert not (tmp_path / "o").exists()  # refused before the run folder is made


def test_bad_parameters_and_sizes(files):
    with pytest.raises(DataError, match="only 5 users"):
        build_replay(params(files, num_clients=9))
    with pytest.raises(DataError, match=r"fewer than instance\.pool_size = 11"):
        build_replay(params(files, pool_size=11))
    with pytest.raises(ValueError, match=r"a file name inside instance\.path"):
        ReplayParams(path=str(files), events="a/b.dat")


# ------------------------------------------------------------------- MovieLens-20M preprocessing

GENRES = ["Action", "Comedy", "Drama", "Thriller", "Romance", "Sci-Fi", "(no genres listed)"]
WORDS = ["funny", "dark", "space", "love", "war", "classic", "twist", "music", "robots", "the"]


def raw_miniature(folder: Path, seed: int = 0) -> Path:
    """A generated miniature of ml-20m's ratings.csv, movies.csv and tags.csv: 12 users (one of
    them, user 5, again after user 9, as the script's dict assignment must handle), 80 movies,
    half-star ratings, movies without tags, titles with commas."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    movies = [int(m) for m in sorted(rng.choice(np.arange(1, 400), size=80, replace=False))]
    with open(folder / "movies.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["movieId", "title", "genres"])
        for m in movies:
            genres = "|".join(rng.choice(GENRES[:-1], size=rng.integers(1, 4), replace=False))
            w.writerow([m, f"Movie, {m} ({1950 + m % 60})", genres if m % 11 else GENRES[-1]])
    with open(folder / "tags.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["userId", "movieId", "tag", "timestamp"])
        for i in range(200):
            tag = " ".join(rng.choice(WORDS, size=rng.integers(1, 3)))
            w.writerow([rng.integers(1, 13), movies[rng.integers(0, 60)], tag, 10**9 + i])
    order = [1, 2, 3, 4, 5, 6, 7, 8, 9, 5, 10, 11, 12]
    ratings = ["userId,movieId,rating,timestamp"]
    for user in order:
        count = int(rng.integers(3, 45))
        for m in sorted(rng.choice(movies, size=count, replace=False)):
            r = rng.choice([0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0])
            ratings.append(f"{user},{m},{r},{int(rng.integers(8 * 10**8, 14 * 10**8))}")
    (folder / "ratings.csv").write_text("\n".join(ratings) + "\n")
    return folder


def authors_processed_events(folder: Path, threshold: int, positive: float, seed: int):
    """``Dataset/ml-20m/getProcessedEvents.py`` (FedGLB-UCB; Async-LinUCB's differs only in its
    constants) line by line, with ``random`` seeded and ``random.sample`` given the negatives
    sorted (a set in the script). Returns the lines it would write (without the header)."""
    rnd = random.Random(seed)
    arm_pool = set()
    user2ItemSeqs = {}
    temp_user_arm_tag = []
    cur_uid = 1
    fin = open(folder / "ratings.csv")  # noqa: SIM115 (the script's own lines)
    fin.readline()
    for line in fin:
        arr = line.strip().split(",")
        if float(arr[2]) < positive:
            continue
        t = {}
        t["uid"] = int(arr[0])
        t["aid"] = int(arr[1])
        t["tstamp"] = int(arr[3])
        arm_pool.add(t["aid"])
        if cur_uid == t["uid"]:
            temp_user_arm_tag.append(t)
        else:
            if len(temp_user_arm_tag) > threshold:
                user2ItemSeqs[cur_uid] = temp_user_arm_tag
            cur_uid = t["uid"]
            temp_user_arm_tag = []
            temp_user_arm_tag.append(t)
    fin.close()
    user_arm_pool = {}
    for _uid, ItemSeqs in user2ItemSeqs.items():
        for t in ItemSeqs:
            if t["uid"] not in user_arm_pool:
                user_arm_pool[t["uid"]] = arm_pool.copy()
            if t["aid"] in user_arm_pool[t["uid"]]:
                user_arm_pool[t["uid"]].remove(t["aid"])
    lines = []
    while user2ItemSeqs:
        userID = rnd.choice(list(user2ItemSeqs.keys()))
        t = user2ItemSeqs[userID].pop(0)
        random_pool = [t["aid"]] + rnd.sample(sorted(user_arm_pool[t["uid"]]), 24)  # noqa: RUF005
        lines.append(str(t["uid"]) + "\t" + str(t["tstamp"]) + "\t" + str(random_pool))
        if not user2ItemSeqs[userID]:
            del user2ItemSeqs[userID]
    return lines, len(arm_pool)


@pytest.mark.parametrize(("variant", "threshold", "positive"), [
    ("fedglb_ucb", 8, 3.0), ("async_linucb", 12, 1.0),
])  # fmt: skip
def test_preprocessing_writes_the_authors_event_lines(tmp_path, variant, threshold, positive):
    raw = raw_miniature(tmp_path / "ml-20m")
    expected, _ = authors_processed_events(raw, threshold, positive, seed=4)
    facts = movielens20m.preprocess(
        raw, tmp_path / "out", variant=variant, min_observations=threshold, seed=4,
        only="events",
    )  # fmt: skip
    users = len({line.split("\t")[0] for line in expected})
    suffix = "_PosOverThree" if variant == "fedglb_ucb" else ""
    name = f"randUserOrderedTime_N{users}_ObsMoreThan{threshold}{suffix}.dat"
    assert facts["events_file"] == name and facts["min_rating"] == positive
    text = (tmp_path / "out" / name).read_text().splitlines()
    assert text[0] == "userid  timestamp   arm_pool"
    assert text[1:] == expected and len(expected) > 50 and users >= 3
    # the rules, read off the lines: the logged item was rated >= positive by the user, the
    # negatives were not (rated lower, or by others only), 25 distinct items per pool (user 5,
    # seen twice, keeps one run: its other run's movies may be negatives)
    ratings = pd.read_csv(raw / "ratings.csv")
    good = ratings[ratings.rating >= positive]
    for line in expected:
        user, _, pool = line.split("\t")
        items = json.loads(pool)
        if user == "5":
            continue
        mine = set(good[good.userId == int(user)].movieId)
        assert items[0] in mine and not mine & set(items[1:]) and len(set(items)) == 25
        assert set(items[1:]) <= set(good.movieId)
    assert not any(line.startswith("12\t") for line in expected)  # the last user: never kept


def test_preprocessing_can_keep_the_last_user(tmp_path):
    raw = raw_miniature(tmp_path / "ml-20m")
    facts = movielens20m.preprocess(
        raw, tmp_path / "out", min_observations=0, include_last_user=True, only="events"
    )
    text = (tmp_path / "out" / facts["events_file"]).read_text()
    assert any(line.startswith("12\t") for line in text.splitlines())


def authors_arm_features(folder: Path, components: int, seed: int):
    """``Dataset/ml-20m/getMovieLensArmFeature.py`` step by step (the plot and the unused files
    left out; ``tags.drop(['timestamp'], 1)`` in today's pandas spelling; the SVD seeded)."""
    from sklearn import preprocessing
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer

    movies = pd.read_csv(folder / "movies.csv")
    tags = pd.read_csv(folder / "tags.csv")
    movies["genres"] = movies["genres"].str.replace("|", " ", regex=False)
    tags = tags.drop(columns=["timestamp"])
    mixed = pd.merge(movies, tags, on="movieId", how="left")
    mixed["tag"] = mixed["tag"].fillna("")
    joined = mixed.groupby("movieId")["tag"].apply(lambda x: "%s" % " ".join(x))  # noqa: UP031
    mixed = pd.DataFrame(joined)
    Final = pd.merge(movies, mixed, on="movieId", how="left")
    Final["metadata"] = Final[["tag", "genres"]].apply(lambda x: " ".join(x), axis=1)
    tfidf = TfidfVectorizer(stop_words="english")
    tfidf_matrix = tfidf.fit_transform(Final["metadata"])
    tfidf_df = pd.DataFrame(tfidf_matrix.toarray(), index=Final.index.tolist())
    svd = TruncatedSVD(n_components=components, random_state=seed)
    latent_matrix = svd.fit_transform(tfidf_df)
    latent_matrix = preprocessing.scale(latent_matrix)
    lines = ["ArticleID\tFeatureVector"]
    for articleID, featureVector in zip(Final.movieId.tolist(), latent_matrix, strict=True):
        lines.append(str(articleID) + "\t" + ";".join([str(x) for x in featureVector]))
    return lines


@pytest.mark.slow
def test_preprocessing_writes_the_authors_features(tmp_path):
    raw = raw_miniature(tmp_path / "ml-20m")
    expected = authors_arm_features(raw, components=5, seed=2)
    movielens20m.preprocess(raw, tmp_path / "out", components=5, seed=2, only="features")
    ours = (tmp_path / "out" / "Arm_FeatureVectors_2.dat").read_text().splitlines()
    assert ours[0] == expected[0] and len(ours) == len(expected) == 81
    for mine, theirs in zip(ours[1:], expected[1:], strict=True):
        assert mine.split("\t")[0] == theirs.split("\t")[0]
        a = np.array(mine.split("\t")[1].split(";"), dtype=float)
        b = np.array(theirs.split("\t")[1].split(";"), dtype=float)
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-9)  # sparse vs dense SVD input
    values = np.array([line.split("\t")[1].split(";") for line in ours[1:]], dtype=float)
    np.testing.assert_allclose(values.mean(axis=0), 0, atol=1e-12)  # preprocessing.scale
    np.testing.assert_allclose(values.std(axis=0), 1, rtol=1e-9)


def test_preprocessed_files_replay(tmp_path):
    raw = raw_miniature(tmp_path / "ml-20m")
    out = tmp_path / "processed"
    command = ["prepare", "movielens20m", str(raw), str(out), "--min-observations", "8"]
    assert cli_main([*command, "--quiet", "--components", "5"]) == 0
    instance = build_replay(ReplayParams(path=str(out)))
    assert instance.num_arms == 25 and instance.dim == 6
    facts = json.loads((out / "preprocessing.json").read_text())
    assert instance.num_events == facts["events"] and instance.num_clients == facts["users"]
    result = simulate(instance, "dislinucb", 50, [0, 0])
    assert result.regret.client_pulls.sum() == 50


def test_preprocessing_errors_are_one_line(tmp_path, capsys):
    assert movielens20m.main([str(tmp_path / "nope"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "MovieLens-20M folder not found" in err
    raw = raw_miniature(tmp_path / "ml-20m")
    (raw / "tags.csv").unlink()
    assert movielens20m.main([str(raw), str(tmp_path / "out"), "--only", "features"]) == 2
    assert f"expected {raw / 'tags.csv'}" in capsys.readouterr().err
    write(raw / "ratings.csv", "userId,movieId,rating\n1,2,3\n")
    assert movielens20m.main([str(raw), str(tmp_path / "out"), "--only", "events"]) == 2
    assert "columns ['timestamp'] are missing" in capsys.readouterr().err


def test_the_terminal_table_reports_a_replays_reward_and_its_ratio():
    entry = {
        "final_regret_mean": 26.88,
        "final_regret_ci95": None,
        "seconds_per_seed": 0.3,
        "rounds": 69,
        "final_reward_mean": 85.0,
        "reward_ratio_mean": 7.0833,
    }
    summary = {"experiment": "r", "horizon": 300, "seeds": [0], "status": "complete"}
    table = summary_table({**summary, "dislinucb": entry})
    assert "dislinucb: reward 85.0, 7.08x random" in table
    assert "counts the misses" in table
    plain = summary_table({**summary, "dislinucb": {**entry, "final_reward_mean": None}})
    assert "random" not in plain and "misses" not in plain
