"""The benchmark registry and tables (the measurements themselves run in ``make bench``)."""

from __future__ import annotations

import numpy as np
import pytest

from fedbandit.bench import BENCHMARKS, format_table
from fedbandit.bench.scale import _exponents, _per_client


def test_paper_and_scale_are_registered():
    assert {"design", "fedpe", "paper", "scale", "linucb", "flowersim", "deploy"} <= set(BENCHMARKS)


def test_paper_table():
    result = {
        "M": 100,
        "K": 10,
        "d": 3,
        "T": 131072,
        "seeds": 10,
        "experiment_seconds": 4.2,
        "command_seconds": 5.9,
        "local_ucb_seconds_per_seed": 0.31,
        "local_ucb_numpy_loop_seconds": 2.9,
        "local_ucb_speedup": 9.4,
        "seconds_per_seed_in_workers": {"fedpe": 0.1, "local_ucb": 0.4},
    }
    table = format_table("paper", result)
    assert "4.20 s" in table and "<= 5 s" in table and "0.310" in table and "9.4x" in table


def test_scale_growth_per_client():
    points = [
        {"M": 10, "T": 8, "seconds": 1.0, "peak_rss_mb": 100.0},
        {"M": 100, "T": 8, "seconds": 20.0, "peak_rss_mb": 500.0},
    ]
    grown = _per_client(points)
    assert grown[0]["us_per_client"] == 1e5
    assert grown[1]["time_growth_over_M_growth"] == 2.0
    assert grown[1]["rss_growth_over_M_growth"] == 0.5
    result = {
        "K": 10,
        "d": 5,
        "growth_with_M": grown,
        "growth_with_T": [points[0], points[0]],
        "local_ucb": _per_client(points),
    }
    table = format_table("scale", result)
    assert "local_ucb" in table and "time 2.00, RSS 0.50 x M's" in table
    # seconds 1 -> 20 and RSS 100 -> 500 MB over M 10 -> 100: M^log10(20), M^log10(5)
    fit = _exponents(points)
    assert fit is not None
    assert fit["time"] == pytest.approx(np.log10(20.0)) and fit["rss"] == pytest.approx(np.log10(5))
    result["fedpe_exponents_in_M"] = fit
    assert "~ M^1.30" in format_table("scale", result)
    assert _exponents([points[0], {"M": 100, "T": 8, "error": "out of memory"}]) is None


def test_sweep_benchmark_measures_the_overhead_ratio():
    result = BENCHMARKS["sweep"](quick=True)
    assert result["tasks"] == 2 * 4 * 2
    expected = result["wall_seconds"] / (result["task_seconds_sum"] / result["workers"])
    assert result["overhead_ratio"] == pytest.approx(expected, rel=1e-12)
    assert result["overhead_ratio"] > 0.5
    assert "overhead ratio" in format_table("sweep", result)


def test_glm_benchmark_times_the_compiled_gradient_against_numpy():
    from fedbandit.bench.glm import _glm_gradient_compiled, _glm_gradient_numpy

    result = BENCHMARKS["glm"](quick=True)
    assert result["gradient_speedup"] == pytest.approx(
        result["numpy_gradient_ms"] / result["compiled_gradient_ms"], rel=1e-12
    )
    assert result["seed_seconds"] > 0 and (result["T"], result["repeats"]) == (200, 1)
    table = format_table("glm", result)
    assert "fedglb_ucb seconds/seed (one run)" in table and "[quick]" in table
    assert "NumPy (before), ms (best of 5)" in table
    # The two formulations compute the same gradients, down to rounding (hand-sized data).
    data_x = np.array([[[1.0, 0.0], [0.0, 2.0], [5.0, 5.0]], [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]])
    data_y = np.array([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    point, count = np.zeros((2, 2)), np.array([2, 1])
    expected = [[-0.5, 1.0], [0.5, 0.5]]  # mu(0) = 1/2: sum (1/2 - y) x over the counted samples
    np.testing.assert_allclose(_glm_gradient_numpy(data_x, data_y, point, count), expected)
    np.testing.assert_allclose(_glm_gradient_compiled(data_x, data_y, point, count), expected)


def test_privacy_benchmark_reports_the_measured_ratio():
    result = BENCHMARKS["privacy"](quick=True)
    expected = result["private_seconds"] / result["batched_seconds"]
    assert result["overhead_ratio"] == pytest.approx(expected, rel=1e-12)
    assert result["private_seconds"] > 0 and result["batched_seconds"] > 0
    assert result["fedpe_overhead_ratio"] == pytest.approx(
        result["private_fedpe_seconds"] / result["fedpe_seconds"], rel=1e-12
    )
    assert result["repeats"] == 1 and result["fedpe_repeats"] == 1  # quick: one timed run each
    table = format_table("privacy", result)
    assert "seconds/seed (one run)" in table and "T=4096; one run)" in table
    assert "best of" not in table
    assert "best of 3" in format_table("privacy", {**result, "repeats": 3})
    assert "private_fedlinucb" in table and "private_fedpe" in table
    assert table.count("target <= 1.20") == 2  # both pairs, side by side in one run


@pytest.mark.slow
def test_flowersim_benchmark_runs_the_commands_side_by_side():
    """Both runtimes with 1 and 3 seeds (quick); the ratios are the measured seconds' ratios."""
    result = BENCHMARKS["flowersim"](quick=True)
    assert result["seeds"] == 3
    ratio = result["flower_sim_many_seeds_seconds"] / result["flower_sim_one_seed_seconds"]
    assert result["flower_sim_many_over_one"] == pytest.approx(ratio, rel=1e-12)
    extra = result["flower_sim_later_seed_seconds"] - result["local_later_seed_seconds"]
    assert result["later_seed_cost_over_local"] == pytest.approx(extra, rel=1e-12)
    assert 0 < result["local_later_seed_seconds"] < result["flower_sim_later_seed_seconds"]
    table = format_table("flowersim", result)
    assert "flower-sim" in table and "local (1 worker)" in table and "<= 2" in table
