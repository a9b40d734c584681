"""Run-ahead: one delivered message carries many logical exchanges, with identical results.

Protocols such as DisLinUCB, Async-LinUCB and FedLinUCB exchange a message at every time step,
yet most steps change nothing on the server: a client that does not trigger sends nothing that
matters and the server's next message is an empty round. Over a network each exchange costs a
round trip, so a runtime may let each client group *run ahead*:

1. The runtime delivers the server's message with a step budget B. The group handles it and,
   while its reply is quiet (``ClientLogic.quiet``: the server will certainly send the empty
   round next) and the horizon allows (``ClientLogic.steps_left``), handles the empty rounds
   ``Message("round", r + 1, ids, {})``, ``r + 2``, ... itself, up to B exchanges in all. It
   returns every reply and remembers its state after the first exchange (``Ahead``).
2. Groups stop at different exchanges; the first s exchanges, s the shortest group's count, are
   valid for everyone (no group's event came earlier). ``ReplyBuffer`` joins the groups' replies
   of those exchanges and hands them to the server one logical exchange at a time, each only if
   the server's message is exactly the empty round the groups assumed; otherwise (or once they
   are used up) the next message goes out for real.
3. With that next message each group learns how many of its exchanges were used
   (``consumed``); a group that ran further restores its state after its first exchange and
   replays the used empty rounds (``rewind``). Its streams are part of its state, so the replay
   draws the same contexts and rewards.

The server's loop (``run_federation``) sees every logical exchange, in order, with the same
messages and replies as when every step travels: regret, communication records and totals are
bit-identical. ``quiet`` is only a hint: a wrong ``True`` costs a rewind, never a wrong result.
``RunAheadRuntime`` does this in-process (it exists to test the mechanism); the Flower runtimes
do it over the network (``fedbandit.flower.grid_runtime``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedbandit.federation.messages import Message
from fedbandit.federation.protocol import ClientLogic
from fedbandit.federation.runtime import InProcessRuntime
from fedbandit.group_environment import RegretRecord

__all__ = ["Ahead", "ReplyBuffer", "RunAheadRuntime", "empty_round", "rewind", "run_ahead"]


def empty_round(after: Message) -> Message:
    """The server's message after a quiet reply to ``after``: an empty round for the same
    clients."""
    return Message("round", after.round + 1, after.client_ids, {})


@dataclass
class Ahead:
    """What a group remembers of its last delivered message: its state after the first exchange
    (None when it did not run ahead), that exchange's message, and how many exchanges it ran."""

    base: dict[str, np.ndarray] | None
    first: Message
    ran: int


def run_ahead(
    logic: ClientLogic, message: Message, budget: int, stop_before_upload: bool = False
) -> tuple[list[Message], Ahead]:
    """Handle ``message``, then empty rounds while the replies are quiet, up to ``budget``
    exchanges in all and within the horizon; every reply, and what ``rewind`` needs. With
    ``stop_before_upload`` (secure aggregation) it stops before a step whose reply would be
    summed (``ClientLogic.uploads_next``)."""
    replies = [logic.handle(message)]
    base = None
    current = message
    while (
        len(replies) < budget
        and logic.quiet(replies[-1])
        and logic.steps_left() > 0
        and not (stop_before_upload and logic.uploads_next())
    ):
        if base is None:
            base = {key: np.array(value, copy=True) for key, value in logic.state_dict().items()}
        current = empty_round(current)
        replies.append(logic.handle(current))
    return replies, Ahead(base, message, len(replies))


def rewind(logic: ClientLogic, ahead: Ahead | None, consumed: int) -> None:
    """Bring a group that ran ``ahead.ran`` exchanges back to the state after the first
    ``consumed`` of them (restore the state after the first, replay the empty rounds)."""
    if ahead is None or consumed >= ahead.ran:
        return
    if consumed < 1 or ahead.base is None:
        raise ValueError(f"cannot rewind to {consumed} of {ahead.ran} exchanges")
    logic.load_state_dict(ahead.base)
    current = ahead.first
    for _ in range(consumed - 1):
        current = empty_round(current)
        logic.handle(current)


class ReplyBuffer:
    """The server side: the joined replies of the exchanges every group ran, handed out one
    logical exchange at a time (``take``), and how many were used (``consumed``)."""

    def __init__(self) -> None:
        self._expected: list[Message] = []  # the empty rounds the groups assumed, in order
        self._replies: list[Message] = []
        #: Exchanges used of the last delivered message (1 once it is delivered).
        self.consumed = 0
        #: Messages actually delivered (physical rounds) and logical exchanges served.
        self.delivered = 0
        self.served = 0

    def take(self, message: Message) -> Message | None:
        """The stored reply for ``message`` if it is the empty round the groups assumed next;
        else None (and what is stored is dropped: the message must be delivered)."""
        if self._replies:
            expected = self._expected[0]
            if (
                message.kind == expected.kind
                and message.round == expected.round
                and not message.fields
                and np.array_equal(message.client_ids, expected.client_ids)
            ):
                self._expected.pop(0)
                self.consumed += 1
                self.served += 1
                return self._replies.pop(0)
        self._expected, self._replies = [], []
        return None

    def delivered_alone(self) -> None:
        """A message was delivered with no run-ahead (a secure exchange): nothing is stored."""
        self._expected, self._replies = [], []
        self.consumed = 1
        self.delivered += 1
        self.served += 1

    def store(self, message: Message, replies: Sequence[Sequence[Message]]) -> Message:
        """Keep the joined replies of the exchanges every group ran after delivering
        ``message`` (``replies``: per group, in client order, its replies in exchange order);
        returns the joined reply to ``message`` itself."""
        steps = min(len(group) for group in replies)
        joined = [Message.concatenate([group[k] for group in replies]) for k in range(steps)]
        self._expected = []
        current = message
        for _ in range(1, steps):
            current = empty_round(current)
            self._expected.append(current)
        self._replies = joined[1:]
        self.consumed = 1
        self.delivered += 1
        self.served += 1
        return joined[0]


class RunAheadRuntime(InProcessRuntime):
    """``InProcessRuntime`` that lets the groups run ahead up to ``steps_per_round`` exchanges
    per delivered message: the network runtimes' mechanism, in-process, where its results can be
    compared with the plain runtime's. ``buffer.delivered`` counts the messages delivered."""

    def __init__(self, groups: Sequence[ClientLogic], steps_per_round: int) -> None:
        super().__init__(groups)
        if steps_per_round < 1:
            raise ValueError(f"steps_per_round must be >= 1, got {steps_per_round}")
        self.steps_per_round = steps_per_round
        self.buffer = ReplyBuffer()
        self._ahead: dict[int, Ahead] = {}

    def exchange(self, message: Message) -> Message:
        stored = self.buffer.take(message)
        if stored is not None:
            return stored
        self._rewind_all()
        replies = []
        for gi, group, part in self.parts(message):
            group_replies, self._ahead[gi] = run_ahead(group, part, self.steps_per_round)
            replies.append(group_replies)
        return self.buffer.store(message, replies)

    def _rewind_all(self) -> None:
        for gi, ahead in self._ahead.items():
            rewind(self.groups[gi], ahead, self.buffer.consumed)
        self._ahead = {}

    def regret_records(self) -> list[RegretRecord]:
        self._rewind_all()
        return super().regret_records()
