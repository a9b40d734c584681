"""ServerApp and ClientApp driving fedbandit's server and client logic, and the Flower runtime.

A (virtual) SuperNode hosts one client group: a contiguous range of logical clients. Every message
is handled by rebuilding the group from the job description and restoring its state from
``context.state`` (a Flower deployment starts a fresh ClientApp process per message), so nodes keep
only arrays. The server learns each node's range before round 1 and checks that the ranges cover
every client exactly once.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedbandit.environment import RegretRecord
from fedbandit.federation import Message as BanditMessage
from fedbandit.federation.protocol import ClientLogic
from fedbandit.federation.runtime import FederationResult, Runtime, run_federation
from fedbandit.flower.codec import MalformedReplyError, decode, encode

#: Keys in ``context.state`` (one namespace for every record type of a ``RecordDict``).
STATE_KEY = "fedbandit.state"
SCALARS_KEY = "fedbandit.scalars"


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
    results: list[FederationResult] = field(default_factory=list, compare=False)


@lru_cache(maxsize=4)
def _instance(config_json: str):
    from fedbandit.config import validate_experiment
    from fedbandit.instances import build_instance

    return build_instance(validate_experiment(json.loads(config_json)).instance)


def node_clients(num_clients: int, partition: int, num_partitions: int) -> np.ndarray:
    """The contiguous client range of node ``partition`` of ``num_partitions``."""
    if not 0 <= partition < num_partitions or num_partitions > num_clients:
        raise ValueError(f"partition {partition} of {num_partitions} for {num_clients} clients")
    return np.array_split(np.arange(num_clients, dtype=np.int64), num_partitions)[partition]


def _client_logic(job: FlowerJob, context: Context) -> ClientLogic:
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
    if STATE_KEY in context.state.array_records:
        stored = context.state.array_records[STATE_KEY]
        scalars = set(json.loads(str(context.state.config_records[SCALARS_KEY]["scalars"])))
        logic.load_state_dict(
            {
                key: array.numpy().reshape(()) if key in scalars else array.numpy()
                for key, array in stored.items()
            }
        )
    return logic


def _save(logic: ClientLogic, context: Context) -> None:
    """The group's state into ``context.state`` (Flower returns 0-d arrays as 1-d: the scalar
    entries are listed so that they come back as scalars)."""
    state = logic.state_dict()
    context.state.array_records[STATE_KEY] = ArrayRecord(
        {key: Array(np.ascontiguousarray(np.atleast_1d(value))) for key, value in state.items()}
    )
    scalars = [key for key, value in state.items() if value.ndim == 0]
    context.state.config_records[SCALARS_KEY] = ConfigRecord({"scalars": json.dumps(scalars)})


def build_client_app(job: FlowerJob) -> ClientApp:
    app = ClientApp()

    @app.query("hello")
    def hello(message: Message, context: Context) -> Message:
        logic = _client_logic(job, context)
        return Message(
            RecordDict({"ids": ArrayRecord({"client_ids": Array(logic.client_ids)})}),
            reply_to=message,
        )

    @app.train("step")
    def step(message: Message, context: Context) -> Message:
        logic = _client_logic(job, context)
        reply = logic.handle(decode(message.content))
        _save(logic, context)
        return Message(encode(reply), reply_to=message)

    @app.query("regret")
    def regret(message: Message, context: Context) -> Message:
        record = _client_logic(job, context).regret_record()
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
    """Delivers each round's message to the nodes through a Flower ``Grid``."""

    def __init__(
        self, grid: Grid, ranges: dict[int, np.ndarray], timeout: float, poll_seconds: float
    ) -> None:
        self.grid, self.ranges = grid, ranges
        self.timeout, self.poll_seconds = timeout, poll_seconds

    def _send(self, messages: list[Message]) -> dict[int, Message]:
        """Push, then pull until every node replied or the deadline; errors name the node."""
        ids = list(self.grid.push_messages(messages))
        node_of = {mid: m.metadata.dst_node_id for mid, m in zip(ids, messages, strict=True)}
        pending, replies = set(ids), {}
        deadline = time.monotonic() + self.timeout
        while pending and time.monotonic() < deadline:
            for reply in self.grid.pull_messages(list(pending)):
                mid = reply.metadata.reply_to_message_id
                pending.discard(mid)
                if reply.has_error():
                    raise RuntimeError(f"node {node_of[mid]} failed: {reply.error.reason}")
                replies[node_of[mid]] = reply
            if pending:
                time.sleep(self.poll_seconds)
        if pending:
            lost = sorted(node_of[m] for m in pending)
            raise TimeoutError(f"no reply within {self.timeout} s from nodes {lost}")
        return replies

    def exchange(self, message: BanditMessage) -> BanditMessage:
        out, expected = [], {}
        for node, ids in self.ranges.items():
            positions = np.flatnonzero(np.isin(message.client_ids, ids))
            if len(positions) == 0:
                continue
            part = message.select(positions)
            expected[node] = part.client_ids
            out.append(Message(encode(part), dst_node_id=node, message_type="train.step"))
        parts = []
        for node, reply in self._send(out).items():
            try:
                parts.append(decode(reply.content, expected[node], message.round))
            except MalformedReplyError as err:
                raise RuntimeError(f"node {node} sent a malformed reply: {err}") from None
        return BanditMessage.concatenate(parts)

    def regret_records(self) -> list[RegretRecord]:
        messages = [
            Message(RecordDict({}), dst_node_id=node, message_type="query.regret")
            for node in self.ranges
        ]
        records = []
        for reply in self._send(messages).values():
            arrays = {k: a.numpy() for k, a in reply.content.array_records["regret"].items()}
            scale = float(reply.content.config_records["scale"]["scale"])
            records.append(
                RegretRecord(
                    arrays["client_ids"],
                    arrays["increment_diff"],
                    arrays["client_regret"],
                    arrays["client_pulls"],
                    scale,
                )
            )
        return records


def discover_nodes(grid: Grid, job: FlowerJob, num_clients: int) -> dict[int, np.ndarray]:
    """Wait (with a deadline) until nodes cover every client exactly once; their ranges."""
    deadline = time.monotonic() + job.start_deadline
    ranges: dict[int, np.ndarray] = {}
    runtime = FlowerGridRuntime(grid, {}, job.round_timeout, job.poll_seconds)
    while time.monotonic() < deadline:
        new = [n for n in grid.get_node_ids() if n not in ranges]
        if new:
            hello = [
                Message(RecordDict({}), dst_node_id=n, message_type="query.hello") for n in new
            ]
            for node, reply in runtime._send(hello).items():
                ranges[node] = reply.content.array_records["ids"]["client_ids"].numpy()
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


def build_server_app(job: FlowerJob) -> ServerApp:
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
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
        runtime = FlowerGridRuntime(grid, ranges, job.round_timeout, job.poll_seconds)
        job.results.append(run_federation(server, runtime))

    return app
