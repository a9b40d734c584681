"""Two suite folders side by side (``fedbandit compare A B``): per environment and overall, is an
algorithm's score in A different from its score in B by more than the seeds' noise?

Per environment the difference of mean scores, mean_A - mean_B, gets a 95% percentile bootstrap
interval in which each side's seeds are resampled on their own (rliable's stratified bootstrap
of the (seeds, 2) matrix [A | B]: every cell draws its own seed within its column). Overall, the
difference of the IQMs over the environments both folders scored, with the same bootstrap over
the (seeds, 2 x environments) matrix, and rliable's probability of improvement P(A > B). A
difference is called real when its interval leaves out 0: ``better`` (A above B) or ``worse``;
otherwise ``within noise``. Both folders must hold the same seeds (the same reward streams:
a change of algorithm is then compared on paired draws).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedbandit.errors import ConfigError
from fedbandit.suites.aggregates import interval, probability_of_improvement
from fedbandit.suites.scorecard import read_suite_folder


@dataclass(frozen=True)
class Difference:
    """One comparison: A's and B's estimates, their difference with its 95% interval, and the
    verdict."""

    what: str
    a: float
    b: float
    difference: float
    low: float
    high: float
    probability_a_better: float

    @property
    def verdict(self) -> str:
        if self.low > 0:
            return "better"
        if self.high < 0:
            return "worse"
        return "within noise"

    def as_dict(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "a": self.a,
            "b": self.b,
            "difference": self.difference,
            "ci95": [self.low, self.high],
            "probability_a_better": self.probability_a_better,
            "verdict": self.verdict,
        }


def _iqm(data: np.ndarray) -> float:
    from scipy.stats import trim_mean  # deferred: SciPy (rliable's IQM is this trimmed mean)

    return float(trim_mean(data, proportiontocut=0.25, axis=None))


def _matrix(results: pd.DataFrame, algorithm: str, environments: list[str]) -> np.ndarray:
    rows = results[(results["algorithm"] == algorithm) & results["score"].notna()]
    table = rows.pivot_table(index="seed", columns="environment", values="score")
    return table[environments].to_numpy(dtype=float)


def compare_algorithm(
    results_a: pd.DataFrame, results_b: pd.DataFrame, algorithm_a: str, algorithm_b: str
) -> list[Difference]:
    """Per shared scored environment, then ``overall``: A's ``algorithm_a`` against B's
    ``algorithm_b``."""

    def scored(results: pd.DataFrame, algorithm: str) -> set[str]:
        rows = results[(results["algorithm"] == algorithm) & results["score"].notna()]
        return set(rows["environment"].astype(str))

    shared = sorted(scored(results_a, algorithm_a) & scored(results_b, algorithm_b))
    if not shared:
        raise ConfigError(
            f"no environment scored both {algorithm_a!r} in A and {algorithm_b!r} in B"
        )
    a = _matrix(results_a, algorithm_a, shared)
    b = _matrix(results_b, algorithm_b, shared)
    if a.shape != b.shape or np.isnan(a).any() or np.isnan(b).any():
        raise ConfigError(
            f"{algorithm_a!r} in A and {algorithm_b!r} in B were not run on the same seeds "
            f"({a.shape[0]} and {b.shape[0]}); rerun both with the same --seeds"
        )
    width = len(shared)
    differences = []
    for column, environment in enumerate(shared):
        pair = np.column_stack([a[:, column], b[:, column]])
        point, bounds = interval(pair, lambda m: np.array([m[:, 0].mean() - m[:, 1].mean()]))
        differences.append(
            Difference(
                environment,
                float(a[:, column].mean()),
                float(b[:, column].mean()),
                float(point[0]),
                float(bounds[0, 0]),
                float(bounds[1, 0]),
                probability_of_improvement(a[:, [column]], b[:, [column]]),
            )
        )
    both = np.hstack([a, b])
    point, bounds = interval(both, lambda m: np.array([_iqm(m[:, :width]) - _iqm(m[:, width:])]))
    differences.append(
        Difference(
            "overall (IQM)",
            _iqm(a),
            _iqm(b),
            float(point[0]),
            float(bounds[0, 0]),
            float(bounds[1, 0]),
            probability_of_improvement(a, b),
        )
    )
    return differences


def compare_folders(
    folder_a: Path,
    folder_b: Path,
    algorithms: list[str] | None = None,
    against: str | None = None,
) -> dict[str, list[Difference]]:
    """Every algorithm both folders scored (or those given), A against B; with ``against``,
    one algorithm of A against another of B."""
    _, results_a, _ = read_suite_folder(folder_a)
    _, results_b, _ = read_suite_folder(folder_b)

    def compared(results: pd.DataFrame) -> set[str]:
        rows = results[(results["role"] == "algorithm") & results["score"].notna()]
        return set(rows["algorithm"].astype(str))

    in_a, in_b = compared(results_a), compared(results_b)
    if against is not None:
        if not algorithms or len(algorithms) != 1:
            raise ConfigError("--against needs exactly one --algorithm (A's side)")
        for name, found, side in ((algorithms[0], in_a, folder_a), (against, in_b, folder_b)):
            if name not in found:
                raise ConfigError(
                    f"{side}: no scores of {name!r}; scored: {', '.join(sorted(found))}"
                )
        return {
            f"{algorithms[0]} vs {against}": compare_algorithm(
                results_a, results_b, algorithms[0], against
            )
        }
    names = sorted(in_a & in_b) if not algorithms else list(algorithms)
    for name in names:
        if name not in in_a or name not in in_b:
            raise ConfigError(
                f"{name!r} is not scored in both folders (A: {', '.join(sorted(in_a))}; "
                f"B: {', '.join(sorted(in_b))})"
            )
    if not names:
        raise ConfigError(f"{folder_a} and {folder_b} score no algorithm in common")
    return {name: compare_algorithm(results_a, results_b, name, name) for name in names}


def describe(comparisons: dict[str, list[Difference]]) -> str:
    """The comparison as text: per algorithm, one line per environment and one overall."""
    lines = []
    for name, differences in comparisons.items():
        lines.append(f"{name}:")
        width = max(len(d.what) for d in differences)
        for d in differences:
            lines.append(
                f"  {d.what:<{width}}  A {d.a:7.3f}  B {d.b:7.3f}  A-B {d.difference:+7.3f} "
                f"[{d.low:+.3f}, {d.high:+.3f}]  P(A>B) {d.probability_a_better:.2f}  {d.verdict}"
            )
    lines.append(
        "scores normalised per environment (0: alone, 1: pooled); A-B with a 95% stratified "
        "bootstrap interval; a difference is real when its interval leaves out 0"
    )
    return "\n".join(lines)
