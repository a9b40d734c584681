"""The scorecard of a suite folder: ``scorecard.json`` for tools and ``scorecard.html`` for people,
made from the folder's ``suite.json``, ``results.csv`` and ``curves.csv`` alone.

The HTML file is self-contained: styles inline, every figure a base64 PNG inside an ``<img>``
with a ``data:`` address, no script and no network reference, so it opens offline and can be
mailed. PNGs are written without a timestamp, so the same results give the same bytes.
"""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from fedbandit.errors import ConfigError
from fedbandit.results.files import atomic_write_json, atomic_write_text, read_json
from fedbandit.suites.aggregates import (
    BOOTSTRAP_REPS,
    PROFILE_TAUS,
    aggregate,
    performance_profile,
    probability_of_improvement,
)
from fedbandit.suites.score import (
    normalised_score,
    reference_ends,
    score_matrices,
    with_scores,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def read_suite_folder(folder: Path) -> tuple[dict[str, Any], pd.DataFrame, pd.DataFrame]:
    """suite.json, results.csv (with scores) and curves.csv of a suite folder."""
    folder = Path(folder)
    plan_path = folder / "suite.json"
    if not plan_path.is_file():
        raise ConfigError(f"{folder} is not a suite folder (no suite.json)")
    for name in ("results.csv", "curves.csv"):
        if not (folder / name).is_file():
            raise ConfigError(f"{folder}: {name} is missing (rerun the suite with --out {folder})")
    plan = read_json(plan_path)
    results = with_scores(pd.read_csv(folder / "results.csv"))
    curves = pd.read_csv(folder / "curves.csv")
    return plan, results, curves


def build_scorecard(
    plan: dict[str, Any], results: pd.DataFrame, reps: int = BOOTSTRAP_REPS
) -> dict[str, Any]:
    """scorecard.json's content: per environment its ends and each entry's score, regret and
    communication per client; per algorithm rliable's aggregates over the environments it was
    scored on; the probability of improvement of each algorithm over each other on the
    environments both were scored on; notes on environments without a score."""
    ends = reference_ends(results)
    environments: dict[str, Any] = {}
    notes = []
    for name, facts in plan["environments"].items():
        rows = results[results["environment"] == name]
        end = ends.get(name)
        entries = {}
        for label, group in rows.groupby("algorithm", sort=True):
            scores = group["score"].to_numpy(dtype=float)
            entries[str(label)] = {
                "role": str(group["role"].iloc[0]),
                "seeds": len(group),
                # the score of the mean regret (= the mean of the seeds' scores): exactly 0
                # and 1 for entries equal to the ends
                "score": (
                    None
                    if end is None or not end.defined
                    else float(
                        normalised_score(float(group["final_regret"].mean()), end.alone, end.pooled)
                    )
                ),
                "score_seed_range": (
                    None if np.isnan(scores).all() else [float(scores.min()), float(scores.max())]
                ),
                "final_regret_mean": float(group["final_regret"].mean()),
                "uplink_scalars_per_client": float(group["uplink_scalars_per_client"].mean()),
                "downlink_scalars_per_client": float(group["downlink_scalars_per_client"].mean()),
                "rounds": float(group["rounds"].mean()),
            }
        defined = end is not None and end.defined
        if end is not None and not end.defined:
            notes.append(
                f"{name}: the pooled reference (R = {end.pooled:.4g}) does not beat learning "
                f"alone (R = {end.alone:.4g}): no gain to capture, no score, left out of the "
                "aggregates"
            )
        environments[name] = {
            "tags": facts.get("tags", []),
            "horizon": facts.get("horizon"),
            "num_clients": facts.get("num_clients"),
            "alone": facts["runs"]["alone"]["algorithm"],
            "pooled": facts["runs"]["pooled"]["algorithm"],
            "alone_regret": None if end is None else end.alone,
            "pooled_regret": None if end is None else end.pooled,
            "scored": defined,
            "entries": entries,
            "excluded": facts.get("excluded", {}),
        }
    matrices = score_matrices(results)
    aggregates = {name: aggregate(envs, m, reps).as_dict() for name, (envs, m) in matrices.items()}
    improvement: dict[str, dict[str, float]] = {}
    for x, (envs_x, m_x) in matrices.items():
        for y, (envs_y, m_y) in matrices.items():
            shared = [e for e in envs_x if e in envs_y]
            if x == y or not shared:
                continue
            columns_x = [envs_x.index(e) for e in shared]
            columns_y = [envs_y.index(e) for e in shared]
            improvement.setdefault(x, {})[y] = probability_of_improvement(
                m_x[:, columns_x], m_y[:, columns_y]
            )
    return {
        "suite": plan["suite"]["name"],
        "description": plan["suite"].get("description", ""),
        "fedbandit": plan.get("fedbandit"),
        "status": plan.get("status"),
        "seeds": plan.get("seeds"),
        "bootstrap_reps": reps,
        "score": "(R_alone - R) / (R_alone - R_pooled), R the regret per client at T",
        "aggregates": aggregates,
        "probability_of_improvement": improvement,
        "environments": environments,
        "notes": notes,
    }


def write_scorecard(folder: Path, reps: int = BOOTSTRAP_REPS) -> tuple[Path, Path]:
    """scorecard.json and scorecard.html into the suite folder, from its files alone; every
    interval from ``reps`` bootstrap replications."""
    if reps < 100:
        raise ConfigError(f"--bootstrap-reps must be >= 100, got {reps}")
    folder = Path(folder)
    plan, results, curves = read_suite_folder(folder)
    card = build_scorecard(plan, results, reps)
    json_path, html_path = folder / "scorecard.json", folder / "scorecard.html"
    atomic_write_json(json_path, card)
    atomic_write_text(html_path, render_html(card, results, curves, reps))
    return json_path, html_path


def score_table(card: dict[str, Any]) -> str:
    """The aggregate table as text, best IQM first (for the terminal)."""
    rows = sorted(card["aggregates"].items(), key=lambda item: -item[1]["iqm"])
    total = sum(1 for env in card["environments"].values() if env["scored"])
    width = max([len(name) for name, _ in rows] + [9])
    lines = [f"{'algorithm':<{width}}  {'IQM':>7}  {'95% CI':<17}  {'mean':>7}  environments"]
    for name, agg in rows:
        low, high = agg["iqm_ci95"]
        lines.append(
            f"{name:<{width}}  {agg['iqm']:7.3f}  [{low:6.3f}, {high:6.3f}]  "
            f"{agg['mean']:7.3f}  {len(agg['environments'])} of {total}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------- drawing


def _png(figure: Figure) -> str:
    """The figure as a ``data:`` address of a PNG without a timestamp."""
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _figure(size: tuple[float, float]) -> Figure:
    from matplotlib.figure import Figure  # deferred: matplotlib

    return Figure(figsize=size)


def _interval_figure(aggregates: dict[str, Any]) -> str:
    names = sorted(aggregates, key=lambda n: aggregates[n]["iqm"])
    figure = _figure((7.5, 0.35 * len(names) + 1.2))
    ax = figure.gca()
    for row, name in enumerate(names):
        low, high = aggregates[name]["iqm_ci95"]
        ax.plot([low, high], [row, row], color="tab:blue", linewidth=5, alpha=0.5)
        ax.plot([aggregates[name]["iqm"]], [row], "k|", markersize=12)
    ax.axvline(0, color="grey", linewidth=0.8, linestyle=":")
    ax.axvline(1, color="grey", linewidth=0.8, linestyle=":")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("IQM of the normalised score (0: alone, 1: pooled), 95% CI")
    return _png(figure)


def _profile_figure(results: pd.DataFrame, reps: int) -> str:
    from rliable.plot_utils import plot_performance_profiles  # type: ignore[import-untyped]

    matrices = score_matrices(results)
    profiles, intervals = {}, {}
    for name, (_, matrix) in matrices.items():
        profiles[name], intervals[name] = performance_profile(matrix, reps=reps)
    figure = _figure((8, 4.5))
    ax = figure.gca()
    palette = _palette(len(profiles))
    plot_performance_profiles(
        profiles,
        PROFILE_TAUS,
        performance_profile_cis=intervals,
        ax=ax,
        colors={name: palette[index] for index, name in enumerate(profiles)},
        xlabel=r"normalised score $\tau$",
        ylabel=r"fraction of runs with score $> \tau$",
    )
    lines = ax.get_lines()[: len(profiles)]  # one line per algorithm, in the dict's order
    ax.legend(lines, list(profiles), fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return _png(figure)


def _palette(count: int) -> list[Any]:
    """``count`` distinct colours (matplotlib's tab20 beyond ten)."""
    from matplotlib import colormaps  # deferred: matplotlib

    name = "tab10" if count <= 10 else "tab20"
    colours = colormaps[name].colors  # type: ignore[attr-defined]
    return [colours[index % len(colours)] for index in range(count)]


def _curves_figure(curves: pd.DataFrame, environment: str) -> str:
    figure = _figure((7, 4))
    ax = figure.gca()
    rows = curves[curves["environment"] == environment]
    groups = list(rows.groupby("algorithm", sort=True))
    palette = _palette(len(groups))
    for index, (label, group) in enumerate(groups):
        style = "--" if label in ("alone", "pooled") else "-"
        ax.plot(
            group["t"], group["regret"], style, label=str(label), linewidth=1.2,
            color=palette[index],
        )  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("t")
    ax.set_ylabel("R(t)/M, mean over seeds")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return _png(figure)


def _tradeoff_figure(results: pd.DataFrame, environment: str) -> str:
    figure = _figure((7, 4))
    ax = figure.gca()
    rows = results[results["environment"] == environment]
    means = rows.groupby("algorithm", sort=True)[
        ["final_regret", "uplink_scalars_per_client", "downlink_scalars_per_client"]
    ].mean()
    palette = _palette(len(means))
    for index, (label, row) in enumerate(means.iterrows()):
        sent = row["uplink_scalars_per_client"] + row["downlink_scalars_per_client"]
        ax.scatter(
            [max(sent, 1.0)], [row["final_regret"]], label=str(label), s=25, color=palette[index]
        )
    ax.set_xscale("log")
    ax.set_xlabel("scalars per client, up + down (0 drawn at 1)")
    ax.set_ylabel("R(T)/M, mean over seeds")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return _png(figure)


# ---------------------------------------------------------------------------- HTML

_STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; max-width: 75em; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.note { color: #8a4b00; }
.muted { color: #888; }
img { max-width: 100%; }
"""


def _number(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def render_html(
    card: dict[str, Any], results: pd.DataFrame, curves: pd.DataFrame, reps: int = BOOTSTRAP_REPS
) -> str:
    """The self-contained HTML scorecard."""
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>fedbandit scorecard: {e(card['suite'])}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>Scorecard of suite {e(card['suite'])}</h1>",
        f"<p>{e(card.get('description') or '')}</p>",
        f"<p class='muted'>fedbandit {e(str(card.get('fedbandit')))}; {card.get('seeds')} seeds "
        f"per environment; status: {e(str(card.get('status')))}.</p>",
        "<p>Score = (R<sub>alone</sub> − R) / (R<sub>alone</sub> − R<sub>pooled</sub>), R the "
        "cumulative regret per client at T: 0 is no better than the clients learning alone, 1 "
        "as good as one learner that sees every client's data. Aggregates by rliable: "
        "interquartile mean (IQM) over every seed and environment with a 95% stratified "
        "bootstrap interval; an algorithm is aggregated over the environments it applies to.</p>",
    ]
    for note in card["notes"]:
        parts.append(f"<p class='note'>{e(note)}</p>")
    parts.append(
        "<h2>Aggregate scores</h2><table><tr><th>algorithm</th><th>IQM</th>"
        "<th>95% CI</th><th>mean</th><th>95% CI</th><th>median</th>"
        "<th>environments</th></tr>"
    )
    scored_total = sum(1 for env in card["environments"].values() if env["scored"])
    for name, agg in sorted(card["aggregates"].items(), key=lambda item: -item[1]["iqm"]):
        parts.append(
            f"<tr><td>{e(name)}</td><td>{_number(agg['iqm'])}</td>"
            f"<td>[{_number(agg['iqm_ci95'][0])}, {_number(agg['iqm_ci95'][1])}]</td>"
            f"<td>{_number(agg['mean'])}</td>"
            f"<td>[{_number(agg['mean_ci95'][0])}, {_number(agg['mean_ci95'][1])}]</td>"
            f"<td>{_number(agg['median'])}</td>"
            f"<td>{len(agg['environments'])} of {scored_total}</td></tr>"
        )
    parts.append("</table>")
    if card["aggregates"]:
        parts.append(f'<img alt="IQM intervals" src="{_interval_figure(card["aggregates"])}">')
        parts.append(
            "<h2>Performance profiles</h2><p>The fraction of (seed, environment) "
            "scores above each threshold, with 95% intervals.</p>"
        )
        parts.append(f'<img alt="performance profiles" src="{_profile_figure(results, reps)}">')
    parts.append("<h2>Scores per environment</h2>")
    names = sorted({label for env in card["environments"].values() for label in env["entries"]})
    header = "".join(f"<th>{e(env)}</th>" for env in card["environments"])
    parts.append(f"<table><tr><th>algorithm</th>{header}</tr>")
    for label in names:
        cells = []
        for env in card["environments"].values():
            entry = env["entries"].get(label)
            cells.append(
                "<td class='muted'>n/a</td>"
                if entry is None
                else f"<td>{_number(entry['score'], 2)}</td>"
            )
        parts.append(f"<tr><td>{e(label)}</td>{''.join(cells)}</tr>")
    parts.append("</table>")
    for env_name, env in card["environments"].items():
        parts.append(f"<h2>Environment {e(env_name)}</h2>")
        parts.append(
            f"<p>T = {env['horizon']}, M = {env['num_clients']} clients; tags: "
            f"{e(', '.join(env['tags']) or 'none')}. Alone: {e(env['alone'])} (R = "
            f"{_number(env['alone_regret'], 2)}); pooled: {e(env['pooled'])} (R = "
            f"{_number(env['pooled_regret'], 2)}).</p>"
        )
        parts.append(
            "<table><tr><th>entry</th><th>score</th><th>seed range</th>"
            "<th>R(T)/M</th><th>uplink scalars / client</th>"
            "<th>downlink scalars / client</th><th>seeds</th></tr>"
        )
        for label, entry in env["entries"].items():
            spread = entry["score_seed_range"]
            shown = "–" if spread is None else f"[{_number(spread[0], 2)}, {_number(spread[1], 2)}]"
            parts.append(
                f"<tr><td>{e(label)}</td><td>{_number(entry['score'], 2)}</td><td>{shown}</td>"
                f"<td>{_number(entry['final_regret_mean'], 2)}</td>"
                f"<td>{_number(entry['uplink_scalars_per_client'], 0)}</td>"
                f"<td>{_number(entry['downlink_scalars_per_client'], 0)}</td>"
                f"<td>{entry['seeds']}</td></tr>"
            )
        parts.append("</table>")
        parts.append(
            f'<img alt="regret curves, {e(env_name)}" src="{_curves_figure(curves, env_name)}">'
        )
        parts.append(
            f'<img alt="regret against communication, {e(env_name)}" '
            f'src="{_tradeoff_figure(results, env_name)}">'
        )
        if env["excluded"]:
            parts.append("<p>Not applicable here:</p><ul>")
            for algorithm, reason in env["excluded"].items():
                parts.append(f"<li>{e(algorithm)}: {e(reason)}</li>")
            parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
