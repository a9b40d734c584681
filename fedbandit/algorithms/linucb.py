"""The LinUCB family on contextual instances, every client learning alone (no communication).

- ``linucb_d`` — LinUCB-d (Wu, Yang, Shen, "Stochastic Linear Contextual Bandits with Diverse
  Contexts", AISTATS 2020). Only the paper's abstract and introduction are available to us; this is
  our reading: disjoint LinUCB whose ridge statistics include every round the arm was played
  (exploitation rounds included) and whose confidence radius follows a time-varying schedule,
  by default the self-normalised radius of Abbasi-Yadkori et al. (2011) with delta_t = 1/t^2.
- ``linucb`` — LinUCB with a fixed exploration weight alpha (Li, Chu, Langford, Schapire 2010).
- ``oful`` — OFUL: the self-normalised radius with a constant confidence delta
  (Abbasi-Yadkori, Pal, Szepesvari 2011); ``radius = "hlinucb_code"`` takes the count-based
  radius of the H-LinUCB authors' OFUL baseline instead (``OFULParams``).
- ``greedy`` — ridge estimates, no exploration bonus.

Models: ``disjoint`` (one ridge model per arm, the LinUCB-d setting), ``shared`` (one model for
every arm's feature vector, the DisLinUCB setting), or ``auto`` (shared on a shared-parameter
instance, disjoint otherwise).
"""

from __future__ import annotations

from typing import Any, Literal

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
from fedbandit.contextual.environment import ContextualEnvironment
from fedbandit.contextual.ridge import (
    DeltaSchedule,
    RadiusRule,
    RidgeLearners,
    count_radius,
    radius,
)
from fedbandit.federation.messages import Message
from fedbandit.federation.protocol import ClientLogic


class RidgeParams(Hyperparameters):
    """Hyperparameters of the LinUCB family.

    - ``regularization``: lambda in V = lambda I + sum x x^T.
    - ``alpha``: fixed exploration weight (``linucb`` only).
    - ``delta``: confidence level of the self-normalised radius (constant schedule).
    - ``theta_bound``: S, a bound on ||theta||, in the self-normalised radius.
    - ``noise_sigma``: sub-Gaussian noise level in the radius; default the instance's.
    - ``model``: disjoint per-arm models, one shared model, or auto.
    - ``refresh_every``: rounds between exact recomputations of V^{-1} from V.
    """

    regularization: float = Field(1.0, gt=0)
    alpha: float = Field(1.0, ge=0)
    delta: float = Field(0.01, gt=0, lt=1)
    theta_bound: float = Field(1.0, ge=0)
    noise_sigma: float | None = Field(None, gt=0)
    model: Literal["auto", "disjoint", "shared"] = "auto"
    refresh_every: int = Field(1024, ge=1)


#: ``radius`` of ``oful`` and ``dislinucb``: the self-normalised radius (log det V) or the
#: count-based radius of the H-LinUCB authors' baselines (``anhddo/hlinUCB``, ``algo.py``).
RadiusChoice = Literal["self_normalized", "hlinucb_code"]


class OFULParams(RidgeParams):
    """``radius``: ``"self_normalized"`` (default): sqrt(lambda) S + sigma sqrt(2 log(1/delta)
    + log det V - d log lambda) (Abbasi-Yadkori et al. 2011, Theorem 2). ``"hlinucb_code"``: the
    Ind-OFUL baseline of the H-LinUCB authors (``anhddo/hlinUCB``, ``algo.py``:28-29
    ``sqrt_beta``, called at :57 from ``oful``, :42-69): sqrt(lambda) S + sigma sqrt(2 log(1/delta)
    + d log(1 + t / (d lambda))), t = 0, 1, ... the client's own earlier pulls (the code's
    ``for t in range(T)``, L = 1), log det V replaced by its bound for ||x|| <= 1. The code has
    lambda = 1, S = 1, no sigma (its noise is N(0, 1)) and delta = 1/T: set ``delta`` for that."""

    radius: RadiusChoice = "self_normalized"


def model_groups(spec: ProblemSpec, model: str) -> np.ndarray:
    """group[k]: which ridge model arm k uses."""
    shared = spec.shared_parameter if model == "auto" else model == "shared"
    if shared:
        return np.zeros(spec.num_arms, dtype=np.int64)
    return np.arange(spec.num_arms, dtype=np.int64)


class RidgePolicy:
    """Selection and update rules of one LinUCB-family member for a group of clients."""

    def __init__(
        self,
        spec: ProblemSpec,
        params: RidgeParams,
        rule: RadiusRule,
        schedule: DeltaSchedule,
        num_clients: int,
        count_from: int | None = None,
    ) -> None:
        self.params, self.rule, self.schedule = params, rule, schedule
        #: None: ``rule``; an integer c: the count-based radius (``count_radius``) with n = the
        #: client's earlier pulls + c (the H-LinUCB authors' baselines: ``hlinucb_code``).
        self.count_from = count_from
        self.group = model_groups(spec, params.model)
        self.sigma = params.noise_sigma if params.noise_sigma is not None else spec.noise_sigma
        self.learners = RidgeLearners(
            num_clients,
            int(self.group.max()) + 1,
            spec.dim,
            params.regularization,
            params.refresh_every,
        )
        self.steps = np.zeros(num_clients, dtype=np.int64)

    def select(self, contexts: np.ndarray) -> np.ndarray:
        if self.count_from is not None:
            counts = np.broadcast_to(
                (self.steps + self.count_from)[:, None], self.learners.logdet.shape
            )
            rad = count_radius(
                counts,
                self.learners.dim,
                self.params.regularization,
                self.sigma,
                self.params.theta_bound,
                self.params.delta,
            )
            return self.learners.select(contexts, self.group, rad)
        rad = radius(
            self.rule,
            self.learners,
            self.steps + 1,
            alpha=self.params.alpha,
            sigma=self.sigma,
            theta_bound=self.params.theta_bound,
            delta=self.params.delta,
            schedule=self.schedule,
        )
        return self.learners.select(contexts, self.group, rad)

    def observed(
        self, contexts: np.ndarray, active: np.ndarray, arms: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The active clients' pulls as (rows, groups, contexts pulled); counts their steps."""
        rows = np.flatnonzero(active) if not active.all() else np.arange(len(active))
        x = contexts[rows, arms[rows]]
        groups = self.group[arms[rows]]
        self.steps += active
        return rows, groups, x

    def update(
        self, contexts: np.ndarray, active: np.ndarray, arms: np.ndarray, rewards: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Learn from the active clients' pulls; returns (rows, groups, contexts pulled)."""
        rows, groups, x = self.observed(contexts, active, arms)
        self.learners.update(rows, groups, x, rewards[rows])
        return rows, groups, x


#: The state of a ``RidgePolicy`` held as ``policy`` by a client logic.
POLICY_STATE = (
    "policy.steps",
    "policy.learners.gram",
    "policy.learners.inverse",
    "policy.learners.target",
    "policy.learners.theta",
    "policy.learners.logdet",
    "policy.learners.updates",
)


class LocalRidgeClient(ClientLogic):
    """Every client of the group runs its own learner over all rounds, vectorised."""

    STATE = POLICY_STATE

    env: ContextualEnvironment

    def __init__(
        self,
        spec: ProblemSpec,
        params: RidgeParams,
        rule: RadiusRule,
        schedule: DeltaSchedule,
        env: ContextualEnvironment,
    ) -> None:
        super().__init__(env)
        hlinucb_code = isinstance(params, OFULParams) and params.radius == "hlinucb_code"
        self.policy = RidgePolicy(
            spec, params, rule, schedule, env.num_clients, count_from=0 if hlinucb_code else None
        )

    def handle(self, message: Message) -> Message:
        if message.kind != "start":
            raise ValueError(f"unknown message kind {message.kind!r} for a local learner")
        for _ in range(self.env.horizon):
            contexts, active = self.env.observe()
            arms = self.policy.select(contexts)
            rewards = self.env.pull(arms)
            self.policy.update(contexts, active, arms, rewards)
        return Message(
            "done", message.round, message.client_ids, {}, meta={"pulls": self.env.pulls.copy()}
        )


def local_ridge_spec(
    name: str,
    description: str,
    rule: RadiusRule,
    schedule: DeltaSchedule,
    params: type[RidgeParams] = RidgeParams,
    citation: str = "",
) -> AlgorithmSpec[Any]:
    """The registry entry of a local (no communication) ridge learner with ``rule`` (and the
    BibTeX of its paper)."""
    return AlgorithmSpec(
        name=name,
        description=description,
        params=params,
        make_server=lambda spec, params: NoCommunicationServer(spec),
        make_client=lambda spec, params, env: LocalRidgeClient(
            spec, params, rule, schedule, environment_of(env, ContextualEnvironment)
        ),
        contextual=True,
        citation=citation,
    )


#: Declared in ``setup.cfg`` under ``fedbandit.algorithms``.
LINUCB_D = local_ridge_spec(
    "linucb_d",
    "LinUCB-d: self-normalised radius, delta_t = 1/t^2 (Wu et al. 2020)",
    "self_normalized",
    "inverse_square",
    citation=citations.LINUCB_D,
)
LINUCB = local_ridge_spec(
    "linucb",
    "LinUCB with a fixed alpha (Li et al. 2010), per client",
    "fixed",
    "constant",
    citation=citations.LINUCB,
)
OFUL = local_ridge_spec(
    "oful",
    "OFUL: self-normalised radius, constant delta (Abbasi-Yadkori 2011)",
    "self_normalized",
    "constant",
    OFULParams,
    citation=citations.OFUL,
)
GREEDY = local_ridge_spec(
    "greedy", "Ridge estimates without an exploration bonus, per client", "zero", "constant"
)
