"""Local UCB: every client runs UCB on its own K arms, ignoring features and other clients.

Index (the authors' reference code; Lattimore & Szepesvari, "Bandit Algorithms", Ch. 8):
UCB_a(t) = mean_a + sigma sqrt(2 log(1 + t log^2 t) / n_a), with untried arms first and ties to the
lowest arm index. No communication: the server sends one empty start message.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from fedbandit.algorithms.base import Hyperparameters, ProblemSpec
from fedbandit.environment import BanditEnvironment
from fedbandit.federation.messages import Message
from fedbandit.federation.protocol import ClientLogic


class LocalUCBParams(Hyperparameters):
    """- ``noise_sigma``: sigma in the index; default (None) the instance's noise level."""

    noise_sigma: float | None = Field(None, gt=0)


class LocalUCBClient(ClientLogic):
    """Runs the whole horizon on receipt of ``start``, vectorised across the group's clients."""

    env: BanditEnvironment

    def __init__(self, spec: ProblemSpec, params: LocalUCBParams, env: BanditEnvironment):
        super().__init__(env)
        self.sigma = params.noise_sigma if params.noise_sigma is not None else spec.noise_sigma

    def handle(self, message: Message) -> Message:
        if message.kind != "start":
            raise ValueError(f"unknown message kind {message.kind!r} for local UCB")
        env = self.env
        n, K = env.num_clients, env.num_arms
        means = np.zeros(n * K)
        counts = np.zeros(n * K)
        inv_sqrt = np.zeros(n * K)
        offsets = np.arange(n) * K
        for step in range(1, env.horizon + 1):
            if step <= K:
                arms = np.full(n, step - 1)
            else:
                bonus = self.sigma * np.sqrt(2.0 * np.log(1.0 + step * np.log(step) ** 2))
                arms = (means + bonus * inv_sqrt).reshape(n, K).argmax(axis=1)
            flat = offsets + arms
            rewards = env.pull_arms(arms)
            counts[flat] += 1.0
            means[flat] += (rewards - means[flat]) / counts[flat]
            inv_sqrt[flat] = 1.0 / np.sqrt(counts[flat])
        return Message(
            "done", message.round, message.client_ids, {}, meta={"pulls": env.pulls.copy()}
        )
