"""Plots as functions of data: frames in, matplotlib axes out.

Importing this module changes no matplotlib setting (notebooks keep their backend). Functions
given no ``ax`` draw on a new pyplot figure; ``plot_run`` (``fedbandit plot RUN_DIR``, and the
end of ``fedbandit run``) draws on ``matplotlib.figure.Figure`` objects that it saves and
discards, so it needs no backend and opens no window.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from fedbandit.analysis import MIN_SEEDS_FOR_BAND, mean_ci95

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: The communication record's column of the authors' cumulative count, in their units
#: (``ServerLogic.authors_comm_cost``), in the files of the algorithms whose authors count one.
AUTHORS_COLUMN = "authors_comm_cost"
#: Units of the communication plot: fedbandit's scalars per client, or the authors' count.
COMM_UNITS = ("fedbandit", "authors")


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
    ylabel: str | None = None,
    xlabel: str | None = None,
) -> Axes:
    """Per-client cumulative regret R(t)/M against t from a long frame (algorithm, seed, t,
    regret): the mean over seeds with a 95% Student-t band of the mean (lower end clipped at 0)
    from ``MIN_SEEDS_FOR_BAND`` seeds on; with fewer seeds every seed's curve is drawn thin
    instead, and a single seed has no interval. With ``over_log_t``, R(t)/M / log t (t >= 2):
    flat for logarithmic regret, falling for bounded. A log t axis is used only where asked.
    ``ylabel`` and ``xlabel`` replace the axis labels (a replay's regret counts misses)."""
    ax = _axes(ax)
    for algorithm, frame in curves.groupby("algorithm", sort=False):
        # Steps every seed reached (a truncated file shortens them all, never mixes them).
        table = frame.pivot_table(index="seed", columns="t", values="regret").dropna(axis=1)
        t, values = table.columns.to_numpy(), table.to_numpy()
        if over_log_t:
            keep = t >= 2
            t, values = t[keep], values[:, keep] / np.log(t[keep])
        if t.size == 0:
            continue
        _draw_seeds(ax, str(algorithm), t, values)
    if log_x and _positive_span(ax, "x"):
        ax.set_xscale("log")
    else:
        compact_ticks(ax)
    log_note = ", log scale" if ax.get_xscale() == "log" else ""
    ax.set_xlabel((xlabel or "t (pulls per client)") + log_note)
    if ylabel is None:
        ylabel = "R(t)/M / log t" if over_log_t else "cumulative regret per client, R(t)/M"
    elif over_log_t:
        ylabel = f"{ylabel} / log t"
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title, fontsize="medium")
    ax.grid(ls="--", alpha=0.5)
    if ax.lines:
        _legend_outside(ax)
        ax.text(
            0.99, 0.01, _band_note(curves), transform=ax.transAxes, fontsize="x-small",
            ha="right", va="bottom", alpha=0.7,
        )  # fmt: skip
    else:
        _nothing(ax, "no finished seed to plot" if curves.empty else "no t >= 2 to plot")
    return ax


def _draw_seeds(ax: Axes, algorithm: str, t: np.ndarray, values: np.ndarray) -> None:
    """One algorithm's curves (seeds, steps): the mean, and a 95% Student-t band of the mean from
    ``MIN_SEEDS_FOR_BAND`` seeds on (lower end clipped at 0 for non-negative values), else every
    seed's curve thin."""
    seeds = len(values)
    mean = values.mean(axis=0)
    (line,) = ax.plot(t, mean, label=f"{algorithm} ({seeds} seed{'s' * (seeds != 1)})")
    if seeds >= MIN_SEEDS_FOR_BAND:
        _, low, high = mean_ci95(values)
        low = np.maximum(low, 0.0) if np.all(values >= 0) else low
        ax.fill_between(t, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    elif seeds > 1:
        for row in values:
            ax.plot(t, row, color=line.get_color(), linewidth=0.5, alpha=0.5)


def plot_reward_curves(
    curves: pd.DataFrame,
    random_per_event: float,
    ax: Axes | None = None,
    ratio: bool = False,
    title: str | None = None,
    legend: bool = True,
) -> Axes:
    """A replay of logged events: the cumulative reward (all clients) against t from a long
    frame (algorithm, seed, t, reward), mean over seeds with a band as ``plot_regret_curves``,
    and the expected reward of uniform random choice, t x ``random_per_event`` (exact), dashed.
    With ``ratio``, reward(t) / random(t): the papers' normalised reward (Li & Wang divide by
    one random run's reward + 1; this divides by its expectation), 1 for random choice, drawn
    from the t at which random's expected reward reaches 1 (before it the ratio is noise)."""
    ax = _axes(ax)
    drawn = False
    for algorithm, frame in curves.groupby("algorithm", sort=False):
        if "reward" not in frame:
            continue
        table = frame.pivot_table(index="seed", columns="t", values="reward").dropna(axis=1)
        t, values = table.columns.to_numpy(), table.to_numpy()
        if ratio:
            keep = t * random_per_event >= 1
            t, values = t[keep], values[:, keep] / (t[keep] * random_per_event)
        if t.size == 0:
            continue
        _draw_seeds(ax, str(algorithm), t, values)
        drawn = True
    if drawn:
        t_all = np.sort(curves["t"].unique())
        if ratio:
            t_all = t_all[t_all * random_per_event >= 1]
        baseline = np.ones(len(t_all)) if ratio else t_all * random_per_event
        ax.plot(t_all, baseline, color="black", linestyle="--", linewidth=1,
                label="uniform random (expected)")  # fmt: skip
        compact_ticks(ax)
        if legend:
            _legend_outside(ax)
        ax.text(
            0.99, 0.01, _band_note(curves), transform=ax.transAxes, fontsize="x-small",
            ha="right", va="bottom", alpha=0.7,
        )  # fmt: skip
    else:
        _nothing(ax, "no finished seed with a reward to plot")
    ax.set_xlabel("t (events replayed)")
    ax.set_ylabel(
        "cumulative reward / uniform random's expected"
        if ratio
        else "cumulative reward, all clients (logged choice picked)"
    )
    if title is not None:
        ax.set_title(title, fontsize="medium")
    ax.grid(ls="--", alpha=0.5)
    return ax


def compact_label(value: float, _position: object = None) -> str:
    """A tick label that stays short: 800 -> "800", 2500 -> "2.5k", 120000 -> "120k",
    2500000 -> "2.5M" (four significant digits at most)."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.4g}{suffix}"
    return f"{value:.4g}"


def compact_ticks(ax: Axes, axis: str = "x") -> None:
    """At most six ticks on a linear ``axis``, labelled ``compact_label``: labels of horizons
    such as 2^17 no longer run into each other ("100000120000")."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
    target.set_major_formatter(FuncFormatter(compact_label))


def _band_note(curves: pd.DataFrame) -> str:
    seeds = curves.groupby("algorithm")["seed"].nunique()
    if seeds.min() >= MIN_SEEDS_FOR_BAND:
        return "band: 95% Student-t interval of the mean over seeds"
    return (
        f"thin lines: single seeds (a band needs >= {MIN_SEEDS_FOR_BAND} seeds)"
        if seeds.max() > 1
        else "one seed: no interval"
    )


def _positive_span(ax: Axes, axis: str) -> bool:
    """Whether the drawn data on ``axis`` are positive and span more than one value (a log axis
    of anything else fails or shows nothing)."""
    values = [
        np.asarray(line.get_xdata() if axis == "x" else line.get_ydata(), dtype=float)
        for line in ax.lines
    ]
    if not values:
        return False
    data = np.concatenate(values)
    data = data[np.isfinite(data)]
    return data.size > 1 and bool(np.all(data > 0)) and float(data.max()) > float(data.min())


def _legend_outside(ax: Axes) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)


def _nothing(ax: Axes, why: str) -> None:
    ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center")


def plot_communication_frame(
    communication: pd.DataFrame,
    num_clients: int,
    ax: Axes | None = None,
    directions: tuple[str, ...] = ("uplink", "downlink"),
    algorithms: list[str] | None = None,
    units: str = "fedbandit",
) -> Axes:
    """Cumulative scalars per client against t from a long frame (algorithm, seed, round,
    direction, t, scalars), for the first seed of each algorithm: uplink solid, downlink dashed.
    Algorithms that exchange nothing (of ``algorithms``, default: those in the frame) are named
    in the corner.

    ``units="authors"``: instead, the authors' cumulative count of the whole run, up and down
    together, in their units (the ``authors_comm_cost`` column; ``plot_authors_communication``);
    ``directions`` is then not used."""
    if units not in COMM_UNITS:
        raise ValueError(f"units must be one of {', '.join(COMM_UNITS)}, got {units!r}")
    if units == "authors":
        return plot_authors_communication(communication, ax, algorithms)
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
    _log_axes_and_legend(ax)
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


def plot_authors_communication(
    communication: pd.DataFrame, ax: Axes | None = None, algorithms: list[str] | None = None
) -> Axes:
    """The authors' cumulative communication count against t, for the first seed of each
    algorithm: the ``authors_comm_cost`` column of its record (its authors' ``totalCommCost``, by
    the rule in the seed's ``report``), the whole run's, not per client, as the authors' scripts
    plot it. Of ``algorithms`` (default: those in the frame), those whose rows carry no such count
    are named under the legend ("no authors' count"), as are those that sent nothing or whose count
    stays 0 ("no communication"). A curve starts at its first count (before it the count is 0);
    log axes where the values allow, as in fedbandit's units. The units differ between authors
    (Async-LinUCB's code counts messages, the others scalars)."""
    ax = _axes(ax)
    listed = algorithms if algorithms is not None else communication.algorithm.unique().tolist()
    drawn: set[str] = set()
    uncounted: set[str] = set()
    for algorithm, frame in communication.groupby("algorithm", sort=False):
        frame = frame[frame.seed == frame.seed.min()]
        if AUTHORS_COLUMN not in frame or frame[AUTHORS_COLUMN].isna().all():
            uncounted.add(str(algorithm))
            continue
        total = frame[AUTHORS_COLUMN].to_numpy(dtype=float)
        counted = total > 0  # from the first count on: a log axis shows the rest
        if not counted.any():
            continue
        t = frame["t"].to_numpy()[counted]
        ax.step(t, total[counted], where="post", marker=".", label=str(algorithm))
        drawn.add(str(algorithm))
    notes = [
        f"{why}: " + ", ".join(names)
        for why, names in (
            ("no authors' count", [str(a) for a in listed if str(a) in uncounted]),
            ("no communication", [str(a) for a in listed if str(a) not in drawn | uncounted]),
        )
        if names
    ]
    _log_axes_and_legend(ax)
    if notes:  # beside the axes, under the legend: clear of the curves
        ax.text(1.02, 0.0, "\n".join(notes), transform=ax.transAxes, fontsize="small", va="bottom")
    ax.set_xlabel("t (pulls per client)")
    ax.set_ylabel("cumulative communication, authors' units\n(their totalCommCost, all clients)")
    ax.grid(ls="--", alpha=0.5)
    return ax


def save_figure(figure: Figure, path: Path) -> Path:
    """Draw ``figure`` into ``path`` (PNG) through a temporary file and a rename."""
    tmp = path.with_name(f".{path.stem}.tmp.png")
    figure.tight_layout()
    figure.savefig(tmp, dpi=120)
    tmp.replace(path)
    return path


def series_keys(algorithm: str, others: Sequence[str]) -> list[str]:
    """Which of the other varied keys split an algorithm's points into separate lines: every key
    but another algorithm's parameters (``params.NAME.x`` leaves the others' runs unchanged)."""
    return [k for k in others if not (k.startswith("params.") and k.split(".")[1] != algorithm)]


def plot_sweep_parameter(
    summary: pd.DataFrame, key: str, ax: Axes | None = None, others: Sequence[str] = ()
) -> Axes:
    """Final regret per client against one varied key (a sweep's summary frame): the mean per
    algorithm with its 95% Student-t interval as a band (from 2 seeds on), log axes where the
    values span two decades or more. ``others``, the other varied keys, split an algorithm's
    points into one line per combination of their values (``series_keys``; for example one line
    per privacy model); points that differ in keys not listed are averaged. A key with values
    that are not all numbers (``fidelity = "paper"`` or ``"authors_code"``) is drawn as
    categories, in the order of the points."""
    ax = _axes(ax)
    numeric = pd.to_numeric(summary[key], errors="coerce")
    categories: list[str] = []
    if numeric.isna().any():
        categories = list(dict.fromkeys(summary[key].astype(str)))
        numeric = summary[key].astype(str).map({c: i for i, c in enumerate(categories)})
    intervals = {
        column: pd.to_numeric(summary[column], errors="coerce")
        for column in ("final_regret_ci95_low", "final_regret_ci95_high")
    }  # None (one seed) becomes NaN: no band
    frames = summary.assign(_x=numeric, **intervals)
    for algorithm, by_algorithm in frames.groupby("algorithm", sort=False):
        split = [k for k in series_keys(str(algorithm), others) if k != key and k in summary]
        series = by_algorithm.groupby(split, sort=False) if split else [((), by_algorithm)]
        for values, frame in series:
            values = values if isinstance(values, tuple) else (values,)
            label = str(algorithm)
            if split:
                label += (
                    " ("
                    + ", ".join(
                        f"{k.rsplit('.', 1)[-1]}={v}" for k, v in zip(split, values, strict=True)
                    )
                    + ")"
                )
            frame = frame.groupby("_x", sort=True).mean(numeric_only=True).reset_index()
            x = frame["_x"].to_numpy(dtype=float)
            (line,) = ax.plot(x, frame["final_regret_mean"], marker="o", label=label)
            low, high = frame["final_regret_ci95_low"], frame["final_regret_ci95_high"]
            if low.notna().all() and high.notna().all():
                ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    for axis in ("y",) if categories else ("x", "y"):
        if _positive_span(ax, axis) and _decades(ax, axis) >= 2:
            (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    if categories:
        ax.set_xticks(range(len(categories)), categories)
        ax.set_xlim(-0.5, len(categories) - 0.5)
    ax.set_xlabel(key + (" (log scale)" if ax.get_xscale() == "log" else ""))
    ax.set_ylabel("final regret per client, R(T)/M")
    ax.set_title(f"final regret against {key}; band: 95% Student-t over seeds", fontsize="medium")
    ax.grid(ls="--", alpha=0.5)
    if ax.lines:
        _legend_outside(ax)
    else:
        _nothing(ax, f"no numeric values of {key} to plot")
    return ax


def plot_sweep_tradeoff(
    summary: pd.DataFrame, ax: Axes | None = None, bytes_axis: bool = False
) -> Axes:
    """Regret against communication: uplink scalars (or bytes) of the whole run on x, final
    regret per client on y, one marker per point and a line per algorithm (the trade-off figure
    of the DisLinUCB / Async-LinUCB / FedLinUCB papers). Algorithms that never upload are left
    out (named in the corner)."""
    ax = _axes(ax)
    column = "uplink_bytes_mean" if bytes_axis else "uplink_scalars_mean"
    silent = []
    for algorithm, frame in summary.groupby("algorithm", sort=False):
        frame = frame.sort_values(column)
        if (frame[column] <= 0).all():
            silent.append(str(algorithm))
            continue
        ax.plot(frame[column], frame["final_regret_mean"], marker="o", label=str(algorithm))
    if _positive_span(ax, "x"):
        ax.set_xscale("log")
    ax.set_xlabel(f"uplink {'bytes' if bytes_axis else 'scalars'}, whole run, all clients (log)")
    ax.set_ylabel("final regret per client, R(T)/M")
    ax.set_title("regret against communication (one marker per sweep point)", fontsize="medium")
    ax.grid(ls="--", alpha=0.5)
    if silent:
        ax.text(0.02, 0.02, "no uplink: " + ", ".join(silent), transform=ax.transAxes,
                fontsize="small", va="bottom")  # fmt: skip
    if ax.lines:
        _legend_outside(ax)
    return ax


def _log_axes_and_legend(ax: Axes) -> None:
    """Logarithmic axes where the drawn values span positive decades, and the legend outside."""
    if ax.lines:
        if _positive_span(ax, "x"):
            ax.set_xscale("log")
        if _positive_span(ax, "y"):
            ax.set_yscale("log")
        _legend_outside(ax)


def _decades(ax: Axes, axis: str) -> float:
    values = np.concatenate(
        [
            np.asarray(line.get_xdata() if axis == "x" else line.get_ydata(), float)
            for line in ax.lines
        ]
    )
    values = values[np.isfinite(values) & (values > 0)]
    return float(np.log10(values.max() / values.min())) if values.size else 0.0
