"""``fedbandit bench sweep``: the overhead of a study run as one pool of long-lived workers.

A study of 24 tasks (3 points x 4 algorithms x 2 seeds of the Fed-PE paper's instance at
M = 100, 300, 1000 and T = 2^15; ``--quick``: 16 tasks at M = 10, 20 and T = 512, where fixed
costs dominate) runs with 2 workers. The overhead ratio is the study's wall time divided by the
sum of its tasks' own seconds (each seed's ``seconds``: the simulation) over the workers. A shell
loop of ``fedbandit run`` per point pays an interpreter start and the imports for every run.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from fedbandit.bench.common import Table
from fedbandit.config import validate_experiment
from fedbandit.runs.sweeps import run_sweep
from fedbandit.sweep import load_sweep


def bench_sweep(quick: bool = False, workers: int = 2) -> dict[str, Any]:
    """The study's tasks, their summed seconds, its wall time and the overhead ratio."""
    clients = [100, 300, 1000] if not quick else [10, 20]
    config = validate_experiment(
        {
            "name": "bench_sweep",
            "horizon": 32768 if not quick else 512,
            "seeds": 2,
            "algorithms": ["fedpe", "fedpe_enhanced", "collaborative", "local_ucb"],
            "instance": {"kind": "paper_synthetic", "num_clients": 50, "num_arms": 10, "dim": 3},
            "sweep": {"grid": {"instance.num_clients": clients}},
        }
    )
    with tempfile.TemporaryDirectory(prefix="fb-bench-sweep-") as folder:
        started = time.perf_counter()
        run_sweep(config, Path(folder) / "out", workers=workers, progress=False)
        wall = time.perf_counter() - started
        table = load_sweep(Path(folder) / "out").table
    task_seconds = float(table["seconds"].sum())
    return {
        "tasks": len(table),
        "workers": workers,
        "task_seconds_sum": task_seconds,
        "wall_seconds": wall,
        "overhead_ratio": wall / (task_seconds / workers),
        "quick": quick,
    }


def format_sweep(result: dict[str, Any]) -> Table:
    """Title and rows of ``fedbandit bench sweep``: the figures and the ratio's target."""
    rows: list[tuple[str, ...]] = [
        ("tasks", "workers", "task seconds (sum)", "wall seconds", "overhead ratio"),
        (
            str(result["tasks"]),
            str(result["workers"]),
            f"{result['task_seconds_sum']:.2f}",
            f"{result['wall_seconds']:.2f}",
            f"{result['overhead_ratio']:.2f}",
        ),
        (
            "",
            "",
            "",
            "",
            "target <= 1.2: wall / (task seconds / workers)",
        ),
    ]
    title = (
        f"sweep: {result['tasks']} tasks (3 points x 4 algorithms x 2 seeds), one pool of "
        f"long-lived workers{' [quick]' if result['quick'] else ''}"
    )
    return title, rows
