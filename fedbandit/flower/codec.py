"""``Message`` <-> Flower ``RecordDict``: arrays as ``ArrayRecord``s (never pickles), the header as
JSON in a ``ConfigRecord``. A field that is the same for every client of a node (a broadcast view,
leading stride 0) travels once per node and is expanded on arrival."""

from __future__ import annotations

import json
from collections.abc import Collection

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedbandit.federation.messages import Message


class MalformedReplyError(ValueError):
    """A reply that cannot be trusted: wrong clients, round, kind, shapes or non-finite values."""


def _arrays(values: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({name: Array(np.ascontiguousarray(value)) for name, value in values.items()})


def encode(message: Message) -> RecordDict:
    fields, broadcast = {}, []
    for name, value in message.fields.items():
        if value.ndim >= 1 and value.shape[0] > 1 and value.strides[0] == 0:
            fields[name] = value[0]
            broadcast.append(name)
        else:
            fields[name] = value
    header = {
        "kind": message.kind,
        "round": message.round,
        "sparse": dict(message.sparse),
        "known": sorted(message.known),
        "broadcast": broadcast,
    }
    return RecordDict(
        {
            "header": ConfigRecord({"json": json.dumps(header)}),
            "ids": _arrays({"client_ids": message.client_ids}),
            "fields": _arrays(fields),
            "meta": _arrays(dict(message.meta)),
        }
    )


def decode(
    record: RecordDict,
    expected_ids: np.ndarray | None = None,
    expected_round: int | None = None,
    expected_kinds: Collection[str] | None = None,
) -> Message:
    """Rebuild a ``Message``; with expectations, reject what does not match."""
    try:
        header = json.loads(str(record.config_records["header"]["json"]))
        ids = record.array_records["ids"]["client_ids"].numpy()
        fields = {name: array.numpy() for name, array in record.array_records["fields"].items()}
        meta = {name: array.numpy() for name, array in record.array_records["meta"].items()}
    except (KeyError, ValueError, TypeError) as err:
        raise MalformedReplyError(f"not a fedbandit message: {err}") from None
    if expected_ids is not None and not np.array_equal(ids, expected_ids):
        raise MalformedReplyError(
            f"replies for clients {ids.tolist()}, expected {expected_ids.tolist()}"
        )
    if expected_round is not None and header.get("round") != expected_round:
        raise MalformedReplyError(
            f"reply for round {header.get('round')}, expected {expected_round}"
        )
    if expected_kinds is not None and header.get("kind") not in expected_kinds:
        raise MalformedReplyError(
            f"reply of kind {header.get('kind')!r}, expected {expected_kinds}"
        )
    for name in header.get("broadcast", []):
        fields[name] = np.broadcast_to(fields[name], (len(ids), *fields[name].shape))
    for name, value in {**fields, **meta}.items():
        if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
            raise MalformedReplyError(f"field {name!r} holds NaN or infinite values")
        if value.dtype.kind not in "biuf":
            raise MalformedReplyError(f"field {name!r} has unsupported dtype {value.dtype}")
    try:
        return Message(
            header["kind"],
            int(header["round"]),
            ids,
            fields,
            sparse=header.get("sparse", {}),
            known=frozenset(header.get("known", [])),
            meta=meta,
        )
    except (KeyError, ValueError) as err:
        raise MalformedReplyError(str(err)) from None
