"""Local UCB: every client runs UCB on its own K arms, ignoring features and other clients.

Index (the authors' reference code; Lattimore & Szepesvari, "Bandit Algorithms", Ch. 8):
UCB_a(t) = mean_a + sigma sqrt(2 log(1 + t log^2 t) / n_a), with untried arms first and ties to the
lowest arm index. No communication: the server sends one empty start message.

The steps run in a compiled kernel (numba) over the clients, in chunks of the environment's noise
buffer (``BanditEnvironment.play_steps``): memory is O(n K) per group plus one chunk of noise for a
block of clients per thread, whatever the horizon. The blocks run on ``fedbandit.threads.
kernel_threads()`` threads (the kernel releases the GIL); the regret does not depend on how many.
The arithmetic is the NumPy transcription's, operation for
operation (``mean + bonus * inv_sqrt``, first maximum, ``mean += (r - mean) / n``, ``1 / sqrt(n)``;
the bonus's ``log(t) ** 2`` is Python's ``pow``, as NumPy's scalar power is), so a seed's regret is
bit-identical to the step-by-step ``pull_arms`` loop (``tests/test_local_ucb.py``). The learner's
state is arm-major, one contiguous (K, block) array per block of clients: the index of one arm is
evaluated for the block's clients at a time in the processor's vector lanes (the same operations;
about 1.5x faster than client-major rows, and 4x faster than strided column slices of one (K, n)
array, which the compiler does not vectorise).
"""

from __future__ import annotations

import threading

import numba
import numpy as np
from pydantic import Field

from fedbandit.algorithms import citations
from fedbandit.algorithms.base import (
    AlgorithmSpec,
    Hyperparameters,
    NoCommunicationServer,
    ProblemSpec,
    environment_of,
)
from fedbandit.environment import BanditEnvironment
from fedbandit.federation.messages import Message
from fedbandit.federation.protocol import ClientLogic


class LocalUCBParams(Hyperparameters):
    """- ``noise_sigma``: sigma in the index; default (None) the instance's noise level."""

    noise_sigma: float | None = Field(None, gt=0)


def ucb_bonuses(sigma: float, first_step: int, count: int) -> np.ndarray:
    """sigma sqrt(2 log(1 + t log^2 t)) for t = first_step .. first_step + count - 1 (1-based),
    equal bit for bit to the scalar expression with NumPy scalars (whose ``** 2`` is C ``pow``,
    not ``x * x``: the square is taken with Python floats, which call ``pow`` too)."""
    steps = np.arange(first_step, first_step + count, dtype=np.float64)
    squares = np.array([x**2 for x in np.log(steps).tolist()])
    return sigma * np.sqrt(2.0 * np.log(1.0 + steps * squares))


@numba.njit(cache=True, nogil=True)
def ucb_steps(
    means: np.ndarray,
    counts: np.ndarray,
    inv_sqrt: np.ndarray,
    bonuses: np.ndarray,
    first_step: int,
    count: int,
    true_means: np.ndarray,
    noise_sigma: float,
    z: np.ndarray,
    gaps: np.ndarray,
    gap_units: np.ndarray,
    regret: np.ndarray,
    step_totals: np.ndarray,
) -> None:
    """Steps first_step .. first_step + count - 1 (0-based) of UCB for every client of the block.

    Learner (arm-major state, ``means[a, i]``): arm = argmax_a means + bonus * inv_sqrt (first
    maximum; arm t at steps t < K), then the running mean and 1/sqrt(n) of the pulled arm.
    Environment (the ``play_steps`` contract): the reward ``true_means[i, arm] + noise_sigma *
    z[i, s]`` and the regret bookkeeping."""
    num_arms, n = means.shape
    best = np.empty(n)
    arms = np.empty(n, dtype=np.int64)
    for s in range(count):
        step = first_step + s
        bonus = bonuses[s]
        # The index for all clients, one arm at a time: clients in the processor's vector lanes
        # (a select, not a branch, keeps the first maximum).
        if step < num_arms:
            arms[:] = step
        else:
            for i in range(n):
                best[i] = means[0, i] + bonus * inv_sqrt[0, i]
                arms[i] = 0
            for a in range(1, num_arms):
                for i in range(n):
                    value = means[a, i] + bonus * inv_sqrt[a, i]
                    better = value > best[i]
                    best[i] = value if better else best[i]
                    arms[i] = a if better else arms[i]
        total = 0.0
        for i in range(n):
            arm = arms[i]
            reward = true_means[i, arm] + noise_sigma * z[i, s]
            pulls = counts[arm, i] + 1.0
            counts[arm, i] = pulls
            means[arm, i] += (reward - means[arm, i]) / pulls
            inv_sqrt[arm, i] = 1.0 / np.sqrt(pulls)
            regret[i] += gaps[i, arm]
            total += gap_units[i, arm]
        step_totals[s] += total  # integers below 2^52: exact in any order


class LocalUCBClient(ClientLogic):
    """Runs the whole horizon on receipt of ``start``, compiled across the group's clients."""

    env: BanditEnvironment

    def __init__(self, spec: ProblemSpec, params: LocalUCBParams, env: BanditEnvironment):
        super().__init__(env)
        self.sigma = params.noise_sigma if params.noise_sigma is not None else spec.noise_sigma

    def handle(self, message: Message) -> Message:
        if message.kind != "start":
            raise ValueError(f"unknown message kind {message.kind!r} for local UCB")
        env = self.env
        # One contiguous (3, K, block) array (means, counts, 1/sqrt(n)) per block of clients,
        # arm-major: see ``ucb_steps``. (Column slices of one (K, n) array would be strided views,
        # which the compiled loops do not vectorise: 4x slower.)
        states: dict[int, np.ndarray] = {}
        bonuses: dict[int, np.ndarray] = {}
        lock = threading.Lock()

        def kernel(
            rows: slice,
            first: int,
            count: int,
            true_means: np.ndarray,
            noise_sigma: float,
            z: np.ndarray,
            gaps: np.ndarray,
            gap_units: np.ndarray,
            regret: np.ndarray,
            step_totals: np.ndarray,
        ) -> None:
            with lock:  # blocks of clients may be played on several threads at once
                if first not in bonuses:  # one chunk of bonuses, shared by the blocks
                    bonuses.clear()
                    bonuses[first] = ucb_bonuses(self.sigma, first + 1, count)
                chunk_bonuses = bonuses[first]
                state = states.get(rows.start)
                if state is None:
                    shape = (3, env.num_arms, rows.stop - rows.start)
                    state = states[rows.start] = np.zeros(shape)
            ucb_steps(
                state[0],
                state[1],
                state[2],
                chunk_bonuses,
                first,
                count,
                true_means,
                noise_sigma,
                z,
                gaps,
                gap_units,
                regret,
                step_totals,
            )

        env.play_steps(kernel)
        return Message(
            "done", message.round, message.client_ids, {}, meta={"pulls": env.pulls.copy()}
        )


#: Declared in ``setup.cfg`` under ``fedbandit.algorithms``.
LOCAL_UCB: AlgorithmSpec[LocalUCBParams] = AlgorithmSpec(
    name="local_ucb",
    description="Every client runs UCB on its own arms (no communication)",
    params=LocalUCBParams,
    make_server=lambda spec, params: NoCommunicationServer(spec),
    make_client=lambda spec, params, env: LocalUCBClient(
        spec, params, environment_of(env, BanditEnvironment)
    ),
    # the asymptotically optimal UCB index, as in Lattimore & Szepesvari's book (chapter 8)
    citation=citations.UCB_BOOK,
)
