"""Benchmarks behind ``make bench`` / ``fedbandit bench NAME [--json]``: ``BENCHMARKS`` by name
and ``format_table``; the design solvers' benchmark is in ``fedbandit.bench.design``, the Flower
deployment's in ``fedbandit.bench.deploy``.

Figures are wall-clock seconds on this machine, measured side by side in one process where a
ratio is reported; interpreter start-up is excluded. BLAS runs single-threaded, as in every
fedbandit command (see ``fedbandit.threads``). Peak memory is measured in a fresh child
process (its ``ru_maxrss``), so earlier benchmarks do not inflate it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

_SCALE_CHILD = """
import json, resource, sys, time
from fedbandit.threads import single_threaded_blas
single_threaded_blas()
from fedbandit.instances import PaperSyntheticParams, paper_synthetic
from fedbandit.simulation import simulate
M, T, K, d = (int(v) for v in sys.argv[1:5])
instance = paper_synthetic(PaperSyntheticParams(num_clients=M, num_arms=K, dim=d))
start = time.perf_counter()
result = simulate(instance, "fedpe", T, [0, 0])
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"M": M, "T": T, "seconds": seconds, "peak_rss_mb": peak,
                  "final_regret": float(result.regret.mean_cumulative_regret()[-1])}))
"""


def bench_design(quick: bool = False) -> dict[str, Any]:
    """Fast design solver against cvxpy + Clarabel on M=100, K=30, d=5 (random active sets)."""
    from fedbandit.bench.design import bench_design as run

    return run(seed=0, repeats=1 if quick else 3)


def bench_fedpe(quick: bool = False) -> dict[str, Any]:
    """Fed-PE in the paper's synthetic setting (M=100, K=10, d=3, T=2^17), one seed."""
    from fedbandit.instances import PaperSyntheticParams, paper_synthetic
    from fedbandit.simulation import simulate

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


def _scale_point(
    num_clients: int, horizon: int, num_arms: int = 10, dim: int = 5
) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _SCALE_CHILD,
            str(num_clients),
            str(horizon),
            str(num_arms),
            str(dim),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if out.returncode != 0:
        raise RuntimeError(f"scale benchmark M={num_clients} T={horizon} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_scale(quick: bool = False) -> dict[str, Any]:
    """Fed-PE at M=10,000, K=10, d=5, T=2^20 in-process, and how time grows with M and T."""
    M, T = (1000, 2**16) if quick else (10000, 2**20)
    main = _scale_point(M, T)
    growth_m = [_scale_point(m, T) for m in (M // 4, M // 2)] + [main]
    growth_t = [_scale_point(M, t) for t in (T // 16, T // 4)] + [main]
    return {
        "M": M,
        "K": 10,
        "d": 5,
        "T": T,
        "seconds": main["seconds"],
        "peak_rss_mb": main["peak_rss_mb"],
        "growth_with_M": growth_m,
        "growth_with_T": growth_t,
    }


def _contextual_instance(num_clients: int):
    from fedbandit.contextual.instances import ContextualParams, contextual_instance

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
    from fedbandit.simulation import simulate

    result = simulate(_contextual_instance(num_clients), "linucb", rounds, [0, 0])
    return num_clients * rounds / result.seconds


def _mabwiser_decisions_per_s(decisions: int) -> float | None:
    """MABWiser's LinUCB online (one predict and one partial_fit per decision) on client 0's
    context stream of the same instance; None when MABWiser is not installed."""
    try:
        from mabwiser.mab import MAB, LearningPolicy
    except ImportError:
        return None
    from fedbandit.contextual.environment import ContextualEnvironment

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
    from fedbandit.simulation import simulate

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


def bench_deploy(quick: bool = False) -> dict[str, Any]:
    """A Flower deployment on loopback (SuperLink + 4 SuperNodes): Fed-PE's wall time and round
    latency, its exchanges against a bare Flower echo app, and node memory at M = 10,000."""
    from fedbandit.bench.deploy import deploy_benchmark

    return deploy_benchmark(quick=quick)


BENCHMARKS: dict[str, Callable[..., dict[str, Any]]] = {
    "design": bench_design,
    "fedpe": bench_fedpe,
    "scale": bench_scale,
    "linucb": bench_linucb,
    "deploy": bench_deploy,
}


def format_table(name: str, result: dict[str, Any]) -> str:
    """A small plain-text table for one benchmark's figures."""
    rows: list[tuple[str, ...]]
    if name == "design":
        rows = [
            ("solver", "seconds", "certificate G/D-1"),
            ("fast", f"{result['fast_seconds']:.4f}", f"{result['fast_certificate']:.2e}"),
            (
                "cvxpy+Clarabel",
                f"{result['cvxpy_seconds']:.4f}",
                f"{result['cvxpy_certificate']:.2e}",
            ),
            ("speedup", f"{result['speedup']:.0f}x", ""),
        ]
        title = f"design: M={result['M']}, K={result['K']}, d={result['d']}"
    elif name == "fedpe":
        rows = [("T", "seconds/seed (best of 3)", "R(T)/M")]
        rows.append(
            (
                str(result["T"]),
                f"{result['seconds_per_seed']:.3f}",
                f"{result['final_regret'][0]:.1f}",
            )
        )
        title = f"fedpe: paper synthetic, M={result['M']}, K={result['K']}, d={result['d']}"
    elif name == "linucb":
        peer = result["mabwiser_decisions_per_s"]
        rows = [("learner", "decisions/s", "ratio to MABWiser")]
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
    elif name == "deploy":
        from fedbandit.bench.deploy import format_deploy

        title, rows = format_deploy(result)
    else:
        rows = [("M", "T", "seconds", "peak RSS MB")]
        for point in result["growth_with_M"] + result["growth_with_T"][:-1]:
            rows.append(
                (
                    str(point["M"]),
                    str(point["T"]),
                    f"{point['seconds']:.2f}",
                    f"{point['peak_rss_mb']:.0f}",
                )
            )
        title = f"scale: Fed-PE, K={result['K']}, d={result['d']}, one seed, in-process"
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [title] + ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines) + "\n"
