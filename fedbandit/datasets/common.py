"""Shared pieces of the real-data loaders: errors, hashing, atomic caching, instance assembly."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedbandit.errors import DataError
from fedbandit.errors import MissingDataError as MissingDataError
from fedbandit.instances import LinearBanditInstance

#: The data layer's errors (``fedbandit.errors.DataError`` under its old name for the data
#: modules; ``MissingDataError`` is re-exported from here too).
DatasetError = DataError


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    """SHA-256 of a file's bytes, as 64 hex digits."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def atomic_save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` (.npz) through a temporary file and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, allow_pickle=False, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def gap_statistics(mu: np.ndarray) -> dict[str, Any]:
    """Per-client best minus second-best mean reward: quantiles, zero gaps, best-arm counts."""
    order = np.sort(mu, axis=1)
    gaps = order[:, -1] - order[:, -2]
    zero = int(np.sum(gaps <= 1e-12))
    stats: dict[str, Any] = {
        "gap_q10": float(np.quantile(gaps, 0.1)),
        "gap_median": float(np.median(gaps)),
        "zero_gap_clients": zero,
        "best_arm_counts": np.bincount(mu.argmax(axis=1), minlength=mu.shape[1]).tolist(),
    }
    if zero:
        stats["gap_note"] = (
            f"{zero} client(s) have two equally good best arms (zero gap): allowed, such a client "
            "incurs no regret choosing either"
        )
    return stats


def openmp_single_thread() -> Any:
    """Context manager: OpenMP (used by scikit-learn's k-means) limited to one thread.

    GNU libgomp hangs in a process forked after the parent ran an OpenMP thread pool, and the
    runner builds the instance in the parent before forking its worker processes, which build it
    again; with one thread no pool is ever started. The sizes here make this cheap.
    """
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="openmp")


#: Instances built in this process, by key (the runner builds the instance once per task; the
#: tasks of a worker process then share one build). At most ``_MEMO_SIZE`` entries.
_MEMO: dict[str, LinearBanditInstance] = {}
_MEMO_SIZE = 8


def memoised(key: str, build: Callable[[], LinearBanditInstance]) -> LinearBanditInstance:
    """``build()`` once per process and key; every call returns an independent copy."""
    if key not in _MEMO:
        instance = build()
        if len(_MEMO) >= _MEMO_SIZE:
            _MEMO.pop(next(iter(_MEMO)))
        _MEMO[key] = instance
    kept = _MEMO[key]
    return dataclasses.replace(
        kept,
        features=kept.features.copy(),
        thetas=kept.thetas.copy(),
        info=copy.deepcopy(kept.info),
    )


def fixed_context_instance(
    client_features: np.ndarray,
    thetas: np.ndarray,
    noise_sigma: float,
    name: str,
    info: dict[str, Any],
) -> LinearBanditInstance:
    """Disjoint-parameter instance with x_{i,a} = x_i for every arm a: features (M, K, d)."""
    if np.any(np.linalg.norm(client_features, axis=1) == 0):
        rows = np.flatnonzero(np.linalg.norm(client_features, axis=1) == 0)
        raise DatasetError(
            f"{name}: client(s) {rows[:5].tolist()} have an all-zero feature vector, which a "
            "linear bandit cannot use (try intercept = true)"
        )
    num_arms = thetas.shape[0]
    features = np.ascontiguousarray(
        np.broadcast_to(
            client_features[:, None, :], (len(client_features), num_arms, thetas.shape[1])
        )
    )
    return LinearBanditInstance(
        features=features,
        thetas=np.ascontiguousarray(thetas, dtype=float),
        noise_sigma=float(noise_sigma),
        shared_parameter=False,
        name=name,
        info=info,
    )
