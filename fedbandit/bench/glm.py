"""``fedbandit bench glm``: FedGLB-UCB's seconds per seed on ``fed_glm``, and one evaluation of
its clients' gradients, NumPy as before against the compiled passes of now."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from fedbandit.algorithms.glm_ucb import client_gradients, link_mean
from fedbandit.bench.common import Table, best_of
from fedbandit.config import load_experiment
from fedbandit.registry import build_instance
from fedbandit.simulation import simulate


def _glm_gradient_numpy(data_x: np.ndarray, data_y: np.ndarray, point: np.ndarray, count):
    """FedGLB-UCB's client gradients as they were computed before the compiled passes: the
    (n, L, d) products, their running sums and each client's entry at its count."""
    z = (data_x * point[:, None, :]).sum(axis=2)
    running = np.cumsum(data_x * (link_mean("logistic", z) - data_y)[:, :, None], axis=1)
    last = running[np.arange(len(count)), np.maximum(count - 1, 0)]
    return np.where((count > 0)[:, None], last, 0.0)


def _glm_gradient_compiled(data_x: np.ndarray, data_y: np.ndarray, point: np.ndarray, count):
    """The same gradients as FedGLB-UCB's clients compute them now (``client_gradients``)."""
    return client_gradients(data_x, data_y, point, count, "logistic")


def bench_glm(quick: bool = False) -> dict[str, Any]:
    """Seconds per seed of ``fedglb_ucb`` on ``fed_glm`` (M = 20, K = 25, d = 10, T = 1000; 200
    quick), best of 2 (one run quick); and one AGD gradient evaluation over every client's data
    (M = 20 clients of L = T samples, d = 10), NumPy as before against the compiled passes, on
    the same arrays, interleaved, best of 20 (5 quick)."""
    horizon = 200 if quick else 1000
    config = load_experiment("fed_glm", [f"horizon={horizon}"])
    instance = build_instance(config.instance)
    params = config.hyperparameters("fedglb_ucb")
    simulate(instance, "fedglb_ucb", 20, [0, 0], params)  # compile and import first
    repeats = 1 if quick else 2
    seed_seconds = min(
        simulate(instance, "fedglb_ucb", horizon, [0, 0], params).seconds for _ in range(repeats)
    )
    rng = np.random.default_rng(0)
    clients, dim = 20, 10
    data_x = rng.standard_normal((clients, horizon, dim)) / np.sqrt(dim)
    data_y = rng.integers(0, 2, (clients, horizon)).astype(float)
    point = np.broadcast_to(rng.standard_normal(dim) / np.sqrt(dim), (clients, dim))
    count = np.full(clients, horizon, dtype=np.int64)
    compiled = _glm_gradient_compiled(data_x, data_y, point, count)
    np.testing.assert_allclose(
        compiled, _glm_gradient_numpy(data_x, data_y, point, count), rtol=1e-12, atol=1e-12
    )
    timings: dict[str, list[float]] = {"numpy": [], "compiled": []}
    for _ in range(5 if quick else 20):
        for key, evaluate in (("numpy", _glm_gradient_numpy), ("compiled", _glm_gradient_compiled)):
            start = time.perf_counter()
            evaluate(data_x, data_y, point, count)
            timings[key].append(time.perf_counter() - start)
    best = {key: min(values) for key, values in timings.items()}
    return {
        "M": clients,
        "K": 25,
        "d": dim,
        "T": horizon,
        "seed_seconds": seed_seconds,
        "repeats": repeats,
        "numpy_gradient_ms": 1e3 * best["numpy"],
        "compiled_gradient_ms": 1e3 * best["compiled"],
        "gradient_speedup": best["numpy"] / best["compiled"],
        "gradient_repeats": len(timings["numpy"]),
        "quick": quick,
    }


def format_glm(result: dict[str, Any]) -> Table:
    """Title and rows (measure, value, ratio) of ``fedbandit bench glm``."""
    rows: list[tuple[str, ...]] = [
        ("measure", "value", "ratio"),
        (
            f"fedglb_ucb seconds/seed ({best_of(result['repeats'])})",
            f"{result['seed_seconds']:.2f}",
            "",
        ),
        (
            f"gradient evaluation, NumPy (before), ms ({best_of(result['gradient_repeats'])})",
            f"{result['numpy_gradient_ms']:.3f}",
            "1.00",
        ),
        (
            "gradient evaluation, compiled (now), ms",
            f"{result['compiled_gradient_ms']:.3f}",
            f"{1 / result['gradient_speedup']:.2f}",
        ),
    ]
    title = (
        f"glm: fed_glm, M={result['M']}, K={result['K']}, d={result['d']}, T={result['T']}"
        f"{' [quick]' if result['quick'] else ''}"
    )
    return title, rows
