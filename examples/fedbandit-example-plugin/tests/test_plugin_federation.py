"""fed_ucb and two_groups through fedbandit: registry, instance facts, exact communication,
state round trip, grouping invariance, dropping clients, and a seed-averaged statistical check."""

import io

import numpy as np
import pytest
from fedbandit_example_plugin import FED_UCB, TWO_GROUPS, FedUCBParams, TwoGroupsParams, two_groups
from pydantic import ValidationError

import fedbandit
from fedbandit import ClientFailure, InProcessRuntime, build_federation, run_federation
from fedbandit.registry import algorithms, instance_kinds, refresh
from fedbandit.simulation import simulate

MODES = {
    "counts": {"pooling": "counts"},
    "least_squares": {"pooling": "least_squares"},
}
SMALL = two_groups(TwoGroupsParams(num_clients=7, num_arms=4, dim=3, seed=3))


def shared_instance(num_clients=6, num_arms=4, dim=3, seed=5):
    """A shared-parameter instance built by hand (one theta for every arm)."""
    rng = np.random.default_rng(seed)
    theta = rng.standard_normal(dim)
    theta /= np.linalg.norm(theta)
    features = rng.uniform(-1, 1, size=(num_clients, num_arms, dim))
    thetas = np.broadcast_to(theta, (num_arms, dim)).copy()
    return fedbandit.LinearBanditInstance(features, thetas, 0.5, shared_parameter=True)


def homogeneous_instance(num_clients=20, num_arms=5, dim=3, seed=0):
    """Every client sees the same features, so every client has the same arm means."""
    rng = np.random.default_rng(seed)
    thetas = rng.standard_normal((num_arms, dim))
    thetas /= np.linalg.norm(thetas, axis=1, keepdims=True)
    x = rng.uniform(0.1, 1.0, size=(num_arms, dim))
    features = np.broadcast_to(x, (num_clients, num_arms, dim)).copy()
    return fedbandit.LinearBanditInstance(features, thetas, 0.5, shared_parameter=False)


CASES = {
    "counts": (SMALL, MODES["counts"]),
    "least_squares": (SMALL, MODES["least_squares"]),
    "least_squares_shared": (shared_instance(), MODES["least_squares"]),
}


# ------------------------------------------------------------------ registry and validation


def test_entry_points_are_found():
    refresh()
    try:
        get_algorithm, get_instance_kind = fedbandit.get_algorithm, fedbandit.get_instance_kind
    except (AttributeError, ImportError):  # the public helpers are not there (yet)
        get_algorithm, get_instance_kind = algorithms().get, instance_kinds().get
    assert get_algorithm("fed_ucb") is FED_UCB
    assert get_instance_kind("two_groups") is TWO_GROUPS
    assert algorithms().get("fed_ucb") is FED_UCB
    assert instance_kinds().get("two_groups") is TWO_GROUPS
    assert "fedbandit-example-plugin" in algorithms().origins["fed_ucb"]
    assert "fedbandit-example-plugin" in instance_kinds().origins["two_groups"]
    assert "fed_ucb" not in algorithms().broken and "two_groups" not in instance_kinds().broken


def test_experiment_file_validates_through_the_registry():
    from pathlib import Path

    path = Path(__file__).parents[1] / "experiments" / "fed_ucb_two_groups.toml"
    config = fedbandit.load_experiment(str(path))
    assert isinstance(config.instance, TwoGroupsParams)
    assert "fed_ucb" in config.algorithms
    assert isinstance(fedbandit.build_instance(config.instance), fedbandit.LinearBanditInstance)


def test_parameters_are_validated():
    with pytest.raises(ValidationError):
        FedUCBParams(alpha=0)
    with pytest.raises(ValidationError):
        FedUCBParams(pooling="median")
    with pytest.raises(ValidationError):
        FedUCBParams(unknown=1)
    with pytest.raises(ValidationError):
        TwoGroupsParams(num_clients=1)
    with pytest.raises(ValidationError):
        TwoGroupsParams(shared_parameter=True)


# ------------------------------------------------------------------ the instance


@pytest.mark.parametrize("seed", range(5))
def test_two_groups_has_two_best_arms_with_the_gap(seed):
    params = TwoGroupsParams(num_clients=11, num_arms=6, dim=4, gap=0.3, seed=seed)
    instance = two_groups(params)
    info = instance.info
    assert info["best_arms"][0] != info["best_arms"][1]
    assert sorted(info["group_sizes"]) == [5, 6]
    best = instance.mean_rewards().argmax(axis=1)
    assert set(best.tolist()) == set(info["best_arms"])
    assert np.bincount(best, minlength=6)[info["best_arms"]].tolist() in (
        info["group_sizes"],
        info["group_sizes"][::-1],
    )
    assert instance.min_gap() >= 0.3 - 1e-12
    again = two_groups(params)
    np.testing.assert_array_equal(again.features, instance.features)
    np.testing.assert_array_equal(again.thetas, instance.thetas)


# ------------------------------------------------------------------ communication


def test_communication_is_phase_end_uploads_and_broadcasts_only():
    """T = 7: phases of 1, 2 and 4 steps. Round 0 broadcasts nothing; rounds 1 and 2 broadcast
    counts (K) + gram (K d^2) + xy (K d) to every client; clients upload in rounds 0 and 1 (K
    counts + d^2 + d per pulled arm) and nothing after the last phase."""
    M, K, d = SMALL.num_clients, SMALL.num_arms, SMALL.dim
    result = simulate(SMALL, "fed_ucb", 7, [0, 0])
    comm = result.communication
    down = comm[comm.direction == "downlink"].set_index("round")
    up = comm[comm.direction == "uplink"].set_index("round")
    assert down.loc[0, "scalars"] == 0
    assert down.loc[1, "scalars"] == down.loc[2, "scalars"] == M * (K + K * d * d + K * d)
    assert up.loc[0, "scalars"] == M * (K + d * d + d)  # one step: one pulled arm each
    assert M * (K + d * d + d) <= up.loc[1, "scalars"] <= M * (K + 2 * (d * d + d))
    assert up.loc[2, "scalars"] == 0 and up.loc[2, "kind"] == "done"
    assert result.totals["rounds"] == 3
    assert result.regret.client_pulls.tolist() == [7] * M


def test_server_statistics_hold_every_reported_pull():
    server, groups = build_federation(SMALL, "fed_ucb", 100, [0, 1], MODES["counts"], 3)
    run_federation(server, InProcessRuntime(groups))
    # phases 1, 2, 4, ..., 32 (63 steps) were reported; the last (37 steps) ended with "done"
    assert server.played == 100 and server.finished
    assert server.stats["counts"].sum() == SMALL.num_clients * 63


def test_counts_mode_downlink_is_two_scalars_per_arm():
    M, K = SMALL.num_clients, SMALL.num_arms
    comm = simulate(SMALL, "fed_ucb", 7, [0, 0], MODES["counts"]).communication
    down = comm[comm.direction == "downlink"].set_index("round")
    assert down.loc[1, "scalars"] == M * 2 * K
    assert comm[comm.direction == "uplink"].set_index("round").loc[0, "scalars"] == M * (K + 1)


# ------------------------------------------------------------------ state round trip


def through_npz(state):
    """What a node can store: arrays only, read back without pickles."""
    for key, value in state.items():
        assert value.dtype.kind in "biuf", f"{key} has dtype {value.dtype}"
    buffer = io.BytesIO()
    np.savez(buffer, **state)
    buffer.seek(0)
    with np.load(buffer, allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


class RestartingRuntime(InProcessRuntime):
    """After every exchange, replaces each client group by a fresh one loaded from its state."""

    def __init__(self, groups, rebuild):
        super().__init__(groups)
        self.rebuild = rebuild
        self.restarts = 0

    def exchange(self, message):
        reply = super().exchange(message)
        fresh = self.rebuild()
        for old, new in zip(self.groups, fresh, strict=True):
            new.load_state_dict(through_npz(old.state_dict()))
        self.groups = fresh
        self.restarts += 1
        return reply


@pytest.mark.parametrize("case", sorted(CASES))
def test_rebuilding_every_group_after_every_message_changes_nothing(case):
    instance, params = CASES[case]
    horizon = 1500
    expected = simulate(instance, "fed_ucb", horizon, [4, 2], params, group_size=2)

    def rebuild():
        return build_federation(instance, "fed_ucb", horizon, [4, 2], params, group_size=2)[1]

    server, groups = build_federation(instance, "fed_ucb", horizon, [4, 2], params, group_size=2)
    runtime = RestartingRuntime(groups, rebuild)
    outcome = run_federation(server, runtime)
    assert runtime.restarts == 11  # phases of 1, 2, ..., 512 and the last 477 steps
    np.testing.assert_array_equal(outcome.regret.increment_diff, expected.regret.increment_diff)
    np.testing.assert_array_equal(outcome.regret.client_regret, expected.regret.client_regret)
    assert outcome.ledger.totals() == expected.totals


# ------------------------------------------------------------------ grouping invariance


@pytest.mark.parametrize("case", sorted(CASES))
def test_grouping_does_not_change_a_bit(case):
    instance, params = CASES[case]
    one = simulate(instance, "fed_ucb", 1000, [0, 1], params, group_size=None)
    for size in (2, 1, 4):
        other = simulate(instance, "fed_ucb", 1000, [0, 1], params, group_size=size)
        np.testing.assert_array_equal(one.regret.increment_diff, other.regret.increment_diff)
        np.testing.assert_array_equal(one.regret.client_regret, other.regret.client_regret)
        assert one.totals == other.totals
        assert one.communication.equals(other.communication)


# ------------------------------------------------------------------ dropping clients


class FailingRuntime(InProcessRuntime):
    """Loses the group serving client ``victim`` in round ``when`` (its reply never arrives)."""

    def __init__(self, groups, when, victim):
        super().__init__(groups)
        self.when, self.victim = when, victim
        self.addressed = []

    def exchange(self, message):
        self.addressed.append(message.client_ids.copy())
        reply = super().exchange(message)
        if message.round != self.when:
            return reply
        group = next(g for g in self.groups if self.victim in g.client_ids)
        kept = np.flatnonzero(~np.isin(reply.client_ids, group.client_ids))
        raise ClientFailure(group.client_ids, {"test": "killed"}, reply.select(kept))


def test_dropped_clients_are_no_longer_addressed():
    server, groups = build_federation(SMALL, "fed_ucb", 500, [0, 0], group_size=3)
    runtime = FailingRuntime(groups, when=4, victim=4)
    outcome = run_federation(server, runtime, on_client_failure="drop")
    assert outcome.status == "complete"
    assert sorted(outcome.dropped) == [3, 4, 5]
    assert all(len(ids) == 7 for ids in runtime.addressed[:5])
    assert all(ids.tolist() == [0, 1, 2, 6] for ids in runtime.addressed[5:])
    assert outcome.regret.client_ids.tolist() == [0, 1, 2, 6]
    assert outcome.regret.client_pulls.tolist() == [500] * 4
    # phases 0..4 (31 steps) had 7 reporting clients minus the 3 lost in phase 4 (16 steps)
    assert server.stats["counts"].sum() == 7 * 15 + 4 * 16 + 4 * (32 + 64 + 128)


def test_losing_every_client_ends_the_run():
    server, groups = build_federation(SMALL, "fed_ucb", 500, [0, 0])
    outcome = run_federation(server, FailingRuntime(groups, 2, 0), on_client_failure="drop")
    assert outcome.status == "aborted" and len(outcome.dropped) == SMALL.num_clients


# ------------------------------------------------------------------ it learns


def mean_curve(instance, algorithm, horizon, seeds, params=None):
    curves = [
        simulate(instance, algorithm, horizon, [7, s], params).regret.mean_cumulative_regret()
        for s in seeds
    ]
    return np.mean(curves, axis=0)


def test_fed_ucb_learns_on_two_groups():
    """Averaged over three instances and reward seeds (T = 4096, M = 20, K = 5, d = 3). Measured:
    fed_ucb about 4.5 per client, local_ucb about 43, uniform random about 2200; count pooling,
    which mixes the two populations, several hundred (linear)."""
    T, seeds = 4096, range(3)
    fed, local, counts, random = [], [], [], []
    for seed in seeds:
        instance = two_groups(TwoGroupsParams(seed=seed))
        fed.append(mean_curve(instance, "fed_ucb", T, [seed]))
        local.append(mean_curve(instance, "local_ucb", T, [seed]))
        counts.append(mean_curve(instance, "fed_ucb", T, [seed], MODES["counts"]))
        random.append(instance.gaps().mean() * np.arange(1, T + 1))
    fed, local, counts, random = (np.mean(c, axis=0) for c in (fed, local, counts, random))
    print(
        f"R(T)/M: fed_ucb {fed[-1]:.2f} (R(T/2) {fed[T // 2 - 1]:.2f}), local_ucb "
        f"{local[-1]:.2f}, fed_ucb counts {counts[-1]:.2f}, uniform random {random[-1]:.2f}"
    )
    assert fed[-1] < 0.01 * random[-1]
    assert fed[-1] < 0.25 * local[-1]
    # sublinear: the second half of the horizon adds much less than the first half
    assert fed[-1] - fed[T // 2 - 1] < 0.25 * fed[T // 2 - 1]
    # count pooling is the wrong model here: it must do clearly worse (the test can tell)
    assert counts[-1] > 10 * fed[-1]


def test_count_pooling_learns_when_means_are_common():
    T = 4096
    instance = homogeneous_instance()
    fed = mean_curve(instance, "fed_ucb", T, range(3), MODES["counts"])
    local = mean_curve(instance, "local_ucb", T, range(3))
    random = instance.gaps().mean() * T
    print(
        f"homogeneous R(T)/M: fed_ucb counts {fed[-1]:.2f}, local_ucb {local[-1]:.2f}, "
        f"random {random:.2f}"
    )
    assert fed[-1] < 0.5 * local[-1]
    assert fed[-1] < 0.01 * random
