"""Aggregates of normalised scores across environments and seeds, by rliable (Agarwal et al.
2021, "Deep Reinforcement Learning at the Edge of the Statistical Precipice"): the interquartile
mean (IQM, the mean of the middle 50% of all seed-environment scores), the mean and the median,
each with a 95% stratified-bootstrap confidence interval (seeds resampled within each
environment), performance profiles (the fraction of seed-environment scores above tau) and the
probability of improvement P(X > Y) (Mann-Whitney, averaged over environments).

rliable 1.2's ``StratifiedBootstrap`` passes ``random_state`` to arch's bootstrap, a keyword
arch 8 no longer takes (and arch 7 does not import under pandas 3): ``_Bootstrap`` is that class
with arch 8's constructor, everything else (its stratified ``update_indices``, arch's
``conf_int``) the libraries' own. rliable draws its resamples from NumPy's global generator, so
each aggregate runs under ``_global_seed`` (seeded, then restored): the intervals are the same
on every run. rliable, arch and SciPy load on first use (they take a second to import).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Bootstrap replications of every interval (rliable's examples use 2,000 for profiles).
BOOTSTRAP_REPS = 2000

#: The seed of NumPy's global generator while rliable resamples.
BOOTSTRAP_SEED = 0

#: Thresholds tau of the performance profiles.
PROFILE_TAUS = np.linspace(-0.5, 1.5, 41)


@contextmanager
def _global_seed(seed: int) -> Iterator[None]:
    """NumPy's global generator seeded for the block, its earlier state restored after."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def _bootstrap(scores: np.ndarray) -> Any:
    """rliable's stratified bootstrap of a (seeds, environments) matrix, built for arch 8."""
    from arch.bootstrap import IIDBootstrap  # deferred: arch, rliable and SciPy load slowly
    from rliable.library import StratifiedBootstrap  # type: ignore[import-untyped]

    class _Bootstrap(StratifiedBootstrap):
        def __init__(self, data: np.ndarray) -> None:
            IIDBootstrap.__init__(self, data, seed=BOOTSTRAP_SEED)
            self._args_shape = data.shape
            self._num_tasks = data.shape[1]
            self._parameters = [self._num_tasks, False]
            self._task_bootstrap = False
            self._strata_indices = self._get_strata_indices()

    return _Bootstrap(scores)


def interval(
    scores: np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray],
    reps: int = BOOTSTRAP_REPS,
) -> tuple[np.ndarray, np.ndarray]:
    """The point estimate ``statistic(scores)`` and its 95% percentile stratified-bootstrap
    interval (2, n): what rliable's ``get_interval_estimates`` returns for one algorithm."""
    with _global_seed(BOOTSTRAP_SEED):
        bounds = _bootstrap(scores).conf_int(statistic, reps=reps, size=0.95, method="percentile")
    return np.asarray(statistic(scores), dtype=float), np.asarray(bounds, dtype=float)


def _summary(scores: np.ndarray) -> np.ndarray:
    from rliable import metrics  # type: ignore[import-untyped]  # deferred: SciPy

    return np.array(
        [
            metrics.aggregate_iqm(scores),
            metrics.aggregate_mean(scores),
            metrics.aggregate_median(scores),
        ]
    )


@dataclass(frozen=True)
class Aggregate:
    """One algorithm's aggregates over its environments: point estimates and 95% intervals."""

    environments: list[str]
    seeds: int
    iqm: float
    iqm_interval: tuple[float, float]
    mean: float
    mean_interval: tuple[float, float]
    median: float
    median_interval: tuple[float, float]

    def as_dict(self) -> dict[str, Any]:
        return {
            "environments": self.environments,
            "seeds": self.seeds,
            "iqm": self.iqm,
            "iqm_ci95": list(self.iqm_interval),
            "mean": self.mean,
            "mean_ci95": list(self.mean_interval),
            "median": self.median,
            "median_ci95": list(self.median_interval),
        }


def aggregate(environments: list[str], scores: np.ndarray, reps: int = BOOTSTRAP_REPS) -> Aggregate:
    """IQM, mean and median of a (seeds, environments) score matrix with their intervals."""
    point, bounds = interval(scores, _summary, reps)

    def pair(index: int) -> tuple[float, float]:
        return float(bounds[0, index]), float(bounds[1, index])

    return Aggregate(
        environments=list(environments),
        seeds=int(scores.shape[0]),
        iqm=float(point[0]),
        iqm_interval=pair(0),
        mean=float(point[1]),
        mean_interval=pair(1),
        median=float(point[2]),
        median_interval=pair(2),
    )


def performance_profile(
    scores: np.ndarray, taus: np.ndarray = PROFILE_TAUS, reps: int = BOOTSTRAP_REPS
) -> tuple[np.ndarray, np.ndarray]:
    """The fraction of seed-environment scores above each tau (rliable's score distribution)
    and its 95% interval (2, len(taus)), as ``create_performance_profile`` computes them."""
    from rliable.library import score_distributions

    return interval(scores, lambda data: score_distributions(data, taus), reps)


def probability_of_improvement(scores_x: np.ndarray, scores_y: np.ndarray) -> float:
    """P(X > Y): rliable's Mann-Whitney probability, averaged over the environments (columns)
    both matrices hold in the same order."""
    from rliable import metrics  # deferred: SciPy

    return float(metrics.probability_of_improvement(scores_x, scores_y))
