"""Secure aggregation over Flower's SecAgg+: the server learns the sum over nodes of the fields
an algorithm's server only sums (``ServerLogic.secure_sums``), and nothing else of them.

Flower 1.42 runs SecAgg+ as a server workflow of its legacy ``Strategy`` API and a ClientApp mod
(``secaggplus_mod``) on message type ``"train"``. ``secure_exchange`` drives one exchange through
it: ``SecAggPlusWorkflow`` with a ``LegacyContext`` built for the exchange and a small
``Strategy`` (``_Exchange``) that hands each node its part of the message (``FitIns``) and keeps
what the workflow unmasks (``aggregate_fit``). On the node, ``secure_reply`` turns the group's
reply into a ``FitRes``: the summed fields, added over the node's clients, as fixed-point limbs
(``fedbandit.secure_sum``: exact, no clipping below 2^52) in the parameters that SecAgg+ masks;
the other fields, fedbandit's own encoding, in the metrics, which travel in the clear.

What SecAgg+ as shipped protects (say no more than this): a semi-honest server sees the sum over
the surviving nodes of each summed field and which nodes survived; every other field, the
``num_examples`` and the metrics travel in the clear. A SuperNode answers for a group of clients,
so masking hides a node's (a silo's) sum, not a client's within it. Flower draws the masks from
``np.random.RandomState`` seeded from the shared keys, not from a cryptographic generator.

No sum is unmasked over fewer than ``min_contributors`` clients (k, default ``MIN_CONTRIBUTORS``):
with k > 1 each exchange is two SecAgg+ runs. First a *count*: every node answers the request
without keeping its state and sends, masked, per block of each summed field (its index along the
axis after the client axis: a parameter group), whether it contributes (any of its clients'
values there is not zero) and how many of its clients do; the server unmasks only these counts.
Then the *sum*, in which the blocks that 1 to k - 1 clients would fill are held back: the clients
keep them for a later exchange (``hold``; DisLinUCB's and H-LinUCB's syncs). An algorithm whose
clients cannot hold blocks back stops the seed instead (``SecureRefusalError``), and a node lost in
the sum's masked-vector stage that could leave a block below k (fewer than k nodes left in it:
each holds at least one contributing client) stops it before the unmasking. When the server's
request itself settles which clients fill which block (``ServerLogic.secure_contributors``:
Fed-PE's design fixes every pull), there is no count: the contributors are taken from it, a
block below k refuses the exchange, and each node gets its clients' part of it with the sum
(``expect``) and refuses to send a value outside it.

The workflow returns sum(w_i x_i) / sum(w_i): every node gives weight 1 (``num_examples`` = 1 =
``max_weight``), so the result is the sum over the n survivors divided by n, multiplied back here
and rounded to the integer limb sums. With ``clipping_range`` = q / 2 Flower's quantiser is the
identity on integers, so the limbs pass unchanged and its unseeded stochastic rounding never acts.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    Parameters,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.serverapp import Grid

from fedbandit import secure_sum
from fedbandit.federation import Message as BanditMessage
from fedbandit.flower.codec import HEADER_KEY, MalformedReplyError, decode, encode
from fedbandit.flower.internals import legacy_records

__all__ = [
    "CLIPPING_RANGE",
    "INLINE_ALWAYS",
    "MIN_CONTRIBUTORS",
    "MIN_NODES",
    "QUANTIZATION_RANGE",
    "PreparedKeys",
    "SecureOutcome",
    "SecureRefusalError",
    "SecureSession",
    "SecureSettings",
    "close_session",
    "count_reply",
    "declaration_mismatch",
    "declared_counts",
    "default_threshold",
    "open_session",
    "request_content",
    "secure_exchange",
    "secure_reply",
    "slotted_secaggplus_mod",
    "unwrap_request",
]

#: SecAgg+'s quantisation range q (Flower's default) and modulus: limbs of +-2^21, <= 1023 nodes.
QUANTIZATION_RANGE = 2**22
MODULUS_RANGE = 2**32
#: q / 2: Flower's quantiser ``(x + c) q / (2 c)`` is then ``x + q / 2``, the identity on integers.
CLIPPING_RANGE = float(QUANTIZATION_RANGE // 2)
#: Fewest nodes that secure aggregation accepts, and fewest whose sum it ever unmasks: with two,
#: each learns the other's value from the sum (and Flower's SecAgg+ halts below two).
MIN_NODES = 3
#: Fewest contributing clients a summed block is unmasked over, by default: with 2, each of them
#: learns the other's values from the sum (the download carries it), as a server colluding
#: with one of them would.
MIN_CONTRIBUTORS = 3
#: FitIns config keys: the names of the fields to sum (JSON list), the phase ("count" or
#: "sum") and, in a sum, the blocks held back (JSON: {"blocks": B, "held": [indices]}).
SUMMED_KEY = "secure-summed"
PHASE_KEY = "secure-phase"
HOLD_KEY = "secure-hold"
#: A sum's FitIns config key, when the server declared the contributors: per summed field, per
#: client of the node, the blocks it may fill (JSON).
EXPECT_KEY = "secure-expect"
#: A count's FitRes metrics keys: the blocks of each summed field (JSON) and whether the node's
#: clients can hold blocks back (``ClientLogic.HOLDS_SECURE_BLOCKS``).
BLOCKS_KEY = "secure-blocks"
HOLDS_KEY = "secure-holds"
#: FitRes metrics keys: the summed fields' layout (JSON) and how many values were clipped.
LAYOUT_KEY = "secure-layout"
CLIPPED_KEY = "secure-clipped"
#: A SecAgg+ message's record naming the slot of the node's SecAgg+ state it belongs to
#: (``slotted_secaggplus_mod``), and the prefix of the node's state records, one per slot.
SLOT_KEY = "fedbandit-secagg-slot"
SLOT_STATE_PREFIX = "fedbandit-secagg-state-"
#: Effectively no limit: a secure exchange carries its messages inline, in the FitIns config
#: and the FitRes metrics (``codec.encode(..., inline_bytes=INLINE_ALWAYS)``).
INLINE_ALWAYS = 2**62


def slotted_secaggplus_mod(msg: Message, ctxt: Context, call_next: Callable) -> Message:
    """Flower's ``secaggplus_mod`` with one SecAgg+ state per slot named in the message (none:
    Flower's one state), so that a node can take part in two SecAgg+ runs at once: an exchange
    being summed and the key set-up of the next (``PreparedKeys``). The mod runs unchanged; its
    state record is swapped in before it and out after it. Slots are numbered in the order the
    runs start; the node keeps the two highest (a late message of an older run, whose server
    stopped waiting, finds no state and is answered with the mod's error)."""
    slot = msg.content.config_records.get(SLOT_KEY)
    if slot is None:
        return secaggplus_mod(msg, ctxt, call_next)
    del msg.content.config_records[SLOT_KEY]
    own = f"{SLOT_STATE_PREFIX}{int(str(slot['slot']))}"
    key = legacy_records.SECAGG_STATE_KEY
    # ``config_records`` is a view that does not see later writes: read it anew each time
    ctxt.state.config_records.pop(key, None)
    if own in ctxt.state.config_records:
        ctxt.state.config_records[key] = ctxt.state.config_records[own]
    try:
        return secaggplus_mod(msg, ctxt, call_next)
    finally:
        ctxt.state.config_records[own] = ctxt.state.config_records.pop(key, ConfigRecord({}))
        slots = sorted((n for n in ctxt.state.config_records if _is_slot(n)), key=_slot_number)
        for name in slots[:-2]:  # only an exchange and the next one's keys are in flight
            del ctxt.state.config_records[name]


def _is_slot(name: str) -> bool:
    return name.startswith(SLOT_STATE_PREFIX)


def _slot_number(name: str) -> int:
    return int(name[len(SLOT_STATE_PREFIX) :])


class _Settings(NamedTuple):
    """What every SecAgg+ run of an exchange shares: the group index (its messages'
    ``group_id``), the stage timeout, the poll interval, the threshold, the run's stop event and
    the node state slot (None: Flower's one state)."""

    group_index: int
    timeout: float
    poll_seconds: float
    threshold: int
    stop: threading.Event | None
    slot: int | None = None


@dataclass(frozen=True)
class SecureSettings:
    """A run's secure aggregation: which reply fields of a message are summed (the server's
    ``ServerLogic.secure_fields``; empty: a plain exchange) and the reconstruction threshold,
    the nodes that must survive a secure exchange (None: ``default_threshold``)."""

    fields: Callable[[BanditMessage], frozenset[str]]
    threshold: int | None = None
    min_contributors: int = MIN_CONTRIBUTORS
    #: The server's ``secure_contributors``: which clients fill which blocks, or None (counted).
    contributors: Callable[[BanditMessage], Mapping[str, np.ndarray] | None] = lambda _: None
    #: The server's ``secure_follows``: whether the exchange after a message is a secure one.
    follows: Callable[[BanditMessage], bool] = lambda _: False

    def threshold_for(self, num_nodes: int) -> int:
        """Nodes that must survive a secure exchange among ``num_nodes``: the setting or the
        default, never fewer than ``MIN_NODES`` (a sum over two nodes tells each the other's
        value) and at most all of them."""
        wanted = self.threshold if self.threshold is not None else default_threshold(num_nodes)
        return min(max(wanted, MIN_NODES), num_nodes)


def default_threshold(num_nodes: int) -> int:
    """A majority of the nodes, and at least ``MIN_NODES``: 3 nodes must all survive, 4 or 5
    tolerate the loss of one or two, 10 of four."""
    return max(MIN_NODES, num_nodes // 2 + 1)


def request_content(content: RecordDict, summed: Iterable[str]) -> FitIns:
    """A node's part of a secure exchange: fedbandit's encoded message (one ``ConfigRecord``,
    ``fedbandit.flower.codec``) as the FitIns config, and the names of the fields to sum."""
    if set(content) != {HEADER_KEY}:
        raise ValueError("a secure exchange carries its message inline, in one record")
    config = dict(content.config_records[HEADER_KEY])
    config[SUMMED_KEY] = json.dumps(sorted(summed))
    return FitIns(Parameters(tensors=[], tensor_type=""), config)  # type: ignore[arg-type]


@dataclass(frozen=True)
class SecureRequest:
    """What a node is asked in a secure exchange: its encoded message, the fields to sum, the
    phase ("count": only which blocks it would fill; "sum") and the blocks to hold back
    (``held`` of ``blocks``, a sum only)."""

    content: RecordDict
    summed: frozenset[str]
    phase: str = "sum"
    blocks: int = 0
    held: tuple[int, ...] = ()
    #: Per summed field, per client, the blocks it may fill (None: not declared).
    expect: dict[str, list[list[int]]] | None = None

    def hold(self, num_clients: int) -> np.ndarray:
        """The ``hold`` field of the request: (clients, blocks), True where held back."""
        hold = np.zeros((num_clients, self.blocks), dtype=bool)
        hold[:, list(self.held)] = True
        return hold


def with_phase(
    fitins: FitIns,
    phase: str,
    blocks: int = 0,
    held: Iterable[int] = (),
    expect: Mapping[str, np.ndarray] | None = None,
) -> FitIns:
    """``fitins`` (of ``request_content``) for a phase of the exchange; ``expect``: per summed
    field, the node's (clients, blocks) part of the declared contributors."""
    config = dict(fitins.config)
    config[PHASE_KEY] = phase
    if phase == "sum":
        config[HOLD_KEY] = json.dumps({"blocks": int(blocks), "held": sorted(int(b) for b in held)})
    if expect is not None:
        config[EXPECT_KEY] = json.dumps(
            {name: [np.flatnonzero(row).tolist() for row in mask] for name, mask in expect.items()}
        )
    return FitIns(fitins.parameters, config)


def unwrap_request(content: RecordDict) -> SecureRequest:
    """On the node: the request of ``request_content`` (and ``with_phase``)."""
    try:
        config = dict(content.config_records["fitins.config"])
        summed = json.loads(str(config.pop(SUMMED_KEY)))
        phase = str(config.pop(PHASE_KEY, "sum"))
        hold = json.loads(str(config.pop(HOLD_KEY, '{"blocks": 0, "held": []}')))
        blocks, held = int(hold["blocks"]), tuple(int(b) for b in hold["held"])
        expect = json.loads(str(config.pop(EXPECT_KEY))) if EXPECT_KEY in config else None
        if expect is not None:
            expect = {str(k): [[int(b) for b in row] for row in v] for k, v in expect.items()}
    except (KeyError, ValueError, TypeError, AttributeError) as err:
        raise MalformedReplyError(f"not a fedbandit secure exchange: {err}") from None
    if phase not in ("count", "sum") or not all(0 <= b < blocks for b in held):
        raise MalformedReplyError(f"not a fedbandit secure exchange: phase {phase!r}, hold {hold}")
    content = RecordDict({HEADER_KEY: ConfigRecord(config)})
    return SecureRequest(content, frozenset(summed), phase, blocks, held, expect)


def _blocks(value: np.ndarray) -> np.ndarray:
    """(clients, blocks): whether each client's values in each block of a summed field (its
    index along the axis after the client axis; one block for a field of one value per
    client) are not all zero."""
    value = np.asarray(value)
    per = value.reshape(len(value), value.shape[1] if value.ndim > 1 else 1, -1)
    return np.any(per != 0, axis=2)


def count_reply(reply: BanditMessage, summed: frozenset[str], holds: bool, seconds: float):
    """The node's ``FitRes`` of a count, as a ``RecordDict``: masked, per block of each summed
    field (sorted by name), 1 when any of its clients contributes and the number of its clients
    that do; in the clear only the number of blocks per field and whether its clients can hold
    blocks back (the same for every node of a run)."""
    names = sorted(summed & set(reply.fields))
    filled = [_blocks(reply.fields[name]) for name in names]
    vector = np.concatenate(
        [f.any(axis=0).astype(np.float64) for f in filled]
        + [f.sum(axis=0).astype(np.float64) for f in filled]
        + [np.zeros(1)]
    )
    limbs, _ = secure_sum.encode(vector)
    blocks = {name: int(f.shape[1]) for name, f in zip(names, filled, strict=True)}
    metrics = {
        BLOCKS_KEY: json.dumps(blocks),
        HOLDS_KEY: int(bool(holds)),
        "handler-s": float(seconds),
    }
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([limbs.ravel()]), 1, metrics)  # type: ignore[arg-type]
    return legacy_records.fitres_to_records(fitres)


def held_values(reply: BanditMessage, summed: frozenset[str], held: Iterable[int]) -> list[str]:
    """The summed fields of ``reply`` with a non-zero value in a ``held`` block (none, when the
    clients held them back as asked)."""
    found = []
    for name in sorted(summed & set(reply.fields)):
        filled = _blocks(reply.fields[name])
        if filled[:, [b for b in held if b < filled.shape[1]]].any():
            found.append(name)
    return found


def declaration_mismatch(
    reply: BanditMessage, summed: frozenset[str], expect: Mapping[str, list[list[int]]]
) -> list[str]:
    """Where the node's clients' values in ``reply`` differ from the server's declaration
    ``expect`` (per summed field, per client, the blocks it fills), one text per field: a value
    outside it would enter a sum uncounted, and a declared block left empty would count a
    contributor whose data are not in the sum. Empty when they agree exactly."""
    found = []
    for name in sorted(summed & set(reply.fields)):
        filled = _blocks(reply.fields[name])
        rows = expect.get(name, [])
        if len(rows) != len(filled):
            found.append(f"{name}: {len(rows)} clients declared, {len(filled)} here")
            continue
        declared = np.zeros(filled.shape, dtype=bool)
        for row, blocks in enumerate(rows):
            declared[row, [b for b in blocks if 0 <= b < filled.shape[1]]] = True
        if extra := np.flatnonzero((filled & ~declared).any(axis=0)).tolist():
            found.append(f"{name}: blocks {extra} filled but not declared")
        if empty := np.flatnonzero((declared & ~filled).any(axis=0)).tolist():
            found.append(f"{name}: blocks {empty} declared but left empty")
    return found


def secure_reply(reply: BanditMessage, summed: frozenset[str], seconds: float) -> RecordDict:
    """The node's ``FitRes`` as a ``RecordDict``: the sums over its clients of the ``summed``
    fields present in ``reply`` as fixed-point limbs (masked by ``secaggplus_mod``), everything
    else encoded in the clear."""
    names = sorted(summed & set(reply.fields))
    sums = [np.asarray(reply.fields[name]).sum(axis=0) for name in names]
    flat = np.concatenate([s.ravel().astype(np.float64) for s in sums] + [np.zeros(1)])
    limbs, clipped = secure_sum.encode(flat)
    layout = {
        name: {"shape": list(s.shape), "dtype": reply.fields[name].dtype.str}
        for name, s in zip(names, sums, strict=True)
    }
    clear = BanditMessage(
        reply.kind,
        reply.round,
        reply.client_ids,
        {k: v for k, v in reply.fields.items() if k not in summed},
        sparse={k: m for k, m in reply.sparse.items() if k not in summed},
        known=reply.known,
        meta=reply.meta,
    )
    metrics = dict(encode(clear, inline_bytes=INLINE_ALWAYS).config_records[HEADER_KEY])
    metrics["handler-s"] = float(seconds)
    metrics[LAYOUT_KEY] = json.dumps(
        {"fields": layout, "sparse": {k: reply.sparse[k] for k in names if k in reply.sparse}}
    )
    metrics[CLIPPED_KEY] = int(clipped)
    fitres = FitRes(
        Status(Code.OK, ""),
        ndarrays_to_parameters([limbs.ravel()]),
        1,  # every node weighs 1: the workflow returns sum / n
        metrics,  # type: ignore[arg-type]
    )
    return legacy_records.fitres_to_records(fitres)


@dataclass
class SecureOutcome:
    """A secure exchange's result: each surviving node's reply without its summed fields (and
    the seconds its handler took), the sums over the survivors, and what went wrong.

    ``halted``: SecAgg+ stopped (too few nodes left to unmask) and nothing was summed."""

    clear: dict[int, BanditMessage]
    sums: dict[str, np.ndarray]
    sparse: dict[str, str]
    lost: dict[int, str]
    clipped: int = 0
    halted: bool = False
    client_seconds: float = float("nan")
    #: Per summed field, per block: (contributing nodes, contributing clients) as counted
    #: before the sum (None without a count), and the blocks held back.
    contributors: dict[str, list[tuple[int, int]]] | None = None
    held: tuple[int, ...] = ()
    #: Whether the exchange went on from keys set up ahead (``PreparedKeys``).
    keys_ahead: bool = False


class SecureRefusalError(ValueError):
    """A sum would be unmasked over fewer nodes than the run allows and the algorithm's clients
    cannot hold the blocks back: the exchange is refused, nothing is unmasked."""


@dataclass
class SecureSession:
    """A run's secure exchanges on one grid: the fewest contributing clients a block is unmasked
    over (``min_contributors``, k) and what the counts found: the (nodes, clients) of every
    non-empty block unmasked, blocks held back."""

    min_contributors: int = MIN_CONTRIBUTORS
    unmasked: list[tuple[int, int]] = field(default_factory=list)
    held_blocks: int = 0
    counts: int = 0
    declared: int = 0

    def report(self) -> dict[str, int | None]:
        """For the seed's JSON (``report.secure_aggregation``)."""
        return {
            "min_contributors": self.min_contributors,
            "count_exchanges": self.counts,
            "declared_exchanges": self.declared,
            "held_blocks": self.held_blocks,
            "fewest_contributing_nodes": min((n for n, _ in self.unmasked), default=None),
            "fewest_contributing_clients": min((c for _, c in self.unmasked), default=None),
        }


#: The session of each grid a run drives secure exchanges on (``open_session``).
_SESSIONS: dict[int, SecureSession] = {}


def open_session(grid: object, min_contributors: int = MIN_CONTRIBUTORS) -> SecureSession:
    """Start the secure session of a run on ``grid``: ``secure_exchange`` on that grid unmasks no
    block over fewer than ``min_contributors`` clients (1: no count, every sum unmasked)."""
    if min_contributors < 1:
        raise ValueError(f"min_contributors must be 1 or more, got {min_contributors}")
    session = _SESSIONS[id(grid)] = SecureSession(min_contributors)
    return session


def close_session(grid: object) -> SecureSession:
    """End the session of ``grid`` (the default one ``secure_exchange`` opened if none was)."""
    return _SESSIONS.pop(id(grid), SecureSession())


@dataclass(frozen=True)
class _Node:
    """What SecAgg+'s workflow needs of a legacy ``ClientProxy``: the node id."""

    node_id: int


class _Exchange(Strategy):
    """The legacy ``Strategy`` SecAgg+ drives: each node's ``FitIns`` out, the unmasked
    aggregate and the survivors' replies back (kept, not aggregated)."""

    def __init__(self, requests: dict[int, FitIns]) -> None:
        self.requests = requests
        self.results: list[tuple[_Node, FitRes]] | None = None

    def initialize_parameters(self, client_manager):
        return None

    def configure_fit(self, server_round, parameters, client_manager):
        return [(_Node(node), fitins) for node, fitins in self.requests.items()]

    def aggregate_fit(self, server_round, results, failures):
        self.results = list(results)
        return None, {}

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        return None


class _TrackingGrid:
    """The run's ``Grid`` for the workflow, with fedbandit's own ``send_and_receive``: pulls every
    ``poll_seconds`` (Flower's deployment grid sleeps 3 s between pulls), ends waits when the
    run is stopped, and records each node's last stage reached and error reasons."""

    def __init__(
        self,
        grid: Grid,
        poll_seconds: float,
        stop: threading.Event | None,
        slot: int | None = None,
    ) -> None:
        self._grid, self.poll_seconds, self.stop = grid, poll_seconds, stop
        #: The node state slot every SecAgg+ message names (``slotted_secaggplus_mod``).
        self.slot = slot
        #: Set to end this run's waits at once and send nothing more (``PreparedKeys.cancel``).
        self.cancel: threading.Event | None = None
        self.errors: dict[int, str] = {}
        self.silent: set[int] = set()
        #: Called with the nodes asked for their shares before the unmask stage is sent: a
        #: reason not to unmask (the stage is then not sent and SecAgg+ halts), or None.
        self.before_unmask: Callable[[set[int]], str | None] | None = None
        self.refused: str | None = None
        #: The nodes given the exchange; ``restart``: those still there when the masked-vector
        #: stage would begin without all of them (the others were lost in the key set-up or key
        #: sharing, before anything was revealed). That stage is then not sent (SecAgg+ halts),
        #: and the exchange starts again with the survivors: Flower 1.42's mod cannot unmask
        #: after such a loss (the survivors hold no shares for the lost node: KeyError).
        self.nodes: set[int] = set()
        self.restart: set[int] | None = None
        #: Called with the nodes asked when the unmask stage is about to be sent (the last round
        #: trip of the run).
        self.on_unmask: Callable[[set[int]], None] | None = None

    def __getattr__(self, name: str):
        return getattr(self._grid, name)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        messages = list(messages)
        stage = _stage(messages[0]) if messages else None
        asked = {m.metadata.dst_node_id for m in messages}
        if self.cancel is not None and self.cancel.is_set():
            return []
        if stage == "collect_masked_vectors" and asked < self.nodes:
            self.restart = asked
            return []
        if self.before_unmask is not None and stage == "unmask":
            self.refused = self.before_unmask(asked)
            if self.refused is not None:
                return []
        if self.on_unmask is not None and stage == "unmask":
            self.on_unmask(asked)
        if self.slot is not None:
            for message in messages:
                message.content.config_records[SLOT_KEY] = ConfigRecord({"slot": self.slot})
        ids = list(self._grid.push_messages(messages))
        node_of = {mid: m.metadata.dst_node_id for mid, m in zip(ids, messages, strict=True)}
        pending = set(ids)
        replies: list[Message] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending and (deadline is None or time.monotonic() < deadline):
            if self.stop is not None and self.stop.is_set():
                break
            if self.cancel is not None and self.cancel.is_set():
                break
            for reply in self._grid.pull_messages(list(pending)):
                mid = reply.metadata.reply_to_message_id
                if mid not in pending:
                    continue
                pending.discard(mid)
                if reply.has_error():
                    self.errors.setdefault(
                        node_of[mid], f"error reply (code {reply.error.code}): {reply.error.reason}"
                    )
                replies.append(reply)
            if pending:
                time.sleep(self.poll_seconds)
        self.silent.update(node_of[mid] for mid in pending)
        return replies


def _stage(message: Message) -> str | None:
    configs = message.content.config_records.get("secaggplus_configs")
    return None if configs is None else str(configs.get("stage"))


@dataclass
class _Protocol:
    """One run of SecAgg+: Flower's workflow, the state it passes between its stages, the
    context it reads its round from and the strategy it drives."""

    workflow: SecAggPlusWorkflow
    context: LegacyContext
    state: legacy_records.WorkflowState
    strategy: _Exchange


def _protocol(
    requests: dict[int, FitIns], group_index: int, timeout: float, threshold: int
) -> _Protocol:
    """A SecAgg+ run over the nodes of ``requests``, before its first stage."""
    strategy = _Exchange(requests)
    # the workflow reads its round and parameters from this context's state, nothing else
    run = Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={})
    context = LegacyContext(run, strategy=strategy)
    context.state.config_records["config"] = ConfigRecord({"current_round": int(group_index)})
    context.state.array_records["parameters"] = legacy_records.parameters_to_record(
        Parameters(tensors=[], tensor_type="")
    )
    workflow = SecAggPlusWorkflow(
        num_shares=len(requests),
        # an int must be below the shares; 1.0 (a fraction) asks for every node
        reconstruction_threshold=threshold if threshold < len(requests) else 1.0,
        max_weight=1,
        clipping_range=CLIPPING_RANGE,
        quantization_range=QUANTIZATION_RANGE,
        modulus_range=MODULUS_RANGE,
        timeout=timeout,
    )
    return _Protocol(workflow, context, legacy_records.WorkflowState(), strategy)


class PreparedKeys:
    """SecAgg+'s key set-up and key sharing (its first two stages, one round trip each) for a
    run's next secure exchange, run ahead in a thread while a plain exchange is out: they
    depend on the nodes only, never on the data, and the masks they lead to are drawn in the
    masked-vector stage as ever. Their messages name a node state slot of their own
    (``slotted_secaggplus_mod``), so they may run while another exchange is summed in another
    slot. ``secure_exchange`` uses them when it asks exactly their nodes with their threshold and
    every node finished both stages; otherwise it starts from the key set-up."""

    def __init__(
        self,
        grid: Grid,
        nodes: Iterable[int],
        *,
        group_index: int,
        timeout: float,
        poll_seconds: float,
        threshold: int,
        stop: threading.Event | None,
        slot: int,
    ) -> None:
        settings = _Settings(group_index, timeout, poll_seconds, threshold, stop, slot)
        self.nodes, self.settings = frozenset(nodes), settings
        placeholder = FitIns(Parameters(tensors=[], tensor_type=""), {})
        requests = {node: placeholder for node in sorted(self.nodes)}
        self.protocol = _protocol(
            requests, settings.group_index, settings.timeout, settings.threshold
        )
        self._tracking = _TrackingGrid(grid, settings.poll_seconds, settings.stop, settings.slot)
        self._cancel = threading.Event()
        self._tracking.cancel = self._cancel
        self._ready = False
        self._thread = threading.Thread(target=self._set_up, name="secagg-keys", daemon=True)
        self._thread.start()

    def _set_up(self) -> None:
        p = self.protocol
        try:
            self._ready = bool(
                p.workflow.setup_stage(self._tracking, p.context, p.state)  # type: ignore[arg-type]
                and p.workflow.share_keys_stage(self._tracking, p.context, p.state)  # type: ignore[arg-type]
                and p.state.active_node_ids == set(self.nodes)
            )
        except Exception:  # any failure: the exchange sets up its own keys
            self._ready = False

    def wait(self) -> None:
        """Until both stages are done (each ends within the exchange timeout or at a stop)."""
        self._thread.join()

    def cancel(self) -> None:
        """Stop at once (no more messages, no more waits) and drop the keys; returns when the
        thread has ended."""
        self._cancel.set()
        self._thread.join()
        self._ready = False

    def usable(self, nodes: Iterable[int], threshold: int) -> bool:
        """Whether an exchange asking ``nodes`` with ``threshold`` can go on from these keys."""
        self.wait()
        return (
            self._ready and self.nodes == frozenset(nodes) and threshold == self.settings.threshold
        )


def _workflow(
    tracking: _TrackingGrid,
    requests: dict[int, FitIns],
    group_index: int,
    timeout: float,
    threshold: int,
    prepared: PreparedKeys | None = None,
) -> list[tuple[_Node, FitRes]] | None:
    """One run of SecAgg+'s four stages over ``requests`` (the last two only, from ``prepared``
    keys): the survivors' replies with the unmasked aggregate, or None when it halted."""
    if prepared is not None:
        protocol = prepared.protocol
        protocol.strategy.requests = requests
        protocol.state.nid_to_fitins = {
            node: legacy_records.fitins_to_records(fitins) for node, fitins in requests.items()
        }
        first = 2
    else:
        protocol = _protocol(requests, group_index, timeout, threshold)
        first = 0
    workflow = protocol.workflow
    stages = (
        workflow.setup_stage,
        workflow.share_keys_stage,
        workflow.collect_masked_vectors_stage,
        workflow.unmask_stage,
    )
    for stage in stages[first:]:
        if not stage(tracking, protocol.context, protocol.state):  # type: ignore[arg-type]
            return None  # halted
    return protocol.strategy.results


def _run(
    grid: Grid,
    requests: dict[int, FitIns],
    settings: _Settings,
    before_unmask: Callable[[set[int]], str | None] | None = None,
    prepared: PreparedKeys | None = None,
    on_unmask: Callable[[set[int]], None] | None = None,
) -> tuple[list[tuple[_Node, FitRes]] | None, _TrackingGrid, dict[int, FitIns], dict[int, str]]:
    """SecAgg+ over ``requests`` (``settings``: group index, timeout, poll seconds, threshold,
    stop), from ``prepared`` keys (checked by the caller: ``PreparedKeys.usable``), started again
    with the survivors whenever nodes are lost before the masked-vector stage
    (``_TrackingGrid.restart``). Returns the workflow's results (None: halted), the last run's
    tracking, the requests it ran with and the nodes lost in the runs started again."""
    group_index, timeout, poll_seconds, threshold, stop, slot = settings
    early: dict[int, str] = {}
    while True:
        tracking = _TrackingGrid(grid, poll_seconds, stop, slot)
        tracking.nodes, tracking.before_unmask = set(requests), before_unmask
        tracking.on_unmask = on_unmask
        results = _workflow(tracking, requests, group_index, timeout, threshold, prepared)
        prepared = None
        if tracking.restart is None:
            return results, tracking, requests, early
        gone = _lost(tracking, requests, timeout, tracking.restart)
        early.update(
            {node: f"{why} (before the masked-vector stage)" for node, why in gone.items()}
        )
        requests = {node: fitins for node, fitins in requests.items() if node in tracking.restart}
        if len(requests) < max(threshold, MIN_NODES):
            return None, tracking, requests, early


def _lost(
    tracking: _TrackingGrid, requests: Mapping[int, object], timeout: float, alive=None
) -> dict[int, str]:
    """The nodes of ``requests`` lost, with why: those not ``alive`` after a completed workflow,
    or (``alive`` None: it halted) those that failed or stayed silent."""
    if alive is None:
        lost = dict(tracking.errors)
        lost.update({node: f"no reply within {timeout:g} s" for node in tracking.silent})
        return lost
    return {
        node: tracking.errors.get(node, f"no reply within {timeout:g} s")
        for node in requests
        if node not in alive
    }


def _limb_sums(results: list[tuple[_Node, FitRes]]) -> np.ndarray:
    """The integer limb sums over the survivors of a completed workflow (it returned their
    mean: sum / n, multiplied back and rounded)."""
    vector = parameters_to_ndarrays(results[0][1].parameters)[0]
    limb_sums = np.rint(np.asarray(vector, dtype=np.float64) * len(results))
    return limb_sums.reshape(-1, secure_sum.LIMBS)


def _counts(
    results: list[tuple[_Node, FitRes]],
) -> tuple[dict[str, list[tuple[int, int]]], bool]:
    """A count's unmasked result: per field, per block (contributing nodes, clients); and
    whether every node's clients can hold blocks back."""
    layouts, holds = set(), True
    for proxy, fitres in results:
        try:
            layouts.add(str(fitres.metrics[BLOCKS_KEY]))
            holds &= bool(int(fitres.metrics[HOLDS_KEY]))
        except (KeyError, TypeError, ValueError) as err:
            raise MalformedReplyError(f"node {proxy.node_id}: not a secure count: {err}") from None
    if len(layouts) != 1:
        raise MalformedReplyError(f"the nodes counted blocks of different layouts: {layouts}")
    blocks: dict[str, int] = json.loads(layouts.pop())
    total = sum(blocks.values())
    values = secure_sum.decode(_limb_sums(results), len(results), (2 * total + 1,))
    values = np.rint(values).astype(np.int64)
    counts, start = {}, 0
    for name, size in blocks.items():
        nodes, clients = values[start : start + size], values[total + start : total + start + size]
        counts[name] = [(int(n), int(c)) for n, c in zip(nodes, clients, strict=True)]
        start += size
    return counts, holds


def secure_exchange(
    grid: Grid,
    requests: dict[int, FitIns],
    group_index: int,
    timeout: float,
    poll_seconds: float,
    threshold: int,
    stop: threading.Event | None = None,
    declared: Mapping[int, Mapping[str, np.ndarray]] | None = None,
    prepared: PreparedKeys | None = None,
    slot: int | None = None,
    on_unmask: Callable[[set[int]], None] | None = None,
) -> SecureOutcome:
    """One exchange through SecAgg+: ``requests`` (node -> its ``request_content``) delivered,
    the summed fields unmasked over the surviving nodes. Nodes that fail a stage (an error, or
    silent for ``timeout`` seconds) are dropped by SecAgg+ and named in ``lost``; with fewer
    than ``threshold`` left, the outcome is ``halted``. ``group_index`` (the job's index in a
    simulation, 0 in a deployment) becomes the messages' ``group_id``: Flower's workflow sets it
    from its round, so the round is set to it.

    With the grid's session (``open_session``) asking for k > 1 contributors, a count comes
    first (see the module): blocks that 1 to k - 1 clients fill are held back by the clients,
    or, when they cannot, the exchange is refused (``SecureRefusalError``, nothing unmasked); a
    node lost in the sum's masked-vector stage that could leave a block below k halts it before
    the unmasking. ``declared`` (node -> per summed field its clients' (clients, blocks) flags,
    of ``ServerLogic.secure_contributors``) replaces the count: a block below k refuses the
    exchange, and each node is sent its part to check its values against. ``prepared``: keys set
    up ahead for this exchange (``PreparedKeys``), used by its first SecAgg+ run (the count when
    one runs, else the sum) when they fit; always waited for. ``slot``: the node state slot of
    this exchange's SecAgg+ runs when the prepared keys of the next may run beside them (None:
    Flower's one state); prepared keys keep their own. ``on_unmask`` is called with the nodes
    asked when the sum's unmask stage is sent: the runtime then starts the next exchange's keys
    with them, beside this last round trip."""
    if prepared is not None:
        prepared.wait()
    legacy_records.require()
    if len(requests) > secure_sum.MAX_NODES:
        raise ValueError(
            f"secure aggregation sums at most {secure_sum.MAX_NODES} nodes (SecAgg+'s modulus "
            f"2^32), not {len(requests)}"
        )
    session = _SESSIONS.setdefault(id(grid), SecureSession())
    k = session.min_contributors
    contributors: dict[str, list[tuple[int, int]]] | None = None
    held: set[int] = set()
    lost: dict[int, str] = {}
    settings = _Settings(group_index, timeout, poll_seconds, threshold, stop, slot)
    if prepared is not None and not prepared.usable(requests, threshold):
        prepared = None  # they do not fit: the exchange sets up its own
    if prepared is not None:
        settings = prepared.settings  # the slot the keys were set up in
    keys_ahead = prepared is not None
    alive = set(requests)
    if k > 1 and declared is not None:  # the server's own flags: nothing to count
        contributors, holds = declared_counts(declared), False
    elif k > 1:  # the count goes on from the keys set up ahead; the sum sets up its own
        count_requests = {node: with_phase(fitins, "count") for node, fitins in requests.items()}
        results, tracking, count_requests, early = _run(
            grid, count_requests, settings, prepared=prepared
        )
        prepared = None
        session.counts += 1
        if results is None:
            gone = {**early, **_lost(tracking, count_requests, timeout)}
            return SecureOutcome({}, {}, {}, gone, halted=True)
        alive = {proxy.node_id for proxy, _ in results}
        lost = {**early, **_lost(tracking, count_requests, timeout, alive)}
        contributors, holds = _counts(results)
    if contributors is not None:
        held = {
            block
            for blocks in contributors.values()
            for block, (_, clients) in enumerate(blocks)
            if 0 < clients < k
        }
        if held and not holds:
            source = " (as the server's request sets them)" if declared is not None else ""
            raise SecureRefusalError(
                f"blocks {sorted(held)} of the summed fields would be unmasked over fewer than "
                f"{k} contributing clients{source}, and this algorithm's clients cannot hold "
                "them back: refused"
            )
        if declared is not None:
            session.declared += 1
        width = max((len(b) for b in contributors.values()), default=0)
        requests = {
            node: with_phase(
                fitins, "sum", width, held, None if declared is None else declared[node]
            )
            for node, fitins in requests.items()
            if node in alive
        }
        if len(requests) < max(threshold, MIN_NODES):
            return SecureOutcome({}, {}, {}, lost, halted=True)
    before_unmask = None
    if contributors is not None:
        counted = set(requests)

        def before_unmask(asked: set[int]) -> str | None:
            gone = len(counted - asked)
            short = [
                (name, block)
                for name, blocks in contributors.items()
                for block, (nodes, _) in enumerate(blocks)
                if block not in held and nodes > 0 and nodes - gone < k
            ]
            if gone and short:
                return (
                    f"{gone} node(s) lost in the masked-vector stage could leave a sum over fewer "
                    f"than {k} contributing clients: not unmasked"
                )
            return None

    results, tracking, requests, early = _run(
        grid, requests, settings, before_unmask, prepared, on_unmask
    )
    lost.update(early)
    if results is None:
        gone = _lost(tracking, requests, timeout)
        if tracking.refused is not None:
            gone = {node: f"{why}; {tracking.refused}" for node, why in gone.items()}
        return SecureOutcome({}, {}, {}, {**lost, **gone}, halted=True)
    outcome = _unmask(results, requests, tracking, timeout)
    outcome.keys_ahead = keys_ahead
    outcome.lost.update(lost)
    outcome.contributors, outcome.held = contributors, tuple(sorted(held))
    if contributors is not None:
        missing = len(requests) - len(results)
        session.held_blocks += len(held)
        session.unmasked.extend(
            (nodes - missing, clients)
            for blocks in contributors.values()
            for block, (nodes, clients) in enumerate(blocks)
            if nodes > 0 and block not in held
        )
    return outcome


def declared_counts(
    declared: Mapping[int, Mapping[str, np.ndarray]],
) -> dict[str, list[tuple[int, int]]]:
    """Per summed field, per block, (contributing nodes, contributing clients) of the declared
    contributors (node -> field -> (clients, blocks) flags)."""
    names = sorted({name for fields in declared.values() for name in fields})
    counts: dict[str, list[tuple[int, int]]] = {}
    for name in names:
        masks = [np.asarray(f[name], dtype=bool) for f in declared.values() if name in f]
        width = max(mask.shape[1] for mask in masks)
        nodes, clients = np.zeros(width, np.int64), np.zeros(width, np.int64)
        for mask in masks:
            nodes[: mask.shape[1]] += mask.any(axis=0)
            clients[: mask.shape[1]] += mask.sum(axis=0)
        counts[name] = [(int(n), int(c)) for n, c in zip(nodes, clients, strict=True)]
    return counts


def _unmask(
    results: list[tuple[_Node, FitRes]],
    requests: dict[int, FitIns],
    tracking: _TrackingGrid,
    timeout: float,
) -> SecureOutcome:
    """The outcome of a completed workflow: sums decoded, each survivor's clear reply."""
    survivors = {proxy.node_id: fitres for proxy, fitres in results}
    lost = {
        node: tracking.errors.get(node, f"no reply within {timeout:g} s")
        for node in requests
        if node not in survivors
    }
    clear: dict[int, BanditMessage] = {}
    layouts: dict[int, str] = {}
    clipped, seconds = 0, []
    for node, fitres in survivors.items():
        metrics = dict(fitres.metrics)
        try:
            layouts[node] = str(metrics.pop(LAYOUT_KEY))
            clipped += int(metrics.pop(CLIPPED_KEY))
            seconds.append(float(metrics.pop("handler-s")))
            clear[node] = decode(RecordDict({HEADER_KEY: ConfigRecord(metrics)}))  # type: ignore[arg-type]
        except (KeyError, TypeError, ValueError) as err:
            raise MalformedReplyError(f"node {node}: not a fedbandit secure reply: {err}") from None
    if len(set(layouts.values())) > 1:
        raise MalformedReplyError(
            "the nodes summed fields of different layouts: "
            + "; ".join(f"node {node}: {text}" for node, text in sorted(layouts.items()))
        )
    layout = json.loads(next(iter(layouts.values())))
    limb_sums = _limb_sums(results)
    sums: dict[str, np.ndarray] = {}
    start = 0
    for name, entry in layout["fields"].items():
        shape = tuple(int(k) for k in entry["shape"])
        size = int(np.prod(shape, dtype=np.int64))
        value = secure_sum.decode(limb_sums[start : start + size], len(survivors), shape)
        dtype = np.dtype(entry["dtype"])
        sums[name] = (np.rint(value) if dtype.kind in "iu" else value).astype(dtype)[None]
        start += size
    return SecureOutcome(
        clear,
        sums,
        dict(layout["sparse"]),
        lost,
        clipped=clipped,
        client_seconds=max(seconds, default=float("nan")),
    )
