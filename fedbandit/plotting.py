"""Plots as functions of data: frames in, matplotlib axes out.

Importing this module changes no matplotlib setting (notebooks keep their backend). Functions
given no ``ax`` draw on a new pyplot figure; ``plot_run`` (``fedbandit plot RUN_DIR``, and the
end of ``fedbandit run``) draws on ``matplotlib.figure.Figure`` objects that it saves and
discards, so it needs no backend and opens no window.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from fedbandit.analysis import mean_ci95

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _axes(ax: Axes | None, size: tuple[float, float] = (7, 4.5)) -> Axes:
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    return plt.figure(figsize=size).gca()


def plot_regret_curves(
    curves: pd.DataFrame,
    ax: Axes | None = None,
    log_x: bool = False,
    over_log_t: bool = False,
    title: str | None = None,
) -> Axes:
    """Per-client cumulative regret R(t)/M against t from a long frame (algorithm, seed, t,
    regret): the mean over seeds and a 95% Student-t band. With ``over_log_t``, R(t)/M / log t
    (t >= 2): flat for logarithmic regret, falling for bounded."""
    ax = _axes(ax)
    for algorithm, frame in curves.groupby("algorithm", sort=False):
        table = frame.pivot(index="seed", columns="t", values="regret")
        t, values = table.columns.to_numpy(), table.to_numpy()
        if over_log_t:
            keep = t >= 2
            t, values = t[keep], values[:, keep] / np.log(t[keep])
        mean, low, high = mean_ci95(values)
        (line,) = ax.plot(t, mean, label=f"{algorithm} ({len(table)} seeds)")
        ax.fill_between(t, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel("t (pulls per client)")
    ax.set_ylabel("R(t)/M / log t" if over_log_t else "cumulative regret per client, R(t)/M")
    if title is not None:
        ax.set_title(title)
    ax.grid(ls="--", alpha=0.5)
    if ax.lines:
        ax.legend()
    return ax


def plot_communication_frame(
    communication: pd.DataFrame,
    num_clients: int,
    ax: Axes | None = None,
    directions: tuple[str, ...] = ("uplink", "downlink"),
    algorithms: list[str] | None = None,
) -> Axes:
    """Cumulative scalars per client against t from a long frame (algorithm, seed, round,
    direction, t, scalars), for the first seed of each algorithm: uplink solid, downlink dashed.
    Algorithms that exchange nothing (of ``algorithms``, default: those in the frame) are named
    in the corner."""
    ax = _axes(ax)
    drawn_any: set[str] = set()
    styles = {"uplink": "-", "downlink": "--"}
    for algorithm, frame in communication.groupby("algorithm", sort=False):
        frame = frame[frame.seed == frame.seed.min()]
        for direction in directions:
            part = frame[frame.direction == direction]
            total = np.cumsum(part["scalars"].to_numpy() / num_clients)
            if total.size == 0 or total[-1] == 0:
                continue
            label = algorithm if len(directions) == 1 else f"{algorithm} {direction}"
            ax.step(
                part["t"].to_numpy(),
                total,
                where="post",
                marker=".",
                label=label,
                linestyle=styles.get(direction, "-"),
            )
            drawn_any.add(str(algorithm))
    listed = algorithms if algorithms is not None else communication.algorithm.unique().tolist()
    silent = [str(a) for a in listed if str(a) not in drawn_any]
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
    ax.set_xlabel("t (pulls per client)")
    which = directions[0] if len(directions) == 1 else "uplink (solid) / downlink (dashed)"
    ax.set_ylabel(f"cumulative {which} scalars per client")
    ax.grid(ls="--", alpha=0.5)
    return ax


def plot_regret(
    run_dir: Path, ax: Axes | None = None, log_x: bool = False, over_log_t: bool = False
) -> Axes:
    """The regret plot of a results folder (see ``plot_regret_curves``)."""
    from fedbandit.api import load_results

    results = load_results(run_dir)
    return plot_regret_curves(
        results.curves, ax=ax, log_x=log_x, over_log_t=over_log_t, title=results._title()
    )


def plot_run(run_dir: Path, log_x: bool | None = None) -> list[Path]:
    """Write plots/regret.png and plots/communication.png (and plots/regret_over_log_t.png when
    the experiment's ``[plot]`` asks) from the folder's files alone."""
    from matplotlib.figure import Figure

    from fedbandit.api import load_results

    run_dir = Path(run_dir)
    results = load_results(run_dir)
    if log_x is None:
        log_x = results.config.plot.log_x
    out = run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    num_clients = int(results.manifest["instance"]["num_clients"])
    paths = []
    figure = Figure(figsize=(7, 4.5))
    plot_regret_curves(results.curves, figure.gca(), log_x=log_x, title=results._title())
    paths.append(_save(figure, out / "regret.png"))
    figure = Figure(figsize=(11, 4.2))
    for ax, direction in zip(figure.subplots(1, 2), ("uplink", "downlink"), strict=True):
        plot_communication_frame(
            results.communication, num_clients, ax, (direction,), results.config.algorithms
        )
    paths.append(_save(figure, out / "communication.png"))
    if results.config.plot.regret_over_log_t:
        figure = Figure(figsize=(7, 4.5))
        plot_regret_curves(
            results.curves, figure.gca(), log_x=True, over_log_t=True, title=results._title()
        )
        paths.append(_save(figure, out / "regret_over_log_t.png"))
    return paths


def _save(figure: Figure, path: Path) -> Path:
    tmp = path.with_name(f".{path.stem}.tmp.png")
    figure.tight_layout()
    figure.savefig(tmp, dpi=120)
    tmp.replace(path)
    return path
