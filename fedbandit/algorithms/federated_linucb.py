"""Federated LinUCB on contextual instances: DisLinUCB, Async-LinUCB, FedLinUCB and a centralised
reference, as server and client logic exchanging ridge statistics.

Every message exchange is one step of the instance's arrival order: the server sends downloads (if
any), every client that acts observes a context, pulls, updates its own statistics, and replies
with uploads (if its trigger fires). In the synchronous order (default) every participating client
acts in a round and uploads are processed at the round's end in client-id order; in the sequential
order (the authors' simulations) one client, drawn uniformly, acts per global step. A download the
server decides after a step travels in the next exchange, before anyone acts again: the authors'
simulations also replace a client's statistics at once, but (``fidelity = "authors_code"``) not
its decisions, which follow at its next own pull. Statistics travel as full d x d matrices plus
d-vectors per parameter group (d^2 + d scalars). "Total interactions" T_total is M T in
synchronous rounds and T (global steps) in the sequential order.

``fidelity`` (DisLinUCB, Async-LinUCB, FedLinUCB): ``"paper"`` (default) runs the papers' rules
with the OFUL index on each client's current view; ``"authors_code"`` reproduces the decisions of
the authors' published code (differences listed in each client class; checked step by step against
transcriptions of that code in ``tests/test_contextual_reference.py``). On the authors' own
sequential setting (``experiments/fed_contextual_published.toml``) the two differ by a factor of
2-3 in regret, with the same communication.

- ``dislinucb`` (Wang, Hu, Chen, Wang, ICLR 2020, Algorithm DisLinUCB; the authors' rule as coded
  by Li & Wang in ``cyrilli/Async-LinUCB``, ``lib/SyncLinUCB.py``, ``syncRoundTriggered``):
  client j triggers a global sync when n_j * log(det V_j / det V_sync) >= D, n_j being j's own
  pulls since the last sync; then every client uploads its unsynced (dV, db) (one extra exchange
  in which nobody pulls) and everyone downloads the new global statistics. D (``threshold_rule``):
  ``simulation`` (default) D = T_total / (M d log T_total), the value of
  ``SimulationHomogeneousClients.py`` (``D2``, "Sync-LinUCB-Match-Regret"), whose T counts global
  steps of one client each: in the sequential order it is the authors' D2 exactly, in the
  synchronous order (T_total = M T) our transposition of it (310 for ``fed_contextual``);
  ``theorem`` D = (T_total / M) log(T_total) / (d M), our transcription of the paper's Theorem 4
  with T = T_total / M steps of M agents (about 2,580 for ``fed_contextual``; regret
  O(d sqrt(M T) log^2 T), O(M^1.5 d^3) scalars). The statement itself could not be checked: only
  the abstract and introduction of arXiv 1904.06309 were reachable (searched again for issue
  22), and the H-LinUCB authors' DisLinUCB (``anhddo/hlinUCB``, ``algo.py``) uses yet another
  value, D = sqrt(T log(M T) / (d M)), T the rounds (give it as ``threshold``), and a
  count-based radius (``radius = "hlinucb_code"``, ``DisLinUCBParams``).
- ``async_linucb`` (Li & Wang, AISTATS 2022; ``cyrilli/Async-LinUCB``, ``lib/AsyncLinUCB.py``):
  client i uploads when det(V_i) / det(V_i - dV_i) > gamma_U (``uploadCommTriggered``); the
  server keeps for each client j a buffer of the *other* clients' uploads since j's last download
  and pushes to j when det(V_global) / det(V_global - buffer_j) > gamma_D
  (``downloadCommTriggered``, checked after every upload).
- ``fedlinucb`` (He, Wang, Min, Gu, NeurIPS 2022; ``uclaml/FedLinUCB``, ``M-15/Federated.py``,
  the "Our-rare" loop): the estimate and the UCB width come from the last download
  (Sigma_down, b_down) only; local data enters only the trigger
  det(Sigma_down + dSigma) > (1 + alpha) det(Sigma_down), on which the client uploads and then
  downloads. ``paper``: Sigma_down starts at lambda I. The authors' SIGMADOW starts at 0
  (``authors_code``): a client plays arm 0 until its first sync, which fires when
  det(SIGMALOC) > 0 (full rank in exact arithmetic, floating-point round-off in practice).
- ``central_linucb``: every client uploads each sample (x, r, arm) and downloads the global
  statistics every round: the fully shared reference.

The decision rule (``paper``) is LinUCB with the self-normalised radius (OFUL) on the client's
decision view, for every protocol, so that only the communication rules differ; ``authors_code``
uses the authors' widths (a fixed 0.5 in FedLinUCB's script, Li & Wang's ``alpha_t`` from sample
counts).

Each protocol is one server and one client class over ``FederatedRidgeServerBase`` and
``FederatedRidgeClientBase`` (the round, upload and download machinery); its rules are the hooks
they override (``_receive`` and ``_interim`` on the server, ``_reply`` and ``_uploaded`` on the
client).
"""

from __future__ import annotations

import dataclasses
import math
from abc import abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Literal, TypeVar

import numpy as np
from pydantic import Field, model_validator

from fedbandit.algorithms import citations
from fedbandit.algorithms.base import AlgorithmSpec, ProblemSpec, environment_of
from fedbandit.algorithms.linucb import (
    POLICY_STATE,
    RadiusChoice,
    RidgeParams,
    RidgePolicy,
    model_groups,
)
from fedbandit.contextual.environment import ContextualEnvironment, total_interactions
from fedbandit.contextual.ridge import count_radius
from fedbandit.federation.messages import Message, broadcast
from fedbandit.federation.protocol import ClientLogic, ServerLogic, remove_clients

Fidelity = Literal["paper", "authors_code"]

#: The authors' ``totalCommCost`` rule per protocol, as the seed's report names it.
AUTHORS_RULES = {
    "dislinucb": "cyrilli/FedGLB-UCB lib/DisLinUCB.py: d^2 + d + 1 scalars per client reached, "
    "up and down, per sync",
    "async_linucb": "cyrilli/Async-LinUCB lib/AsyncLinUCB.py: 1 per upload, 1 per download "
    "(messages, not scalars)",
}


class FidelityParams(RidgeParams):
    """``fidelity``: ``"paper"`` (default): the papers' rules with our decision rule (the OFUL
    index on the client's current view: a download counts at the client's next decision);
    ``"authors_code"``: the decisions of the authors' published code, which differ as listed in
    the docstrings of the protocols' client classes. Keys the authors' code sets differently
    (``AUTHORS_DEFAULTS``) take its values there unless given."""

    fidelity: Fidelity = "paper"
    #: The authors' code's values, used with ``fidelity = "authors_code"`` where a key is not given.
    AUTHORS_DEFAULTS: ClassVar[dict[str, Any]] = {}

    @model_validator(mode="before")
    @classmethod
    def _authors_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("fidelity") == "authors_code":
            return {**cls.AUTHORS_DEFAULTS, **data}
        return data


#: ``width`` of ``dislinucb`` and ``async_linucb``: ``"adaptive"`` or a fixed positive number.
Width = float | Literal["adaptive"]


class LiWangWidthParams(FidelityParams):
    """``width``: the confidence width of the decisions with ``fidelity = "authors_code"``.
    ``"adaptive"`` (default): the code's ``alpha_t`` = sigma sqrt(d log(1 + n / (d lambda)) +
    2 log(1/delta)) + sqrt(lambda), n the samples in the client's statistics (``count_radius``),
    as the code computes it when its ``alpha`` is None or -1 (the simulations:
    ``SimulationHomogeneousClients.py``). A positive number: that fixed width, as the real-data
    scripts set ``alpha = 0.3`` (``cyrilli/FedGLB-UCB``, ``RunRealworldDataset.py``:199
    ``alpha_linear``, for ``lib/DisLinUCB.py``; ``cyrilli/Async-LinUCB``,
    ``SimulationRealworldData.py``:247 ``config["alpha"]``, for ``lib/SyncLinUCB.py`` and
    ``lib/AsyncLinUCB.py``): the UCB is x^T theta + width ||x||_{V^-1}. Only with
    ``authors_code``; the paper mode keeps the OFUL radius."""

    width: Width = "adaptive"

    @model_validator(mode="after")
    def _width_needs_authors_code(self) -> LiWangWidthParams:
        if isinstance(self.width, float) and not (0 < self.width < math.inf):
            raise ValueError(f"width must be a positive number or 'adaptive', got {self.width}")
        if self.width != "adaptive" and self.fidelity != "authors_code":
            raise ValueError(
                f"width = {self.width} is the authors' scripts' fixed width: it needs "
                'fidelity = "authors_code" (the paper mode keeps the adaptive radius)'
            )
        return self


class DisLinUCBParams(LiWangWidthParams):
    """``threshold``: D of the sync trigger; default (None) by ``threshold_rule``: ``simulation``
    T_total / (M d log T_total) (the authors' simulations' ``D2``; in the synchronous order, where
    T_total = M T, this is our transposition of it: 310 for ``fed_contextual``, whose Theorem 4
    value is about 2,580), ``theorem`` (T_total / M) log(T_total) / (d M) (the paper's Theorem 4),
    T_total the total number of interactions (M T in synchronous rounds, T in the sequential
    order). 0 syncs every round (the centralised learner); inf never syncs (local learners).
    ``authors_code``: lambda = 0.1 (``SimulationHomogeneousClients.py``).

    ``radius``: ``"self_normalized"`` (default): the OFUL radius sqrt(lambda) S + sigma
    sqrt(2 log(1/delta) + log det V - d log lambda) on the client's view. ``"hlinucb_code"``: the
    DisLinUCB baseline of the H-LinUCB authors (``anhddo/hlinUCB``, ``algo.py``:28-29
    ``sqrt_beta``, called at :109 from ``dis_lin_ucb``, :87-127): sqrt(lambda) S + sigma
    sqrt(2 log(1/delta) + d log(1 + t / (d lambda))), t = 1, 2, ... the round, which in their
    loop (every client acts every round) is the client's own pulls including this one: one
    client's count, although the view holds every client's synced samples. The code has
    lambda = 1, S = 1, no sigma (N(0, 1) noise), delta = 1 / (M T): set ``delta``. Only the
    radius: their sync rule (checked mid-round, the triggering sample kept out of the sync) is
    not ours. Not with ``fidelity = "authors_code"`` (cyrilli's code, which has its own width)."""

    threshold: float | None = Field(None, ge=0)
    threshold_rule: Literal["simulation", "theorem"] = "simulation"
    delta: float = Field(0.1, gt=0, lt=1)
    radius: RadiusChoice = "self_normalized"
    AUTHORS_DEFAULTS: ClassVar[dict[str, Any]] = {"regularization": 0.1}

    @model_validator(mode="after")
    def _one_code(self) -> DisLinUCBParams:
        if self.radius == "hlinucb_code" and self.fidelity == "authors_code":
            raise ValueError(
                'radius = "hlinucb_code" (anhddo/hlinUCB) cannot be combined with '
                'fidelity = "authors_code" (cyrilli/Async-LinUCB, its own width): '
                'use fidelity = "paper" with it'
            )
        return self


class AsyncParams(LiWangWidthParams):
    """``upload_ratio`` gamma_U and ``download_ratio`` gamma_D (>= 1): determinant ratios that
    trigger an upload and a server push (Async-LinUCB; 1 uploads on every pull that grows the
    determinant, as the authors' ``gamma=1``). Our default: 2 for both. ``authors_code``:
    lambda = 0.1 (``SimulationHomogeneousClients.py``)."""

    upload_ratio: float = Field(2.0, ge=1)
    download_ratio: float = Field(2.0, ge=1)
    delta: float = Field(0.1, gt=0, lt=1)
    AUTHORS_DEFAULTS: ClassVar[dict[str, Any]] = {"regularization": 0.1}


class FedLinUCBParams(FidelityParams):
    """``communication_alpha``: a client syncs when det(V_down + dV) > (1 + alpha) det(V_down).
    Our default: 1 (the determinant doubles). ``authors_code``: the fixed width ``alpha`` = 0.5
    (``beta`` of ``M-15/Federated.py``), lambda = 1 as there."""

    communication_alpha: float = Field(1.0, gt=0)
    delta: float = Field(0.1, gt=0, lt=1)
    AUTHORS_DEFAULTS: ClassVar[dict[str, Any]] = {"alpha": 0.5}


class CentralParams(RidgeParams):
    delta: float = Field(0.1, gt=0, lt=1)


#: What a client group keeps besides the paper mode's state with ``fidelity = "authors_code"``.
AUTHORS_STATE = ("view_count", "decision_inverse", "decision_theta", "decision_radius")


def _logdet(gram: np.ndarray) -> np.ndarray:
    """log det, summed over the parameter groups: (..., G, d, d) -> (...)."""
    return np.linalg.slogdet(gram)[1].sum(axis=-1)


class FederatedRidgeClientBase(ClientLogic):
    """A group of clients running LinUCB on their views (lambda I + the last download + their own
    data not yet uploaded). Each round: take the download, if any, then observe, pull and learn;
    ``_reply`` (the protocol's upload rule) says what goes back."""

    STATE: tuple[str, ...] = (
        *POLICY_STATE,
        "pending_gram",
        "pending_target",
        "pending_count",
        "reference_logdet",
        "since_sync",
    )

    env: ContextualEnvironment

    def __init__(self, spec: ProblemSpec, params: RidgeParams, env: ContextualEnvironment) -> None:
        super().__init__(env)
        self.spec, self.params = spec, params
        n = env.num_clients
        self.policy = RidgePolicy(spec, params, "self_normalized", "constant", n)
        learners = self.policy.learners
        self.pending_gram = np.zeros_like(learners.gram)
        self.pending_target = np.zeros_like(learners.target)
        self.pending_count = np.zeros(learners.logdet.shape, dtype=np.int64)
        # log det of the view when it last equalled the shared statistics (sync or download)
        self.reference_logdet = learners.logdet.sum(axis=1).copy()
        self.since_sync = np.zeros(n, dtype=np.int64)
        self.authors_code = getattr(params, "fidelity", "paper") == "authors_code"
        if self.authors_code:
            # The authors' LocalClient decides on AInv, UserTheta and alpha_t as of its last own
            # pull (``localUpdate``): a download changes its statistics (and so its triggers) at
            # once, its decisions only after its next own pull. alpha_t counts the samples in
            # the client's statistics (``numObs_local``), which travel with the statistics.
            self.view_count = np.zeros(learners.logdet.shape, dtype=np.int64)
            self.decision_inverse = learners.inverse.copy()
            self.decision_theta = learners.theta.copy()
            self.decision_radius = self._decision_radius(np.arange(n))
            self.STATE = (*type(self).STATE, *AUTHORS_STATE)

    def _decision_radius(self, rows: np.ndarray) -> np.ndarray:
        """authors_code: the width of the ``rows``' decisions, (len(rows), G): Li & Wang's
        ``alpha_t`` from the samples in each client's statistics (``count_radius``), or the
        fixed ``width`` the real-data scripts set (``LiWangWidthParams``)."""
        learners = self.policy.learners
        width = getattr(self.params, "width", "adaptive")
        if width != "adaptive":
            return np.full((len(rows), learners.logdet.shape[1]), float(width))
        return count_radius(
            self.view_count[rows],
            learners.dim,
            learners.regularization,
            self.policy.sigma,
            self.params.theta_bound,
            self.params.delta,
        )

    def _snapshot(self, rows: np.ndarray) -> None:
        """authors_code: the ``rows``' decisions from now on use their current view."""
        learners = self.policy.learners
        self.decision_inverse[rows] = learners.inverse[rows]
        self.decision_theta[rows] = learners.theta[rows]
        self.decision_radius[rows] = self._decision_radius(rows)

    def _pulled(self, rows: np.ndarray, groups: np.ndarray) -> None:
        """authors_code, after the ``rows``' own pulls: the sample joins the count of the view,
        and the decision snapshot is taken (``LocalClient.localUpdate``)."""
        self.view_count[rows, groups] += 1
        self._snapshot(rows)

    def _select(self, contexts: np.ndarray) -> np.ndarray:
        """The arms: the OFUL index on the current view, or (authors_code) the snapshot's."""
        if not self.authors_code:
            return self.policy.select(contexts)
        from fedbandit.contextual.kernels import select_arms  # numba: compiled on first use

        arms = np.empty(len(contexts), dtype=np.int64)
        select_arms(
            self.decision_inverse,
            self.decision_theta,
            contexts,
            self.policy.group,
            self.decision_radius,
            arms,
        )
        return arms

    def handle(self, message: Message) -> Message:
        if message.kind != "round":
            raise ValueError(f"unknown message kind {message.kind!r} for {type(self).__name__}")
        if "gram" in message.fields:
            self._download(message)
        contexts, active = self.env.observe()
        arms = self._select(contexts)
        rewards = self.env.pull(arms)
        rows, groups, x = self._learn(contexts, active, arms, rewards)
        self.pending_gram[rows, groups] += x[:, :, None] * x[:, None, :]
        self.pending_target[rows, groups] += rewards[rows, None] * x
        self.pending_count[rows, groups] += 1
        self.since_sync += active  # the client's own pulls (numObs_uploadbuffer)
        if not self.authors_code:
            return self._reply(message, contexts, active, arms, rewards)
        self._pulled(rows, groups)
        reply = self._reply(message, contexts, active, arms, rewards)
        # The authors' server knows a client from its first decision on (``decide`` registers
        # it): syncs and pushes skip clients that have not pulled yet. One flag, once a client.
        joined = active & (self.env.pulls == 1)
        return dataclasses.replace(
            reply,
            fields={**reply.fields, "joined": joined},
            sparse={**reply.sparse, "joined": "joined"},
        )

    def _learn(
        self, contexts: np.ndarray, active: np.ndarray, arms: np.ndarray, rewards: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The decision view learns from every own pull (view = last download + own pending)."""
        return self.policy.update(contexts, active, arms, rewards)

    @abstractmethod
    def _reply(
        self,
        message: Message,
        contexts: np.ndarray,
        active: np.ndarray,
        arms: np.ndarray,
        rewards: np.ndarray,
    ) -> Message:
        """The reply to a round, after every client has pulled and learnt: the upload rule."""

    def steps_left(self) -> int:
        """Rounds the server still sends: one per time step up to the horizon."""
        return int(self.env.horizon - self.env.round)

    def _growth(self) -> np.ndarray:
        """log det V_i - log det of the reference view, per client."""
        return self.policy.learners.logdet.sum(axis=1) - self.reference_logdet

    #: Under secure aggregation a collect may ask to hold groups back (``hold``, see ``_upload``).
    HOLDS_SECURE_BLOCKS = True

    def _upload(self, message: Message, sending: np.ndarray) -> Message:
        """Upload the pending (dV, db) of the ``sending`` clients (groups with new data only).

        Under secure aggregation the request carries ``hold`` (n, G): groups whose sum would
        have fewer contributors than the run allows (``fedbandit.flower.secure_aggregation``)
        stay pending, for the next sync; and the clear ``send`` flags are all True (every client
        takes part in every summed group, zeros included), so that they name nobody."""
        send = sending[:, None] & (self.pending_count > 0)
        hold = message.fields.get("hold")
        if hold is not None and np.size(hold):
            send &= ~np.asarray(hold, dtype=bool)
        fields = {
            "gram_delta": np.where(send[..., None, None], self.pending_gram, 0.0),
            "target_delta": np.where(send[..., None], self.pending_target, 0.0),
            "send": send if hold is None else np.ones_like(send),
        }
        sparse = {"gram_delta": "send", "target_delta": "send"}
        if self.authors_code:  # the sample counts travel with the statistics (numObs)
            fields["count_delta"] = np.where(send, self.pending_count, 0)
            sparse["count_delta"] = "send"
        self.pending_gram[send] = 0.0
        self.pending_target[send] = 0.0
        self.pending_count[send] = 0
        self._uploaded(sending)
        return Message(
            "upload",
            message.round,
            message.client_ids,
            fields,
            sparse=sparse,
            known=frozenset({"send"}),
            meta={"pulls": self.env.pulls.copy()},
        )

    def _uploaded(self, sending: np.ndarray) -> None:
        """Called once the ``sending`` clients have uploaded; nothing by default."""

    def quiet(self, reply: Message) -> bool:
        """An upload reply with nothing sent: the protocols that upload on a trigger
        (Async-LinUCB, FedLinUCB) then decide no download, so the next message is an empty
        round. (DisLinUCB and the centralised reference override or never run ahead.)"""
        return reply.kind == "upload" and not reply.fields["send"].any()

    def _download(self, message: Message) -> None:
        """View = downloaded statistics + own pending data; the download is the new reference."""
        rows = np.flatnonzero(message.fields["receive"].any(axis=1))
        gram = message.fields["gram"][rows]
        target = message.fields["target"][rows]
        self.policy.learners.set_view(
            rows, gram + self.pending_gram[rows], target + self.pending_target[rows]
        )
        self.reference_logdet[rows] = _logdet(gram)
        self.since_sync[rows] = 0
        if self.authors_code:
            self.view_count[rows] = message.fields["count"][rows] + self.pending_count[rows]


class FederatedRidgeServerBase(ServerLogic):
    """Keeps the global statistics (lambda I + all uploaded data) and sends them to the clients
    marked in ``download``; ``_receive`` (the protocol's aggregation and download rule) handles
    each round's replies.

    Dropped clients are no longer addressed, synchronised or pushed to; what they uploaded before
    stays in the global statistics, and what they had not uploaded is lost. The protocols' constants
    (DisLinUCB's D uses M) are not re-tuned."""

    #: The authors' ``totalCommCost`` rule of the protocol (``AUTHORS_RULES``), or None where the
    #: authors' code counts none: the server then reports no ``authors_comm_cost``.
    authors_rule: str | None = None

    def __init__(self, spec: ProblemSpec, params: RidgeParams) -> None:
        self.spec, self.params = spec, params
        self.group = model_groups(spec, params.model)
        G, d, M = int(self.group.max()) + 1, spec.dim, spec.num_clients
        self.gram = np.broadcast_to(params.regularization * np.eye(d), (G, d, d)).copy()
        self.target = np.zeros((G, d))
        self.download = np.zeros(M, dtype=bool)  # by client id
        self.clients = spec.client_ids.copy()
        self.rounds_done = 0
        self.exchange = 0
        self.authors_code = getattr(params, "fidelity", "paper") == "authors_code"
        #: authors_code: the clients that have pulled (their ``joined`` flag), and the samples in
        #: the global statistics (sent with every download).
        self.registered = np.zeros(M, dtype=bool)
        self.count = np.zeros(G, dtype=np.int64)
        #: The authors' ``totalCommCost`` of this run, by the protocol's rule in the authors'
        #: units (``authors_comm_cost``); counted by DisLinUCB and Async-LinUCB.
        self.authors_comm = 0

    def report(self) -> dict[str, Any]:
        """The authors' ``totalCommCost`` of the run (``authors_comm_cost``, counted by the
        protocol as ``authors_rule`` says), for one shared model: the authors' code has no
        counterpart with several."""
        count = self.authors_comm_cost()
        if count is None or self.authors_rule is None:
            return {}
        return {"authors_comm_cost": count, "authors_comm_cost_rule": self.authors_rule}

    def authors_comm_cost(self) -> int | None:
        """The authors' ``totalCommCost`` so far (``authors_rule``); None without a rule or with
        several models."""
        if self.authors_rule is None or self.gram.shape[0] != 1:
            return None
        return self.authors_comm

    def configure(self) -> Message | None:
        ids = self.clients
        if len(ids) == 0:
            return None
        n, G = len(ids), self.gram.shape[0]
        self.exchange += 1
        interim = self._interim(ids)
        if interim is not None:
            return interim
        if self.rounds_done >= self.spec.horizon:
            return None
        self.rounds_done += 1
        download = self.download[ids]
        if not download.any():
            return Message("round", self.exchange - 1, ids, {})
        receive = np.broadcast_to(download[:, None], (n, G))
        fields = {
            "gram": broadcast(self.gram, n),
            "target": broadcast(self.target, n),
            "receive": receive,
        }
        sparse = {"gram": "receive", "target": "receive"}
        if self.authors_code:
            fields["count"] = broadcast(self.count, n)
            sparse["count"] = "receive"
        self.download[:] = False
        return Message(
            "round", self.exchange - 1, ids, fields, sparse=sparse, known=frozenset({"receive"})
        )

    def _interim(self, ids: np.ndarray) -> Message | None:
        """An exchange in which nobody pulls, to send before the next round; none by default."""
        return None

    def bookkeeping_fields(self) -> frozenset[str]:
        """``authors_code``'s joined flag: one scalar, once a client, no statistics."""
        return frozenset({"joined"})

    def aggregate(self, reply: Message) -> None:
        if reply.round != self.exchange - 1:
            raise RuntimeError(f"reply for exchange {reply.round}, expected {self.exchange - 1}")
        if "joined" in reply.fields:
            self.registered[reply.client_ids[np.asarray(reply.fields["joined"], dtype=bool)]] = True
        self._receive(reply)

    @abstractmethod
    def _receive(self, reply: Message) -> None:
        """Fold the replies of the exchange into the global statistics; mark who downloads next."""

    def _add_uploads(self, reply: Message) -> np.ndarray:
        """Add an upload reply's (dV, db) to the global statistics; returns who sent anything."""
        if reply.kind != "upload":
            raise RuntimeError(f"unexpected reply kind {reply.kind!r}")
        self.gram += reply.fields["gram_delta"].sum(axis=0)
        self.target += reply.fields["target_delta"].sum(axis=0)
        if "count_delta" in reply.fields:
            self.count += reply.fields["count_delta"].sum(axis=0).astype(np.int64)
        return np.asarray(reply.fields["send"].any(axis=1))

    def drop_clients(self, client_ids: np.ndarray) -> None:
        self.clients = remove_clients(self.clients, client_ids, type(self).__name__)
        self.download[np.asarray(client_ids, dtype=np.int64)] = False


def dislinucb_threshold(params: DisLinUCBParams, num_clients: int, dim: int, total: int) -> float:
    """D: the given ``threshold``, or the named rule's value at T_total = ``total`` interactions.

    ``simulation``: T_total / (M d log T_total), ``D2`` of ``SimulationHomogeneousClients.py`` in
    ``cyrilli/Async-LinUCB`` (T there counts every client's steps: one random client per
    iteration). ``theorem``: D = (T / (d M)) log(M T) with T = T_total / M time steps of M agents,
    Wang et al. 2020, Theorem 4 (our transcription from memory, its text unreachable here: with it
    at most 2 d sqrt(M) syncs of M d^2 scalars each, the O(M^1.5 d^3) of the paper's abstract)."""
    if params.threshold is not None:
        return params.threshold
    T_total = max(total, 3)
    if params.threshold_rule == "theorem":
        return (T_total / num_clients) * math.log(T_total) / (dim * num_clients)
    return T_total / (num_clients * dim * math.log(T_total))


class DisLinUCBClient(FederatedRidgeClientBase):
    """DisLinUCB (Wang et al., ICLR 2020; rule as in ``cyrilli/Async-LinUCB``,
    ``lib/SyncLinUCB.py``, ``syncRoundTriggered``): client j asks for a global sync when
    n_j * log(det V_j / det V_sync) >= D, n_j its own pulls since the last sync (the paper's
    t - t_last, in which every agent acts every step); on the server's collect, every client
    uploads its unsynced (dV, db). D: ``dislinucb_threshold``.

    ``fidelity = "authors_code"`` (``cyrilli/Async-LinUCB``, ``lib/SyncLinUCB.py``): a client
    decides on its view as of its last own pull (``LocalClient.localUpdate`` recomputes AInv,
    UserTheta, alpha_t; a sync overwrites A_local, b_local only), so a sync reaches its decisions
    after its next pull; a sync reaches only the clients that have pulled (``decide`` registers
    a client; the others keep lambda I and their own data); the width is ``alpha_t`` =
    sigma sqrt(d log(1 + n / (d lambda)) + 2 log(1/delta)) + sqrt(lambda), n the samples in the
    client's statistics; lambda = 0.1 unless given.

    ``radius = "hlinucb_code"``: the width is the H-LinUCB authors' count-based one, t being the
    client's own pulls including the current one (``DisLinUCBParams``)."""

    def __init__(
        self, spec: ProblemSpec, params: DisLinUCBParams, env: ContextualEnvironment
    ) -> None:
        super().__init__(spec, params, env)
        self.threshold = dislinucb_threshold(
            params, spec.num_clients, spec.dim, total_interactions(env.instance, env.horizon)
        )
        if params.radius == "hlinucb_code":
            self.policy.count_from = 1  # the round t = 1, 2, ...: own pulls including this one

    def handle(self, message: Message) -> Message:
        if message.kind == "collect":
            return self._upload(message, np.ones(self.env.num_clients, dtype=bool))
        return super().handle(message)

    def _reply(
        self,
        message: Message,
        contexts: np.ndarray,
        active: np.ndarray,
        arms: np.ndarray,
        rewards: np.ndarray,
    ) -> Message:
        trigger = self.since_sync * self._growth() >= self.threshold
        return Message(
            "trigger",
            message.round,
            message.client_ids,
            {"trigger": trigger},
            sparse={"trigger": "trigger"},
            meta={"pulls": self.env.pulls.copy()},
        )

    def quiet(self, reply: Message) -> bool:
        """No trigger: the server does not collect, so its next message is an empty round."""
        return reply.kind == "trigger" and not reply.fields["trigger"].any()


class DisLinUCBServer(FederatedRidgeServerBase):
    """DisLinUCB (Wang et al. 2020): any client's trigger starts a sync, one extra exchange
    (``collect``) in which every client uploads and nobody pulls; then everyone downloads the new
    global statistics."""

    #: ``cyrilli/FedGLB-UCB``'s ``lib/DisLinUCB.py`` (``updateParameters``) adds d^2 + d + 1
    #: scalars per client it knows for the upload and again for the download of every sync:
    #: sum over syncs of 2 (d^2 + d + 1) m_s, m_s the clients the sync reaches (those that have
    #: pulled with ``authors_code``, every client in the paper mode), counted when the sync is
    #: decided, a sync after the last step included. Ours counts an upload only from a client
    #: with data, and a download only when it is sent (``*_scalars``).
    authors_rule = AUTHORS_RULES["dislinucb"]

    def __init__(self, spec: ProblemSpec, params: RidgeParams) -> None:
        super().__init__(spec, params)
        self.collect = False

    def secure_sums(self) -> dict[str, frozenset[str]]:
        """A sync's uploads are only added up: (dV, db) and, with ``authors_code``, the counts."""
        return {"collect": frozenset({"gram_delta", "target_delta", "count_delta"})}

    def bookkeeping_fields(self) -> frozenset[str]:
        """The clients' trigger flags and the server's collect request: a sync is counted as
        the exchanges that carry statistics (the collect's uploads, the download)."""
        return super().bookkeeping_fields() | {"trigger", "request"}

    def _interim(self, ids: np.ndarray) -> Message | None:
        if not self.collect:
            return None
        return Message(
            "collect", self.exchange - 1, ids, {"request": np.ones(len(ids), dtype=bool)}
        )

    def _receive(self, reply: Message) -> None:
        if reply.kind == "trigger":
            self.collect = bool(reply.fields["trigger"].any())
            return
        self._add_uploads(reply)
        self.collect = False
        # authors_code: a sync reaches the clients that have pulled (``self.clients`` of
        # SyncLinUCB); the paper's every agent.
        self.download[:] = self.registered if self.authors_code else True
        reached = int(np.count_nonzero(self.download[self.clients]))
        d = self.spec.dim
        self.authors_comm += 2 * (d * d + d + 1) * reached


class DeterminantRatioClient(FederatedRidgeClientBase):
    """Client i uploads when det(V_i) / det(V_i - dV_i) > exp(threshold), dV_i being its data not
    yet uploaded and V_i its view (last download + all its own data): Async-LinUCB's client rule
    (``cyrilli/Async-LinUCB``, ``lib/AsyncLinUCB.py``, ``LocalClient.uploadCommTriggered``)."""

    threshold: float

    def _reply(
        self,
        message: Message,
        contexts: np.ndarray,
        active: np.ndarray,
        arms: np.ndarray,
        rewards: np.ndarray,
    ) -> Message:
        return self._upload(message, self._growth() > self.threshold)

    def _uploaded(self, sending: np.ndarray) -> None:
        # the upload trigger compares the view with the view less what is not yet uploaded
        self.reference_logdet[sending] = _logdet(
            self.policy.learners.gram[sending] - self.pending_gram[sending]
        )


class AsyncLinUCBClient(DeterminantRatioClient):
    """Async-LinUCB (Li & Wang, AISTATS 2022): client i uploads when
    det(V_i) / det(V_i - dV_i) > gamma_U (``LocalClient.uploadCommTriggered``).

    ``fidelity = "authors_code"`` (``lib/AsyncLinUCB.py``): as for DisLinUCB, decisions use the
    view of the client's last own pull (a push adds to A_local at once, to AInv, UserTheta and
    alpha_t at the next ``localUpdate``), pushes skip clients that have not pulled yet (their
    buffer keeps every other client's uploads, as the authors' starts from the aggregate at
    registration), the width is ``alpha_t`` and lambda = 0.1 unless given."""

    def __init__(self, spec: ProblemSpec, params: AsyncParams, env: ContextualEnvironment) -> None:
        super().__init__(spec, params, env)
        self.threshold = math.log(params.upload_ratio)


class AsyncLinUCBServer(FederatedRidgeServerBase):
    """Async-LinUCB (Li & Wang, AISTATS 2022; ``cyrilli/Async-LinUCB``, ``lib/AsyncLinUCB.py``,
    ``AsyncLinUCB.updateParameters`` and ``downloadCommTriggered``): the server keeps, per client
    j, a buffer of the uploads of the *other* clients since j's last download (j's own uploads are
    already in j's view), and pushes its global statistics to j when
    det(V_global) / det(V_global - buffer_j) > gamma_D (V_global includes lambda I, as the authors'
    A_aggregated + lambda I). Checked after the uploads of each step; several uploads in one
    synchronous round enter in client-id order before the check (our choice: the authors'
    simulation has one upload per step)."""

    #: ``cyrilli/Async-LinUCB``'s ``lib/AsyncLinUCB.py`` (``updateParameters``) adds 1 per upload
    #: and 1 per download it triggers, a count of messages whatever their size, counted when
    #: decided (a download decided after the last step included).
    authors_rule = AUTHORS_RULES["async_linucb"]

    def __init__(self, spec: ProblemSpec, params: AsyncParams) -> None:
        super().__init__(spec, params)
        self.push_threshold = math.log(params.download_ratio)
        self.pending_push = np.zeros((spec.num_clients, *self.gram.shape))

    def configure(self) -> Message | None:
        pushing = self.download.copy()
        message = super().configure()
        if message is not None and message.kind == "round" and "gram" in message.fields:
            self.pending_push[pushing] = 0.0
        return message

    def _receive(self, reply: Message) -> None:
        if reply.kind != "upload":
            raise RuntimeError(f"unexpected reply kind {reply.kind!r}")
        send = np.asarray(reply.fields["send"])
        deltas = reply.fields["gram_delta"]
        for position in np.flatnonzero(send.any(axis=1)):
            uploader = int(reply.client_ids[position])
            delta = np.where(send[position][:, None, None], deltas[position], 0.0)
            others = np.arange(len(self.pending_push)) != uploader
            self.pending_push[others] += delta
        self._add_uploads(reply)
        if not send.any():
            return
        ids = self.clients
        stale = float(_logdet(self.gram)) - _logdet(self.gram - self.pending_push[ids])
        push = stale > self.push_threshold
        # authors_code: only clients that have pulled are checked (``AsyncLinUCB.clients``); a
        # client's buffer holds every other upload until then, as the authors' buffer starts as
        # the aggregate at registration.
        pushed = push & self.registered[ids] if self.authors_code else push
        self.download[ids] |= pushed
        self.authors_comm += int(np.count_nonzero(send.any(axis=1)) + np.count_nonzero(pushed))


class FedLinUCBClient(FederatedRidgeClientBase):
    """FedLinUCB (He, Wang, Min, Gu, NeurIPS 2022; ``uclaml/FedLinUCB``, ``M-15/Federated.py``, the
    "Our-rare" loop): the decision view is the last download (Sigma_down, b_down) alone; the
    client's own data since then (dSigma, db) is kept aside and enters only the trigger
    det(Sigma_down + dSigma) > (1 + alpha) det(Sigma_down), on which it uploads (dSigma, db) and
    downloads the server's statistics.

    ``fidelity = "paper"``: Sigma_down starts at lambda I and decisions use the OFUL index.
    ``fidelity = "authors_code"``, as ``Federated.py`` does: SIGMADOW starts at 0, so until its
    first sync a client's every index is 0 (``lstsq`` on a zero matrix) and it plays arm 0; its
    first sync fires when np.linalg.det(SIGMALOC) > 0, which needs d independent pulls in exact
    arithmetic and is decided by floating-point round-off in practice (often after one to three
    pulls); decisions use the fixed width ``alpha`` = 0.5 (``beta``); the trigger is evaluated
    with ``np.linalg.det`` (a product over parameter groups), not log determinants."""

    def __init__(
        self, spec: ProblemSpec, params: FedLinUCBParams, env: ContextualEnvironment
    ) -> None:
        super().__init__(spec, params, env)
        self.threshold = math.log(1.0 + params.communication_alpha)
        self.communication_alpha = params.communication_alpha
        if self.authors_code:
            self.downloaded = np.zeros(env.num_clients, dtype=bool)
            self.decision_inverse[:] = 0.0  # SIGMADOW = 0: every index 0 until a download
            self.STATE = (*self.STATE, "downloaded")

    def _decision_radius(self, rows: np.ndarray) -> np.ndarray:
        """authors_code: the fixed width ``alpha`` (the script's ``beta`` = 0.5)."""
        return np.full((len(rows), self.policy.learners.logdet.shape[1]), self.params.alpha)

    def _pulled(self, rows: np.ndarray, groups: np.ndarray) -> None:
        """authors_code: own pulls leave the decision view (the last download) as it is."""

    def _download(self, message: Message) -> None:
        super()._download(message)
        if self.authors_code:
            rows = np.flatnonzero(message.fields["receive"].any(axis=1))
            self.downloaded[rows] = True
            self._snapshot(rows)

    def _learn(
        self, contexts: np.ndarray, active: np.ndarray, arms: np.ndarray, rewards: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.policy.observed(contexts, active, arms)  # the view waits for a download

    def _reply(
        self,
        message: Message,
        contexts: np.ndarray,
        active: np.ndarray,
        arms: np.ndarray,
        rewards: np.ndarray,
    ) -> Message:
        down = self.policy.learners.gram
        if not self.authors_code:
            growth = _logdet(down + self.pending_gram) - _logdet(down)
            return self._upload(message, active & (growth > self.threshold))
        down = np.where(self.downloaded[:, None, None, None], down, 0.0)
        grown = np.prod(np.linalg.det(down + self.pending_gram), axis=-1)
        before = (1.0 + self.communication_alpha) * np.prod(np.linalg.det(down), axis=-1)
        return self._upload(message, active & (grown > before))


class FedLinUCBServer(FederatedRidgeServerBase):
    """FedLinUCB (He et al. 2022): a client that uploaded downloads the global statistics (all
    uploads so far, its own included) before it acts again."""

    def _receive(self, reply: Message) -> None:
        uploaded = self._add_uploads(reply)
        self.download[reply.client_ids] |= uploaded


class CentralLinUCBClient(FederatedRidgeClientBase):
    """Centralised LinUCB: every client uploads each sample (x, r, arm), every round."""

    def quiet(self, reply: Message) -> bool:
        return False  # every round's samples change the server's statistics and downloads

    def _reply(
        self,
        message: Message,
        contexts: np.ndarray,
        active: np.ndarray,
        arms: np.ndarray,
        rewards: np.ndarray,
    ) -> Message:
        fields = {
            "x": contexts[np.arange(len(arms)), arms][:, None],
            "reward": rewards[:, None],
            "arm": arms[:, None].astype(np.int32),
            "acted": active[:, None],
        }
        sparse = {"x": "acted", "reward": "acted", "arm": "acted"}
        self.pending_gram[:] = 0.0
        self.pending_target[:] = 0.0
        self.pending_count[:] = 0
        return Message(
            "samples",
            message.round,
            message.client_ids,
            fields,
            sparse=sparse,
            known=frozenset({"acted"}),
            meta={"pulls": self.env.pulls.copy()},
        )


class CentralLinUCBServer(FederatedRidgeServerBase):
    """Centralised LinUCB: adds every sample to the global statistics and sends them to every
    client every round (the fully shared reference)."""

    def _receive(self, reply: Message) -> None:
        if reply.kind != "samples":
            raise RuntimeError(f"unexpected reply kind {reply.kind!r}")
        acted = reply.fields["acted"][:, 0]
        x = reply.fields["x"][acted, 0]
        groups = self.group[reply.fields["arm"][acted, 0]]
        outer = np.einsum("jd,je->jde", x, x)
        gram_delta = np.zeros((len(x), *self.gram.shape))
        target_delta = np.zeros((len(x), *self.target.shape))
        gram_delta[np.arange(len(x)), groups] = outer
        target_delta[np.arange(len(x)), groups] = reply.fields["reward"][acted, 0, None] * x
        self.gram += gram_delta.sum(axis=0)
        self.target += target_delta.sum(axis=0)
        self.download[:] = True


P = TypeVar("P", bound=RidgeParams)


def federated_ridge_spec(
    name: str,
    description: str,
    params: type[P],
    server: Callable[[ProblemSpec, P], FederatedRidgeServerBase],
    client: Callable[[ProblemSpec, P, ContextualEnvironment], FederatedRidgeClientBase],
    citation: str = "",
) -> AlgorithmSpec[Any]:
    """The registry entry of a federated ridge protocol (server and client classes; the BibTeX
    of its paper)."""
    return AlgorithmSpec(
        name=name,
        description=description,
        params=params,
        make_server=lambda spec, p: server(spec, p),
        make_client=lambda spec, p, env: client(
            spec, p, environment_of(env, ContextualEnvironment)
        ),
        contextual=True,
        citation=citation,
    )


#: Declared in ``pyproject.toml`` under ``fedbandit.algorithms``.
DISLINUCB = federated_ridge_spec(
    "dislinucb",
    "DisLinUCB: log-det sync trigger (Wang et al. 2020)",
    DisLinUCBParams,
    DisLinUCBServer,
    DisLinUCBClient,
    citations.DISLINUCB,
)
ASYNC_LINUCB = federated_ridge_spec(
    "async_linucb",
    "Async-LinUCB: upload and push ratios (Li & Wang 2022)",
    AsyncParams,
    AsyncLinUCBServer,
    AsyncLinUCBClient,
    citations.ASYNC_LINUCB,
)
FEDLINUCB = federated_ridge_spec(
    "fedlinucb",
    "FedLinUCB: determinant-ratio sync (He et al. 2022)",
    FedLinUCBParams,
    FedLinUCBServer,
    FedLinUCBClient,
    citations.FEDLINUCB,
)
CENTRAL_LINUCB = federated_ridge_spec(
    "central_linucb",
    "Centralised LinUCB: every sample shared every round",
    CentralParams,
    CentralLinUCBServer,
    CentralLinUCBClient,
)
