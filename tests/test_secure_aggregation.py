"""Secure aggregation: the fixed-point limbs (exact sums, hand values), the summed-field message,
the refusals, and SecAgg+ end to end with fedbandit's real ClientApp on in-memory nodes (a fake
Grid: Flower's workflow and mod, no Ray): the server sees only sums, results equal the plaintext
run, a lost node within the threshold still gives the survivors' sum, below it the seed stops."""

import copy
import functools
import json
import threading
import uuid
from fractions import Fraction

import numpy as np
import pytest
from flwr.app import Context, Error, Message, RecordDict

from fedbandit import secure_sum
from fedbandit.cli import main
from fedbandit.config import load_experiment
from fedbandit.federation.messages import Message as BanditMessage
from fedbandit.federation.runtime import run_federation
from fedbandit.flower.apps import FlowerJob, build_client_app
from fedbandit.flower.codec import HEADER_KEY
from fedbandit.flower.grid_runtime import FlowerGridRuntime, discover_nodes
from fedbandit.flower.secure_aggregation import (
    SecureSettings,
    close_session,
    default_threshold,
    open_session,
)
from fedbandit.registry import build_instance
from fedbandit.runspec import RunSpec, RuntimeOptions
from fedbandit.simulation import build_server, simulate

# --- fixed-point limbs -------------------------------------------------------------------------


def test_limbs_of_hand_values():
    # 1.5 = 3 * 2^51: V = 3 * 2^51 = 0b11 << 51; base 2^21 digits of V: [0, 0, 3 << 9, 0, 0]
    limbs, clipped = secure_sum.encode(np.array([1.5]))
    assert clipped == 0 and secure_sum.LIMBS == 5
    centred = [-(2**20), -(2**20), (3 << 9) - 2**20, -(2**20), 0]
    np.testing.assert_array_equal(limbs[0], centred)
    # -1.0 = -2^52: floor digits [0, 0, 2^21 - 2^10, 2^21 - 1, -1] (top limb signed)
    limbs, _ = secure_sum.encode(np.array([-1.0]))
    np.testing.assert_array_equal(
        limbs[0], [-(2**20), -(2**20), 2**21 - 2**10 - 2**20, 2**21 - 1 - 2**20, -1]
    )
    assert secure_sum.decode(limbs, 1, (1,))[0] == -1.0


def test_limbs_stay_in_secaggs_range_and_sum_exactly():
    rng = np.random.default_rng(5)
    values = [
        rng.normal(size=(4, 3)) * 10.0 ** rng.integers(-14, 14, size=(4, 3)) for _ in range(9)
    ]
    encoded = [secure_sum.encode(v)[0] for v in values]
    for limbs in encoded:
        assert limbs.min() >= -secure_sum.LIMB_RANGE and limbs.max() < secure_sum.LIMB_RANGE
    total = secure_sum.decode(np.sum(encoded, axis=0), len(values), (4, 3))
    for index in np.ndindex(4, 3):
        exact = sum(Fraction(float(v[index])) for v in values)
        bound = len(values) * 2.0 ** -(secure_sum.FRACTION_BITS + 1) + abs(float(exact)) * 2**-53
        assert abs(Fraction(float(total[index])) - exact) <= Fraction(bound)
    # integers (counts) come back exactly
    counts = np.array([0, 1, 7, 123456789, -5])
    np.testing.assert_array_equal(
        secure_sum.decode(secure_sum.encode(counts)[0] * 3, 3, (5,)), counts * 3
    )


def test_values_beyond_the_range_are_clipped_and_counted():
    limbs, clipped = secure_sum.encode(np.array([1e16, -1e16, 4e15, 0.0]))
    assert clipped == 2
    back = secure_sum.decode(limbs, 1, (4,))
    assert back[0] == pytest.approx(2.0**52) and back[1] == pytest.approx(-(2.0**52))
    assert back[2] == 4e15 and back[3] == 0.0
    with pytest.raises(ValueError, match="NaN"):
        secure_sum.encode(np.array([np.nan]))


# --- the summed-field message ------------------------------------------------------------------


def test_a_summed_field_holds_one_sum_and_counts_as_every_clients_value():
    ids = np.array([2, 5, 9])
    plain = BanditMessage(
        "upload",
        0,
        ids,
        {"gram": np.ones((3, 2, 2)), "send": np.array([[True], [False], [True]])},
        sparse={"gram": "send"},
    )
    summed = BanditMessage(
        "upload",
        0,
        ids,
        {"gram": np.full((1, 2, 2), 2.0), "send": plain.fields["send"]},
        sparse={"gram": "send"},
        summed=frozenset({"gram"}),
    )
    np.testing.assert_array_equal(summed.scalars_per_client(), plain.scalars_per_client())
    np.testing.assert_array_equal(summed.fields["gram"].sum(axis=0), np.full((2, 2), 2.0))
    with pytest.raises(ValueError, match="leading axis"):
        BanditMessage("upload", 0, ids, {"gram": np.ones((3, 2))}, summed=frozenset({"gram"}))
    with pytest.raises(ValueError, match="cannot select"):
        summed.select(slice(0, 1))
    with pytest.raises(ValueError, match="cannot join"):
        BanditMessage.concatenate([summed, summed])


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--algorithms", "dislinucb"], "needs runtime 'flower-sim' or 'flower'"),
        (["--runtime", "flower-sim", "--nodes", "2"], "3 or more nodes"),
        (["--runtime", "flower-sim", "--algorithms", "async_linucb"], "async_linucb declares no"),
        (["--runtime", "flower-sim", "--algorithms", "fedlinucb"], "fedlinucb declares no"),
    ],
)
def test_what_secure_aggregation_cannot_serve_is_refused_in_one_line(
    argv, message, tmp_path, capsys
):
    code = main(
        ["run", "contextual_tiny", "--secure-aggregation", "--out", str(tmp_path / "r"), *argv]
    )
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err and not (tmp_path / "r" / "runs").exists()


def test_a_threshold_needs_secure_aggregation():
    with pytest.raises(ValueError, match="needs --secure-aggregation"):
        RuntimeOptions(runtime="flower-sim", secure_threshold=3)


def test_the_threshold_is_a_majority_of_at_least_three_and_at_most_every_node():
    assert [default_threshold(n) for n in (3, 4, 5, 10)] == [3, 3, 3, 6]
    assert SecureSettings(lambda message: frozenset(), threshold=9).threshold_for(4) == 4
    assert SecureSettings(lambda message: frozenset()).threshold_for(3) == 3
    with pytest.raises(ValueError, match="greater than or equal to 3"):
        RuntimeOptions(runtime="flower-sim", secure_aggregation=True, secure_threshold=2)
    with pytest.raises(ValueError, match="more surviving nodes than the 4 nodes"):
        RuntimeOptions(runtime="flower-sim", secure_aggregation=True, secure_threshold=5)


# --- SecAgg+ end to end on in-memory nodes ------------------------------------------------------


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


def _stage(message: Message) -> str | None:
    configs = message.content.config_records.get("secaggplus_configs")
    return None if configs is None else str(configs.get("stage"))


def _round(message: Message) -> int | None:
    """The bandit round a message carries (plain or a SecAgg+ stage-2 request)."""
    content = message.content
    if "fitins.config" in content.config_records:
        return int(json.loads(str(content.config_records["fitins.config"]["json"]))["round"])
    if HEADER_KEY in content.config_records and "json" in content.config_records[HEADER_KEY]:
        return int(json.loads(str(content.config_records[HEADER_KEY]["json"]))["round"])
    return None


class NodesGrid:
    """Nodes running fedbandit's real ClientApp (SecAgg+ mod included) in this process, each with
    its own persistent ``Context``; ``silent_from[node] = r`` makes a node stop answering at
    bandit round r (in SecAgg+'s masked-vector stage, or a plain step), ``failing_from`` answer
    with an error reply instead, and ``tamper[node]`` edits its replies. Records every reply.
    Messages are answered one at a time, as a SuperNode does (the runtime may push and pull from
    two threads: keys set up ahead)."""

    def __init__(
        self,
        job: FlowerJob,
        num_nodes: int,
        silent_from: dict[int, int] | None = None,
        failing_from: dict[int, int] | None = None,
        tamper: dict | None = None,
        silent_at_stage: dict[int, tuple[str, int]] | None = None,
    ):
        self.app = build_client_app([job])
        self.contexts = {
            100 + p: Context(
                run_id=1,
                node_id=100 + p,
                node_config={"partition-id": p, "num-partitions": num_nodes},
                state=RecordDict(),
                run_config={},
            )
            for p in range(num_nodes)
        }
        self.silent_from = silent_from or {}
        self.failing_from = failing_from or {}
        self.tamper = tamper or {}
        #: node -> (SecAgg+ stage, n): silent from the n-th message of that stage it gets on
        self.silent_at_stage = silent_at_stage or {}
        self.stages_seen: dict[int, int] = {}
        self.silenced: set[int] = set()
        self.inbox: dict[str, Message] = {}
        self.replies: list[tuple[int, Message, Message]] = []
        self.lock = threading.Lock()
        #: (node, SecAgg+ stage or None) of every message pushed, in order.
        self.pushed: list[tuple[int, str | None]] = []

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        ids = []
        with self.lock:
            for message in messages:
                message.metadata.__dict__["_message_id"] = str(uuid.uuid4())
                self.inbox[message.metadata.message_id] = message
                self.pushed.append((message.metadata.dst_node_id, _stage(message)))
                ids.append(message.metadata.message_id)
        return ids

    def pull_messages(self, message_ids):
        with self.lock:
            return self._answer(message_ids)

    def _answer(self, message_ids):
        out = []
        for mid in message_ids:
            message = self.inbox.pop(mid, None)
            if message is None:
                continue
            node = message.metadata.dst_node_id
            round_ = _round(message)
            if node in self.silent_from and round_ is not None and round_ >= self.silent_from[node]:
                self.silenced.add(node)
            if node in self.silent_at_stage and _stage(message) == self.silent_at_stage[node][0]:
                self.stages_seen[node] = self.stages_seen.get(node, 0) + 1
                if self.stages_seen[node] >= self.silent_at_stage[node][1]:
                    self.silenced.add(node)
            if node in self.silenced:
                continue
            failing = node in self.failing_from and (round_ or -1) >= self.failing_from[node]
            try:  # a copy, as a real transport delivers: the mod edits its message's records
                if failing:
                    raise RuntimeError("the ClientApp failed")
                reply = self.app(copy.deepcopy(message), self.contexts[node])
            except Exception as err:  # a ClientApp error is an error reply
                reply = Message(Error(code=0, reason=str(err)), reply_to=message)
            if node in self.tamper and not reply.has_error():
                self.tamper[node](message, reply)
            reply.metadata.__dict__["_src_node_id"] = node  # as the SuperLink sets it
            self.replies.append((node, message, reply))
            out.append(reply)
        return out


def secure_run(
    experiment,
    algorithm,
    num_nodes=4,
    secure=True,
    policy="abort",
    overrides=(),
    min_contributors=None,
    prepare_keys=False,
    **grid_options,
):
    """A whole run on ``NodesGrid``; ``min_contributors``: the session's k (default: the
    module's default session, k = ``MIN_CONTRIBUTORS``); ``prepare_keys``: as a deployment,
    the keys of an exchange the server announces are set up ahead."""
    config = load_experiment(experiment, list(overrides))
    options = RuntimeOptions(
        runtime="flower-sim",
        nodes=num_nodes,
        secure_aggregation=secure,
        on_client_failure=policy,
        round_timeout=0.3,
    )
    job = FlowerJob(
        RunSpec(experiment=config, algorithm=algorithm, seed=0, options=options),
        num_nodes=num_nodes,
        poll_seconds=0.001,
    )
    grid = NodesGrid(job, num_nodes, **grid_options)
    instance = build_instance(config.instance)
    server = build_server(instance, algorithm, config.horizon, config.hyperparameters(algorithm))
    seen: list[BanditMessage] = []
    aggregate = server.aggregate

    def recording(reply):
        seen.append(reply)
        aggregate(reply)

    server.aggregate = recording
    ranges = discover_nodes(grid, job, instance.num_clients)
    settings = (
        SecureSettings(
            server.secure_fields,
            contributors=server.secure_contributors,
            follows=server.secure_follows,
        )
        if secure
        else None
    )
    runtime = FlowerGridRuntime(
        grid,
        ranges,
        0.3,
        0.001,
        steps_per_round=options.steps_per_round,
        secure=settings,
        prepare_keys=prepare_keys,
    )
    if min_contributors is not None:
        open_session(grid, min_contributors)
    try:
        outcome = run_federation(server, runtime, policy)
    finally:
        runtime.session = close_session(grid)
    return outcome, seen, grid, runtime


@pytest.mark.parametrize(
    ("experiment", "algorithm", "summed"),
    [
        ("contextual_tiny", "dislinucb", {"gram_delta", "target_delta"}),
        ("fedpe_tiny", "fedpe", {"weighted_estimate"}),
        ("fedpe_shared_tiny", "fedpe_shared", {"weighted_estimate"}),
        ("fed_private_pe", "private_fedpe", {"weighted_estimate"}),
        ("fed_heterogeneous_tiny", "hlinucb", {"gram_delta", "target_delta"}),
        ("fed_private", "batched_fedlinucb", {"gram_node", "target_node"}),
        ("fed_private", "private_fedlinucb", {"gram_node", "target_node"}),
    ],
)
def test_secagg_gives_the_plaintext_results_and_the_server_sees_only_sums(
    experiment, algorithm, summed
):
    # H-LinUCB syncs before tau only when the clients differ little
    overrides = ["instance.heterogeneity=0.05"] if algorithm == "hlinucb" else []
    config = load_experiment(experiment, overrides)
    local = simulate(
        build_instance(config.instance),
        algorithm,
        config.horizon,
        RunSpec(experiment=config, algorithm=algorithm, seed=0).entropy,
        config.hyperparameters(algorithm),
    )
    # batched FedLinUCB's 80 secure batches run without the contributor count here (it doubles
    # SecAgg+'s stages); with it: test_secure_contributors.py (slow)
    minimum = 1 if "fedlinucb" in algorithm else None
    outcome, seen, grid, runtime = secure_run(
        experiment, algorithm, overrides=overrides, min_contributors=minimum
    )
    np.testing.assert_array_equal(outcome.regret.increment_diff, local.regret.increment_diff)
    assert outcome.status == "complete" and runtime.secure_report["exchanges"] > 0
    assert runtime.secure_report["clipped_values"] == 0
    if "target_delta" in summed or "target_node" in summed:  # counted as in plaintext
        assert outcome.ledger.totals() == local.totals
    secure_replies = [r for r in seen if r.summed]
    assert len(secure_replies) == runtime.secure_report["exchanges"]
    for reply in secure_replies:
        assert reply.summed == summed
        for name in summed:  # one sum, never a value per client
            assert reply.fields[name].shape[0] == 1
    # What reached the server in SecAgg+'s masked-vector stage: no array left unmasked, and the
    # clear part (the metrics) names no summed field.
    stage2 = [r for _, m, r in grid.replies if _stage(m) == "collect_masked_vectors"]
    assert stage2
    for reply in stage2:
        for record in reply.content.array_records.values():
            assert len(record) == 0
        metrics = reply.content.config_records["fitres.metrics"]
        if "secure-blocks" in metrics:  # a count: the blocks per field, nothing of a client
            assert set(metrics) == {"secure-blocks", "secure-holds", "handler-s"}
            continue
        clear = json.loads(str(metrics["json"]))
        names = {entry[0].split("/", 1)[1] for entry in clear["layout"]}
        # nor, for Fed-PE, the per-arm estimates the summed shares are made of
        assert not names & (summed | ({"estimate"} if "weighted_estimate" in summed else set()))


@functools.cache
def secure_rounds() -> list[int]:
    """The rounds whose replies travel as sums in an undisturbed secure DisLinUCB run."""
    _, seen, _, _ = secure_run("contextual_tiny", "dislinucb")
    return [reply.round for reply in seen if reply.summed]


@pytest.mark.parametrize("fault", ["silent", "failing"])
def test_a_node_lost_in_the_masked_stage_leaves_the_survivors_sum(fault):
    """Node 103 takes part in SecAgg+'s setup of the second secure sync, then goes silent (or
    answers with an error) in its masked-vector stage: the others' sum still unmasks (threshold 3
    of 4, its masks rebuilt from shares), and the run goes on exactly as a plaintext run losing
    that node in that round."""
    at = secure_rounds()[1]
    fail = {f"{fault}_from": {103: at}}
    secure, seen, _, runtime = secure_run("contextual_tiny", "dislinucb", policy="drop", **fail)
    plain, _, _, _ = secure_run("contextual_tiny", "dislinucb", secure=False, policy="drop", **fail)
    assert secure.status == plain.status == "complete"
    assert secure.dropped == plain.dropped == {4: at}
    np.testing.assert_array_equal(secure.regret.increment_diff, plain.regret.increment_diff)
    assert runtime.secure_report["lost_nodes"] == 1
    survivors = next(r for r in seen if r.round == at)
    assert survivors.summed and survivors.client_ids.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("stage", ["setup", "share_keys"])
def test_a_node_lost_before_the_masked_stage_restarts_the_exchange_with_the_survivors(stage):
    """Issue 39, item 1: node 103 goes silent in SecAgg+'s key set-up (or key sharing) of the
    second secure sync's sum (its 4th message of that stage: each sync is a count and a sum).
    Nothing has been revealed yet, so the exchange starts again with the three others: the run
    goes on exactly as a plaintext run losing that node in that round (Flower's mod alone would
    fail every node at the unmasking)."""
    at = secure_rounds()[1]
    secure, seen, _, runtime = secure_run(
        "contextual_tiny", "dislinucb", policy="drop", silent_at_stage={103: (stage, 4)}
    )
    plain, _, _, _ = secure_run(
        "contextual_tiny", "dislinucb", secure=False, policy="drop", silent_from={103: at}
    )
    assert secure.status == plain.status == "complete"
    assert secure.dropped == plain.dropped == {4: at}
    np.testing.assert_array_equal(secure.regret.increment_diff, plain.regret.increment_diff)
    assert runtime.secure_report["lost_nodes"] == 1
    survivors = next(r for r in seen if r.round == at)
    assert survivors.summed and survivors.client_ids.tolist() == [0, 1, 2, 3]


@pytest.mark.slow
def test_under_abort_a_node_lost_in_the_key_set_up_stops_the_seed_keeping_the_others_regret():
    at = secure_rounds()[1]
    outcome, _, _, runtime = secure_run(
        "contextual_tiny", "dislinucb", policy="abort", silent_at_stage={103: ("setup", 4)}
    )
    assert outcome.status == "aborted" and f"round {at}: lost clients 4 " in outcome.failure
    assert "before the masked-vector stage" in outcome.failure
    assert set(runtime.lost) == {103} and outcome.regret.client_ids.tolist() == [0, 1, 2, 3]


@pytest.mark.slow
def test_a_node_lost_at_the_unmasking_is_inside_the_sum_and_lost_next_round():
    """The fourth stage: node 103 goes silent when asked for its key shares in the second
    secure sync (its masked vector is already in the aggregate; the others' shares suffice, 3 of
    4): the sum over all four is unmasked, and the node is lost at the next round, exactly as a
    plaintext run losing it there."""
    at = secure_rounds()[1]
    secure, seen, _, _ = secure_run(
        "contextual_tiny", "dislinucb", policy="drop", silent_at_stage={103: ("unmask", 4)}
    )
    plain, _, _, _ = secure_run(
        "contextual_tiny", "dislinucb", secure=False, policy="drop", silent_from={103: at + 1}
    )
    assert secure.status == plain.status == "complete"
    assert secure.dropped == plain.dropped == {4: at + 1}
    np.testing.assert_array_equal(secure.regret.increment_diff, plain.regret.increment_diff)
    assert next(r for r in seen if r.round == at).client_ids.tolist() == [0, 1, 2, 3, 4]


def test_below_the_threshold_the_seed_stops_with_one_clear_reason():
    at = secure_rounds()[1]
    outcome, seen, _, runtime = secure_run(
        "contextual_tiny", "dislinucb", policy="drop", silent_from={102: at, 103: at}
    )
    assert outcome.status == "aborted" and outcome.dropped == {}
    assert f"round {at}: lost clients" in outcome.failure
    assert "secure aggregation halted (fewer than 3 of 4 nodes left to unmask)" in (outcome.failure)
    assert [r.round for r in seen if r.summed] == secure_rounds()[:1]
    # the two live nodes still report their regret: nothing they did is lost
    assert set(runtime.lost) == {102, 103}
    assert outcome.regret.client_ids.tolist() == [0, 1, 2]


def test_three_nodes_must_all_survive_so_no_sum_of_two_is_ever_unmasked():
    """With 3 nodes the threshold is 3: losing one in the masked stage halts the exchange
    (a sum of the two others would tell each the other's values) instead of unmasking it."""
    _, seen, _, _ = secure_run("contextual_tiny", "dislinucb", num_nodes=3)
    at = [r.round for r in seen if r.summed][1]
    outcome, seen, _, runtime = secure_run(
        "contextual_tiny", "dislinucb", num_nodes=3, policy="drop", silent_from={102: at}
    )
    assert outcome.status == "aborted"
    assert "secure aggregation halted (fewer than 3 of 3 nodes left to unmask)" in (outcome.failure)
    assert not any(r.summed and r.round >= at for r in seen)
    assert set(runtime.lost) == {102}


def test_a_malformed_reply_inside_the_sum_stops_the_seed_cleanly():
    """A node whose clear part names the wrong round: its masked values are already in the sum,
    so the exchange cannot be used; the seed stops (status aborted) with the reason, and the
    other nodes still report their regret."""
    at = secure_rounds()[1]

    def wrong_round(message, reply):
        metrics = reply.content.config_records.get("fitres.metrics")
        if metrics is not None and "json" in metrics:
            header = json.loads(str(metrics["json"]))
            if header["round"] >= at:
                header["round"] += 1
                metrics["json"] = json.dumps(header)

    outcome, seen, _, runtime = secure_run(
        "contextual_tiny", "dislinucb", policy="drop", tamper={101: wrong_round}
    )
    assert outcome.status == "aborted" and outcome.dropped == {}
    assert "secure aggregation unusable" in outcome.failure and "node 101" in outcome.failure
    assert not any(r.summed and r.round >= at for r in seen)
    assert set(runtime.lost) == {101}
    assert outcome.regret.client_ids.tolist() == [0, 1, 3, 4]


def test_a_summed_reply_never_travels_with_run_ahead_replies(monkeypatch):
    """Batched FedLinUCB's clients run ahead through the steps inside a batch and stop before
    the step that closes it (``uploads_next``), so the upload goes through SecAgg+; a protocol
    that fails to say so is stopped when its upload reaches the runtime in the clear."""
    outcome, seen, grid, _ = secure_run("fed_private", "batched_fedlinucb", min_contributors=1)
    assert outcome.status == "complete"
    steps = [m for _, m, _ in grid.replies if m.metadata.message_type == "train.step"]
    assert len(steps) < 2000  # run ahead: 4 nodes x 2,000 rounds would be 8,000 deliveries
    assert [r.round for r in seen if r.kind == "upload"] == list(range(24, 2000, 25))
    assert all(r.summed for r in seen if r.kind == "upload")
    from fedbandit.algorithms.private_linucb import BatchedLinUCBClient

    monkeypatch.setattr(BatchedLinUCBClient, "uploads_next", lambda self: False)
    with pytest.raises(RuntimeError, match="came back in the clear"):
        secure_run("fed_private", "batched_fedlinucb", min_contributors=1)


# --- issue 37: the shuffle model's epsilon against the server the run had ------------------------

SHUFFLE = ["params.private_fedlinucb.privacy_model='shuffle'"]


def test_the_shuffle_models_epsilon_is_the_headline_only_when_the_server_saw_sums():
    """Through SecAgg+ the server sees each batch's nodes summed over the silos: the headline is
    the sum model's epsilon (5). The same run in the clear reports epsilon_local (issue 37)."""
    short = [*SHUFFLE, "horizon=250"]  # 10 batches: the headline does not depend on their number
    secure, seen, _, _ = secure_run(
        "fed_private", "private_fedlinucb", overrides=short, min_contributors=1
    )
    plain, _, _, _ = secure_run("fed_private", "private_fedlinucb", secure=False, overrides=short)
    np.testing.assert_array_equal(secure.regret.increment_diff, plain.regret.increment_diff)
    assert all(r.summed for r in seen if r.kind == "upload")
    summed, clear = secure.report["privacy"], plain.report["privacy"]
    assert summed["epsilon"] == summed["epsilon_secure_sum"] == pytest.approx(5.0, abs=0.01)
    assert "secure aggregation" in summed["server_saw"]
    assert clear["epsilon"] == clear["epsilon_local"] == summed["epsilon_local"] > 20
    assert clear["epsilon_secure_sum"] == summed["epsilon"]
    assert "per silo" in clear["server_sees"][0]["seen"]
    assert "sum over the silos" in summed["server_sees"][0]["seen"]


def test_after_a_lost_node_the_shuffle_epsilon_comes_from_the_survivors_sums():
    """Node 103 goes silent at batch 10's upload of 20 (--on-client-failure drop): the later
    sums carry the survivors' noise only, so the sum model's epsilon is recomputed from the sums
    actually formed (``dropout_epsilon``), above the 5 the run started with, and the report
    names the silos lost and the round."""
    from fedbandit.privacy import dropout_epsilon

    outcome, seen, _, _ = secure_run(
        "fed_private", "private_fedlinucb", policy="drop", overrides=[*SHUFFLE, "horizon=500"],
        silent_from={103: 10 * 25 - 1}, min_contributors=1,
    )  # fmt: skip
    assert outcome.status == "complete" and outcome.dropped
    privacy = outcome.report["privacy"]
    assert privacy["silos_lost"] == {str(c): r for c, r in sorted(outcome.dropped.items())}
    sizes = [len(r.client_ids) for r in seen if r.kind == "upload"]
    assert sizes[:9] == [10] * 9 and set(sizes[9:]) == {10 - len(outcome.dropped)}
    expected = dropout_epsilon(privacy["noise_multiplier"], 10, sizes, privacy["delta"])
    assert privacy["epsilon"] == privacy["epsilon_secure_sum"] == expected > 5.1
    assert privacy["silos_per_sum_min"] == 10 - len(outcome.dropped)
