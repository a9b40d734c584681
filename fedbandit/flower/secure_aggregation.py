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

The workflow returns sum(w_i x_i) / sum(w_i): every node gives weight 1 (``num_examples`` = 1 =
``max_weight``), so the result is the sum over the n survivors divided by n, multiplied back here
and rounded to the integer limb sums. With ``clipping_range`` = q / 2 Flower's quantiser is the
identity on integers, so the limbs pass unchanged and its unseeded stochastic rounding never acts.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
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
    "MIN_NODES",
    "QUANTIZATION_RANGE",
    "SecureOutcome",
    "SecureSettings",
    "default_threshold",
    "request_content",
    "secure_exchange",
    "secure_reply",
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
#: FitIns config keys: the names of the fields to sum (JSON list).
SUMMED_KEY = "secure-summed"
#: FitRes metrics keys: the summed fields' layout (JSON) and how many values were clipped.
LAYOUT_KEY = "secure-layout"
CLIPPED_KEY = "secure-clipped"
#: Effectively no limit: a secure exchange carries its messages inline, in the FitIns config
#: and the FitRes metrics (``codec.encode(..., inline_bytes=INLINE_ALWAYS)``).
INLINE_ALWAYS = 2**62


@dataclass(frozen=True)
class SecureSettings:
    """A run's secure aggregation: which reply fields of a message are summed (the server's
    ``ServerLogic.secure_fields``; empty: a plain exchange) and the reconstruction threshold,
    the nodes that must survive a secure exchange (None: ``default_threshold``)."""

    fields: Callable[[BanditMessage], frozenset[str]]
    threshold: int | None = None

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


def unwrap_request(content: RecordDict) -> tuple[RecordDict, frozenset[str]]:
    """On the node: the encoded message of ``request_content`` and the names to sum."""
    try:
        config = dict(content.config_records["fitins.config"])
        summed = json.loads(str(config.pop(SUMMED_KEY)))
    except (KeyError, ValueError) as err:
        raise MalformedReplyError(f"not a fedbandit secure exchange: {err}") from None
    return RecordDict({HEADER_KEY: ConfigRecord(config)}), frozenset(summed)


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

    def __init__(self, grid: Grid, poll_seconds: float, stop: threading.Event | None) -> None:
        self._grid, self.poll_seconds, self.stop = grid, poll_seconds, stop
        self.errors: dict[int, str] = {}
        self.silent: set[int] = set()

    def __getattr__(self, name: str):
        return getattr(self._grid, name)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        messages = list(messages)
        ids = list(self._grid.push_messages(messages))
        node_of = {mid: m.metadata.dst_node_id for mid, m in zip(ids, messages, strict=True)}
        pending = set(ids)
        replies: list[Message] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending and (deadline is None or time.monotonic() < deadline):
            if self.stop is not None and self.stop.is_set():
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


def secure_exchange(
    grid: Grid,
    requests: dict[int, FitIns],
    group_index: int,
    timeout: float,
    poll_seconds: float,
    threshold: int,
    stop: threading.Event | None = None,
) -> SecureOutcome:
    """One exchange through SecAgg+: ``requests`` (node -> its ``request_content``) delivered,
    the summed fields unmasked over the surviving nodes. Nodes that fail a stage (an error, or
    silent for ``timeout`` seconds) are dropped by SecAgg+ and named in ``lost``; with fewer
    than ``threshold`` left, the outcome is ``halted``. ``group_index`` (the job's index in a
    simulation, 0 in a deployment) becomes the messages' ``group_id``: Flower's workflow sets it
    from its round, so the round is set to it."""
    legacy_records.require()
    tracking = _TrackingGrid(grid, poll_seconds, stop)
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
    workflow(tracking, context)  # type: ignore[arg-type]
    if strategy.results is None:
        lost = {node: why for node, why in tracking.errors.items()}
        lost.update({node: f"no reply within {timeout:g} s" for node in tracking.silent})
        return SecureOutcome({}, {}, {}, lost, halted=True)
    return _unmask(strategy.results, requests, tracking, timeout)


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
    vector = parameters_to_ndarrays(next(iter(survivors.values())).parameters)[0]
    limb_sums = np.rint(np.asarray(vector, dtype=np.float64) * len(survivors))
    limb_sums = limb_sums.reshape(-1, secure_sum.LIMBS)
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
