"""Runtimes deliver server messages to client groups and bring back the replies.

Every runtime counts communication the same way, from the messages themselves, in a
``CommunicationLedger``; the interaction loop ``run_federation`` is written once for all runtimes.

Client failures. A runtime that loses clients in a round (no reply before the round's deadline, an
error reply, or a reply it cannot trust) raises ``ClientFailure`` naming every lost client, with the
joined replies of the clients that did answer. ``run_federation`` then applies the run's policy:

- ``"abort"`` (default): stop; the result keeps what was done so far (the ledger up to the failed
  round, the regret records of the groups still reachable) with ``status == "aborted"``.
- ``"drop"``: the server and the runtime forget the lost clients for the rest of the run
  (``ServerLogic.drop_clients``, ``Runtime.drop``); the surviving replies of the failed round are
  aggregated; ``FederationResult.dropped`` records who was dropped in which round.

Either way the regret record covers the clients whose groups could still report at the end: the
server cannot know what a lost client did after it was lost.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from fedbandit.federation.messages import Message
from fedbandit.federation.protocol import ClientLogic, ServerLogic
from fedbandit.group_environment import RegretRecord

if TYPE_CHECKING:
    import pandas as pd

#: Values of ``on_client_failure``: what ``run_federation`` does when a round loses clients.
FAILURE_POLICIES = ("abort", "drop")


def describe_clients(client_ids: np.ndarray | Sequence[int]) -> str:
    """Client ids as sorted ranges for messages: ``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    ids = np.unique(np.asarray(client_ids, dtype=np.int64))
    if ids.size == 0:
        return "none"
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    runs = np.split(ids, breaks)
    return ", ".join(f"{r[0]}" if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


class ClientFailure(Exception):  # noqa: N818 - the name of the event, not of a bug
    """Clients were lost in a round: they did not answer in time, answered with an error, or sent a
    reply that was rejected (wrong clients, round, kind, shapes or dtypes, NaN or inf).

    - ``lost_clients``: sorted int64 ids of every lost client. A runtime loses a node or client
      group as a whole, so this may name clients of that group that were not addressed this round.
    - ``reasons``: what went wrong, by where (for example ``"node 42 (clients 3-5)"``).
    - ``partial``: the joined replies of the addressed clients that did answer (ordered by client
      id), or None when none did. Rejected replies are never part of it.
    - ``fatal``: the round cannot go on without the lost clients either (secure aggregation
      halted: too few nodes left to unmask the sum); the run stops whatever the policy.
    """

    def __init__(
        self,
        lost_clients: np.ndarray | Sequence[int],
        reasons: Mapping[str, str],
        partial: Message | None = None,
        fatal: bool = False,
    ) -> None:
        self.lost_clients = np.unique(np.asarray(lost_clients, dtype=np.int64))
        self.fatal = fatal
        if self.lost_clients.size == 0:
            raise ValueError("a client failure must name at least one lost client")
        self.reasons = dict(reasons)
        self.partial = partial
        super().__init__(self.describe())

    def describe(self) -> str:
        text = f"lost clients {describe_clients(self.lost_clients)}"
        if self.reasons:
            text += " (" + "; ".join(f"{where}: {why}" for where, why in self.reasons.items()) + ")"
        return text


@dataclass
class CommunicationLedger:
    """Per round and direction: messages (clients with a non-empty payload), scalars and bytes,
    and of those scalars the ``bookkeeping`` ones (fields named in ``bookkeeping_fields``: flags
    such as a sync trigger, ``ServerLogic.bookkeeping_fields``).

    ``t`` is the mean number of pulls per client done when the round's replies came back, over
    the clients that replied, and never below an earlier round's ``t``: the mean falls when
    clients that had pulled more are lost (``drop``), and a round nobody answered has no mean;
    either keeps the last value, so the column is non-decreasing by construction.
    Exchanges that carry nothing in either direction are not recorded. In a round that lost clients
    only what was exchanged is counted: the downlink to every addressed client (it was sent) and
    the uplink of the replies that arrived and were accepted (none when nobody answered: then the
    round has a downlink row only).

    With ``authors`` (a server that counts its authors' communication,
    ``ServerLogic.authors_comm_cost``) every row also has ``authors_comm_cost``: that count,
    cumulative, after the server aggregated the row's exchange (``count_authors``), so the last
    row holds the run's total. A count that grows in an exchange that left no row shows from the
    next row on (at the end of a run: on the last row).
    """

    rows: list[dict[str, float | int | str]] = field(default_factory=list)
    bookkeeping_fields: frozenset[str] = frozenset()
    #: The last round's ``t`` (NaN before any reply reported its pulls).
    last_t: float = float("nan")
    #: Whether rows carry the authors' cumulative count (``authors_comm_cost``).
    authors: bool = False
    #: The authors' count after the last aggregated exchange.
    authors_count: int = 0
    #: Where the rows of the last recorded exchange begin.
    exchange_start: int = 0

    def record(
        self,
        message: Message,
        direction: str,
        pulls_mean: float,
        tally: tuple[np.ndarray, int, int] | None = None,
    ) -> None:
        """One row for ``message``; ``tally`` is its ``Message.tally`` when already taken."""
        scalars, num_bytes, flags = tally or message.tally(self.bookkeeping_fields)
        self.rows.append(
            {
                "round": message.round,
                "kind": message.kind,
                "direction": direction,
                "t": pulls_mean,
                "messages": int(np.count_nonzero(scalars)),
                "scalars": int(scalars.sum()),
                "bytes": num_bytes,
                "bookkeeping_scalars": flags,
                **({"authors_comm_cost": self.authors_count} if self.authors else {}),
            }
        )

    def record_exchange(self, message: Message, reply: Message | None) -> None:
        """The round's downlink ``message`` and the ``reply`` received (None: nobody answered)."""
        pulls = reply.meta.get("pulls") if reply is not None else None
        if pulls is not None and len(pulls):
            mean = float(np.mean(pulls))
            self.last_t = mean if np.isnan(self.last_t) else max(self.last_t, mean)
        pulls_mean = self.last_t
        down = message.tally(self.bookkeeping_fields)
        up = reply.tally(self.bookkeeping_fields) if reply is not None else None
        self.exchange_start = len(self.rows)
        if down[0].any() or (up is not None and up[0].any()):
            self.record(message, "downlink", pulls_mean, down)
            if reply is not None:
                self.record(reply, "uplink", pulls_mean, up)

    def count_authors(self, count: int | None) -> None:
        """The server's authors' count (``ServerLogic.authors_comm_cost``) after it aggregated
        the last recorded exchange: the value of that exchange's rows and of later rows."""
        if not self.authors or count is None:
            return
        self.authors_count = int(count)
        for row in self.rows[self.exchange_start :]:
            row["authors_comm_cost"] = self.authors_count

    def frame(self) -> pd.DataFrame:
        import pandas as pd  # only where results are written: clients never need it

        columns = [
            "round",
            "kind",
            "direction",
            "t",
            "messages",
            "scalars",
            "bytes",
            "bookkeeping_scalars",
        ]
        if not self.authors:
            return pd.DataFrame(self.rows, columns=columns)
        frame = pd.DataFrame(self.rows, columns=[*columns, "authors_comm_cost"])
        if len(frame):  # a count grown in exchanges that left no row: on the last row
            frame.loc[frame.index[-1], "authors_comm_cost"] = self.authors_count
        return frame

    def totals(self) -> dict[str, int]:
        """Sums per direction; ``rounds``, the exchanges in which any message carried data;
        ``statistics_rounds``, those in which statistics travelled (a field that is not
        bookkeeping, in either direction); ``bookkeeping_rounds``, those that carried only
        bookkeeping flags (``rounds`` = ``statistics_rounds`` + ``bookkeeping_rounds``)."""
        out = {
            f"{direction}_{column}": sum(
                int(row[column]) for row in self.rows if row["direction"] == direction
            )
            for direction in ("uplink", "downlink")
            for column in ("messages", "scalars", "bytes", "bookkeeping_scalars")
        }
        rounds = {row["round"] for row in self.rows if int(row["messages"]) > 0}
        statistics = {
            row["round"]
            for row in self.rows
            if int(row["scalars"]) > int(row["bookkeeping_scalars"])
        }
        out["rounds"] = len(rounds)
        out["statistics_rounds"] = len(statistics)
        out["bookkeeping_rounds"] = len(rounds - statistics)
        return out


class Runtime(ABC):
    """Delivers one round's message to the client groups and returns their joined replies."""

    @abstractmethod
    def exchange(self, message: Message) -> Message:
        """Deliver ``message`` (addressed to some clients) and return the replies, by client id.

        Raises ``ClientFailure`` when clients are lost (runtimes that can lose clients)."""

    @abstractmethod
    def regret_records(self) -> list[RegretRecord]:
        """The regret record of each client group still reachable (never of lost or dropped ones),
        after the run. May raise ``ClientFailure`` for groups lost while asked: those are then
        excluded from the next call."""

    def drop(self, client_ids: np.ndarray) -> None:
        """Stop serving ``client_ids`` for the rest of the run (``on_client_failure="drop"``)."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot drop clients, so it does not support "
            "on_client_failure='drop'"
        )

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (processes, connections)."""


class InProcessRuntime(Runtime):
    """All client groups in this process: messages are handed over as arrays (no copies).

    Nothing is lost in-process; ``drop`` still works (a group is dropped as a whole) so that a
    wrapper can inject failures."""

    def __init__(self, groups: Sequence[ClientLogic]) -> None:
        if not groups:
            raise ValueError("at least one client group is needed")
        self.groups = list(groups)
        ids = np.concatenate([g.client_ids for g in self.groups])
        if len(np.unique(ids)) != len(ids):
            raise ValueError("client groups overlap: every logical client must be in one group")
        self._group_of = np.full(int(ids.max()) + 1, -1, dtype=np.int64)
        for index, group in enumerate(self.groups):
            self._group_of[group.client_ids] = index
        self.dropped_groups: set[int] = set()

    def parts(self, message: Message) -> list[tuple[int, ClientLogic, Message]]:
        """(group index, group, its part of ``message``) for every group ``message`` addresses."""
        if message.client_ids.max(initial=0) >= len(self._group_of) or np.any(
            self._group_of[message.client_ids] < 0
        ):
            raise ValueError(
                f"round {message.round} addresses clients no group serves (or dropped ones)"
            )
        group_of = self._group_of[message.client_ids]
        out = []
        for gi, group in enumerate(self.groups):
            positions = np.flatnonzero(group_of == gi)
            if len(positions) == 0:
                continue
            if positions[-1] - positions[0] + 1 == len(positions):
                part = message.select(slice(positions[0], positions[-1] + 1))
            else:
                part = message.select(positions)
            out.append((gi, group, part))
        return out

    def exchange(self, message: Message) -> Message:
        return Message.concatenate([group.handle(part) for _, group, part in self.parts(message)])

    def drop(self, client_ids: np.ndarray) -> None:
        ids = np.unique(np.asarray(client_ids, dtype=np.int64))
        known = (ids >= 0) & (ids < len(self._group_of))
        known[known] = self._group_of[ids[known]] >= 0
        if not known.all():
            raise ValueError(f"cannot drop clients {describe_clients(ids[~known])}: not served")
        indices = np.unique(self._group_of[ids])
        for gi in indices:
            group_ids = self.groups[gi].client_ids
            if not np.isin(group_ids, ids).all():
                raise ValueError(
                    f"a client group is dropped as a whole: the group of clients "
                    f"{describe_clients(group_ids)} cannot drop only {describe_clients(ids)}"
                )
        self._group_of[ids] = -1
        self.dropped_groups.update(int(gi) for gi in indices)

    def regret_records(self) -> list[RegretRecord]:
        return [
            g.regret_record() for gi, g in enumerate(self.groups) if gi not in self.dropped_groups
        ]


@dataclass(frozen=True)
class FederationResult:
    """The outcome of ``run_federation``.

    - ``status``: ``"complete"`` (the server ended the run) or ``"aborted"`` (clients were lost
      under ``on_client_failure="abort"``, or no client was left): the regret record then covers
      the reachable clients up to the abort (their ``client_pulls`` say how far each got).
    - ``failure``: human text naming every lost client and why, per round; None if none was lost.
    - ``dropped``: client id -> the round in which it was dropped (``on_client_failure="drop"``);
      those clients are not in ``regret``.
    - ``report``: the server's ``ServerLogic.report()`` at the end of the run.
    """

    regret: RegretRecord
    ledger: CommunicationLedger
    status: str = "complete"
    failure: str | None = None
    dropped: dict[int, int] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return self.status == "complete"


def _check_failure_support(server: ServerLogic, runtime: Runtime) -> None:
    """Under "drop", refuse before the run a server or runtime that cannot drop clients."""
    if type(server).drop_clients is ServerLogic.drop_clients:
        raise NotImplementedError(
            f"{type(server).__name__} cannot drop clients, so on_client_failure='drop' is not "
            "available for this algorithm; use on_client_failure='abort'"
        )
    if type(runtime).drop is Runtime.drop:
        raise NotImplementedError(
            f"{type(runtime).__name__} cannot drop clients, so on_client_failure='drop' is not "
            "available on this runtime; use on_client_failure='abort'"
        )


def _surviving_reply(message: Message, failure: ClientFailure) -> Message | None:
    """The failure's partial reply restricted to the addressed clients that were not lost; None
    when none of them answered. A runtime that leaves a surviving client unanswered is a bug."""
    surviving = message.client_ids[~np.isin(message.client_ids, failure.lost_clients)]
    partial = failure.partial
    if partial is not None:
        if partial.round != message.round:
            raise RuntimeError(
                f"round {message.round}: the runtime's partial replies are for round "
                f"{partial.round}"
            )
        kept = np.flatnonzero(~np.isin(partial.client_ids, failure.lost_clients))
        partial = partial.select(kept) if len(kept) < partial.num_clients else partial
    if partial is None or partial.num_clients == 0:
        if len(surviving):
            raise RuntimeError(
                f"round {message.round}: the runtime lost clients "
                f"{describe_clients(failure.lost_clients)} but returned no replies of the "
                f"surviving clients {describe_clients(surviving)}"
            )
        return None
    if not np.array_equal(partial.client_ids, surviving):
        raise RuntimeError(
            f"round {message.round}: the partial replies came from clients "
            f"{describe_clients(partial.client_ids)}, not from the surviving addressed clients "
            f"{describe_clients(surviving)}"
        )
    return partial


def run_federation(
    server: ServerLogic, runtime: Runtime, on_client_failure: str = "abort"
) -> FederationResult:
    """The interaction loop: configure, deliver, aggregate, until the server is done.

    ``on_client_failure`` says what a round that loses clients (``ClientFailure``) does:
    ``"abort"`` (and any ``fatal`` failure) stops the run and returns the results so far with
    ``status="aborted"``; ``"drop"``
    calls ``server.drop_clients`` and ``runtime.drop`` with the lost clients, aggregates the
    surviving replies of the round and goes on. When no addressed client answered, nothing is
    aggregated: the server configures its next round without the lost clients (the built-in servers
    address every remaining client, so this happens only when none is left, and they then end the
    run). A run that ends with no client left to report its regret has ``status="aborted"`` and an
    empty regret record.
    """
    if on_client_failure not in FAILURE_POLICIES:
        allowed = ", ".join(repr(p) for p in FAILURE_POLICIES)
        raise ValueError(f"on_client_failure must be one of {allowed}, got {on_client_failure!r}")
    if on_client_failure == "drop":
        _check_failure_support(server, runtime)
    authors = server.authors_comm_cost()
    ledger = CommunicationLedger(
        bookkeeping_fields=server.bookkeeping_fields(),
        authors=authors is not None,
        authors_count=authors or 0,
    )
    failures: list[str] = []
    dropped: dict[int, int] = {}
    status, next_round = "complete", 0
    while (message := server.configure()) is not None:
        next_round = message.round + 1
        try:
            answered = runtime.exchange(message)
        except ClientFailure as failure:
            survivors = _surviving_reply(message, failure)
            ledger.record_exchange(message, survivors)
            failures.append(f"round {message.round}: {failure}")
            if on_client_failure == "abort" or failure.fatal:
                status = "aborted"
                break
            server.drop_clients(failure.lost_clients)
            runtime.drop(failure.lost_clients)
            dropped.update(dict.fromkeys(failure.lost_clients.tolist(), message.round))
            if survivors is not None:
                server.aggregate(survivors)
                ledger.count_authors(server.authors_comm_cost())
            continue
        if not np.array_equal(answered.client_ids, message.client_ids):
            raise RuntimeError(
                f"round {message.round}: replies came from clients other than those addressed"
            )
        ledger.record_exchange(message, answered)
        server.aggregate(answered)
        ledger.count_authors(server.authors_comm_cost())
    records: list[RegretRecord] = []
    lost_at_end: set[int] = set()
    while True:
        try:
            records = runtime.regret_records()
            break
        except ClientFailure as failure:
            lost = set(failure.lost_clients.tolist())
            if lost <= lost_at_end:
                raise RuntimeError(
                    f"{type(runtime).__name__} keeps failing to report regret: {failure}"
                ) from failure
            lost_at_end |= lost
            failures.append(f"regret records: {failure}")
            if on_client_failure == "abort":
                status = "aborted"
            else:
                runtime.drop(failure.lost_clients)
                dropped.update(dict.fromkeys(sorted(lost), next_round))
    if records:
        regret = RegretRecord.merge(records)
    else:
        failures.append("no client is left to report its regret")
        status, regret = "aborted", RegretRecord.empty()
    return FederationResult(
        regret, ledger, status, "; ".join(failures) or None, dropped, server.report()
    )
