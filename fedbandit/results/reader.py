"""Reading a results folder back (``Results``, ``load_results``) and drawing its plots from the
files alone (``plot_run``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from fedbandit.config import ExperimentConfig, validate_experiment
from fedbandit.errors import ConfigError, DataError
from fedbandit.plotting import (
    AUTHORS_COLUMN,
    COMM_UNITS,
    plot_communication_frame,
    plot_regret_curves,
    plot_reward_curves,
    save_figure,
)
from fedbandit.results.files import (
    completed_seeds,
    read_json,
    seed_stem,
)
from fedbandit.results.replay import (
    MISSES_LABEL,
    is_replay,
    random_reward_per_event,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes


@dataclass(frozen=True)
class Results:
    """The results of one experiment, in memory.

    - ``curves``: one row per (algorithm, seed, t): ``regret`` is the per-client cumulative
      regret R(t)/M, stored at the steps of ``fedbandit.analysis.curve_grid(T)`` (every 2^k,
      T/2, T, and about 1,500 steps spaced evenly on a log and on a linear scale); a replay of
      logged events adds ``reward``, the cumulative reward of all clients (its regret counts
      misses).
    - ``communication``: one row per (algorithm, seed, round, direction): ``kind``, ``t``
      (pulls per client when the round happened), ``messages``, ``scalars``, ``bytes`` (whole
      run, all clients), and ``authors_comm_cost`` when an algorithm's authors count their own
      communication (their ``totalCommCost``, cumulative, in their units; NaN in the rows of
      the other algorithms).
    - ``summary``: one row per algorithm, the columns of ``summary.json``.
    Only seeds that finished (status complete) are included; ``manifest["status"]`` says whether
    every run asked for is done (a run limited to some algorithms is complete when those are;
    ``manifest["not_requested"]`` lists the experiment's runs it did not ask for).
    """

    config: ExperimentConfig
    manifest: dict[str, Any]
    curves: pd.DataFrame
    communication: pd.DataFrame
    summary: pd.DataFrame
    #: The results folder, or None for a run made in memory (``fedbandit.run(out=None)``).
    run_dir: Path | None = None

    @property
    def complete(self) -> bool:
        """Every (algorithm, seed) the run asked for finished."""
        return self.manifest.get("status") == "complete"

    def final_regret(self) -> pd.DataFrame:
        """R(T)/M per (algorithm, seed)."""
        last = self.curves.sort_values("t").groupby(["algorithm", "seed"], sort=False).tail(1)
        return last[["algorithm", "seed", "regret"]].sort_values(["algorithm", "seed"])

    @property
    def replay(self) -> bool:
        """Whether the run replays logged events (reward: the logged-choice indicator)."""
        return is_replay(self.config)

    def plot_regret(self, ax: Axes | None = None, log_x: bool = False) -> Axes:
        """R(t)/M against t per algorithm: mean over seeds and a 95% Student-t band (for a
        replay: the misses per client)."""
        ylabel, xlabel = self._regret_labels()
        return plot_regret_curves(
            self.curves, ax, log_x, title=self._title(), ylabel=ylabel, xlabel=xlabel
        )

    def final_reward(self) -> pd.DataFrame:
        """A replay's cumulative reward at T per (algorithm, seed), with the expected reward of
        uniform random choice (``random``) and the ratio."""
        self._require_replay()
        last = self.curves.sort_values("t").groupby(["algorithm", "seed"], sort=False).tail(1)
        frame = last[["algorithm", "seed", "t", "reward"]].sort_values(["algorithm", "seed"])
        frame = frame.assign(random=frame["t"] * self.random_reward_per_event())
        return frame.assign(ratio=frame["reward"] / frame["random"]).drop(columns="t")

    def random_reward_per_event(self) -> float:
        """1/K: the expected reward of uniform random choice per replayed event."""
        self._require_replay()
        return random_reward_per_event(self.manifest.get("instance", {}))

    def plot_reward(self, ax: Axes | None = None, ratio: bool = False) -> Axes:
        """A replay's cumulative reward against t (or, with ``ratio``, its ratio to uniform
        random choice's expected reward), mean over seeds with a band (see
        ``plot_reward_curves``)."""
        self._require_replay()
        return plot_reward_curves(
            self.curves, self.random_reward_per_event(), ax=ax, ratio=ratio, title=self._title()
        )

    def _require_replay(self) -> None:
        if not self.replay or "reward" not in self.curves:
            raise ConfigError(
                f"{self.config.name}: not a replay of logged events, so no reward curve "
                "(its rewards are noisy; its regret is the pseudo-regret)"
            )

    def _regret_labels(self) -> tuple[str | None, str | None]:
        """The regret plot's (y, x) labels: a replay's regret counts misses, per event."""
        if not self.replay:
            return None, None
        return MISSES_LABEL, "t (events replayed)"

    def plot_communication(self, ax: Axes | None = None, units: str = "fedbandit") -> Axes:
        """Cumulative uplink (solid) and downlink (dashed) scalars per client against t; with
        ``units="authors"``, the authors' cumulative count of the whole run in their units
        (``plot_authors_communication``; a ConfigError when no algorithm of the run has one)."""
        check_comm_units(self, units)
        return plot_communication_frame(
            self.communication,
            int(self.manifest["instance"]["num_clients"]),
            ax=ax,
            algorithms=self.config.algorithms,
            units=units,
        )

    def _title(self) -> str:
        """Experiment, sizes, horizon, noise and seeds (and whether the run is incomplete)."""
        facts = self.manifest.get("instance", {})
        counts = self.curves.groupby("algorithm")["seed"].nunique()
        low, high = (int(counts.min()), int(counts.max())) if len(counts) else (0, 0)
        if high == 0:
            shown = "no finished seed"
        elif low != high:
            shown = f"{low}-{high} seeds"
        else:
            shown = f"{low} seed" if low == 1 else f"{low} seeds"
        sizes = ", ".join(
            f"{label}={facts[key]:g}"
            if isinstance(facts.get(key), float)
            else f"{label}={facts[key]}"
            for label, key in (("M", "num_clients"), ("K", "num_arms"), ("d", "dim"))
            if key in facts
        )
        sigma = facts.get("noise_sigma")
        noise = f", sigma={sigma:g}" if isinstance(sigma, (int, float)) else ""
        if self.replay:  # 0/1 rewards from the log: sigma is only what learners assume
            noise = ", logged events"
        status = "" if self.complete else " [incomplete]"
        return f"{self.config.name}{status}\n{sizes}, T={self.config.horizon}{noise}, {shown}"


def load_results(run_dir: str | Path) -> Results:
    """Read a results folder (made by ``fedbandit run`` or ``fedbandit.run(out=...)``)."""
    run_dir = Path(run_dir)
    manifest_path = run_dir / "manifest.json"
    if not manifest_path.is_file():
        raise ConfigError(f"{run_dir} is not a results folder (no manifest.json)")
    manifest = read_json(manifest_path)
    config = validate_experiment(manifest["config"], source=str(manifest_path))
    curves, communication = [], []
    for algorithm in manifest["algorithms"]:
        for seed in completed_seeds(run_dir, algorithm, manifest["seeds"]):
            stem = seed_stem(run_dir, algorithm, seed)
            curve = _read_table(stem.with_suffix(".regret.csv"), ["t", "regret"])
            curves.append(curve.assign(algorithm=algorithm, seed=seed))
            comm = _read_table(
                stem.with_suffix(".comm.csv"),
                ["round", "direction", "t", "scalars"],
                cumulative=(AUTHORS_COLUMN,),
            )
            communication.append(comm.assign(algorithm=algorithm, seed=seed))
    curve_columns = ["algorithm", "seed", "t", "regret"]
    comm_columns = ["algorithm", "seed", "round", "kind", "direction", "t", "messages"]
    comm_columns += ["scalars", "bytes"]
    summary_path = run_dir / "summary.json"
    summary_data = read_json(summary_path) if summary_path.is_file() else {}
    rows = [
        {"algorithm": name, **entry}
        for name, entry in summary_data.items()
        if isinstance(entry, dict) and "final_regret_mean" in entry
    ]
    return Results(
        config=config,
        manifest=manifest,
        curves=_frame(curves, curve_columns),
        communication=_numeric(_frame(communication, comm_columns), AUTHORS_COLUMN),
        summary=pd.DataFrame(rows),
        run_dir=run_dir,
    )


def check_comm_units(results: Results, units: str) -> None:
    """A ConfigError unless ``units`` is one of ``COMM_UNITS`` and, for ``"authors"``, some
    algorithm of ``results`` counts its communication in its authors' units."""
    if units not in COMM_UNITS:
        raise ConfigError(
            f"communication units must be one of {', '.join(COMM_UNITS)}, got {units!r}"
        )
    if units == "authors" and AUTHORS_COLUMN not in results.communication:
        where = results.run_dir if results.run_dir is not None else results.config.name
        raise ConfigError(
            f"{where}: no algorithm of this run ({', '.join(results.config.algorithms)}) counts "
            f"communication in its authors' units (the {AUTHORS_COLUMN} column of "
            "seed_K.comm.csv, written by the servers of dislinucb, async_linucb, fedglb_ucb and "
            "ons_glm); plot it in fedbandit's units"
        )


def _read_table(path: Path, columns: list[str], cumulative: tuple[str, ...] = ()) -> pd.DataFrame:
    """A result CSV with ``columns`` of finite numbers (``direction`` aside) and, of the
    ``cumulative`` columns, those it has (files written before a column existed lack it) of
    numbers that never fall; a DataError naming the file otherwise (a hand-edited or truncated
    file)."""
    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError) as err:  # pandas' parser errors are ValueErrors
        raise DataError(f"{path}: not a readable result table ({err})") from None
    if missing := [c for c in columns if c not in frame.columns]:
        raise DataError(f"{path}: columns {missing} are missing (a hand-edited file?)")
    numeric = [c for c in columns if c != "direction"]
    values = frame[numeric].apply(pd.to_numeric, errors="coerce")
    if (values.isna() & frame[numeric].notna()).to_numpy().any():  # text where numbers belong
        raise DataError(f"{path}: non-numeric values in {numeric} (a hand-edited file?)")
    if "t" in frame and len(frame) and not frame["t"].is_monotonic_increasing:
        raise DataError(f"{path}: the t column is not increasing (a hand-edited file?)")
    for column in (c for c in cumulative if c in frame.columns):
        counts = pd.to_numeric(frame[column], errors="coerce")
        if counts.isna().any():
            raise DataError(
                f"{path}: missing or non-numeric values in {column} (a hand-edited file?)"
            )
        if not counts.is_monotonic_increasing:
            raise DataError(f"{path}: the {column} column falls (a hand-edited file?)")
    return frame


def _numeric(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """``frame`` with ``column``, where it has it, as numbers (NaN in the rows of files without
    it; an empty file leaves it as text)."""
    if column in frame:
        frame[column] = pd.to_numeric(frame[column])
    return frame


def _frame(parts: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    if not parts:
        return pd.DataFrame(columns=columns)
    frame = pd.concat(parts, ignore_index=True)
    return frame[columns + [c for c in frame.columns if c not in columns]]


def plot_regret(
    run_dir: Path, ax: Axes | None = None, log_x: bool = False, over_log_t: bool = False
) -> Axes:
    """The regret plot of a results folder (see ``plot_regret_curves``)."""
    results = load_results(run_dir)
    ylabel, xlabel = results._regret_labels()
    return plot_regret_curves(
        results.curves,
        ax=ax,
        log_x=log_x,
        over_log_t=over_log_t,
        title=results._title(),
        ylabel=ylabel,
        xlabel=xlabel,
    )


def plot_run(run_dir: Path, log_x: bool | None = None, comm_units: str = "fedbandit") -> list[Path]:
    """Write plots/regret.png and plots/communication.png (and plots/regret_over_log_t.png when
    the experiment's ``[plot]`` asks, plots/reward.png for a replay of logged events: the
    cumulative reward and its ratio to uniform random choice) from the folder's files alone.
    With ``comm_units="authors"`` the communication plot is plots/communication_authors.png
    instead: the authors' cumulative count in their units (``plot_authors_communication``; a
    ConfigError when no algorithm of the run has one)."""
    from matplotlib.figure import Figure  # matplotlib loads in a fifth of a second: when drawing

    run_dir = Path(run_dir)
    results = load_results(run_dir)
    check_comm_units(results, comm_units)
    if log_x is None:
        log_x = results.config.plot.log_x
    out = run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    num_clients = int(results.manifest["instance"]["num_clients"])
    paths = []
    ylabel, xlabel = results._regret_labels()
    figure = Figure(figsize=(7, 4.5))
    plot_regret_curves(
        results.curves,
        figure.gca(),
        log_x=log_x,
        title=results._title(),
        ylabel=ylabel,
        xlabel=xlabel,
    )
    paths.append(save_figure(figure, out / "regret.png"))
    if comm_units == "authors":
        figure = Figure(figsize=(8, 4.5))
        plot_communication_frame(
            results.communication,
            num_clients,
            figure.gca(),
            algorithms=results.config.algorithms,
            units="authors",
        )
        figure.gca().set_title(results._title(), fontsize="medium")
        paths.append(save_figure(figure, out / "communication_authors.png"))
    else:
        figure = Figure(figsize=(11, 4.2))
        for ax, direction in zip(figure.subplots(1, 2), ("uplink", "downlink"), strict=True):
            plot_communication_frame(
                results.communication, num_clients, ax, (direction,), results.config.algorithms
            )
        paths.append(save_figure(figure, out / "communication.png"))
    if results.config.plot.regret_over_log_t:
        figure = Figure(figsize=(7, 4.5))
        plot_regret_curves(
            results.curves,
            figure.gca(),
            log_x=True,
            over_log_t=True,
            title=results._title(),
            ylabel=ylabel,
            xlabel=xlabel,
        )
        paths.append(save_figure(figure, out / "regret_over_log_t.png"))
    if results.replay and "reward" in results.curves:
        figure = Figure(figsize=(12, 4.5))
        per_event = results.random_reward_per_event()
        for ax, ratio in zip(figure.subplots(1, 2), (False, True), strict=True):
            plot_reward_curves(
                results.curves, per_event, ax, ratio=ratio, title=results._title(), legend=ratio
            )
        paths.append(save_figure(figure, out / "reward.png"))
    return paths
