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

import math
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numba
import numpy as np

from fedbandit import compile_notice
from fedbandit.group_environment import GroupEnvironment, RegretRecord
from fedbandit.privacy import CLIP_TOLERANCE
from fedbandit.rng import REWARD_DOMAIN
from fedbandit.streams import ClientStreams, _normals, _output, _step
from fedbandit.threads import kernel_threads

compile_notice.install()  # one line on stderr when numba compiles these kernels

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
        streams: ClientStreams,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The reward sums ``sums`` of n = ``executed`` pulls (from ``pull_counts``) with every
        single reward clipped to [-bound, bound] (as ``fedbandit.privacy.clip_values``: a reward
        within ``CLIP_TOLERANCE`` of the bound is left as it is), and how many rewards were
        clipped, per client.

        Drawn from their exact law given the sum S, without drawing the n rewards: for i.i.d.
        N(mu, sigma^2) rewards, the rewards given S are S / n + sigma (w_j - wbar) (w_j i.i.d.
        N(0, 1)), whatever mu. ``_block_excess`` draws which of them lie beyond the bound and
        their values, by thinning with the union bound and splitting a block along its Gaussian
        bridge where a clipped reward is likely; its cost grows with the number of rewards
        clipped, not with n (where more than 1 in 32 rewards may be clipped, the rewards are
        drawn one by one given S instead). The clipped sum is S plus the clipping's corrections:
        exactly S when no reward of the block is clipped. The draws come from ``streams`` (the
        clients' own PCG64 streams, ``fedbandit.streams.ClientStreams``, in the group's order),
        client after client and arm after arm, so they do not depend on the grouping; how many
        draws a block takes depends on its sum. The regret is untouched (clipping is what the
        learner does with the rewards it saw). ``tests/test_private_fedpe.py`` compares the law
        with a pull-by-pull loop.
        """
        executed = np.ascontiguousarray(executed, dtype=np.int64)
        if executed.shape != self._means.shape or sums.shape != executed.shape:
            raise ValueError(f"executed and sums must have shape {self._means.shape}")
        if len(streams) != self.num_clients:
            raise ValueError(f"need one stream per client ({self.num_clients}), got {len(streams)}")
        clipped_sums = np.array(sums, dtype=np.float64)
        clipped = np.zeros(self.num_clients, dtype=np.int64)
        widened = bound * (1.0 + CLIP_TOLERANCE)  # as ``clip_values``: within it, left as is
        _clip_blocks(
            executed,
            clipped_sums,
            float(self.noise_sigma),
            float(bound),
            widened,
            streams.state_hi,
            streams.state_lo,
            streams.inc_hi,
            streams.inc_lo,
            clipped,
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


#: The thinning step of ``_block_excess`` runs on pieces of a block whose union bound on a
#: clipped reward, q = m (P(y > W) + P(y < -W)), is at most this; larger pieces are split first
#: into about q / ``_PIECE_TARGET`` pieces (each piece's sum drawn from its Gaussian bridge).
_THIN_MAX = 0.5
_PIECE_TARGET = 0.35
#: Where q / m, the bound on the chance that one reward is clipped, exceeds this, the rewards of a
#: block are drawn one by one given their sum instead (``_dense_excess``): about 13 ns a reward
#: against about 0.5 us a clipped reward for the thinning and splitting.
_DENSE = 1.0 / 32.0
_SQRT_HALF = math.sqrt(0.5)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_UNIT = 1.0 / 9007199254740992.0  # 2^-53


@numba.njit(inline="always")
def _uniform(st: np.ndarray) -> float:
    """The next double in [0, 1) of the PCG64 stream whose (state_hi, state_lo, inc_hi, inc_lo)
    is ``st`` (NumPy's ``random()``: the top 53 bits of the next 64-bit output)."""
    st[0], st[1] = _step(st[0], st[1], st[2], st[3])
    return float(_output(st[0], st[1]) >> np.uint64(11)) * _UNIT


@numba.njit(inline="always")
def _normal(st: np.ndarray, buf: np.ndarray) -> float:
    """The next standard normal of the stream ``st`` (NumPy's ziggurat, ``fedbandit.streams``)."""
    st[0], st[1] = _normals(st[0], st[1], st[2], st[3], buf)
    return buf[0]


@numba.njit(inline="always")
def _tail_bound(a: float) -> float:
    """An upper bound on P(Z > a), Z ~ N(0, 1), by one exponential: exp(-a^2 / 2) times
    min(1/2, 1 / (a sqrt(2 pi))) for a > 0 (the Chernoff and Mills-ratio bounds; within 10% of
    the tail from a = 3), and 1 for a <= 0."""
    if a <= 0.0:
        return 1.0
    return math.exp(-0.5 * a * a) * min(0.5, _INV_SQRT_2PI / a)


@numba.njit(cache=True)
def _normal_tail(a: float, st: np.ndarray) -> float:
    """Z ~ N(0, 1) given Z > a, for a >= 0: Robert's (1995) exponential proposal a + E / lam,
    lam = (a + sqrt(a^2 + 4)) / 2, accepted with probability exp(-(z - lam)^2 / 2) (exact)."""
    lam = 0.5 * (a + math.sqrt(a * a + 4.0))
    while True:
        z = a - math.log1p(-_uniform(st)) / lam
        if _uniform(st) <= math.exp(-0.5 * (z - lam) * (z - lam)):
            return z


_CANDIDATE, _SPLIT = 0, 1


@numba.njit(cache=True)
def _block_excess(
    m: int,
    total: float,
    sigma: float,
    bound: float,
    widened: float,
    st: np.ndarray,
    buf: np.ndarray,
    frames: np.ndarray,
    values: np.ndarray,
    scratch: np.ndarray,
) -> tuple[int, float]:
    """How many of m i.i.d. N(mu, sigma^2) rewards with sum ``total`` lie beyond [-widened,
    widened], and the sum of their clipping corrections (+-bound - y), drawn from their exact law
    given the sum, without drawing the m rewards (see ``BanditEnvironment.clip_block_rewards``).

    Given their sum, each of the m rewards is N(total / m, sigma^2 (1 - 1/m)), so the union bound
    q = m (P(y > W) + P(y < -W)) on a reward beyond the bound is known in closed form (here q is
    the sum of the sides' bounds b >= P by ``_tail_bound``; the exact P is computed only for a
    candidate).
    - If q <= ``_THIN_MAX`` (thinning): with probability 1 - q nothing is clipped. Else a
      candidate: a side in proportion to its b, one reward y_J drawn from its law beyond the
      bound on that side (``_normal_tail``), the other m - 1 given their sum total - y_J in the
      same way, and the whole kept with probability (P / b) / N (N the number beyond the bound,
      y_J included), else nothing is clipped. A side's candidate is kept with probability
      m P E[1 / N | y_J beyond on that side]; summed over the sides, P(some reward beyond), and
      what is kept has the law of the rewards given that event: the result has the exact law.
    - If q is larger and q / m <= ``_DENSE``, the block is split into about q /
      ``_PIECE_TARGET`` pieces whose sums are drawn one after another from their Gaussian bridge
      (the sum of c of m rewards given their total is N(total c / m, sigma^2 c (m - c) / m));
      given their sums the pieces are independent blocks.
    - If q / m > ``_DENSE`` (many rewards clipped), the m rewards are drawn given their sum one
      by one, total / m + sigma (w_j - wbar) with w_j i.i.d. N(0, 1) (``_dense_excess``).
    The recursion runs on an explicit stack (numba cannot cache recursive functions): ``frames``
    (int64, (depth, 4): kind, pieces left, rewards left, count) and ``values`` (float64,
    (depth, 3): correction, sum left or own correction, keeping ratio), grown when full.
    """
    depth = 0
    call = True  # evaluate (m, total); else return (count, correction) to the frame on top
    count, correction = 0, 0.0
    while True:
        if call:
            call = False
            count, correction = 0, 0.0
            if m <= 0:
                pass
            elif m == 1 or sigma == 0.0:  # the rewards are known: each is total / m
                y = total / m
                if y > widened:
                    count, correction = m, m * (bound - y)
                elif y < -widened:
                    count, correction = m, m * (-bound - y)
            else:
                mean = total / m
                scale = sigma * math.sqrt(1.0 - 1.0 / m)
                a_hi = (widened - mean) / scale
                a_lo = (widened + mean) / scale
                b_hi = _tail_bound(a_hi)
                q = m * (b_hi + _tail_bound(a_lo))
                if depth == frames.shape[0]:
                    frames, values = _grown(frames), _grown(values)
                if q > _THIN_MAX and q > _DENSE * m:
                    count, correction = _dense_excess(m, total, sigma, bound, widened, st, scratch)
                elif q <= _THIN_MAX:
                    u = _uniform(st)
                    if u < q:
                        # A candidate. u / q is uniform on [0, 1), independent of the decision:
                        # it picks the side.
                        if u < m * b_hi:
                            y = mean + scale * _normal_tail(a_hi, st)
                            own = bound - y
                            ratio = 0.5 * math.erfc(a_hi * _SQRT_HALF) / b_hi
                        else:
                            y = mean - scale * _normal_tail(a_lo, st)
                            own = -bound - y
                            ratio = 0.5 * math.erfc(a_lo * _SQRT_HALF) / _tail_bound(a_lo)
                        frames[depth, 0] = _CANDIDATE
                        values[depth, 1] = own
                        values[depth, 2] = ratio
                        depth += 1
                        m, total, call = m - 1, total - y, True
                        continue
                else:
                    frames[depth, 0] = _SPLIT
                    frames[depth, 1] = min(m, math.ceil(q / _PIECE_TARGET))
                    frames[depth, 2] = m
                    frames[depth, 3] = 0
                    values[depth, 0] = 0.0
                    values[depth, 1] = total
                    depth += 1
                    count = -1  # no result yet: start the first piece below
        if depth == 0:
            return count, correction
        top = depth - 1
        if frames[top, 0] == _CANDIDATE:
            # The other m - 1 are drawn: keep the candidate with probability (P / b) / N.
            if _uniform(st) * (count + 1) < values[top, 2]:
                count, correction = count + 1, correction + values[top, 1]
            else:
                count, correction = 0, 0.0
            depth = top
            continue
        if count >= 0:  # a piece's result
            frames[top, 3] += count
            values[top, 0] += correction
        pieces, left, remaining = frames[top, 1], frames[top, 2], values[top, 1]
        if pieces == 0:
            count, correction = frames[top, 3], values[top, 0]
            depth = top
            continue
        if pieces == 1:
            m, total = left, remaining
        else:
            c = left // pieces
            spread = sigma * math.sqrt(c * (left - c) / left)
            m, total = c, remaining * c / left + spread * _normal(st, buf)
        frames[top, 1] = pieces - 1
        frames[top, 2] = left - m
        values[top, 1] = remaining - total
        call = True


@numba.njit(cache=True)
def _dense_excess(
    m: int,
    total: float,
    sigma: float,
    bound: float,
    widened: float,
    st: np.ndarray,
    scratch: np.ndarray,
) -> tuple[int, float]:
    """``_block_excess`` by drawing the m rewards given their sum: for i.i.d. Gaussian rewards
    the sample mean is independent of the deviations, so total / m + sigma (w_j - wbar), w_j
    i.i.d. N(0, 1) from the stream ``st``, have the law of the rewards given the sum; each is
    clipped. ``scratch`` holds at least m values."""
    w = scratch[:m]
    st[0], st[1] = _normals(st[0], st[1], st[2], st[3], w)
    w_mean = 0.0
    for j in range(m):
        w_mean += w[j]
    w_mean /= m
    mean = total / m
    count, correction = 0, 0.0
    for j in range(m):
        y = mean + sigma * (w[j] - w_mean)
        if y > widened:
            correction += bound - y
            count += 1
        elif y < -widened:
            correction += -bound - y
            count += 1
    return count, correction


@numba.njit(cache=True)
def _grown(stack: np.ndarray) -> np.ndarray:
    """``stack`` with twice the rows, the first ones copied."""
    out = np.empty((2 * stack.shape[0], stack.shape[1]), dtype=stack.dtype)
    out[: stack.shape[0]] = stack
    return out


@numba.njit(cache=True)
def _clip_blocks(
    executed: np.ndarray,
    sums: np.ndarray,
    noise_sigma: float,
    bound: float,
    widened: float,
    state_hi: np.ndarray,
    state_lo: np.ndarray,
    inc_hi: np.ndarray,
    inc_lo: np.ndarray,
    clipped: np.ndarray,
) -> None:
    """``clip_block_rewards`` for every client: arms in order, each client's draws from its own
    stream (row i of the state arrays); ``sums`` corrected and ``clipped`` counted in place."""
    st = np.empty(4, dtype=np.uint64)
    buf = np.empty(1)
    frames = np.empty((64, 4), dtype=np.int64)
    values = np.empty((64, 3))
    scratch = np.empty(max(1, executed.max()) if executed.size else 1)
    for i in range(executed.shape[0]):
        st[0], st[1], st[2], st[3] = state_hi[i], state_lo[i], inc_hi[i], inc_lo[i]
        for a in range(executed.shape[1]):
            n = executed[i, a]
            if n == 0:
                continue
            count, correction = _block_excess(
                n, sums[i, a], noise_sigma, bound, widened, st, buf, frames, values, scratch
            )
            if count:
                sums[i, a] += correction
                clipped[i] += count
        state_hi[i], state_lo[i] = st[0], st[1]


def gap_scale(instance: LinearBanditInstance) -> float:
    """2^k with k <= 40 such that M * max gap * 2^k < 2^52 (exact integer sums in float64)."""
    bound = instance.num_clients * max(float(instance.gaps().max()), 1e-300)
    return float(2.0 ** min(40, int(np.floor(52 - np.log2(bound))) - 1))
