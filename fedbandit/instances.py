"""Problem instances: fixed per-client arm features with linear rewards.

Model (Huang et al., "Federated Linear Contextual Bandits", NeurIPS 2021, Sec. 2): client i holds a
feature vector x_{i,a} in R^d for every arm a; pulling arm a returns
y = x_{i,a}^T theta_a + eta with eta ~ N(0, sigma^2). In the shared-parameter case theta_a = theta
for every arm. The instance holds the truth; learners only ever see their own features and rewards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedbandit.group_environment import GroupEnvironment
from fedbandit.rng import INSTANCE_DOMAIN, domain_generator


@runtime_checkable
class Instance(Protocol):
    """What every instance kind builds: the truth behind rewards and regret for M clients.

    ``contextual`` says which algorithms apply (fresh contexts each round, or fixed features per
    client and arm); ``make_environment`` gives the environment that plays a group of clients, so
    the harness never chooses one by type. ``summary`` goes into ``manifest.json``; a kind that
    reads files records them there as ``data_files`` (path -> SHA-256, see ``data_files``).
    """

    @property
    def num_clients(self) -> int: ...
    @property
    def num_arms(self) -> int: ...
    @property
    def dim(self) -> int: ...
    @property
    def noise_sigma(self) -> float: ...
    @property
    def shared_parameter(self) -> bool: ...
    @property
    def contextual(self) -> bool: ...

    def summary(self) -> dict[str, Any]: ...

    def make_environment(
        self, client_ids: np.ndarray | Sequence[int], horizon: int, entropy: int | Sequence[int]
    ) -> GroupEnvironment:
        """The environment of the clients ``client_ids`` over ``horizon`` steps, rewards seeded
        by ``entropy`` (one stream per client, see ``fedbandit.rng``)."""
        ...


def data_files(instance: Instance) -> dict[str, str]:
    """The files an instance was built from, path -> SHA-256 of the bytes read: its summary's
    ``data_files`` (data-backed kinds record it; empty for generated instances). A results
    folder holds the results of one such set of files. Read from the instance's ``info`` where it
    has one (every built-in kind: its summary would be recomputed, a contextual instance's
    Monte Carlo diversity included, for every seed), else from ``summary()``."""
    info = getattr(instance, "info", None)
    if isinstance(info, dict):
        return dict(info.get("data_files") or {})
    return dict(instance.summary().get("data_files") or {})


@dataclass(frozen=True)
class InstanceKindSpec:
    """A registry entry for an instance kind: its name (the ``kind`` key of an experiment's
    ``[instance]`` table), the parameter model (a pydantic model with ``kind: Literal[name]`` and
    ``extra="forbid"``) and the builder from validated parameters to an ``Instance``. Built-in
    kinds and plugins alike declare one under the ``fedbandit.instances`` entry-point group."""

    kind: str
    params: type[BaseModel]
    build: Callable[[Any], Instance]
    description: str = ""

    def __post_init__(self) -> None:
        declared = self.params.model_fields.get("kind")
        if declared is None or declared.default != self.kind:
            raise TypeError(
                f"instance kind {self.kind!r}: its parameter model {self.params.__name__} must "
                f'declare kind: Literal["{self.kind}"] = "{self.kind}"'
            )


@dataclass(frozen=True)
class LinearBanditInstance:
    """Features (M, K, d), parameters (K, d), noise level; the truth behind rewards and regret."""

    features: np.ndarray
    thetas: np.ndarray
    noise_sigma: float
    shared_parameter: bool
    name: str = "instance"
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.features.ndim != 3:
            raise ValueError(f"features must have shape (M, K, d), got {self.features.shape}")
        num_arms, dim = self.features.shape[1:]
        if self.thetas.shape != (num_arms, dim):
            raise ValueError(f"thetas must have shape {(num_arms, dim)}, got {self.thetas.shape}")
        if not (np.all(np.isfinite(self.features)) and np.all(np.isfinite(self.thetas))):
            raise ValueError("features and thetas must be finite")
        if np.any(np.linalg.norm(self.features, axis=2) == 0):
            raise ValueError("every feature vector x_{i,a} must be nonzero")
        if not self.noise_sigma >= 0:
            raise ValueError(f"noise_sigma must be >= 0, got {self.noise_sigma}")
        if self.shared_parameter and not np.allclose(self.thetas, self.thetas[0]):
            raise ValueError("a shared-parameter instance needs identical theta rows")

    @property
    def num_clients(self) -> int:
        return int(self.features.shape[0])

    @property
    def num_arms(self) -> int:
        return int(self.features.shape[1])

    @property
    def dim(self) -> int:
        return int(self.features.shape[2])

    def mean_rewards(self) -> np.ndarray:
        """mu_{i,a} = x_{i,a}^T theta_a, shape (M, K)."""
        return np.einsum("mkd,kd->mk", self.features, self.thetas)

    def gaps(self) -> np.ndarray:
        """Delta_{i,a} = max_b mu_{i,b} - mu_{i,a}, shape (M, K)."""
        mu = self.mean_rewards()
        return mu.max(axis=1, keepdims=True) - mu

    def min_gap(self) -> float:
        """Smallest positive gap between a client's best and second-best arm."""
        mu = np.sort(self.mean_rewards(), axis=1)
        return float((mu[:, -1] - mu[:, -2]).min()) if self.num_arms > 1 else float("inf")

    @property
    def contextual(self) -> bool:
        return False

    def make_environment(
        self, client_ids: np.ndarray | Sequence[int], horizon: int, entropy: int | Sequence[int]
    ) -> GroupEnvironment:
        from fedbandit.environment import BanditEnvironment  # numba: compiled on first import

        return BanditEnvironment(self, client_ids, horizon, entropy)

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "num_clients": self.num_clients,
            "num_arms": self.num_arms,
            "dim": self.dim,
            "noise_sigma": self.noise_sigma,
            "shared_parameter": self.shared_parameter,
            "min_gap": self.min_gap(),
            "max_gap": float(self.gaps().max()),
            **self.info,
        }


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    num_clients: int = Field(100, ge=1, description="M, number of clients")
    num_arms: int = Field(10, ge=2, description="K, number of arms")
    dim: int = Field(3, ge=1, description="d, feature dimension")
    noise_sigma: float = Field(1.0, ge=0, description="standard deviation of reward noise")
    seed: int = Field(0, ge=0, description="seed of the instance draw (not of the rewards)")


class PaperSyntheticParams(_Params):
    """The synthetic instance of Huang et al. (2021), Sec. 6."""

    kind: Literal["paper_synthetic"] = "paper_synthetic"

    @model_validator(mode="after")
    def _check(self) -> PaperSyntheticParams:
        if self.dim < 2:
            raise ValueError("paper_synthetic needs dim >= 2")
        return self


class SyntheticParams(_Params):
    """A general random instance, disjoint or shared parameter, with a guaranteed minimum gap."""

    kind: Literal["synthetic"] = "synthetic"
    shared_parameter: bool = Field(False, description="one theta for all arms")
    min_gap: float = Field(0.1, ge=0, description="best minus second-best mean, per client")
    feature_scale: float = Field(1.0, gt=0, description="radius of the feature ball")


def paper_synthetic(params: PaperSyntheticParams) -> LinearBanditInstance:
    """Huang et al. (2021) synthetic instance (read from the authors' reference implementation).

    theta_a = e_1 for every arm. Per client one good arm a0 ~ U{0..K-2}: x_1 ~ U[0.7, 0.8], other
    coordinates ~ U[0, 0.6/(d-1)]; every other arm: x_1 ~ U[0.5, 0.6], others ~ U[0, 0.8/(d-1)].
    """
    rng = domain_generator(params.seed, INSTANCE_DOMAIN)
    M, K, d = params.num_clients, params.num_arms, params.dim
    features = np.empty((M, K, d))
    features[:, :, 0] = rng.uniform(0.5, 0.6, size=(M, K))
    features[:, :, 1:] = rng.uniform(0.0, 0.8 / (d - 1), size=(M, K, d - 1))
    good = rng.integers(0, K - 1, size=M)
    rows = np.arange(M)
    features[rows, good, 0] = rng.uniform(0.7, 0.8, size=M)
    features[rows, good, 1:] = rng.uniform(0.0, 0.6 / (d - 1), size=(M, d - 1))
    thetas = np.zeros((K, d))
    thetas[:, 0] = 1.0
    return LinearBanditInstance(
        features, thetas, params.noise_sigma, shared_parameter=True, name="paper_synthetic"
    )


def synthetic(params: SyntheticParams) -> LinearBanditInstance:
    """Random instance: theta_a uniform on the unit sphere (one theta if shared), x_{i,a} uniform
    in the ball of radius ``feature_scale``; then each client's best arm is pushed along its theta
    until best minus second-best is at least ``min_gap`` (x_{i,b} += c theta_b / ||theta_b||^2).
    """
    rng = domain_generator(params.seed, INSTANCE_DOMAIN)
    M, K, d = params.num_clients, params.num_arms, params.dim
    num_thetas = 1 if params.shared_parameter else K
    thetas = rng.standard_normal((num_thetas, d))
    thetas /= np.linalg.norm(thetas, axis=1, keepdims=True)
    thetas = np.broadcast_to(thetas, (K, d)).copy()
    directions = rng.standard_normal((M, K, d))
    directions /= np.linalg.norm(directions, axis=2, keepdims=True)
    radii = params.feature_scale * rng.uniform(0.1, 1.0, size=(M, K, 1)) ** (1.0 / d)
    features = directions * radii
    mu = np.einsum("mkd,kd->mk", features, thetas)
    order = np.argsort(mu, axis=1)
    rows = np.arange(M)
    best, second = order[:, -1], order[:, -2]
    shortfall = np.maximum(params.min_gap - (mu[rows, best] - mu[rows, second]), 0.0)
    features[rows, best] += shortfall[:, None] * thetas[best]
    return LinearBanditInstance(
        features, thetas, params.noise_sigma, params.shared_parameter, name="synthetic"
    )


#: The instance kinds defined here, declared in ``pyproject.toml`` under ``fedbandit.instances``.
PAPER_SYNTHETIC = InstanceKindSpec(
    "paper_synthetic",
    PaperSyntheticParams,
    paper_synthetic,
    "The synthetic instance of the Fed-PE paper (shared theta = e_1, one good arm)",
)
SYNTHETIC = InstanceKindSpec(
    "synthetic",
    SyntheticParams,
    synthetic,
    "Random features and parameters with a guaranteed minimum gap",
)
