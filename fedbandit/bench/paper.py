"""``fedbandit bench paper``: the whole ``fedpe_synthetic`` experiment through the API and the
command, and Local UCB's compiled kernel against the NumPy loop it replaced."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fedbandit.algorithms.local_ucb import LocalUCBClient, LocalUCBParams
from fedbandit.api import run
from fedbandit.bench.common import Table
from fedbandit.bench.reference import local_ucb_numpy_loop
from fedbandit.environment import BanditEnvironment
from fedbandit.federation.messages import Message
from fedbandit.instances import PaperSyntheticParams, paper_synthetic
from fedbandit.simulation import problem_spec, simulate


def _local_ucb_seconds(horizon: int, seeds: int) -> tuple[list[float], float]:
    """Local UCB on the paper's instance: seconds of each seed (compiled kernel, after a warm-up),
    and one seed of the NumPy loop it replaced (``fedbandit.bench.reference``), side by side."""
    instance = paper_synthetic(PaperSyntheticParams())
    simulate(instance, "local_ucb", 2**8, [0, 99])  # warm-up: imports, the kernel's cache
    times = [simulate(instance, "local_ucb", horizon, [0, s]).seconds for s in range(seeds)]
    ids = np.arange(instance.num_clients)
    start = time.perf_counter()
    compiled = BanditEnvironment(instance, ids, horizon, [0, 0])
    LocalUCBClient(problem_spec(instance, horizon), LocalUCBParams(), compiled).handle(
        Message("start", 0, ids, {})
    )
    times.append(time.perf_counter() - start)
    start = time.perf_counter()
    loop = BanditEnvironment(instance, ids, horizon, [0, 0])
    local_ucb_numpy_loop(loop, instance.noise_sigma)
    loop_seconds = time.perf_counter() - start
    if not np.array_equal(loop.record().increment_diff, compiled.record().increment_diff):
        raise RuntimeError("Local UCB's compiled kernel and the NumPy loop disagree")
    return times, loop_seconds


#: The host yardstick's horizon (``bench paper``'s) and its seconds on the machine that measured
#: the docs' tables (docs/appendix/benchmark-history.md, the ``paper`` run).
YARDSTICK_HORIZON = 2**17
YARDSTICK_DOCS_SECONDS = 1.56


def host_yardstick() -> dict[str, float]:
    """How fast this host runs NumPy-bound work, and how loaded it is: one seed of Local UCB's
    NumPy loop on the paper's instance at T = 2^17 (``bench paper``'s "NumPy loop" row; 1.56 s on
    the docs' machine) and the 1-minute load average before it. Counts measured on hosts whose
    yardsticks differ compare by the ratio of their yardsticks, not by their seconds."""
    instance = paper_synthetic(PaperSyntheticParams())
    ids = np.arange(instance.num_clients)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    environment = BanditEnvironment(instance, ids, YARDSTICK_HORIZON, [0, 0])
    local_ucb_numpy_loop(environment, instance.noise_sigma)
    return {
        "numpy_loop_seconds": time.perf_counter() - start,
        "docs_numpy_loop_seconds": YARDSTICK_DOCS_SECONDS,
        "load_1min": load,
    }


def bench_paper(quick: bool = False) -> dict[str, Any]:
    """The whole ``fedpe_synthetic`` experiment (4 algorithms x 10 seeds, M = 100, K = 10, d = 3,
    T = 2^17) with 2 worker processes, result files and plots included, and Local UCB per seed
    against the NumPy loop it replaced."""
    horizon, seeds = (2**13, 2) if quick else (2**17, 10)
    overrides = {"horizon": horizon, "seeds": seeds}
    per_seed, loop_seconds = _local_ucb_seconds(horizon, 2 if quick else 3)
    folder = Path(tempfile.mkdtemp(prefix="fedbandit-bench-paper-"))
    try:
        start = time.perf_counter()
        results = run(
            "fedpe_synthetic", workers=2, out=folder / "api", overrides=overrides, progress=False
        )
        experiment_seconds = time.perf_counter() - start
        command = [sys.executable, "-m", "fedbandit.cli", "run", "fedpe_synthetic"]
        command += ["--workers", "2", "--quiet", "--out", str(folder / "cli")]
        command += ["--set", f"horizon={horizon}", "--set", f"seeds={seeds}"]
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, timeout=1800)
        command_seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    summary = results.summary.set_index("algorithm")
    return {
        "M": 100,
        "K": 10,
        "d": 3,
        "T": horizon,
        "seeds": seeds,
        "workers": 2,
        "experiment_seconds": experiment_seconds,
        "command_seconds": command_seconds,
        "seconds_per_seed_in_workers": {
            name: float(summary.loc[name, "seconds_per_seed"]) for name in summary.index
        },
        "local_ucb_seconds_per_seed": min(per_seed),
        "local_ucb_seconds_all": per_seed,
        "local_ucb_numpy_loop_seconds": loop_seconds,
        "local_ucb_speedup": loop_seconds / min(per_seed),
        "final_regret": {
            name: float(summary.loc[name, "final_regret_mean"]) for name in summary.index
        },
    }


def format_paper(result: dict[str, Any]) -> Table:
    """Title and rows (measure, value, target) of ``fedbandit bench paper``."""
    rows: list[tuple[str, ...]] = [("measure", "value", "target")]
    rows.append(
        (
            f"experiment, {result['seeds']} seeds x 4 algorithms, --workers 2",
            f"{result['experiment_seconds']:.2f} s",
            "<= 5 s",
        )
    )
    rows.append(("same, `fedbandit run` command", f"{result['command_seconds']:.2f} s", ""))
    rows.append(
        (
            "local_ucb seconds/seed (best)",
            f"{result['local_ucb_seconds_per_seed']:.3f}",
            "<= 0.5",
        )
    )
    rows.append(
        (
            "local_ucb NumPy loop (before), one seed",
            f"{result['local_ucb_numpy_loop_seconds']:.2f} s",
            f"{result['local_ucb_speedup']:.1f}x",
        )
    )
    for algorithm, seconds in result["seconds_per_seed_in_workers"].items():
        rows.append((f"{algorithm} seconds/seed in the workers", f"{seconds:.3f}", ""))
    title = (
        f"paper: fedpe_synthetic, M={result['M']}, K={result['K']}, d={result['d']}, "
        f"T={result['T']}"
    )
    return title, rows
