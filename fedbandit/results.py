"""The results folder: atomic writes, one seed's files, the summary, reading a folder back
(``Results``) and drawing its plots from the files alone.

Layout of ``results/NAME/<timestamp>/``::

    config.toml                  the resolved experiment (after --set overrides)
    manifest.json                versions, git commit, seeds, instance facts, status
    runs/ALGO/seed_K.regret.csv  t, regret: mean per-client cumulative regret R(t)/M (a replay
                                 of logged events adds reward: the cumulative reward, all clients)
    runs/ALGO/seed_K.comm.csv    round, kind, direction, t, messages, scalars, bytes
    runs/ALGO/seed_K.clients.csv client_id, regret, pulls (at the horizon)
    runs/ALGO/seed_K.json        totals and timing; written last: marks the seed done
    summary.json                 per algorithm: final regret, CI, communication, checkpoints,
                                 R(T)/R(T/2) averaged over seeds
    plots/regret.png, plots/communication.png (and plots/reward.png for a replay)

Every file is written to a temporary name and renamed, so a file is whole or absent.

A replay of logged events (an instance kind whose parameters say ``REWARD_IS_HIT``, such as
``replay``: reward 1 if the pick is the logged choice, else 0) has no true parameter; its
``regret`` is the number of *misses* (events whose pick was not the logged choice), so the
cumulative reward is t - misses(t), written as the ``reward`` column of the curve file. The
summary adds the final reward, the expected reward of uniform random choice (t / K, exact) and
their ratio; ``plots/reward.png`` draws both.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from fedbandit._version import __version__
from fedbandit.analysis import INTERVAL, checkpoint_times, curve_grid, interval_or_none
from fedbandit.config import ExperimentConfig, validate_experiment
from fedbandit.errors import ConfigError, DataError
from fedbandit.plotting import (
    plot_communication_frame,
    plot_regret_curves,
    plot_reward_curves,
    save_figure,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from fedbandit.group_environment import RegretRecord
    from fedbandit.simulation import SeedResult

PACKAGES = ("fedbandit", "numpy", "scipy", "cvxpy", "clarabel", "flwr", "pandas", "matplotlib")

#: Totals that split ``rounds`` and the scalars into statistics and bookkeeping flags
#: (``CommunicationLedger.totals``); summarised when every seed has them.
BOOKKEEPING_TOTALS = (
    "statistics_rounds",
    "bookkeeping_rounds",
    "uplink_bookkeeping_scalars",
    "downlink_bookkeeping_scalars",
)


#: The y label of a replay's regret curve (its regret counts misses).
MISSES_LABEL = "misses per client, R(t)/M (pick != logged choice)"
#: What the summary says a replay's columns are.
REPLAY_UNITS = {
    "final_regret": "R(T)/M: misses per client (events whose pick was not the logged choice; "
    "regret against always picking the logged choice, reward 1 per event)",
    "final_reward": "cumulative reward at T, all clients: events whose pick was the logged "
    "choice (T - misses)",
    "random_reward": "expected cumulative reward of uniform random choice at T: sum over the T "
    "events of 1/|pool| = T / K (exact, not a random run)",
    "reward_ratio": "final_reward / random_reward (the papers' normalised reward)",
    "hit_rate": "final_reward / T",
}


def is_replay(config: ExperimentConfig | Any) -> bool:
    """Whether a run replays logged events: its instance's reward is the logged-choice indicator
    and its regret counts misses (the kind's parameters say ``REWARD_IS_HIT``)."""
    instance = getattr(config, "instance", config)
    return bool(getattr(instance, "REWARD_IS_HIT", False))


def hit_curve(record: RegretRecord, horizon: int) -> np.ndarray | None:
    """A replay's cumulative reward at steps 1..T over all clients: t - misses(t), exact (every
    step's regret is 0 or 1 miss); None when the record does not cover every step (clients lost
    before reporting: their steps' outcomes are unknown)."""
    if len(record.client_ids) == 0 or int(np.sum(record.client_pulls)) != horizon:
        return None
    per_step = np.rint(np.cumsum(record.increment_diff)[:-1] / record.scale)
    return np.arange(1, horizon + 1) - np.cumsum(per_step)


def random_reward_per_event(instance_facts: dict[str, Any]) -> float:
    """1/K from a replay instance's summary (the manifest's ``instance``)."""
    value = instance_facts.get("random_reward_per_event")
    if value is None:
        value = 1.0 / float(instance_facts["num_arms"])
    return float(value)


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def json_text(data: Any) -> str:
    """The JSON text fedbandit writes (indented, NumPy values as plain numbers)."""
    return json.dumps(data, indent=2, sort_keys=False, default=_jsonable) + "\n"


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json_text(data))


def atomic_write_csv(path: Path, frame: pd.DataFrame) -> None:
    atomic_write_text(path, frame.to_csv(index=False))


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def seed_stem(run_dir: Path, algorithm: str, seed: int) -> Path:
    return run_dir / "runs" / algorithm / f"seed_{seed}"


def seed_status(run_dir: Path, algorithm: str, seed: int) -> str | None:
    """ "complete", "aborted" (lost clients stopped it; rerun on resume), or None (not run)."""
    path = seed_stem(run_dir, algorithm, seed).with_suffix(".json")
    if not path.is_file():
        return None
    return str(read_json(path).get("status", "complete"))


def seed_done(run_dir: Path, algorithm: str, seed: int) -> bool:
    return seed_status(run_dir, algorithm, seed) == "complete"


@functools.cache
def package_versions() -> dict[str, str]:
    versions = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        if name == "fedbandit":  # the running code's own version, installed or not
            versions[name] = __version__
            continue
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


@functools.cache
def git_commit() -> str | None:
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():  # an installed package: no checkout of its own
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def machine_facts() -> dict[str, Any]:
    return {"platform": platform.platform(), "cpus": os.cpu_count()}


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def load_curves(run_dir: Path, algorithm: str, seeds: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Regret curves of the completed seeds: (t (n,), curves (seeds, n))."""
    frames = [
        pd.read_csv(seed_stem(run_dir, algorithm, s).with_suffix(".regret.csv")) for s in seeds
    ]
    t = frames[0]["t"].to_numpy()
    for frame in frames[1:]:
        if not np.array_equal(frame["t"].to_numpy(), t):
            raise ValueError(f"{run_dir}: seeds of {algorithm!r} are stored on different grids")
    return t, np.stack([f["regret"].to_numpy() for f in frames])


def completed_seeds(run_dir: Path, algorithm: str, seeds: list[int]) -> list[int]:
    return [s for s in seeds if seed_done(run_dir, algorithm, s)]


def summarize(run_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """summary.json: stable keys, one entry per algorithm name plus experiment, horizon, seeds."""
    horizon = int(manifest["horizon"])
    summary: dict[str, Any] = {
        "experiment": manifest["experiment"],
        "horizon": horizon,
        "seeds": manifest["seeds"],
        "status": manifest["status"],
        "interval": INTERVAL + " (lower end clipped at 0; none for a single seed)",
        "units": {
            "final_regret": "R(T)/M: cumulative regret per client",
            "uplink_scalars, downlink_scalars, *_bytes, *_messages": "whole run, all clients",
            "rounds": "exchanges that carried anything; statistics_rounds: those that carried "
            "statistics, bookkeeping_rounds: those that carried only bookkeeping flags",
            "*_bookkeeping_scalars": "the flags among the scalars (included in *_scalars)",
            "*_per_client": "whole run, per client",
            "seconds_per_seed": "wall seconds of a seed; in-process runs leave out the one-time "
            "compilation of kernels (compile_seconds in the seed's JSON)",
        },
    }
    replay = is_replay_manifest(manifest)
    if replay:
        summary["units"].update(REPLAY_UNITS)
    for algorithm in manifest["algorithms"]:
        seeds = completed_seeds(run_dir, algorithm, manifest["seeds"])
        if not seeds:
            continue
        t, curves = load_curves(run_dir, algorithm, seeds)
        infos = [read_json(seed_stem(run_dir, algorithm, s).with_suffix(".json")) for s in seeds]
        final = curves[:, -1]
        interval = interval_or_none(final)
        entry: dict[str, Any] = {
            "final_regret_mean": float(np.mean(final)),
            #: None with a single seed (no interval); see "interval" for how it is made.
            "final_regret_ci95": list(interval) if interval is not None else None,
            "seconds_per_seed": float(np.mean([i["seconds"] for i in infos])),
            "seeds_completed": seeds,
        }
        for key in (
            "rounds",
            "uplink_scalars",
            "downlink_scalars",
            "uplink_bytes",
            "downlink_bytes",
            "uplink_messages",
            "downlink_messages",
        ):
            values = [i["totals"][key] for i in infos]
            entry[key] = int(values[0]) if len(set(values)) == 1 else float(np.mean(values))
        for key in BOOKKEEPING_TOTALS:  # absent from seeds recorded before they were counted
            if all(key in i["totals"] for i in infos):
                values = [i["totals"][key] for i in infos]
                entry[key] = int(values[0]) if len(set(values)) == 1 else float(np.mean(values))
        entry.update(privacy_entry(infos))
        clients = int(manifest["instance"]["num_clients"])
        for key in ("uplink_scalars", "downlink_scalars"):
            entry[f"{key}_per_client"] = float(entry[key]) / clients
        half = int(np.searchsorted(t, horizon // 2))
        if t[half] == horizon // 2 and np.all(curves[:, half] > 0):
            entry["regret_growth_last_doubling"] = float(np.mean(curves[:, -1] / curves[:, half]))
        index = np.searchsorted(t, checkpoint_times(horizon))
        entry["regret_checkpoints"] = {
            str(int(t[i])): float(curves[:, i].mean()) for i in index if i < len(t)
        }
        if replay:
            entry.update(reward_entry(run_dir, algorithm, seeds, manifest, t, index))
        summary[algorithm] = entry
    return summary


def is_replay_manifest(manifest: dict[str, Any]) -> bool:
    """Whether a results folder holds a replay of logged events (its experiment's instance)."""
    try:
        config = validate_experiment(manifest["config"])
    except (ConfigError, KeyError):
        return False
    return is_replay(config)


def reward_entry(
    run_dir: Path,
    algorithm: str,
    seeds: list[int],
    manifest: dict[str, Any],
    t: np.ndarray,
    index: np.ndarray,
) -> dict[str, Any]:
    """A replay's summary keys: final reward (all clients), the expected reward of uniform
    random choice at T (exact), their ratio and the hit rate, each averaged over seeds with its
    interval, and the reward at the checkpoints. None where a seed has no reward (lost clients)."""
    horizon = int(manifest["horizon"])
    frames = [
        pd.read_csv(seed_stem(run_dir, algorithm, s).with_suffix(".regret.csv")) for s in seeds
    ]
    if not all("reward" in f for f in frames):
        return {"final_reward_mean": None, "reward_note": "no reward column in the curve files"}
    rewards = np.stack([f["reward"].to_numpy(dtype=float) for f in frames])
    random = horizon * random_reward_per_event(manifest["instance"])
    final = rewards[:, -1]
    if not np.all(np.isfinite(final)):
        return {
            "final_reward_mean": None,
            "random_reward": random,
            "reward_note": "a seed lost clients before they reported: its reward is unknown",
        }
    ratio = final / random
    interval, ratio_interval = interval_or_none(final), interval_or_none(ratio)
    return {
        "final_reward_mean": float(final.mean()),
        "final_reward_ci95": list(interval) if interval is not None else None,
        "random_reward": random,
        "reward_ratio_mean": float(ratio.mean()),
        "reward_ratio_ci95": list(ratio_interval) if ratio_interval is not None else None,
        "hit_rate_mean": float(final.mean() / horizon),
        "reward_checkpoints": {
            str(int(t[i])): float(rewards[:, i].mean()) for i in index if i < len(t)
        },
    }


def privacy_entry(infos: list[dict[str, Any]]) -> dict[str, Any]:
    """A private algorithm's summary keys from its seeds' reports: ``epsilon`` and ``delta`` spent
    per user over the run (the same for every seed: the schedule is fixed), the accounting, and
    the values clipped per seed (mean); nothing for a non-private algorithm."""
    reports = [i["report"] for i in infos if "privacy" in i.get("report", {})]
    if not reports:
        return {}
    privacy = reports[0]["privacy"]
    clipped = {
        key: float(np.mean([r.get("clipped", {}).get(key, 0) for r in reports]))
        for key in ("features", "rewards")
    }
    return {
        "epsilon": privacy["epsilon"],
        "delta": privacy["delta"],
        "privacy": privacy,
        "clipped_per_seed": clipped,
    }


def seed_files(
    config: ExperimentConfig | dict[str, Any], seed: int, result: SeedResult
) -> dict[str, str]:
    """The files of one finished (algorithm, seed) as texts, by path relative to the run folder,
    in the order they are written: the ``.json`` last (it marks the seed done).

    The regret curve is stored at the steps of ``analysis.curve_grid(T)`` (every 2^k, T/2, T and
    about 1,500 points spaced evenly on a log and on a linear scale), not at every step."""
    if not isinstance(config, ExperimentConfig):
        config = validate_experiment(config)
    algorithm = result.algorithm
    stem = seed_stem(Path("."), algorithm, seed)
    grid = curve_grid(config.horizon)
    curve = result.regret.mean_cumulative_regret()
    if len(curve) == 0:  # every client was lost before reporting
        curve = np.full(config.horizon, np.nan)
    clients = pd.DataFrame(
        {
            "client_id": result.regret.client_ids,
            "regret": result.regret.client_regret,
            "pulls": result.regret.client_pulls,
        }
    )
    info = {
        "algorithm": algorithm,
        "seed": seed,
        "seconds": result.seconds,
        **({} if result.compile_seconds is None else {"compile_seconds": result.compile_seconds}),
        "totals": result.totals,
        "final_regret": float(curve[-1]),
        "status": result.status,
        "failure": result.failure,
        "dropped": {str(client): round_ for client, round_ in result.dropped.items()},
        "clients_reported": len(result.regret.client_ids),
    }
    if result.report:
        info["report"] = dict(result.report)
    regret = pd.DataFrame({"t": grid, "regret": curve[grid - 1]})
    if is_replay(config):
        hits = hit_curve(result.regret, config.horizon)
        if hits is None:
            regret["reward"] = np.nan
            info["final_reward"] = None
        else:
            regret["reward"] = hits[grid - 1]
            info["final_reward"] = float(hits[-1])
    return {
        str(stem.with_suffix(".regret.csv")): regret.to_csv(index=False),
        str(stem.with_suffix(".comm.csv")): result.communication.to_csv(index=False),
        str(stem.with_suffix(".clients.csv")): clients.to_csv(index=False),
        str(stem.with_suffix(".json")): json_text(info),
    }


def write_files(run_dir: Path, files: dict[str, str]) -> None:
    """Write ``seed_files`` output into ``run_dir``, each file atomically, in order."""
    for relative, text in files.items():
        atomic_write_text(Path(run_dir) / relative, text)


def write_seed_result(
    config: ExperimentConfig | dict[str, Any], run_dir: Path, seed: int, result: SeedResult
) -> None:
    """Write the files of one finished (algorithm, seed) (``seed_files``), the ``.json`` last."""
    write_files(run_dir, seed_files(config, seed, result))


def remove_stale_temporaries(run_dir: Path) -> None:
    """Delete temporary files an interrupted writer left behind (final files are never partial:
    they appear only by an atomic rename)."""
    for stale in run_dir.rglob(".*.tmp*"):
        stale.unlink(missing_ok=True)


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
      run, all clients).
    - ``summary``: one row per algorithm, the columns of ``summary.json``.
    Only seeds that finished (status complete) are included; ``manifest["status"]`` says whether
    the run is complete.
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

    def plot_communication(self, ax: Axes | None = None) -> Axes:
        """Cumulative uplink (solid) and downlink (dashed) scalars per client against t."""
        return plot_communication_frame(
            self.communication,
            int(self.manifest["instance"]["num_clients"]),
            ax=ax,
            algorithms=self.config.algorithms,
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
                stem.with_suffix(".comm.csv"), ["round", "direction", "t", "scalars"]
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
        communication=_frame(communication, comm_columns),
        summary=pd.DataFrame(rows),
        run_dir=run_dir,
    )


def _read_table(path: Path, columns: list[str]) -> pd.DataFrame:
    """A result CSV with ``columns`` of finite numbers (``direction`` aside); a DataError naming
    the file otherwise (a hand-edited or truncated file)."""
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


def plot_run(run_dir: Path, log_x: bool | None = None) -> list[Path]:
    """Write plots/regret.png and plots/communication.png (and plots/regret_over_log_t.png when
    the experiment's ``[plot]`` asks, plots/reward.png for a replay of logged events: the
    cumulative reward and its ratio to uniform random choice) from the folder's files alone."""
    from matplotlib.figure import Figure  # matplotlib loads in a fifth of a second: when drawing

    run_dir = Path(run_dir)
    results = load_results(run_dir)
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
