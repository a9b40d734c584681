"""The environment of a client group on fixed features: draws rewards and keeps the true regret.

``GroupEnvironment`` and ``RegretRecord`` (``fedbandit.group_environment``, re-exported here) are
what every environment shares; ``BanditEnvironment`` is the one of fixed-feature instances.

Learners never see means or gaps. Pulls are executed either in blocks (``pull_counts``: n pulls of
arm a cost one Gaussian draw, since the sum of n i.i.d. N(mu, sigma^2) rewards is exactly
N(n mu, n sigma^2)) or one step at a time for every client at once (``pull_arms``). Regret is exact
at every step: within a block the pulls are taken in arm order, so the per-step regret is a known
piecewise-constant function, stored as a difference array over time.

Gaps are rounded to a fixed-point grid of step 2^-k (k chosen from the instance so that a step's sum
over all clients stays below 2^52): the difference array then holds integers, its sums are exact
in any order, and the merged curve is bit-identical however clients are grouped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numba
import numpy as np

from fedbandit.group_environment import GroupEnvironment, RegretRecord
from fedbandit.privacy import CLIP_TOLERANCE
from fedbandit.rng import REWARD_DOMAIN
from fedbandit.streams import ClientStreams
from fedbandit.threads import kernel_threads

if TYPE_CHECKING:
    from fedbandit.instances import LinearBanditInstance

__all__ = ["NOISE_CHUNK", "STEP_BLOCK", "BanditEnvironment", "GroupEnvironment", "RegretRecord"]

#: What the environment has been used for so far (the two kinds of pulls do not mix).
_NO_PULLS, _BLOCKS, _STEPS = 0, 1, 2
#: Noise draws per client per refill for step-by-step pulls (fixed: part of the stream layout).
NOISE_CHUNK = 4096
#: Clients per block of ``play_steps``: a block's learner state and its column of noise stay in the
#: processor's caches (Local UCB at M = 10^4, T = 2^15 on two threads: 1.7-2.0 s with 128,
#: 2.3-2.5 s with 512, 2.9 s with 1024; 64 is no faster than 128).
STEP_BLOCK = 128
#: A compiled step kernel for ``BanditEnvironment.play_steps`` (see there for the arguments).
StepKernel = Callable[..., None]


class BanditEnvironment(GroupEnvironment):
    """Rewards and regret for the clients ``client_ids`` of an instance, over horizon T each.

    The clients' reward streams are ``ClientStreams``: the same PCG64 streams and standard normals
    as one NumPy generator per client, held as arrays and drawn for all clients in compiled loops.
    """

    _STATE = (*GroupEnvironment._STATE, "_mode")

    def __init__(
        self,
        instance: LinearBanditInstance,
        client_ids: np.ndarray | Sequence[int],
        horizon: int,
        entropy: int | Sequence[int],
    ) -> None:
        super().__init__(instance.num_clients, client_ids, horizon, entropy, gap_scale(instance))
        self.noise_sigma = instance.noise_sigma
        self.features = instance.features[self.client_ids]
        self._means = instance.mean_rewards()[self.client_ids]
        self._gaps = np.round(instance.gaps()[self.client_ids] * self.scale) / self.scale
        self._gap_units = self._gaps * self.scale
        n = len(self.client_ids)
        self._noise = np.empty((n, 0))
        self._row_offsets = np.arange(n) * self.num_arms
        self._mode = _NO_PULLS
        self._noise_pos = 0
        self._block_noise = np.empty((0, 0))

    @property
    def num_arms(self) -> int:
        return self._means.shape[1]

    def _seed_streams(self, entropy: int | Sequence[int]) -> None:
        self._streams = ClientStreams.seeded(entropy, self.client_ids, REWARD_DOMAIN)

    def _stream_arrays(self) -> dict[str, np.ndarray]:
        return self._streams.to_arrays()

    def _load_streams(self, arrays: dict[str, np.ndarray]) -> None:
        self._streams = ClientStreams(arrays)

    def remaining(self) -> np.ndarray:
        return self.horizon - self.pulls

    def pull_counts(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pull arm a of client i ``counts[i, a]`` times, in arm order, within each client's budget.

        Returns (executed counts, reward sums), both (n, K). Each client draws exactly K standard
        normals from its own stream per call, so streams do not depend on grouping.
        """
        counts = np.asarray(counts)
        if counts.shape != self._means.shape:
            raise ValueError(f"counts must have shape {self._means.shape}, got {counts.shape}")
        if np.any(counts < 0):
            raise ValueError("pull counts must be non-negative")
        counts = np.ascontiguousarray(counts, dtype=np.int64)
        if self._mode == _STEPS:
            raise RuntimeError("pull_counts cannot follow pull_arms in one environment")
        self._mode = _BLOCKS
        if self._block_noise.shape != counts.shape:
            self._block_noise = np.empty(counts.shape)  # reused by every call: no page faults
        z = self._block_noise
        self._streams.fill(z, np.arange(self.num_clients))
        executed = np.empty_like(counts)
        sums = np.empty(counts.shape)
        _block_pulls(
            counts,
            self.horizon,
            self._means,
            self.noise_sigma,
            z,
            self._gap_units,
            self.pulls,
            self._diff,
            executed,
            sums,
        )
        self._regret += (executed * self._gaps).sum(axis=1)
        return executed, sums

    def clip_block_rewards(
        self,
        executed: np.ndarray,
        sums: np.ndarray,
        bound: float,
        rngs: Sequence[np.random.Generator],
    ) -> tuple[np.ndarray, np.ndarray]:
        """The reward sums ``sums`` of n = ``executed`` pulls (from ``pull_counts``) with every
        single reward clipped to [-bound, bound] (as ``fedbandit.privacy.clip_values``), and
        how many rewards were clipped, per client.

        The single rewards are drawn given their sum S: for i.i.d. N(mu, sigma^2) rewards the
        sample mean is independent of the deviations y_j - ybar, which have the law of
        sigma (w_j - wbar) with w_j i.i.d. N(0, 1). So y_j = S / n + sigma (w_j - wbar) has the law
        of the n pulls given S; the w_j come from ``rngs`` (one generator per client, in the
        group's order: n_i draws for client i, arms in order). The clipped sum is S plus the
        clipping's corrections: exactly S when no reward of the block is clipped. The regret is
        untouched (clipping is what the learner does with the rewards it saw).
        """
        executed = np.asarray(executed, dtype=np.int64)
        if executed.shape != self._means.shape or sums.shape != executed.shape:
            raise ValueError(f"executed and sums must have shape {self._means.shape}")
        if len(rngs) != self.num_clients:
            raise ValueError(f"need one generator per client ({self.num_clients}), got {len(rngs)}")
        clipped_sums = np.array(sums, dtype=np.float64)
        clipped = np.zeros(self.num_clients, dtype=np.int64)
        widened = bound * (1.0 + CLIP_TOLERANCE)  # as ``clip_values``: within it, left as is
        for row, rng in enumerate(rngs):
            total = int(executed[row].sum())
            if total:
                w = rng.standard_normal(total)
                clipped[row] = _clip_block(
                    executed[row], clipped_sums[row], w, self.noise_sigma, bound, widened
                )
        return clipped_sums, clipped

    def pull_arms(self, arms: np.ndarray) -> np.ndarray:
        """Every client pulls one arm now (all clients at the same step). Returns rewards (n,)."""
        if self._noise_pos == self._noise.shape[1]:
            self._refill()
        t = int(self.pulls[0])
        if self._mode == _BLOCKS or t >= self.horizon:
            raise RuntimeError("pull_arms needs every client at the same step, before the horizon")
        self._mode = _STEPS
        flat = self._row_offsets + arms
        rewards = self._means.take(flat) + self.noise_sigma * self._noise[:, self._noise_pos]
        self._noise_pos += 1
        self._regret += self._gaps.take(flat)
        total = self._gap_units.take(flat).sum()
        self._diff[t] += total
        self._diff[t + 1] -= total
        self.pulls += 1
        return rewards

    def play_steps(
        self, kernel: StepKernel, block: int = STEP_BLOCK, threads: int | None = None
    ) -> None:
        """Play the whole horizon step by step with a compiled kernel, in O(n K) memory.

        The rewards and the regret are those of ``pull_arms`` called once per step (same noise
        streams, same arithmetic), but the noise is drawn in chunks of ``NOISE_CHUNK`` steps for
        ``block`` clients at a time, so memory does not grow with the number of clients times the
        chunk, nor with the horizon. ``kernel(rows, first_step, count, means, noise_sigma, z,
        gaps, gap_units, regret, step_totals)`` plays steps ``first_step .. first_step + count -
        1`` (0-based) for the clients ``rows`` (a slice of the group): the learner's part picks
        the arms and learns from the rewards ``means[i, arm] + noise_sigma * z[i, s]``; the
        environment's part adds ``gaps[i, arm]`` to ``regret[i]`` and ``gap_units[i, arm]`` to
        ``step_totals[s]``. Afterwards the state (pulls, regret, noise stream position) is the
        state ``pull_arms`` would have left.

        The blocks of one chunk run on ``threads`` threads (default ``fedbandit.threads.
        kernel_threads()``), each with its own noise buffer and step totals: the kernel must
        release the GIL (numba ``nogil``) for them to overlap, and may be called for different
        blocks at once. The result does not depend on the number of threads: blocks are disjoint
        clients with their own streams, and the step totals are integer-valued (fixed point) sums
        below 2^52, exact in any order.
        """
        if self._mode != _NO_PULLS:
            raise RuntimeError("play_steps needs an environment that has not been pulled yet")
        self._mode = _STEPS
        n, horizon = self.num_clients, self.horizon
        blocks = [slice(start, min(start + block, n)) for start in range(0, n, block)]
        workers = max(1, min(kernel_threads() if threads is None else threads, len(blocks)))
        buffers = [np.empty((min(block, n), NOISE_CHUNK)) for _ in range(workers)]
        totals = np.zeros((workers, NOISE_CHUNK))
        lock = threading.Lock()

        def play(worker: int, first: int, count: int, queue: Iterator[slice]) -> None:
            z, step_totals = buffers[worker], totals[worker]
            while True:
                with lock:  # blocks are handed out as threads become free
                    rows = next(queue, None)
                if rows is None:
                    return
                chunk = z[: rows.stop - rows.start]
                self._streams.fill(chunk, np.arange(rows.start, rows.stop))
                kernel(
                    rows,
                    first,
                    count,
                    self._means[rows],
                    self.noise_sigma,
                    chunk,
                    self._gaps[rows],
                    self._gap_units[rows],
                    self._regret[rows],
                    step_totals,
                )

        pool = ThreadPoolExecutor(workers - 1) if workers > 1 else None
        try:
            for first in range(0, horizon, NOISE_CHUNK):
                count = min(NOISE_CHUNK, horizon - first)
                if first + count == horizon:
                    self._refill_snapshot = self._stream_arrays()
                totals[:] = 0.0
                queue = iter(blocks)
                helpers = (
                    [pool.submit(play, w, first, count, queue) for w in range(1, workers)]
                    if pool
                    else []
                )
                play(0, first, count, queue)
                for helper in helpers:
                    helper.result()
                # Integer-valued (fixed point) sums below 2^52: exact in any order.
                step_totals = totals.sum(axis=0)
                self._diff[first : first + count] += step_totals[:count]
                self._diff[first + 1 : first + count + 1] -= step_totals[:count]
                self.pulls += count
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        # As after the last pull_arms: a partly used buffer is its generators' states and position.
        self._noise = np.broadcast_to(np.float64(np.nan), (n, NOISE_CHUNK))
        self._noise_pos = (horizon - 1) % NOISE_CHUNK + 1

    def _draw_buffer(self) -> None:
        # In place: one buffer of n x NOISE_CHUNK (stacking per-client draws next to the old
        # buffer held three at the moment of a refill).
        shape = (self.num_clients, NOISE_CHUNK)
        if self._noise.shape != shape or not self._noise.flags.writeable:
            self._noise = np.empty((0, 0))  # free the old buffer before allocating the new one
            self._noise = np.empty(shape)
        self._streams.fill(self._noise, np.arange(self.num_clients))
        self._noise_pos = 0

    def _buffer_position(self) -> int:
        return self._noise_pos if self._noise_pos < self._noise.shape[1] else -1

    def _set_buffer_position(self, position: int) -> None:
        if position < 0:
            self._noise = np.empty((self.num_clients, 0))
            position = 0
        self._noise_pos = position


@numba.njit(cache=True)
def _block_pulls(
    counts: np.ndarray,
    horizon: int,
    means: np.ndarray,
    noise_sigma: float,
    z: np.ndarray,
    gap_units: np.ndarray,
    pulls: np.ndarray,
    diff: np.ndarray,
    executed: np.ndarray,
    sums: np.ndarray,
) -> None:
    """``pull_counts`` for every client in one pass: arms in order, the running total clipped at
    the horizon; reward sums n mu + (sigma sqrt(n)) z; each block's regret added to the fixed-point
    difference array at its first and past its last step (integer-valued: exact in any order);
    ``pulls`` advanced in place."""
    num_clients, num_arms = counts.shape
    for i in range(num_clients):
        requested, done = 0, 0
        for a in range(num_arms):
            requested += counts[i, a]
            total = min(requested, horizon - pulls[i])
            n = total - done
            executed[i, a] = n
            sums[i, a] = n * means[i, a] + noise_sigma * np.sqrt(float(n)) * z[i, a]
            if n > 0:
                start = pulls[i] + done
                diff[start] += gap_units[i, a]
                diff[start + n] -= gap_units[i, a]
            done = total
        pulls[i] += done


@numba.njit(cache=True)
def _clip_block(
    counts: np.ndarray,
    sums: np.ndarray,
    w: np.ndarray,
    noise_sigma: float,
    bound: float,
    widened: float,
) -> int:
    """One client's ``clip_block_rewards``: the rewards y_j = S_a / n_a + sigma (w_j - wbar_a) of
    each arm a (its n_a draws of ``w`` in arm order) clipped to [-bound, bound] where beyond
    ``widened``; ``sums`` corrected in place by the clipping; returns how many were clipped."""
    start, clipped = 0, 0
    for a in range(counts.shape[0]):
        n = counts[a]
        if n == 0:
            continue
        w_mean = 0.0
        for j in range(start, start + n):
            w_mean += w[j]
        w_mean /= n
        mean = sums[a] / n
        correction = 0.0
        for j in range(start, start + n):
            y = mean + noise_sigma * (w[j] - w_mean)
            if y > widened:
                correction += bound - y
                clipped += 1
            elif y < -widened:
                correction += -bound - y
                clipped += 1
        if correction != 0.0:
            sums[a] += correction
        start += n
    return clipped


def gap_scale(instance: LinearBanditInstance) -> float:
    """2^k with k <= 40 such that M * max gap * 2^k < 2^52 (exact integer sums in float64)."""
    bound = instance.num_clients * max(float(instance.gaps().max()), 1e-300)
    return float(2.0 ** min(40, int(np.floor(52 - np.log2(bound))) - 1))
