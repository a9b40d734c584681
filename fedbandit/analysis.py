"""Statistics over seeds as pure functions on arrays shaped (seeds, ...)."""

from __future__ import annotations

import numpy as np

#: t_{0.975, nu} for nu = 1..30 degrees of freedom (scipy.stats.t.ppf(0.975, nu), 6 decimals).
T_975 = (
    12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157,
    2.228139, 2.200985, 2.178813, 2.160369, 2.144787, 2.13145, 2.119905, 2.109816, 2.100922,
    2.093024, 2.085963, 2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831,
    2.048407, 2.04523, 2.042272,
)  # fmt: skip


def t_quantile_975(nu: int) -> float:
    """The 0.975 quantile of Student's t with ``nu`` degrees of freedom: the table up to 30, then
    the Cornish-Fisher expansion around z = 1.959964 (Abramowitz & Stegun 26.7.5; error below
    1e-7 for nu >= 30). Without scipy.stats, whose import takes most of a second."""
    if nu < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {nu}")
    if nu <= len(T_975):
        return T_975[nu - 1]
    z = 1.959963984540054
    return (
        z
        + (z**3 + z) / (4 * nu)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * nu**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * nu**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * nu**4)
    )


def mean_ci95(values: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and Student-t 95% interval of the mean over ``axis``: mean -/+ t_{0.975, n-1} s /
    sqrt(n) (the interval is the mean itself when there is a single seed)."""
    values = np.asarray(values, dtype=float)
    n = values.shape[axis]
    mean = values.mean(axis=axis)
    if n < 2:
        return mean, mean.copy(), mean.copy()
    half = t_quantile_975(n - 1) * values.std(axis=axis, ddof=1) / np.sqrt(n)
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
