"""Federated phased elimination: Fed-PE, its shared-parameter case, Enhanced Fed-PE and the
Collaborative full-information reference.

Huang, Wu, Yang, Shen, "Federated Linear Contextual Bandits", NeurIPS 2021 (arXiv 2110.14177), as
run by the authors' reference implementation. One phase p (length f(p) = 2^p, f(0) = 1) is two
message exchanges:

1. ``eliminate`` (server -> clients): the last aggregate theta_g and W_g = V_g^+ for each client's
   active arms (plus l = min ||x||^2 once). Each client drops arms by the elimination rule and
   replies with its active set (K booleans).
2. ``explore`` (server -> clients): the multi-client G-optimal design pi over the active sets. Each
   client pulls arm a ceil(f(p) pi_{i,a}) times and replies with the executed counts and, per pulled
   arm, its local estimate theta_hat_{i,a} = ybar x / ||x||^2 (Fed-PE) or the reward sum
   (Collaborative). The server aggregates this phase's data only.

Phase 0 is an ``explore`` with uniform weights and f(0) = 1: every arm once. The server learns the
unit directions u_{i,a} from phase 0 estimates, never the features (Fed-PE); the Collaborative
reference receives the features themselves and runs least squares.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field

from fedbandit.algorithms import citations
from fedbandit.algorithms.base import AlgorithmSpec, Hyperparameters, ProblemSpec, environment_of
from fedbandit.design import solve_design_fast
from fedbandit.environment import BanditEnvironment
from fedbandit.errors import ConfigError
from fedbandit.estimators import (
    aggregate_direction_sums,
    aggregate_directions,
    aggregate_least_squares,
    direction_estimates,
    eliminate_cumulative,
    eliminate_phase,
    enhanced_alpha,
    executed_counts,
    fedpe_alpha,
    last_phase,
    phase_length,
    pull_counts,
    scores_and_widths,
    squared_norms,
    unit_directions,
    weighted_direction_sums,
)
from fedbandit.federation.messages import Message, broadcast
from fedbandit.federation.protocol import ClientLogic, ServerLogic, remove_clients


class PhasedEliminationParams(Hyperparameters):
    """Hyperparameters shared by the phased-elimination family.

    - ``alpha``: confidence constant. Default (None): Fed-PE's
      alpha = min(2 log(20 M K P), 2 log(10 K P) + d log k0 + d) with P = number of phases; for the
      cumulative (Enhanced, Collaborative) rule alpha' = M (10 M K)^2 / (K d). Reference code.
    - ``noise_sigma``: the known noise level sigma that scales every width. Default (None): the
      instance's sigma (the papers assume it known; the reference code fixes sigma = 1).
    - ``design_tolerance``: the fast design solver stops when G(pi)/D - 1 <= this.
    - ``design_max_iter``: iteration cap of the design solver per phase.
    """

    alpha: float | None = Field(None, gt=0)
    noise_sigma: float | None = Field(None, gt=0)
    design_tolerance: float = Field(1e-2, gt=0, le=1)
    design_max_iter: int = Field(20000, ge=1)


@dataclass(frozen=True)
class Variant:
    """Which member of the family: estimator, elimination rule, and parameter sharing."""

    estimator: Literal["direction", "least_squares"]
    elimination: Literal["phase", "cumulative"]
    shared: bool


def _groups(num_arms: int, shared: bool) -> tuple[np.ndarray, int]:
    if shared:
        return np.zeros(num_arms, dtype=np.int64), 1
    return np.arange(num_arms, dtype=np.int64), num_arms


def _rows_of(field: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """field[positions]; a broadcast field (the same value for every client) stays a broadcast
    view, so the einsum over it takes the same path as over the whole field."""
    if field.strides[0] == 0:
        return np.broadcast_to(field[0], (len(positions), *field.shape[1:]))
    return field[positions]


class PhasedEliminationServer(ServerLogic):
    """Aggregates local estimates per group and solves the multi-client G-optimal design."""

    def __init__(self, spec: ProblemSpec, params: PhasedEliminationParams, variant: Variant):
        if spec.horizon < spec.num_arms:
            raise ConfigError(
                f"phased elimination needs horizon >= K = {spec.num_arms} (phase 0 pulls every "
                f"arm once per client), got horizon = {spec.horizon}"
            )
        self.spec, self.params, self.variant = spec, params, variant
        self.group, self.num_groups = _groups(spec.num_arms, variant.shared)
        self.final_phase = last_phase(spec.horizon, spec.num_arms)
        self.clients = spec.client_ids.copy()
        self.active = np.ones((spec.num_clients, spec.num_arms), dtype=bool)
        self.weights = np.full(self.active.shape, 1.0 / spec.num_arms)
        self.vectors: np.ndarray | None = None
        self.theta = np.zeros((self.num_groups, spec.dim))
        self.cov = np.zeros((self.num_groups, spec.dim, spec.dim))
        self.min_sq_norm: float | None = None
        #: Each client's pulls so far, from the reports' executed counts.
        self.pulls = np.zeros(spec.num_clients, dtype=np.int64)
        self.phase, self.round, self.stage = 0, 0, "explore"
        self.design_log: list[dict[str, float]] = []

    def configure(self) -> Message | None:
        if self.stage == "done" or len(self.clients) == 0:
            return None
        n = len(self.clients)
        rows = self._rows(self.clients)
        active = self.active[rows]
        if self.stage == "explore":
            fields = {
                "weights": np.where(active, self.weights[rows], 0.0),
                "phase": np.full(n, self.phase, dtype=np.int32),
                "active": active,
            }
            message = Message(
                "explore",
                self.round,
                self.clients,
                fields,
                sparse={"weights": "active"},
                known=frozenset({"active"}),
            )
        elif self.variant.shared:
            fields = {"theta": broadcast(self.theta[0], n), "cov": broadcast(self.cov[0], n)}
            if self.phase == 1 and self.min_sq_norm is not None:
                fields["min_sq_norm"] = np.full(n, self.min_sq_norm)
            message = Message("eliminate", self.round, self.clients, fields)
        else:
            fields = {
                "theta": broadcast(self.theta, n),
                "cov": broadcast(self.cov, n),
                "active": active,
            }
            if self.phase == 1 and self.min_sq_norm is not None:
                fields["min_sq_norm"] = np.full(n, self.min_sq_norm)
            message = Message(
                "eliminate",
                self.round,
                self.clients,
                fields,
                sparse={"theta": "active", "cov": "active"},
                known=frozenset({"active"}),
            )
        self.round += 1
        return message

    def _rows(self, client_ids: np.ndarray) -> np.ndarray:
        return np.asarray(client_ids, dtype=np.int64)

    def _all_rows(self, rows: np.ndarray) -> bool:
        """Whether ``rows`` are every client of the run, in order (no gather needed)."""
        n = self.spec.num_clients
        return len(rows) == n and bool(np.array_equal(rows, np.arange(n)))

    def aggregate(self, reply: Message) -> None:
        expected = "report" if self.stage == "explore" else "active_set"
        if reply.kind != expected or reply.round != self.round - 1:
            raise RuntimeError(
                f"expected {expected!r} replies for round {self.round - 1}, got "
                f"{reply.kind!r} for round {reply.round}"
            )
        if not np.array_equal(reply.client_ids, self.clients):
            raise RuntimeError(
                f"round {reply.round}: replies of clients {reply.client_ids.tolist()}, expected "
                f"the clients addressed {self.clients.tolist()}"
            )
        if expected == "report":
            self._aggregate_report(reply)
        else:
            self._update_design(reply)

    def _aggregate_report(self, reply: Message) -> None:
        rows = self._rows(reply.client_ids)
        every = self._all_rows(rows)
        if every:
            counts = reply.fields["counts"].astype(np.int64)
        else:
            counts = np.zeros(self.active.shape, dtype=np.int64)
            counts[rows] = reply.fields["counts"]
        self.pulls[rows] += reply.fields["counts"].sum(axis=1, dtype=np.int64)
        if self.phase == 0:
            self._learn_vectors(reply, rows)
        assert self.vectors is not None
        if "weighted_estimate" in reply.fields:  # secure aggregation: sum_i s_{i,g} only
            theta, cov, _ = aggregate_direction_sums(
                reply.fields["weighted_estimate"].sum(axis=0),
                self._weights(counts),
                self.vectors,
                self.group,
                self.num_groups,
            )
        elif self.variant.estimator == "direction":
            if every:
                estimates = reply.fields["estimate"]
            else:
                estimates = np.zeros((*self.active.shape, self.spec.dim))
                estimates[rows] = reply.fields["estimate"]
            theta, cov, _ = aggregate_directions(
                estimates, self._weights(counts), self.vectors, self.group, self.num_groups
            )
        else:
            sums = np.zeros(self.active.shape)
            sums[rows] = reply.fields["reward_sum"]
            theta, cov, _ = aggregate_least_squares(
                sums, counts, self.vectors, self.group, self.num_groups
            )
        # A group that got no pulls this phase keeps its previous estimate.
        pulled = np.zeros(self.num_groups, dtype=bool)
        np.logical_or.at(pulled, self.group, counts.sum(axis=0) > 0)
        self.theta[pulled], self.cov[pulled] = theta[pulled], cov[pulled]
        if self.phase >= self.final_phase:
            self.stage = "done"
        else:
            self.phase += 1
            self.stage = "eliminate"

    def secure_sums(self) -> dict[str, frozenset[str]]:
        """From phase 1 on, a report's estimates can reach the aggregate as sum_i s_{i,g}
        (``weighted_direction_sums``, the client's ``summable``): the server needs no single
        client's estimate. Phase 0's reports stay per client (the design needs each client's
        directions u_{i,a}), as do the counts and active sets the design is made of."""
        if self.variant.estimator != "direction":
            return {}
        return {"explore": frozenset({"weighted_estimate"})}

    def secure_fields(self, message: Message) -> frozenset[str]:
        if message.kind == "explore" and int(message.fields["phase"][0]) >= 1:
            return super().secure_fields(message)
        return frozenset()

    def secure_contributors(self, message: Message) -> dict[str, np.ndarray] | None:
        """An explore message fixes every client's pulls: n_{i,a} = ceil(f(p) pi_{i,a}) on its
        active arms (``pull_counts``), within what is left of its horizon (``executed_counts``,
        from the counts reported so far). Client i's s_{i,g} holds data exactly when it pulls an
        arm of group g."""
        if not self.secure_fields(message):
            return None
        rows, fields = self._rows(message.client_ids), message.fields
        length = phase_length(int(fields["phase"][0]))
        requested = pull_counts(fields["weights"], length, fields["active"])
        executed = executed_counts(requested, self.spec.horizon - self.pulls[rows])
        member = self.group[:, None] == np.arange(self.num_groups)  # (K, G)
        return {"weighted_estimate": (executed > 0).astype(np.int64) @ member > 0}

    def secure_follows(self, message: Message) -> bool:
        """Every elimination is followed by a summed exploration (phase 1 or later), and every
        exploration but the last phase's by another one, after an elimination."""
        if not self.secure_sums():
            return False
        if message.kind == "explore":
            return int(message.fields["phase"][0]) < self.final_phase
        return message.kind == "eliminate"

    def _weights(self, counts: np.ndarray) -> np.ndarray:
        """Each estimate's weight in the aggregation: its pull count n (Fed-PE)."""
        return counts

    def _learn_vectors(self, reply: Message, rows: np.ndarray) -> None:
        shape = (*self.active.shape, self.spec.dim)
        self.vectors = np.zeros(shape)
        if self.variant.estimator == "direction":
            self.vectors[rows] = unit_directions(reply.fields["estimate"])
            self.min_sq_norm = float(np.min(reply.fields["min_sq_norm"]))
        else:
            self.vectors[rows] = reply.fields["features"]
        mine = self.vectors if self._all_rows(rows) else self.vectors[rows]
        zero = ~np.any(mine != 0.0, axis=2)
        if zero.any():
            i, a = np.argwhere(zero)[0]
            raise RuntimeError(
                f"client {reply.client_ids[i]} reported a zero vector for arm {a} in phase 0: "
                "its direction is unknown (a reward mean of exactly 0)"
            )

    def _update_design(self, reply: Message) -> None:
        rows = self._rows(reply.client_ids)
        active = reply.fields["active"].astype(bool)
        empty = ~active.any(axis=1)
        if empty.any():
            raise RuntimeError(f"clients {reply.client_ids[empty].tolist()} eliminated every arm")
        self.active[rows] = active
        assert self.vectors is not None
        start = time.perf_counter()
        every = self._all_rows(rows)
        result = solve_design_fast(
            self.vectors if every else self.vectors[rows],
            active,
            self.group,
            tol=self.params.design_tolerance,
            max_iter=self.params.design_max_iter,
            initial=self.weights if every else self.weights[rows],
        )
        self.weights[rows] = result.weights
        self.design_log.append(
            {
                "phase": self.phase,
                "certificate": result.certificate,
                "iterations": result.iterations,
                "seconds": time.perf_counter() - start,
                "active_pairs": int(active.sum()),
                "clients": len(rows),
            }
        )
        self.stage = "explore"

    def drop_clients(self, client_ids: np.ndarray) -> None:
        """Forget lost clients: they are never addressed again, and every later aggregation and
        multi-client G-optimal design covers the remaining clients only. A phase the lost clients
        were in the middle of is aggregated from the surviving replies (``run_federation`` calls
        this first); with no client left the run ends. The confidence constants (alpha, which
        depends on M) are not re-tuned: clients do not learn of the drop."""
        self.clients = remove_clients(self.clients, client_ids, type(self).__name__)
        rows = self._rows(np.asarray(client_ids, dtype=np.int64))
        self.active[rows] = False
        self.weights[rows] = 0.0
        if len(self.clients) == 0:
            self.stage = "done"


class PhasedEliminationClient(ClientLogic):
    """A group of clients: eliminates arms locally and explores by the server's design."""

    STATE: tuple[str, ...] = (
        "active",
        "explored_phase",
        "min_sq_norm",
        "sum_scores",
        "sum_widths",
        "total_length",
    )

    env: BanditEnvironment

    def __init__(
        self,
        spec: ProblemSpec,
        params: PhasedEliminationParams,
        variant: Variant,
        env: BanditEnvironment,
    ):
        super().__init__(env)
        self.spec, self.params, self.variant = spec, params, variant
        n, K = env.num_clients, spec.num_arms
        self.features = env.features
        self.active = np.ones((n, K), dtype=bool)
        self.sigma = params.noise_sigma if params.noise_sigma is not None else spec.noise_sigma
        num_phases = last_phase(spec.horizon, K) + 1
        if params.alpha is not None:
            self.alpha = params.alpha
        elif variant.elimination == "phase":
            self.alpha = fedpe_alpha(spec.num_clients, K, num_phases, spec.dim)
        else:
            self.alpha = enhanced_alpha(spec.num_clients, K, spec.dim)
        self.min_sq_norm = float("nan")  # l = min ||x||^2, sent by the server in phase 1
        self.explored_phase = -1
        # Enhanced / Collaborative accumulators (reference code: mu1, mu2 starts at d K / M, N).
        self.sum_scores = np.zeros((n, K))
        self.sum_widths = np.full((n, K), spec.dim * K / spec.num_clients)
        self.total_length = 0.0
        self._sq_norms: np.ndarray | None = None  # ||x_{i,a}||^2, computed once
        self._estimates: np.ndarray | None = None

    def _every(self, rows: np.ndarray) -> bool:
        """Whether ``rows`` are all the group's rows in order (then no gather is needed)."""
        n = len(self.client_ids)
        return len(rows) == n and bool(np.array_equal(rows, np.arange(n)))

    def _features(self, rows: np.ndarray) -> np.ndarray:
        """features[rows], without a copy when ``rows`` are all the group's rows."""
        return self.features if self._every(rows) else self.features[rows]

    def _sq_norm_rows(self, rows: np.ndarray) -> np.ndarray:
        if self._sq_norms is None:
            self._sq_norms = squared_norms(self.features)
        return self._sq_norms if self._every(rows) else self._sq_norms[rows]

    def _weights(self, counts: np.ndarray) -> np.ndarray:
        """The weights the server gives each estimate (``PhasedEliminationServer._weights``)."""
        return counts

    def summable(self, reply: Message, summed: frozenset[str]) -> Message:
        """A report with ``weighted_estimate`` s_{i,g} = sum_{a in g} w_{i,a} theta_hat_{i,a}
        (w the server's weights) in place of the per-arm estimates, for secure aggregation."""
        if "weighted_estimate" not in summed or "estimate" not in reply.fields:
            return reply
        group, num_groups = _groups(self.spec.num_arms, self.variant.shared)
        weights = self._weights(reply.fields["counts"].astype(np.int64))
        fields = {k: v for k, v in reply.fields.items() if k != "estimate"}
        fields["weighted_estimate"] = weighted_direction_sums(
            reply.fields["estimate"], weights, group, num_groups
        )
        sparse = {k: m for k, m in reply.sparse.items() if k != "estimate"}
        return dataclasses.replace(reply, fields=fields, sparse=sparse)

    def _rows(self, client_ids: np.ndarray) -> np.ndarray:
        rows = np.searchsorted(self.client_ids, client_ids)
        if np.any(rows >= len(self.client_ids)) or np.any(self.client_ids[rows] != client_ids):
            raise ValueError(f"message addresses clients outside this group: {client_ids}")
        return rows

    def handle(self, message: Message) -> Message:
        rows = self._rows(message.client_ids)
        if message.kind == "explore":
            return self._explore(message, rows)
        if message.kind == "eliminate":
            return self._eliminate(message, rows)
        raise ValueError(f"unknown message kind {message.kind!r} for a phased-elimination client")

    def _observe(self, requested: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pull ``requested`` (n, K) of the group: (executed counts, reward sums) to report."""
        return self.env.pull_counts(requested)

    def _explore(self, message: Message, rows: np.ndarray) -> Message:
        phase = int(message.fields["phase"][0])
        every = self._every(rows)
        active = self.active if every else self.active[rows]
        counts = pull_counts(message.fields["weights"], phase_length(phase), active)
        if every:
            requested = counts
        else:
            requested = np.zeros(self.active.shape, dtype=np.int64)
            requested[rows] = counts
        executed, sums = self._observe(requested)
        if not every:
            executed, sums = executed[rows], sums[rows]
        self.explored_phase = phase
        pulled = executed > 0
        fields: dict[str, np.ndarray] = {"counts": executed.astype(np.int32), "pulled": pulled}
        if self.variant.estimator == "direction":
            features = self._features(rows)
            sq = self._sq_norm_rows(rows)
            # One buffer for every phase's estimates: the server reads them within the exchange.
            self._estimates = direction_estimates(sums, executed, features, sq, self._estimates)
            fields["estimate"] = self._estimates
            sparse = {"estimate": "pulled"}
            if phase == 0:
                fields["min_sq_norm"] = sq.min(axis=1)
        else:
            fields["reward_sum"] = sums
            sparse = {"reward_sum": "pulled"}
            if phase == 0:
                fields["features"] = self.features[rows]
        return Message(
            "report",
            message.round,
            message.client_ids,
            fields,
            sparse=sparse,
            known=frozenset({"pulled"}),
            meta={"pulls": self.env.pulls[rows]},
        )

    def _eliminate(self, message: Message, rows: np.ndarray) -> Message:
        if "min_sq_norm" in message.fields:
            self.min_sq_norm = float(message.fields["min_sq_norm"][0])
        n, K, d = len(rows), self.spec.num_arms, self.spec.dim
        theta, cov = message.fields["theta"], message.fields["cov"]
        if self.variant.shared:
            theta = np.broadcast_to(theta[:, None], (n, K, d))
            cov = np.broadcast_to(cov[:, None], (n, K, d, d))
        active = self.active[rows]
        scale = self.min_sq_norm if self.variant.estimator == "direction" else 1.0
        if np.isnan(scale):
            raise RuntimeError("eliminate message arrived before the server sent l = min ||x||^2")
        if self.variant.elimination == "phase":
            # A client with one active arm keeps it: only the others need scores and widths.
            choice = np.flatnonzero(active.sum(axis=1) >= 2)
            keep = active.copy()
            if choice.size:
                scores, widths = scores_and_widths(
                    self.features[rows[choice]], _rows_of(theta, choice), _rows_of(cov, choice)
                )
                keep[choice] = eliminate_phase(
                    scores, widths, active[choice], self.alpha, scale, self.sigma
                )
        else:
            scores, widths = scores_and_widths(self._features(rows), theta, cov)
            length = float(phase_length(self.explored_phase))
            self.sum_scores[rows] += np.where(active, length * scores, 0.0)
            self.sum_widths[rows] += np.where(active, length**2 * widths / scale, 0.0)
            self.total_length += length
            keep = eliminate_cumulative(
                self.sum_scores[rows],
                self.sum_widths[rows],
                self.total_length,
                active,
                self.alpha,
                self.sigma,
            )
        self.active[rows] = keep
        return Message(
            "active_set",
            message.round,
            message.client_ids,
            {"active": keep},
            meta={"pulls": self.env.pulls[rows]},
        )


def phased_elimination_spec(name: str, description: str, variant: Variant) -> AlgorithmSpec[Any]:
    """The registry entry of one phased-elimination variant; each cites the Fed-PE paper (the
    enhanced variant and the full-information reference are its authors' code)."""
    return AlgorithmSpec(
        name=name,
        description=description,
        params=PhasedEliminationParams,
        make_server=lambda spec, params: PhasedEliminationServer(spec, params, variant),
        make_client=lambda spec, params, env: PhasedEliminationClient(
            spec, params, variant, environment_of(env, BanditEnvironment)
        ),
        needs_shared_parameter=variant.shared,
        citation=citations.FEDPE,
    )


#: Declared in ``setup.cfg`` under ``fedbandit.algorithms``.
FEDPE = phased_elimination_spec(
    "fedpe",
    "Fed-PE, disjoint parameters (Huang et al. 2021)",
    Variant("direction", "phase", shared=False),
)
FEDPE_SHARED = phased_elimination_spec(
    "fedpe_shared",
    "Fed-PE, one parameter shared by all arms (Huang et al. 2021)",
    Variant("direction", "phase", shared=True),
)
FEDPE_ENHANCED = phased_elimination_spec(
    "fedpe_enhanced",
    "Enhanced Fed-PE: all past phases, log-based width",
    Variant("direction", "cumulative", shared=False),
)
COLLABORATIVE = phased_elimination_spec(
    "collaborative",
    "Full-information least squares with the same phases (reference)",
    Variant("least_squares", "cumulative", shared=False),
)
