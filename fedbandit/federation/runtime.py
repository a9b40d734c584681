"""Runtimes deliver server messages to client groups and bring back the replies.

Every runtime counts communication the same way, from the messages themselves, in a
``CommunicationLedger``; the interaction loop ``run_federation`` is written once for all runtimes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from fedbandit.environment import RegretRecord
from fedbandit.federation.messages import Message
from fedbandit.federation.protocol import ClientLogic, ServerLogic

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class CommunicationLedger:
    """Per round and direction: messages (clients with a non-empty payload), scalars and bytes.

    ``t`` is the mean number of pulls per client done when the round's replies came back.
    Exchanges that carry nothing in either direction are not recorded.
    """

    rows: list[dict[str, float | int | str]] = field(default_factory=list)

    def record(self, message: Message, direction: str, pulls_mean: float) -> None:
        scalars = message.scalars_per_client()
        num_bytes = message.bytes_per_client()
        self.rows.append(
            {
                "round": message.round,
                "kind": message.kind,
                "direction": direction,
                "t": pulls_mean,
                "messages": int(np.count_nonzero(scalars)),
                "scalars": int(scalars.sum()),
                "bytes": int(num_bytes.sum()),
            }
        )

    def frame(self) -> pd.DataFrame:
        import pandas as pd  # only where results are written: clients never need it

        columns = ["round", "kind", "direction", "t", "messages", "scalars", "bytes"]
        return pd.DataFrame(self.rows, columns=columns)

    def totals(self) -> dict[str, int]:
        """Sums per direction, and the number of rounds in which any message carried data."""
        out = {
            f"{direction}_{column}": sum(
                int(row[column]) for row in self.rows if row["direction"] == direction
            )
            for direction in ("uplink", "downlink")
            for column in ("messages", "scalars", "bytes")
        }
        out["rounds"] = len({row["round"] for row in self.rows if int(row["messages"]) > 0})
        return out


class Runtime(ABC):
    """Delivers one round's message to the client groups and returns their joined replies."""

    @abstractmethod
    def exchange(self, message: Message) -> Message:
        """Deliver ``message`` (addressed to some clients) and return the replies, by client id."""

    @abstractmethod
    def regret_records(self) -> list[RegretRecord]:
        """Each client group's regret record, after the run."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (processes, connections)."""


class InProcessRuntime(Runtime):
    """All client groups in this process: messages are handed over as arrays (no copies)."""

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

    def exchange(self, message: Message) -> Message:
        if message.client_ids.max(initial=0) >= len(self._group_of) or np.any(
            self._group_of[message.client_ids] < 0
        ):
            raise ValueError(f"round {message.round} addresses clients no group serves")
        group_of = self._group_of[message.client_ids]
        replies = []
        for gi, group in enumerate(self.groups):
            positions = np.flatnonzero(group_of == gi)
            if len(positions) == 0:
                continue
            if positions[-1] - positions[0] + 1 == len(positions):
                part = message.select(slice(positions[0], positions[-1] + 1))
            else:
                part = message.select(positions)
            replies.append(group.handle(part))
        return Message.concatenate(replies)

    def regret_records(self) -> list[RegretRecord]:
        return [g.regret_record() for g in self.groups]


@dataclass(frozen=True)
class FederationResult:
    regret: RegretRecord
    ledger: CommunicationLedger


def run_federation(server: ServerLogic, runtime: Runtime) -> FederationResult:
    """The interaction loop: configure, deliver, aggregate, until the server is done."""
    ledger = CommunicationLedger()
    while (message := server.configure()) is not None:
        reply = runtime.exchange(message)
        if not np.array_equal(reply.client_ids, message.client_ids):
            raise RuntimeError(
                f"round {message.round}: replies came from clients other than those addressed"
            )
        pulls = reply.meta.get("pulls")
        pulls_mean = float(np.mean(pulls)) if pulls is not None else float("nan")
        if message.scalars_per_client().any() or reply.scalars_per_client().any():
            ledger.record(message, "downlink", pulls_mean)
            ledger.record(reply, "uplink", pulls_mean)
        server.aggregate(reply)
    records = runtime.regret_records()
    return FederationResult(RegretRecord.merge(records), ledger)
