"""What the environment of every client group shares, and the regret record it reports.

``GroupEnvironment`` holds a group's clients, their random streams (one per logical client,
``fedbandit.rng``), the regret bookkeeping and its state as arrays; ``RegretRecord`` is the true
regret a group reports at the end of a run. The concrete environments build on it:
``fedbandit.environment.BanditEnvironment`` (fixed features) and
``fedbandit.contextual.environment.ContextualEnvironment`` (fresh contexts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedbandit.rng import REWARD_DOMAIN, client_generators
from fedbandit.state import (
    collect,
    generators_from_arrays,
    generators_to_arrays,
    restore,
    strip_prefix,
    with_prefix,
)


@dataclass(frozen=True)
class RegretRecord:
    """What a client group reports at the end of a run.

    ``increment_diff[t]``: difference array of the summed per-step regret over the group's clients
    (per-step regret sum at step t is ``cumsum(increment_diff)[t]``, steps 0..T-1).

    A record may cover any subset of a run's clients: after a run that lost clients (see
    ``fedbandit.federation.runtime``) it covers the surviving ones only, and every average is over
    ``client_ids``, never over the instance's M.
    """

    client_ids: np.ndarray
    increment_diff: np.ndarray
    client_regret: np.ndarray
    client_pulls: np.ndarray
    scale: float

    @staticmethod
    def empty() -> RegretRecord:
        """The record of no client (a run that lost every client): an empty curve."""
        return RegretRecord(
            client_ids=np.empty(0, dtype=np.int64),
            increment_diff=np.zeros(1),
            client_regret=np.empty(0),
            client_pulls=np.empty(0, dtype=np.int64),
            scale=1.0,
        )

    @staticmethod
    def merge(records: Sequence[RegretRecord]) -> RegretRecord:
        """One record of the clients of ``records`` (any subset of a run's client groups)."""
        if not records:
            raise ValueError("no regret records to merge")
        order = np.argsort(np.concatenate([r.client_ids for r in records]), kind="stable")
        if len({r.scale for r in records}) != 1:
            raise ValueError("regret records of one run must share the fixed-point scale")
        if len({r.increment_diff.shape for r in records}) != 1:
            raise ValueError("regret records of one run must share the horizon")
        return RegretRecord(
            client_ids=np.concatenate([r.client_ids for r in records])[order],
            increment_diff=np.sum([r.increment_diff for r in records], axis=0),
            client_regret=np.concatenate([r.client_regret for r in records])[order],
            client_pulls=np.concatenate([r.client_pulls for r in records])[order],
            scale=records[0].scale,
        )

    def mean_cumulative_regret(self) -> np.ndarray:
        """R(t)/M for t = 1..T: per-client average cumulative regret, shape (T,), with M the number
        of clients in this record (all NaN for a record of no client)."""
        if len(self.client_ids) == 0:
            return np.full(len(self.increment_diff) - 1, np.nan)
        per_step = np.cumsum(self.increment_diff)[:-1] / self.scale
        return np.cumsum(per_step) / len(self.client_ids)


class GroupEnvironment:
    """What the environment of every client group shares: its clients and their random streams,
    the regret bookkeeping, and saving and restoring that state as arrays.

    Subclasses that draw randomness ahead in buffers implement ``_draw_buffer``,
    ``_buffer_position`` (-1 when nothing is buffered) and ``_set_buffer_position``; a partly used
    buffer is saved as the generator states it was drawn from and redrawn on load. The clients'
    streams are a list of NumPy generators here; a subclass may hold them otherwise (as arrays,
    ``ClientStreams``) by overriding ``_seed_streams``, ``_stream_arrays`` and ``_load_streams``.
    """

    _STATE: tuple[str, ...] = ("pulls", "_regret", "_diff")

    def __init__(
        self,
        num_instance_clients: int,
        client_ids: np.ndarray | Sequence[int],
        horizon: int,
        entropy: int | Sequence[int],
        scale: float,
    ) -> None:
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        self.client_ids = np.asarray(client_ids, dtype=np.int64)
        if self.client_ids.ndim != 1 or len(self.client_ids) == 0:
            raise ValueError("client_ids must be a non-empty 1-d sequence")
        if self.client_ids.min() < 0 or self.client_ids.max() >= num_instance_clients:
            raise ValueError(f"client ids must lie in [0, {num_instance_clients})")
        self.horizon = int(horizon)
        self.scale = scale
        #: The run's entropy: an algorithm seeds its own per-client streams from it (in a domain
        #: of ``fedbandit.rng`` of its own), never from the environment's.
        self.entropy = entropy
        self._seed_streams(entropy)
        n = len(self.client_ids)
        self.pulls = np.zeros(n, dtype=np.int64)
        self._regret = np.zeros(n)
        self._diff = np.zeros(self.horizon + 1)
        self._refill_snapshot: dict[str, np.ndarray] = {}

    @property
    def num_clients(self) -> int:
        return len(self.client_ids)

    def _seed_streams(self, entropy: int | Sequence[int]) -> None:
        self._rngs = client_generators(entropy, self.client_ids, REWARD_DOMAIN)

    def _stream_arrays(self) -> dict[str, np.ndarray]:
        return generators_to_arrays(self._rngs)

    def _load_streams(self, arrays: dict[str, np.ndarray]) -> None:
        self._rngs = generators_from_arrays(arrays)

    def _draw_buffer(self) -> None:
        """Draw the next buffer of randomness from the clients' generators (if any)."""

    def _buffer_position(self) -> int:
        return -1

    def _set_buffer_position(self, position: int) -> None:
        """Resume a redrawn buffer at ``position``, or empty it (-1)."""

    def _refill(self) -> None:
        self._refill_snapshot = self._stream_arrays()
        self._draw_buffer()

    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything that changes as the group plays, as arrays (no objects)."""
        state = collect(self, self._STATE)
        position = self._buffer_position()
        state["buffer_pos"] = np.array(position)
        generators = self._refill_snapshot if position >= 0 else self._stream_arrays()
        state.update(with_prefix("rng.", generators))
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        restore(self, self._STATE, state)
        self._load_streams(strip_prefix("rng.", state))
        position = int(state["buffer_pos"])
        if position >= 0:
            self._refill()
        self._set_buffer_position(position)

    def record(self) -> RegretRecord:
        return RegretRecord(
            client_ids=self.client_ids.copy(),
            increment_diff=self._diff.copy(),
            client_regret=self._regret.copy(),
            client_pulls=self.pulls.copy(),
            scale=self.scale,
        )
