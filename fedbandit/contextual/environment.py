"""The environment of a group of clients on a contextual instance: contexts, rewards, true regret.

Each logical client draws its contexts, its reward noise and its participation coins from its own
stream, in fixed chunks of ``CHUNK`` rounds, so results do not depend on how clients are grouped.
Regret is the pseudo-regret max_k mu_k(x_t) - mu_{a_t}(x_t), exact at every round, summed on the
same fixed-point grid as ``fedbandit.environment`` (integer-valued floats: order-independent sums).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedbandit.contextual.instances import ContextualInstance
from fedbandit.environment import RegretRecord
from fedbandit.rng import REWARD_DOMAIN, client_generators
from fedbandit.state import (
    collect,
    generators_from_arrays,
    generators_to_arrays,
    restore,
    strip_prefix,
    with_prefix,
)

#: Rounds drawn per refill (part of the stream layout: changing it changes results).
CHUNK = 1024
#: Fixed-point grid of the regret sums: 2^-30.
REGRET_SCALE = float(2**30)


class ContextualEnvironment:
    """Rounds 0..T-1 for the clients ``client_ids``; in each, the active clients act once."""

    def __init__(
        self,
        instance: ContextualInstance,
        client_ids: np.ndarray | Sequence[int],
        horizon: int,
        entropy: int | Sequence[int],
    ) -> None:
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        self.instance = instance
        self.client_ids = np.asarray(client_ids, dtype=np.int64)
        if self.client_ids.min() < 0 or self.client_ids.max() >= instance.num_clients:
            raise ValueError(f"client ids must lie in [0, {instance.num_clients})")
        self.horizon = int(horizon)
        self.noise_sigma = instance.noise_sigma
        self._rngs = client_generators(entropy, self.client_ids, REWARD_DOMAIN)
        n = len(self.client_ids)
        self.round = 0
        self.pulls = np.zeros(n, dtype=np.int64)
        self._regret = np.zeros(n)
        self._diff = np.zeros(self.horizon + 1)
        self._pos = CHUNK
        self._offsets = np.arange(n) * instance.num_arms
        self._all_active = instance.params.participation == 1.0
        self._contexts = self._means = self._noise = self._active = np.empty(0)

    @property
    def num_clients(self) -> int:
        return len(self.client_ids)

    @property
    def num_arms(self) -> int:
        return self.instance.num_arms

    def _refill(self) -> None:
        self._refill_snapshot = generators_to_arrays(self._rngs)
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

    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything that changes as the group plays, as arrays. A partly used chunk is saved as
        the generator states it was drawn from, and redrawn on load."""
        state = collect(self, ("round", "pulls", "_regret", "_diff"))
        buffered = self._pos < CHUNK
        state["chunk_pos"] = np.array(self._pos if buffered else -1)
        generators = self._refill_snapshot if buffered else generators_to_arrays(self._rngs)
        state.update(with_prefix("rng.", generators))
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        restore(self, ("round", "pulls", "_regret", "_diff"), state)
        self._rngs = generators_from_arrays(strip_prefix("rng.", state))
        position = int(state["chunk_pos"])
        if position >= 0:
            self._refill()
            self._pos = position
        else:
            self._pos = CHUNK

    def record(self) -> RegretRecord:
        if np.abs(self._diff).max(initial=0.0) >= 2.0**52:
            raise OverflowError("per-round regret sums exceed the exact fixed-point range")
        return RegretRecord(
            client_ids=self.client_ids.copy(),
            increment_diff=self._diff.copy(),
            client_regret=self._regret.copy(),
            client_pulls=self.pulls.copy(),
            scale=REGRET_SCALE,
        )
