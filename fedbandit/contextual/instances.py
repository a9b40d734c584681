"""Contextual instances: every client draws a fresh context every round.

Contexts are stored as x_{t,k} in R^d for every arm k, shape (K, d) per client and round, and the
expected reward of arm k is x_{t,k}^T theta_k. Two settings share this form:

- ``disjoint`` (the LinUCB-d setting, Wu, Yang, Shen, AISTATS 2020): one context x_t per round,
  x_{t,k} = x_t for every arm, and a parameter theta_k per arm.
- ``shared`` (the DisLinUCB setting, Wang et al., ICLR 2020): one parameter theta for all arms and a
  feature vector x_{t,k} per arm per round.

Heterogeneous clients (``heterogeneity`` epsilon > 0, the setting of H-LinUCB, Do, Nguyen-Tang,
Arora, NeurIPS 2023), generated as the authors' ``get_type_training`` / ``create_theta_list`` do
(``anhddo/hlinUCB``, ``algo.py``): client m has its own parameters
theta_{m,k} = (1 - epsilon) s theta_k + 0.55 epsilon u_{m,k}, s the ``common_scale`` (their
``base_scale``), u_{m,k} a random unit vector; ||theta_{m,k}|| <= 1 for s <= 1 and two clients'
parameters differ by at most 1.1 epsilon. The realised maximum difference (the dissimilarity,
which H-LinUCB is told, as in the authors' code) is in the instance summary. The authors keep the
closest of 1000 draws to the target epsilon; ours is one draw.

Context laws: ``gaussian`` (N(0, I_d)), ``sphere`` (uniform on the unit sphere),
``cube_normalized`` (uniform in the cube [-1, 1]^d, then normalised: unit vectors, but not uniform
on the sphere, more of them towards the cube's corners; the actions of ``anhddo/hlinUCB``,
``create_action_set``: ``normalize(np.random.rand(K, d) - 0.5)``), ``points`` (one of
``num_points`` fixed points, drawn at instance creation), ``subspace`` (N(0, P) with P the
projection on a random ``subspace_dim``-dimensional subspace). A hard ``margin``: contexts whose
best and second-best arms are closer than it are redrawn (rejection sampling).

Generalised linear rewards (``kind = "glm_contextual"``, the setting of FedGLB-UCB, Li and Wang,
NeurIPS 2022): the mean of arm k is mu(x_{t,k}^T theta_k) with a ``logistic`` (1 / (1 + e^-z)) or
``probit`` (Phi(z)) link, every parameter scaled to norm ``theta_norm``, and the reward is
Bernoulli(mu). The regret is measured on mu, the true link. A reward is drawn from the client's
normal noise stream as 1{z < Phi^-1(mu)} (z ~ N(0, 1), so the chance is exactly mu), so a GLM
instance uses the same streams and chunk layout as a linear one. Its ``points`` pool can be the
FedGLB-UCB authors' arms: ``bias_coordinate`` (a unit vector in d - 1 coordinates and a constant 1,
norm sqrt 2) and ``basis_points`` (the first d arms the basis vectors with that bias coordinate).

Diversity (our reading of Wu et al. 2020, as in that line of work): for every arm k,
lambda_0 = min_k lambda_min(E[x x^T 1{k optimal at x}]) > 0 in the disjoint setting; for a shared
parameter lambda_0 = lambda_min(E[x_{k*} x_{k*}^T]) with k* the optimal arm. ``diversity`` estimates
it by Monte Carlo.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedbandit.contextual.environment import ContextualEnvironment
from fedbandit.group_environment import GroupEnvironment
from fedbandit.instances import InstanceKindSpec
from fedbandit.rng import INSTANCE_DOMAIN, domain_generator

#: Rejection sampling gives up when fewer than this fraction of draws survive the margin.
MIN_ACCEPTANCE = 1e-3


class ContextualParams(BaseModel):
    """Parameters of a contextual instance (``kind = "contextual"`` in an experiment)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["contextual"] = "contextual"
    setting: Literal["disjoint", "shared"] = Field("disjoint")
    contexts: Literal["gaussian", "sphere", "cube_normalized", "points", "subspace"] = Field(
        "gaussian"
    )
    num_clients: int = Field(10, ge=1, description="M")
    num_arms: int = Field(5, ge=2, description="K")
    dim: int = Field(5, ge=1, description="d")
    noise_sigma: float = Field(0.5, ge=0)
    margin: float = Field(0.0, ge=0, description="redraw contexts whose top-two gap is below")
    num_points: int = Field(3, ge=1, description="support size of the 'points' law")
    subspace_dim: int = Field(1, ge=0, description="dimension of the 'subspace' law")
    participation: float = Field(1.0, gt=0, le=1, description="chance a client acts in a round")
    arrival: Literal["synchronous", "sequential", "round_robin"] = Field(
        "synchronous",
        description="synchronous: every client acts in every round (T rounds); sequential: one "
        "client drawn uniformly acts per global step (T global steps), as in the papers' "
        "simulations; round_robin: clients act one after another in id order, one per global "
        "step (T global steps, T / M rounds), as in H-LinUCB's simulations",
    )
    heterogeneity: float = Field(
        0.0,
        ge=0,
        le=2,
        description="epsilon: client m's parameter is (1 - eps) s theta + 0.55 eps u_m",
    )
    common_scale: float = Field(
        1.0, gt=0, le=1, description="s, the norm of the clients' common part over (1 - eps)"
    )
    balance_draws: int = Field(
        1, ge=1, le=1000, description="parameter sets drawn; the most balanced one is kept"
    )
    seed: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> ContextualParams:
        if self.contexts == "subspace" and self.subspace_dim >= self.dim:
            raise ValueError("subspace_dim must be smaller than dim for 'subspace' contexts")
        if self.arrival != "synchronous" and self.participation < 1:
            raise ValueError(
                f"the {self.arrival} arrival order says who acts: participation must be 1"
            )
        return self


class GLMContextualParams(ContextualParams):
    """Parameters of a generalised linear contextual instance (``kind = "glm_contextual"``):
    those of ``contextual`` plus the link and the parameters' norm; rewards are Bernoulli, so
    ``noise_sigma`` is only the sub-Gaussian constant algorithms assume (1/2 for rewards in
    [0, 1])."""

    kind: Literal["glm_contextual"] = "glm_contextual"  # type: ignore[assignment]
    link: Literal["logistic", "probit"] = Field("logistic", description="mu(z)")
    theta_norm: float = Field(1.0, gt=0, description="||theta_k|| (the common part's norm)")
    bias_coordinate: bool = Field(
        False,
        description="with contexts = 'points': each point is a unit vector in the first d - 1 "
        "coordinates and a constant 1 in the last (norm sqrt 2)",
    )
    basis_points: bool = Field(
        False,
        description="with contexts = 'points': the first d points are the rows of the identity, "
        "with bias_coordinate each with its last coordinate set to 1 (e_i + e_d, and e_d)",
    )

    @model_validator(mode="after")
    def _check_points(self) -> GLMContextualParams:
        for name in ("bias_coordinate", "basis_points"):
            if getattr(self, name) and self.contexts != "points":
                raise ValueError(
                    f"{name} shapes a fixed pool of arms: it needs contexts = 'points'"
                )
        if self.bias_coordinate and self.dim < 2:
            raise ValueError("bias_coordinate needs dim >= 2 (d - 1 free coordinates and the bias)")
        if self.basis_points and self.num_points < self.dim:
            raise ValueError("basis_points puts the d basis vectors in the pool: num_points >= dim")
        return self


@dataclass(frozen=True)
class ContextualInstance:
    """The truth of a contextual instance: parameters and the law of contexts."""

    params: ContextualParams
    thetas: np.ndarray
    points: np.ndarray | None
    basis: np.ndarray | None
    name: str = "contextual"
    info: dict[str, Any] = field(default_factory=dict)
    #: (M, K, d): each client's own parameters (heterogeneous clients), or None (all share thetas).
    client_thetas: np.ndarray | None = None

    @property
    def num_clients(self) -> int:
        return self.params.num_clients

    @property
    def num_arms(self) -> int:
        return self.params.num_arms

    @property
    def dim(self) -> int:
        return self.params.dim

    @property
    def noise_sigma(self) -> float:
        return self.params.noise_sigma

    @property
    def shared_parameter(self) -> bool:
        return self.params.setting == "shared"

    @property
    def link(self) -> str | None:
        """The link of a generalised linear instance, None for linear rewards."""
        return getattr(self.params, "link", None)

    def rewards(self, means: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """Rewards of arms with ``means`` from standard normal ``noise`` of the same shape:
        mean + sigma z (linear), or 1{z < Phi^-1(mean)}, Bernoulli(mean) (generalised linear)."""
        if self.link is None:
            return means + self.noise_sigma * noise
        from scipy.special import ndtri  # SciPy: only generalised linear instances need it

        return (noise < ndtri(means)).astype(np.float64)

    @property
    def contextual(self) -> bool:
        return True

    def make_environment(
        self, client_ids: np.ndarray | Sequence[int], horizon: int, entropy: int | Sequence[int]
    ) -> GroupEnvironment:
        return ContextualEnvironment(self, client_ids, horizon, entropy)

    @property
    def context_rows(self) -> int:
        """Distinct context vectors per round: 1 (disjoint: x_{t,k} = x_t) or K (shared)."""
        return 1 if self.params.setting == "disjoint" else self.params.num_arms

    def _raw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """``count`` compact contexts before the margin, shape (count, context_rows, d)."""
        p = self.params
        rows = self.context_rows
        if p.contexts == "points":
            assert self.points is not None
            return self.points[rng.integers(0, len(self.points), size=(count, rows))]
        if p.contexts == "cube_normalized":
            cube = rng.uniform(-1.0, 1.0, (count, rows, p.dim))
            return cube / np.linalg.norm(cube, axis=2, keepdims=True)
        draw = rng.standard_normal((count, rows, p.dim))
        if p.contexts == "sphere":
            draw /= np.linalg.norm(draw, axis=2, keepdims=True)
        elif p.contexts == "subspace":
            assert self.basis is not None
            draw = draw[..., : p.subspace_dim] @ self.basis.T
        return draw

    def means(self, contexts: np.ndarray, client_id: int | None = None) -> np.ndarray:
        """mu_k = x_k^T theta_k (a generalised linear instance: mu(x_k^T theta_k), its link) for
        contexts of shape (..., K, d) or compact (..., 1, d), with client ``client_id``'s own
        parameters on a heterogeneous instance (default: the common ones).

        A compiled loop rather than a matrix product, so a value never depends on how many
        contexts are evaluated together (BLAS blocking would change the rounding)."""
        flat = np.ascontiguousarray(contexts).reshape(-1, *contexts.shape[-2:])
        from fedbandit.contextual.kernels import context_means  # numba loads on first use

        thetas = self.thetas
        if self.client_thetas is not None and client_id is not None:
            thetas = self.client_thetas[client_id]
        linear = context_means(flat, thetas).reshape(*contexts.shape[:-2], self.num_arms)
        return linear if self.link is None else link_function(self.link, linear)

    def expand(self, compact: np.ndarray) -> np.ndarray:
        """Compact contexts (..., context_rows, d) as per-arm contexts (..., K, d) (a view)."""
        return np.broadcast_to(compact, (*compact.shape[:-2], self.num_arms, self.dim))

    def sample_contexts(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """``count`` compact contexts (count, context_rows, d) that respect the margin."""
        return self.sample_contexts_and_means(rng, count)[0]

    def sample_contexts_and_means(
        self, rng: np.random.Generator, count: int, client_id: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """``count`` compact contexts of client ``client_id`` (the same law for every client here)
        that respect the margin, and their means (count, K). The environment calls this once per
        client and chunk with the client's own generator."""
        out = np.empty((count, self.context_rows, self.dim))
        means = np.empty((count, self.num_arms))
        filled, drawn = 0, 0
        while filled < count:
            batch = self._raw(rng, (count - filled) * 5 // 4 + 16)
            batch_means = self.means(batch, client_id)
            drawn += len(batch)
            if self.params.margin > 0:
                keep = top_two_gap(batch_means) >= self.params.margin
                batch, batch_means = batch[keep], batch_means[keep]
            take = min(len(batch), count - filled)
            out[filled : filled + take] = batch[:take]
            means[filled : filled + take] = batch_means[:take]
            filled += take
            if drawn > 64 and filled < MIN_ACCEPTANCE * drawn:
                raise ValueError(
                    f"margin {self.params.margin} rejects nearly every context of this instance "
                    f"({filled} of {drawn} kept); lower instance.margin"
                )
        return out, means

    def diversity(self, samples: int = 20000, seed: int = 12345) -> dict[str, float]:
        """Monte Carlo lambda_0 and the empirical top-two gap quantiles of the context law."""
        rng = np.random.default_rng(seed)
        x = self.expand(self.sample_contexts(rng, samples))
        mu = self.means(x)
        best = mu.argmax(axis=1)
        rows = np.arange(samples)
        chosen = x[rows, best]  # (n, d): the optimal arm's feature vector
        if self.shared_parameter:
            lam = float(np.linalg.eigvalsh(chosen.T @ chosen / samples)[0])
        else:
            lam = np.inf
            for k in range(self.num_arms):
                xk = chosen[best == k]
                second = xk.T @ xk / samples
                lam = min(lam, float(np.linalg.eigvalsh(second)[0]))
        gaps = top_two_gap(mu)
        return {
            "lambda_0": max(lam, 0.0),
            "margin": self.params.margin,
            "gap_min_sampled": float(gaps.min()),
            "gap_median_sampled": float(np.median(gaps)),
            "optimal_arm_shares": np.bincount(best, minlength=self.num_arms).tolist(),
        }

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            **self.params.model_dump(mode="json"),
            **self.diversity(),
            **self.info,
        }


def link_function(link: str, z: np.ndarray) -> np.ndarray:
    """mu(z): ``logistic`` 1 / (1 + e^-z) or ``probit`` Phi(z), the standard normal cdf."""
    from scipy.special import expit, ndtr  # SciPy: only generalised linear instances need it

    if link == "logistic":
        return expit(z)
    if link == "probit":
        return ndtr(z)
    raise ValueError(f"unknown link {link!r}; known: logistic, probit")


def top_two_gap(means: np.ndarray) -> np.ndarray:
    """Best minus second-best mean along the last axis (0 when the best is tied)."""
    best = means.max(axis=-1, keepdims=True)
    first = means.argmax(axis=-1)[..., None]
    others = np.where(np.arange(means.shape[-1]) == first, -np.inf, means)
    return best[..., 0] - others.max(axis=-1)


def contextual_instance(params: ContextualParams) -> ContextualInstance:
    """Draw the parameters: theta_k uniform on the unit sphere (one theta if shared), so that in the
    disjoint setting every arm wins a full-dimensional cone of Gaussian contexts. With
    ``balance_draws`` > 1, that many parameter sets are drawn and the one whose least-often optimal
    arm is optimal most often (on 4096 contexts) is kept: a cheap way to a larger lambda_0."""
    rng = domain_generator(params.seed, INSTANCE_DOMAIN)
    points = basis = None
    if params.contexts == "points":
        points = rng.standard_normal((params.num_points, params.dim))
        points /= np.linalg.norm(points, axis=1, keepdims=True)
    if params.contexts == "subspace":
        basis, _ = np.linalg.qr(rng.standard_normal((params.dim, max(params.subspace_dim, 1))))
        basis = basis[:, : params.subspace_dim]
    count = 1 if params.setting == "shared" else params.num_arms
    best, best_share = None, -1
    for _ in range(params.balance_draws):
        thetas = rng.standard_normal((count, params.dim))
        thetas /= np.linalg.norm(thetas, axis=1, keepdims=True)
        thetas = np.broadcast_to(thetas, (params.num_arms, params.dim)).copy()
        candidate = ContextualInstance(
            params, thetas, points, basis, name=f"contextual_{params.contexts}"
        )
        if params.balance_draws == 1:
            return _heterogeneous(candidate, rng)
        x = candidate.expand(candidate._raw(rng, 4096))
        share = np.bincount(candidate.means(x).argmax(axis=1), minlength=params.num_arms).min()
        if share > best_share:
            best, best_share = candidate, share
    assert best is not None
    return _heterogeneous(best, rng)


def _heterogeneous(instance: ContextualInstance, rng: np.random.Generator) -> ContextualInstance:
    """``instance`` with each client's own parameters when ``heterogeneity`` > 0 (drawn after
    everything else, so a homogeneous instance of the same seed is unchanged):
    theta_{m,k} = (1 - eps) s theta_k + 0.55 eps u_{m,k}, u_{m,k} uniform on the unit sphere (one
    u_m for every arm with a shared parameter); the code's u is ``normalize(rand - 0.5)``."""
    p = instance.params
    eps = p.heterogeneity
    if eps == 0:
        return instance
    count = 1 if p.setting == "shared" else p.num_arms
    u = rng.standard_normal((p.num_clients, count, p.dim))
    u /= np.linalg.norm(u, axis=2, keepdims=True)
    own = (1 - eps) * p.common_scale * instance.thetas[None, :count] + 0.55 * eps * u
    own = np.broadcast_to(own, (p.num_clients, p.num_arms, p.dim)).copy()
    return ContextualInstance(
        p,
        instance.thetas,
        instance.points,
        instance.basis,
        name=f"{instance.name}_heterogeneous",
        info={**instance.info, "dissimilarity": dissimilarity(own)},
        client_thetas=own,
    )


def dissimilarity(client_thetas: np.ndarray) -> float:
    """max over clients i, j and arms k of ||theta_{i,k} - theta_{j,k}|| (H-LinUCB's epsilon,
    ``calc_dissimilarity`` in ``anhddo/hlinUCB``)."""
    gaps = client_thetas[:, None] - client_thetas[None, :]
    return float(np.linalg.norm(gaps, axis=-1).max())


def glm_contextual_instance(params: GLMContextualParams) -> ContextualInstance:
    """The contextual instance of the same seed and law with every parameter (common and each
    client's own) scaled to ``theta_norm`` times its norm there, and the link applied to the
    means: parameters drawn as for ``contextual``, so theta_k is uniform on the sphere of radius
    ``theta_norm``.

    The arms of FedGLB-UCB's authors (``cyrilli/FedGLB-UCB``, ``RunSyntheticDataset.py``: a pool
    of 1000 arms, ``randn(n, d - 1)`` normalised with a bias coordinate 1 appended, the first d
    rows overwritten by ``eye(d)`` with its last column set to 1; K drawn with replacement per
    step) are ``contexts = "points"``, ``num_points = 1000``, ``bias_coordinate`` and
    ``basis_points``: then d - 1 of the pool's arms are e_i + e_d (norm sqrt 2), one is e_d
    (norm 1, the bias alone) and the rest are (u, 1) with u uniform on the unit sphere of
    R^(d-1) (norm sqrt 2). u is the first d - 1 coordinates of the linear instance's point,
    renormalised (the same law as the authors' draw; the parameters are those of the linear
    instance of the same seed)."""
    base = contextual_instance(params)
    points = base.points
    if points is not None and (params.bias_coordinate or params.basis_points):
        points = authors_arm_pool(points, params.bias_coordinate, params.basis_points)
    scale = params.theta_norm
    own = None if base.client_thetas is None else base.client_thetas * scale
    info = dict(base.info)
    if own is not None:
        info["dissimilarity"] = dissimilarity(own)
    suffix = "_bias" if params.bias_coordinate else ""
    return ContextualInstance(
        params,
        base.thetas * scale,
        points,
        base.basis,
        name=f"glm_{params.link}_{params.contexts}{suffix}",
        info=info,
        client_thetas=own,
    )


def authors_arm_pool(points: np.ndarray, bias_coordinate: bool, basis_points: bool) -> np.ndarray:
    """Unit ``points`` (n, d) as a pool with a bias coordinate and/or the basis in front (see
    ``glm_contextual_instance``): with ``bias_coordinate`` each row becomes (u / ||u||, 1), u its
    first d - 1 coordinates; with ``basis_points`` the first d rows become eye(d), with
    ``bias_coordinate`` its last column set to 1 (the script's ``basis[:, -1] = 1``)."""
    pool = np.array(points, dtype=np.float64)
    d = pool.shape[1]
    if bias_coordinate:
        free = pool[:, : d - 1]
        pool[:, : d - 1] = free / np.linalg.norm(free, axis=1, keepdims=True)
        pool[:, d - 1] = 1.0
    if basis_points:
        basis = np.eye(d)
        if bias_coordinate:
            basis[:, -1] = 1.0
        pool[:d] = basis
    return pool


#: Declared in ``pyproject.toml`` under ``fedbandit.instances``.
CONTEXTUAL = InstanceKindSpec(
    "contextual",
    ContextualParams,
    contextual_instance,
    "Fresh contexts every round (LinUCB-d's diverse and non-diverse settings)",
)
GLM_CONTEXTUAL = InstanceKindSpec(
    "glm_contextual",
    GLMContextualParams,
    glm_contextual_instance,
    "Fresh contexts every round, Bernoulli rewards through a logistic or probit link",
)
