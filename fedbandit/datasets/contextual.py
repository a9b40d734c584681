"""Contextual bandits from classification data, with non-IID client partitions.

The reduction of Bietti, Agarwal and Langford ("A Contextual Bandit Bake-off", JMLR 22(133), 2021):
arms are the K classes; in every round a client draws one of its own labelled samples (x, y),
uniformly with replacement, sees phi(x) and pulls an arm k; the reward is 1{k = y} + N(0, sigma^2)
(sigma = ``noise_sigma``, default 0). The mean reward vector of a sample is one-hot(y), so the
optimal arm is the true class and the pseudo-regret max_k mu_k - mu_{a_t} counts mistakes.

Features are those of the fixed-context loader (``standardised_design`` in ``tables.py``):
z = (x - mean) / std
over all n samples (constant columns dropped), optionally the first q principal components,
phi = (1, z_1..z_q) with ``intercept`` (d = q + 1). The context of a round is phi(x)
for every arm (disjoint parameters: LinUCB-d's setting); E[reward of k | x] = P(y = k | x) is
generally not linear in phi, so a linear learner is misspecified.

Partitions of the n samples among the M clients (seeded by ``seed``):

- ``dirichlet`` (label skew; Hsu, Qi, Brown 2019; Li et al., NIID-Bench, ICDE 2022): for every class
  k independently, p_k ~ Dirichlet(alpha 1_M) and the class's samples, in random order, are cut
  into M consecutive runs of lengths round(n_k cumsum(p_k)) differences. Large alpha: near-IID;
  small alpha: every client sees few classes. E[(share of class k at client i - 1/M)^2] =
  (1 - 1/M) / (M (M alpha + 1)). A draw leaving a client with fewer than ``min_client_samples``
  samples is redrawn from the same stream (deterministic), at most ``max_draws`` draws in all; the
  partition is then Dirichlet conditioned on that event (the number of draws is reported).
- ``clusters`` (feature skew): k-means with ``num_clusters`` (default M) clusters on the reduced
  features z; the clusters, in a random order, go to the clients in turn (cluster j of that order to
  client j mod M).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedbandit.contextual.environment import ContextualEnvironment
from fedbandit.datasets.common import (
    DatasetError,
    file_sha256,
    openmp_single_thread,
)
from fedbandit.datasets.tables import (
    HEADER_DESCRIPTION,
    LABEL_DESCRIPTION,
    LabelledData,
    bundled_dataset,
    fit_thetas,
    load_table,
    select_classes,
    standardised_design,
)
from fedbandit.group_environment import GroupEnvironment
from fedbandit.instances import InstanceKindSpec
from fedbandit.rng import INSTANCE_DOMAIN, domain_generator

KIND: Literal["classification_contextual"] = "classification_contextual"


class ClassificationContextualParams(BaseModel):
    """Classification data as a contextual bandit (``kind = "classification_contextual"``).

    The data: ``dataset`` (a set bundled with scikit-learn) or ``path`` (+ ``label``) of the user's
    table, exactly one of the two."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["classification_contextual"] = KIND
    dataset: Literal["digits", "wine", "breast_cancer", "iris"] | None = Field(
        None, description="a classification set bundled with scikit-learn"
    )
    path: str | None = Field(None, min_length=1, description="the user's table (as kind 'table')")
    label: str | int | None = Field(None, description=LABEL_DESCRIPTION)
    header: bool | None = Field(None, description=HEADER_DESCRIPTION)
    num_clients: int = Field(10, ge=1, description="M, number of clients")
    dim: int | None = Field(
        None, ge=1, description="d, including the intercept; None: every standardised feature"
    )
    intercept: bool = Field(True, description="first feature coordinate is the constant 1")
    classes: list[str | int] | None = Field(
        None, min_length=2, description="labels used as arms, in order (default: all, sorted)"
    )
    partition: Literal["dirichlet", "clusters"] = Field(
        "dirichlet", description="label skew (Dirichlet) or feature skew (k-means clusters)"
    )
    concentration: float = Field(0.5, gt=0, description="alpha of Dirichlet(alpha 1_M)")
    num_clusters: int | None = Field(
        None, ge=1, description="k-means clusters for 'clusters' (default M; must be >= M)"
    )
    min_client_samples: int = Field(1, ge=1, description="fewer samples at a client: redraw")
    max_draws: int = Field(100, ge=1, description="Dirichlet draws before giving up")
    noise_sigma: float = Field(0.0, ge=0, description="Gaussian noise added to 1{k = y}")
    participation: float = Field(1.0, gt=0, le=1, description="chance a client acts in a round")
    seed: int = Field(0, ge=0, description="seeds the partition and k-means (not the rewards)")

    @model_validator(mode="after")
    def _check(self) -> ClassificationContextualParams:
        if (self.dataset is None) == (self.path is None):
            raise ValueError(
                "set exactly one of instance.dataset (digits, wine, breast_cancer, iris) and "
                "instance.path (your table)"
            )
        if self.label is not None and self.path is None:
            raise ValueError("instance.label applies to a table (instance.path) only")
        if self.header is not None and self.path is None:
            raise ValueError("instance.header applies to a table (instance.path) only")
        if self.intercept and self.dim == 1:
            raise ValueError("dim counts the intercept: dim >= 2 is needed when intercept = true")
        if self.classes is not None and len({str(c) for c in self.classes}) != len(self.classes):
            raise ValueError(f"classes are listed twice: {self.classes}")
        if self.num_clusters is not None:
            if self.partition != "clusters":
                raise ValueError("instance.num_clusters applies to partition = 'clusters' only")
            if self.num_clusters < self.num_clients:
                raise ValueError(
                    f"num_clusters = {self.num_clusters} < num_clients = {self.num_clients}: "
                    "every client needs at least one cluster"
                )
        return self


@dataclass(frozen=True, eq=False)
class TabularContextualInstance:
    """Samples phi(x_j) (n, d) with labels y_j in 0..K-1, and each client's sample indices."""

    params: ClassificationContextualParams
    features: np.ndarray
    labels: np.ndarray
    members: tuple[np.ndarray, ...]
    classes: list[str]
    name: str = KIND
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.features.ndim != 2 or len(self.features) != len(self.labels):
            raise ValueError(
                f"features (n, d) and labels (n,) must agree: {self.features.shape} and "
                f"{self.labels.shape}"
            )
        if len(self.members) != self.params.num_clients:
            raise ValueError(
                f"{len(self.members)} partitions for {self.params.num_clients} clients"
            )
        for array in (self.features, self.labels, *self.members):
            array.flags.writeable = False

    @property
    def num_clients(self) -> int:
        return self.params.num_clients

    @property
    def num_arms(self) -> int:
        return len(self.classes)

    @property
    def dim(self) -> int:
        return int(self.features.shape[1])

    @property
    def noise_sigma(self) -> float:
        return self.params.noise_sigma

    def rewards(self, means: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """1{k = y} + sigma z for arms with ``means`` and standard normal ``noise``."""
        return means + self.noise_sigma * noise

    @property
    def shared_parameter(self) -> bool:
        return False

    @property
    def contextual(self) -> bool:
        return True

    def make_environment(
        self, client_ids: np.ndarray | Sequence[int], horizon: int, entropy: int | Sequence[int]
    ) -> GroupEnvironment:
        return ContextualEnvironment(self, client_ids, horizon, entropy)

    @property
    def context_rows(self) -> int:
        """One context vector per round, used for every arm (x_{t,k} = phi(x_t))."""
        return 1

    def expand(self, compact: np.ndarray) -> np.ndarray:
        """Compact contexts (..., 1, d) as per-arm contexts (..., K, d) (a view)."""
        return np.broadcast_to(compact, (*compact.shape[:-2], self.num_arms, self.dim))

    def sample_indices(self, rng: np.random.Generator, count: int, client_id: int) -> np.ndarray:
        """``count`` sample indices drawn uniformly with replacement from the client's partition."""
        if not 0 <= client_id < self.num_clients:
            raise ValueError(f"client_id must lie in [0, {self.num_clients}), got {client_id}")
        own = self.members[client_id]
        return own[rng.integers(0, len(own), size=count)]

    def sample_contexts_and_means(
        self, rng: np.random.Generator, count: int, client_id: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Contexts (count, 1, d) of ``count`` samples of client ``client_id`` (drawn with ``rng``
        only) and their means (count, K) = one-hot of the labels."""
        index = self.sample_indices(rng, count, client_id)
        means = np.zeros((count, self.num_arms))
        means[np.arange(count), self.labels[index]] = 1.0
        return self.features[index][:, None, :], means

    def client_label_counts(self) -> np.ndarray:
        """Samples of each class at each client, (M, K)."""
        return np.stack(
            [np.bincount(self.labels[m], minlength=self.num_arms) for m in self.members]
        )

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            **self.params.model_dump(mode="json"),
            "num_arms": self.num_arms,
            "dim": self.dim,
            "shared_parameter": False,
            **copy.deepcopy(self.info),
        }


def dirichlet_partition(
    y: np.ndarray,
    num_clients: int,
    concentration: float,
    rng: np.random.Generator,
    min_samples: int = 1,
    max_draws: int = 100,
    source: str = "data",
) -> tuple[np.ndarray, int]:
    """Owner client of every sample (n,) under Dirichlet label skew, and the draws it took.

    Per class k: p_k ~ Dirichlet(alpha 1_M); the class's samples in random order go to client i
    for positions [round(n_k c_{i-1}), round(n_k c_i)), c = cumsum(p_k). Redrawn (same stream) while
    a client holds fewer than ``min_samples`` samples, at most ``max_draws`` draws."""
    M = num_clients
    K = int(y.max()) + 1
    by_class = [np.flatnonzero(y == k) for k in range(K)]
    owner = np.empty(len(y), dtype=np.int64)
    sizes = np.zeros(M, dtype=np.int64)
    for draw in range(1, max_draws + 1):
        for idx in by_class:
            shuffled = rng.permutation(idx)
            p = rng.dirichlet(np.full(M, concentration))
            bounds = np.round(np.cumsum(p) * len(idx)).astype(np.int64)
            bounds[-1] = len(idx)
            lengths = np.diff(bounds, prepend=0)
            owner[shuffled] = np.repeat(np.arange(M), lengths)
        sizes = np.bincount(owner, minlength=M)
        if sizes.min() >= min_samples:
            return owner, draw
    short = np.flatnonzero(sizes < min_samples)
    raise DatasetError(
        f"{source}: client(s) {short[:10].tolist()} got fewer than min_client_samples = "
        f"{min_samples} samples (client {short[0]}: {sizes[short[0]]}) in each of max_draws = "
        f"{max_draws} Dirichlet draws (concentration = {concentration}, num_clients = {M}, "
        f"{len(y)} samples); raise instance.concentration, lower instance.num_clients, or raise "
        "instance.max_draws"
    )


def cluster_partition(
    Z: np.ndarray,
    num_clients: int,
    num_clusters: int,
    rng: np.random.Generator,
    min_samples: int = 1,
    source: str = "data",
) -> np.ndarray:
    """Owner client of every sample (n,): k-means clusters (3 initialisations, seeded from
    ``rng``) in a random order, cluster j of that order to client j mod M."""
    from sklearn.cluster import KMeans

    distinct = len(np.unique(Z, axis=0))
    if distinct < num_clusters:
        raise DatasetError(
            f"{source}: too few distinct samples ({distinct}) for {num_clusters} k-means clusters; "
            "lower instance.num_clients or instance.num_clusters"
        )
    state = int(rng.integers(0, 2**31 - 1))
    with openmp_single_thread():
        kmeans = KMeans(n_clusters=num_clusters, n_init=3, random_state=state).fit(Z)
    client_of_cluster = np.empty(num_clusters, dtype=np.int64)
    client_of_cluster[rng.permutation(num_clusters)] = np.arange(num_clusters) % num_clients
    owner = client_of_cluster[kmeans.labels_]
    sizes = np.bincount(owner, minlength=num_clients)
    if sizes.min() < min_samples:
        short = np.flatnonzero(sizes < min_samples)
        raise DatasetError(
            f"{source}: client(s) {short[:10].tolist()} got fewer than min_client_samples = "
            f"{min_samples} samples from their k-means clusters (client {short[0]}: "
            f"{sizes[short[0]]}); lower instance.num_clients or raise instance.num_clusters"
        )
    return owner


def _entropy_bits(shares: np.ndarray) -> np.ndarray:
    """H(p) = -sum_k p_k log2 p_k along the last axis (0 log 0 = 0)."""
    safe = np.where(shares > 0, shares, 1.0)
    return -np.sum(shares * np.log2(safe), axis=-1)


def _linear_error(design: np.ndarray, y: np.ndarray, K: int, intercept: bool) -> float:
    """In-sample error of argmax_k phi^T theta_k, theta the one-vs-rest ridge fit (lambda = 1)."""
    thetas = fit_thetas(design, np.eye(K)[y], 1.0, intercept)
    return float(np.mean((design @ thetas.T).argmax(axis=1) != y))


def partition_statistics(
    counts: np.ndarray, design: np.ndarray, y: np.ndarray, owner: np.ndarray, intercept: bool
) -> dict[str, Any]:
    """Compact facts of a partition with label counts (M, K): sizes, classes per client, largest
    class share, label entropy, heterogeneity = 1 - mean_i H(p_i) / H(p) (0: every client has the
    global label mix; 1: one class per client), and reference error rates per round (a client's
    draws are uniform on its samples): ``majority_error_mean`` = mean_i (1 - max_k p_ik), always
    pulling the client's majority class; ``global_linear_error_mean`` / ``local_linear_error_mean``,
    the in-sample error of one-vs-rest ridge fits on all samples / on the client's own samples."""
    M, K = counts.shape
    sizes = counts.sum(axis=1)
    shares = counts / sizes[:, None]
    overall = counts.sum(axis=0) / counts.sum()
    largest = shares.max(axis=1)
    present = (counts > 0).sum(axis=1)
    global_entropy = float(_entropy_bits(overall))
    entropy = _entropy_bits(shares)
    thetas = fit_thetas(design, np.eye(K)[y], 1.0, intercept)
    wrong = (design @ thetas.T).argmax(axis=1) != y
    global_error = np.array([wrong[owner == i].mean() for i in range(M)])
    local_error = np.array(
        [_linear_error(design[owner == i], y[owner == i], K, intercept) for i in range(M)]
    )
    return {
        "client_samples_min": int(sizes.min()),
        "client_samples_median": float(np.median(sizes)),
        "client_samples_max": int(sizes.max()),
        "classes_per_client_mean": round(float(present.mean()), 4),
        "classes_per_client_min": int(present.min()),
        "largest_class_share_mean": round(float(largest.mean()), 4),
        "largest_class_share_min": round(float(largest.min()), 4),
        "largest_class_share_max": round(float(largest.max()), 4),
        "client_label_entropy_bits_mean": round(float(entropy.mean()), 4),
        "global_label_entropy_bits": round(global_entropy, 4),
        "heterogeneity": round(1.0 - float(entropy.mean()) / global_entropy, 4),
        "majority_error_mean": round(float(1.0 - largest.mean()), 4),
        "global_linear_error_mean": round(float(global_error.mean()), 4),
        "local_linear_error_mean": round(float(local_error.mean()), 4),
    }


def contextual_from_data(
    data: LabelledData, params: ClassificationContextualParams, name: str
) -> TabularContextualInstance:
    """The contextual instance of labelled data: features, partition, facts (module docstring)."""
    data, classes = select_classes(data, params.classes)
    source = data.source
    n, p = data.X.shape
    M = params.num_clients
    if n < M * params.min_client_samples:
        raise DatasetError(
            f"{source}: too few samples for the requested clients: {n} samples, num_clients = {M}, "
            f"min_client_samples = {params.min_client_samples}"
        )
    built = standardised_design(data, classes, params.dim, params.intercept)
    K = len(classes)
    rng = domain_generator(params.seed, INSTANCE_DOMAIN)
    draws = 1
    if params.partition == "dirichlet":
        owner, draws = dirichlet_partition(
            built.y,
            M,
            params.concentration,
            rng,
            params.min_client_samples,
            params.max_draws,
            source,
        )
    else:
        owner = cluster_partition(
            built.Z,
            M,
            params.num_clusters or M,
            rng,
            params.min_client_samples,
            source,
        )
    members = tuple(np.flatnonzero(owner == i) for i in range(M))
    counts = np.stack([np.bincount(built.y[m], minlength=K) for m in members])
    class_counts = np.bincount(built.y, minlength=K)
    info: dict[str, Any] = {
        "source": source,
        "num_samples": int(n),
        "num_features": int(p),
        "constant_features_dropped": int(p - built.usable),
        "components": int(built.Z.shape[1]),
        "explained_variance": round(built.explained, 4),
        "classes": classes,
        "class_counts": class_counts.tolist(),
        "class_balance": round(float(class_counts.min() / class_counts.max()), 4),
        "reward": "1{arm = label} + N(0, noise_sigma^2); regret counts mistakes",
        "partition_draws": draws,
        **partition_statistics(counts, built.design, built.y, owner, params.intercept),
    }
    return TabularContextualInstance(
        params=params,
        features=np.ascontiguousarray(built.design, dtype=float),
        labels=built.y,
        members=members,
        classes=classes,
        name=name,
        info=info,
    )


#: Instances built in this process, by key (the runner builds the instance once per task). The
#: instances are immutable (read-only arrays; ``summary`` copies ``info``), so they are shared.
_MEMO: dict[str, TabularContextualInstance] = {}
_MEMO_SIZE = 8


def build_classification_contextual(
    params: ClassificationContextualParams,
) -> TabularContextualInstance:
    """A bundled set or the user's table as a contextual instance (built once per process, and
    for a table once per file content)."""
    if params.dataset is not None:
        key = f"{KIND} {params.model_dump_json()}"
    else:
        assert params.path is not None
        file = Path(params.path).expanduser()
        content = file_sha256(file) if file.is_file() else "missing"
        key = f"{KIND} {content} {params.model_dump_json()}"
    if key not in _MEMO:
        if params.dataset is not None:
            data, name = bundled_dataset(params.dataset), f"contextual_{params.dataset}"
        else:
            data = load_table(file, params.label, params.header)
            name = f"contextual_table_{file.name}"
        instance = contextual_from_data(data, params, name)
        if params.dataset is None:
            instance.info["data_files"] = {str(file): content}
        if len(_MEMO) >= _MEMO_SIZE:
            _MEMO.pop(next(iter(_MEMO)))
        _MEMO[key] = instance
    return _MEMO[key]


#: The registry's builder (a ``DataError`` is a ``FedbanditError``: the command line reports it).
classification_contextual_instance = build_classification_contextual

#: Declared in ``pyproject.toml`` under ``fedbandit.instances``.
CLASSIFICATION_CONTEXTUAL = InstanceKindSpec(
    KIND,
    ClassificationContextualParams,
    classification_contextual_instance,
    "A classification set as a contextual bandit with non-IID client partitions",
)
