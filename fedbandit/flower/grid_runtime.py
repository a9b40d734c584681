"""The Flower transport of a federation: ``FlowerGridRuntime`` delivers each round's message to
the nodes through a Flower ``Grid`` (deadlines, reply checks, lost nodes, restarted nodes), and
``discover_nodes`` learns which clients each node serves before round 1, checking that the ranges
cover every client exactly once. The wire format is ``fedbandit.flower.codec``'s."""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from logging import WARNING
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import Message, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from fedbandit.errors import DeploymentError
from fedbandit.federation import Message as BanditMessage
from fedbandit.federation.run_ahead import ReplyBuffer, empty_round
from fedbandit.federation.runtime import ClientFailure, Runtime, describe_clients
from fedbandit.flower.codec import (
    REGRET_PIECE_VALUES,
    MalformedReplyError,
    decode,
    decode_hello,
    decode_regret_piece,
    decode_steps,
    encode,
    handler_seconds,
    regret_query,
    set_ahead,
)
from fedbandit.flower.internals import object_push, pull_backoff
from fedbandit.flower.secure_aggregation import (
    INLINE_ALWAYS,
    MIN_NODES,
    PreparedKeys,
    SecureRefusalError,
    SecureSettings,
    request_content,
    secure_exchange,
)
from fedbandit.group_environment import RegretRecord

if TYPE_CHECKING:
    from fedbandit.flower.job import FlowerJob

__all__ = ["FlowerGridRuntime", "discover_nodes"]


#: Messages sent to a node again when its reply's upload was lost (``FlowerGridRuntime._send``):
#: a step is answered from the node's kept answer (``fedbandit.flower.apps.answered_once``), a
#: regret query and a hello change nothing on the node (a regret query's rewind is done once).
ASK_AGAIN = frozenset({"query.hello", "train.step", "query.regret"})
#: How many times one exchange asks one node again.
ASK_AGAIN_TIMES = 2
#: A push of the ServerApp's messages whose objects the SuperLink lost is sent again, as new
#: messages, at most this many times in a row, after waits of ``PUSH_AGAIN_WAIT_SECONDS`` doubling.
PUSH_AGAIN_TIMES = 4
PUSH_AGAIN_WAIT_SECONDS = 0.5


class LostPushError(DeploymentError):
    """The SuperLink lost the objects of the ServerApp's messages ``PUSH_AGAIN_TIMES`` + 1 times in
    a row."""


def push_whole(
    grid: Grid, messages: list[Message], stop: threading.Event | None = None
) -> tuple[list[str], int]:
    """``grid.push_messages(messages)``, sent again as new messages (same content, new ids) when
    the SuperLink lost one of their objects (``object_push.is_lost_push``): at most
    ``PUSH_AGAIN_TIMES`` times, waiting 0.5, 1, 2, 4 s. Messages of a failed push that did arrive
    whole may still be delivered: a node answers a request it answered already from its kept
    answer (``fedbandit.flower.apps.answered_once``), and a hello or regret query changes nothing,
    so only ``ASK_AGAIN`` kinds are sent again; other failures propagate unchanged. Returns the
    message ids and how many times the messages were sent again.

    A message of the failed push can stay incomplete for good (when the lost object was its own
    top object), and a node that pulled it waits for it up to its object limit
    (``pull_backoff.SUPERNODE_OBJECT_WAIT_SECONDS``) before it takes the copy sent again."""
    for attempt in range(PUSH_AGAIN_TIMES + 1):
        try:
            return list(grid.push_messages(messages)), attempt
        except Exception as err:
            kinds = sorted({m.metadata.message_type for m in messages})
            if not object_push.is_lost_push(err) or not set(kinds) <= ASK_AGAIN:
                raise
            if attempt == PUSH_AGAIN_TIMES:
                raise LostPushError(
                    f"the SuperLink lost an object of the ServerApp's {', '.join(kinds)} "
                    f"messages {attempt + 1} times in a row ({err}); is its database on a slow "
                    "or full disk, or the host overloaded?"
                ) from None
            log(
                WARNING,
                "the SuperLink lost an object of %d %s message(s) in their upload (%s): sending "
                "them again (%d of %d)",
                len(messages), "/".join(kinds), err, attempt + 1, PUSH_AGAIN_TIMES,
            )  # fmt: skip
            check_stop(stop)
            time.sleep(PUSH_AGAIN_WAIT_SECONDS * 2**attempt)
            messages = [renewed(m) for m in messages]
    raise AssertionError("unreachable")  # pragma: no cover


def renewed(message: Message) -> Message:
    """A new message with ``message``'s content, destination, type and group (a new id)."""
    meta = message.metadata
    return Message(
        message.content,
        dst_node_id=meta.dst_node_id,
        message_type=meta.message_type,
        group_id=meta.group_id,
    )


def describe_error(reply: Message) -> str:
    """Why a node's reply is an error. Flower's ServerApp turns a reply whose objects never
    arrived (its sender stopped while uploading: killed, or its host lost) into an error reply
    of code ``MESSAGE_UNAVAILABLE``: that is no reply, said so."""
    code, reason = reply.error.code, reply.error.reason
    if code == pull_backoff.MESSAGE_UNAVAILABLE:
        return f"no reply: the node stopped while uploading it ({reason})"
    return f"error reply (code {code}): {reason}"


class FlowerGridRuntime(Runtime):
    """Delivers each round's message to the nodes through a Flower ``Grid``.

    Every round has a deadline, ``timeout`` seconds after the push. A connected node whose reply
    was lost in its upload (Flower's "objects unavailable" error) is asked again, at most
    ``ASK_AGAIN_TIMES`` times, each time with a deadline of ``timeout`` seconds of its own (the
    node answered: only its upload was lost). A node is lost as a whole when it answers
    with another error, stays silent until the deadline, or sends a reply that cannot be
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
        steps_per_round: int = 1,
        group_id: str = "",
        stop: threading.Event | None = None,
        secure: SecureSettings | None = None,
        prepare_keys: bool = False,
    ) -> None:
        self.grid, self.ranges = grid, dict(ranges)
        #: Clients lost for good in an earlier seed that no node serves (``NodeRanges.absent``):
        #: the first exchange loses them, so that ``drop`` removes them at once.
        self.absent = np.asarray(getattr(ranges, "absent", ()), dtype=np.int64)
        self._unserved = np.empty(0, np.int64)  # the absent clients, once lost
        #: Secure aggregation: the exchanges whose summed fields travel through SecAgg+.
        self.secure = secure
        #: What secure aggregation did: exchanges, values clipped, nodes lost in it.
        self.secure_report: dict[str, int] = {
            "exchanges": 0,
            "clipped_values": 0,
            "lost_nodes": 0,
            "keys_set_up_ahead": 0,
        }
        #: Set up the SecAgg+ keys of the next secure exchange ahead, while the exchanges before
        #: it run (``PreparedKeys``), when the server says one follows (``SecureSettings.follows``):
        #: in a node state slot of their own, beside a secure exchange in another slot.
        self.prepare_keys = prepare_keys
        self._prepared: PreparedKeys | None = None
        self._slots = 0  # node state slots handed out, in order (``slotted_secaggplus_mod``)
        #: Names the job of every message sent (a simulation runs several jobs on its nodes).
        self.group_id = group_id
        #: Set when the run is stopped from outside (Ctrl-C of a simulation): waits end at once.
        self.stop = stop
        #: Logical exchanges one delivered message may carry (``fedbandit.federation.run_ahead``).
        self.steps_per_round = steps_per_round
        self.buffer = ReplyBuffer()
        self._delivered_to: set[int] = set()  # nodes of the last delivery (they may rewind)
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
        #: Called with each round's number before it is delivered (a detached run's progress).
        self.on_round: Callable[[int], None] | None = None
        # request kind -> structures of the replies accepted for it
        self._structures: dict[str, set[tuple]] = {}
        #: Per exchange: round, kind, the server's compute since the previous exchange ended
        #: (aggregate, then configure), seconds from push to the last reply, and the slowest
        #: node's ClientApp handler seconds (the rest of the exchange is Flower's transport).
        self.timings: list[dict[str, float | int | str]] = []
        self._last_end = time.perf_counter()
        #: Requests sent to a node again after its reply's upload was lost (``_ask_again``).
        self.asked_again = 0
        #: Values of a regret curve asked for in one regret query (``codec.REGRET_PIECE_VALUES``).
        self.regret_piece_values = REGRET_PIECE_VALUES

    def _send(self, messages: list[Message]) -> tuple[dict[int, Message], dict[int, str], set[int]]:
        """Push, then pull until every node replied or the deadline. Returns the good replies and
        the error replies' reasons by node, and the nodes silent until the deadline.

        Each message is pushed on its own, not in one batch: Flower registers a batch's messages
        first and then uploads all their objects, and a node that pulled its message waits for
        that message's objects at most ``pull_backoff.SUPERNODE_OBJECT_WAIT_SECONDS``. At 16
        SuperNodes under load 26-35 the upload of a round's 16 messages took over 60 s (about a
        second per object request, SQLite locks retried): 13 nodes gave up on their message and
        the round was lost. One push per message makes a node wait for its own objects only, at
        one more request per node and round."""
        if not messages:
            return {}, {}, set()
        sent: dict[str, Message] = {}
        # each message's deadline: the round's for the first, a full one for a message asked again;
        # after a push sent again, a node may first wait out a copy that stays incomplete
        deadline_of: dict[str, float] = {}
        for message in messages:
            (mid,), pushed_again = push_whole(self.grid, [message], self.stop)
            grace = pull_backoff.SUPERNODE_OBJECT_WAIT_SECONDS if pushed_again else 0.0
            sent[mid], deadline_of[mid] = message, time.monotonic() + self.timeout + grace
        node_of = {mid: m.metadata.dst_node_id for mid, m in sent.items()}
        pending: set[str] = set(sent)
        replies: dict[int, Message] = {}
        errors: dict[int, str] = {}
        asked_again: dict[int, int] = {}
        lost_upload: dict[int, str] = {}  # nodes asked again, with the reason
        while live := [mid for mid in pending if time.monotonic() < deadline_of[mid]]:
            check_stop(self.stop)
            for reply in self.grid.pull_messages(live):
                mid = reply.metadata.reply_to_message_id
                if mid not in pending:  # a stray or repeated reply: not an answer we wait for
                    continue
                pending.discard(mid)
                node = node_of[mid]
                if reply.has_error() and self._ask_again(sent[mid], reply, asked_again):
                    lost_upload[node] = describe_error(reply)
                    again = self._message(sent[mid].content, node, sent[mid].metadata.message_type)
                    (new_id,), pushed_again = push_whole(self.grid, [again], self.stop)
                    sent[new_id], node_of[new_id] = again, node
                    grace = pull_backoff.SUPERNODE_OBJECT_WAIT_SECONDS if pushed_again else 0.0
                    deadline_of[new_id] = time.monotonic() + self.timeout + grace
                    pending.add(new_id)
                elif reply.has_error():
                    errors[node] = describe_error(reply)
                else:
                    replies[node] = reply
            if pending:
                time.sleep(self.poll_seconds)
        silent = {node_of[mid] for mid in pending}
        for node in silent & set(lost_upload):  # a node asked again, then silent: say why
            errors[node] = (
                f"{lost_upload[node]}; asked again, it did not answer within {self.timeout:g} s"
            )
        return replies, errors, silent - set(lost_upload)

    def _ask_again(self, message: Message, reply: Message, asked_again: dict[int, int]) -> bool:
        """True when ``reply`` is Flower's "objects unavailable" error for a node still connected
        and ``message`` may be sent to it again (``ASK_AGAIN``, at most ``ASK_AGAIN_TIMES`` per
        exchange): the node answered, but its reply's upload was lost (a push session that
        expired, or an object a locked SuperLink store lost after accepting it). The node
        answers a request it already answered with the same reply (``build_client_app``)."""
        node = message.metadata.dst_node_id
        if (
            reply.error.code != pull_backoff.MESSAGE_UNAVAILABLE
            or message.metadata.message_type not in ASK_AGAIN
            or asked_again.get(node, 0) >= ASK_AGAIN_TIMES
            or node not in set(self.grid.get_node_ids())
        ):
            return False
        asked_again[node] = asked_again.get(node, 0) + 1
        log(
            WARNING,
            "node %s's reply to %s was lost in its upload (%s): asking it again (%d of %d)",
            node, message.metadata.message_type, reply.error.reason, asked_again[node],
            ASK_AGAIN_TIMES,
        )  # fmt: skip
        self.asked_again += 1
        return True

    def _message(self, content: RecordDict, node: int, message_type: str) -> Message:
        return Message(content, dst_node_id=node, message_type=message_type, group_id=self.group_id)

    def _where(self, node: int) -> str:
        return f"node {node} (clients {describe_clients(self.ranges[node])})"

    def _failure(self, failures: dict[int, str], partial: BanditMessage | None) -> ClientFailure:
        """Mark the nodes lost; the exception naming all their clients."""
        self.lost.update(failures)
        self._cancel_keys_of(failures)
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

    def _content(self, node: int, part: BanditMessage, budget: int) -> RecordDict:
        """A delivered message's records: the message, and with run-ahead its instructions."""
        content = encode(part)
        if self.steps_per_round > 1:
            self._set_ahead(content, node, budget)
        return content

    def _set_ahead(self, content: RecordDict, node: int, budget: int) -> None:
        """Run-ahead instructions: ``budget``, and how many exchanges of its last delivery the
        node must keep (0 when it took no part in the last delivery: nothing to rewind)."""
        set_ahead(content, budget, self.buffer.consumed if node in self._delivered_to else 0)

    def _decode(self, reply: Message, sent: BanditMessage, budget: int) -> list[BanditMessage]:
        """A node's replies to ``sent`` (one per exchange it ran), checked; MalformedReplyError."""
        if self.steps_per_round > 1:
            parts = decode_steps(reply.content, sent.client_ids, sent.round, budget)
        else:
            parts = [decode(reply.content, sent.client_ids, sent.round)]
        assumed = sent
        for index, part in enumerate(parts):
            if index:
                assumed = empty_round(assumed)
            self._check_reply(assumed, part)
        return parts

    def exchange(self, message: BanditMessage) -> BanditMessage:
        """The joined replies; raises ``ClientFailure`` when nodes are lost (see the class).
        With ``steps_per_round`` > 1 the nodes may run ahead: the replies of the exchanges all
        of them ran are kept and returned without delivering while the server's messages are
        the empty rounds they assumed."""
        if self.absent.size:
            return self._without_absent(message)
        summed = self.secure.fields(message) if self.secure is not None else frozenset()
        if self.steps_per_round > 1 and (stored := self.buffer.take(message)) is not None:
            if leaked := sorted(summed & set(stored.fields)):
                raise RuntimeError(
                    f"round {message.round}: the replies' fields {leaked}, which secure "
                    "aggregation sums, came back in the clear with run-ahead replies: the "
                    "algorithm's ClientLogic.uploads_next must say True before such a step"
                )
            return stored
        if summed:
            return self._secure_exchange(message, summed)
        if self.on_round is not None:
            self.on_round(message.round)
        budget = self.steps_per_round
        sent, failures = self._split(message)
        out = [
            self._message(self._content(node, part, budget), node, "train.step")
            for node, part in sent.items()
            if node not in failures
        ]
        if self.prepare_keys:
            self._prepare(message, [node for node in sent if node not in failures])
        started = time.perf_counter()
        replies, errors, silent = self._send(out)
        handler = [
            seconds for r in replies.values() if (seconds := handler_seconds(r.content)) is not None
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
        decoded, steps = {}, {}
        for node, reply in replies.items():
            try:
                steps[node] = self._decode(reply, sent[node], budget)
            except MalformedReplyError as err:
                failures[node] = f"malformed reply: {err}"
            else:
                decoded[node] = steps[node][0]
        failures.update(self._outvoted(message.kind, decoded))
        unreachable = [n for n in failures if n in errors or n in silent]
        if unreachable and self.reconnect_seconds > 0:
            self._reconnect(unreachable, sent, message, failures, steps)
            decoded = {node: parts[0] for node, parts in steps.items()}
        good = [node for node in sorted(decoded) if node not in failures]
        self._delivered_to = set(good)
        if failures:
            self.buffer.consumed = 1  # the survivors' first exchange is used, no more
            parts = [decoded[node] for node in good]
            raise self._failure(failures, BanditMessage.concatenate(parts) if parts else None)
        return self.buffer.store(message, [steps[node] for node in good])

    def _without_absent(self, message: BanditMessage) -> BanditMessage:
        """The seed's first exchange while clients lost for good in an earlier seed are absent:
        ``message`` goes to the other clients, and ``ClientFailure`` names the absent ones with
        the others' replies (under ``drop`` the server then goes on without them from the first
        round instead of the seed waiting for them)."""
        absent, self.absent = self.absent, np.empty(0, np.int64)
        self._unserved = absent
        reasons = {
            f"clients {describe_clients(absent)}": "lost in an earlier seed of this command, "
            "and no node serves them now"
        }
        keep = np.flatnonzero(~np.isin(message.client_ids, absent))
        try:
            reply = self.exchange(message.select(keep)) if keep.size else None
        except ClientFailure as failure:
            raise ClientFailure(
                np.union1d(failure.lost_clients, absent),
                {**reasons, **failure.reasons},
                failure.partial,
                failure.fatal,
            ) from None
        raise ClientFailure(absent, reasons, reply)

    def _split(self, message: BanditMessage) -> tuple[dict[int, BanditMessage], dict[int, str]]:
        """Each node's part of ``message``, and the nodes among them lost earlier (with why);
        a ValueError when it addresses clients no node serves."""
        sent: dict[int, BanditMessage] = {}
        failures: dict[int, str] = {}
        for node, ids in self.ranges.items():
            positions = np.flatnonzero(np.isin(message.client_ids, ids))
            if len(positions) == 0:
                continue
            sent[node] = message.select(positions)
            if node in self.lost:
                failures[node] = f"lost earlier: {self.lost[node]}"
        served = np.concatenate([p.client_ids for p in sent.values()] + [np.empty(0, np.int64)])
        if len(served) != message.num_clients:
            unserved = np.setdiff1d(message.client_ids, served)
            raise ValueError(
                f"round {message.round} addresses clients no node serves (or dropped ones): "
                f"{describe_clients(unserved)}"
            )
        return sent, failures

    def _secure_exchange(self, message: BanditMessage, summed: frozenset[str]) -> BanditMessage:
        """Deliver ``message`` through SecAgg+ (``fedbandit.flower.secure_aggregation``): the
        reply's ``summed`` fields come back as their sum over the nodes that answered
        (``BanditMessage.summed``), the rest per client. A node lost on the way is lost as in a
        plain round (``ClientFailure`` with the survivors' sum); too few left to unmask fails the
        round for good (``fatal``). Delivered alone, never run ahead: a node that ran ahead in
        the last delivery is told how far to go back."""
        if self.on_round is not None:
            self.on_round(message.round)
        sent, failures = self._split(message)
        requests = {}
        for node, part in sent.items():
            if node in failures:
                continue
            content = encode(part, inline_bytes=INLINE_ALWAYS)
            if self.steps_per_round > 1:
                self._set_ahead(content, node, 1)
            requests[node] = request_content(content, summed)
        assert self.secure is not None
        declared = self._declared(message, sent, requests)
        threshold = self.secure.threshold_for(len(requests))
        started = time.perf_counter()
        prepared, self._prepared = self._prepared, None  # secure_exchange waits for them
        slot: int | None = None
        on_unmask: Callable[[set[int]], None] | None = None
        if self.prepare_keys:  # a slot of its own; the next exchange's keys, with the nodes
            slot = self._new_slot()  # asked to unmask, in the slot after
            on_unmask = functools.partial(self._prepare, message)

        outcome, broken = None, ""
        if len(requests) < MIN_NODES:
            broken = f"it needs {MIN_NODES} or more nodes; {len(requests)} are left"
            if prepared is not None:
                prepared.cancel()
        else:
            try:
                outcome = secure_exchange(
                    self.grid,
                    requests,
                    int(self.group_id or 0),
                    self.timeout,
                    self.poll_seconds,
                    threshold,
                    self.stop,
                    declared,
                    prepared,
                    slot,
                    on_unmask,
                )
            except SecureRefusalError as err:  # refused before anything was unmasked
                broken = str(err)
            except (MalformedReplyError, ValueError, KeyError, TypeError) as err:
                broken = f"a reply it cannot use: {err}"  # inside the sum: nothing is usable
            check_stop(self.stop)
            self.secure_report["exchanges"] += 1
        self.timings.append(
            {
                "round": message.round,
                "kind": message.kind,
                "server_s": started - self._last_end,
                "exchange_s": time.perf_counter() - started,
                "client_s": outcome.client_seconds if outcome is not None else float("nan"),
            }
        )
        self._last_end = time.perf_counter()
        self.buffer.delivered_alone()
        self._delivered_to = set()
        if outcome is None or outcome.halted:
            gone = outcome.lost if outcome is not None else {}
            why = broken or f"fewer than {threshold} of {len(requests)} nodes left to unmask"
            raise self._halted(failures, requests, f"secure aggregation halted ({why})", gone)
        self.secure_report["clipped_values"] += outcome.clipped
        self.secure_report["keys_set_up_ahead"] += int(outcome.keys_ahead)
        self.secure_report["lost_nodes"] += len(outcome.lost)
        failures.update(outcome.lost)
        rejected: dict[int, str] = {}
        for node, part in outcome.clear.items():
            try:
                if not np.array_equal(part.client_ids, sent[node].client_ids) or (
                    part.round != message.round
                ):
                    raise MalformedReplyError(
                        f"reply for clients {describe_clients(part.client_ids)} round "
                        f"{part.round}, expected {describe_clients(sent[node].client_ids)} round "
                        f"{message.round}"
                    )
                self._check_reply(sent[node], part)
            except MalformedReplyError as err:
                rejected[node] = f"malformed reply: {err}"
        rejected.update(self._outvoted(message.kind, outcome.clear))
        if rejected:  # a rejected reply is inside the sum: nothing of this round can be used
            why = "a node's reply was rejected, and its values are inside the sum"
            raise self._halted(failures, requests, f"secure aggregation unusable ({why})", rejected)
        good = sorted(outcome.clear)
        self._delivered_to = set(good)
        joined = BanditMessage.concatenate([outcome.clear[node] for node in good])
        reply = BanditMessage(
            joined.kind,
            joined.round,
            joined.client_ids,
            {**joined.fields, **outcome.sums},
            sparse={**joined.sparse, **outcome.sparse},
            known=joined.known,
            meta=joined.meta,
            summed=frozenset(outcome.sums),
        )
        if failures:
            raise self._failure(failures, reply)
        return reply

    def _new_slot(self) -> int:
        self._slots += 1
        return self._slots

    def _prepare(self, message: BanditMessage, nodes: Iterable[int]) -> None:
        """While ``message`` is out, when the server says a secure exchange follows it and no
        keys are being set up already: set up that exchange's SecAgg+ keys with ``nodes``, in
        a node state slot of their own."""
        if not self.prepare_keys or self.secure is None or self._prepared is not None:
            return
        nodes = sorted(node for node in nodes if node not in self.lost)
        if len(nodes) < MIN_NODES or not self.secure.follows(message):
            return
        self._prepared = PreparedKeys(
            self.grid,
            nodes,
            group_index=int(self.group_id or 0),
            timeout=self.timeout,
            poll_seconds=self.poll_seconds,
            threshold=self.secure.threshold_for(len(nodes)),
            stop=self.stop,
            slot=self._new_slot(),
        )

    def _cancel_keys_of(self, nodes: Iterable[int]) -> None:
        """Drop keys set up ahead with any of ``nodes`` (lost: the keys could not be used, and
        waiting for them would wait for the lost node)."""
        if self._prepared is not None and self._prepared.nodes & set(nodes):
            self.close()

    def close(self) -> None:
        """Stop and drop keys being set up ahead (at the end of a run, whatever its end)."""
        if self._prepared is not None:
            self._prepared.cancel()
            self._prepared = None

    def _declared(
        self, message: BanditMessage, sent: dict[int, BanditMessage], requests: Mapping[int, object]
    ) -> dict[int, dict[str, np.ndarray]] | None:
        """The server's declared contributors (``ServerLogic.secure_contributors``) split by node,
        or None (they are counted); a ValueError when they do not fit the message."""
        assert self.secure is not None
        declared = self.secure.contributors(message)
        if declared is None:
            return None
        masks = {name: np.asarray(mask, dtype=bool) for name, mask in declared.items()}
        for name, mask in masks.items():
            if mask.ndim != 2 or len(mask) != message.num_clients:
                raise ValueError(
                    f"round {message.round}: declared contributors of {name!r} have shape "
                    f"{mask.shape}, expected ({message.num_clients}, blocks)"
                )
        split = {}
        for node in requests:
            rows = np.flatnonzero(np.isin(message.client_ids, sent[node].client_ids))
            split[node] = {name: mask[rows] for name, mask in masks.items()}
        return split

    def _halted(
        self,
        failures: dict[int, str],
        requests: Mapping[int, object],
        why: str,
        gone: dict[int, str],
    ) -> ClientFailure:
        """A secure exchange that cannot be used: a ``fatal`` failure naming every addressed
        node's clients (those lost earlier in ``failures``, those asked in ``requests`` with
        ``why`` and, for the nodes in ``gone``, what happened to them). Only the nodes in
        ``gone`` are lost; the others still report their regret."""
        self.secure_report["lost_nodes"] += len(gone)
        reasons = dict(failures)
        for node in requests:
            reasons[node] = why + (f": {gone[node]}" if node in gone else "")
        self.lost.update(gone)
        self._cancel_keys_of(gone)
        lost = np.concatenate([self.ranges[node] for node in reasons])
        described = {self._where(node): text for node, text in sorted(reasons.items())}
        return ClientFailure(lost, described, None, fatal=True)

    def _reconnect(
        self,
        unreachable: list[int],
        sent: dict[int, BanditMessage],
        message: BanditMessage,
        failures: dict[int, str],
        decoded: dict[int, list[BanditMessage]],
    ) -> None:
        """Wait up to ``reconnect_seconds`` for new nodes serving exactly the clients of the
        ``unreachable`` ones (restarted SuperNodes), move those clients to them and deliver the
        round again; updates ``failures`` and ``decoded`` (each node's replies) in place."""
        waiting = {node: self.ranges[node] for node in unreachable}
        deadline = time.monotonic() + self.reconnect_seconds
        while waiting and time.monotonic() < deadline:
            known = set(self.ranges) | set(self.dropped) | self._strangers
            new = [n for n in self.grid.get_node_ids() if n not in known]
            hello = [self._message(RecordDict({}), n, "query.hello") for n in new]
            replies, _, _ = self._send(hello)
            for node, reply in replies.items():
                try:
                    ids = decode_hello(reply.content)
                except MalformedReplyError:
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
                content = self._content(node, sent[node], self.steps_per_round)
                again = self._message(content, node, "train.step")
                answers, errors, _ = self._send([again])
                try:
                    if node not in answers:
                        raise MalformedReplyError(errors.get(node, "no reply"))
                    parts = self._decode(answers[node], sent[node], self.steps_per_round)
                except MalformedReplyError as err:
                    failures[node] = f"{reason}; its replacement failed too: {err}"
                else:
                    decoded[node] = parts
            if waiting:
                time.sleep(0.5)

    def regret_records(self) -> list[RegretRecord]:
        """The records of the nodes still reachable; nodes that fail now are lost (ClientFailure):
        the next call leaves them out. A curve longer than ``regret_piece_values`` is asked for
        in pieces, one exchange each, so that no reply grows with the horizon."""
        self.close()
        failures: dict[int, str] = {}
        records: dict[int, RegretRecord] = {}
        pieces: dict[int, list[np.ndarray]] = {}
        lengths: dict[int, int] = {}
        start, asked = 0, [node for node in self.ranges if node not in self.lost]
        while asked:
            messages = []
            for node in asked:
                content = regret_query(start, self.regret_piece_values)
                if self.steps_per_round > 1:  # a node that ran ahead rewinds first
                    self._set_ahead(content, node, 1)
                messages.append(self._message(content, node, "query.regret"))
            replies, errors, silent = self._send(messages)
            failures.update(errors)
            failures.update({node: f"no reply within {self.timeout:g} s" for node in silent})
            for node, reply in sorted(replies.items()):
                try:
                    piece, length = decode_regret_piece(reply.content, self.ranges[node], start)
                    if lengths.setdefault(node, length) != length:
                        raise MalformedReplyError(
                            f"a regret curve of {length} values, {lengths[node]} before"
                        )
                except MalformedReplyError as err:
                    failures[node] = f"malformed regret record: {err}"
                    continue
                records.setdefault(node, piece)
                pieces.setdefault(node, []).append(piece.increment_diff)
            start += self.regret_piece_values
            asked = [n for n in replies if n not in failures and start < lengths[n]]
        records = {
            node: dataclasses.replace(record, increment_diff=np.concatenate(pieces[node]))
            for node, record in records.items()
            if node not in failures
        }
        horizons = [(r.increment_diff.shape, r.scale) for r in records.values()]
        common = max(set(horizons), key=horizons.count, default=None)
        for node, record in records.items():
            if (record.increment_diff.shape, record.scale) != common:
                failures[node] = "regret record of another horizon or scale than the other nodes'"
        if failures:
            raise self._failure(failures, None)
        return list(records.values())

    def drop(self, client_ids: np.ndarray) -> None:
        """Forget the nodes serving ``client_ids``: a node is dropped as a whole. Clients no
        node served in this seed (absent from its start) need no node. The Grid remembers the
        clients dropped for its later seeds (``lost_for_good``)."""
        ids = np.unique(np.asarray(client_ids, dtype=np.int64))
        self._cancel_keys_of(n for n, served in self.ranges.items() if np.isin(served, ids).any())
        if _weakref_able(self.grid):
            _DROPPED_ON_GRID.setdefault(self.grid, set()).update(ids.tolist())
        ids = np.setdiff1d(ids, self._unserved)
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


#: Seconds discovery still waits for nodes that have not answered their hello once the nodes that
#: did cover every client: long enough for a live node's reply (to catch an overlap), short
#: enough not to matter when the silent node is a dead one the SuperLink still lists.
HELLO_GRACE_SECONDS = 2.0


def check_stop(stop: threading.Event | None) -> None:
    """Raise ``SimulationStoppedError`` when ``stop`` is set."""
    if stop is not None and stop.is_set():
        raise SimulationStoppedError("the simulation was stopped")


class SimulationStoppedError(RuntimeError):
    """The driver stopped the simulation (Ctrl-C) while this ServerApp waited for its nodes."""


class NodeRanges(dict[int, np.ndarray]):
    """``discover_nodes``' answer: each node's clients, and ``absent``, the clients lost for
    good in an earlier seed that no node serves now (``FlowerGridRuntime`` drops them in the
    seed's first exchange)."""

    absent: np.ndarray = np.empty(0, np.int64)


#: Per Grid (one Flower run's ServerApp): the clients dropped by its earlier seeds under
#: ``on_client_failure = "drop"`` (a detached run runs a command's seeds on one Grid).
_DROPPED_ON_GRID: weakref.WeakKeyDictionary[Grid, set[int]] = weakref.WeakKeyDictionary()


def lost_for_good(grid: Grid, job: FlowerJob) -> np.ndarray:
    """The clients this seed does not wait for: ``job.absent_clients`` (lost in an earlier
    seed of the command, told by the driver) and those the earlier seeds on ``grid`` dropped;
    none unless the job's policy is ``drop``."""
    if job.on_client_failure != "drop":
        return np.empty(0, np.int64)
    earlier = _DROPPED_ON_GRID.get(grid, set()) if _weakref_able(grid) else set()
    return np.unique(np.asarray([*job.absent_clients, *earlier], dtype=np.int64))


def _weakref_able(grid: object) -> bool:
    try:
        weakref.ref(grid)
    except TypeError:
        return False
    return True


def discover_nodes(
    grid: Grid,
    job: FlowerJob,
    num_clients: int,
    group_id: str = "",
    stop: threading.Event | None = None,
) -> NodeRanges:
    """The client range of every node taking part: each connected node is asked once (a hello)
    which clients it serves, until the nodes that answered cover every client exactly once.

    Nodes that answer with an error or stay silent are left out: the SuperLink lists a dead node
    for a minute or more, and it must not stop a run that the live nodes can serve. Two nodes
    serving the same client raise ``DeploymentError`` naming both at once; clients still unserved
    at ``start_deadline`` raise it naming them, the nodes that answered and those that did not.
    Under ``drop``, clients lost for good in an earlier seed (``lost_for_good``) are not waited
    for: served by a node that answers, they take part; else they are the answer's ``absent``."""
    deadline = time.monotonic() + job.start_deadline
    absent = lost_for_good(grid, job)
    absent = absent[absent < num_clients]
    needed = np.ones(num_clients, dtype=bool)
    needed[absent] = False
    ranges: dict[int, np.ndarray] = {}
    asked: dict[str, int] = {}  # hello message id -> node
    hellos_again: dict[int, int] = {}
    failed: dict[int, str] = {}
    covered_at: float | None = None
    while True:
        check_stop(stop)
        known = set(ranges) | set(failed) | set(asked.values())
        new = [n for n in grid.get_node_ids() if n not in known]
        if new:
            hello = [
                Message(
                    RecordDict({}), dst_node_id=n, message_type="query.hello", group_id=group_id
                )
                for n in new
            ]
            ids, _ = push_whole(grid, hello, stop)
            asked.update(zip(ids, new, strict=True))
        pending = [mid for mid, node in asked.items() if node not in ranges and node not in failed]
        for reply in grid.pull_messages(pending) if pending else []:
            node = asked.get(reply.metadata.reply_to_message_id)
            if node is None or node in ranges or node in failed:
                continue
            if reply.has_error() and _hello_again(grid, node, reply, hellos_again):
                again = Message(
                    RecordDict({}), dst_node_id=node, message_type="query.hello", group_id=group_id
                )
                del asked[reply.metadata.reply_to_message_id]  # answered: never pulled again
                asked.update(zip(push_whole(grid, [again], stop)[0], [node], strict=True))
                continue
            if reply.has_error():
                failed[node] = f"error reply (code {reply.error.code}): {reply.error.reason}"
                continue
            try:
                ranges[node] = decode_hello(reply.content)
            except MalformedReplyError as err:
                failed[node] = f"malformed hello reply: {err}"
                continue
            if (beyond := ranges[node][ranges[node] >= num_clients]).size:
                raise DeploymentError(
                    f"node {node} serves clients {describe_clients(ranges[node])}, but the "
                    f"experiment has {num_clients} clients (0-{num_clients - 1}): clients "
                    f"{describe_clients(beyond)} do not exist; restart it with a --clients "
                    "range inside the experiment"
                )
            _refuse_overlaps(ranges, node)
        counts = np.bincount(
            np.concatenate([*ranges.values(), np.empty(0, np.int64)]), minlength=num_clients
        )
        silent = {node for node in asked.values() if node not in ranges and node not in failed}
        now = time.monotonic()
        if np.all(counts[needed] == 1):
            covered_at = covered_at if covered_at is not None else now
            if not silent or now - covered_at >= HELLO_GRACE_SECONDS:
                found = NodeRanges(ranges)
                found.absent = absent[counts[absent] == 0]
                return found
        if now >= deadline:
            raise DeploymentError(
                _unserved(np.flatnonzero((counts == 0) & needed), job, ranges, failed, silent)
            )
        time.sleep(job.poll_seconds)


def _hello_again(grid: Grid, node: int, reply: Message, asked_again: dict[int, int]) -> bool:
    """True when a hello's reply was lost in its upload (Flower's "objects unavailable") and the
    node, still connected, may be asked again (at most ``ASK_AGAIN_TIMES``)."""
    if (
        reply.error.code != pull_backoff.MESSAGE_UNAVAILABLE
        or asked_again.get(node, 0) >= ASK_AGAIN_TIMES
        or node not in set(grid.get_node_ids())
    ):
        return False
    asked_again[node] = asked_again.get(node, 0) + 1
    log(WARNING, "node %s's hello reply was lost in its upload: asking it again", node)
    return True


def _refuse_overlaps(ranges: dict[int, np.ndarray], node: int) -> None:
    """Raise when ``node``'s clients are already served by another node (naming both)."""
    for other, served in ranges.items():
        both = np.intersect1d(served, ranges[node])
        if other != node and both.size:
            raise DeploymentError(
                f"clients {describe_clients(both)} are served by two nodes: node {other} "
                f"(clients {describe_clients(served)}) and node {node} (clients "
                f"{describe_clients(ranges[node])}); give each SuperNode its own --clients range"
            )


def _unserved(
    missing: np.ndarray,
    job: FlowerJob,
    ranges: dict[int, np.ndarray],
    failed: dict[int, str],
    silent: set[int],
) -> str:
    """The message for clients no live node serves at the start deadline."""
    serving = ", ".join(f"node {n} (clients {describe_clients(r)})" for n, r in ranges.items())
    unreachable = [f"node {n}: {why}" for n, why in sorted(failed.items())]
    unreachable += [f"node {n}: no answer" for n in sorted(silent)]
    return (
        f"no node serves clients {describe_clients(missing)} after {job.start_deadline:g} s "
        f"(serving: {serving or 'none'}"
        + (f"; not answering: {'; '.join(unreachable)}" if unreachable else "")
        + f"); start a SuperNode with --clients {describe_clients(missing).split(',')[0]} "
        "(one per missing range), or wait longer with --start-deadline"
    )
