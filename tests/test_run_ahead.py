"""Run-ahead (``fedbandit.federation.run_ahead``): many logical exchanges per delivered message
give bit-identical regret and communication records, for every algorithm, grouping, budget and
arrival order; the per-step protocols need about as many deliveries as communication events; a
wrong ``quiet`` hint costs rewinds, never a wrong result."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedbandit.config import load_experiment
from fedbandit.federation.messages import Message
from fedbandit.federation.run_ahead import ReplyBuffer, RunAheadRuntime, empty_round
from fedbandit.federation.runtime import InProcessRuntime, run_federation
from fedbandit.registry import build_instance
from fedbandit.simulation import build_federation

CONTEXTUAL = ["dislinucb", "async_linucb", "fedlinucb", "central_linucb", "hlinucb"]


def instance_of(arrival: str = "synchronous"):
    extra = ["instance.participation=1.0"] if arrival != "synchronous" else []
    extra.append("instance.heterogeneity=0.4")  # H-LinUCB's weights and its switch at tau
    config = load_experiment(
        "contextual_tiny", [f'instance.arrival="{arrival}"', "instance.num_clients=6", *extra]
    )
    return build_instance(config.instance)


def run(instance, algorithm, runtime_of, horizon=300, group_size=2, seed=3):
    server, groups = build_federation(
        instance, algorithm, horizon, [0, seed], group_size=group_size
    )
    runtime = runtime_of(groups)
    return run_federation(server, runtime), runtime


def assert_identical(a, b):
    np.testing.assert_array_equal(a.regret.increment_diff, b.regret.increment_diff)
    np.testing.assert_array_equal(a.regret.client_regret, b.regret.client_regret)
    np.testing.assert_array_equal(a.regret.client_pulls, b.regret.client_pulls)
    pd.testing.assert_frame_equal(a.ledger.frame(), b.ledger.frame())
    assert a.ledger.totals() == b.ledger.totals()
    assert (a.status, a.dropped) == (b.status, b.dropped)


@pytest.mark.parametrize("arrival", ["synchronous", "sequential", "round_robin"])
@pytest.mark.parametrize("algorithm", CONTEXTUAL)
def test_run_ahead_gives_the_per_step_results(algorithm, arrival):
    instance = instance_of(arrival)
    plain, _ = run(instance, algorithm, InProcessRuntime, horizon=200)
    for budget, group_size in ((1, 2), (7, 2), (1000, 6), (50, 1)):
        ahead, runtime = run(
            instance,
            algorithm,
            lambda groups, b=budget: RunAheadRuntime(groups, b),
            horizon=200,
            group_size=group_size,
        )
        assert_identical(plain, ahead)
        if budget == 1:
            assert runtime.buffer.delivered == runtime.buffer.served


@pytest.mark.parametrize("algorithm", ["dislinucb", "async_linucb", "fedlinucb"])
def test_deliveries_follow_the_communication_events(algorithm):
    """With an unlimited budget a message is delivered about once per communication event
    (a sync, an upload, a download): far fewer than the logical exchanges."""
    instance = instance_of("sequential")
    result, runtime = run(instance, algorithm, lambda g: RunAheadRuntime(g, 10**6), horizon=600)
    frame = result.ledger.frame()
    events = frame.loc[frame["messages"] > 0, "round"].nunique()
    assert runtime.buffer.served >= 600
    assert runtime.buffer.delivered <= 2 * events + 2
    assert runtime.buffer.delivered < runtime.buffer.served / 5


def test_central_reference_and_fedpe_never_run_ahead():
    instance = instance_of()
    _, runtime = run(instance, "central_linucb", lambda g: RunAheadRuntime(g, 100))
    assert runtime.buffer.delivered == runtime.buffer.served
    config = load_experiment("fedpe_tiny", ["instance.num_clients=4", "horizon=256"])
    paper = build_instance(config.instance)
    plain, _ = run(paper, "fedpe", InProcessRuntime, horizon=256)
    ahead, runtime = run(paper, "fedpe", lambda g: RunAheadRuntime(g, 100), horizon=256)
    assert_identical(plain, ahead)
    assert runtime.buffer.delivered == runtime.buffer.served


def test_a_wrong_quiet_hint_costs_rewinds_not_results(monkeypatch):
    """Every reply claimed quiet, even those after which the server acts: the groups run ahead
    on empty rounds the server never sends; the buffer notices, they rewind, results hold."""
    from fedbandit.algorithms.federated_linucb import FederatedRidgeClientBase

    instance = instance_of()
    monkeypatch.setattr(FederatedRidgeClientBase, "quiet", lambda self, reply: True)
    for algorithm in ("dislinucb", "central_linucb"):
        plain, _ = run(instance, algorithm, InProcessRuntime)
        ahead, runtime = run(instance, algorithm, lambda g: RunAheadRuntime(g, 64))
        assert_identical(plain, ahead)
    # the centralised server downloads after every round: every assumed empty round was wrong
    assert runtime.buffer.delivered == runtime.buffer.served


def test_reply_buffer_hands_out_only_the_assumed_empty_rounds():
    ids = np.array([0, 1])
    first = Message("round", 4, ids, {"x": np.ones((2, 1))})

    def reply(r):
        return Message("upload", r, ids, {"send": np.zeros((2, 1), bool)})

    buffer = ReplyBuffer()
    joined = buffer.store(first, [[reply(4), reply(5), reply(6)], [reply(4), reply(5)]])
    assert joined.round == 4 and buffer.consumed == 1
    assert buffer.take(empty_round(first)).round == 5  # both groups ran exchange 5
    assert buffer.consumed == 2
    assert buffer.take(Message("round", 6, ids, {})) is None  # group 2 stopped at 5
    buffer.store(first, [[reply(4), reply(5)], [reply(4), reply(5)]])
    other = Message("round", 5, ids, {"gram": np.ones((2, 1))})  # not the empty round
    assert buffer.take(other) is None and buffer.consumed == 1
