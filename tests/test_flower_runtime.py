"""FlowerGridRuntime against a fake Grid (no Ray, no network): the protocol over Flower messages,
and every failure path (error reply, silence, malformed reply) loses the node by name under both
client-failure policies, without the bad data ever reaching the server."""

import time
import uuid
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, RecordDict
from flwr.supercore.inflatable.inflatable_utils import ObjectPushError

from fedbandit.config import load_experiment
from fedbandit.errors import DeploymentError
from fedbandit.federation.messages import Message as BanditMessage
from fedbandit.federation.runtime import ClientFailure, run_federation
from fedbandit.flower import grid_runtime
from fedbandit.flower.apps import FlowerJob, answered_once
from fedbandit.flower.codec import (
    REGRET_PIECE_KEY,
    MalformedReplyError,
    answer_regret_query,
    clear_group_state,
    decode,
    decode_regret,
    decode_regret_piece,
    encode,
    encode_regret,
    regret_query,
)
from fedbandit.flower.grid_runtime import (
    ASK_AGAIN_TIMES,
    PUSH_AGAIN_TIMES,
    FlowerGridRuntime,
    LostPushError,
    discover_nodes,
    push_whole,
)
from fedbandit.flower.internals import pull_backoff
from fedbandit.instances import PaperSyntheticParams, paper_synthetic
from fedbandit.runspec import RunSpec, RuntimeOptions
from fedbandit.simulation import build_federation, simulate

INSTANCE = paper_synthetic(PaperSyntheticParams(num_clients=6, num_arms=3, dim=2, seed=3))


def job_with(**options) -> FlowerJob:
    """A job with these runtime options (discovery reads only its deadlines and poll)."""
    spec = RunSpec(
        experiment=load_experiment("fedpe_tiny"),
        algorithm="fedpe",
        seed=0,
        options=RuntimeOptions(runtime="flower-sim", **options),
    )
    return FlowerJob(spec, num_nodes=2, poll_seconds=0.001)


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
    ranges = discover_nodes(grid, job_with(start_deadline=5), 6)
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


def test_a_lost_node_is_a_client_failure_with_the_other_nodes_replies():
    good, _ = client_node([0, 1, 2])
    with pytest.raises(ClientFailure) as caught:
        one_round({31: good, 32: lambda message: None}, {31: np.arange(3), 32: np.arange(3, 6)})
    failure = caught.value
    np.testing.assert_array_equal(failure.lost_clients, [3, 4, 5])
    assert failure.reasons == {"node 32 (clients 3-5)": "no reply within 0.3 s"}
    assert failure.partial.kind == "report" and failure.partial.round == 0
    np.testing.assert_array_equal(failure.partial.client_ids, [0, 1, 2])


def regret_reply(logic, message):
    """The ClientApp's answer to ``query.regret`` (the piece of the curve it asks for)."""
    return Message(answer_regret_query(logic.regret_record(), message.content), reply_to=message)


def with_reply(reply, **changes):
    fields = {
        "kind": reply.kind,
        "round": reply.round,
        "client_ids": reply.client_ids,
        "fields": dict(reply.fields),
        "sparse": reply.sparse,
        "known": reply.known,
        "meta": reply.meta,
    }
    return BanditMessage(**{**fields, **changes})


def tamper(reply, fault):
    """A malformed version of a correct ``report`` (explore) or ``active_set`` reply."""
    fields = dict(reply.fields)
    if fault == "nan":
        fields["estimate"] = fields["estimate"].copy()
        fields["estimate"][0, 0, 0] = np.nan
    elif fault == "ids":
        return with_reply(reply, client_ids=reply.client_ids + 10)
    elif fault == "round":
        return with_reply(reply, round=reply.round + 1)
    elif fault == "kind":
        return with_reply(reply, kind="done")
    elif fault == "shape":  # one more coordinate than d
        fields["estimate"] = np.concatenate([fields["estimate"], fields["estimate"][..., :1]], -1)
    elif fault == "dtype":
        fields["counts"] = fields["counts"].astype(np.float64)
    elif fault == "mask":
        fields["pulled"] = fields["pulled"].astype(np.int8)
    elif fault == "echo":  # the active set of an eliminate reply, with one arm too many
        fields["active"] = np.concatenate([fields["active"], fields["active"][:, :1]], 1)
    return with_reply(reply, fields=fields)


def faulty_node(ids, fault, at_round, stage="train.step"):
    """A client node that fails at round ``at_round`` (or at the regret query): an error reply
    from the SuperLink (as Flower makes for a dead node), silence, or a tampered reply."""
    answer, logic = client_node(ids)

    def node(message):
        kind = message.metadata.message_type
        if kind == "query.regret" and stage != "query.regret":
            return regret_reply(logic, message)
        hit = kind == stage == "query.regret" or (
            kind == stage and decode(message.content).round == at_round
        )
        if not hit:
            return answer(message)
        if fault == "error":
            reply = Message(Error(code=2, reason="node died"), reply_to=message)
            reply.metadata.__dict__["_src_node_id"] = 1
            return reply
        if fault == "upload":  # what Flower's ServerApp makes of a reply whose objects never came
            unavailable = "Reply message objects are unavailable."
            error = Error(pull_backoff.MESSAGE_UNAVAILABLE, unavailable)
            reply = Message(error, reply_to=message)
            reply.metadata.__dict__["_src_node_id"] = 1
            return reply
        if fault == "silent":
            return None
        reply = tamper(decode(answer(message).content), fault)
        return Message(encode(reply), reply_to=message)

    return node, logic


def good_node(ids):
    answer, logic = client_node(ids)

    def node(message):
        if message.metadata.message_type == "query.regret":
            return regret_reply(logic, message)
        return answer(message)

    return node, logic


class CountingGrid(FakeGrid):
    """Remembers every message pushed: (node, message type, round or None)."""

    def __init__(self, nodes):
        super().__init__(nodes)
        self.pushed = []
        self.batches = []

    def push_messages(self, messages):
        self.batches.append(len(messages))
        for m in messages:
            is_step = m.metadata.message_type == "train.step"
            round_ = decode(m.content).round if is_step else None
            self.pushed.append((m.metadata.dst_node_id, m.metadata.message_type, round_))
        return super().push_messages(messages)


def flower_run(nodes, ranges, policy, timeout=2.0, grid=None, piece_values=None):
    """Fed-PE over the fake grid; every reply the server aggregates is kept."""
    grid = CountingGrid(nodes) if grid is None else grid
    server, _ = build_federation(INSTANCE, "fedpe", 300, [0, 0])
    seen = []
    aggregate = server.aggregate

    def spy(reply):
        seen.append(reply)
        aggregate(reply)

    server.aggregate = spy
    runtime = FlowerGridRuntime(grid, ranges, timeout=timeout, poll_seconds=0.001)
    if piece_values is not None:
        runtime.regret_piece_values = piece_values
    result = run_federation(server, runtime, policy)
    return result, seen, grid, runtime


THREE = {21: np.arange(0, 2), 22: np.arange(2, 4), 23: np.arange(4, 6)}
REASONS = {
    "error": "error reply (code 2): node died",
    "upload": "no reply: the node stopped while uploading it (Reply message objects are "
    "unavailable.)",
    "silent": "no reply within 0.2 s",
    "nan": "malformed reply: field 'estimate' holds NaN or infinite values",
    "ids": "malformed reply: replies for clients [14, 15], expected [4, 5]",
    "round": "malformed reply: reply for round 3, expected 2",
    "kind": "malformed reply: kind 'done' (majority: 'report')",
    "shape": "malformed reply: fields 'estimate' of a 'report' reply is <f8 of shape (n, 3, 3); "
    "in earlier replies it was <f8 of shape (n, 3, 2)",
    "dtype": "malformed reply: fields 'counts' of a 'report' reply is <f8 of shape (n, 3); in "
    "earlier replies it was <i4 of shape (n, 3)",
    "mask": "malformed reply: sparse field 'estimate' of shape (2, 3, 2) does not fit its mask "
    "'pulled' of shape (2, 3) and dtype int8",
    "echo": "malformed reply: field 'active' has shape (2, 4), was sent as (2, 3)",
}


def assert_never_aggregated(seen, bad_ids, from_round):
    for reply in seen:
        for value in reply.fields.values():
            assert np.all(np.isfinite(value))
        assert reply.kind in ("report", "active_set")
        assert set(reply.client_ids.tolist()) <= set(range(6))
        if reply.round >= from_round:
            assert not np.isin(reply.client_ids, bad_ids).any()


@pytest.mark.parametrize("fault", list(REASONS))
@pytest.mark.parametrize("policy", ["abort", "drop"])
def test_a_failing_node_is_lost_and_never_reaches_aggregation(fault, policy):
    at_round = 3 if fault == "echo" else 2
    bad, _ = faulty_node([4, 5], fault, at_round)
    nodes = {21: good_node([0, 1])[0], 22: good_node([2, 3])[0], 23: bad}
    timeout = 0.2 if fault == "silent" else 2.0
    result, seen, grid, runtime = flower_run(nodes, THREE, policy, timeout)
    reason = f"round {at_round}: lost clients 4-5 (node 23 (clients 4-5): {REASONS[fault]})"
    assert result.failure == reason
    assert_never_aggregated(seen, [4, 5], at_round)
    steps_23 = [r for node, kind, r in grid.pushed if node == 23 and kind == "train.step"]
    # never addressed after its failure; a reply lost in its upload is asked for again first
    again = [at_round] * ASK_AGAIN_TIMES if fault == "upload" else []
    assert steps_23 == list(range(at_round + 1)) + again
    assert (23, "query.regret", None) not in grid.pushed
    if policy == "abort":
        assert result.status == "aborted" and result.dropped == {}
        assert [r.round for r in seen] == list(range(at_round))
        np.testing.assert_array_equal(result.regret.client_ids, [0, 1, 2, 3])
        assert 23 in runtime.lost
    else:
        assert result.status == "complete"
        assert result.dropped == {4: at_round, 5: at_round}
        assert [r.round for r in seen] == list(range(17))
        assert seen[at_round].client_ids.tolist() == [0, 1, 2, 3]
        np.testing.assert_array_equal(result.regret.client_ids, [0, 1, 2, 3])
        np.testing.assert_array_equal(result.regret.client_pulls, [300] * 4)
        assert list(runtime.ranges) == [21, 22] and runtime.lost == {}
        np.testing.assert_array_equal(runtime.dropped[23], [4, 5])


def test_the_first_round_is_checked_against_the_majority_and_a_tie_rejects_both():
    nodes = {21: good_node([0, 1])[0], 22: good_node([2, 3])[0]}
    nodes[23], _ = faulty_node([4, 5], "shape", 0)
    result, seen, _, _ = flower_run(nodes, THREE, "drop")
    assert result.dropped == {4: 0, 5: 0} and result.status == "complete"
    assert "fields 'estimate' <f8 of shape (n, 3, 3) (majority: <f8 of shape (n, 3, 2))" in (
        result.failure
    )
    assert_never_aggregated(seen, [4, 5], 0)
    # two nodes that disagree in round 0: nothing says which is right, both are lost
    two = {21: good_node([0, 1, 2])[0], 22: faulty_node([3, 4, 5], "shape", 0)[0]}
    result, seen, _, _ = flower_run(two, {21: np.arange(3), 22: np.arange(3, 6)}, "drop")
    assert result.status == "aborted" and seen == []
    assert result.dropped == dict.fromkeys(range(6), 0)
    assert "no majority or earlier round settles which is right" in result.failure


@pytest.mark.parametrize("policy", ["abort", "drop"])
def test_a_node_failing_the_regret_query(policy):
    nodes = {21: good_node([0, 1])[0], 22: good_node([2, 3])[0]}
    nodes[23], _ = faulty_node([4, 5], "error", None, stage="query.regret")
    result, seen, _, _ = flower_run(nodes, THREE, policy)
    assert [r.round for r in seen] == list(range(17))
    assert result.failure == (
        "regret records: lost clients 4-5 (node 23 (clients 4-5): error reply (code 2): node died)"
    )
    np.testing.assert_array_equal(result.regret.client_ids, [0, 1, 2, 3])
    if policy == "abort":
        assert (result.status, result.dropped) == ("aborted", {})
    else:
        assert (result.status, result.dropped) == ("complete", {4: 17, 5: 17})


def test_drop_removes_whole_nodes_only():
    runtime = FlowerGridRuntime(FakeGrid({}), dict(THREE), timeout=1, poll_seconds=0.01)
    with pytest.raises(
        ValueError, match="node 22 serves clients 2-3: a node is dropped as a whole"
    ):
        runtime.drop(np.array([3]))
    with pytest.raises(ValueError, match="cannot drop clients 9: no node serves them"):
        runtime.drop(np.array([9]))
    runtime.drop(np.array([2, 3]))
    assert list(runtime.ranges) == [21, 23]


def test_discovery_refuses_overlaps_and_names_missing_clients():
    a, _ = client_node([0, 1, 2])
    b, _ = client_node([2, 3])
    job = job_with(start_deadline=0.5)
    with pytest.raises(
        DeploymentError,
        match=r"clients 2 are served by two nodes: node 1 \(clients 0-2\) and node 2 "
        r"\(clients 2-3\)",
    ):
        discover_nodes(FakeGrid({1: a, 2: b}), job, 6)
    with pytest.raises(DeploymentError, match=r"no node serves clients 3-5 after 0.5 s"):
        discover_nodes(FakeGrid({1: a}), job, 6)
    with pytest.raises(DeploymentError, match=r"node 1 serves clients 0-2, but the experiment"):
        discover_nodes(FakeGrid({1: a}), job, 2)


def test_discovery_leaves_out_dead_nodes_when_the_live_ones_cover_every_client():
    """A node the SuperLink still lists after it died (an error reply, or silence) does not stop
    a run that the live nodes serve, even when it served the same clients as its replacement."""
    a, _ = client_node([0, 1, 2])
    b, _ = client_node([3, 4, 5])

    def dead(message):
        return Message(Error(code=5, reason="node unavailable"), reply_to=message)

    ranges = discover_nodes(FakeGrid({7: dead, 1: a, 2: b}), job_with(start_deadline=5), 6)
    assert sorted(ranges) == [1, 2]
    started = time.monotonic()
    ranges = discover_nodes(
        FakeGrid({7: lambda message: None, 1: a, 2: b}), job_with(start_deadline=30), 6
    )
    assert sorted(ranges) == [1, 2]
    assert time.monotonic() - started < 10  # a grace for the silent node, not the deadline
    with pytest.raises(DeploymentError) as caught:
        discover_nodes(FakeGrid({7: dead, 1: a}), job_with(start_deadline=0.3), 6)
    assert "no node serves clients 3-5" in str(caught.value)
    assert "not answering: node 7: error reply (code 5): node unavailable" in str(caught.value)


def test_node_store_resumes_after_or_replays_before_the_last_round(tmp_path):
    """A restarted node continues from the state after its last round, or handles that same
    round again from the state before it (its reply was lost with the old process)."""
    from fedbandit.flower.apps import NodeStore

    store = NodeStore(tmp_path, 42, np.array([3, 4, 5]))
    assert store.load() is None
    before = {"env.pulls": np.array([1, 2, 3]), "logic.phase": np.array(2)}
    after = {"env.pulls": np.array([4, 5, 6]), "logic.phase": np.array(3)}
    store.save(7, before, after)
    assert store.path == tmp_path / "run-42" / "clients-3-3.npz"
    round_, got_before, got_after = store.load()
    assert round_ == 7
    np.testing.assert_array_equal(got_before["env.pulls"], [1, 2, 3])
    np.testing.assert_array_equal(got_after["env.pulls"], [4, 5, 6])
    assert got_after["logic.phase"].shape == () and int(got_after["logic.phase"]) == 3
    assert not list(tmp_path.rglob("*.tmp"))


def test_codec_regret_state_and_hello_round_trip():
    """The ClientApp's records (codec) read back as written; a record for other clients or with
    a non-finite value is malformed."""
    from fedbandit.flower.codec import (
        MalformedReplyError,
        decode_hello,
        decode_regret,
        decode_state,
        encode_hello,
        encode_regret,
        encode_state,
    )

    _, groups = build_federation(INSTANCE, "fedpe", 64, [0, 0], client_ids=np.array([2, 3]))
    logic = groups[0]
    record = logic.regret_record()
    back = decode_regret(encode_regret(record), np.array([2, 3]))
    for name in ("client_ids", "increment_diff", "client_regret", "client_pulls"):
        np.testing.assert_array_equal(getattr(back, name), getattr(record, name))
    assert back.scale == record.scale
    with pytest.raises(MalformedReplyError, match="regret of clients"):
        decode_regret(encode_regret(record), np.array([2, 4]))
    bad = encode_regret(record)
    bad["regret"]["client_regret"] = Array(np.full(2, np.inf))
    with pytest.raises(MalformedReplyError, match="NaN, infinite"):
        decode_regret(bad, np.array([2, 3]))

    np.testing.assert_array_equal(decode_hello(encode_hello(logic.client_ids)), [2, 3])
    with pytest.raises(MalformedReplyError):
        decode_hello(RecordDict({}))

    context_state = RecordDict({})
    assert decode_state(context_state) is None
    state = {"env.pulls": np.array([[1, 2], [3, 4]]), "logic.phase": np.array(5)}
    encode_state(state, context_state)
    got = decode_state(context_state)
    np.testing.assert_array_equal(got["env.pulls"], state["env.pulls"])
    assert got["logic.phase"].shape == () and int(got["logic.phase"]) == 5


def upload_lost(message):
    """What Flower's ServerApp makes of a reply whose objects never arrived."""
    error = Error(pull_backoff.MESSAGE_UNAVAILABLE, "Reply message objects are unavailable.")
    reply = Message(error, reply_to=message)
    reply.metadata.__dict__["_src_node_id"] = 1
    return reply


def once_node(ids, lose_rounds):
    """A client node whose steps go through the ClientApp's ``answered_once``; the first reply
    of each round in ``lose_rounds`` is lost in its upload (after the node did the work)."""
    answer, logic = client_node(ids)
    handled = []

    def handler(message, context):
        handled.append(decode(message.content).round)
        return answer(message)

    step = answered_once(handler)
    context = SimpleNamespace(state=RecordDict())
    lose = set(lose_rounds)

    def node(message):
        kind = message.metadata.message_type
        if kind == "query.regret":
            return regret_reply(logic, message)
        if kind == "query.hello":
            return answer(message)
        reply = step(message, context)
        if (round_ := decode(message.content).round) in lose:
            lose.discard(round_)
            return upload_lost(message)
        return reply

    return node, handled


@pytest.mark.parametrize("policy", ["abort", "drop"])
def test_a_reply_lost_in_its_upload_is_asked_again_and_answered_without_the_work_twice(policy):
    nodes = {21: good_node([0, 1])[0], 22: good_node([2, 3])[0]}
    nodes[23], handled = once_node([4, 5], lose_rounds=[2, 5])
    result, _, grid, runtime = flower_run(nodes, THREE, policy)
    local = simulate(INSTANCE, "fedpe", 300, [0, 0])
    assert (result.status, result.failure, result.dropped) == ("complete", None, {})
    np.testing.assert_array_equal(result.regret.increment_diff, local.regret.increment_diff)
    assert runtime.asked_again == 2
    steps = [r for node, kind, r in grid.pushed if node == 23 and kind == "train.step"]
    assert steps.count(2) == 2 and steps.count(5) == 2
    assert len(handled) == len(steps) - 2  # the work of each round done once


def test_a_node_that_left_is_not_asked_again_and_is_lost():
    nodes = {21: good_node([0, 1])[0], 22: good_node([2, 3])[0]}
    nodes[23], _ = once_node([4, 5], lose_rounds=[2])

    class LeftGrid(CountingGrid):
        def get_node_ids(self):
            return [21, 22]

    server, _ = build_federation(INSTANCE, "fedpe", 300, [0, 0])
    runtime = FlowerGridRuntime(LeftGrid(nodes), THREE, timeout=2.0, poll_seconds=0.001)
    result = run_federation(server, runtime, "abort")
    assert result.status == "aborted" and runtime.asked_again == 0
    assert "node 23 (clients 4-5): no reply: the node stopped while uploading it" in result.failure


def test_a_reply_lost_every_time_is_asked_again_twice_then_the_node_is_lost():
    nodes = {21: good_node([0, 1])[0], 22: good_node([2, 3])[0]}
    nodes[23], _ = faulty_node([4, 5], "upload", 2)
    result, _, grid, runtime = flower_run(nodes, THREE, "abort")
    assert result.status == "aborted" and runtime.asked_again == ASK_AGAIN_TIMES == 2
    assert grid.pushed.count((23, "train.step", 2)) == 1 + ASK_AGAIN_TIMES


def test_answered_once_keeps_the_last_answer_only_and_a_new_job_forgets_it():
    calls = []

    def handler(message, context):
        calls.append(message.content.config_records["q"]["n"])
        return Message(RecordDict({"a": ConfigRecord({"n": calls[-1] * 10})}), reply_to=message)

    step = answered_once(handler)
    context = SimpleNamespace(state=RecordDict())

    def ask(n):
        message = Message(RecordDict({"q": ConfigRecord({"n": n})}), dst_node_id=5,
                          message_type="train.step")  # fmt: skip
        message.metadata.__dict__["_message_id"] = str(uuid.uuid4())
        return step(message, context).content.config_records["a"]["n"]

    assert [ask(1), ask(1), ask(2), ask(2), ask(1)] == [10, 10, 20, 20, 10]
    assert calls == [1, 2, 1]
    clear_group_state(context.state)
    assert ask(1) == 10 and calls == [1, 2, 1, 1]


def test_discovery_asks_a_node_again_whose_hello_reply_was_lost_in_its_upload():
    answer, _ = client_node([3, 4, 5])
    hellos = []

    def node(message):
        hellos.append(message.metadata.message_id)
        return upload_lost(message) if len(hellos) == 1 else answer(message)

    grid = FakeGrid({11: client_node([0, 1, 2])[0], 12: node})
    ranges = discover_nodes(grid, job_with(start_deadline=5), 6)
    assert {k: v.tolist() for k, v in ranges.items()} == {11: [0, 1, 2], 12: [3, 4, 5]}
    assert len(hellos) == 2 and hellos[0] != hellos[1]  # the answered hello is not pulled again


def test_a_node_asked_again_that_then_stays_silent_is_lost_with_both_reasons():
    answer, _ = client_node([4, 5])
    asked = []

    def node(message):  # its reply to round 2 is lost in its upload, then it is gone
        kind = message.metadata.message_type
        if kind != "train.step" or decode(message.content).round < 2:
            return answer(message)
        asked.append(message.metadata.message_id)
        return upload_lost(message) if len(asked) == 1 else None

    nodes = {21: good_node([0, 1])[0], 22: good_node([2, 3])[0], 23: node}
    result, _, _, runtime = flower_run(nodes, THREE, "abort", timeout=0.5)
    assert runtime.asked_again == 1
    assert result.failure == (
        "round 2: lost clients 4-5 (node 23 (clients 4-5): no reply: the node stopped while "
        "uploading it (Reply message objects are unavailable.); asked again, it did not answer "
        "within 0.5 s)"
    )


@pytest.mark.parametrize("policy", ["abort", "drop"])
def test_a_long_regret_curve_is_asked_for_in_pieces_that_join_to_the_whole(policy):
    nodes = {node: good_node(ids.tolist())[0] for node, ids in THREE.items()}
    result, _, grid, _ = flower_run(nodes, THREE, policy, piece_values=7)
    local = simulate(INSTANCE, "fedpe", 300, [0, 0])
    assert (result.status, result.failure) == ("complete", None)
    np.testing.assert_array_equal(result.regret.increment_diff, local.regret.increment_diff)
    np.testing.assert_array_equal(result.regret.client_regret, local.regret.client_regret)
    queries = [node for node, kind, _ in grid.pushed if kind == "query.regret"]
    assert len(local.regret.increment_diff) == 301
    assert {node: queries.count(node) for node in THREE} == dict.fromkeys(THREE, 43)  # 301 / 7
    # one push per message: a node waits for its own message's objects only
    assert set(grid.batches) == {1} and len(grid.batches) == len(grid.pushed)


def test_a_regret_piece_from_another_start_loses_the_node():
    good, logic = good_node([4, 5])

    def shifted(message):  # answers every piece from the curve's start
        if message.metadata.message_type != "query.regret":
            return good(message)
        return Message(encode_regret(logic.regret_record(), 0, 7), reply_to=message)

    nodes = {21: good_node([0, 1])[0], 22: good_node([2, 3])[0], 23: shifted}
    result, _, _, _ = flower_run(nodes, THREE, "drop", piece_values=7)
    assert result.failure == (
        "regret records: lost clients 4-5 (node 23 (clients 4-5): malformed regret record: "
        "regret piece from 0 of a curve of 301 values, asked from 7)"
    )
    np.testing.assert_array_equal(result.regret.client_ids, [0, 1, 2, 3])


def test_codec_regret_pieces():
    _, groups = build_federation(INSTANCE, "fedpe", 64, [0, 0], client_ids=np.array([2, 3]))
    record = groups[0].regret_record()
    ids = np.array([2, 3])
    pieces = [
        decode_regret_piece(answer_regret_query(record, regret_query(start, 30)), ids, start)
        for start in (0, 30, 60)
    ]
    assert [len(p.increment_diff) for p, _ in pieces] == [30, 30, 5]
    assert {length for _, length in pieces} == {65}
    joined = np.concatenate([p.increment_diff for p, _ in pieces])
    np.testing.assert_array_equal(joined, record.increment_diff)
    with pytest.raises(MalformedReplyError, match="not the record"):
        decode_regret(encode_regret(record, 0, 30), ids)
    with pytest.raises(MalformedReplyError, match="asked from 0"):
        decode_regret_piece(encode_regret(record, 30, 30), ids, 0)
    with pytest.raises(MalformedReplyError, match="empty regret piece"):
        decode_regret_piece(encode_regret(record, 30, 0), ids, 30)
    request = regret_query(0)
    request[REGRET_PIECE_KEY]["values"] = 0
    with pytest.raises(MalformedReplyError, match="values=0"):
        answer_regret_query(record, request)
    # a query without a piece (an older ServerApp) is answered with the first piece
    assert (
        len(decode_regret_piece(answer_regret_query(record, RecordDict({})), ids)[0].increment_diff)
        == 65
    )


class LosingPushGrid(CountingGrid):
    """Its pushes numbered in ``lose`` fail as Flower's grid does when the SuperLink lost one of
    their objects (``ObjectPushError``), after the batch's first message arrived whole and its
    node handled it (its reply goes to a message id nobody waits for)."""

    def __init__(self, nodes, lose):
        super().__init__(nodes)
        self.lose, self.calls = set(lose), 0

    def push_messages(self, messages):
        self.calls += 1
        if self.calls in self.lose:
            first = messages[0]
            first.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            self.nodes[first.metadata.dst_node_id](first)
            raise ObjectPushError("0828ffba", 7, "503a0e22")
        return super().push_messages(messages)


@pytest.mark.parametrize("policy", ["abort", "drop"])
def test_a_push_whose_objects_the_superlink_lost_is_sent_again_and_done_once(policy, monkeypatch):
    monkeypatch.setattr(grid_runtime, "PUSH_AGAIN_WAIT_SECONDS", 0.0)
    nodes, handled = {}, {}
    for node, ids in THREE.items():
        nodes[node], handled[node] = once_node(ids.tolist(), lose_rounds=[])
    grid = LosingPushGrid(nodes, lose={2, 6, 7, 9})  # 6, 7: the same round's push lost twice
    result, _, grid, runtime = flower_run(nodes, THREE, policy, grid=grid)
    local = simulate(INSTANCE, "fedpe", 300, [0, 0])
    assert (result.status, result.failure, result.dropped) == ("complete", None, {})
    np.testing.assert_array_equal(result.regret.increment_diff, local.regret.increment_diff)
    for node in THREE:  # every round's work done once, though some were delivered twice
        assert handled[node] == sorted(set(handled[node])), node
    assert runtime.asked_again == 0


def test_a_push_lost_every_time_ends_in_one_line_and_other_kinds_are_not_sent_again(
    monkeypatch,
):
    monkeypatch.setattr(grid_runtime, "PUSH_AGAIN_WAIT_SECONDS", 0.0)
    tries = []

    class Lost:
        def push_messages(self, messages):
            tries.append([m.metadata.created_at for m in messages])
            raise ObjectPushError("0828ffba", 7, "503a0e22")

    step = Message(RecordDict({}), dst_node_id=3, message_type="train.step")
    with pytest.raises(
        LostPushError,
        match=r"lost an object of the ServerApp's train.step "
        r"messages 5 times in a row \(Failed to push object",
    ):
        push_whole(Lost(), [step])
    assert len(tries) == PUSH_AGAIN_TIMES + 1 == 5
    other = Message(RecordDict({}), dst_node_id=3, message_type="train.secagg")
    with pytest.raises(ObjectPushError):
        push_whole(Lost(), [other])
    assert len(tries) == 6  # a message the node may not see twice is not sent again
