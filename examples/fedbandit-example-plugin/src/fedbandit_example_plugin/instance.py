"""two_groups: two client populations that share the arms' parameters but not their best arm.

What it models: M clients of two kinds (say two regions, or two user types) choosing among the
same K items. An item's quality is a per-arm parameter theta_a common to everyone; what differs is
how each kind of client sees the item (its feature vector x_{i,a}), so the two populations prefer
different items. Pooling per-arm reward averages over all clients (plain federated UCB,
``fed_ucb`` with ``pooling = "counts"``) mixes the two populations and serves one of them the wrong
arm for ever; pooling least-squares statistics (``pooling = "least_squares"``) learns every theta_a
from both populations and still gives each client its own best arm.

Construction (all randomness from ``domain_generator(seed, INSTANCE_DOMAIN)``):

1. theta_a uniform on the unit sphere of R^d, one per arm (disjoint parameters).
2. Clients are split into two groups of sizes floor(M/2) and ceil(M/2) by a random permutation.
3. Two distinct best arms b_0 != b_1 are drawn; each group g gets prototype features z_{g,a}
   uniform in the unit ball (radius >= 0.1), and z_{g,b_g} is moved along theta_{b_g} until
   mu_{g,b_g} = max_{a != b_g} mu_{g,a} + 1.5 gap, with mu_{g,a} = z_{g,a}^T theta_a.
4. Client i of group g has x_{i,a} = z_{g,a} + e_{i,a}, with e_{i,a} uniform in the ball of
   radius gap/4: its means move by at most gap/4, so its best arm is b_g and beats every other arm
   by at least ``gap``. In particular b_0 is at least ``gap`` worse than b_1 for group 1 and vice
   versa.

``info`` (in ``manifest.json``): the group sizes, the two best arms, and the arm that maximises the
mean reward averaged over all clients (what per-arm count pooling converges to).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fedbandit import INSTANCE_DOMAIN, InstanceKindSpec, LinearBanditInstance, domain_generator


class TwoGroupsParams(BaseModel):
    """Parameters of the ``two_groups`` instance kind."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["two_groups"] = "two_groups"
    num_clients: int = Field(20, ge=2, description="M, number of clients (two groups)")
    num_arms: int = Field(5, ge=2, description="K, number of arms")
    dim: int = Field(3, ge=1, description="d, feature dimension")
    noise_sigma: float = Field(0.5, ge=0, description="standard deviation of reward noise")
    gap: float = Field(
        0.2, gt=0, le=1, description="every client's best arm beats its others by at least this"
    )
    seed: int = Field(0, ge=0, description="seed of the instance draw (not of the rewards)")


def _uniform_ball(
    rng: np.random.Generator, shape: tuple[int, ...], dim: int, low: float, high: float
) -> np.ndarray:
    """Points uniform in the shell low <= ||x|| <= high of R^dim, shape (*shape, dim)."""
    directions = rng.standard_normal((*shape, dim))
    directions /= np.linalg.norm(directions, axis=-1, keepdims=True)
    u = rng.uniform((low / high) ** dim, 1.0, size=(*shape, 1))
    return directions * high * u ** (1.0 / dim)


def two_groups(params: TwoGroupsParams) -> LinearBanditInstance:
    """Build the instance (see the module docstring)."""
    rng = domain_generator(params.seed, INSTANCE_DOMAIN)
    M, K, d, gap = params.num_clients, params.num_arms, params.dim, params.gap
    thetas = rng.standard_normal((K, d))
    thetas /= np.linalg.norm(thetas, axis=1, keepdims=True)
    group = rng.permutation(np.arange(M) % 2)
    best = rng.choice(K, size=2, replace=False)
    prototypes = _uniform_ball(rng, (2, K), d, 0.1, 1.0)
    for g in (0, 1):
        mu = np.einsum("kd,kd->k", prototypes[g], thetas)
        b = int(best[g])
        target = np.delete(mu, b).max() + 1.5 * gap
        prototypes[g, b] += (target - mu[b]) * thetas[b]  # ||theta_b|| = 1
    jitter = _uniform_ball(rng, (M, K), d, 0.0, gap / 4)
    features = prototypes[group] + jitter
    instance_means = np.einsum("mkd,kd->mk", features, thetas)
    info = {
        "group_sizes": [int(np.sum(group == 0)), int(np.sum(group == 1))],
        "best_arms": [int(best[0]), int(best[1])],
        "pooled_best_arm": int(instance_means.mean(axis=0).argmax()),
    }
    return LinearBanditInstance(
        features, thetas, params.noise_sigma, shared_parameter=False, name="two_groups", info=info
    )


TWO_GROUPS = InstanceKindSpec(
    kind="two_groups",
    params=TwoGroupsParams,
    build=two_groups,
    description="Two client populations with shared arm parameters but different best arms "
    "(plugin)",
)
