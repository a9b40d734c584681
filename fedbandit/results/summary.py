"""A results folder's status and ``summary.json``, from its seed files alone: which seeds finished,
aborted or are missing; final regret with its interval, communication, checkpoints, a replay's
reward and a private algorithm's privacy spent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedbandit.analysis import INTERVAL, checkpoint_times, interval_or_none
from fedbandit.config import ExperimentConfig
from fedbandit.results.files import (
    completed_seeds,
    read_json,
    seed_stem,
)
from fedbandit.results.replay import (
    REPLAY_UNITS,
    is_replay_manifest,
    random_reward_per_event,
)

#: Totals that split ``rounds`` and the scalars into statistics and bookkeeping flags
#: (``CommunicationLedger.totals``); summarised when every seed has them.
BOOKKEEPING_TOTALS = (
    "statistics_rounds",
    "bookkeeping_rounds",
    "uplink_bookkeeping_scalars",
    "downlink_bookkeeping_scalars",
)


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


def summarize(run_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """summary.json: stable keys, one entry per algorithm name plus experiment, horizon, seeds."""
    horizon = int(manifest["horizon"])
    summary: dict[str, Any] = {
        "experiment": manifest["experiment"],
        "horizon": horizon,
        "seeds": manifest["seeds"],
        "status": manifest["status"],
        "requested_algorithms": manifest.get("requested", {}).get(
            "algorithms", manifest.get("algorithms", [])
        ),
        "not_requested": manifest.get("not_requested", []),
        "interval": INTERVAL + " (lower end clipped at 0; none for a single seed)",
        "units": {
            "final_regret": "R(T)/M: cumulative regret per client",
            "uplink_scalars, downlink_scalars, *_bytes, *_messages": "whole run, all clients",
            "rounds": "exchanges that carried anything; statistics_rounds: those that carried "
            "statistics, bookkeeping_rounds: those that carried only bookkeeping flags",
            "*_bookkeeping_scalars": "the flags among the scalars (included in *_scalars)",
            "*_per_client": "whole run, per client",
            "authors_comm_cost": "the authors' totalCommCost of the run, in their units, by the "
            "rule in authors_comm_cost_rule (only for algorithms whose authors' code counts it)",
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
        entry.update(authors_entry(infos))
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


def authors_entry(infos: list[dict[str, Any]]) -> dict[str, Any]:
    """``authors_comm_cost``: the authors' ``totalCommCost`` of the run, by the algorithm's rule in
    the authors' units (the seeds' ``report``, ``ServerLogic.report``), mean over seeds (an int
    when every seed has the same), with the rule; nothing unless every seed reports it."""
    if not infos or not all("authors_comm_cost" in i.get("report", {}) for i in infos):
        return {}
    values = [i["report"]["authors_comm_cost"] for i in infos]
    return {
        "authors_comm_cost": int(values[0]) if len(set(values)) == 1 else float(np.mean(values)),
        "authors_comm_cost_rule": infos[0]["report"]["authors_comm_cost_rule"],
    }


def privacy_entry(infos: list[dict[str, Any]]) -> dict[str, Any]:
    """A private algorithm's summary keys from its seeds' reports: ``epsilon`` and ``delta`` spent
    per user over the run, the largest over the seeds (a seed that lost clients may spend more:
    fewer contributors to a sum), with that seed's accounting (``privacy``), every seed's
    ``epsilon_per_seed`` in the order of ``infos``, and the values clipped per seed (mean);
    nothing for a non-private algorithm."""
    reports = [i["report"] for i in infos if "privacy" in i.get("report", {})]
    if not reports:
        return {}
    privacy = largest_privacy(reports)
    clipped = {
        key: float(np.mean([r.get("clipped", {}).get(key, 0) for r in reports]))
        for key in ("features", "rewards")
    }
    return {
        "epsilon": privacy["epsilon"],
        "delta": privacy["delta"],
        "privacy": privacy,
        "epsilon_per_seed": [float(r["privacy"]["epsilon"]) for r in reports],
        "clipped_per_seed": clipped,
    }


def largest_privacy(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The privacy accounting of the seed that spent the largest epsilon (the first such)."""
    return dict(max(reports, key=lambda report: float(report["privacy"]["epsilon"]))["privacy"])


def record_failures(run_dir: Path, config: ExperimentConfig, manifest: dict[str, Any]) -> None:
    """The manifest's status: "incomplete" while any (algorithm, seed) asked for is not done
    (aborted by lost clients, or not run yet), else "complete"; the aborted seeds with the
    reason, the runs asked for still missing, the runs of the experiment's other algorithms
    that a run limited with ``--algorithms`` (the manifest's ``requested``) did not ask for and
    the folder lacks (``not_requested``: a later run without ``--algorithms`` adds them), and
    the clients dropped from each seed."""
    aborted, dropped = {}, {}
    missing: list[str] = []
    not_requested: list[str] = []
    requested = set(manifest.get("requested", {}).get("algorithms", config.algorithms))
    privacy: dict[str, Any] = {}  # each private algorithm's accountant and its inputs
    for algorithm in config.algorithms:
        for seed in manifest.get("seeds", range(config.seeds)):
            path = seed_stem(run_dir, algorithm, seed).with_suffix(".json")
            if not path.is_file():
                label = f"{algorithm}/seed_{seed}"
                (missing if algorithm in requested else not_requested).append(label)
                continue
            info = read_json(path)
            if "privacy" in info.get("report", {}):
                privacy.setdefault(algorithm, []).append(info["report"])
            if info.get("status", "complete") != "complete":
                aborted[f"{algorithm}/seed_{seed}"] = info.get("failure")
            if info.get("dropped"):
                dropped[f"{algorithm}/seed_{seed}"] = info["dropped"]
    manifest["status"] = "incomplete" if aborted or missing else "complete"
    if privacy:  # the largest epsilon over the seeds run, aborted ones too (they released)
        manifest["privacy"] = {name: largest_privacy(found) for name, found in privacy.items()}
    manifest["aborted_seeds"] = aborted
    manifest["missing_runs"] = missing
    manifest["not_requested"] = not_requested
    manifest["dropped_clients"] = dropped
