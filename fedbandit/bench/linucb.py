"""``fedbandit bench linucb``: decisions per second of our batched LinUCB against MABWiser's
online LinUCB (when installed), and LinUCB-d at the target size."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from fedbandit.bench.common import Table
from fedbandit.contextual.environment import ContextualEnvironment
from fedbandit.contextual.instances import ContextualParams, contextual_instance
from fedbandit.simulation import simulate


def _contextual_instance(num_clients: int):
    return contextual_instance(
        ContextualParams(
            setting="disjoint",
            contexts="gaussian",
            num_clients=num_clients,
            num_arms=10,
            dim=10,
            noise_sigma=0.5,
            margin=0.1,
            seed=0,
        )
    )


def _ours_decisions_per_s(num_clients: int, rounds: int) -> float:
    result = simulate(_contextual_instance(num_clients), "linucb", rounds, [0, 0])
    return num_clients * rounds / result.seconds


def _mabwiser_decisions_per_s(decisions: int) -> float | None:
    """MABWiser's LinUCB online (one predict and one partial_fit per decision) on client 0's
    context stream of the same instance; None when MABWiser is not installed."""
    try:
        from mabwiser.mab import MAB, LearningPolicy
    except ImportError:
        return None
    instance = _contextual_instance(1)
    env = ContextualEnvironment(instance, [0], decisions + 10, [0, 0])
    arms = list(range(instance.num_arms))
    mab = MAB(arms=arms, learning_policy=LearningPolicy.LinUCB(alpha=1.0, l2_lambda=1.0))
    contexts, _ = env.observe()
    mab.fit(
        decisions=arms,
        rewards=[0.0] * len(arms),
        contexts=np.repeat(contexts[0, :1], len(arms), axis=0),
    )
    start = time.perf_counter()
    for _ in range(decisions):
        contexts, _ = env.observe()
        x = contexts[0, :1]
        arm = int(mab.predict(x))
        reward = env.pull(np.array([arm]))
        mab.partial_fit([arm], reward.tolist(), x)
    return decisions / (time.perf_counter() - start)


def bench_linucb(quick: bool = False) -> dict[str, Any]:
    """Per-decision throughput: our batched LinUCB (M = 100 clients; and M = 1) against MABWiser's
    online LinUCB, K = 10, d = 10, Gaussian contexts; plus LinUCB-d at the target size."""
    rounds = 500 if quick else 3000
    ours = _ours_decisions_per_s(100, rounds)
    single = _ours_decisions_per_s(1, rounds)
    peer = _mabwiser_decisions_per_s(300 if quick else 2000)
    horizon = 2000 if quick else 100_000
    run = simulate(_contextual_instance(100), "linucb_d", horizon, [0, 0])
    return {
        "K": 10,
        "d": 10,
        "ours_decisions_per_s": ours,
        "ours_single_client_decisions_per_s": single,
        "mabwiser_decisions_per_s": peer,
        "speedup": ours / peer if peer else None,
        "single_client_speedup": single / peer if peer else None,
        "linucb_d_M100_T": horizon,
        "linucb_d_M100_seconds": run.seconds,
    }


def format_linucb(result: dict[str, Any]) -> Table:
    """Title and rows of ``fedbandit bench linucb``; "n/a" ratios without MABWiser."""
    peer = result["mabwiser_decisions_per_s"]
    rows: list[tuple[str, ...]] = [("learner", "decisions/s", "ratio to MABWiser")]
    rows.append(
        (
            "ours, M=100 batched",
            f"{result['ours_decisions_per_s']:.0f}",
            f"{result['speedup']:.0f}x" if peer else "n/a",
        )
    )
    rows.append(
        (
            "ours, M=1",
            f"{result['ours_single_client_decisions_per_s']:.0f}",
            f"{result['single_client_speedup']:.1f}x" if peer else "n/a",
        )
    )
    rows.append(("MABWiser LinUCB", f"{peer:.0f}" if peer else "not installed", ""))
    rows.append(
        (
            f"linucb_d M=100 T={result['linucb_d_M100_T']}",
            f"{result['linucb_d_M100_seconds']:.1f} s",
            "",
        )
    )
    title = f"linucb: K={result['K']}, d={result['d']}, Gaussian contexts"
    return title, rows
