"""The echo ClientApp: replies with an ArrayRecord of the requested number of bytes."""

import time

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.query("hello")
def hello(message: Message, context: Context) -> Message:
    """Warm-up: loads the app on the node (as fedbandit's node discovery does)."""
    return Message(RecordDict({}), reply_to=message)


@app.train("echo")
def echo(message: Message, context: Context) -> Message:
    """Read the payload, reply with ``reply-bytes`` bytes (zeros but for the message's 8-byte
    stamp, so that no two replies are the same Flower object) and the handler's seconds."""
    started = time.perf_counter()
    received = int(message.content.array_records["payload"]["bytes"].numpy().size)
    request = message.content.metric_records["size"]
    size, stamp = _whole(request["reply-bytes"]), _whole(request["stamp"])
    data = np.zeros(size, dtype=np.uint8)
    head = np.frombuffer(stamp.to_bytes(8, "little"), dtype=np.uint8)[:size]
    data[: len(head)] = head
    content = RecordDict(
        {
            "payload": ArrayRecord({"bytes": Array(data)}),
            "size": MetricRecord({"received-bytes": received, "stamp": stamp}),
        }
    )
    content["timing"] = MetricRecord({"handler-s": time.perf_counter() - started})
    return Message(content, reply_to=message)


def _whole(value: object) -> int:
    """A metric that must be a whole number."""
    if not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {type(value).__name__}")
    return int(value)
