"""``fedbandit bench fedpe``: Fed-PE in the paper's synthetic setting, one seed at a time."""

from __future__ import annotations

from typing import Any

from fedbandit.bench.common import Table
from fedbandit.instances import PaperSyntheticParams, paper_synthetic
from fedbandit.simulation import simulate


def bench_fedpe(quick: bool = False) -> dict[str, Any]:
    """Fed-PE in the paper's synthetic setting (M=100, K=10, d=3, T=2^17), one seed."""
    horizon = 2**14 if quick else 2**17
    instance = paper_synthetic(PaperSyntheticParams())
    simulate(instance, "fedpe", 2**8, [0, 99])  # warm-up: imports and caches
    times, regrets = [], []
    for seed in range(3):
        result = simulate(instance, "fedpe", horizon, [0, seed])
        times.append(result.seconds)
        regrets.append(float(result.regret.mean_cumulative_regret()[-1]))
    return {
        "M": 100,
        "K": 10,
        "d": 3,
        "T": horizon,
        "seconds_per_seed": min(times),
        "seconds_all": times,
        "final_regret": regrets,
    }


def format_fedpe(result: dict[str, Any]) -> Table:
    """Title and rows of ``fedbandit bench fedpe``."""
    rows: list[tuple[str, ...]] = [("T", "seconds/seed (best of 3)", "R(T)/M")]
    rows.append(
        (
            str(result["T"]),
            f"{result['seconds_per_seed']:.3f}",
            f"{result['final_regret'][0]:.1f}",
        )
    )
    title = f"fedpe: paper synthetic, M={result['M']}, K={result['K']}, d={result['d']}"
    return title, rows
