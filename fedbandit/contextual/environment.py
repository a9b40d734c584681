"""The environment of a group of clients on a contextual instance: contexts, rewards, true regret.

Each logical client draws its contexts, its reward noise and its participation coins from its own
stream, in fixed chunks of ``CHUNK`` rounds, so results do not depend on how clients are grouped.
Regret is the pseudo-regret max_k mu_k(x_t) - mu_{a_t}(x_t), exact at every round, summed on the
same fixed-point grid as ``fedbandit.environment`` (integer-valued floats: order-independent sums).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from fedbandit.contextual.instances import ContextualInstance
from fedbandit.environment import GroupEnvironment, RegretRecord

if TYPE_CHECKING:
    from fedbandit.datasets.contextual import TabularContextualInstance

#: Rounds drawn per refill (part of the stream layout: changing it changes results).
CHUNK = 1024
#: Fixed-point grid of the regret sums: 2^-30.
REGRET_SCALE = float(2**30)


class ContextualEnvironment(GroupEnvironment):
    """Rounds 0..T-1 for the clients ``client_ids``; in each, the active clients act once."""

    _STATE = (*GroupEnvironment._STATE, "round")

    def __init__(
        self,
        instance: ContextualInstance | TabularContextualInstance,
        client_ids: np.ndarray | Sequence[int],
        horizon: int,
        entropy: int | Sequence[int],
    ) -> None:
        super().__init__(instance.num_clients, client_ids, horizon, entropy, REGRET_SCALE)
        self.instance = instance
        self.noise_sigma = instance.noise_sigma
        self.round = 0
        self._pos = CHUNK
        self._offsets = np.arange(self.num_clients) * instance.num_arms
        self._all_active = instance.params.participation == 1.0
        self._contexts = self._means = self._noise = np.empty(0)
        self._active = np.empty(0, dtype=bool)

    @property
    def num_arms(self) -> int:
        return self.instance.num_arms

    def _draw_buffer(self) -> None:
        p = self.instance.params
        contexts, means, noise, coins = [], [], [], []
        for client_id, rng in zip(self.client_ids, self._rngs, strict=True):
            chunk, chunk_means = self.instance.sample_contexts_and_means(rng, CHUNK, int(client_id))
            contexts.append(chunk)
            means.append(chunk_means)
            noise.append(rng.standard_normal(CHUNK))
            coins.append(rng.random(CHUNK) if p.participation < 1 else np.zeros(CHUNK))
        self._contexts = np.stack(contexts, axis=1)  # (CHUNK, n, 1 or K, d)
        self._means = np.stack(means, axis=1)  # (CHUNK, n, K)
        gap_units = np.round((self._means.max(axis=2, keepdims=True) - self._means) * REGRET_SCALE)
        self._gap_units = gap_units.reshape(CHUNK, -1)  # (CHUNK, n K), integer-valued
        self._noise = np.stack(noise, axis=1)
        self._active = np.stack(coins, axis=1) < p.participation
        self._pos = 0

    def observe(self) -> tuple[np.ndarray, np.ndarray]:
        """This round's contexts (n, K, d) (a read-only view) and which clients act (n,)."""
        if self.round >= self.horizon:
            raise RuntimeError(f"the horizon of {self.horizon} rounds is over")
        if self._pos == CHUNK:
            self._refill()
        return self.instance.expand(self._contexts[self._pos]), self._active[self._pos]

    def pull(self, arms: np.ndarray) -> np.ndarray:
        """The active clients pull ``arms`` (n,) (ignored for inactive ones); rewards (n,), and the
        round ends. Rewards of inactive clients are 0."""
        active = self._active[self._pos]
        flat = self._offsets + arms
        chosen = self._means[self._pos].reshape(-1)[flat]
        rewards = chosen + self.noise_sigma * self._noise[self._pos]
        units = self._gap_units[self._pos][flat]
        if not self._all_active:
            rewards = np.where(active, rewards, 0.0)
            units = np.where(active, units, 0.0)
        self._regret += units / REGRET_SCALE
        total = units.sum()
        self._diff[self.round] += total
        self._diff[self.round + 1] -= total
        self.pulls += active
        self.round += 1
        self._pos += 1
        return rewards

    def _buffer_position(self) -> int:
        return self._pos if self._pos < CHUNK else -1

    def _set_buffer_position(self, position: int) -> None:
        self._pos = position if position >= 0 else CHUNK

    def record(self) -> RegretRecord:
        if np.abs(self._diff).max(initial=0.0) >= 2.0**52:
            raise OverflowError("per-round regret sums exceed the exact fixed-point range")
        return super().record()
