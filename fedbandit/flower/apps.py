"""ServerApp and ClientApp driving fedbandit's server and client logic, and the Flower runtime.

A (virtual) SuperNode hosts one client group: a contiguous range of logical clients. Every message
is handled by rebuilding the group from the job description and restoring its state from
``context.state`` (a Flower deployment starts a fresh ClientApp process per message), so nodes keep
only arrays. The server learns each node's range before round 1 and checks that the ranges cover
every client exactly once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedbandit.environment import RegretRecord
from fedbandit.federation import Message as BanditMessage
from fedbandit.federation.protocol import ClientLogic
from fedbandit.federation.runtime import (
    ClientFailure,
    FederationResult,
    Runtime,
    describe_clients,
    run_federation,
)
from fedbandit.flower.codec import MalformedReplyError, decode, encode

#: Keys in ``context.state`` (one namespace for every record type of a ``RecordDict``).
STATE_KEY = "fedbandit.state"
SCALARS_KEY = "fedbandit.scalars"
#: Key of the reply record with the ClientApp handler's seconds (a measurement, not counted).
TIMING_KEY = "timing"


@dataclass(frozen=True)
class FlowerJob:
    """Everything a node needs to rebuild its client group: the validated experiment config (as
    plain data), the algorithm, the reward entropy, and the number of nodes."""

    config: dict[str, Any]
    algorithm: str
    entropy: tuple[int, ...]
    num_nodes: int
    round_timeout: float = 120.0
    start_deadline: float = 120.0
    poll_seconds: float = 0.01
    on_client_failure: str = "abort"
    reconnect_seconds: float = 0.0
    results: list[FederationResult] = field(default_factory=list, compare=False)
    #: Per-exchange latency of the last run (see ``FlowerGridRuntime.timings``).
    timings: list[dict[str, Any]] = field(default_factory=list, compare=False)


@lru_cache(maxsize=4)
def _instance(config_json: str):
    from fedbandit.config import validate_experiment
    from fedbandit.instances import build_instance

    return build_instance(validate_experiment(json.loads(config_json)).instance)


def job_to_json(job: FlowerJob) -> str:
    """The job as the JSON text a deployment passes in the run config (key ``job``)."""
    fields = {f.name: getattr(job, f.name) for f in dataclasses.fields(job) if f.compare}
    return json.dumps({**fields, "entropy": list(job.entropy)}, sort_keys=True)


@lru_cache(maxsize=4)
def job_from_json(text: str) -> FlowerJob:
    if not text:
        raise ValueError(
            "the run config has no 'job': submit runs with `fedbandit run --runtime flower`"
        )
    data = json.loads(text)
    known = {f.name for f in dataclasses.fields(FlowerJob) if f.compare}
    if unknown := set(data) - known:
        raise ValueError(f"unknown job keys {sorted(unknown)}; known: {sorted(known)}")
    return FlowerJob(**{**data, "entropy": tuple(data["entropy"])})


def _job(job: FlowerJob | None, context: Context) -> FlowerJob:
    """The job given to the app builder (simulation) or carried by the run config (deployment)."""
    return job if job is not None else job_from_json(str(context.run_config.get("job", "")))


def node_clients(num_clients: int, partition: int, num_partitions: int) -> np.ndarray:
    """The contiguous client range of node ``partition`` of ``num_partitions``."""
    if not 0 <= partition < num_partitions or num_partitions > num_clients:
        raise ValueError(f"partition {partition} of {num_partitions} for {num_clients} clients")
    return np.array_split(np.arange(num_clients, dtype=np.int64), num_partitions)[partition]


class NodeStore:
    """A node's client statistics on disk, so that a restarted SuperNode resumes a run.

    One file per run and client range, ``STATE_DIR/run-ID/clients-FIRST-COUNT.npz``, holds the
    state after the last round the node handled, the state before it, and that round's number: a
    round delivered again (its reply was lost with the old process) is handled again from the
    state before it, which gives the same reply, since the state includes every random stream.
    Written atomically (temporary file, then rename) after every round.
    """

    def __init__(self, directory: Path, run_id: int, client_ids: np.ndarray) -> None:
        first, count = int(client_ids[0]), len(client_ids)
        self.path = Path(directory) / f"run-{run_id}" / f"clients-{first}-{count}.npz"

    def load(self) -> tuple[int, dict[str, np.ndarray], dict[str, np.ndarray]] | None:
        """(round, state before it, state after it), or None when nothing was saved."""
        if not self.path.is_file():
            return None
        with np.load(self.path, allow_pickle=False) as data:
            parts: dict[str, dict[str, np.ndarray]] = {"before": {}, "after": {}}
            for key in data.files:
                part, _, name = key.partition(":")
                if part in parts:
                    parts[part][name] = data[key]
            return int(data["round"]), parts["before"], parts["after"]

    def save(self, round_: int, before: dict[str, np.ndarray], after: dict[str, np.ndarray]):
        arrays = {
            "round": np.array(round_),
            **{f"before:{k}": v for k, v in before.items()},
            **{f"after:{k}": v for k, v in after.items()},
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(temporary, "wb") as handle:
            np.savez(handle, **arrays)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)


def _store(context: Context, client_ids: np.ndarray) -> NodeStore | None:
    """The node's store when it was started with a state folder (``--persist``)."""
    directory = context.node_config.get("state-dir")
    return NodeStore(Path(str(directory)), context.run_id, client_ids) if directory else None


def _copy(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {key: np.array(value, copy=True) for key, value in state.items()}


def _client_logic(
    job: FlowerJob, context: Context, round_: int | None = None
) -> tuple[ClientLogic, NodeStore | None]:
    """The node's client group with its state: from ``context.state`` when the SuperNode kept
    it, else from the node's store (a restarted SuperNode): the state before ``round_`` when
    that round was already handled, else the latest."""
    from fedbandit.config import validate_experiment
    from fedbandit.simulation import build_federation

    config = validate_experiment(job.config)
    instance = _instance(json.dumps(job.config, sort_keys=True))
    node = context.node_config
    if "first-client" in node:
        first, count = int(node["first-client"]), int(node["num-clients"])
        ids = np.arange(first, first + count, dtype=np.int64)
    else:
        ids = node_clients(
            instance.num_clients, int(node["partition-id"]), int(node["num-partitions"])
        )
    _, groups = build_federation(
        instance,
        job.algorithm,
        config.horizon,
        list(job.entropy),
        config.hyperparameters(job.algorithm),
        client_ids=ids,
    )
    logic = groups[0]
    store = _store(context, logic.client_ids)
    if STATE_KEY not in context.state.array_records and store is not None:
        saved = store.load()
        if saved is not None:
            handled, before, after = saved
            logic.load_state_dict(before if handled == round_ else after)
            return logic, store
    if STATE_KEY in context.state.array_records:
        stored = context.state.array_records[STATE_KEY]
        scalars = set(json.loads(str(context.state.config_records[SCALARS_KEY]["scalars"])))
        logic.load_state_dict(
            {
                key: array.numpy().reshape(()) if key in scalars else array.numpy()
                for key, array in stored.items()
            }
        )
    return logic, store


def _save(logic: ClientLogic, context: Context) -> None:
    """The group's state into ``context.state`` (Flower returns 0-d arrays as 1-d: the scalar
    entries are listed so that they come back as scalars)."""
    state = logic.state_dict()
    context.state.array_records[STATE_KEY] = ArrayRecord(
        {key: Array(np.ascontiguousarray(np.atleast_1d(value))) for key, value in state.items()}
    )
    scalars = [key for key, value in state.items() if value.ndim == 0]
    context.state.config_records[SCALARS_KEY] = ConfigRecord({"scalars": json.dumps(scalars)})


def build_client_app(job: FlowerJob | None = None) -> ClientApp:
    """The ClientApp; without ``job`` (a deployment) each message reads it from the run config."""
    app = ClientApp()

    @app.query("hello")
    def hello(message: Message, context: Context) -> Message:
        logic, _ = _client_logic(_job(job, context), context)
        return Message(
            RecordDict({"ids": ArrayRecord({"client_ids": Array(logic.client_ids)})}),
            reply_to=message,
        )

    @app.train("step")
    def step(message: Message, context: Context) -> Message:
        started = time.perf_counter()
        request = decode(message.content)
        logic, store = _client_logic(_job(job, context), context, request.round)
        before = _copy(logic.state_dict()) if store is not None else {}
        reply = logic.handle(request)
        _save(logic, context)
        if store is not None:
            store.save(request.round, before, logic.state_dict())
        content = encode(reply)
        content[TIMING_KEY] = MetricRecord({"handler-s": time.perf_counter() - started})
        return Message(content, reply_to=message)

    @app.query("regret")
    def regret(message: Message, context: Context) -> Message:
        record = _client_logic(_job(job, context), context)[0].regret_record()
        arrays = {
            "client_ids": record.client_ids,
            "increment_diff": record.increment_diff,
            "client_regret": record.client_regret,
            "client_pulls": record.client_pulls,
        }
        return Message(
            RecordDict(
                {
                    "regret": ArrayRecord(
                        {k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()}
                    ),
                    "scale": ConfigRecord({"scale": record.scale}),
                }
            ),
            reply_to=message,
        )

    return app


class FlowerGridRuntime(Runtime):
    """Delivers each round's message to the nodes through a Flower ``Grid``.

    Every round has a deadline, ``timeout`` seconds after the push. A node is lost as a whole when
    it answers with an error, stays silent until the deadline, or sends a reply that cannot be
    trusted: wrong clients, round, dtype kind or non-finite values (the codec); a field it echoes
    with another shape than was sent; a sparse field its mask does not fit; a field whose dtype or
    shape differs from the same field in earlier accepted replies of that kind; a structure (kind,
    fields, dtypes, shapes) that differs from the majority of the round's nodes (a tie that earlier
    rounds cannot settle rejects every tied node). ``exchange`` then raises ``ClientFailure`` for
    the lost nodes' clients with the joined replies of the other nodes, so that a rejected reply
    never reaches the server. Lost nodes are not asked again (nor for their regret records);
    ``drop`` forgets them. The first reply of a kind from a lone node can only be checked by the
    codec and against what was sent.

    Replies are matched to the message sent by ``reply_to_message_id``, never by their sender: the
    error reply Flower makes for a dead node comes from the SuperLink (``src_node_id`` 1).
    """

    def __init__(
        self,
        grid: Grid,
        ranges: dict[int, np.ndarray],
        timeout: float,
        poll_seconds: float,
        reconnect_seconds: float = 0.0,
    ) -> None:
        self.grid, self.ranges = grid, dict(ranges)
        self.timeout, self.poll_seconds = timeout, poll_seconds
        #: How long a round waits for a restarted node (new node id, same clients) to replace a
        #: silent or failed one; the round is then delivered to it again.
        self.reconnect_seconds = reconnect_seconds
        self._strangers: set[int] = set()
        #: Nodes lost and not (yet) dropped, with the reason.
        self.lost: dict[int, str] = {}
        #: Nodes dropped by ``drop``, with their clients.
        self.dropped: dict[int, np.ndarray] = {}
        # (reply kind, "fields" or "meta", name) -> (dtype, trailing shape) of accepted replies
        self._layouts: dict[tuple[str, str, str], tuple[str, tuple[int, ...]]] = {}
        # request kind -> structures of the replies accepted for it
        self._structures: dict[str, set[tuple]] = {}
        #: Per exchange: round, kind, the server's compute since the previous exchange ended
        #: (aggregate, then configure), seconds from push to the last reply, and the slowest
        #: node's ClientApp handler seconds (the rest of the exchange is Flower's transport).
        self.timings: list[dict[str, float | int | str]] = []
        self._last_end = time.perf_counter()

    def _send(self, messages: list[Message]) -> tuple[dict[int, Message], dict[int, str], set[int]]:
        """Push, then pull until every node replied or the deadline. Returns the good replies and
        the error replies' reasons by node, and the nodes silent until the deadline."""
        if not messages:
            return {}, {}, set()
        ids = list(self.grid.push_messages(messages))
        node_of = {mid: m.metadata.dst_node_id for mid, m in zip(ids, messages, strict=True)}
        pending: set[str] = set(ids)
        replies: dict[int, Message] = {}
        errors: dict[int, str] = {}
        deadline = time.monotonic() + self.timeout
        while pending and time.monotonic() < deadline:
            for reply in self.grid.pull_messages(list(pending)):
                mid = reply.metadata.reply_to_message_id
                if mid not in pending:  # a stray or repeated reply: not an answer we wait for
                    continue
                pending.discard(mid)
                if reply.has_error():
                    errors[node_of[mid]] = (
                        f"error reply (code {reply.error.code}): {reply.error.reason}"
                    )
                else:
                    replies[node_of[mid]] = reply
            if pending:
                time.sleep(self.poll_seconds)
        return replies, errors, {node_of[mid] for mid in pending}

    def _where(self, node: int) -> str:
        return f"node {node} (clients {describe_clients(self.ranges[node])})"

    def _failure(self, failures: dict[int, str], partial: BanditMessage | None) -> ClientFailure:
        """Mark the nodes lost; the exception naming all their clients."""
        self.lost.update(failures)
        lost = np.concatenate([self.ranges[node] for node in failures])
        reasons = {self._where(node): why for node, why in sorted(failures.items())}
        return ClientFailure(lost, reasons, partial)

    @staticmethod
    def _layout(reply: BanditMessage) -> dict[tuple[str, str], tuple[str, tuple[int, ...]]]:
        """(part, name) -> (dtype, shape after the client axis) of every array of a reply."""
        return {
            (part, name): (value.dtype.str, tuple(value.shape[1:]))
            for part, values in (("fields", reply.fields), ("meta", reply.meta))
            for name, value in values.items()
        }

    @staticmethod
    def _show(layout: tuple[str, tuple[int, ...]] | None) -> str:
        if layout is None:
            return "absent"
        return f"{layout[0]} of shape (n{''.join(f', {k}' for k in layout[1])})"

    def _check_reply(self, sent: BanditMessage, reply: BanditMessage) -> None:
        """Shapes against what was sent and against earlier replies; raise MalformedReplyError."""
        for name, value in reply.fields.items():
            if name in sent.fields and value.shape[1:] != sent.fields[name].shape[1:]:
                raise MalformedReplyError(
                    f"field {name!r} has shape {value.shape}, was sent as {sent.fields[name].shape}"
                )
        for name, mask_name in reply.sparse.items():
            value, mask = reply.fields[name], reply.fields[mask_name]
            if mask.dtype != np.bool_ or value.shape[: mask.ndim] != mask.shape:
                raise MalformedReplyError(
                    f"sparse field {name!r} of shape {value.shape} does not fit its mask "
                    f"{mask_name!r} of shape {mask.shape} and dtype {mask.dtype}"
                )
        for (part, name), layout in self._layout(reply).items():
            known = self._layouts.get((reply.kind, part, name))
            if known is not None and known != layout:
                raise MalformedReplyError(
                    f"{part} {name!r} of a {reply.kind!r} reply is {self._show(layout)}; in "
                    f"earlier replies it was {self._show(known)}"
                )

    def _outvoted(self, request_kind: str, decoded: dict[int, BanditMessage]) -> dict[int, str]:
        """The nodes whose reply structure is not the round's accepted one, with the reason; the
        accepted structure is the one most nodes sent (ties settled by earlier rounds)."""
        structures = {
            node: (
                reply.kind,
                tuple(sorted(self._layout(reply).items())),
                tuple(sorted(reply.sparse.items())),
                tuple(sorted(reply.known)),
            )
            for node, reply in decoded.items()
        }
        votes: dict[tuple, int] = {}
        for structure in structures.values():
            votes[structure] = votes.get(structure, 0) + 1
        top = max(votes.values(), default=0)
        leaders = [s for s, count in votes.items() if count == top]
        if len(leaders) > 1:
            leaders = [s for s in leaders if s in self._structures.get(request_kind, set())]
        if len(leaders) != 1:
            return {
                node: "its reply's structure (kind, fields, dtypes, shapes) disagrees with "
                "other nodes' and no majority or earlier round settles which is right"
                for node in structures
            }
        accepted = leaders[0]
        self._structures.setdefault(request_kind, set()).add(accepted)
        kind = accepted[0]
        self._layouts.update({(kind, *key): layout for key, layout in accepted[1]})
        rejected = {}
        for node, structure in structures.items():
            if structure == accepted:
                continue
            if structure[0] != kind:
                why = f"kind {structure[0]!r} (majority: {kind!r})"
            else:
                mine, theirs = dict(structure[1]), dict(accepted[1])
                names = sorted(
                    k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k)
                )
                why = ", ".join(
                    f"{part} {name!r} {self._show(mine.get((part, name)))} "
                    f"(majority: {self._show(theirs.get((part, name)))})"
                    for part, name in names
                ) or (
                    f"sparse {dict(structure[2])} and known {list(structure[3])} (majority: "
                    f"{dict(accepted[2])} and {list(accepted[3])})"
                )
            rejected[node] = f"malformed reply: {why}"
        return rejected

    def exchange(self, message: BanditMessage) -> BanditMessage:
        """The joined replies; raises ``ClientFailure`` when nodes are lost (see the class)."""
        sent: dict[int, BanditMessage] = {}
        out, failures = [], {}
        for node, ids in self.ranges.items():
            positions = np.flatnonzero(np.isin(message.client_ids, ids))
            if len(positions) == 0:
                continue
            sent[node] = message.select(positions)
            if node in self.lost:
                failures[node] = f"lost earlier: {self.lost[node]}"
            else:
                out.append(Message(encode(sent[node]), dst_node_id=node, message_type="train.step"))
        served = np.concatenate([p.client_ids for p in sent.values()] + [np.empty(0, np.int64)])
        if len(served) != message.num_clients:
            unserved = np.setdiff1d(message.client_ids, served)
            raise ValueError(
                f"round {message.round} addresses clients no node serves (or dropped ones): "
                f"{describe_clients(unserved)}"
            )
        started = time.perf_counter()
        replies, errors, silent = self._send(out)
        handler = [
            float(r.content.metric_records[TIMING_KEY]["handler-s"])
            for r in replies.values()
            if TIMING_KEY in r.content.metric_records
        ]
        self.timings.append(
            {
                "round": message.round,
                "kind": message.kind,
                "server_s": started - self._last_end,
                "exchange_s": time.perf_counter() - started,
                "client_s": max(handler, default=float("nan")),
            }
        )
        self._last_end = time.perf_counter()
        failures.update(errors)
        failures.update({node: f"no reply within {self.timeout:g} s" for node in silent})
        decoded = {}
        for node, reply in replies.items():
            try:
                part = decode(reply.content, sent[node].client_ids, message.round)
                self._check_reply(sent[node], part)
            except MalformedReplyError as err:
                failures[node] = f"malformed reply: {err}"
            else:
                decoded[node] = part
        failures.update(self._outvoted(message.kind, decoded))
        unreachable = [n for n in failures if n in errors or n in silent]
        if unreachable and self.reconnect_seconds > 0:
            self._reconnect(unreachable, sent, message, failures, decoded)
        parts = [decoded[node] for node in sorted(decoded) if node not in failures]
        if failures:
            raise self._failure(failures, BanditMessage.concatenate(parts) if parts else None)
        return BanditMessage.concatenate(parts)

    def _reconnect(
        self,
        unreachable: list[int],
        sent: dict[int, BanditMessage],
        message: BanditMessage,
        failures: dict[int, str],
        decoded: dict[int, BanditMessage],
    ) -> None:
        """Wait up to ``reconnect_seconds`` for new nodes serving exactly the clients of the
        ``unreachable`` ones (restarted SuperNodes), move those clients to them and deliver the
        round again; updates ``failures`` and ``decoded`` in place."""
        waiting = {node: self.ranges[node] for node in unreachable}
        deadline = time.monotonic() + self.reconnect_seconds
        while waiting and time.monotonic() < deadline:
            known = set(self.ranges) | set(self.dropped) | self._strangers
            new = [n for n in self.grid.get_node_ids() if n not in known]
            hello = [
                Message(RecordDict({}), dst_node_id=n, message_type="query.hello") for n in new
            ]
            replies, _, _ = self._send(hello)
            for node, reply in replies.items():
                try:
                    ids = reply.content.array_records["ids"]["client_ids"].numpy()
                except KeyError:
                    ids = np.empty(0, np.int64)
                old = next((o for o, r in waiting.items() if np.array_equal(r, ids)), None)
                if old is None:
                    self._strangers.add(node)
                    continue
                del waiting[old]
                self.ranges[node] = self.ranges.pop(old)
                self.lost.pop(old, None)
                sent[node] = sent.pop(old)
                reason = failures.pop(old)
                again = Message(encode(sent[node]), dst_node_id=node, message_type="train.step")
                answers, errors, _ = self._send([again])
                try:
                    if node not in answers:
                        raise MalformedReplyError(errors.get(node, "no reply"))
                    part = decode(answers[node].content, sent[node].client_ids, message.round)
                    self._check_reply(sent[node], part)
                except MalformedReplyError as err:
                    failures[node] = f"{reason}; its replacement failed too: {err}"
                else:
                    decoded[node] = part
            if waiting:
                time.sleep(0.5)

    @staticmethod
    def _regret_record(content: RecordDict, client_ids: np.ndarray) -> RegretRecord:
        try:
            arrays = {k: a.numpy() for k, a in content.array_records["regret"].items()}
            record = RegretRecord(
                arrays["client_ids"],
                arrays["increment_diff"],
                arrays["client_regret"],
                arrays["client_pulls"],
                float(content.config_records["scale"]["scale"]),
            )
        except (KeyError, ValueError, TypeError) as err:
            raise MalformedReplyError(f"not a regret record: {err}") from None
        n = len(client_ids)
        if not np.array_equal(record.client_ids, client_ids):
            raise MalformedReplyError(
                f"regret of clients {record.client_ids.tolist()}, expected {client_ids.tolist()}"
            )
        if (
            record.increment_diff.ndim != 1
            or record.client_regret.shape != (n,)
            or record.client_pulls.shape != (n,)
            or record.client_pulls.dtype.kind not in "iu"
        ):
            raise MalformedReplyError("regret record arrays of the wrong shape or dtype")
        values = (record.increment_diff, record.client_regret, np.array(record.scale))
        if not all(v.dtype.kind == "f" and np.all(np.isfinite(v)) for v in values):
            raise MalformedReplyError("regret record with NaN, infinite or non-float values")
        return record

    def regret_records(self) -> list[RegretRecord]:
        """The records of the nodes still reachable; nodes that fail now are lost (ClientFailure):
        the next call leaves them out."""
        messages = [
            Message(RecordDict({}), dst_node_id=node, message_type="query.regret")
            for node in self.ranges
            if node not in self.lost
        ]
        replies, failures, silent = self._send(messages)
        failures.update({node: f"no reply within {self.timeout:g} s" for node in silent})
        records: dict[int, RegretRecord] = {}
        for node, reply in sorted(replies.items()):
            try:
                records[node] = self._regret_record(reply.content, self.ranges[node])
            except MalformedReplyError as err:
                failures[node] = f"malformed regret record: {err}"
        horizons = [(r.increment_diff.shape, r.scale) for r in records.values()]
        common = max(set(horizons), key=horizons.count, default=None)
        for node, record in records.items():
            if (record.increment_diff.shape, record.scale) != common:
                failures[node] = "regret record of another horizon or scale than the other nodes'"
        if failures:
            raise self._failure(failures, None)
        return list(records.values())

    def drop(self, client_ids: np.ndarray) -> None:
        """Forget the nodes serving ``client_ids``: a node is dropped as a whole."""
        ids = np.unique(np.asarray(client_ids, dtype=np.int64))
        nodes = [node for node, served in self.ranges.items() if np.isin(served, ids).any()]
        for node in nodes:
            if not np.isin(self.ranges[node], ids).all():
                raise ValueError(
                    f"node {node} serves clients {describe_clients(self.ranges[node])}: a node is "
                    f"dropped as a whole, not for clients {describe_clients(ids)} only"
                )
        covered = np.concatenate([self.ranges[n] for n in nodes] + [np.empty(0, np.int64)])
        if len(unknown := np.setdiff1d(ids, covered)):
            raise ValueError(
                f"cannot drop clients {describe_clients(unknown)}: no node serves them"
            )
        for node in nodes:
            self.dropped[node] = self.ranges.pop(node)
            self.lost.pop(node, None)


def discover_nodes(grid: Grid, job: FlowerJob, num_clients: int) -> dict[int, np.ndarray]:
    """Wait (with a deadline) until nodes cover every client exactly once; their ranges. A node
    that fails to answer its hello stops the discovery, by name."""
    deadline = time.monotonic() + job.start_deadline
    ranges: dict[int, np.ndarray] = {}
    counts = np.zeros(num_clients, dtype=np.int64)
    runtime = FlowerGridRuntime(grid, {}, job.round_timeout, job.poll_seconds)
    while time.monotonic() < deadline:
        new = [n for n in grid.get_node_ids() if n not in ranges]
        if new:
            hello = [
                Message(RecordDict({}), dst_node_id=n, message_type="query.hello") for n in new
            ]
            replies, errors, silent = runtime._send(hello)
            if errors:
                node, why = min(errors.items())
                raise RuntimeError(f"node {node} failed: {why}")
            if silent:
                raise TimeoutError(
                    f"no reply within {job.round_timeout} s from nodes {sorted(silent)}"
                )
            for node, reply in replies.items():
                try:
                    ranges[node] = reply.content.array_records["ids"]["client_ids"].numpy()
                except KeyError:
                    raise RuntimeError(f"node {node} sent a malformed hello reply") from None
        counts = np.bincount(
            np.concatenate([*ranges.values(), np.empty(0, np.int64)]), minlength=num_clients
        )
        if np.any(counts > 1):
            raise RuntimeError(f"clients served by two nodes: {np.flatnonzero(counts > 1)}")
        if np.all(counts == 1):
            return ranges
        time.sleep(0.2)
    missing = np.flatnonzero(counts == 0)
    raise TimeoutError(f"after {job.start_deadline} s no node serves clients {missing.tolist()}")


def build_server_app(job: FlowerJob | None = None) -> ServerApp:
    """The ServerApp; without ``job`` (a deployment) it reads the job from the run config and
    writes the seed's result files to the run config's ``result-dir``."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        deployed = job is None
        started = time.perf_counter()
        run(_job(job, context), grid)
        if deployed:
            _write_result(_job(job, context), context, time.perf_counter() - started)

    def run(job: FlowerJob, grid: Grid) -> None:
        from fedbandit.algorithms import get_algorithm
        from fedbandit.config import validate_experiment
        from fedbandit.simulation import problem_spec

        config = validate_experiment(job.config)
        instance = _instance(json.dumps(job.config, sort_keys=True))
        spec_entry = get_algorithm(job.algorithm)
        spec = problem_spec(instance, config.horizon)
        server = spec_entry.make_server(
            spec, spec_entry.params(**config.hyperparameters(job.algorithm))
        )
        ranges = discover_nodes(grid, job, instance.num_clients)
        runtime = FlowerGridRuntime(
            grid, ranges, job.round_timeout, job.poll_seconds, job.reconnect_seconds
        )
        job.results.append(run_federation(server, runtime, job.on_client_failure))
        job.timings[:] = runtime.timings

    return app


def _write_result(job: FlowerJob, context: Context, seconds: float) -> None:
    """Write the finished seed into ``result-dir`` (on the SuperLink host), as a local run does."""
    from fedbandit.runner import write_seed_result
    from fedbandit.simulation import SeedResult

    result_dir = str(context.run_config.get("result-dir", ""))
    if not result_dir:
        raise ValueError("the run config has no 'result-dir': nowhere to write the results")
    outcome = job.results.pop()
    write_latency(
        Path(result_dir), job.algorithm, int(context.run_config.get("seed", 0)), job.timings
    )
    write_seed_result(
        job.config,
        Path(result_dir),
        int(context.run_config.get("seed", 0)),
        SeedResult.of(job.algorithm, list(job.entropy), outcome, seconds),
    )


def write_latency(run_dir: Path, algorithm: str, seed: int, timings: list[dict[str, Any]]) -> None:
    """``seed_K.latency.csv``: per exchange the server compute, Flower transport and client
    compute seconds (transport = exchange wall time minus the slowest node's handler)."""
    import pandas as pd

    from fedbandit.results import atomic_write_csv, seed_stem

    frame = pd.DataFrame(timings, columns=["round", "kind", "server_s", "exchange_s", "client_s"])
    frame["transport_s"] = frame["exchange_s"] - frame["client_s"]
    atomic_write_csv(seed_stem(run_dir, algorithm, seed).with_suffix(".latency.csv"), frame)
