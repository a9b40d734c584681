"""Client-failure policies of ``run_federation``: "abort" keeps the results so far, "drop" goes on
without the lost clients. Failures are injected by a test-only wrapper around the in-process
runtime (the Flower runtime's own failure detection is tested in test_flower_runtime.py)."""

import numpy as np
import pytest

from fedbandit.contextual.instances import ContextualParams, contextual_instance
from fedbandit.design import certificate
from fedbandit.environment import RegretRecord
from fedbandit.federation.messages import Message
from fedbandit.federation.protocol import ServerLogic
from fedbandit.federation.runtime import (
    ClientFailure,
    InProcessRuntime,
    Runtime,
    describe_clients,
    run_federation,
)
from fedbandit.instances import (
    PaperSyntheticParams,
    SyntheticParams,
    paper_synthetic,
    synthetic,
)
from fedbandit.simulation import build_federation

INSTANCE = paper_synthetic(PaperSyntheticParams(num_clients=6, num_arms=3, dim=2, seed=3))
SHARED = synthetic(SyntheticParams(num_clients=6, num_arms=4, dim=3, seed=5, shared_parameter=True))
CONTEXTUAL = contextual_instance(
    ContextualParams(setting="shared", num_clients=6, num_arms=4, dim=3, seed=2)
)
HORIZON = 300


class FaultyRuntime(Runtime):
    """In-process client groups; the groups listed in ``faults[round]`` die in that round: they
    never see its message and are lost (as a Flower node is) with the joined replies of the
    others. Records every message it was asked to deliver."""

    def __init__(self, groups, faults):
        self.groups, self.faults = groups, faults
        self.inner = InProcessRuntime(groups)
        self.lost: set[int] = set()
        self.addressed: dict[int, np.ndarray] = {}

    def exchange(self, message):
        self.addressed[message.round] = message.client_ids.copy()
        dying = [g for g in self.faults.get(message.round, ()) if g not in self.lost]
        if not dying:
            return self.inner.exchange(message)
        self.lost.update(dying)
        lost = np.concatenate([self.groups[g].client_ids for g in dying])
        keep = np.flatnonzero(~np.isin(message.client_ids, lost))
        partial = self.inner.exchange(message.select(keep)) if len(keep) else None
        raise ClientFailure(lost, {f"group {g}": "killed by the test" for g in dying}, partial)

    def regret_records(self):
        return [g.regret_record() for i, g in enumerate(self.groups) if i not in self.lost]

    def drop(self, client_ids):
        self.inner.drop(client_ids)


def faulty_run(algorithm, faults, policy, instance=INSTANCE, horizon=HORIZON):
    """Groups of two clients: group g holds clients 2g and 2g + 1."""
    server, groups = build_federation(instance, algorithm, horizon, [0, 0], group_size=2)
    runtime = FaultyRuntime(groups, faults)
    return server, runtime, run_federation(server, runtime, policy)


def reference_records(algorithm, rounds, keep):
    """The records of groups ``keep`` after the first ``rounds`` rounds of an undisturbed run."""
    server, groups = build_federation(INSTANCE, algorithm, HORIZON, [0, 0], group_size=2)
    runtime = InProcessRuntime(groups)
    for _ in range(rounds):
        server.aggregate(runtime.exchange(server.configure()))
    return RegretRecord.merge([groups[g].regret_record() for g in keep])


def complete_ledger(algorithm="fedpe"):
    server, groups = build_federation(INSTANCE, algorithm, HORIZON, [0, 0], group_size=2)
    return run_federation(server, InProcessRuntime(groups)).ledger.frame()


def assert_same_record(actual, expected):
    np.testing.assert_array_equal(actual.client_ids, expected.client_ids)
    np.testing.assert_array_equal(actual.increment_diff, expected.increment_diff)
    np.testing.assert_array_equal(actual.client_regret, expected.client_regret)
    np.testing.assert_array_equal(actual.client_pulls, expected.client_pulls)


def test_an_undisturbed_run_is_complete():
    _, _, result = faulty_run("fedpe", {}, "drop")
    assert (result.status, result.failure, result.dropped, result.complete) == (
        "complete",
        None,
        {},
        True,
    )
    np.testing.assert_array_equal(result.regret.client_ids, np.arange(6))


def test_abort_keeps_the_results_so_far():
    server, runtime, result = faulty_run("fedpe", {3: [1]}, "abort")
    assert result.status == "aborted" and not result.complete
    assert result.failure == "round 3: lost clients 2-3 (group 1: killed by the test)"
    assert result.dropped == {}
    assert sorted(runtime.addressed) == [0, 1, 2, 3]  # nothing after the failed round
    # the survivors' regret as it was when the run stopped (round 3 eliminates: no pulls)
    assert_same_record(result.regret, reference_records("fedpe", 3, keep=[0, 2]))
    np.testing.assert_array_equal(result.regret.client_ids, [0, 1, 4, 5])
    curve = result.regret.mean_cumulative_regret()
    assert curve.shape == (HORIZON,)
    assert np.all(
        curve[result.regret.client_pulls.max() - 1 :] == curve[-1]
    )  # flat after the abort
    # the ledger up to the failure: the failed round's downlink went to all 6 clients, 4 answered
    frame, full = result.ledger.frame(), complete_ledger()
    assert frame["round"].max() == 3
    before = full[full["round"] < 3].reset_index(drop=True)
    assert frame[frame["round"] < 3].reset_index(drop=True).equals(before)
    last = frame[frame["round"] == 3].set_index("direction")
    assert last.loc["downlink", "messages"] == 6
    assert last.loc["uplink", "messages"] == 4
    assert last.loc["uplink", "scalars"] == 4 * INSTANCE.num_arms  # an active set per survivor
    # the server never saw the failed round's replies
    assert server.stage == "eliminate" and len(server.design_log) == 1


@pytest.mark.parametrize("fail_round", [2, 3])
def test_drop_continues_fedpe_without_the_lost_clients(fail_round):
    """Round 2 explores (the lost clients' reports never arrive: the phase is aggregated from the
    survivors), round 3 eliminates (the design is solved over the survivors' active sets)."""
    server, runtime, result = faulty_run("fedpe", {fail_round: [1]}, "drop")
    assert result.status == "complete"
    assert result.dropped == {2: fail_round, 3: fail_round}
    assert result.failure == f"round {fail_round}: lost clients 2-3 (group 1: killed by the test)"
    rounds = sorted(runtime.addressed)
    assert rounds == list(range(17))  # the run went to its end
    for r in rounds:
        expected = [0, 1, 2, 3, 4, 5] if r <= fail_round else [0, 1, 4, 5]
        np.testing.assert_array_equal(runtime.addressed[r], expected)
    # the server's client set and every design after the drop cover the survivors only
    np.testing.assert_array_equal(server.clients, [0, 1, 4, 5])
    designs = [(entry["phase"], entry["clients"]) for entry in server.design_log]
    assert designs == [(p, 6 if 2 * p - 1 < fail_round else 4) for p in range(1, 9)]
    survivors = np.array([0, 1, 4, 5])
    assert not server.active[[2, 3]].any() and not server.weights[[2, 3]].any()
    gap, _ = certificate(
        server.weights[survivors],
        server.vectors[survivors],
        server.active[survivors],
        server.group,
    )
    assert 0 <= gap <= server.params.design_tolerance
    # the regret record covers exactly the survivors, who played the whole horizon
    np.testing.assert_array_equal(result.regret.client_ids, survivors)
    np.testing.assert_array_equal(result.regret.client_pulls, [HORIZON] * 4)
    assert_same_record(
        result.regret, RegretRecord.merge([runtime.groups[g].regret_record() for g in (0, 2)])
    )
    # ledger: the failed round's uplink counts the survivors; later rounds address 4 clients
    frame = result.ledger.frame().set_index(["round", "direction"])
    assert frame.loc[(fail_round, "downlink"), "messages"] == 6
    assert frame.loc[(fail_round, "uplink"), "messages"] == 4
    assert (frame.loc[fail_round + 1 :, "messages"] == 4).all()


def test_drop_with_the_shared_parameter():
    server, runtime, result = faulty_run("fedpe_shared", {1: [0, 2]}, "drop", instance=SHARED)
    assert result.status == "complete"
    assert result.dropped == dict.fromkeys([0, 1, 4, 5], 1)
    assert "lost clients 0-1, 4-5" in result.failure
    np.testing.assert_array_equal(server.clients, [2, 3])
    assert {entry["clients"] for entry in server.design_log} == {2}
    np.testing.assert_array_equal(result.regret.client_ids, [2, 3])
    np.testing.assert_array_equal(result.regret.client_pulls, [HORIZON, HORIZON])
    assert all(np.array_equal(ids, [2, 3]) for r, ids in runtime.addressed.items() if r > 1)
    # one parameter estimated from the survivors' data only
    assert server.theta.shape == (1, SHARED.dim) and np.all(np.isfinite(server.theta))


def test_drop_under_a_contextual_protocol_and_without_communication():
    server, runtime, result = faulty_run(
        "fedlinucb", {5: [2]}, "drop", instance=CONTEXTUAL, horizon=40
    )
    assert (result.status, result.dropped) == ("complete", {4: 5, 5: 5})
    np.testing.assert_array_equal(server.clients, [0, 1, 2, 3])
    assert all(np.array_equal(ids, [0, 1, 2, 3]) for r, ids in runtime.addressed.items() if r > 5)
    np.testing.assert_array_equal(result.regret.client_pulls, [40] * 4)
    _, _, local = faulty_run("local_ucb", {0: [0]}, "drop")
    assert (local.status, local.dropped) == ("complete", {0: 0, 1: 0})
    np.testing.assert_array_equal(local.regret.client_ids, [2, 3, 4, 5])
    np.testing.assert_array_equal(local.regret.client_pulls, [HORIZON] * 4)


def test_losing_every_client_ends_the_run_aborted_with_an_empty_record():
    server, runtime, result = faulty_run("fedpe", {1: [0, 1], 3: [2]}, "drop")
    assert result.status == "aborted"
    assert result.dropped == {**dict.fromkeys(range(4), 1), 4: 3, 5: 3}
    assert result.failure.endswith("no client is left to report its regret")
    assert sorted(runtime.addressed) == [0, 1, 2, 3]
    assert server.configure() is None
    assert len(result.regret.client_ids) == 0
    assert result.regret.mean_cumulative_regret().shape == (0,)
    # nobody answered round 3: its downlink was sent, no uplink arrived
    last = result.ledger.frame().query("round == 3")
    assert last["direction"].tolist() == ["downlink"]


def test_regret_records_merge_any_subset_of_clients():
    server, groups = build_federation(INSTANCE, "fedpe", HORIZON, [0, 0], group_size=2)
    run_federation(server, InProcessRuntime(groups))
    subset = RegretRecord.merge([groups[2].regret_record(), groups[0].regret_record()])
    np.testing.assert_array_equal(subset.client_ids, [0, 1, 4, 5])
    curve = subset.mean_cumulative_regret()
    assert curve[-1] == pytest.approx(subset.client_regret.mean(), rel=1e-12)
    with pytest.raises(ValueError, match="no regret records"):
        RegretRecord.merge([])


class OneShotServer(ServerLogic):
    """A server that has not implemented ``drop_clients``."""

    def configure(self):
        return None

    def aggregate(self, reply: Message) -> None:
        pass


def test_drop_needs_a_server_and_a_runtime_that_support_it():
    _, groups = build_federation(INSTANCE, "fedpe", HORIZON, [0, 0])
    with pytest.raises(NotImplementedError, match="OneShotServer cannot drop clients"):
        run_federation(OneShotServer(), InProcessRuntime(groups), "drop")
    with pytest.raises(NotImplementedError, match="on_client_failure='abort'"):
        OneShotServer().drop_clients(np.array([0]))

    class Fixed(Runtime):
        def exchange(self, message):
            raise AssertionError

        def regret_records(self):
            return []

    server, _ = build_federation(INSTANCE, "fedpe", HORIZON, [0, 0])
    with pytest.raises(NotImplementedError, match="Fixed cannot drop clients"):
        run_federation(server, Fixed(), "drop")
    # "abort" needs neither
    result = run_federation(OneShotServer(), InProcessRuntime(groups))
    assert result.status == "complete"


def test_an_unknown_policy_is_refused_by_name():
    server, groups = build_federation(INSTANCE, "fedpe", HORIZON, [0, 0])
    with pytest.raises(ValueError, match=r"one of 'abort', 'drop', got 'ignore'"):
        run_federation(server, InProcessRuntime(groups), "ignore")


def test_dropping_names_the_clients_and_keeps_groups_whole():
    server, groups = build_federation(INSTANCE, "fedpe", HORIZON, [0, 0], group_size=2)
    runtime = InProcessRuntime(groups)
    with pytest.raises(ValueError, match="group of clients 2-3 cannot drop only 3"):
        runtime.drop(np.array([3]))
    runtime.drop(np.array([2, 3]))
    with pytest.raises(ValueError, match="addresses clients no group serves"):
        runtime.exchange(server.configure())
    assert [r.client_ids.tolist() for r in runtime.regret_records()] == [[0, 1], [4, 5]]
    server.drop_clients(np.array([2, 3]))
    with pytest.raises(ValueError, match=r"cannot drop clients \[3\]: it does not address"):
        server.drop_clients(np.array([3]))
    assert describe_clients([5, 0, 1, 2, 7, 8]) == "0-2, 5, 7-8"


def test_the_ledgers_t_never_falls_when_clients_that_pulled_more_are_lost(tmp_path):
    """A drop can lower the mean pull count of the clients still answering (10.95 -> 10.93 on a
    deployment): ``t`` keeps its last value, as after a round nobody answered, so a finished
    run's ``comm.csv`` passes the reader's check for hand-edited files."""
    from fedbandit.federation.runtime import CommunicationLedger
    from fedbandit.results.reader import _read_table

    ledger = CommunicationLedger()

    def exchange(round_, clients, pulls):
        ids = np.asarray(clients)
        down = Message("round", round_, ids, {"x": np.ones((len(ids), 1))})
        reply = Message("step", round_, ids, {"y": np.ones((len(ids), 1))}, meta={"pulls": pulls})
        ledger.record_exchange(down, reply)

    exchange(0, [0, 1, 2, 3], np.array([12, 12, 10, 10]))  # mean 11
    exchange(1, [2, 3], np.array([10, 10]))  # clients 0-1 lost: mean 10
    ledger.record_exchange(Message("round", 2, np.array([2, 3]), {"x": np.ones((2, 1))}), None)
    exchange(3, [2, 3], np.array([13, 13]))
    frame = ledger.frame()
    assert frame["t"].tolist() == [11.0, 11.0, 11.0, 11.0, 11.0, 13.0, 13.0]
    path = tmp_path / "seed_0.comm.csv"
    frame.to_csv(path, index=False)
    assert _read_table(path, ["round", "direction", "t", "scalars"])["t"].is_monotonic_increasing
