"""Plain-loop transcriptions of replaced implementations, kept as references: the benchmarks time
them side by side with the current code and the tests check that both give the same results."""

from __future__ import annotations

import numpy as np

from fedbandit.environment import BanditEnvironment


def local_ucb_numpy_loop(env: BanditEnvironment, sigma: float) -> None:
    """Local UCB as it was before the compiled kernel (fedbandit 0.1), verbatim: one NumPy step
    for all of the group's clients and one ``pull_arms`` per time step."""
    n, K = env.num_clients, env.num_arms
    means = np.zeros(n * K)
    counts = np.zeros(n * K)
    inv_sqrt = np.zeros(n * K)
    offsets = np.arange(n) * K
    for step in range(1, env.horizon + 1):
        if step <= K:
            arms = np.full(n, step - 1)
        else:
            bonus = sigma * np.sqrt(2.0 * np.log(1.0 + step * np.log(step) ** 2))
            arms = (means + bonus * inv_sqrt).reshape(n, K).argmax(axis=1)
        flat = offsets + arms
        rewards = env.pull_arms(arms)
        counts[flat] += 1.0
        means[flat] += (rewards - means[flat]) / counts[flat]
        inv_sqrt[flat] = 1.0 / np.sqrt(counts[flat])
