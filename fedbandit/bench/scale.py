"""``fedbandit bench scale``: how Fed-PE's time and peak memory grow with the number of clients
M (up to 10^6) and the horizon T, and Local UCB's with M, every point in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import numpy as np

from fedbandit.bench.common import Table

_SCALE_CHILD = """
import json, resource, sys, time
from fedbandit.threads import process_defaults
process_defaults()
from fedbandit.instances import PaperSyntheticParams, paper_synthetic
from fedbandit.simulation import simulate
M, T, K, d = (int(v) for v in sys.argv[1:5])
algorithm = sys.argv[5]
instance = paper_synthetic(PaperSyntheticParams(num_clients=M, num_arms=K, dim=d))
if algorithm == "local_ucb":
    simulate(paper_synthetic(PaperSyntheticParams(num_clients=2, num_arms=K, dim=d)),
             algorithm, 64, [0, 0])  # load the compiled kernel outside the timing
usage = resource.getrusage(resource.RUSAGE_SELF)
cpu_before = usage.ru_utime + usage.ru_stime
start = time.perf_counter()
result = simulate(instance, algorithm, T, [0, 0])
seconds = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_SELF)
cpu = usage.ru_utime + usage.ru_stime - cpu_before
peak = usage.ru_maxrss / 1024
print(json.dumps({"algorithm": algorithm, "M": M, "T": T, "seconds": seconds,
                  "cpu_seconds": cpu, "peak_rss_mb": peak,
                  "final_regret": float(result.regret.mean_cumulative_regret()[-1])}))
"""


def _scale_point(
    num_clients: int,
    horizon: int,
    num_arms: int = 10,
    dim: int = 5,
    algorithm: str = "fedpe",
) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _SCALE_CHILD,
            str(num_clients),
            str(horizon),
            str(num_arms),
            str(dim),
            algorithm,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=3600,
    )
    if out.returncode != 0:
        raise RuntimeError(
            f"scale benchmark {algorithm} M={num_clients} T={horizon} failed:\n{out.stderr}"
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _tried_point(num_clients: int, horizon: int, algorithm: str = "fedpe") -> dict[str, Any]:
    """A large scale point; if its process fails (out of memory on a smaller machine), the
    failure is reported in place of the figures and the other points still are."""
    try:
        return _scale_point(num_clients, horizon, algorithm=algorithm)
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        tail = str(error).strip().splitlines()[-1:] or [""]
        return {"algorithm": algorithm, "M": num_clients, "T": horizon, "error": tail[0]}


def _per_client(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each point with its microseconds and kilobytes per client, and the growth from the point
    before (ratio of seconds and of peak RSS over the ratio of M: 1 is linear in M)."""
    out: list[dict[str, Any]] = []
    for k, point in enumerate(points):
        entry = dict(point)
        if "error" in point:
            out.append(entry)
            continue
        entry["us_per_client"] = 1e6 * point["seconds"] / point["M"]
        entry["kb_per_client"] = 1024 * point["peak_rss_mb"] / point["M"]
        if k and "error" not in points[k - 1]:
            before = points[k - 1]
            factor = point["M"] / before["M"]
            entry["time_growth_over_M_growth"] = point["seconds"] / before["seconds"] / factor
            entry["rss_growth_over_M_growth"] = (
                point["peak_rss_mb"] / before["peak_rss_mb"] / factor
            )
        out.append(entry)
    return out


def _exponents(points: list[dict[str, Any]]) -> dict[str, float] | None:
    """Time and peak RSS as powers of M between the smallest and largest successful points:
    seconds ~ M^a, RSS ~ M^b (1 is linear in M; RSS includes the interpreter's fixed part)."""
    good = [p for p in points if "error" not in p]
    if len(good) < 2 or good[-1]["M"] == good[0]["M"]:
        return None
    span = np.log(good[-1]["M"] / good[0]["M"])
    return {
        "from_M": good[0]["M"],
        "to_M": good[-1]["M"],
        "time": float(np.log(good[-1]["seconds"] / good[0]["seconds"]) / span),
        "rss": float(np.log(good[-1]["peak_rss_mb"] / good[0]["peak_rss_mb"]) / span),
    }


def bench_scale(quick: bool = False) -> dict[str, Any]:
    """Fed-PE at M=10,000, K=10, d=5, T=2^20 in-process, how time grows with M (up to M =
    10^6) and T; Local UCB at M = 10^4 and 10^5, T = 2^17. Every point in a fresh process."""
    M, T = (1000, 2**16) if quick else (10000, 2**20)
    big = (10 * M,) if quick else (10 * M, 100 * M)
    ucb_T, ucb_M = (2**13, (1000, 10000)) if quick else (2**17, (10000, 100000))
    main = _scale_point(M, T)
    growth_m = [_scale_point(m, T) for m in (M // 4, M // 2)] + [main]
    growth_t = [_scale_point(M, t) for t in (T // 16, T // 4)] + [main]
    large = [_tried_point(m, T) for m in big]
    local_ucb = [_tried_point(m, ucb_T, algorithm="local_ucb") for m in ucb_M]
    return {
        "M": M,
        "K": 10,
        "d": 5,
        "T": T,
        "seconds": main["seconds"],
        "peak_rss_mb": main["peak_rss_mb"],
        "growth_with_M": _per_client(growth_m + large),
        "fedpe_exponents_in_M": _exponents(growth_m + large),
        "local_ucb_exponents_in_M": _exponents(local_ucb),
        "growth_with_T": growth_t,
        "million": large[-1],  # the M = 10^6 point (10^4 with --quick)
        "local_ucb_T": ucb_T,
        "local_ucb": _per_client(local_ucb),
    }


def format_scale(result: dict[str, Any]) -> Table:
    """Title and rows of ``fedbandit bench scale``: one row per point, failed points included,
    and the growth fitted as a power of M."""
    rows: list[tuple[str, ...]] = [
        (
            "algorithm",
            "M",
            "T",
            "seconds",
            "CPU s",
            "peak RSS MB",
            "us/client",
            "KB/client",
            "growth",
        )
    ]
    points = [("fedpe", p) for p in result["growth_with_M"] + result["growth_with_T"][:-1]]
    points += [("local_ucb", p) for p in result["local_ucb"]]
    for algorithm, point in points:
        if "error" in point:
            rows.append((algorithm, str(point["M"]), str(point["T"]), "failed", "", "", "", "", ""))
            continue
        growth = ""
        if "time_growth_over_M_growth" in point:
            growth = (
                f"time {point['time_growth_over_M_growth']:.2f}, "
                f"RSS {point['rss_growth_over_M_growth']:.2f} x M's"
            )
        rows.append(
            (
                algorithm,
                str(point["M"]),
                str(point["T"]),
                f"{point['seconds']:.2f}",
                f"{point['cpu_seconds']:.1f}" if "cpu_seconds" in point else "",
                f"{point['peak_rss_mb']:.0f}",
                f"{1e6 * point['seconds'] / point['M']:.1f}",
                f"{1024 * point['peak_rss_mb'] / point['M']:.1f}",
                growth,
            )
        )
    title = f"scale: K={result['K']}, d={result['d']}, one seed each, in-process"
    for algorithm, key in (
        ("fedpe", "fedpe_exponents_in_M"),
        ("local_ucb", "local_ucb_exponents_in_M"),
    ):
        fit = result.get(key)
        if fit:
            rows.append(
                (
                    algorithm,
                    f"{fit['from_M']}..{fit['to_M']}",
                    "",
                    f"~ M^{fit['time']:.2f}",
                    "",
                    f"~ M^{fit['rss']:.2f}",
                    "",
                    "",
                    "growth as a power of M",
                )
            )
    return title, rows
