"""MovieLens-100K as a Fed-PE instance, from the user's own copy (never downloaded).

The pipeline of Huang et al., "Federated Linear Contextual Bandits" (NeurIPS 2021), Sec. 6:

1. read ``u.data`` (user id, item id, rating 1..5, timestamp; tab-separated) into the
   n_users x n_items rating matrix R (sizes from ``u.info`` when present, else the largest ids);
2. complete R by user-based collaborative filtering, Pearson similarity, k = 10 neighbours
   (:func:`complete_ratings`); observed ratings are kept;
3. divide by 5 and factorise with NMF, R_hat / 5 ~ W H (d components; scikit-learn);
4. k-means (k = K) on the item vectors (the columns of H): the centres are theta_1..theta_K;
5. clients are the first M users; every arm of client i has x_{i,a} = W_i, so the mean reward is
   mu_{i,a} = W_i^T theta_a and a reward is mu_{i,a} + N(0, sigma^2) (disjoint parameters).

Steps 1-4 (W for every user, the thetas, facts) are cached under ``cache_dir``, keyed by the
SHA-256 of ``u.data`` and the preprocessing parameters; a cached build only hashes the file.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fedbandit.datasets.common import (
    DatasetError,
    MissingDataError,
    atomic_save_npz,
    file_sha256,
    fixed_context_instance,
    gap_statistics,
    openmp_single_thread,
)
from fedbandit.instances import InstanceKindSpec
from fedbandit.rng import INSTANCE_DOMAIN, domain_generator

#: Bump when the preprocessing changes: old cache entries are then never read again.
PIPELINE_VERSION = 1
GROUPLENS_URL = "https://grouplens.org/datasets/movielens/100k/"
FIELDS = "user id, item id, rating, timestamp"
#: NMF's coordinate descent needs 400-2000 iterations on the full matrix (about 5 ms each); its
#: relative error changes by < 1e-4 after a few hundred, so the cap bounds the time, not the fit.
NMF_MAX_ITER = 1000


class MovieLensParams(BaseModel):
    """MovieLens-100K (the Fed-PE paper's real-data instance); defaults are the paper's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["movielens100k"] = "movielens100k"
    path: str = Field(
        "", description="the ml-100k folder or its u.data file (empty: not supplied yet)"
    )
    num_clients: int = Field(100, ge=1, description="M: clients are the first M users")
    num_arms: int = Field(30, ge=2, description="K: k-means clusters of the item vectors")
    dim: int = Field(3, ge=1, description="d: NMF components")
    noise_sigma: float = Field(1.0, ge=0, description="standard deviation of reward noise")
    seed: int = Field(0, ge=0, description="seeds NMF's and k-means' random_state")
    neighbours: int = Field(10, ge=1, description="k of the user-based collaborative filtering")
    cache_dir: str = Field(
        "results/.cache", description="where preprocessed instances are cached ('' = no cache)"
    )


@dataclass(frozen=True)
class Ratings:
    """Parsed ratings: 0-based user and item indices, ratings, and the matrix size."""

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    num_users: int
    num_items: int
    source: Path

    def matrix(self) -> tuple[np.ndarray, np.ndarray]:
        """The rating matrix R (0 where missing) and its mask of observed entries."""
        R = np.zeros((self.num_users, self.num_items))
        R[self.users, self.items] = self.ratings
        mask = np.zeros(R.shape, dtype=bool)
        mask[self.users, self.items] = True
        return R, mask


def resolve_path(path: str | Path) -> Path:
    """The ``u.data`` file for a folder or a file path; a clear error if it is not there."""
    text = str(path).strip()
    how = (
        f"MovieLens-100K is published by GroupLens ({GROUPLENS_URL}) and may not be "
        "redistributed, so it is not included and is never downloaded: download ml-100k.zip "
        "yourself, unzip it, and pass the folder: `fedbandit run fedpe_movielens --set "
        "instance.path=/path/to/ml-100k` (the data cards: `fedbandit docs datasets`)"
    )
    if not text:
        raise MissingDataError(f"no MovieLens-100K file given (instance.path is empty). {how}")
    candidate = Path(text).expanduser()
    file = candidate / "u.data" if candidate.is_dir() or not candidate.suffix else candidate
    if not file.is_file():
        raise MissingDataError(f"MovieLens-100K ratings file not found: expected {file}. {how}")
    return file


def _read_info(file: Path) -> dict[str, int]:
    """Counts from ``u.info`` next to ``u.data`` ('943 users', '1682 items', '100000 ratings')."""
    info_file = file.with_name("u.info")
    counts: dict[str, int] = {}
    if not info_file.is_file():
        return counts
    for line in info_file.read_text(errors="replace").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1] in ("users", "items", "ratings"):
            counts[parts[1]] = int(parts[0])
    return counts


def read_ratings(path: str | Path) -> Ratings:
    """Parse and validate ``u.data``; every problem is reported with the file and line number.

    Checked: 4 tab-separated fields per line, integer ids >= 1 (and within the counts of
    ``u.info`` when that file is present), a numeric rating in [1, 5], an integer timestamp, no
    blank lines, no (user, item) pair rated twice, and the number of ratings ``u.info`` states.
    """
    file = resolve_path(path)
    raw = file.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise DatasetError(f"{file}, line {line}: not text (undecodable byte)") from None
    counts = _read_info(file)
    max_user = counts.get("users")
    max_item = counts.get("items")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    truncated_hint = "" if text.endswith("\n") else " (the last line has no newline: truncated?)"
    n = len(lines)
    if n == 0:
        raise DatasetError(f"{file}: no ratings (empty file)")
    users = np.empty(n, dtype=np.int64)
    items = np.empty(n, dtype=np.int64)
    ratings = np.empty(n, dtype=np.float64)
    for row, text in enumerate(lines):
        number = row + 1

        def fail(problem: str, number: int = number, text: str = text) -> DatasetError:
            hint = truncated_hint if number == n else ""
            return DatasetError(f"{file}, line {number}: {problem}{hint}: {text[:80]!r}")

        fields = text.rstrip("\r").split("\t")
        if len(fields) != 4:
            raise fail(f"expected 4 tab-separated fields ({FIELDS}), found {len(fields)}")
        for position, (label, bound) in enumerate((("user", max_user), ("item", max_item))):
            try:
                value = int(fields[position])
            except ValueError:
                raise fail(f"{label} id {fields[position]!r} is not an integer") from None
            if value < 1 or (bound is not None and value > bound):
                upper = f"{bound} (from u.info)" if bound is not None else "..."
                raise fail(f"{label} id {value} is out of range 1..{upper}")
            (users if position == 0 else items)[row] = value
        try:
            rating = float(fields[2])
        except ValueError:
            raise fail(f"rating {fields[2]!r} is not a number") from None
        if not 1.0 <= rating <= 5.0:
            raise fail(f"rating {fields[2]} is outside 1..5")
        ratings[row] = rating
        try:
            int(fields[3])
        except ValueError:
            raise fail(f"timestamp {fields[3]!r} is not an integer") from None
    num_users = max_user or int(users.max())
    num_items = max_item or int(items.max())
    keys = (users - 1) * num_items + (items - 1)
    order = np.argsort(keys, kind="stable")
    repeated = np.flatnonzero(np.diff(keys[order]) == 0)
    if repeated.size:
        first, again = sorted((int(order[repeated[0]]), int(order[repeated[0] + 1])))
        raise DatasetError(
            f"{file}, line {again + 1}: user {users[again]} rates item {items[again]} a second "
            f"time (first at line {first + 1})"
        )
    expected = counts.get("ratings")
    if expected is not None and expected != n:
        raise DatasetError(
            f"{file}: {n} ratings, but u.info says {expected}: the file looks truncated or edited"
        )
    return Ratings(users - 1, items - 1, ratings, num_users, num_items, file)


def pearson_similarity(R: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """User-user Pearson correlation over co-rated items, (n_users, n_users).

    sim(u, v) = (n S_uv - S_u S_v) / sqrt((n Q_u - S_u^2)(n Q_v - S_v^2)), with n the number of
    items both rated and S, Q the sums of ratings and squared ratings over those items (each
    user's mean taken over the co-rated items); 0 where undefined (n < 2 or no variance).
    """
    B = mask.astype(float)
    X = np.where(mask, R, 0.0)
    n = B @ B.T
    s = X @ B.T  # s[u, v]: sum of u's ratings over the items u and v both rated
    q = (X * X) @ B.T
    num = n * (X @ X.T) - s * s.T
    var = n * q - s * s
    den = np.sqrt(np.maximum(var, 0.0) * np.maximum(var.T, 0.0))
    sim = np.divide(num, den, out=np.zeros_like(num), where=den > 1e-9)
    return np.clip(sim, -1.0, 1.0)


def complete_ratings(R: np.ndarray, mask: np.ndarray, neighbours: int = 10) -> np.ndarray:
    """User-based collaborative filtering with means, Pearson similarity, k nearest neighbours.

    For a missing (u, i): N = the k users most similar to u among those who rated i, keeping those
    with sim > 0; r_hat(u, i) = m_u + sum_{v in N} sim(u, v) (r_vi - m_v) / sum_{v in N} sim(u, v)
    (m_u the mean of u's ratings), or m_u when N is empty; clipped to [1, 5]. This is KNNWithMeans
    of the Surprise library (Hug, JOSS 2020) with its Pearson similarity. Observed ratings are kept.
    """
    counts = mask.sum(axis=1)
    overall = float(R[mask].mean())
    means = np.divide(
        np.where(mask, R, 0.0).sum(axis=1), counts, out=np.full(len(R), overall), where=counts > 0
    )
    sim = pearson_similarity(R, mask)
    np.fill_diagonal(sim, -np.inf)
    completed = np.repeat(means[:, None], R.shape[1], axis=1)
    for item in range(R.shape[1]):
        raters = np.flatnonzero(mask[:, item])
        if raters.size == 0:
            continue
        need = np.flatnonzero(~mask[:, item])
        if need.size == 0:
            continue
        S = sim[np.ix_(need, raters)]
        dev = R[raters, item] - means[raters]
        if raters.size > neighbours:
            top = np.argpartition(-S, neighbours - 1, axis=1)[:, :neighbours]
            S = np.take_along_axis(S, top, axis=1)
            D = dev[top]
        else:
            D = np.broadcast_to(dev, S.shape)
        weights = np.where(S > 0, S, 0.0)
        total = weights.sum(axis=1)
        shift = np.divide(
            (weights * D).sum(axis=1), total, out=np.zeros(len(need)), where=total > 0
        )
        completed[need, item] += shift
    completed[mask] = R[mask]
    return np.clip(completed, 1.0, 5.0)


def _cache_file(params: MovieLensParams, data_sha256: str) -> Path | None:
    if not params.cache_dir.strip():
        return None
    key_fields = {
        "pipeline": PIPELINE_VERSION,
        "data_sha256": data_sha256,
        "neighbours": params.neighbours,
        "dim": params.dim,
        "num_arms": params.num_arms,
        "seed": params.seed,
    }
    key = json.dumps(key_fields, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return Path(params.cache_dir).expanduser() / f"movielens100k-{digest}.npz"


def _load_cache(path: Path | None, params: MovieLensParams) -> dict[str, Any] | None:
    if path is None or not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            user_vectors = np.array(data["user_vectors"])
            thetas = np.array(data["thetas"])
            facts = json.loads(str(data["facts"]))
    except (OSError, ValueError, KeyError, json.JSONDecodeError):
        return None  # unreadable entry: recompute and overwrite it
    if user_vectors.shape[1:] != (params.dim,) or thetas.shape != (params.num_arms, params.dim):
        return None
    return {"user_vectors": user_vectors, "thetas": thetas, "facts": facts}


def preprocess(file: Path, params: MovieLensParams, data_sha256: str) -> dict[str, Any]:
    """Steps 1-4: parse, complete, NMF, k-means; returns W for all users, thetas and facts."""
    from sklearn.cluster import KMeans
    from sklearn.decomposition import NMF
    from sklearn.exceptions import ConvergenceWarning

    start = time.perf_counter()
    ratings = read_ratings(file)
    if params.num_arms > ratings.num_items:
        raise DatasetError(
            f"{file}: num_arms = {params.num_arms} clusters need at least as many items; the "
            f"file has {ratings.num_items}"
        )
    if params.dim > min(ratings.num_users, ratings.num_items):
        raise DatasetError(f"{file}: dim = {params.dim} exceeds the rating matrix's size")
    R, mask = ratings.matrix()
    completed = complete_ratings(R, mask, params.neighbours) / 5.0
    rng = domain_generator(params.seed, INSTANCE_DOMAIN)
    nmf_state, kmeans_state = (int(s) for s in rng.integers(0, 2**31 - 1, size=2))
    nmf = NMF(n_components=params.dim, init="random", random_state=nmf_state, max_iter=NMF_MAX_ITER)
    with openmp_single_thread(), warnings.catch_warnings():
        warnings.simplefilter("ignore", category=ConvergenceWarning)  # reported in the facts
        W = nmf.fit_transform(completed)
        H = nmf.components_
        kmeans = KMeans(n_clusters=params.num_arms, n_init=10, random_state=kmeans_state)
        kmeans.fit(H.T)
    facts = {
        "dataset": "MovieLens-100K (GroupLens)",
        "data_sha256": data_sha256,
        "num_users": ratings.num_users,
        "num_items": ratings.num_items,
        "num_ratings": len(ratings.ratings),
        "density": round(len(ratings.ratings) / R.size, 6),
        "completion": f"user-based kNN with means, Pearson similarity, k = {params.neighbours}",
        "nmf_relative_error": float(np.linalg.norm(completed - W @ H) / np.linalg.norm(completed)),
        "nmf_iterations": int(nmf.n_iter_),
        "nmf_converged": bool(nmf.n_iter_ < NMF_MAX_ITER),
        "kmeans_inertia": float(kmeans.inertia_),
        "preprocess_seconds": round(time.perf_counter() - start, 2),
    }
    return {"user_vectors": W, "thetas": kmeans.cluster_centers_, "facts": facts}


def build_movielens(params: MovieLensParams) -> Any:
    """MovieLens-100K instance (cached): x_{i,a} = W_i for the first M users, theta_a = centre a."""
    file = resolve_path(params.path)
    data_sha256 = file_sha256(file)
    cache = _cache_file(params, data_sha256)
    entry = _load_cache(cache, params)
    if entry is None:
        entry = preprocess(file, params, data_sha256)
        entry["facts"] = json.loads(json.dumps(entry["facts"]))
        if cache is not None:
            atomic_save_npz(
                cache,
                {
                    "user_vectors": entry["user_vectors"],
                    "thetas": entry["thetas"],
                    "facts": np.array(json.dumps(entry["facts"])),
                },
            )
    W, thetas, facts = entry["user_vectors"], entry["thetas"], entry["facts"]
    if params.num_clients > len(W):
        raise DatasetError(
            f"{file}: num_clients = {params.num_clients} but the file has {len(W)} users"
        )
    clients = W[: params.num_clients]
    info = {
        **{k: v for k, v in facts.items() if k != "preprocess_seconds"},
        "source": str(file),
        "data_files": {str(file): data_sha256},
        "clients": f"users 1..{params.num_clients}",
        **gap_statistics(clients @ thetas.T),
    }
    return fixed_context_instance(clients, thetas, params.noise_sigma, "movielens100k", info)


#: The registry's builder (a ``DataError`` is a ``FedbanditError``: the command line reports it).
movielens_instance = build_movielens

#: Declared in ``setup.cfg`` under ``fedbandit.instances``.
MOVIELENS100K = InstanceKindSpec(
    "movielens100k",
    MovieLensParams,
    movielens_instance,
    "MovieLens-100K as in the Fed-PE paper (the user supplies the file)",
)


def generate_ratings(
    num_users: int,
    num_items: int,
    num_ratings: int,
    rank: int = 3,
    noise: float = 0.5,
    seed: int = 0,
    min_per_user: int = 20,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Synthetic ratings shaped like MovieLens, for tests and timing only (not real data).

    Truth: 3.5 + U V^T / sqrt(rank) + N(0, noise^2), U and V standard normal; a rating is the truth
    rounded and clipped to 1..5. Each user rates at least ``min_per_user`` items (log-normal
    activity); items are chosen with Zipf-like popularity p_j ~ 1/(j + 10). Returns 1-based user
    ids, item ids, integer ratings, and the noiseless truth matrix (num_users, num_items).
    """
    rng = np.random.default_rng(seed)
    U = rng.standard_normal((num_users, rank))
    V = rng.standard_normal((num_items, rank))
    truth = 3.5 + U @ V.T / math.sqrt(rank)
    if num_ratings < num_users * min_per_user or num_ratings > num_users * num_items:
        raise ValueError(
            "num_ratings must lie in [num_users * min_per_user, num_users * num_items]"
        )
    weight = rng.lognormal(0.0, 1.0, num_users)
    extra = num_ratings - num_users * min_per_user
    per_user = min_per_user + np.floor(extra * weight / weight.sum()).astype(int)
    per_user = np.minimum(per_user, num_items)
    while per_user.sum() < num_ratings:
        room = np.flatnonzero(per_user < num_items)
        per_user[rng.choice(room)] += 1
    popularity = 1.0 / (np.arange(num_items) + 10.0)
    popularity = popularity[rng.permutation(num_items)]
    users, items = [], []
    for user, count in enumerate(per_user):
        chosen = rng.choice(num_items, size=count, replace=False, p=popularity / popularity.sum())
        users.append(np.full(count, user))
        items.append(chosen)
    u, i = np.concatenate(users), np.concatenate(items)
    noisy = truth[u, i] + noise * rng.standard_normal(len(u))
    ratings = np.clip(np.rint(noisy), 1, 5).astype(int)
    order = rng.permutation(len(u))
    return u[order] + 1, i[order] + 1, ratings[order], truth


def write_u_data(path: Path, users: np.ndarray, items: np.ndarray, ratings: np.ndarray) -> Path:
    """Write ratings in the u.data format: user \\t item \\t rating \\t timestamp, one per line."""
    stamps = 874724710 + np.arange(len(users)) * 37
    lines = [
        f"{u}\t{i}\t{r}\t{s}\n" for u, i, r, s in zip(users, items, ratings, stamps, strict=True)
    ]
    path.write_text("".join(lines))
    return path
