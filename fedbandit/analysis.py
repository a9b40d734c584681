"""Statistics over seeds as pure functions on arrays shaped (seeds, ...)."""

from __future__ import annotations

import numpy as np


def mean_ci95(values: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and Student-t 95% interval of the mean over ``axis`` (the interval is the mean itself
    when there is a single seed)."""
    values = np.asarray(values, dtype=float)
    n = values.shape[axis]
    mean = values.mean(axis=axis)
    if n < 2:
        return mean, mean.copy(), mean.copy()
    from scipy import stats  # imported here: it takes most of a second

    half = stats.t.ppf(0.975, n - 1) * values.std(axis=axis, ddof=1) / np.sqrt(n)
    return mean, mean - half, mean + half


#: How every interval fedbandit reports is made; printed with it.
INTERVAL = "95% Student-t interval of the mean over seeds"
#: Below this many seeds the plots draw each seed's curve instead of a band (a Student-t band of
#: two or three curves pinches where they cross and its lower edge can fall below zero).
MIN_SEEDS_FOR_BAND = 5


def interval_or_none(values: np.ndarray) -> tuple[float, float] | None:
    """The 95% Student-t interval of the mean of ``values`` (1-d), with the lower end clipped at
    0 when every value is non-negative (regret, communication); None for fewer than 2 values."""
    values = np.asarray(values, dtype=float)
    if values.size < 2:
        return None
    _, low_array, high_array = mean_ci95(values)
    low, high = float(low_array), float(high_array)
    if np.all(values >= 0):
        low = max(low, 0.0)
    return low, high


def checkpoint_times(horizon: int) -> np.ndarray:
    """t = 2^k for every k with 2^k <= T."""
    return 2 ** np.arange(int(np.floor(np.log2(horizon))) + 1)


def curve_grid(horizon: int, points: int = 1500) -> np.ndarray:
    """Steps at which curves are stored: every 2^k, T/2, T and a log-and-linear grid (1-based)."""
    grid = np.concatenate(
        [
            checkpoint_times(horizon),
            [max(horizon // 2, 1)],
            np.geomspace(1, horizon, points // 2),
            np.linspace(1, horizon, points // 2),
            [horizon],
        ]
    )
    return np.unique(np.clip(np.round(grid).astype(np.int64), 1, horizon))
