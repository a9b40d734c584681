"""The environment of a group of clients on a contextual instance: contexts, rewards, true regret.

Each logical client draws its contexts, its reward noise and its participation coins from its own
stream, in fixed chunks of ``CHUNK`` rounds, so results do not depend on how clients are grouped.
Regret is the pseudo-regret max_k mu_k(x_t) - mu_{a_t}(x_t), exact at every round, summed on the
same fixed-point grid as ``fedbandit.environment`` (integer-valued floats: order-independent sums).

Arrival orders (the instance's ``arrival``):

- ``synchronous`` (default): rounds 0..T-1; in each, every participating client acts once.
- ``round_robin``: the order of H-LinUCB's simulations (Do et al., ``anhddo/hlinUCB``, ``algo.py``:
  ``for t ...: for m in range(M)``): global steps 0..T-1, client s mod M acting at step s.
- ``sequential``: the order of the simulations of DisLinUCB, Async-LinUCB and FedLinUCB (Li & Wang,
  ``cyrilli/Async-LinUCB``, ``SimulationHomogeneousClients.py``: ``random.choices(users)`` per
  iteration; He et al., ``uclaml/FedLinUCB``, ``Federated.py``: ``agent = np.random.choice(M)``):
  global steps 0..T-1, in each of which one client, drawn uniformly from the M clients, acts. The
  acting client is drawn from a stream of its own (``ARRIVAL_DOMAIN``, derived from the run's
  entropy alone, so every client group draws the same sequence); the acting client's k-th context
  and noise are the k-th of its own stream, in the same chunk layout as the synchronous order.
- ``logged`` (``fedbandit.datasets.replay``, a replay of logged events): global steps 0..T-1, in
  each of which the client of event s of the file acts; its own environment
  (``ReplayEnvironment``, a subclass of this one) serves the events. Counted like
  ``sequential`` by ``total_interactions`` and ``round_of_step``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fedbandit.group_environment import GroupEnvironment, RegretRecord
from fedbandit.rng import domain_generator
from fedbandit.state import (
    collect,
    generators_from_arrays,
    generators_to_arrays,
    restore,
    strip_prefix,
    with_prefix,
)

if TYPE_CHECKING:
    from fedbandit.contextual.instances import ContextualInstance
    from fedbandit.datasets.contextual import TabularContextualInstance

#: Rounds drawn per refill (part of the stream layout: changing it changes results).
CHUNK = 1024
#: Fixed-point grid of the regret sums: 2^-30.
REGRET_SCALE = float(2**30)
#: Spawn-key domain of the sequential order's arrival stream (one per run, not per client).
ARRIVAL_DOMAIN = 2


def arrival_order(instance: Any) -> str:
    """The instance's arrival order: ``synchronous`` unless its parameters say ``sequential``,
    ``round_robin`` or ``logged``."""
    return str(getattr(getattr(instance, "params", None), "arrival", "synchronous"))


def total_interactions(instance: Any, horizon: int) -> int:
    """Client actions in a run: M T in synchronous rounds, T in the one-client-per-step orders."""
    if arrival_order(instance) != "synchronous":
        return int(horizon)
    return int(horizon) * int(instance.num_clients)


def round_of_step(instance: Any, step: int) -> int:
    """The 1-based round of global step ``step`` (0-based): step + 1 in synchronous rounds;
    step // M + 1 when one client acts per step (a round: M steps)."""
    if arrival_order(instance) == "synchronous":
        return int(step) + 1
    return int(step) // int(instance.num_clients) + 1


class ContextualEnvironment(GroupEnvironment):
    """Rounds (or global steps) 0..T-1 for the clients ``client_ids``; in each, the active clients
    act once (in the sequential order: the one client the arrival stream draws, if it is ours)."""

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
        self.sequential = arrival_order(instance) != "synchronous"
        self.round_robin = arrival_order(instance) == "round_robin"
        if self.sequential:
            self._init_sequential(entropy)

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
        if self.sequential:
            return self._observe_sequential()
        if self._pos == CHUNK:
            self._refill()
        return self.instance.expand(self._contexts[self._pos]), self._active[self._pos]

    def pull(self, arms: np.ndarray) -> np.ndarray:
        """The active clients pull ``arms`` (n,) (ignored for inactive ones); rewards (n,), and the
        round ends. Rewards of inactive clients are 0."""
        if self.sequential:
            return self._pull_sequential(arms)
        active = self._active[self._pos]
        flat = self._offsets + arms
        chosen = self._means[self._pos].reshape(-1)[flat]
        rewards = self.instance.rewards(chosen, self._noise[self._pos])
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

    # --- the sequential order -------------------------------------------------------------------

    def _init_sequential(self, entropy: int | Sequence[int]) -> None:
        n, p = self.num_clients, self.instance.params
        if p.participation < 1:
            raise ValueError(
                f"the {arrival_order(self.instance)} arrival order needs participation = 1"
            )
        self._arrival_rng = domain_generator(entropy, ARRIVAL_DOMAIN)
        self._arrival_snapshot = generators_to_arrays([self._arrival_rng])
        self._arrivals = np.empty(0, dtype=np.int64)
        self._arrival_pos = CHUNK
        # per client: its own chunk of contexts, means, gaps and noise, and where it stands in it
        self._client_pos = np.full(n, CHUNK, dtype=np.int64)
        self._client_snapshot = generators_to_arrays(self._rngs)
        probe, _ = self.instance.sample_contexts_and_means(np.random.default_rng(0), 1)
        self._seq_contexts = np.zeros((n, CHUNK, *probe.shape[1:]))
        self._seq_means = np.zeros((n, CHUNK, self.num_arms))
        self._seq_gaps = np.zeros((n, CHUNK, self.num_arms))
        self._seq_noise = np.zeros((n, CHUNK))
        self._actor = -1  # the row of the acting client in this step, or -1

    def _draw_arrivals(self, start: int) -> None:
        """The actors of the ``CHUNK`` global steps from ``start`` on."""
        if self.round_robin:
            self._arrivals = (start + np.arange(CHUNK)) % self.instance.num_clients
            return
        self._arrival_snapshot = generators_to_arrays([self._arrival_rng])
        self._arrivals = self._arrival_rng.integers(0, self.instance.num_clients, size=CHUNK)

    def _draw_client(self, row: int, snapshot: bool = True) -> None:
        """Client ``row``'s next chunk, drawn exactly as in the synchronous layout."""
        rng = self._rngs[row]
        if snapshot:
            words = generators_to_arrays([rng])
            for key, value in words.items():
                self._client_snapshot[key][row] = value[0]
        chunk, means = self.instance.sample_contexts_and_means(
            rng, CHUNK, int(self.client_ids[row])
        )
        self._seq_contexts[row] = chunk
        self._seq_means[row] = means
        self._seq_gaps[row] = np.round((means.max(axis=1, keepdims=True) - means) * REGRET_SCALE)
        self._seq_noise[row] = rng.standard_normal(CHUNK)

    def _observe_sequential(self) -> tuple[np.ndarray, np.ndarray]:
        if self._arrival_pos == CHUNK:
            self._draw_arrivals(self.round)
            self._arrival_pos = 0
        actor = int(self._arrivals[self._arrival_pos])
        rows = np.flatnonzero(self.client_ids == actor)
        active = np.zeros(self.num_clients, dtype=bool)
        compact = np.zeros((self.num_clients, *self._seq_contexts.shape[2:]))
        self._actor = -1
        if len(rows):
            row = int(rows[0])
            if self._client_pos[row] == CHUNK:
                self._draw_client(row)
                self._client_pos[row] = 0
            compact[row] = self._seq_contexts[row, self._client_pos[row]]
            active[row] = True
            self._actor = row
        return self.instance.expand(compact), active

    def _pull_sequential(self, arms: np.ndarray) -> np.ndarray:
        rewards = np.zeros(self.num_clients)
        row = self._actor
        if row >= 0:
            pos = int(self._client_pos[row])
            arm = int(arms[row])
            rewards[row] = self.instance.rewards(
                self._seq_means[row, pos, arm : arm + 1], self._seq_noise[row, pos : pos + 1]
            )[0]
            units = float(self._seq_gaps[row, pos, arm])
            self._regret[row] += units / REGRET_SCALE
            self._diff[self.round] += units
            self._diff[self.round + 1] -= units
            self.pulls[row] += 1
            self._client_pos[row] += 1
        self._actor = -1
        self.round += 1
        self._arrival_pos += 1
        return rewards

    def state_dict(self) -> dict[str, np.ndarray]:
        if not self.sequential:
            return super().state_dict()
        state = collect(self, self._STATE)
        state["client_pos"] = self._client_pos.copy()
        state["arrival_pos"] = np.array(self._arrival_pos)
        # a client's partly used chunk is saved as the generator state it was drawn from
        current = generators_to_arrays(self._rngs)
        drawn = self._client_pos < CHUNK
        words = {k: np.where(drawn, self._client_snapshot[k], v) for k, v in current.items()}
        state.update(with_prefix("rng.", words))
        arrival = (
            self._arrival_snapshot
            if self._arrival_pos < CHUNK
            else generators_to_arrays([self._arrival_rng])
        )
        state.update(with_prefix("arrival_rng.", arrival))
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        if not self.sequential:
            super().load_state_dict(state)
            return
        restore(self, self._STATE, state)
        self._rngs = generators_from_arrays(strip_prefix("rng.", state))
        self._client_snapshot = generators_to_arrays(self._rngs)
        self._client_pos = np.asarray(state["client_pos"], dtype=np.int64).copy()
        for row in np.flatnonzero(self._client_pos < CHUNK):
            self._draw_client(int(row), snapshot=False)
        self._arrival_rng = generators_from_arrays(strip_prefix("arrival_rng.", state))[0]
        self._arrival_pos = int(state["arrival_pos"])
        if self._arrival_pos < CHUNK:
            self._draw_arrivals(self.round - self._arrival_pos)
        self._actor = -1

    def record(self) -> RegretRecord:
        if np.abs(self._diff).max(initial=0.0) >= 2.0**52:
            raise OverflowError("per-round regret sums exceed the exact fixed-point range")
        return super().record()
