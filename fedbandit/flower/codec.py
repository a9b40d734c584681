"""fedbandit's wire format over Flower records.

- ``Message`` <-> Flower ``RecordDict`` (``encode``/``decode``): one ``ConfigRecord``
  (``HEADER_KEY``) holding the header and layout as JSON and the arrays packed into one buffer
  (raw bytes with their dtypes and shapes, never pickles); a buffer above ``INLINE_BYTES`` travels
  in an ``ArrayRecord`` instead (Flower splits it into chunks). A group's run-ahead replies the
  same way, one buffer for all (``encode_steps``/``decode_steps``). The same record carries the
  run-ahead instructions of a delivered message (``set_ahead``/``get_ahead``: step budget,
  exchanges used of the previous one) and the ClientApp handler's seconds in a reply
  (``set_handler_seconds``/``handler_seconds``; a measurement, not counted). A field that is the
  same for every client of a node (a broadcast view, leading stride 0) travels once per node and
  is expanded on arrival.
- A node's ``hello`` reply, its client ids (``encode_hello``/``decode_hello``).
- A client group's ``RegretRecord`` (``encode_regret``/``decode_regret``, checked against the
  node's clients), asked for in pieces of at most ``REGRET_PIECE_VALUES`` values of its curve
  (``regret_query``/``answer_regret_query``/``decode_regret_piece``).
- A client group's state in the ClientApp's ``context.state`` (``encode_state``/``decode_state``).

Flower 1.42 stores and moves every object of a message (the message, its ``RecordDict``, each
record, array and array chunk) in its own request to the SuperLink, and a SQLite SuperLink writes
on every request. A message as one ``ConfigRecord`` is 3 objects (message, record dict, record)
where header + ``ArrayRecord`` + timing was 7: fewer requests per round on every link.

Every decoder rejects what it cannot trust with ``MalformedReplyError``."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from flwr.app import Message as FlowerMessage

from fedbandit.federation.messages import Message
from fedbandit.federation.run_ahead import Ahead
from fedbandit.group_environment import RegretRecord


class MalformedReplyError(ValueError):
    """A reply that cannot be trusted: wrong clients, round, kind, shapes or non-finite values."""


#: dtype kinds a message may carry: booleans, integers, floats (never objects).
ALLOWED_KINDS = "biuf"
#: Keys in ``context.state`` (one namespace for every record type of a ``RecordDict``).
STATE_KEY = "fedbandit.state"
SCALARS_KEY = "fedbandit.scalars"
#: Key of a message's one ``ConfigRecord``: ``json`` (header and layout), ``packed`` (the arrays'
#: bytes, when inline), ``handler-s`` (a reply's ClientApp seconds), ``ahead-budget`` and
#: ``ahead-consumed`` (a delivered message's run-ahead instructions).
HEADER_KEY = "header"
#: Key of the ``ArrayRecord`` holding a packed buffer above ``INLINE_BYTES``.
DATA_KEY = "data"
#: Largest packed buffer sent inside the ``ConfigRecord``; a larger one goes in an ``ArrayRecord``,
#: which Flower splits into chunks of 5 MiB (``FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE``).
INLINE_BYTES = 4 * 1024 * 1024
#: Keys in ``context.state`` of a group's run-ahead memory (``fedbandit.federation.run_ahead``).
AHEAD_STATE_KEY = "fedbandit.ahead.base"
AHEAD_SCALARS_KEY = "fedbandit.ahead.scalars"
AHEAD_INFO_KEY = "fedbandit.ahead.info"
#: ``context.state``: the request a node answered last, and that answer's records (prefixed).
LAST_REQUEST_KEY = "fedbandit.last-request"
LAST_REPLY_PREFIX = "fedbandit.last-reply:"


def pack(arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, list[list[Any]]]:
    """All ``arrays`` in one byte buffer, and their layout ``[name, dtype, shape, offset]``.

    Flower 1.42 moves every object of a message (record, array, chunk) in its own HTTP request,
    so one buffer per message instead of one array per field cuts a round's requests about
    threefold; the buffer is raw C-order bytes, never a pickle."""
    layout, buffers, offset = [], [], 0
    for name, value in arrays.items():
        value = np.ascontiguousarray(value)
        layout.append([name, value.dtype.str, list(value.shape), offset])
        buffers.append(value.reshape(-1).view(np.uint8))
        offset += value.nbytes
    return (np.concatenate(buffers) if buffers else np.empty(0, np.uint8)), layout


def unpack(buffer: np.ndarray, layout: list[list[Any]]) -> dict[str, np.ndarray]:
    """The arrays of a ``pack``ed buffer (copies); a layout that does not fit is malformed."""
    if buffer.dtype != np.uint8 or buffer.ndim != 1:
        raise MalformedReplyError(f"packed buffer of dtype {buffer.dtype}, expected uint8")
    arrays = {}
    try:
        for name, dtype_str, shape, offset in layout:
            dtype = np.dtype(dtype_str)
            if dtype.kind not in ALLOWED_KINDS or dtype.hasobject:
                raise MalformedReplyError(f"field {name!r} has unsupported dtype {dtype}")
            shape = tuple(int(k) for k in shape)
            end = int(offset) + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if min(shape, default=0) < 0 or not 0 <= int(offset) <= end <= len(buffer):
                raise MalformedReplyError(f"field {name!r} does not fit the packed buffer")
            arrays[str(name)] = np.frombuffer(
                buffer[int(offset) : end].tobytes(), dtype=dtype
            ).reshape(shape)
    except (TypeError, ValueError) as err:
        raise MalformedReplyError(f"bad packed layout: {err}") from None
    return arrays


def _flatten(message: Message, prefix: str = "") -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """A message's arrays (named ``PREFIXsection/name``) and its header without the layout."""
    fields, broadcast, compact = {}, [], {}
    for name, value in message.fields.items():
        if value.ndim >= 1 and value.shape[0] > 1 and value.strides[0] == 0:
            fields[name] = value[0]
            broadcast.append(name)
        elif (entries := _masked_entries(message, name, value)) is not None:
            fields[name] = entries
            compact[name] = list(value.shape[message.fields[message.sparse[name]].ndim :])
        else:
            fields[name] = value
    arrays = {
        f"{prefix}ids/client_ids": message.client_ids,
        **{f"{prefix}fields/{k}": v for k, v in fields.items()},
        **{f"{prefix}meta/{k}": v for k, v in message.meta.items()},
    }
    header = {
        "kind": message.kind,
        "round": message.round,
        "sparse": dict(message.sparse),
        "known": sorted(message.known),
        "broadcast": broadcast,
        "compact": compact,
    }
    return arrays, header


def _masked_entries(message: Message, name: str, value: np.ndarray) -> np.ndarray | None:
    """A sparse field's entries under its mask, when every entry outside it is a zero bit for
    bit (so that filling zeros on arrival gives the same array); else None (sent whole). An
    upload with nothing to send then travels as a mask, not as d x d zeros per client."""
    mask_name = message.sparse.get(name)
    if mask_name is None or name in message.sparse.values():  # masks always travel whole
        return None
    mask = message.fields[mask_name]
    if mask.dtype != np.bool_ or value.shape[: mask.ndim] != mask.shape:
        return None
    outside = np.ascontiguousarray(value[~mask])
    if outside.view(np.uint8).any():
        return None
    return np.ascontiguousarray(value[mask])


def _records(
    arrays: dict[str, np.ndarray], header: dict[str, Any], inline_bytes: int = INLINE_BYTES
) -> RecordDict:
    buffer, layout = pack(arrays)
    record = ConfigRecord({"json": json.dumps({**header, "layout": layout})})
    if buffer.nbytes <= inline_bytes:
        record["packed"] = buffer.tobytes()
        return RecordDict({HEADER_KEY: record})
    return RecordDict({HEADER_KEY: record, DATA_KEY: ArrayRecord({"packed": Array(buffer)})})


def _header_and_buffer(record: RecordDict) -> tuple[dict[str, Any], np.ndarray]:
    """The JSON header and the packed buffer of ``_records`` (KeyError, ValueError, TypeError
    for what is not one)."""
    config = record.config_records[HEADER_KEY]
    header = json.loads(str(config["json"]))
    if not isinstance(header, dict):
        raise TypeError("the header is not a JSON object")
    if "packed" in config:
        packed = config["packed"]
        if not isinstance(packed, bytes):
            raise TypeError(f"packed arrays of type {type(packed).__name__}, expected bytes")
        return header, np.frombuffer(packed, dtype=np.uint8)
    return header, record.array_records[DATA_KEY]["packed"].numpy()


def encode(message: Message, inline_bytes: int = INLINE_BYTES) -> RecordDict:
    """``message`` as one record (its packed buffer in an ``ArrayRecord`` above
    ``inline_bytes``)."""
    arrays, header = _flatten(message)
    return _records(arrays, header, inline_bytes)


def encode_steps(messages: list[Message]) -> RecordDict:
    """Several replies (a group's run-ahead exchanges, ``fedbandit.federation.run_ahead``) in
    one record: one packed buffer, one header per reply."""
    arrays: dict[str, np.ndarray] = {}
    headers = []
    for step, message in enumerate(messages):
        part, header = _flatten(message, f"{step}:")
        arrays.update(part)
        headers.append(header)
    return _records(arrays, {"steps": headers})


def decode_steps(
    record: RecordDict, expected_ids: np.ndarray, first_round: int, max_steps: int
) -> list[Message]:
    """The replies of ``encode_steps``: at least one and at most ``max_steps``, for exchanges
    ``first_round``, ``first_round + 1``, ... in order, each checked as ``decode`` checks one."""
    try:
        header, buffer = _header_and_buffer(record)
        arrays = unpack(buffer, header["layout"])
        steps = list(header["steps"])
    except (KeyError, ValueError, TypeError) as err:
        raise MalformedReplyError(f"not a fedbandit run-ahead reply: {err}") from None
    if not 1 <= len(steps) <= max_steps:
        raise MalformedReplyError(f"{len(steps)} run-ahead replies, expected 1 to {max_steps}")
    by_step: list[dict[str, np.ndarray]] = [{} for _ in steps]
    for key, value in arrays.items():
        step, _, name = key.partition(":")
        if not step.isdigit() or int(step) >= len(steps):
            raise MalformedReplyError(f"run-ahead reply holds an array of no step: {key!r}")
        by_step[int(step)][name] = value
    return [
        _message(part, header, expected_ids, first_round + step, None)
        for step, (part, header) in enumerate(zip(by_step, steps, strict=True))
    ]


def _expand(entries: np.ndarray, mask: np.ndarray, tail: list[int], name: str) -> np.ndarray:
    """A compact sparse field back to its full shape: its entries under the mask, zeros
    elsewhere (as they were, bit for bit, when it was sent)."""
    shape = (*mask.shape, *(int(k) for k in tail))
    if mask.dtype != np.bool_ or entries.shape != (int(mask.sum()), *shape[mask.ndim :]):
        raise MalformedReplyError(
            f"compact field {name!r} of shape {entries.shape} does not fit its mask "
            f"{mask.shape} ({int(mask.sum()) if mask.dtype == np.bool_ else mask.dtype} set)"
        )
    full = np.zeros(shape, dtype=entries.dtype)
    full[mask] = entries
    return full


def decode(
    record: RecordDict,
    expected_ids: np.ndarray | None = None,
    expected_round: int | None = None,
    expected_kinds: Collection[str] | None = None,
) -> Message:
    """Rebuild a ``Message``; with expectations, reject what does not match."""
    try:
        header, buffer = _header_and_buffer(record)
        arrays = unpack(buffer, header["layout"])
    except (KeyError, ValueError, TypeError) as err:
        raise MalformedReplyError(f"not a fedbandit message: {err}") from None
    return _message(arrays, header, expected_ids, expected_round, expected_kinds)


def _message(
    arrays: dict[str, np.ndarray],
    header: dict[str, Any],
    expected_ids: np.ndarray | None,
    expected_round: int | None,
    expected_kinds: Collection[str] | None,
) -> Message:
    """The ``Message`` of a header and its arrays (``section/name``), checked."""
    sections: dict[str, dict[str, np.ndarray]] = {"ids": {}, "fields": {}, "meta": {}}
    for key, value in arrays.items():
        section, _, name = key.partition("/")
        if section not in sections:
            raise MalformedReplyError(f"unknown section in packed array {key!r}")
        sections[section][name] = value
    if "client_ids" not in sections["ids"]:
        raise MalformedReplyError("not a fedbandit message: no client ids")
    ids, fields, meta = sections["ids"]["client_ids"], sections["fields"], sections["meta"]
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
    try:
        for name in header.get("broadcast", []):
            fields[name] = np.broadcast_to(fields[name], (len(ids), *fields[name].shape))
        for name, tail in header.get("compact", {}).items():
            fields[name] = _expand(fields[name], fields[header["sparse"][name]], tail, name)
    except KeyError as err:
        raise MalformedReplyError(f"broadcast or compact field {err} is missing") from None
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


def _header_record(content: RecordDict) -> ConfigRecord:
    """``content``'s ``HEADER_KEY`` record, added empty when it has none (a query's content)."""
    if HEADER_KEY not in content.config_records:
        content[HEADER_KEY] = ConfigRecord()
    return content.config_records[HEADER_KEY]


def set_handler_seconds(content: RecordDict, seconds: float) -> None:
    """Record the ClientApp handler's seconds in a reply (a measurement, not counted)."""
    _header_record(content)["handler-s"] = float(seconds)


def handler_seconds(content: RecordDict) -> float | None:
    """The ClientApp handler's seconds of a reply, or None when it carries none."""
    config = content.config_records.get(HEADER_KEY)
    value = None if config is None else config.get("handler-s")
    return float(value) if isinstance(value, (int, float)) else None


def set_ahead(content: RecordDict, budget: int, consumed: int) -> None:
    """A delivered message's run-ahead instructions: ``budget`` (exchanges the group may run)
    and ``consumed`` (exchanges used of its previous delivery; 0: nothing to rewind)."""
    record = _header_record(content)
    record["ahead-budget"] = int(budget)
    record["ahead-consumed"] = int(consumed)


def get_ahead(content: RecordDict) -> tuple[int, int] | None:
    """``(budget, consumed)`` of ``set_ahead``, or None for a message without run-ahead."""
    config = content.config_records.get(HEADER_KEY)
    if config is None or "ahead-budget" not in config:
        return None
    budget, consumed = config["ahead-budget"], config.get("ahead-consumed")
    if not isinstance(budget, int) or not isinstance(consumed, int) or budget < 1 or consumed < 0:
        raise MalformedReplyError(
            f"run-ahead instructions budget={budget!r}, consumed={consumed!r}: expected a "
            "budget >= 1 and consumed >= 0"
        )
    return budget, consumed


def encode_hello(client_ids: np.ndarray) -> RecordDict:
    """A node's ``hello`` reply: the ids of the clients it serves."""
    return RecordDict({"ids": ArrayRecord({"client_ids": Array(client_ids)})})


def decode_hello(record: RecordDict) -> np.ndarray:
    """The client ids of a ``hello`` reply; ``MalformedReplyError`` when they are missing."""
    try:
        return record.array_records["ids"]["client_ids"].numpy()
    except KeyError as err:
        raise MalformedReplyError(f"not a hello reply: no {err}") from None


#: The most values of a group's regret curve (``increment_diff``, T + 1 of them) in one reply to a
#: regret query (512 KiB of float64): a longer curve is asked for in pieces (``regret_query``), so
#: no message at the end of a run grows with its horizon. Horizons up to 65,535 take one query.
REGRET_PIECE_VALUES = 1 << 16
REGRET_PIECE_KEY = "regret-piece"


def regret_query(start: int, values: int = REGRET_PIECE_VALUES) -> RecordDict:
    """A regret query's content: the piece ``increment_diff[start:start + values]`` of the curve."""
    if start < 0 or values < 1:
        raise ValueError(f"a regret piece needs start >= 0 and values >= 1, got {start}, {values}")
    return RecordDict({REGRET_PIECE_KEY: ConfigRecord({"start": start, "values": values})})


def regret_piece_asked(content: RecordDict) -> tuple[int, int]:
    """``(start, values)`` of a regret query (``regret_query``); the first piece when absent."""
    config = content.config_records.get(REGRET_PIECE_KEY)
    if config is None:
        return 0, REGRET_PIECE_VALUES
    start, values = config.get("start"), config.get("values")
    if not isinstance(start, int) or not isinstance(values, int) or start < 0 or values < 1:
        raise MalformedReplyError(
            f"regret piece start={start!r}, values={values!r}: expected start >= 0, values >= 1"
        )
    return start, values


def encode_regret(record: RegretRecord, start: int = 0, values: int | None = None) -> RecordDict:
    """A client group's regret record as the reply to a regret query for the piece
    ``increment_diff[start:start + values]`` (all of it when ``values`` is None), with the
    curve's full length and the per-client arrays (one value per client: small)."""
    stop = len(record.increment_diff) if values is None else start + values
    arrays = {
        "client_ids": record.client_ids,
        "increment_diff": record.increment_diff[start:stop],
        "client_regret": record.client_regret,
        "client_pulls": record.client_pulls,
    }
    return RecordDict(
        {
            "regret": ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()}),
            "scale": ConfigRecord(
                {"scale": record.scale, "start": start, "length": len(record.increment_diff)}
            ),
        }
    )


def answer_regret_query(record: RegretRecord, request: RecordDict) -> RecordDict:
    """The reply of a node whose record is ``record`` to the regret query ``request``."""
    start, values = regret_piece_asked(request)
    return encode_regret(record, start, values)


def decode_regret_piece(
    content: RecordDict, client_ids: np.ndarray, start: int = 0
) -> tuple[RegretRecord, int]:
    """A reply's regret record piece (its ``increment_diff`` from ``start``) and the full curve's
    length: one array per client of the right shape and dtype, finite floats, the piece asked
    for; else ``MalformedReplyError``."""
    try:
        arrays = {k: a.numpy() for k, a in content.array_records["regret"].items()}
        config = content.config_records["scale"]
        record = RegretRecord(
            arrays["client_ids"],
            arrays["increment_diff"],
            arrays["client_regret"],
            arrays["client_pulls"],
            _number(config["scale"]),
        )
        length, got = config.get("length", len(record.increment_diff)), config.get("start", 0)
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
    if not isinstance(length, int) or got != start or start + len(record.increment_diff) > length:
        raise MalformedReplyError(
            f"regret piece from {got!r} of a curve of {length!r} values, asked from {start}"
        )
    if start < length and not len(record.increment_diff):
        raise MalformedReplyError(f"an empty regret piece from {start} of {length} values")
    values = (record.increment_diff, record.client_regret, np.array(record.scale))
    if not all(v.dtype.kind == "f" and np.all(np.isfinite(v)) for v in values):
        raise MalformedReplyError("regret record with NaN, infinite or non-float values")
    return record, length


def decode_regret(content: RecordDict, client_ids: np.ndarray) -> RegretRecord:
    """The whole regret record of a reply carrying all of it (``decode_regret_piece`` from 0)."""
    record, length = decode_regret_piece(content, client_ids)
    if len(record.increment_diff) != length:
        raise MalformedReplyError(
            f"a regret piece of {len(record.increment_diff)} of {length} values, not the record"
        )
    return record


def encode_state(
    state: dict[str, np.ndarray],
    target: RecordDict,
    keys: tuple[str, str] = (STATE_KEY, SCALARS_KEY),
) -> None:
    """A client group's state (``ClientLogic.state_dict()``) into ``target`` (the ClientApp's
    ``context.state``) under ``keys`` (arrays, scalar names). Flower returns 0-d arrays as 1-d:
    the scalar entries are listed so that ``decode_state`` gives them back as scalars."""
    array_key, scalars_key = keys
    target.array_records[array_key] = ArrayRecord(
        {key: Array(np.ascontiguousarray(np.atleast_1d(value))) for key, value in state.items()}
    )
    scalars = [key for key, value in state.items() if value.ndim == 0]
    target.config_records[scalars_key] = ConfigRecord({"scalars": json.dumps(scalars)})


def decode_state(
    source: RecordDict, keys: tuple[str, str] = (STATE_KEY, SCALARS_KEY)
) -> dict[str, np.ndarray] | None:
    """The state ``encode_state`` wrote into ``source`` under ``keys``, or None when it holds
    none."""
    array_key, scalars_key = keys
    if array_key not in source.array_records:
        return None
    stored = source.array_records[array_key]
    scalars = set(json.loads(str(source.config_records[scalars_key]["scalars"])))
    return {
        key: array.numpy().reshape(()) if key in scalars else array.numpy()
        for key, array in stored.items()
    }


def clear_group_state(target: RecordDict) -> None:
    """Remove a client group's state, run-ahead memory and last answer from ``target``
    (``context.state``)."""
    for key in (STATE_KEY, AHEAD_STATE_KEY):
        if key in target.array_records:
            del target.array_records[key]
    for key in (SCALARS_KEY, AHEAD_SCALARS_KEY, AHEAD_INFO_KEY):
        if key in target.config_records:
            del target.config_records[key]
    _forget_reply(target)


def request_key(message: FlowerMessage) -> str:
    """What identifies a request: its type, job (group id) and content (Flower's content hash):
    sent again after its reply's upload was lost, a request has the same key."""
    meta = message.metadata
    return f"{meta.message_type}|{meta.group_id}|{message.content.object_id}"


def _forget_reply(target: RecordDict) -> None:
    for name in [n for n in target if n.startswith(LAST_REPLY_PREFIX)]:
        del target[name]
    if LAST_REQUEST_KEY in target.config_records:
        del target.config_records[LAST_REQUEST_KEY]


def remember_reply(key: str, reply: RecordDict, target: RecordDict) -> None:
    """Keep the answer ``reply`` to the request ``key`` in ``target`` (``context.state``), in
    place of the one kept before."""
    _forget_reply(target)
    for name, record in reply.items():
        target[LAST_REPLY_PREFIX + name] = record
    target.config_records[LAST_REQUEST_KEY] = ConfigRecord({"key": key})


def remembered_reply(key: str, source: RecordDict) -> RecordDict | None:
    """The answer kept by ``remember_reply`` when ``key`` is the request it answered, else
    None."""
    last = source.config_records.get(LAST_REQUEST_KEY)
    if last is None or last.get("key") != key:
        return None
    return RecordDict(
        {
            name.removeprefix(LAST_REPLY_PREFIX): record
            for name, record in source.items()
            if name.startswith(LAST_REPLY_PREFIX)
        }
    )


def encode_ahead(ahead: Ahead, target: RecordDict) -> None:
    """A group's run-ahead memory into ``target`` (``context.state``): its state after the
    first exchange, that exchange's round and how many it ran. Only the round and the client ids
    of the first message are kept: a rewind replays empty rounds after it."""
    info = {"round": ahead.first.round, "ran": ahead.ran}
    target.config_records[AHEAD_INFO_KEY] = ConfigRecord({"json": json.dumps(info)})
    if ahead.base is not None:
        encode_state(ahead.base, target, (AHEAD_STATE_KEY, AHEAD_SCALARS_KEY))
    elif AHEAD_STATE_KEY in target.array_records:
        del target.array_records[AHEAD_STATE_KEY]


def decode_ahead(source: RecordDict, client_ids: np.ndarray) -> Ahead | None:
    """The run-ahead memory ``encode_ahead`` wrote for the group of ``client_ids``, or None."""
    if AHEAD_INFO_KEY not in source.config_records:
        return None
    info = json.loads(str(source.config_records[AHEAD_INFO_KEY]["json"]))
    base = decode_state(source, (AHEAD_STATE_KEY, AHEAD_SCALARS_KEY))
    first = Message("round", int(info["round"]), client_ids, {})
    return Ahead(base, first, int(info["ran"]))


def _number(value: object) -> float:
    """A record's scalar as a float; a list or text is not a number (MalformedReplyError)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MalformedReplyError(f"expected a number, got {type(value).__name__}")
    return float(value)
