"""Federated LinUCB on a fixed batch schedule, without and with differential privacy (Zhou &
Chowdhury, "On Differentially Private Federated Linear Contextual Bandits", ICLR 2024, arXiv
2302.13945; their experiment code ``Alphasxd/DPLCB``, ``Agents.py``).

Every client acts every round; at the end of each batch of B rounds (``batch_size``, the
authors' ``BatchSize`` = 25) every client uploads, and every client downloads the server's
statistics before it acts again. The schedule is fixed in advance: the authors show that a
data-dependent trigger (as FedUCB's log-det rule, Dubey & Pentland 2020) leaks through the sync
times themselves.

- ``batched_fedlinucb``: the non-private reference of their experiments (``FedLinUCB``): uploads
  are the clean batch statistics.
- ``private_fedlinucb``: silo-level local DP by the binary-tree Gaussian mechanism
  (``LDPFedLinUCB``; ``privacy_model = "shuffle"``: noise for a server that sees only the silos'
  sum, whose epsilon is the headline only when the uploads really arrived as secure sums, else
  ``epsilon_local``: ``fedbandit.privacy``). Features are clipped to ||x|| <= ``feature_bound``
  and rewards to [-``reward_bound``, ``reward_bound``] before they enter any statistic; each
  silo sends its run totals of clipped values once, in the last round, and the sum is reported
  in the seed's JSON (``report``, with ``privacy.server_sees``: every field the server saw).

Both send a silo's tree node (the sum of its last 2^l batches, l the trailing zero bits of the
batch number) and the server answers with the prefix sum over all batches so far, summed over its
levels' nodes, so that the only differences between them are the noise, the clipping and the
regularisation. A client decides with V = lambda I + (downloaded prefix) + its own batch so far,
b likewise (``Agents.py``, ``FedLinUCB.get_arm``; for ``private_fedlinucb`` with ``decisions =
"noisy_only"``, the default, V = lambda I + (downloaded prefix) only, see ``PrivateParams``), by
the index
x^T theta + beta_t ||x||_{V^{-1}} with the authors' width
beta_t = c (sqrt(lambda) S + R sqrt(d log(1 + t M L^2 / (d lambda)) + log(1/alpha)))
(``confidence_ellipsoid_width``), t the round. lambda: sqrt(M) for ``batched_fedlinucb``;
sqrt(M N) sigma (sqrt(N + ln(1/alpha)) + sqrt(d)) for ``private_fedlinucb`` (the shift that keeps
the noisy Gram invertible, sigma the noise of one silo).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Literal

import numpy as np
from pydantic import Field

from fedbandit.algorithms import citations
from fedbandit.algorithms.base import AlgorithmSpec, Hyperparameters, ProblemSpec, environment_of
from fedbandit.algorithms.linucb import model_groups
from fedbandit.contextual.environment import ContextualEnvironment
from fedbandit.contextual.ridge import RidgeLearners
from fedbandit.errors import ConfigError
from fedbandit.federation.messages import Message, broadcast
from fedbandit.federation.protocol import ClientLogic, ServerLogic, remove_clients
from fedbandit.privacy import (
    BOUND_RANGE,
    DELTA_RANGE,
    EPSILON_RANGE,
    PrivacyModel,
    TreeAccounting,
    clip_norms,
    clip_values,
    prefix_levels,
    regularization_shift,
    require_finite,
    symmetric_noise,
    tree_accounting,
    tree_depth,
    tree_level,
)
from fedbandit.rng import PRIVACY_DOMAIN, client_generators
from fedbandit.state import (
    generators_from_arrays,
    generators_to_arrays,
    strip_prefix,
    with_prefix,
)

#: What a private silo decides with inside a batch (``PrivateParams.decisions``).
Decisions = Literal["noisy_only", "authors"]


class BatchedParams(Hyperparameters):
    """Hyperparameters of ``batched_fedlinucb`` (defaults: the authors' ``Fed_Lin_Bandit.py``).

    - ``batch_size``: B, rounds per batch (25).
    - ``confidence``: alpha, the failure probability in the width (0.01).
    - ``width_scale``: c, scales the width (``crs``: 1 on synthetic data, 0.1 on MSLR).
    - ``theta_bound``: S, a bound on ||theta||; default sqrt(d) (the authors').
    - ``feature_bound``: L, a bound on ||x|| in the width (1, the authors').
    - ``noise_sigma``: R, the reward noise level in the width; default the instance's.
    - ``regularization``: lambda; default sqrt(M) (the authors' ``FedLinUCB``).
    - ``model``: disjoint per-arm models, one shared model, or auto (as the LinUCB family).
    - ``refresh_every``: rounds between exact recomputations of V^{-1} from V.
    """

    batch_size: int = Field(25, ge=1)
    confidence: float = Field(0.01, gt=0, lt=1)
    width_scale: float = Field(1.0, ge=0)
    theta_bound: float | None = Field(None, ge=0)
    feature_bound: float = Field(1.0, gt=0)
    noise_sigma: float | None = Field(None, gt=0)
    regularization: float | None = Field(None, gt=0)
    model: Literal["auto", "disjoint", "shared"] = "auto"
    refresh_every: int = Field(1024, ge=1)


class PrivateParams(BatchedParams):
    """Hyperparameters of ``private_fedlinucb``: those of ``batched_fedlinucb`` and

    - ``epsilon``, ``delta``: the target guarantee per user of each silo over the whole run
      (required; finite, epsilon in ``EPSILON_RANGE`` = [1e-3, 1e3], delta in ``DELTA_RANGE``
      = [1e-15, 1), and the accountant's answer for the run finite).
    - ``feature_bound`` (L) and ``reward_bound`` (R): clipping bounds, which fix the sensitivity
      (required; finite, in ``BOUND_RANGE`` = [1e-6, 1e6]).
    - ``privacy_model``: ``silo_ldp`` (each silo's release is private on its own) or ``shuffle``
      (noise calibrated for a server that sees only the sum over silos: the reported epsilon
      is the sum model's only when every upload arrived as a secure sum, else
      ``epsilon_local``).
    - ``regularization``: default the authors' shift sqrt(M N) sigma (sqrt(N + ln(1/alpha)) +
      sqrt(d)).
    - ``decisions``: what a silo decides with inside a batch. ``noisy_only`` (default): the last
      noisy download alone (V = lambda I + prefix, b = prefix), so a round's (x, r) enters the
      released nodes only as itself and the declared sensitivity holds: the variant the privacy
      analysis needs. ``authors``: the download plus the silo's own clean statistics of the batch
      so far (``Agents.py``); later arms of a batch then depend on its earlier rewards, and the
      guarantee holds only if the data within a batch is taken as non-adaptive (the report says
      so).
    - ``noise``: false releases the clean statistics (for testing only: no guarantee).
    """

    epsilon: float = Field(ge=EPSILON_RANGE[0], le=EPSILON_RANGE[1], allow_inf_nan=False)
    delta: float = Field(ge=DELTA_RANGE[0], lt=DELTA_RANGE[1], allow_inf_nan=False)
    feature_bound: float = Field(  # required here
        ge=BOUND_RANGE[0], le=BOUND_RANGE[1], allow_inf_nan=False
    )
    reward_bound: float = Field(ge=BOUND_RANGE[0], le=BOUND_RANGE[1], allow_inf_nan=False)
    privacy_model: PrivacyModel = "silo_ldp"
    decisions: Decisions = "noisy_only"
    noise: bool = True


#: Measured: with the authors' in-batch rule, negating one reward moved the released node by up to
#: this many times the declared sensitivity (40 trials, 72% of them changed later arms).
AUTHORS_RULE_FACTOR = 4.8


def within_batch(decisions: Decisions) -> str:
    """What the guarantee assumes of the data inside a batch, for the privacy report."""
    if decisions == "noisy_only":
        return (
            "decisions inside a batch use only the last noisy download: a round's (x, r) "
            "enters the released nodes only as itself, so the declared sensitivity holds"
        )
    return (
        "decisions inside a batch also use the silo's own clean statistics of the batch "
        "(the authors' rule): later arms of a batch depend on its earlier rewards, so the "
        "epsilon assumes non-adaptive data within a batch; measured, negating one reward moved "
        f"the released node by up to {AUTHORS_RULE_FACTOR}x the declared sensitivity "
        '(decisions = "noisy_only" makes the guarantee hold)'
    )


def _accounting(spec: ProblemSpec, params: BatchedParams, report: bool) -> TreeAccounting | None:
    """The tree's noise and guarantee of a private run (None for the non-private reference)."""
    if not isinstance(params, PrivateParams):
        return None
    accounting = tree_accounting(
        params.privacy_model,
        params.epsilon,
        params.delta,
        spec.horizon // params.batch_size,
        spec.num_clients,
        params.feature_bound,
        params.reward_bound,
        report,
    )
    spent = {"noise_multiplier": accounting.noise_multiplier, "silo_sigma": accounting.silo_sigma}
    if report:
        spent |= {"epsilon": accounting.epsilon, "epsilon_local": accounting.epsilon_local}
    require_finite("private_fedlinucb", params.epsilon, params.delta, spent)
    return accounting


def disclosures(summed: bool) -> list[dict[str, str]]:
    """What the server of ``private_fedlinucb`` sees, field by field: who sends it, when, in what
    form, and whether the guarantee covers it (the privacy report's ``server_sees``)."""
    return [
        {
            "field": "gram_node, target_node",
            "when": "each batch's last round (every batch_size rounds)",
            "seen": "their sum over the silos that answered (secure aggregation)"
            if summed
            else "per silo",
            "guarantee": "inside: the noisy tree node the accounting is about",
        },
        {
            "field": "meta.pulls",
            "when": "every round",
            "seen": "per silo, in the clear",
            "guarantee": "outside, data-independent: the rounds a silo has played",
        },
        {
            "field": "meta.clipped_features, meta.clipped_rewards",
            "when": "once, in the run's last round",
            "seen": "per silo, in the clear: the run's totals",
            "guarantee": "outside: how many of the silo's values left their bounds",
        },
        {
            "field": "reply kind (step or upload) and timing",
            "when": "every round",
            "seen": "per silo",
            "guarantee": "outside, data-independent: the fixed batch schedule",
        },
        {
            "field": "regret record",
            "when": "once, at the end",
            "seen": "per silo, in the clear",
            "guarantee": "outside: the simulation's true regret, a measurement that a silo with "
            "real data would not have",
        },
    ]


def adds_noise(params: BatchedParams) -> bool:
    """Whether the silos add the tree's noise to their releases (``private_fedlinucb`` unless
    ``noise = false``)."""
    return isinstance(params, PrivateParams) and params.noise


def _check_batches(spec: ProblemSpec, params: BatchedParams) -> int:
    batches = spec.horizon // params.batch_size
    if batches < 1:
        raise ConfigError(
            f"batch_size {params.batch_size} is longer than the horizon {spec.horizon}: no batch "
            "would ever be synchronised (choose batch_size <= horizon)"
        )
    return batches


def _regularization(
    spec: ProblemSpec, params: BatchedParams, accounting: TreeAccounting | None
) -> float:
    """lambda: the given value, else sqrt(M) (non-private) or the authors' noise shift."""
    if params.regularization is not None:
        return params.regularization
    if accounting is None:
        return math.sqrt(spec.num_clients)
    return regularization_shift(
        accounting.silo_sigma,
        spec.num_clients,
        accounting.compositions,
        spec.dim,
        params.confidence,
    )


def confidence_width(
    step: int,
    *,
    regularization: float,
    theta_bound: float,
    noise_sigma: float,
    feature_bound: float,
    num_clients: int,
    dim: int,
    confidence: float,
    width_scale: float,
) -> float:
    """beta_t = c (sqrt(lambda) S + R sqrt(d log(1 + t M L^2 / (d lambda)) + log(1/alpha)))
    (``Agents.py``, ``FedLinUCB.confidence_ellipsoid_width``)."""
    growth = dim * math.log(1.0 + step * num_clients * feature_bound**2 / (dim * regularization))
    return width_scale * (
        math.sqrt(regularization) * theta_bound
        + noise_sigma * math.sqrt(growth + math.log(1.0 / confidence))
    )


class BatchedLinUCBClient(ClientLogic):
    """A group of silos: decide on lambda I + the last download + the own batch so far; at the end
    of a batch, upload the tree node it closes (noisy, for ``private_fedlinucb``)."""

    STATE = (
        "learners.gram",
        "learners.inverse",
        "learners.target",
        "learners.theta",
        "learners.logdet",
        "learners.updates",
        "batch_gram",
        "batch_target",
        "node_gram",
        "node_target",
        "clipped_features",
        "clipped_rewards",
    )

    env: ContextualEnvironment

    def __init__(
        self, spec: ProblemSpec, params: BatchedParams, env: ContextualEnvironment
    ) -> None:
        super().__init__(env)
        self.spec, self.params = spec, params
        self.num_batches = _check_batches(spec, params)
        self.accounting = _accounting(spec, params, report=False)
        self.private = isinstance(params, PrivateParams)
        self.noisy = adds_noise(params)
        # The authors' rule learns from the own batch as it goes; "noisy_only" waits for the
        # next download.
        self.own_batch = not isinstance(params, PrivateParams) or params.decisions == "authors"
        self.group = model_groups(spec, params.model)
        n, G, d = env.num_clients, int(self.group.max()) + 1, spec.dim
        depth = tree_depth(self.num_batches)
        self.regularization = _regularization(spec, params, self.accounting)
        self.learners = RidgeLearners(n, G, d, self.regularization, params.refresh_every)
        self.batch_gram = np.zeros((n, G, d, d))
        self.batch_target = np.zeros((n, G, d))
        self.node_gram = np.zeros((n, depth, G, d, d))
        self.node_target = np.zeros((n, depth, G, d))
        self.clipped_features = np.zeros(n, dtype=np.int64)
        self.clipped_rewards = np.zeros(n, dtype=np.int64)
        self.noise_rngs = client_generators(env.entropy, env.client_ids, PRIVACY_DOMAIN)
        sigma = params.noise_sigma if params.noise_sigma is not None else spec.noise_sigma
        theta_bound = params.theta_bound if params.theta_bound is not None else math.sqrt(d)
        self._width = functools.partial(
            confidence_width,
            regularization=self.regularization,
            theta_bound=theta_bound,
            noise_sigma=sigma,
            feature_bound=params.feature_bound,
            num_clients=spec.num_clients,
            dim=d,
            confidence=params.confidence,
            width_scale=params.width_scale,
        )

    def state_dict(self) -> dict[str, np.ndarray]:
        return {
            **super().state_dict(),
            **with_prefix("noise_rng.", generators_to_arrays(self.noise_rngs)),
        }

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        super().load_state_dict(state)
        self.noise_rngs = generators_from_arrays(strip_prefix("noise_rng.", state))

    def handle(self, message: Message) -> Message:
        if message.kind != "round":
            raise ValueError(f"unknown message kind {message.kind!r} for {type(self).__name__}")
        if "gram" in message.fields:
            rows = np.flatnonzero(message.fields["receive"].any(axis=1))
            eye = self.regularization * np.eye(self.spec.dim)
            self.learners.set_view(
                rows,
                self.batch_gram[rows] + message.fields["gram"][rows] + eye,
                self.batch_target[rows] + message.fields["target"][rows],
            )
        contexts, active = self.env.observe()
        width = self._width(self.env.round + 1)
        radius = np.full(self.learners.logdet.shape, width)
        arms = self.learners.select(contexts, self.group, radius)
        rewards = self.env.pull(arms)
        rows = np.flatnonzero(active) if not active.all() else np.arange(len(active))
        x, r = contexts[rows, arms[rows]], rewards[rows]
        if self.private:
            params = self.params
            assert isinstance(params, PrivateParams)
            x, features_clipped = clip_norms(x, params.feature_bound)
            r, rewards_clipped = clip_values(r, params.reward_bound)
            self.clipped_features[rows] += features_clipped
            self.clipped_rewards[rows] += rewards_clipped
        groups = self.group[arms[rows]]
        if self.own_batch:
            self.learners.update(rows, groups, x, r)
        self.batch_gram[rows, groups] += x[:, :, None] * x[:, None, :]
        self.batch_target[rows, groups] += r[:, None] * x
        meta = {"pulls": self.env.pulls.copy()}
        if self.private and self.env.round >= self.env.horizon:  # run totals, once at the end
            meta["clipped_features"] = self.clipped_features.copy()
            meta["clipped_rewards"] = self.clipped_rewards.copy()
        batch, ends = divmod(self.env.round, self.params.batch_size)
        if ends or batch > self.num_batches:
            return Message("step", message.round, message.client_ids, {}, meta=meta)
        return Message("upload", message.round, message.client_ids, self._release(batch), meta=meta)

    def _release(self, batch: int) -> dict[str, np.ndarray]:
        """Close the tree node of ``batch``: alpha_l = (nodes below l) + this batch, plus (private)
        fresh noise from each silo's own stream; the batch starts anew (``LDPFedLinUCB.update``)."""
        level = tree_level(batch)
        self.node_gram[:, level] = self.node_gram[:, :level].sum(axis=1) + self.batch_gram
        self.node_target[:, level] = self.node_target[:, :level].sum(axis=1) + self.batch_target
        gram, target = self.node_gram[:, level].copy(), self.node_target[:, level].copy()
        if self.noisy:
            assert self.accounting is not None
            sigma = self.accounting.silo_sigma
            for row, rng in enumerate(self.noise_rngs):
                gram[row] += symmetric_noise(rng, sigma, gram.shape[1:])
                target[row] += rng.normal(0.0, sigma, target.shape[1:])
        self.batch_gram[:] = 0.0
        self.batch_target[:] = 0.0
        return {"gram_node": gram, "target_node": target}

    def quiet(self, reply: Message) -> bool:
        """A round inside a batch: the server only sends the next empty round. The last round is
        never quiet, so the server receives the clipping counts (sent then only: per round they
        would tell the server which round had a value out of bounds)."""
        return reply.kind == "step" and self.env.round < self.env.horizon

    def steps_left(self) -> int:
        return int(self.env.horizon - self.env.round)

    def uploads_next(self) -> bool:
        """The next round closes a batch: its reply carries the batch's tree node."""
        batch, ends = divmod(int(self.env.round) + 1, self.params.batch_size)
        return ends == 0 and batch <= self.num_batches


class BatchedLinUCBServer(ServerLogic):
    """Sums the silos' tree nodes per level; after batch k it sends every client the prefix sum
    over batches 1..k (the nodes at the set bits of k), before anyone acts again.

    Dropped clients are no longer addressed; their nodes already summed stay in the tree."""

    def __init__(self, spec: ProblemSpec, params: BatchedParams) -> None:
        self.spec, self.params = spec, params
        self.num_batches = _check_batches(spec, params)
        self.accounting = _accounting(spec, params, report=True)
        G = int(model_groups(spec, params.model).max()) + 1
        d = spec.dim
        self.depth = tree_depth(spec.horizon // params.batch_size)
        self.tree_gram = np.zeros((self.depth, G, d, d))
        self.tree_target = np.zeros((self.depth, G, d))
        self.gram = np.zeros((G, d, d))
        self.target = np.zeros((G, d))
        self.batch = 0
        self.download = False
        self.rounds_done = 0
        self.clients = spec.client_ids.copy()
        self.clipped = np.zeros((spec.num_clients, 2), dtype=np.int64)
        self.clear_uploads = 0  # uploads that reached the server per silo
        self.summed_silos: list[int] = []  # the silos in each secure sum, by batch
        self.lost: dict[int, int] = {}  # silo -> the round it was lost in

    def configure(self) -> Message | None:
        ids = self.clients
        if len(ids) == 0 or self.rounds_done >= self.spec.horizon:
            return None
        self.rounds_done += 1
        if not self.download:
            return Message("round", self.rounds_done - 1, ids, {})
        self.download = False
        n, G = len(ids), self.gram.shape[0]
        return Message(
            "round",
            self.rounds_done - 1,
            ids,
            {
                "gram": broadcast(self.gram, n),
                "target": broadcast(self.target, n),
                "receive": np.ones((n, G), dtype=bool),
            },
            sparse={"gram": "receive", "target": "receive"},
            known=frozenset({"receive"}),
        )

    def secure_sums(self) -> dict[str, frozenset[str]]:
        """The silos' tree nodes are only summed per level (over silos)."""
        return {"round": frozenset({"gram_node", "target_node"})}

    def secure_fields(self, message: Message) -> frozenset[str]:
        """The rounds that close a batch (the clients upload at the end of round k B)."""
        batch, ends = divmod(message.round + 1, self.params.batch_size)
        if message.kind == "round" and ends == 0 and batch <= self.num_batches:
            return super().secure_fields(message)
        return frozenset()

    def secure_contributors(self, message: Message) -> dict[str, np.ndarray] | None:
        """With noise, every silo addressed fills every block of its tree node: each entry gets
        fresh Gaussian noise (non-zero almost surely) whether or not the silo pulled an arm of the
        block's group. Without noise a silo's groups depend on its arms, unknown to the server:
        they are counted."""
        if not (adds_noise(self.params) and self.secure_fields(message)):
            return None
        filled = np.ones((message.num_clients, self.gram.shape[0]), dtype=bool)
        return {"gram_node": filled, "target_node": filled}

    def secure_follows(self, message: Message) -> bool:
        """A batch is closed by a summed upload at round k B - 1, k = 1 .. (batches): one follows
        ``message`` while it comes before the last of them."""
        return message.round < self.num_batches * self.params.batch_size - 1

    def aggregate(self, reply: Message) -> None:
        if reply.round != self.rounds_done - 1:
            raise RuntimeError(f"reply for round {reply.round}, expected {self.rounds_done - 1}")
        if "clipped_features" in reply.meta:
            self.clipped[reply.client_ids, 0] = reply.meta["clipped_features"]
            self.clipped[reply.client_ids, 1] = reply.meta["clipped_rewards"]
        if reply.kind == "step":
            return
        if reply.kind != "upload":
            raise RuntimeError(f"unexpected reply kind {reply.kind!r}")
        if {"gram_node", "target_node"} <= reply.summed:
            self.summed_silos.append(len(reply.client_ids))
        else:
            self.clear_uploads += 1
        self.batch += 1
        level = tree_level(self.batch)
        self.tree_gram[level] = reply.fields["gram_node"].sum(axis=0)
        self.tree_target[level] = reply.fields["target_node"].sum(axis=0)
        levels = prefix_levels(self.batch, self.depth)
        self.gram = self.tree_gram[levels].sum(axis=0)
        self.target = self.tree_target[levels].sum(axis=0)
        self.download = True

    def drop_clients(self, client_ids: np.ndarray) -> None:
        """Stop addressing lost silos; the round each was lost in goes into the privacy report
        (a secure sum after it carries fewer silos' noise)."""
        self.clients = remove_clients(self.clients, client_ids, type(self).__name__)
        for client in np.asarray(client_ids).tolist():
            self.lost[int(client)] = self.rounds_done - 1

    def report(self) -> dict[str, Any]:
        """The guarantee against the server this run had (``TreeAccounting.report``), what that
        server saw (``disclosures``), and how many values the clients clipped (the run totals of
        the silos that reached the last round: a silo lost earlier sends none)."""
        if self.accounting is None or not isinstance(self.params, PrivateParams):
            return {}
        privacy = self.accounting.report(
            self.clear_uploads, self.summed_silos, self.spec.num_clients
        )
        summed = self.clear_uploads == 0 and len(self.summed_silos) > 0
        return {
            "privacy": {
                **privacy,
                "noise": bool(getattr(self.params, "noise", True)),
                "decisions": self.params.decisions,
                "within_batch": within_batch(self.params.decisions),
                "silos_lost": {str(silo): round_ for silo, round_ in sorted(self.lost.items())},
                "server_sees": disclosures(summed),
            },
            "clipped": {
                "features": int(self.clipped[:, 0].sum()),
                "rewards": int(self.clipped[:, 1].sum()),
            },
        }


def _spec(name: str, description: str, params: type[BatchedParams]) -> AlgorithmSpec[Any]:
    return AlgorithmSpec(
        name=name,
        description=description,
        params=params,
        make_server=lambda spec, p: BatchedLinUCBServer(spec, p),
        make_client=lambda spec, p, env: BatchedLinUCBClient(
            spec, p, environment_of(env, ContextualEnvironment)
        ),
        contextual=True,
        citation=citations.PRIVATE_FEDLINUCB,
    )


#: Declared in ``setup.cfg`` under ``fedbandit.algorithms``.
BATCHED_FEDLINUCB = _spec(
    "batched_fedlinucb",
    "FedLinUCB on fixed batches, non-private (Zhou & Chowdhury 2024)",
    BatchedParams,
)
PRIVATE_FEDLINUCB = _spec(
    "private_fedlinucb",
    "Private FedLinUCB: tree-based Gaussian mechanism, silo LDP or shuffle (Zhou & Chowdhury 2024)",
    PrivateParams,
)
