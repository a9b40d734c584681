"""The echo ServerApp: per round, one message of the round's downlink size to every node, then
pull until every node replied (poll and deadline as fedbandit's ``FlowerGridRuntime``); writes the
per-round exchange seconds as JSON to the run config's ``out``.

Payloads are zeros but for an 8-byte stamp unique to the message (echoed in the reply): Flower
stores objects by content hash and does not push an object the SuperLink already holds, so equal
payloads would travel once per run instead of once per message."""

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


def exchange(
    grid: Grid, messages: list[Message], timeout: float, poll_seconds: float
) -> list[Message]:
    """Push, then pull every ``poll_seconds`` until every message has its reply; raises
    ``RuntimeError`` on an error reply or at the deadline."""
    pending = set(grid.push_messages(messages))
    replies = []
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for reply in grid.pull_messages(list(pending)):
            mid = reply.metadata.reply_to_message_id
            if mid not in pending:
                continue
            pending.discard(mid)
            if reply.has_error():
                raise RuntimeError(f"error reply (code {reply.error.code}): {reply.error.reason}")
            replies.append(reply)
        if pending:
            time.sleep(poll_seconds)
    if pending:
        raise RuntimeError(f"{len(pending)} replies missing after {timeout} s")
    return replies


def payload(size: int, stamp: int) -> ArrayRecord:
    """``size`` bytes: zeros, the first (up to) 8 of them the little-endian ``stamp``."""
    data = np.zeros(size, dtype=np.uint8)
    head = np.frombuffer(stamp.to_bytes(8, "little"), dtype=np.uint8)[:size]
    data[: len(head)] = head
    return ArrayRecord({"bytes": Array(data)})


def wait_for_nodes(grid: Grid, count: int, deadline_s: float) -> list[int]:
    """The node ids once at least ``count`` nodes are connected (``TimeoutError`` otherwise)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= count:
            return nodes
        time.sleep(0.2)
    raise TimeoutError(f"fewer than {count} nodes after {deadline_s} s")


def write_json(path: Path, data: object) -> None:
    """Write ``data`` to a temporary file next to ``path``, then rename it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle)
    os.replace(tmp, path)


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    rounds = [(int(down), int(up)) for down, up in json.loads(str(config["rounds"]))]
    out = str(config["out"])
    if not out:
        raise ValueError("the run config has no 'out': nowhere to write the timings")
    poll, timeout = float(config["poll-seconds"]), float(config["round-timeout"])
    nodes = wait_for_nodes(grid, int(config["num-nodes"]), float(config["start-deadline"]))
    hello = [Message(RecordDict({}), dst_node_id=n, message_type="query.hello") for n in nodes]
    exchange(grid, hello, timeout, poll)
    timings = []
    for index, (down, up) in enumerate(rounds):
        messages = []
        for position, node in enumerate(nodes):
            stamp = index * len(nodes) + position + 1
            content = RecordDict(
                {
                    "payload": payload(down, stamp),
                    "size": MetricRecord({"reply-bytes": up, "stamp": stamp}),
                }
            )
            messages.append(Message(content, dst_node_id=node, message_type="train.echo"))
        started = time.perf_counter()
        replies = exchange(grid, messages, timeout, poll)
        seconds = time.perf_counter() - started
        handler = max(_seconds(r.content.metric_records["timing"]["handler-s"]) for r in replies)
        timings.append(
            {
                "round": index,
                "downlink_bytes": down,
                "uplink_bytes": up,
                "exchange_s": seconds,
                "client_s": handler,
            }
        )
    write_json(Path(out), {"nodes": len(nodes), "rounds": timings})


def _seconds(value: object) -> float:
    """A timing metric as seconds (NaN for anything but a number)."""
    return float(value) if isinstance(value, (int, float)) else float("nan")
