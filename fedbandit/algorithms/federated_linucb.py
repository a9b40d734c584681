"""Federated LinUCB on contextual instances: DisLinUCB, Async-LinUCB, FedLinUCB and a centralised
reference, as server and client logic exchanging ridge statistics.

Every message exchange is one round: the server sends downloads (if any), every client that
participates observes a context, pulls, updates its own view, and replies with uploads (if its
trigger fires). Arrivals are round-robin in synchronous rounds: all participating clients act in a
round, and uploads are processed at the round's end in client-id order. Statistics travel as full
d x d matrices plus d-vectors per parameter group (d^2 + d scalars).

- ``dislinucb`` (Wang, Hu, Chen, Wang, ICLR 2020): client j triggers a global sync when
  (t - t_last) * log(det V_j / det V_sync) >= D; then every client uploads its unsynced (dV, db)
  (one extra exchange in which nobody pulls) and everyone downloads the new global statistics.
  Default D = T / (M d log T), the value of the paper's simulations.
- ``async_linucb`` (Li & Wang, AISTATS 2022): client i uploads when
  det(V_i) / det(V_i - dV_i) > gamma_U; the server pushes its global statistics to client j when
  det(V_global) / det(V_global at j's last download) > gamma_D.
- ``fedlinucb`` (He, Wang, Min, Gu, NeurIPS 2022): a client uploads and then downloads when
  det(V_down + dV) > (1 + alpha) det(V_down).
- ``central_linucb``: every client uploads each sample (x, r, arm) and downloads the global
  statistics every round: the fully shared reference.

The decision rule is LinUCB with the self-normalised radius (OFUL) on the client's current view.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field

from fedbandit.algorithms.base import ProblemSpec
from fedbandit.algorithms.linucb import POLICY_STATE, RidgeParams, RidgePolicy, model_groups
from fedbandit.contextual.environment import ContextualEnvironment
from fedbandit.federation.messages import Message, broadcast
from fedbandit.federation.protocol import ClientLogic, ServerLogic, remove_clients


class DisLinUCBParams(RidgeParams):
    """``threshold``: D of the sync trigger; default (None) T / (M d log T). 0 syncs every
    round (the centralised learner); inf never syncs (local learners)."""

    threshold: float | None = Field(None, ge=0)
    delta: float = Field(0.1, gt=0, lt=1)


class AsyncParams(RidgeParams):
    """``upload_ratio`` gamma_U and ``download_ratio`` gamma_D (> 1): determinant ratios that
    trigger an upload and a server push (Async-LinUCB). Our default: 2 for both."""

    upload_ratio: float = Field(2.0, gt=1)
    download_ratio: float = Field(2.0, gt=1)
    delta: float = Field(0.1, gt=0, lt=1)


class FedLinUCBParams(RidgeParams):
    """``communication_alpha``: a client syncs when det(V_down + dV) > (1 + alpha) det(V_down).
    Our default: 1 (the determinant doubles)."""

    communication_alpha: float = Field(1.0, gt=0)
    delta: float = Field(0.1, gt=0, lt=1)


class CentralParams(RidgeParams):
    delta: float = Field(0.1, gt=0, lt=1)


def _logdet(gram: np.ndarray) -> np.ndarray:
    """log det, summed over the parameter groups: (..., G, d, d) -> (...)."""
    return np.linalg.slogdet(gram)[1].sum(axis=-1)


class FederatedRidgeClient(ClientLogic):
    """A group of clients running LinUCB on their views; uploads follow the protocol's trigger."""

    STATE = (
        *POLICY_STATE,
        "pending_gram",
        "pending_target",
        "pending_count",
        "reference_logdet",
        "since_sync",
    )

    env: ContextualEnvironment

    def __init__(
        self, spec: ProblemSpec, params: RidgeParams, protocol: str, env: ContextualEnvironment
    ) -> None:
        super().__init__(env)  # type: ignore[arg-type]
        self.spec, self.params, self.protocol = spec, params, protocol
        n = env.num_clients
        self.policy = RidgePolicy(spec, params, "self_normalized", "constant", n)
        learners = self.policy.learners
        self.pending_gram = np.zeros_like(learners.gram)
        self.pending_target = np.zeros_like(learners.target)
        self.pending_count = np.zeros(learners.logdet.shape, dtype=np.int64)
        # log det of the view when it last equalled the shared statistics (sync or download)
        self.reference_logdet = learners.logdet.sum(axis=1).copy()
        self.since_sync = np.zeros(n, dtype=np.int64)
        self.threshold = self._threshold()

    def _threshold(self) -> float:
        p, spec = self.params, self.spec
        if isinstance(p, DisLinUCBParams):
            if p.threshold is not None:
                return p.threshold
            T = max(spec.horizon, 3)
            return T / (spec.num_clients * spec.dim * math.log(T))
        if isinstance(p, AsyncParams):
            return math.log(p.upload_ratio)
        if isinstance(p, FedLinUCBParams):
            return math.log(1.0 + p.communication_alpha)
        return 0.0

    def handle(self, message: Message) -> Message:
        if message.kind == "collect":
            return self._upload(message, np.ones(self.env.num_clients, dtype=bool))
        if message.kind != "round":
            raise ValueError(f"unknown message kind {message.kind!r} for {self.protocol}")
        if "gram" in message.fields:
            self._download(message)
        contexts, active = self.env.observe()
        arms = self.policy.select(contexts)
        rewards = self.env.pull(arms)
        rows, groups, x = self.policy.update(contexts, active, arms, rewards)
        self.pending_gram[rows, groups] += x[:, :, None] * x[:, None, :]
        self.pending_target[rows, groups] += rewards[rows, None] * x
        self.pending_count[rows, groups] += 1
        self.since_sync += 1
        if self.protocol == "central":
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
        growth = self.policy.learners.logdet.sum(axis=1) - self.reference_logdet
        if self.protocol == "dislinucb":
            trigger = self.since_sync * growth >= self.threshold
            return Message(
                "trigger",
                message.round,
                message.client_ids,
                {"trigger": trigger},
                sparse={"trigger": "trigger"},
                meta={"pulls": self.env.pulls.copy()},
            )
        return self._upload(message, growth > self.threshold)

    def _upload(self, message: Message, sending: np.ndarray) -> Message:
        send = sending[:, None] & (self.pending_count > 0)
        fields = {
            "gram_delta": np.where(send[..., None, None], self.pending_gram, 0.0),
            "target_delta": np.where(send[..., None], self.pending_target, 0.0),
            "send": send,
        }
        self.pending_gram[send] = 0.0
        self.pending_target[send] = 0.0
        self.pending_count[send] = 0
        if self.protocol != "dislinucb":
            # the upload trigger compares the view with the view less what is not yet uploaded
            self.reference_logdet[sending] = _logdet(
                self.policy.learners.gram[sending] - self.pending_gram[sending]
            )
        return Message(
            "upload",
            message.round,
            message.client_ids,
            fields,
            sparse={"gram_delta": "send", "target_delta": "send"},
            known=frozenset({"send"}),
            meta={"pulls": self.env.pulls.copy()},
        )

    def _download(self, message: Message) -> None:
        rows = np.flatnonzero(message.fields["receive"].any(axis=1))
        gram = message.fields["gram"][rows]
        target = message.fields["target"][rows]
        self.policy.learners.set_view(
            rows, gram + self.pending_gram[rows], target + self.pending_target[rows]
        )
        self.reference_logdet[rows] = _logdet(gram)
        self.since_sync[rows] = 0


class FederatedRidgeServer(ServerLogic):
    """Keeps the global statistics (lambda I + all uploaded data) and decides the downloads.

    Dropped clients are no longer addressed, synchronised or pushed to; what they uploaded before
    stays in the global statistics, and what they had not uploaded is lost. The protocols' constants
    (DisLinUCB's D uses M) are not re-tuned."""

    def __init__(self, spec: ProblemSpec, params: RidgeParams, protocol: str) -> None:
        self.spec, self.params, self.protocol = spec, params, protocol
        self.group = model_groups(spec, params.model)
        G, d, M = int(self.group.max()) + 1, spec.dim, spec.num_clients
        self.gram = np.broadcast_to(params.regularization * np.eye(d), (G, d, d)).copy()
        self.target = np.zeros((G, d))
        self.client_logdet = np.full(M, float(_logdet(self.gram)))
        self.download = np.zeros(M, dtype=bool)  # by client id
        self.clients = spec.client_ids.copy()
        self.collect = False
        self.rounds_done = 0
        self.exchange = 0

    def configure(self) -> Message | None:
        ids = self.clients
        if len(ids) == 0:
            return None
        n, G = len(ids), self.gram.shape[0]
        self.exchange += 1
        if self.collect:
            return Message("collect", self.exchange - 1, ids, {"request": np.ones(n, dtype=bool)})
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
        self.client_logdet[ids[download]] = float(_logdet(self.gram))
        self.download[:] = False
        return Message(
            "round",
            self.exchange - 1,
            ids,
            fields,
            sparse={"gram": "receive", "target": "receive"},
            known=frozenset({"receive"}),
        )

    def aggregate(self, reply: Message) -> None:
        if reply.round != self.exchange - 1:
            raise RuntimeError(f"reply for exchange {reply.round}, expected {self.exchange - 1}")
        if reply.kind == "trigger":
            self.collect = bool(reply.fields["trigger"].any())
            return
        if reply.kind == "samples":
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
            return
        if reply.kind != "upload":
            raise RuntimeError(f"unexpected reply kind {reply.kind!r}")
        self.gram += reply.fields["gram_delta"].sum(axis=0)
        self.target += reply.fields["target_delta"].sum(axis=0)
        uploaded = reply.fields["send"].any(axis=1)
        if self.protocol == "dislinucb":
            self.collect = False
            self.download[:] = True
        elif self.protocol == "fedlinucb":
            self.download[reply.client_ids] |= uploaded
        else:
            assert isinstance(self.params, AsyncParams)
            stale = float(_logdet(self.gram)) - self.client_logdet
            self.download |= stale > math.log(self.params.download_ratio)

    def drop_clients(self, client_ids: np.ndarray) -> None:
        self.clients = remove_clients(self.clients, client_ids, type(self).__name__)
        self.download[np.asarray(client_ids, dtype=np.int64)] = False
