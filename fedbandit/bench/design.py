"""``fedbandit bench design``: the multi-client G-optimal design solvers (``fedbandit.design``).

``bench_design``: M=100, K=30, d=5, random per-client active sets, some rank-deficient arms;
interior-point solver vs cvxpy + Clarabel, both to certificate G/D - 1 <= 1e-3.
``bench_paper_setting``: the Fed-PE paper's synthetic setting (M=100, K=10, d=3, all arms active,
positive coordinates; Huang et al., NeurIPS 2021, Sec. 7), cold and warm-started to 1e-2.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedbandit.bench.common import Table
from fedbandit.design import solve_design_cvxpy, solve_design_fast
from fedbandit.errors import import_extra

__all__ = [
    "bench_design",
    "bench_paper_setting",
    "format_design",
    "paper_design_problem",
    "random_design_problem",
]


def random_design_problem(
    rng: np.random.Generator,
    num_clients: int,
    num_arms: int,
    dim: int,
    rank_deficient_arms: int = 3,
    deficient_rank: int = 2,
) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors (M, K, d) and an active mask (M, K).

    Gaussian directions, except ``rank_deficient_arms`` random arms whose vectors (all clients)
    lie in a random ``deficient_rank``-dimensional subspace. Client i keeps a uniformly random
    subset of arms of uniformly random size in 1..K.
    """
    if not 0 <= rank_deficient_arms <= num_arms or not 1 <= deficient_rank <= dim:
        raise ValueError("need 0 <= rank_deficient_arms <= K and 1 <= deficient_rank <= d")
    vectors = rng.standard_normal((num_clients, num_arms, dim))
    for arm in rng.choice(num_arms, size=rank_deficient_arms, replace=False):
        basis = np.linalg.qr(rng.standard_normal((dim, deficient_rank)))[0]
        vectors[:, arm] = rng.standard_normal((num_clients, deficient_rank)) @ basis.T
    vectors /= np.linalg.norm(vectors, axis=2, keepdims=True)
    sizes = rng.integers(1, num_arms + 1, size=num_clients)
    order = np.argsort(np.argsort(rng.random((num_clients, num_arms)), axis=1), axis=1)
    return vectors, order < sizes[:, None]


def paper_design_problem(
    rng: np.random.Generator, num_clients: int = 100, num_arms: int = 10, dim: int = 3
) -> tuple[np.ndarray, np.ndarray]:
    """Fed-PE synthetic setting: unit vectors with positive coordinates, every arm active."""
    vectors = np.abs(rng.standard_normal((num_clients, num_arms, dim)))
    vectors /= np.linalg.norm(vectors, axis=2, keepdims=True)
    return vectors, np.ones((num_clients, num_arms), dtype=bool)


def bench_design(quick: bool = False, seed: int = 0, repeats: int | None = None) -> dict[str, Any]:
    """Fast (best of ``2 repeats - 1``) vs cvxpy + Clarabel (best of min(2, repeats)) at tol 1e-3,
    interleaved so that both see the same load; medians too. Then, as between two Fed-PE phases,
    5% of the (client, arm) pairs are eliminated and the next design is solved cold and
    warm-started from the first (the server passes the previous phase's design). ``repeats`` is
    3, or 1 with ``quick``, unless given.

    Times include preprocessing and the final certificate; cvxpy's import is excluded.
    """
    import_extra("cvxpy", extra="bench", needed_by="fedbandit bench design")  # its import: untimed

    if repeats is None:
        repeats = 1 if quick else 3

    num_clients, num_arms, dim = 100, 30, 5
    rng = np.random.default_rng(seed)
    vectors, active = random_design_problem(rng, num_clients, num_arms, dim)
    solve_design_fast(vectors, active, tol=1e-3)  # warm-up: first calls of the LAPACK routines
    fast_runs, ref_runs = [], []
    for k in range(max(1, 2 * repeats - 1)):
        fast_runs.append(solve_design_fast(vectors, active, tol=1e-3))
        if k < max(1, min(2, repeats)):
            ref_runs.append(solve_design_cvxpy(vectors, active))
    fast = min(fast_runs, key=lambda r: r.seconds)
    ref = min(ref_runs, key=lambda r: r.seconds)
    fast_median = float(np.median([r.seconds for r in fast_runs]))
    ref_median = float(np.median([r.seconds for r in ref_runs]))
    reduced = active & (rng.random(active.shape) >= 0.05)
    reduced[np.arange(num_clients), active.argmax(axis=1)] = True
    cold_next = [solve_design_fast(vectors, reduced, tol=1e-3) for _ in range(repeats)]
    warm_next = [
        solve_design_fast(vectors, reduced, tol=1e-3, initial=fast.weights) for _ in range(repeats)
    ]
    cold = min(cold_next, key=lambda r: r.seconds)
    warm = min(warm_next, key=lambda r: r.seconds)
    return {
        "fast_seconds": fast.seconds,
        "cvxpy_seconds": ref.seconds,
        "fast_certificate": fast.certificate,
        "cvxpy_certificate": ref.certificate,
        "speedup": ref.seconds / fast.seconds,
        "fast_seconds_median": fast_median,
        "cvxpy_seconds_median": ref_median,
        "speedup_median": ref_median / fast_median,
        "M": num_clients,
        "K": num_arms,
        "d": dim,
        "fast_iterations": fast.iterations,
        "next_phase_cold_seconds": cold.seconds,
        "next_phase_cold_iterations": cold.iterations,
        "next_phase_cold_certificate": cold.certificate,
        "next_phase_warm_seconds": warm.seconds,
        "next_phase_warm_iterations": warm.iterations,
        "next_phase_warm_certificate": warm.certificate,
        "next_phase_warm_speedup_vs_cvxpy": ref.seconds / warm.seconds,
    }


def bench_paper_setting(
    seed: int = 0, repeats: int = 5, tol: float = 1e-2, eliminated: float = 0.05
) -> dict:
    """Paper setting, cold (uniform start), then after a fraction ``eliminated`` of the
    (client, arm) pairs is dropped (as between Fed-PE phases) cold and warm-started from the
    first design; best of ``repeats`` each. Warm starts pay off for small changes only."""
    rng = np.random.default_rng(seed)
    vectors, active = paper_design_problem(rng)
    runs = max(1, repeats)

    def best(act: np.ndarray, initial: np.ndarray | None = None):
        return min(
            (solve_design_fast(vectors, act, tol=tol, initial=initial) for _ in range(runs)),
            key=lambda r: r.seconds,
        )

    cold = best(active)
    reduced = active & (rng.random(active.shape) >= eliminated)
    reduced[np.arange(active.shape[0]), rng.integers(0, active.shape[1], active.shape[0])] = True
    cold_next = best(reduced)
    warm_next = best(reduced, cold.weights)
    return {
        "cold_seconds": cold.seconds,
        "cold_iterations": cold.iterations,
        "cold_certificate": cold.certificate,
        "next_cold_seconds": cold_next.seconds,
        "next_cold_iterations": cold_next.iterations,
        "next_warm_seconds": warm_next.seconds,
        "next_warm_iterations": warm_next.iterations,
        "next_warm_certificate": warm_next.certificate,
    }


def format_design(result: dict[str, Any]) -> Table:
    """Title and rows of ``fedbandit bench design``: each solver's seconds and certificate."""
    rows: list[tuple[str, ...]] = [
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
    return title, rows
