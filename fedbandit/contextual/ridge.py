"""Ridge regression for the LinUCB family, vectorised over clients and parameter groups.

Each client keeps, per group g (one group per arm for disjoint models, one group for a shared
parameter), V = lambda I + sum x x^T and b = sum r x over the rounds the group was played, the
inverse V^{-1} by Sherman-Morrison rank-one updates (no O(d^3) inverse per step), log det V by the
matrix determinant lemma, and a periodic refresh of V^{-1} from V itself (numerical safety).

Index of arm k with context x_k (Li et al. 2010; Abbasi-Yadkori, Pal, Szepesvari 2011):
    x_k^T theta_hat_g + beta_g sqrt(x_k^T V_g^{-1} x_k),  theta_hat_g = V_g^{-1} b_g.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np


def sherman_morrison(
    inverse: np.ndarray, x: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(V + x x^T)^{-1} = V^{-1} - V^{-1} x x^T V^{-1} / (1 + x^T V^{-1} x), batched over the
    leading axes. Also returns q = x^T V^{-1} x (log det grows by log(1 + q)) and the gain
    k = (V + x x^T)^{-1} x = V^{-1} x / (1 + q) (theta_hat grows by k (r - x^T theta_hat))."""
    vx = np.matmul(inverse, x[..., None])[..., 0]
    quad = (x * vx).sum(axis=-1)
    gain = vx / (1.0 + quad)[..., None]
    return inverse - vx[..., :, None] * gain[..., None, :], quad, gain


def self_normalized_radius(
    logdet: np.ndarray,
    dim: int,
    regularization: float,
    sigma: float,
    theta_bound: float,
    delta: float | np.ndarray,
) -> np.ndarray:
    """beta = sigma sqrt(2 log(1/delta) + log det V - d log lambda) + sqrt(lambda) S
    (Abbasi-Yadkori et al. 2011, Theorem 2)."""
    inner = 2.0 * np.log(1.0 / delta) + logdet - dim * math.log(regularization)
    return sigma * np.sqrt(np.maximum(inner, 0.0)) + math.sqrt(regularization) * theta_bound


def count_radius(
    counts: np.ndarray,
    dim: int,
    regularization: float,
    sigma: float,
    theta_bound: float,
    delta: float,
) -> np.ndarray:
    """alpha_t = sigma sqrt(d log(1 + n / (d lambda)) + 2 log(1/delta)) + sqrt(lambda) S, n the
    samples in the statistics: the OFUL radius with log det V / det(lambda I) replaced by its
    bound for ||x|| <= 1, as Li & Wang's code computes it (``cyrilli/Async-LinUCB``,
    ``lib/SyncLinUCB.py`` and ``lib/AsyncLinUCB.py``, ``LocalClient.alpha_t``, S = 1 there)."""
    inner = dim * np.log(1.0 + counts / (dim * regularization)) + 2.0 * math.log(1.0 / delta)
    return sigma * np.sqrt(inner) + math.sqrt(regularization) * theta_bound


class RidgeLearners:
    """n independent ridge learners (one per client), each with G parameter groups."""

    def __init__(
        self,
        num_clients: int,
        num_groups: int,
        dim: int,
        regularization: float,
        refresh_every: int = 1024,
    ) -> None:
        self.dim, self.regularization = dim, regularization
        self.refresh_every = refresh_every
        eye = np.eye(dim)
        self.gram = np.broadcast_to(
            regularization * eye, (num_clients, num_groups, dim, dim)
        ).copy()
        self.inverse = np.broadcast_to(
            eye / regularization, (num_clients, num_groups, dim, dim)
        ).copy()
        self.target = np.zeros((num_clients, num_groups, dim))
        self.theta = np.zeros((num_clients, num_groups, dim))
        self._identity: dict[bytes, bool] = {}
        self.logdet = np.full((num_clients, num_groups), dim * math.log(regularization))
        self.updates = 0

    def estimates(self) -> np.ndarray:
        """theta_hat = V^{-1} b, (n, G, d) (kept up to date by every update)."""
        return self.theta

    def _per_arm(self, group: np.ndarray) -> bool:
        """Whether ``group`` is the identity (one model per arm); cached by its contents."""
        key = group.tobytes()
        if key not in self._identity:
            self._identity[key] = len(group) == self.theta.shape[1] and bool(
                np.array_equal(group, np.arange(len(group)))
            )
        return self._identity[key]

    def _by_arm(self, values: np.ndarray, group: np.ndarray) -> np.ndarray:
        """Per-group arrays seen per arm without copying when groups are trivial."""
        num_groups = values.shape[1]
        if num_groups == 1:
            return values  # broadcasts over the arm axis
        if num_groups == len(group) and np.array_equal(group, np.arange(num_groups)):
            return values
        return values[:, group]

    def indices(self, contexts: np.ndarray, group: np.ndarray, radius: np.ndarray) -> np.ndarray:
        """x_k^T theta_g + radius_g ||x_k||_{V_g^{-1}} for contexts (n, K, d), radius (n, G)."""
        n, num_groups, d = self.theta.shape
        if (
            contexts.strides[1] == 0
            and num_groups == len(group)
            and np.array_equal(group, np.arange(num_groups))
        ):
            # One context for every arm and one model per arm: two batched GEMVs per client.
            x = np.ascontiguousarray(contexts[:, 0])[:, :, None]  # (n, d, 1)
            vx = np.matmul(self.inverse.reshape(n, num_groups * d, d), x).reshape(n, -1, d)
            width = np.maximum((vx * x[:, None, :, 0]).sum(axis=2), 0.0)
            mean = np.matmul(self.theta, x)[..., 0]
            return mean + radius * np.sqrt(width)
        inverse = self._by_arm(self.inverse, group)
        theta = self._by_arm(self.theta, group)
        vx = np.matmul(inverse, contexts[..., None])[..., 0]
        width = np.maximum((vx * contexts).sum(axis=2), 0.0)
        mean = (theta * contexts).sum(axis=2)
        return mean + self._by_arm(radius, group) * np.sqrt(width)

    def select(self, contexts: np.ndarray, group: np.ndarray, radius: np.ndarray) -> np.ndarray:
        """argmax_k of ``indices`` per client, by the compiled kernel (first maximum on ties)."""
        from fedbandit.contextual.kernels import select_arms  # numba loads on first use

        arms = np.empty(len(contexts), dtype=np.int64)
        select_arms(self.inverse, self.theta, contexts, group, radius, arms)
        return arms

    def update(
        self, rows: np.ndarray, groups: np.ndarray, x: np.ndarray, rewards: np.ndarray
    ) -> None:
        """Add (x, r) to group ``groups[j]`` of client ``rows[j]`` (compiled kernel)."""
        from fedbandit.contextual.kernels import ridge_update

        ridge_update(
            self.inverse,
            self.theta,
            self.gram,
            self.target,
            self.logdet,
            np.ascontiguousarray(rows, dtype=np.int64),
            np.ascontiguousarray(groups, dtype=np.int64),
            np.ascontiguousarray(x, dtype=np.float64),
            np.ascontiguousarray(rewards, dtype=np.float64),
        )
        self.updates += 1
        if self.updates % self.refresh_every == 0:
            self.refresh()

    def refresh(self, rows: np.ndarray | slice = slice(None)) -> None:
        """Recompute V^{-1} and log det V from V (after a download, or periodically)."""
        self.inverse[rows] = np.linalg.inv(self.gram[rows])
        self.logdet[rows] = np.linalg.slogdet(self.gram[rows])[1]
        self.theta[rows] = np.matmul(self.inverse[rows], self.target[rows][..., None])[..., 0]

    def set_view(self, rows: np.ndarray, gram: np.ndarray, target: np.ndarray) -> None:
        """Replace the statistics of ``rows`` (a download of global statistics)."""
        self.gram[rows] = gram
        self.target[rows] = target
        self.refresh(rows)


RadiusRule = Literal["fixed", "self_normalized", "zero"]
DeltaSchedule = Literal["constant", "inverse_square"]


def radius(
    rule: RadiusRule,
    learners: RidgeLearners,
    step: np.ndarray,
    *,
    alpha: float,
    sigma: float,
    theta_bound: float,
    delta: float,
    schedule: DeltaSchedule,
) -> np.ndarray:
    """The confidence radius per client and group, (n, G), at each client's own step t >= 1.

    fixed: alpha (LinUCB, Li et al. 2010); zero: greedy; self_normalized: the OFUL radius with
    delta_t = delta (constant) or delta_t = 1/t^2 (inverse_square, our reading of LinUCB-d).
    """
    shape = learners.logdet.shape
    if rule == "fixed":
        return np.full(shape, alpha)
    if rule == "zero":
        return np.zeros(shape)
    if schedule == "constant":
        delta_t: float | np.ndarray = delta
    elif step.min() == step.max():
        delta_t = 1.0 / max(int(step[0]), 1) ** 2  # every client at the same step: a scalar
    else:
        delta_t = 1.0 / np.maximum(step, 1)[:, None] ** 2
    return self_normalized_radius(
        learners.logdet, learners.dim, learners.regularization, sigma, theta_bound, delta_t
    )
