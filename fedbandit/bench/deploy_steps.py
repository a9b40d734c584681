"""The six steps of ``fedbandit bench deploy`` (``fedbandit.bench.deploy``), each measured on the
deployment the steps before left running, and the sizes they run at."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedbandit.bench.cluster import (
    NUM_NODES,
    RUN_TIMEOUT,
    Cluster,
    experiment_args,
    median_p90,
    run_fedbandit,
    seed_file,
    wait_for_nodes,
)
from fedbandit.bench.processes import SAMPLE_SECONDS, RssSampler, machine_cpu_seconds
from fedbandit.flower.processes import CONNECTION
from fedbandit.flower.seeds import DEPLOYMENT_POLL_SECONDS
from fedbandit.flower.submission import Submission

#: The echo app submitted with ``flwr run`` in step 2.
ECHO_APP_DIR = Path(__file__).parent.parent / "flower" / "echo_app"
TARGET_WALL_S = 180.0
TARGET_RATIO = 1.5
TARGET_PEAK_MB = 2048.0
#: A summed round (secure aggregation) against a plain one, median over the run (issue 39).
TARGET_SECURE_RATIO = 3.0


@dataclass(frozen=True)
class Sizes:
    """Clients and horizon of the latency run (steps 1-2), of the memory run (step 3), and the
    horizon of the contextual run (step 5, ``fed_contextual``'s 20 clients)."""

    clients: int
    horizon: int
    memory_clients: int
    memory_horizon: int
    contextual_horizon: int
    #: The per-step protocols of step 5 (the centralised reference syncs every step).
    contextual_algorithms: tuple[str, ...] = ("dislinucb", "async_linucb", "fedlinucb")


FULL = Sizes(
    clients=100, horizon=2**12, memory_clients=10_000, memory_horizon=2**12,
    contextual_horizon=20_000,
)  # fmt: skip
QUICK = Sizes(
    clients=8, horizon=16, memory_clients=400, memory_horizon=16, contextual_horizon=60,
    contextual_algorithms=("dislinucb",),
)  # fmt: skip
CONTEXTUAL_CLIENTS = 20


def payload_sizes(comm_csv: Path, num_nodes: int) -> list[tuple[int, int]]:
    """Per round (in order) the (downlink, uplink) payload bytes per node: a ``seed_K.comm.csv``'s
    bytes summed over the round's clients, divided over ``num_nodes`` (rounded up; 0 when the
    round has no message in that direction)."""
    frame = pd.read_csv(comm_csv)
    totals = frame.pivot_table(
        index="round", columns="direction", values="bytes", aggfunc="sum", fill_value=0
    )
    sizes = []
    for _, row in totals.sort_index().iterrows():
        down, up = int(row.get("downlink", 0)), int(row.get("uplink", 0))
        sizes.append((math.ceil(down / num_nodes), math.ceil(up / num_nodes)))
    return sizes


def measure_fedpe(cluster: Cluster, sizes: Sizes, root: Path, tag: str = "fedpe") -> dict[str, Any]:
    """Step 1: the deployed run's wall time and latency split, and the check against local
    (outputs in ``ROOT/TAG-flower`` and ``ROOT/TAG-local``)."""
    flower_out, local_out = root / f"{tag}-flower", root / f"{tag}-local"
    experiment = experiment_args(sizes.clients, sizes.horizon)
    connect = ["--runtime", "flower", "--superlink", cluster.superlink, "--insecure"]
    wall = run_fedbandit(
        ["run", *experiment, *connect, "--out", str(flower_out)], root / f"{tag}-flower.log"
    )
    run_fedbandit(
        ["run", *experiment, "--runtime", "local", "--out", str(local_out)],
        root / f"{tag}-local.log",
    )
    latency = pd.read_csv(seed_file(flower_out, "latency.csv"))
    seed = json.loads(seed_file(flower_out, "json").read_text())
    identical = (
        seed_file(flower_out, "regret.csv").read_bytes()
        == seed_file(local_out, "regret.csv").read_bytes()
    )
    return {
        "M": sizes.clients,
        "T": sizes.horizon,
        "clients_per_node": sizes.clients // NUM_NODES,
        "rounds": len(latency),
        "wall_s": wall,
        "serverapp_s": float(seed["seconds"]),
        "median_server_s": float(latency["server_s"].median()),
        "median_transport_s": float(latency["transport_s"].median()),
        "median_client_s": float(latency["client_s"].median()),
        "median_exchange_s": float(latency["exchange_s"].median()),
        "identical": identical,
        "target_wall_s": TARGET_WALL_S,
        "_latency": latency,
        "_comm": seed_file(flower_out, "comm.csv"),
    }


def echo_run_config(sizes: list[tuple[int, int]], out: Path) -> dict[str, Any]:
    """The echo app's run config: the rounds' payload sizes per node, where to write the
    timings, and fedbandit's poll interval and round deadline."""
    return {
        "rounds": json.dumps(sizes),
        "out": str(out),
        "num-nodes": NUM_NODES,
        "poll-seconds": DEPLOYMENT_POLL_SECONDS,
        "round-timeout": 120.0,
        "start-deadline": 120.0,
    }


def measure_echo(
    cluster: Cluster, submission: Submission, fedpe: dict[str, Any], root: Path
) -> dict[str, Any]:
    """Step 2: the echo app on the same nodes with step 1's payload sizes, against step 1."""
    sizes = payload_sizes(fedpe["_comm"], NUM_NODES)
    out = root / "echo" / "timings.json"
    submission.run(echo_run_config(sizes, out), "echo", done_file=out, app_dir=ECHO_APP_DIR)
    echo = json.loads(out.read_text())["rounds"]
    if len(echo) != len(sizes):
        raise RuntimeError(f"echo ran {len(echo)} rounds of {len(sizes)}")
    latency = fedpe["_latency"]
    ours_med, ours_p90 = median_p90(latency["exchange_s"])
    echo_med, echo_p90 = median_p90(r["exchange_s"] for r in echo)
    echo_transport, _ = median_p90(r["exchange_s"] - r["client_s"] for r in echo)
    return {
        "rounds": len(echo),
        "same_nodes_one_run": True,
        "poll_s": DEPLOYMENT_POLL_SECONDS,
        "median_downlink_bytes_per_node": float(np.median([d for d, _ in sizes])),
        "median_uplink_bytes_per_node": float(np.median([u for _, u in sizes])),
        "fedbandit_median_s": ours_med,
        "echo_median_s": echo_med,
        "ratio": ours_med / echo_med,
        "fedbandit_p90_s": ours_p90,
        "echo_p90_s": echo_p90,
        "ratio_p90": ours_p90 / echo_p90,
        "fedbandit_median_transport_s": float(latency["transport_s"].median()),
        "echo_median_transport_s": echo_transport,
        "target_ratio": TARGET_RATIO,
    }


def measure_memory(
    cluster: Cluster, submission: Submission, sizes: Sizes, root: Path, old_nodes: list[str]
) -> dict[str, Any]:
    """Step 3: restart the nodes with M / 4 clients each; a run while their RSS is sampled."""
    before = submission.online_nodes()
    cluster.stop(old_nodes)
    names = cluster.start_nodes(sizes.memory_clients, "memory")
    wait_for_nodes(cluster, submission, exclude=before)
    roots = {name: cluster.processes[name].pid for name in names}
    roots["superlink"] = cluster.processes["superlink"].pid
    out = root / "memory-flower"
    args = [
        "run",
        *experiment_args(sizes.memory_clients, sizes.memory_horizon),
        "--runtime",
        "flower",
        "--superlink",
        cluster.superlink,
        "--insecure",
        "--out",
        str(out),
    ]
    with RssSampler(roots) as sampler:
        wall = run_fedbandit(args, root / "memory-flower.log")
    rounds = len(pd.read_csv(seed_file(out, "latency.csv")))
    nodes = [sampler.peak_mb[name] for name in names]
    return {
        "M": sizes.memory_clients,
        "T": sizes.memory_horizon,
        "clients_per_node": sizes.memory_clients // NUM_NODES,
        "rounds": rounds,
        "wall_s": wall,
        "peak_rss_mb_per_node": nodes,
        "peak_rss_mb_max_node": max(nodes),
        "peak_rss_mb_superlink": sampler.peak_mb["superlink"],
        "samples": sampler.samples,
        "sample_s": SAMPLE_SECONDS,
        "target_peak_mb": TARGET_PEAK_MB,
    }


def measure_in_memory(
    cluster: Cluster, submission_dir: Path, sizes: Sizes, root: Path, fedpe: dict[str, Any]
) -> dict[str, Any]:
    """Step 4: every process of steps 1-3 stopped, a SuperLink with ``--in-memory`` and four
    fresh SuperNodes, and step 1's run again: its wall time and median exchange against step 1's
    (a SuperLink database file in step 1)."""
    cluster.stop(list(cluster.alive))
    cluster.start_superlink("superlink-in-memory", in_memory=True)
    submission = Submission(
        cluster.superlink, submission_dir, insecure=True, run_timeout=RUN_TIMEOUT
    )
    cluster.start_nodes(sizes.clients, "in-memory")
    wait_for_nodes(cluster, submission, exclude=set())
    run = measure_fedpe(cluster, sizes, root, tag="in-memory")
    return {
        "wall_s": run["wall_s"],
        "median_exchange_s": run["median_exchange_s"],
        "median_transport_s": run["median_transport_s"],
        "identical": run["identical"],
        "wall_ratio": run["wall_s"] / fedpe["wall_s"],
        "exchange_ratio": run["median_exchange_s"] / fedpe["median_exchange_s"],
    }


def measure_contextual(
    cluster: Cluster, submission: Submission, sizes: Sizes, root: Path
) -> dict[str, Any]:
    """Step 5: ``fed_contextual`` (20 clients on four fresh SuperNodes, one seed) with the
    per-step protocols: Flower rounds and wall time per algorithm with run-ahead (the default
    ``--steps-per-round``), against the T rounds the per-step protocol needs; regret identical
    to the local run."""
    before = submission.online_nodes()
    cluster.stop([name for name in cluster.alive if "node" in name])
    cluster.start_nodes(CONTEXTUAL_CLIENTS, "contextual")
    wait_for_nodes(cluster, submission, exclude=before)
    results = {}
    for algorithm in sizes.contextual_algorithms:
        experiment = [
            "fed_contextual", "--seeds", "1", "--quiet",
            "--set", f"horizon={sizes.contextual_horizon}", "--set", f'algorithms=["{algorithm}"]',
            "--set", "params={}",
        ]  # fmt: skip
        flower_out, local_out = root / f"ctx-{algorithm}-flower", root / f"ctx-{algorithm}-local"
        wall = run_fedbandit(
            ["run", *experiment, "--runtime", "flower", "--superlink", cluster.superlink,
             "--insecure", "--out", str(flower_out)],
            root / f"ctx-{algorithm}-flower.log",
        )  # fmt: skip
        run_fedbandit(
            ["run", *experiment, "--out", str(local_out)], root / f"ctx-{algorithm}-local.log"
        )
        seed = flower_out / "runs" / algorithm / "seed_0"
        latency = pd.read_csv(seed.with_suffix(".latency.csv"))
        totals = json.loads(seed.with_suffix(".json").read_text())["totals"]
        identical = all(
            seed.with_suffix(suffix).read_bytes()
            == (local_out / "runs" / algorithm / "seed_0").with_suffix(suffix).read_bytes()
            for suffix in (".regret.csv", ".comm.csv")
        )
        results[algorithm] = {
            "T": sizes.contextual_horizon,
            "flower_rounds": len(latency),
            "communication_rounds": int(totals["rounds"]),
            "wall_s": wall,
            "median_exchange_s": float(latency["exchange_s"].median()),
            "identical": identical,
        }
    return results


def run_traffic(submission: Submission) -> dict[str, int]:
    """Bytes in and out of the SuperLink per Flower run it knows (``flwr ls``: what went over
    the wire, framing and SecAgg+'s key exchange included), by run id."""
    reply = json.loads(
        submission.flwr(submission.environment(), "ls", CONNECTION, "--format", "json")
    )
    return {
        str(run["run-id"]): int(run["network-traffic"]["total-bytes"])
        for run in reply.get("runs", [])
    }


def new_run_traffic(before: dict[str, int], after: dict[str, int]) -> int:
    """The traffic of the one run in ``after`` that ``before`` did not list (run ids are random,
    so the newest run is found by difference)."""
    new = [run for run in after if run not in before]
    if len(new) != 1:
        raise RuntimeError(f"expected one new Flower run, flwr ls lists {len(new)}")
    return after[new[0]]


def measure_secure(
    cluster: Cluster, submission: Submission, sizes: Sizes, root: Path
) -> dict[str, Any]:
    """Step 6: on step 5's four SuperNodes (20 clients), Fed-PE at step 1's horizon without and
    with ``--secure-aggregation``, one after the other: wall times, the median exchange of the
    rounds that secure aggregation sums (Fed-PE's explore rounds from phase 1 on) in both runs,
    their uplink bytes as counted, the runs' traffic through the SuperLink, the CPU seconds the
    machine was busy during each run, and whether the regret curves are identical."""
    experiment = experiment_args(CONTEXTUAL_CLIENTS, sizes.horizon)
    connect = ["--runtime", "flower", "--superlink", cluster.superlink, "--insecure"]
    runs: dict[str, dict[str, Any]] = {}
    for tag, extra in (("plain", []), ("secure", ["--secure-aggregation"])):
        out = root / f"secure-{tag}"
        before = run_traffic(submission)
        cpu_before = machine_cpu_seconds()
        wall = run_fedbandit(
            ["run", *experiment, *connect, *extra, "--out", str(out)], root / f"secure-{tag}.log"
        )
        cpu_after = machine_cpu_seconds()
        latency = pd.read_csv(seed_file(out, "latency.csv"))
        comm = pd.read_csv(seed_file(out, "comm.csv"))
        explore = latency[latency["kind"] == "explore"].iloc[1:]  # phase 0 stays in the clear
        rounds = set(explore["round"])
        uplink = comm[(comm["direction"] == "uplink") & comm["round"].isin(rounds)]
        runs[tag] = {
            "wall_s": wall,
            "cpu_s": None if cpu_before is None or cpu_after is None else cpu_after - cpu_before,
            "traffic_bytes": new_run_traffic(before, run_traffic(submission)),
            "median_exchange_s": float(explore["exchange_s"].median()),
            "uplink_bytes_per_round": float(uplink["bytes"].mean()),
            "regret": seed_file(out, "regret.csv").read_bytes(),
            "report": json.loads(seed_file(out, "json").read_text()).get("report") or {},
        }
    plain, secure = runs["plain"], runs["secure"]
    summed = secure["report"].get("secure_aggregation", {})
    return {
        "M": CONTEXTUAL_CLIENTS,
        "T": sizes.horizon,
        "secure_exchanges": int(summed.get("exchanges", 0)),
        "keys_set_up_ahead": int(summed.get("keys_set_up_ahead", 0)),
        "count_exchanges": int(summed.get("count_exchanges", 0)),
        "target_exchange_ratio": TARGET_SECURE_RATIO,
        "wall_s": {"plain": plain["wall_s"], "secure": secure["wall_s"]},
        "wall_ratio": secure["wall_s"] / plain["wall_s"],
        "cpu_s": {"plain": plain["cpu_s"], "secure": secure["cpu_s"]},
        "cores": os.cpu_count() or 1,
        "median_exchange_s": {
            "plain": plain["median_exchange_s"],
            "secure": secure["median_exchange_s"],
        },
        "exchange_ratio": secure["median_exchange_s"] / plain["median_exchange_s"],
        "uplink_bytes_per_round": {
            "plain": plain["uplink_bytes_per_round"],
            "secure": secure["uplink_bytes_per_round"],
        },
        "traffic_bytes": {"plain": plain["traffic_bytes"], "secure": secure["traffic_bytes"]},
        "traffic_ratio": secure["traffic_bytes"] / max(plain["traffic_bytes"], 1),
        "identical": plain["regret"] == secure["regret"],
    }
