"""Plots rebuilt from a results folder alone (``fedbandit plot RUN_DIR``).

Each function takes an optional matplotlib ``ax`` and returns it.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from fedbandit.analysis import mean_ci95
from fedbandit.results import (
    completed_seeds,
    load_curves,
    read_json,
    seed_stem,
)


def plot_regret(
    run_dir: Path, ax: Axes | None = None, log_x: bool = False, over_log_t: bool = False
) -> Axes:
    """Per-client cumulative regret R(T)/M against T: mean and 95% band over seeds. With
    ``over_log_t``, R(T) / log T (for T >= 2): flat for logarithmic regret, falling for bounded."""
    manifest = read_json(run_dir / "manifest.json")
    ax = ax or plt.figure(figsize=(7, 4.5)).gca()
    for algorithm in manifest["algorithms"]:
        seeds = completed_seeds(run_dir, algorithm, manifest["seeds"])
        if not seeds:
            continue
        t, curves = load_curves(run_dir, algorithm, seeds)
        if over_log_t:
            keep = t >= 2
            t, curves = t[keep], curves[:, keep] / np.log(t[keep])
        mean, low, high = mean_ci95(curves)
        (line,) = ax.plot(t, mean, label=f"{algorithm} ({len(seeds)} seeds)")
        ax.fill_between(t, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel("T (pulls per client)")
    ax.set_ylabel("R(T)/M / log T" if over_log_t else "cumulative regret per client, R(T)/M")
    status = "" if manifest.get("status") == "complete" else " [incomplete]"
    ax.set_title(f"{manifest['experiment']}{status}")
    ax.grid(ls="--", alpha=0.5)
    ax.legend()
    return ax


def communication_curve(
    run_dir: Path, algorithm: str, seed: int, direction: str
) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative scalars per client against t for one seed and direction."""
    frame = pd.read_csv(seed_stem(run_dir, algorithm, seed).with_suffix(".comm.csv"))
    frame = frame[frame.direction == direction]
    manifest = read_json(run_dir / "manifest.json")
    per_client = frame["scalars"].to_numpy() / manifest["instance"]["num_clients"]
    return frame["t"].to_numpy(), np.cumsum(per_client)


def plot_communication(run_dir: Path, axes: np.ndarray | None = None) -> np.ndarray:
    """Cumulative uplink and downlink scalars per client against T (first completed seed)."""
    manifest = read_json(run_dir / "manifest.json")
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, direction in zip(axes, ("uplink", "downlink"), strict=True):
        silent = []
        for algorithm in manifest["algorithms"]:
            seeds = completed_seeds(run_dir, algorithm, manifest["seeds"])
            if not seeds:
                continue
            t, total = communication_curve(run_dir, algorithm, seeds[0], direction)
            if total.size == 0 or total[-1] == 0:
                silent.append(algorithm)
                continue
            ax.step(t, total, where="post", marker=".", label=algorithm)
        if ax.lines:
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.legend(fontsize="small")
        if silent:
            ax.text(
                0.02,
                0.02,
                "no communication: " + ", ".join(silent),
                transform=ax.transAxes,
                fontsize="small",
                va="bottom",
            )
        ax.set_xlabel("T (pulls per client)")
        ax.set_ylabel(f"cumulative {direction} scalars per client")
        ax.grid(ls="--", alpha=0.5)
    return axes


def plot_run(run_dir: Path, log_x: bool | None = None) -> list[Path]:
    """Write plots/regret.png and plots/communication.png from the folder's files."""
    run_dir = Path(run_dir)
    manifest = read_json(run_dir / "manifest.json")
    if log_x is None:
        log_x = bool(manifest.get("config", {}).get("plot", {}).get("log_x", False))
    out = run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    ax = plot_regret(run_dir, log_x=log_x)
    paths.append(_save(ax.figure, out / "regret.png"))
    axes = plot_communication(run_dir)
    paths.append(_save(axes[0].figure, out / "communication.png"))
    if manifest.get("config", {}).get("plot", {}).get("regret_over_log_t", False):
        ax = plot_regret(run_dir, log_x=True, over_log_t=True)
        paths.append(_save(ax.figure, out / "regret_over_log_t.png"))
    return paths


def _save(figure, path: Path) -> Path:
    tmp = path.with_name(f".{path.stem}.tmp.png")
    figure.tight_layout()
    figure.savefig(tmp, dpi=120)
    plt.close(figure)
    tmp.replace(path)
    return path
