"""``fedbandit bench nodes``: one Flower deployment on loopback per node count, measured in one run.

For each count N of ``NODE_COUNTS`` the benchmark starts a SuperLink (its SQLite state, as
``fedbandit superlink`` keeps it by default) and N SuperNodes (``fedbandit supernode``, each with
its warm ClientApp executor) serving ``CLIENTS`` = 240 clients in contiguous ranges, runs
``fedbandit run fedpe_tiny`` (Fed-PE, one seed, T = 4,096) on them, and stops every process before
the next count. Per count: the wall time of the command, the median and 90th-percentile round
(``seed_0.latency.csv``'s ``exchange_s``: from the ServerApp's push to its last reply), whether
the regret curve equals a local run's byte for byte, clients dropped, the SuperLink's HTTP 500
answers that the nodes retried (``fedbandit.flower.internals.server_error_retry``), and the
resident memory of each SuperNode: the peak of its process tree (SuperNode and executor, sampled
every 0.2 s) and, after the run, the SuperNode process and the executor apart.

Every node shares this machine's cores, so the round time here grows with N for want of CPU (each
idle node polls the SuperLink every 0.2 s), not for want of network: it is the figure of a
laptop or a single test host, an upper bound for nodes on hosts of their own.

A count that does not finish (the run exits non-zero, nodes do not come online, a process of the
deployment dies, or the run passes ``RUN_TIMEOUT``) is a row of its own with the reason, and the
benchmark goes on with the next count; the logs are then kept and their folder printed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from fedbandit.bench import cluster as loopback
from fedbandit.bench.common import Table
from fedbandit.bench.paper import host_yardstick
from fedbandit.bench.processes import (
    RssSampler,
    children_map,
    process_tree,
    rss_kb,
    sigterm_as_interrupt,
)
from fedbandit.flower.submission import Submission
from fedbandit.results.files import read_json

NODE_COUNTS = (1, 2, 4, 8, 16, 32)
CLIENTS = 240
HORIZON = 4096
QUICK_COUNTS = (1, 2)
QUICK_CLIENTS = 8
QUICK_HORIZON = 16
#: What a SuperNode's log says when it asks again after an HTTP 500.
RETRY_LINE = "answered HTTP 500"


def node_memory_split(pid: int) -> tuple[float, float]:
    """(SuperNode process, its descendants) resident memory in MiB of the node started as
    ``pid`` (the ``fedbandit supernode`` process, which becomes the SuperNode)."""
    tree = process_tree(pid, children_map())
    own = rss_kb(tree[0]) / 1024
    return own, sum(rss_kb(child) for child in tree[1:]) / 1024


def unfinished_count(
    num_nodes: int, clients: int, horizon: int, error: BaseException
) -> dict[str, Any]:
    """The row of a count that did not finish: ``reason`` is one line saying why."""
    if isinstance(error, loopback.CommandFailedError):
        reason = f"`fedbandit run` {error.reason}"
    elif isinstance(error, subprocess.TimeoutExpired):
        reason = f"`fedbandit run` not finished after {loopback.RUN_TIMEOUT:.0f} s"
    else:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    return {"nodes": num_nodes, "M": clients, "T": horizon, "finished": False, "reason": reason}


def measure_count(root: Path, num_nodes: int, clients: int, horizon: int) -> dict[str, Any]:
    """One deployment of ``num_nodes`` SuperNodes and one ``fedbandit run`` on it; a count that
    did not finish is returned as ``unfinished_count``'s row."""
    try:
        return _measure_count(root, num_nodes, clients, horizon)
    except (RuntimeError, TimeoutError, subprocess.TimeoutExpired) as error:
        return unfinished_count(num_nodes, clients, horizon, error)


#: The run's start deadline and round timeout (``fedbandit run``'s defaults are 120 s): the
#: benchmark asks how many nodes a machine holds, so a count ends for what the machine cannot do,
#: not for a deadline a loaded host misses (at load 25, 16 nodes' first hellos took up to 47 s
#: each, and 9 of 16 missed the 120 s start deadline).
DEADLINE_SECONDS = 600.0


def _measure_count(root: Path, num_nodes: int, clients: int, horizon: int) -> dict[str, Any]:
    folder = root / f"nodes-{num_nodes}"
    folder.mkdir()
    cluster = loopback.Cluster(folder)
    try:
        cluster.start_superlink()
        submission = Submission(
            cluster.superlink, folder / "flwr-cli", insecure=True, run_timeout=loopback.RUN_TIMEOUT
        )
        names = cluster.start_nodes(clients, "node", num_nodes)
        started = time.perf_counter()
        loopback.wait_for_nodes(cluster, submission, exclude=set(), timeout=600.0, count=num_nodes)
        startup = time.perf_counter() - started
        roots = {name: cluster.processes[name].pid for name in names}
        roots["superlink"] = cluster.processes["superlink"].pid
        experiment = loopback.experiment_args(clients, horizon)
        out = folder / "flower"
        connect = ["--runtime", "flower", "--superlink", cluster.superlink, "--insecure"]
        connect += ["--start-deadline", f"{DEADLINE_SECONDS:g}"]
        connect += ["--round-timeout", f"{DEADLINE_SECONDS:g}"]
        with RssSampler(roots) as sampler:
            wall = loopback.run_fedbandit(
                ["run", *experiment, *connect, "--out", str(out)], folder / "flower.log"
            )
        split = [node_memory_split(cluster.processes[name].pid) for name in names]
        retries = sum(cluster.tail(name, 10**6).count(RETRY_LINE) for name in names)
    finally:
        cluster.close()
    local = folder / "local"
    loopback.run_fedbandit(
        ["run", *experiment, "--runtime", "local", "--out", str(local)], folder / "l.log"
    )
    latency = pd.read_csv(loopback.seed_file(out, "latency.csv"))
    seed = read_json(loopback.seed_file(out, "json"))
    median, p90 = loopback.median_p90(latency["exchange_s"])
    peaks = sorted(sampler.peak_mb[name] for name in names)
    return {
        "nodes": num_nodes,
        "M": clients,
        "T": horizon,
        "finished": True,
        "rounds": len(latency),
        "startup_s": startup,
        "wall_s": wall,
        "median_round_s": median,
        "p90_round_s": p90,
        "identical": loopback.seed_file(out, "regret.csv").read_bytes()
        == loopback.seed_file(local, "regret.csv").read_bytes(),
        "dropped": len(seed.get("dropped") or {}),
        "retried_500": retries,
        "peak_rss_mb_node_median": float(pd.Series(peaks).median()),
        "peak_rss_mb_node_max": peaks[-1],
        "rss_mb_supernode": float(pd.Series([own for own, _ in split]).median()),
        "rss_mb_executor": float(pd.Series([child for _, child in split]).median()),
        "peak_rss_mb_superlink": sampler.peak_mb["superlink"],
    }


def bench_nodes(
    quick: bool = False, workdir: Path | None = None, counts: Sequence[int] | None = None
) -> dict[str, Any]:
    """Every count of ``NODE_COUNTS`` (``QUICK_COUNTS`` with ``quick``) in turn. State and logs go
    to a temporary folder, removed when every count finished (kept, and its path printed, when
    one did not or the benchmark was interrupted); with ``workdir`` they go there and are kept."""
    counts = tuple(counts or (QUICK_COUNTS if quick else NODE_COUNTS))
    clients, horizon = (QUICK_CLIENTS, QUICK_HORIZON) if quick else (CLIENTS, HORIZON)
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="fedbandit-bench-nodes-", dir=workdir))
    rows = []
    ok = False
    host = host_yardstick()
    with sigterm_as_interrupt():
        try:
            for count in counts:
                rows.append(measure_count(root, count, clients, horizon))
            ok = all(row.get("finished", True) for row in rows)
        except BaseException:
            print(f"fedbandit bench nodes: interrupted; logs kept in {root}", file=sys.stderr)
            raise
        finally:
            if ok and workdir is None:
                shutil.rmtree(root, ignore_errors=True)
    if not ok:
        unfinished = [str(row["nodes"]) for row in rows if not row.get("finished", True)]
        print(
            f"fedbandit bench nodes: N = {', '.join(unfinished)} did not finish; logs kept in "
            f"{root}",
            file=sys.stderr,
        )
    return {"quick": quick, "counts": list(counts), "runs": rows, "host": host}


def format_nodes(result: dict[str, Any]) -> Table:
    """Title and rows of ``fedbandit bench nodes``: one row per node count."""
    runs = result["runs"]
    finished = [run for run in runs if run.get("finished", True)]
    first = runs[0] if runs else {"M": 0, "T": 0}
    title = f"nodes: fedpe_tiny (Fed-PE) M={first['M']} T={first['T']} on N SuperNodes, one machine"
    if (host := result.get("host")) is not None:
        title += (
            f"; host: Local UCB NumPy loop {host['numpy_loop_seconds']:.2f} s (docs' machine "
            f"{host['docs_numpy_loop_seconds']:.2f} s), load {host['load_1min']:.1f} before"
        )
    rows: list[tuple[str, ...]] = [
        (
            "N", "rounds", "wall s", "median round s", "p90 round s", "x N=1",
            "same as local", "dropped", "500s retried", "node peak MB", "SuperNode / executor MB",
        )
    ]  # fmt: skip
    base = finished[0]["median_round_s"] if finished else float("nan")
    for run in runs:
        if not run.get("finished", True):
            rows.append((str(run["nodes"]), f"did not finish: {run['reason']}"))
            continue
        rows.append(
            (
                str(run["nodes"]),
                str(run["rounds"]),
                f"{run['wall_s']:.1f}",
                f"{run['median_round_s']:.2f}",
                f"{run['p90_round_s']:.2f}",
                f"{run['median_round_s'] / base:.1f}",
                str(run["identical"]).lower(),
                str(run["dropped"]),
                str(run["retried_500"]),
                f"{run['peak_rss_mb_node_median']:.0f} (max {run['peak_rss_mb_node_max']:.0f})",
                f"{run['rss_mb_supernode']:.0f} / {run['rss_mb_executor']:.0f}",
            )
        )
    return title, rows
