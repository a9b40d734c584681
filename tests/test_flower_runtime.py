"""FlowerGridRuntime against a fake Grid (no Ray, no network): the protocol over Flower messages,
and every failure path names the node or the clients at fault."""

import uuid

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Error, Message, RecordDict

from fedbandit.federation.runtime import run_federation
from fedbandit.flower.apps import FlowerGridRuntime, FlowerJob, discover_nodes
from fedbandit.flower.codec import decode, encode
from fedbandit.instances import PaperSyntheticParams, paper_synthetic
from fedbandit.simulation import build_federation, simulate

INSTANCE = paper_synthetic(PaperSyntheticParams(num_clients=6, num_arms=3, dim=2, seed=3))


@pytest.fixture(autouse=True)
def flower_identity():
    """Flower messages need the task identity a real runtime sets (run, node and task ids)."""
    from flwr.supercore.task_identity import TaskIdentity

    names = ("_run_id", "_node_id", "_task_id")
    saved = {name: TaskIdentity.__dict__.get(name) for name in names}
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = 1
    TaskIdentity.task_id = 1
    yield
    for name, value in saved.items():
        setattr(TaskIdentity, name, value)


class FakeGrid:
    """Nodes are functions from a pushed message to a reply (or None: never answers)."""

    def __init__(self, nodes):
        self.nodes = nodes
        self.inbox = {}

    def get_node_ids(self):
        return list(self.nodes)

    def push_messages(self, messages):
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            self.inbox[message.metadata.message_id] = message
            ids.append(message.metadata.message_id)
        return ids

    def pull_messages(self, message_ids):
        replies = []
        for mid in message_ids:
            message = self.inbox[mid]
            reply = self.nodes[message.metadata.dst_node_id](message)
            if reply is not None:
                replies.append(reply)
        return replies


def client_node(ids, algorithm="fedpe", horizon=300):
    """A node that runs the real client logic for ``ids``, as the ClientApp does."""
    _, groups = build_federation(INSTANCE, algorithm, horizon, [0, 0], client_ids=np.array(ids))
    logic = groups[0]

    def answer(message):
        kind = message.metadata.message_type
        if kind == "query.hello":
            return Message(
                RecordDict({"ids": ArrayRecord({"client_ids": Array(logic.client_ids)})}),
                reply_to=message,
            )
        return Message(encode(logic.handle(decode(message.content))), reply_to=message)

    return answer, logic


def test_protocol_over_flower_messages_matches_the_in_process_run():
    nodes, logics = {}, {}
    for node, ids in ((11, [0, 1, 2]), (12, [3]), (13, [4, 5])):
        nodes[node], logics[node] = client_node(ids)
    grid = FakeGrid(nodes)
    ranges = discover_nodes(grid, FlowerJob({}, "fedpe", (0, 0), 3, start_deadline=5), 6)
    assert {k: v.tolist() for k, v in ranges.items()} == {11: [0, 1, 2], 12: [3], 13: [4, 5]}

    class Runtime(FlowerGridRuntime):
        def regret_records(self):
            return [logic.regret_record() for logic in logics.values()]

    server, _ = build_federation(INSTANCE, "fedpe", 300, [0, 0])
    outcome = run_federation(server, Runtime(grid, ranges, timeout=5, poll_seconds=0.001))
    local = simulate(INSTANCE, "fedpe", 300, [0, 0])
    np.testing.assert_array_equal(outcome.regret.increment_diff, local.regret.increment_diff)
    assert outcome.ledger.totals() == local.totals


def one_round(nodes, ranges):
    server, _ = build_federation(INSTANCE, "fedpe", 300, [0, 0])
    runtime = FlowerGridRuntime(FakeGrid(nodes), ranges, timeout=0.3, poll_seconds=0.01)
    return runtime.exchange(server.configure())


def test_an_error_reply_names_the_node():
    good, _ = client_node([0, 1, 2])

    def broken(message):
        return Message(Error(code=2, reason="ClientApp raised"), reply_to=message)

    with pytest.raises(RuntimeError, match="node 22 failed: ClientApp raised"):
        one_round({21: good, 22: broken}, {21: np.arange(3), 22: np.arange(3, 6)})


def test_a_silent_node_times_out_by_name():
    good, _ = client_node([0, 1, 2])
    with pytest.raises(TimeoutError, match=r"nodes \[32\]"):
        one_round({31: good, 32: lambda message: None}, {31: np.arange(3), 32: np.arange(3, 6)})


@pytest.mark.parametrize("fault", ["nan", "ids", "round"])
def test_a_malformed_reply_is_rejected_before_aggregation(fault):
    answer, _ = client_node([3, 4, 5])

    def faulty(message):
        reply = decode(answer(message).content)
        if fault == "nan":
            reply.fields["estimate"][0, 0, 0] = np.nan
        elif fault == "ids":
            reply = type(reply)(
                reply.kind,
                reply.round,
                reply.client_ids + 10,
                reply.fields,
                reply.sparse,
                reply.known,
                reply.meta,
            )
        else:
            reply = type(reply)(
                reply.kind,
                reply.round + 1,
                reply.client_ids,
                reply.fields,
                reply.sparse,
                reply.known,
                reply.meta,
            )
        return Message(encode(reply), reply_to=message)

    good, _ = client_node([0, 1, 2])
    with pytest.raises(RuntimeError, match="node 42 sent a malformed reply"):
        one_round({41: good, 42: faulty}, {41: np.arange(3), 42: np.arange(3, 6)})


def test_discovery_refuses_overlaps_and_names_missing_clients():
    a, _ = client_node([0, 1, 2])
    b, _ = client_node([2, 3])
    job = FlowerJob({}, "fedpe", (0, 0), 2, start_deadline=0.5)
    with pytest.raises(RuntimeError, match=r"served by two nodes: \[2\]"):
        discover_nodes(FakeGrid({1: a, 2: b}), job, 6)
    with pytest.raises(TimeoutError, match=r"no node serves clients \[3, 4, 5\]"):
        discover_nodes(FakeGrid({1: a}), job, 6)
