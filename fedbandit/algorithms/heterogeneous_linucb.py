"""H-LinUCB: federated LinUCB for clients whose parameters differ (Do, Nguyen-Tang, Arora,
"Multi-Agent Learning with Heterogeneous Linear Contextual Bandits", NeurIPS 2023; the authors'
code ``anhddo/hlinUCB``, ``algo.py``, ``hlin_ucb``).

The clients are told the dissimilarity epsilon (any two clients' parameters differ by at most
epsilon). Up to round tau = min(T, floor(1/epsilon^2)) they share statistics as in DisLinUCB, but
every sample enters with the weight w = min(1, alpha / ||x||_{V^-1}), alpha = sqrt(d) /
(epsilon M T): a sample that would move the shared estimate far (large ||x||_{V^-1}) counts less,
which bounds the bias the other clients' parameters bring. From round tau on the shared statistics
are dropped and every client runs OFUL alone, with no communication.

The rules, transcribed from ``algo.py`` (only the abstract of the paper was reachable: where the
two might differ, this follows the code):

- radius, t < tau: beta_t = sqrt(lambda) S + sigma sqrt(d log(1 + M t / (d lambda))
  + log(1/delta_1)) + alpha epsilon M t, delta_1 = 1 / (M tau + 1) (``sqrt_beta_corruption``);
- radius, t >= tau: beta_t = sqrt(lambda) S + sigma sqrt(2 log(1/delta_2)
  + d log(1 + t / (d lambda))), delta_2 = 1 / (T - tau + 1) (``sqrt_beta``);
- sync trigger (t < tau), checked with the new weighted sample but before it is stored:
  log(det(V_m + w x x^T) / det(V_sync)) (t - t_last) > D, D = sqrt(T log(M T) / (d M)); on a sync
  every client uploads what it has not shared, *without* the triggering client's new sample, which
  stays in that client's own statistics (``cov[m] += ...`` after the sync); everyone downloads;
- t is the round (1-based) and T the number of rounds; epsilon defaults to the instance's realised
  dissimilarity max_{i,j} ||theta_i - theta_j|| (``calc_dissimilarity`` of the true parameters, as
  the code does), plus the code's 1e-7 so that epsilon = 0 divides nothing by zero (then tau = T,
  alpha is huge, w = 1: DisLinUCB with this D and radius).

Where ours differs: lambda, S and the noise level sigma are parameters (the code's: 1, 1, 1); in
synchronous rounds every client acts in a round and a sync follows the round (the code's clients
act one after another within a round, a sync reaching the later ones at once: that is the
``round_robin`` arrival order, in which ours makes the code's decisions; checked in
``tests/test_heterogeneous.py``); the code's loop plays rounds 1..T-1, ours 1..T; tau = T never
switches (as in the code, whose last round is T - 1 < tau).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pydantic import Field

from fedbandit.algorithms import citations
from fedbandit.algorithms.base import ProblemSpec
from fedbandit.algorithms.federated_linucb import (
    DisLinUCBServer,
    FederatedRidgeClientBase,
    federated_ridge_spec,
)
from fedbandit.algorithms.linucb import RidgeParams
from fedbandit.contextual.environment import ContextualEnvironment, round_of_step
from fedbandit.federation.messages import Message

#: Added to epsilon by the authors' code "to avoid division by zero".
EPSILON_FLOOR = 1e-7


class HLinUCBParams(RidgeParams):
    """``dissimilarity``: epsilon, the bound on ||theta_i - theta_j|| the clients are told; default
    the instance's realised one (0 on a homogeneous instance). ``delta``, ``alpha`` and the
    refresh setting of ``RidgeParams`` are not used: the confidence levels are the code's."""

    dissimilarity: float | None = Field(None, ge=0)


def hlinucb_constants(epsilon: float, num_clients: int, dim: int, rounds: int) -> dict[str, float]:
    """The code's constants for T = ``rounds`` rounds of M = ``num_clients`` clients:
    tau = min(T, floor(1/eps^2)), alpha = sqrt(d) / (eps M T), D = sqrt(T log(M T) / (d M)),
    delta_1 = 1 / (M tau + 1), delta_2 = 1 / (T - tau + 1); eps includes the 1e-7 floor."""
    eps = epsilon + EPSILON_FLOOR
    T, M = rounds, num_clients
    tau = min(T, int(1.0 / eps**2))
    return {
        "epsilon": eps,
        "tau": float(tau),
        "alpha": math.sqrt(dim) / (eps * M * T),
        "threshold": math.sqrt(T * math.log(M * T) / dim / M),
        "delta_shared": 1.0 / (M * tau + 1),
        "delta_alone": 1.0 / (T - tau + 1),
    }


def hlinucb_radius(
    t: int,
    shared: bool,
    constants: dict[str, float],
    num_clients: int,
    dim: int,
    regularization: float,
    sigma: float,
    theta_bound: float,
) -> float:
    """beta_t: while ``shared`` (t < tau) sqrt(lambda) S + sigma sqrt(d log(1 + M t / (d lambda))
    + log(1/delta_1)) + alpha eps M t (``sqrt_beta_corruption``); after it the OFUL radius
    sqrt(lambda) S + sigma sqrt(2 log(1/delta_2) + d log(1 + t / (d lambda))) (``sqrt_beta``)."""
    base = math.sqrt(regularization) * theta_bound
    if shared:
        inner = dim * math.log(1 + num_clients * t / (dim * regularization)) + math.log(
            1 / constants["delta_shared"]
        )
        bias = constants["alpha"] * constants["epsilon"] * num_clients * t
        return base + sigma * math.sqrt(inner) + bias
    inner = 2 * math.log(1 / constants["delta_alone"]) + dim * math.log(
        1 + t / (dim * regularization)
    )
    return base + sigma * math.sqrt(inner)


class HLinUCBClient(FederatedRidgeClientBase):
    """A group of H-LinUCB clients: weighted DisLinUCB up to round tau, OFUL alone after it."""

    STATE = (
        *FederatedRidgeClientBase.STATE,
        "held_gram",
        "held_target",
        "held_count",
        "sync_round",
        "alone",
    )

    def __init__(
        self, spec: ProblemSpec, params: HLinUCBParams, env: ContextualEnvironment
    ) -> None:
        super().__init__(spec, params, env)
        instance = env.instance
        epsilon = params.dissimilarity
        if epsilon is None:
            epsilon = float(getattr(instance, "info", {}).get("dissimilarity", 0.0))
        self.rounds = round_of_step(instance, env.horizon - 1)
        self.constants = hlinucb_constants(epsilon, spec.num_clients, spec.dim, self.rounds)
        self.tau = int(self.constants["tau"])
        # the triggering clients' newest weighted sample: kept out of the sync it triggers
        self.held_gram = np.zeros_like(self.pending_gram)
        self.held_target = np.zeros_like(self.pending_target)
        self.held_count = np.zeros_like(self.pending_count)
        n = env.num_clients
        self.sync_round = np.zeros(n, dtype=np.int64)  # t_last: the round of the last sync
        self.alone = np.zeros(n, dtype=bool)  # past tau: shared statistics dropped
        self.trigger = np.zeros(n, dtype=bool)

    def shared_phase(self, t: int) -> bool:
        """Round t is before the switch to independent learning (tau = T never switches)."""
        return self.tau >= self.rounds or t < self.tau

    def handle(self, message: Message) -> Message:
        if message.kind == "collect":
            return self._collect(message)
        if message.kind != "round":
            raise ValueError(f"unknown message kind {message.kind!r} for {type(self).__name__}")
        if "gram" in message.fields:
            self._download(message)
            received = message.fields["receive"].any(axis=1)
            self.sync_round[received] = round_of_step(self.env.instance, self.env.round - 1)
        t = round_of_step(self.env.instance, self.env.round)
        shared = self.shared_phase(t)
        if not shared and not self.alone.all():
            self._go_alone()
        contexts, active = self.env.observe()
        beta = hlinucb_radius(
            t,
            shared,
            self.constants,
            self.spec.num_clients,
            self.spec.dim,
            self.params.regularization,
            self.policy.sigma,
            self.params.theta_bound,
        )
        learners = self.policy.learners
        arms = learners.select(contexts, self.policy.group, np.full(learners.logdet.shape, beta))
        rewards = self.env.pull(arms)
        rows, groups, x = self.policy.observed(contexts, active, arms)
        if shared:
            inverse = learners.inverse[rows, groups]
            norm = np.sqrt(np.maximum(np.einsum("jd,jde,je->j", x, inverse, x), 0.0))
            with np.errstate(divide="ignore"):
                weight = np.minimum(1.0, self.constants["alpha"] / norm)
        else:
            weight = np.ones(len(rows))
        root = np.sqrt(weight)
        learners.update(rows, groups, root[:, None] * x, root * rewards[rows])
        gram = weight[:, None, None] * x[:, :, None] * x[:, None, :]
        target = (weight * rewards[rows])[:, None] * x
        self.pending_gram[rows, groups] += gram
        self.pending_target[rows, groups] += target
        self.pending_count[rows, groups] += 1
        trigger = np.zeros(self.env.num_clients, dtype=bool)
        if shared:
            elapsed = t - self.sync_round
            trigger = active & (self._growth() * elapsed > self.constants["threshold"])
        self.held_gram[:] = 0.0
        self.held_target[:] = 0.0
        self.held_count[:] = 0
        held = trigger[rows]
        self.held_gram[rows[held], groups[held]] = gram[held]
        self.held_target[rows[held], groups[held]] = target[held]
        self.held_count[rows[held], groups[held]] = 1
        self.trigger = trigger
        return self._reply(message, contexts, active, arms, rewards)

    def _collect(self, message: Message) -> Message:
        """Every client uploads what it has not shared, less the sample that triggered the sync;
        that sample stays pending (the code adds it to ``cov[m]`` after the sync)."""
        self.pending_gram -= self.held_gram
        self.pending_target -= self.held_target
        self.pending_count -= self.held_count
        reply = self._upload(message, np.ones(self.env.num_clients, dtype=bool))
        self.pending_gram += self.held_gram
        self.pending_target += self.held_target
        self.pending_count += self.held_count
        return reply

    def _go_alone(self) -> None:
        """Round tau: drop the shared statistics; each client starts OFUL from lambda I."""
        learners = self.policy.learners
        rows = np.flatnonzero(~self.alone)
        lam = self.params.regularization
        eye = np.broadcast_to(lam * np.eye(learners.dim), learners.gram[rows].shape)
        learners.set_view(rows, eye.copy(), np.zeros_like(learners.target[rows]))
        self.pending_gram[rows] = 0.0
        self.pending_target[rows] = 0.0
        self.pending_count[rows] = 0
        self.alone[rows] = True

    def _reply(
        self,
        message: Message,
        contexts: np.ndarray,
        active: np.ndarray,
        arms: np.ndarray,
        rewards: np.ndarray,
    ) -> Message:
        """Which clients ask for a sync this round (``trigger``, set by ``handle``)."""
        return Message(
            "trigger",
            message.round,
            message.client_ids,
            {"trigger": self.trigger},
            sparse={"trigger": "trigger"},
            meta={"pulls": self.env.pulls.copy()},
        )

    def quiet(self, reply: Message) -> bool:
        """No trigger: the server does not collect, so its next message is an empty round."""
        return reply.kind == "trigger" and not reply.fields["trigger"].any()


#: Declared in ``setup.cfg`` under ``fedbandit.algorithms``. The server is DisLinUCB's: any
#: trigger starts a collect, after which every client downloads the new shared statistics.
HLINUCB: Any = federated_ridge_spec(
    "hlinucb",
    "H-LinUCB: weighted sharing up to tau, then alone (Do et al. 2023)",
    HLinUCBParams,
    DisLinUCBServer,
    HLinUCBClient,
    citations.HLINUCB,
)
