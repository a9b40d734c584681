"""The two halves of a federated algorithm.

A ``ServerLogic`` decides what to send each round and aggregates the replies; a ``ClientLogic``
serves one *client group* (any number of logical clients held as arrays with a leading client
axis) and answers each message. Neither knows how messages travel: a runtime delivers them. The
algorithm code imports no network library and never reaches into the other side's memory.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedbandit.federation.messages import Message
from fedbandit.group_environment import GroupEnvironment, RegretRecord
from fedbandit.state import collect, restore, strip_prefix, with_prefix


class ServerLogic(ABC):
    """Server hooks: ``configure`` the next round (None ends the run), ``aggregate`` the replies."""

    @abstractmethod
    def configure(self) -> Message | None:
        """The message for every participating client this round, or None when the run is over."""

    @abstractmethod
    def aggregate(self, reply: Message) -> None:
        """Take the replies of the round just configured, ordered by client id."""

    def secure_sums(self) -> Mapping[str, frozenset[str]]:
        """The reply fields this server only ever sums over clients, by the kind of the message
        that asks for them: for example ``{"collect": frozenset({"gram_delta",
        "target_delta"})}``. With secure aggregation (``RuntimeOptions.secure_aggregation``) the
        replies to such a message travel through SecAgg+, and ``aggregate`` receives each named
        field as its sum over the clients that answered (``Message.summed``: leading axis 1), so
        it must read them with ``.sum(axis=0)`` only; every other field arrives per client, in
        the clear. Empty (the default): the server needs each client's values, and a run with
        secure aggregation is refused."""
        return {}

    def secure_fields(self, message: Message) -> frozenset[str]:
        """The fields of the replies to ``message`` (about to be sent) that travel as sums under
        secure aggregation: by default ``secure_sums()`` of its kind. A server overrides it when
        only some messages of a kind can be summed (Fed-PE's phase 0 reports stay per client)."""
        return self.secure_sums().get(message.kind, frozenset())

    def secure_contributors(self, message: Message) -> Mapping[str, np.ndarray] | None:
        """Which clients' data fill each block of each summed field (``secure_fields``) of the
        replies to ``message``, when the message itself settles it: per field a (clients, blocks)
        bool array, True where the client's values enter the block (a block is the index after
        the client axis; a field of one value per client is one block). Secure aggregation then
        takes each sum's contributors from it instead of counting them in a masked exchange
        first (half the round trips), and every node refuses to send a value outside it. None
        (the default): the contributors are counted."""
        return None

    def secure_follows(self, message: Message) -> bool:
        """Whether a later exchange of this run, the next one or one after plain ones, sums
        fields under secure aggregation: a deployment then sets up that exchange's SecAgg+ keys
        while ``message`` (about to be sent) and the exchanges up to it run. False (the
        default): they are set up in line."""
        return False

    def bookkeeping_fields(self) -> frozenset[str]:
        """The fields of this protocol's messages, in either direction, that are bookkeeping:
        flags that steer the protocol (a client's sync trigger, the server's collect request,
        ``authors_code``'s joined flag) and carry no statistics. They are counted as
        communication like any field (messages, scalars, bytes, rounds), and the ledger also
        reports them apart: an exchange that carried only bookkeeping is not a statistics round
        (``CommunicationLedger.totals``), so protocols that send the same statistics with more or
        fewer flags compare on what they send. Empty by default: every field is statistics."""
        return frozenset()

    def report(self) -> dict[str, Any]:
        """What the algorithm measured about its own run, as JSON-ready values, for the seed's
        JSON (``"report"``): for example a private algorithm's privacy accounting and how many
        values its clients clipped. Called once, after the last round; empty by default."""
        return {}

    def authors_comm_cost(self) -> int | None:
        """The communication of the run so far counted as the algorithm's authors count it in
        their code (their ``totalCommCost``, in their units), or None (the default) when their
        code counts none. ``run_federation`` asks after every ``aggregate`` and writes the
        cumulative count beside each row of the communication record (the ``authors_comm_cost``
        column of ``seed_K.comm.csv``); ``report`` should give its final value."""
        return None

    def drop_clients(self, client_ids: np.ndarray) -> None:
        """Stop addressing ``client_ids`` for the rest of the run (``on_client_failure="drop"``).

        ``run_federation`` calls it after a round in which these clients were lost and before it
        aggregates the surviving replies of that round (so ``aggregate`` then sees exactly the
        clients still addressed). When no addressed client answered, ``aggregate`` is not called
        for that round: the server must be ready to configure its next round without the lost
        clients, or end the run (``configure`` returns None) when no client is left.
        """
        raise NotImplementedError(
            f"{type(self).__name__} cannot drop clients, so on_client_failure='drop' is not "
            "available for this algorithm; use on_client_failure='abort'"
        )


def remove_clients(current: np.ndarray, client_ids: np.ndarray, owner: str) -> np.ndarray:
    """``current`` without ``client_ids`` (sorted); every id must be a current client."""
    ids = np.unique(np.asarray(client_ids, dtype=np.int64))
    unknown = np.setdiff1d(ids, current)
    if unknown.size:
        raise ValueError(
            f"{owner} cannot drop clients {unknown.tolist()}: it does not address them"
        )
    return np.setdiff1d(current, ids)


class ClientLogic(ABC):
    """Client hooks for one group of logical clients that share an environment.

    ``STATE`` lists the attributes (dotted paths allowed) that change between messages: with the
    environment's own state they let a fresh process rebuild the group (``load_state_dict``), as a
    Flower deployment must for every message.
    """

    STATE: tuple[str, ...] = ()

    def __init__(self, env: GroupEnvironment) -> None:
        self.env = env

    @property
    def client_ids(self):
        return self.env.client_ids

    @abstractmethod
    def handle(self, message: Message) -> Message:
        """Answer a message addressed to (a subset of) this group's clients."""

    def state_dict(self) -> dict[str, np.ndarray]:
        """The group's state (environment and algorithm) as NumPy arrays, no objects."""
        return {
            **with_prefix("env.", self.env.state_dict()),
            **with_prefix("logic.", collect(self, self.STATE)),
        }

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Continue exactly where the group whose ``state_dict`` this is left off."""
        self.env.load_state_dict(strip_prefix("env.", state))
        restore(self, self.STATE, strip_prefix("logic.", state))

    def summable(self, reply: Message, summed: frozenset[str]) -> Message:
        """``reply`` in the form whose ``summed`` fields the server adds up under secure
        aggregation (the runtime then sums them over the node's clients and masks them). By
        default the reply itself; an algorithm whose plain reply carries per-client values that
        the server combines with its own weights returns those weighted terms instead (Fed-PE:
        sum over its arms of n theta_hat), which its server knows how to aggregate."""
        return reply

    def regret_record(self) -> RegretRecord:
        """The environment's record of the true regret (a measurement, not communication)."""
        return self.env.record()

    def quiet(self, reply: Message) -> bool:
        """True when the server, given ``reply`` (this group's answer to a round), certainly does
        nothing but configure the next step as an empty round,
        ``Message("round", reply.round + 1, ids, {})``, as long as every other group's reply is
        quiet too. A runtime may then let the group run ahead on such empty rounds without asking
        the server (``fedbandit.federation.run_ahead``), and the results stay identical.
        Default: never (every reply goes to the server before the group acts again)."""
        return False

    def uploads_next(self) -> bool:
        """True when this group's reply to the next message will carry values that a secure run
        sums (its next upload). Under secure aggregation a group running ahead stops before
        such a step, so that its reply travels through SecAgg+ and not in the clear with the
        run-ahead replies. Default False: override it in a protocol whose summed replies can
        follow quiet ones (batched FedLinUCB's uploads at the end of each batch)."""
        return False

    def steps_left(self) -> int:
        """How many more empty rounds the server may still send (its horizon); consulted only
        after a quiet reply."""
        return 0
