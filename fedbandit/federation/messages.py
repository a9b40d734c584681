"""Plain typed messages: NumPy arrays with a leading client axis, and their schemas.

A ``Message`` is a batch of logical messages, one per addressed client: every field has shape
``(n_clients, ...)``. A field may be *sparse along the arm axis*: then only the entries where the
named boolean mask field is True are transmitted (for example, Fed-PE broadcasts theta_a only to
the clients still holding arm a). Communication is counted from this description alone, so every
runtime (in-process or Flower) counts the same: scalars are array entries, bytes are
``scalars * itemsize`` of the payload (framing excluded).

Fields that hold the same value for every client may be ``np.broadcast_to`` views: no copy is made
in-process, and they still count once per receiving client, as on a real network.

A reply that came through secure aggregation holds, for each field named in ``summed``, only its
sum over the clients, with a leading axis of 1: a server reads such a field with ``.sum(axis=0)``
(which gives the same array for a plaintext reply). It is counted as if every client had sent its
own value, so communication is the same with and without secure aggregation.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Message:
    """A batch of messages of one ``kind`` for ``round``, one per client in ``client_ids``.

    ``meta`` is a measurement side channel (for example pulls done so far): it is never read by the
    algorithm and is not counted as communication. ``known`` names fields the receiver already
    holds or can derive (such as its own active set, used as a sparsity mask): they travel with the
    message in-process for convenience but are not counted. ``summed`` names fields that hold only
    their sum over the clients (leading axis 1; see the module).
    """

    kind: str
    round: int
    client_ids: np.ndarray
    fields: Mapping[str, np.ndarray]
    sparse: Mapping[str, str] = field(default_factory=dict)
    known: frozenset[str] = frozenset()
    meta: Mapping[str, np.ndarray] = field(default_factory=dict)
    summed: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        n = len(self.client_ids)
        if unknown := self.summed - set(self.fields):
            raise ValueError(f"summed fields {sorted(unknown)} are not fields of {self.kind!r}")
        for name, value in {**self.fields, **self.meta}.items():
            if name in self.summed and name in self.fields:
                if value.shape[:1] != (1,):
                    raise ValueError(
                        f"summed field {name!r} of message {self.kind!r} has leading axis "
                        f"{value.shape[:1]}, expected (1,): one sum over the clients"
                    )
                continue
            if value.shape[:1] != (n,):
                raise ValueError(
                    f"field {name!r} of message {self.kind!r} has leading axis "
                    f"{value.shape[:1]}, expected ({n},) clients"
                )
        for name, mask in self.sparse.items():
            if name not in self.fields or mask not in self.fields:
                raise ValueError(f"sparse field {name!r} or its mask {mask!r} is missing")

    @property
    def num_clients(self) -> int:
        return len(self.client_ids)

    def scalars_per_client(self, only: frozenset[str] | None = None) -> np.ndarray:
        """Transmitted scalars for each addressed client, shape (n,); of the fields named in
        ``only`` alone when it is given."""
        total = np.zeros(self.num_clients, dtype=np.int64)
        for name, _, entries in self._transmitted():
            if only is None or name in only:
                total += entries
        return total

    def bytes_per_client(self) -> np.ndarray:
        total = np.zeros(self.num_clients, dtype=np.int64)
        for _, value, entries in self._transmitted():
            total += entries * value.dtype.itemsize
        return total

    def tally(self, only: frozenset[str] = frozenset()) -> tuple[np.ndarray, int, int]:
        """(transmitted scalars per client, total bytes, total scalars of the fields named in
        ``only``) in one pass over the fields: what a ledger row needs."""
        scalars = np.zeros(self.num_clients, dtype=np.int64)
        num_bytes = flagged = 0
        for name, value, entries in self._transmitted():
            scalars += entries
            total = int(entries.sum())
            num_bytes += total * value.dtype.itemsize
            if name in only:
                flagged += total
        return scalars, num_bytes, flagged

    def _transmitted(self) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
        """(name, value, scalars sent per client) of every field not already ``known``."""
        for name, value in self.fields.items():
            if name not in self.known:
                yield name, value, self._entries(name, value)

    def _entries(self, name: str, value: np.ndarray) -> np.ndarray:
        mask_name = self.sparse.get(name)
        if mask_name is None:  # dense (a summed field too: each client sent one of its shape)
            return np.full(self.num_clients, int(np.prod(value.shape[1:])), dtype=np.int64)
        mask = self.fields[mask_name]
        return mask.reshape(self.num_clients, -1).sum(axis=1) * int(np.prod(value.shape[2:]))

    def select(self, positions: np.ndarray | slice) -> Message:
        """The sub-batch for the clients at ``positions`` (a slice keeps views); a message with
        summed fields cannot be split."""
        if self.summed:
            raise ValueError(f"cannot select clients of a message with summed fields {self.summed}")
        return Message(
            kind=self.kind,
            round=self.round,
            client_ids=self.client_ids[positions],
            fields={k: v[positions] for k, v in self.fields.items()},
            sparse=dict(self.sparse),
            known=self.known,
            meta={k: v[positions] for k, v in self.meta.items()},
        )

    @staticmethod
    def concatenate(parts: Sequence[Message]) -> Message:
        """Join replies from several client groups, ordered by client id."""
        if not parts:
            raise ValueError("nothing to concatenate")
        first = parts[0]
        for part in parts[1:]:
            if (part.kind, part.round) != (first.kind, first.round):
                raise ValueError(
                    f"cannot join {part.kind!r} round {part.round} with "
                    f"{first.kind!r} round {first.round}"
                )
            if set(part.fields) != set(first.fields):
                raise ValueError(f"replies of kind {first.kind!r} carry different fields")
        if any(part.summed for part in parts):
            raise ValueError("cannot join messages with summed fields")
        if len(parts) == 1 and np.all(first.client_ids[1:] > first.client_ids[:-1]):
            return first  # one group's reply, already ordered by client id: nothing to join
        ids = np.concatenate([p.client_ids for p in parts])
        order = np.argsort(ids, kind="stable")

        def join(key: str, attr: str) -> np.ndarray:
            return np.concatenate([getattr(p, attr)[key] for p in parts])[order]

        return Message(
            kind=first.kind,
            round=first.round,
            client_ids=ids[order],
            fields={k: join(k, "fields") for k in first.fields},
            sparse=dict(first.sparse),
            known=first.known,
            meta={k: join(k, "meta") for k in first.meta},
        )


def broadcast(value: np.ndarray, num_clients: int) -> np.ndarray:
    """The same array for every client, as a read-only view with a leading client axis."""
    value = np.asarray(value)
    return np.broadcast_to(value, (num_clients, *value.shape))
