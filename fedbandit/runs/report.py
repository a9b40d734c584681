"""What a finished run shows a person: the plots (drawn from the files, a failure recorded, not
raised) and the terminal's summary table with its notes (replay reward, privacy spent)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from fedbandit.results import plot_run
from fedbandit.results.files import (
    atomic_write_json,
)


def plot_after_run(run_dir: Path, manifest: dict[str, Any]) -> None:
    """The run's plots; the results are complete without them, so a plot that cannot be drawn
    is recorded in the manifest (``plots_error``) and reported, not raised."""
    try:
        plot_run(run_dir)
    except Exception as err:  # the files are whole; say what failed and how to redo it
        manifest["plots_error"] = f"{type(err).__name__}: {err}"
        atomic_write_json(run_dir / "manifest.json", manifest)
        print(
            f"fedbandit: warning: the plots were not made ({manifest['plots_error']}); the "
            f"results are complete; retry with `fedbandit plot {run_dir}`",
            file=sys.stderr,
        )
    else:
        if manifest.pop("plots_error", None) is not None:
            atomic_write_json(run_dir / "manifest.json", manifest)


def _subset(summary: dict[str, Any]) -> str:
    """How the status line names a run limited with ``--algorithms``: what it asked for."""
    not_requested = summary.get("not_requested") or []
    if not not_requested:
        return ""
    asked = ", ".join(summary.get("requested_algorithms", []))
    others = sorted({run.split("/")[0] for run in not_requested})
    return f" for the algorithms asked for ({asked}; not run: {', '.join(others)})"


def summary_table(summary: dict[str, Any]) -> str:
    """A plain-text table of the summary for the terminal."""
    header = (
        f"{'algorithm':<16}{'R(T)/M':>10}{'95% interval':>22}{'s/seed':>9}"
        f"{'rounds':>8}{'stats':>7}{'up/client':>12}{'down/client':>13}{'epsilon':>9}"
    )
    lines = [
        f"{summary['experiment']}: T = {summary['horizon']}, "
        f"{len(summary['seeds'])} seed{'s' * (len(summary['seeds']) != 1)}, "
        f"status {summary['status']}{_subset(summary)}",
        header,
    ]
    private: list[str] = []
    replay: list[str] = []
    authors: list[str] = []
    for name, entry in summary.items():
        if not isinstance(entry, dict) or "final_regret_mean" not in entry:
            continue
        if entry.get("final_reward_mean") is not None:
            replay.append(
                f"{name}: reward {entry['final_reward_mean']:.1f}, "
                f"{entry['reward_ratio_mean']:.2f}x random"
            )
        interval = entry["final_regret_ci95"]
        shown = "n/a (1 seed)" if interval is None else f"[{interval[0]:.2f}, {interval[1]:.2f}]"
        clients = entry.get("uplink_scalars_per_client", float("nan"))
        down = entry.get("downlink_scalars_per_client", float("nan"))
        stats = entry.get("statistics_rounds", "-")  # absent from seeds recorded before
        lines.append(
            f"{name:<16}{entry['final_regret_mean']:>10.2f}{shown:>22}"
            f"{entry['seconds_per_seed']:>9.2f}{entry['rounds']:>8}{stats:>7}"
            f"{clients:>12.4g}{down:>13.4g}"
            + (f"{entry['epsilon']:>9.3g}" if "epsilon" in entry else f"{'-':>9}")
        )
        if "authors_comm_cost" in entry:
            authors.append(f"{name} {entry['authors_comm_cost']:,.0f}")
        if "epsilon" in entry:
            private.append(f"{name} ({_privacy_note(entry)})")
    lines.append(
        "R(T)/M: cumulative regret per client at T (mean over seeds); interval: "
        "95% Student-t over seeds; up/down: scalars sent per client over the run"
    )
    lines.append(
        "s/seed: wall seconds per seed; in-process runs leave out the one-time compilation of "
        "kernels (compile_seconds in each seed's JSON)"
    )
    lines.append(
        "rounds: exchanges that carried anything; stats: those that carried statistics (the "
        "others carried only bookkeeping flags: sync triggers, collect requests, joined flags)"
    )
    if replay:
        lines.append(
            "replay of logged events: R(T)/M counts the misses per client (events whose pick was "
            "not the logged choice); reward: logged choices matched, all clients, and its ratio to "
            "uniform choice's expected reward: " + "; ".join(replay)
        )
    if authors:
        lines.append(
            "authors' units: totalCommCost of the authors' code, by its rule "
            "(authors_comm_cost_rule in summary.json): "
            + "; ".join(authors)
            + "; over time: fedbandit plot --comm-units authors on the results folder"
        )
    if private:
        lines.append(
            "epsilon: privacy spent over the run, by dp_accounting's PLD accountant: "
            + "; ".join(private)
        )
    return "\n".join(lines)


def _privacy_note(entry: dict[str, Any]) -> str:
    """What a private algorithm's epsilon in the table holds against: delta, the privacy model,
    what the server saw (for ``shuffle`` without a secure sum: each silo's node, so the column
    shows epsilon_local and the sum model's value is named beside it), the neighbours."""
    privacy = entry["privacy"]
    saw = f"; server saw {privacy['server_saw']}" if "server_saw" in privacy else ""
    if privacy["model"] == "shuffle" and privacy["epsilon"] != privacy.get("epsilon_secure_sum"):
        saw += (
            f": epsilon_local shown, {privacy['epsilon_secure_sum']:.3g} only with "
            "--secure-aggregation"
        )
    spent = entry.get("epsilon_per_seed", [])
    differs = (
        f"; the largest over the seeds, which spent {min(spent):.4g}-{max(spent):.4g}"
        if spent and min(spent) != max(spent)
        else ""
    )
    return (
        f"delta {entry['delta']:.3g}, {privacy['model']}{saw}; neighbours: "
        f"{privacy['neighbouring']}{differs}"
    )
