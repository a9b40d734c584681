"""``fedbandit bench privacy``: the differentially private algorithms against their non-private
schedules, side by side: ``private_fedlinucb`` against ``batched_fedlinucb``, ``private_fedpe``
(with and without its noise) against ``fedpe``."""

from __future__ import annotations

from typing import Any

from fedbandit.bench.common import Table, best_of
from fedbandit.contextual.instances import ContextualParams, contextual_instance
from fedbandit.instances import PaperSyntheticParams, paper_synthetic
from fedbandit.simulation import simulate


def bench_privacy(quick: bool = False) -> dict[str, Any]:
    """Seconds per seed of ``private_fedlinucb`` (silo LDP, eps = 1, delta = 0.01; its default
    ``decisions = "noisy_only"``, which skips the silo's own updates inside a batch) against its
    non-private schedule ``batched_fedlinucb``, interleaved, best of 3, at the authors' synthetic
    sizes (``Fed_Lin_Bandit.py``: M = 100 silos, K = 100 arms, d = 10, B = 25, unit contexts;
    T = 10,000 there and here; 500 and one timed run quick); and ``private_fedpe`` against ``fedpe``
    (``_bench_private_fedpe``)."""
    horizon = 500 if quick else 10_000
    instance = contextual_instance(
        ContextualParams(
            setting="shared", contexts="sphere", num_clients=100, num_arms=100, dim=10,
            noise_sigma=0.5,
        )
    )  # fmt: skip
    private = {"epsilon": 1.0, "delta": 0.01, "feature_bound": 1.0, "reward_bound": 2.0}
    runs = {"batched_fedlinucb": {}, "private_fedlinucb": private}
    simulate(instance, "private_fedlinucb", 50, [0, 0], private)  # compile and import first
    repeats = 1 if quick else 3
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, params in runs.items():
            seconds[name].append(simulate(instance, name, horizon, [0, 0], params).seconds)
    best = {name: min(values) for name, values in seconds.items()}
    fedpe = _bench_private_fedpe(quick)
    return {
        "M": 100,
        "K": 100,
        "d": 10,
        "T": horizon,
        "batched_seconds": best["batched_fedlinucb"],
        "private_seconds": best["private_fedlinucb"],
        "overhead_ratio": best["private_fedlinucb"] / best["batched_fedlinucb"],
        "repeats": repeats,
        **fedpe,
        "quick": quick,
    }


def _bench_private_fedpe(quick: bool) -> dict[str, Any]:
    """Seconds per seed of ``private_fedpe`` (eps = 1, delta = 0.01, R = 4) against ``fedpe``,
    interleaved, best of 5, on the paper's synthetic instance (M = 100, K = 10, d = 3,
    T = 2^17; 2^12 and one timed run quick); and of ``private_fedpe`` with ``noise = false``, to
    separate the clipping (the clipped sums and counts drawn given each block's sum,
    ``BanditEnvironment.clip_block_rewards``) from the noise."""
    horizon = 2**12 if quick else 2**17
    instance = paper_synthetic(PaperSyntheticParams())
    private = {"epsilon": 1.0, "delta": 0.01, "reward_bound": 4.0}
    runs = [
        ("fedpe", "fedpe", None),
        ("private", "private_fedpe", private),
        ("clipping_only", "private_fedpe", {**private, "noise": False}),
    ]
    simulate(instance, "private_fedpe", 64, [0, 0], private)  # compile and import first
    repeats = 1 if quick else 5
    seconds: dict[str, list[float]] = {key: [] for key, _, _ in runs}
    for _ in range(repeats):
        for key, name, params in runs:
            seconds[key].append(simulate(instance, name, horizon, [0, 0], params).seconds)
    best = {key: min(values) for key, values in seconds.items()}
    return {
        "fedpe_T": horizon,
        "fedpe_seconds": best["fedpe"],
        "private_fedpe_seconds": best["private"],
        "clipping_only_seconds": best["clipping_only"],
        "fedpe_overhead_ratio": best["private"] / best["fedpe"],
        "fedpe_repeats": repeats,
    }


def format_privacy(result: dict[str, Any]) -> Table:
    """Title and rows of ``fedbandit bench privacy``: each pair with its ratio and target."""
    rows: list[tuple[str, ...]] = [
        (
            "algorithm",
            f"seconds/seed ({best_of(result['repeats'])})",
            "ratio",
        ),
        ("batched_fedlinucb", f"{result['batched_seconds']:.2f}", "1.00"),
        (
            "private_fedlinucb",
            f"{result['private_seconds']:.2f}",
            f"{result['overhead_ratio']:.2f}",
        ),
        ("", "", "target <= 1.20"),
        (
            f"fedpe (M=100, K=10, d=3, T={result['fedpe_T']}; {best_of(result['fedpe_repeats'])})",
            "",
            "",
        ),
        ("fedpe", f"{result['fedpe_seconds']:.3f}", "1.00"),
        (
            "private_fedpe",
            f"{result['private_fedpe_seconds']:.3f}",
            f"{result['fedpe_overhead_ratio']:.2f}",
        ),
        (
            "  noise = false (clipping only)",
            f"{result['clipping_only_seconds']:.3f}",
            f"{result['clipping_only_seconds'] / result['fedpe_seconds']:.2f}",
        ),
        ("", "", "target <= 1.20"),
    ]
    title = (
        f"privacy: M={result['M']}, K={result['K']}, d={result['d']}, T={result['T']}, "
        f"B=25{' [quick]' if result['quick'] else ''}"
    )
    return title, rows
