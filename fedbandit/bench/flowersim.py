"""``fedbandit bench flowersim``: ``fedbandit run fedpe_tiny`` on flower-sim and in-process, with
one seed and with several, as whole commands side by side."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fedbandit.bench.common import Table
from fedbandit.errors import require_extra


def _command_seconds(out: Path, seeds: int, runtime: str) -> tuple[float, list[float]]:
    """Wall seconds of ``fedbandit run fedpe_tiny`` (Fed-PE alone) with ``seeds`` seeds on
    ``runtime`` (a process of its own, as a user runs it; local on one worker), and each seed's
    own seconds from its result file."""
    command = [sys.executable, "-m", "fedbandit.cli", "run", "fedpe_tiny", "--quiet"]
    command += ["--set", 'algorithms=["fedpe"]', "--set", f"seeds={seeds}", "--out", str(out)]
    command += ["--runtime", runtime] + (["--workers", "1"] if runtime == "local" else [])
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, timeout=1800)
    wall = time.perf_counter() - start
    per_seed = [
        float(json.loads((out / "runs" / "fedpe" / f"seed_{seed}.json").read_text())["seconds"])
        for seed in range(seeds)
    ]
    return wall, per_seed


def bench_flowersim(quick: bool = False) -> dict[str, Any]:
    """``fedpe_tiny`` (Fed-PE, 23 exchanges a seed) with 1 and with N seeds, on flower-sim and
    in-process, side by side: flower-sim starts its simulation once per command, so N seeds
    should cost at most 2x one seed, and each seed after the first at most 1 s more than
    in-process (from the seeds' own seconds, median of seeds 1..N-1; the difference of the
    commands' wall times also carries the start-up's variation of a few seconds)."""
    require_extra("ray", extra="simulation", needed_by="fedbandit bench flowersim")
    many = 3 if quick else 10
    folder = Path(tempfile.mkdtemp(prefix="fedbandit-bench-flowersim-"))
    seconds: dict[str, dict[int, float]] = {"flower-sim": {}, "local": {}}
    later: dict[str, float] = {}
    try:
        for runtime in ("flower-sim", "local"):
            for seeds in (1, many):
                out = folder / f"{runtime}-{seeds}"
                seconds[runtime][seeds], per_seed = _command_seconds(out, seeds, runtime)
            later[runtime] = float(np.median(per_seed[1:]))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    sim, local = seconds["flower-sim"], seconds["local"]
    sim_extra = (sim[many] - sim[1]) / (many - 1)
    local_extra = (local[many] - local[1]) / (many - 1)
    return {
        "flower_sim_later_seed_seconds": later["flower-sim"],
        "local_later_seed_seconds": later["local"],
        "later_seed_cost_over_local": later["flower-sim"] - later["local"],
        "seeds": many,
        "flower_sim_one_seed_seconds": sim[1],
        "flower_sim_many_seeds_seconds": sim[many],
        "local_one_seed_seconds": local[1],
        "local_many_seeds_seconds": local[many],
        "flower_sim_many_over_one": sim[many] / sim[1],
        "flower_sim_seconds_per_further_seed": sim_extra,
        "local_seconds_per_further_seed": local_extra,
        "further_seed_cost_over_local": sim_extra - local_extra,
        "quick": quick,
    }


def format_flowersim(result: dict[str, Any]) -> Table:
    """Title and rows (one per runtime, then the targets) of ``fedbandit bench flowersim``."""
    many = result["seeds"]
    rows: list[tuple[str, ...]] = [
        (
            "runtime",
            "1 seed (s)",
            f"{many} seeds (s)",
            f"{many} / 1",
            "per further seed, from wall (s)",
            "a later seed, own (s)",
        ),
        (
            "flower-sim",
            f"{result['flower_sim_one_seed_seconds']:.2f}",
            f"{result['flower_sim_many_seeds_seconds']:.2f}",
            f"{result['flower_sim_many_over_one']:.2f}",
            f"{result['flower_sim_seconds_per_further_seed']:.2f}",
            f"{result['flower_sim_later_seed_seconds']:.3f}",
        ),
        (
            "local (1 worker)",
            f"{result['local_one_seed_seconds']:.2f}",
            f"{result['local_many_seeds_seconds']:.2f}",
            "",
            f"{result['local_seconds_per_further_seed']:.2f}",
            f"{result['local_later_seed_seconds']:.3f}",
        ),
        (
            "targets",
            "",
            "",
            "<= 2",
            f"{result['further_seed_cost_over_local']:.2f} more",
            f"<= 1 s more: {result['later_seed_cost_over_local']:.3f}",
        ),
    ]
    title = (
        "flowersim: `fedbandit run fedpe_tiny` (fedpe), whole commands side by side"
        f"{' [quick]' if result['quick'] else ''}"
    )
    return title, rows
