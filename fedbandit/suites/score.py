"""The normalised score of a suite: per environment, how much of the gain of federation an
algorithm captured.

    score = (R_alone - R_alg) / (R_alone - R_pooled)

with R the cumulative regret per client at T: R_alone the mean over seeds of the clients learning
alone (no communication), R_pooled the mean over seeds of one learner that sees every client's
data (full communication). An algorithm no better than learning alone scores 0, one as good as
pooling everything scores 1; below 0 is worse than not communicating, above 1 better than the
pooled reference. Each seed of an algorithm gets its own score against the two reference means
(the mean of an algorithm's seed scores is the score of its mean regret), as the Atari
human-normalised scores do (Agarwal et al. 2021, "Deep RL at the edge of the statistical
precipice", the rliable paper). An environment where pooling does not beat learning alone
(R_alone <= R_pooled) has no gain to capture: its scores are undefined (NaN) and it is left out
of the aggregates, and the scorecard says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

#: Columns of ``results.csv``: one row per (environment, entry, seed).
RESULT_COLUMNS = [
    "environment",
    "algorithm",
    "role",
    "seed",
    "final_regret",
    "rounds",
    "uplink_scalars_per_client",
    "downlink_scalars_per_client",
    "uplink_bytes_per_client",
    "downlink_bytes_per_client",
]


def normalised_score(regret: np.ndarray | float, alone: float, pooled: float) -> np.ndarray:
    """(alone - regret) / (alone - pooled), element-wise; NaN everywhere when alone <= pooled
    (pooling gains nothing, so no share of a gain can be measured)."""
    values = np.asarray(regret, dtype=float)
    gap = float(alone) - float(pooled)
    if not np.isfinite(gap) or gap <= 0:
        return np.full(values.shape, np.nan)
    return (float(alone) - values) / gap


@dataclass(frozen=True)
class ReferenceEnds:
    """One environment's two ends: mean final regret per client over seeds."""

    alone: float
    pooled: float

    @property
    def defined(self) -> bool:
        """Whether pooling beats learning alone, so that scores exist."""
        return bool(np.isfinite(self.alone - self.pooled) and self.alone > self.pooled)


def reference_ends(results: pd.DataFrame) -> dict[str, ReferenceEnds]:
    """Each environment's reference ends, from the rows whose role is ``alone`` / ``pooled``."""
    ends = {}
    for environment, rows in results.groupby("environment", sort=False):
        means = rows.groupby("role")["final_regret"].mean()
        if "alone" in means and "pooled" in means:
            ends[str(environment)] = ReferenceEnds(float(means["alone"]), float(means["pooled"]))
    return ends


def with_scores(results: pd.DataFrame) -> pd.DataFrame:
    """``results`` with a ``score`` column: every row normalised by its environment's ends."""
    ends = reference_ends(results)
    scored = results.copy()
    scores = np.full(len(scored), np.nan)
    for index, (environment, regret) in enumerate(
        zip(scored["environment"], scored["final_regret"], strict=True)
    ):
        end = ends.get(str(environment))
        if end is not None:
            scores[index] = float(normalised_score(float(regret), end.alone, end.pooled))
    scored["score"] = scores
    return scored


def score_matrices(scored: pd.DataFrame) -> dict[str, tuple[list[str], np.ndarray]]:
    """Per compared algorithm: the environments it was scored on (those with defined ends) and
    its score matrix of shape (seeds, environments), rliable's layout. Seeds are matched by
    index; an environment where some seed is missing is left out of that algorithm's matrix."""
    compared = scored[(scored["role"] == "algorithm") & scored["score"].notna()]
    matrices: dict[str, tuple[list[str], np.ndarray]] = {}
    for algorithm, rows in compared.groupby("algorithm", sort=True):
        table = rows.pivot_table(index="seed", columns="environment", values="score")
        table = table.dropna(axis=1)
        if table.shape[1] == 0:
            continue
        columns = sorted(str(c) for c in table.columns)
        matrices[str(algorithm)] = (columns, table[columns].to_numpy(dtype=float))
    return matrices
