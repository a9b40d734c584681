"""``fedbandit bench deploy``: a real Flower deployment on loopback, measured in one run.

The benchmark starts its own SuperLink and four SuperNodes (``fedbandit superlink`` /
``fedbandit supernode``, each process in its own session, state in a temporary folder, free ports
in 9800-9899) and always stops them, also when interrupted. Then:

1. **fedpe**: ``fedbandit run fedpe_tiny --runtime flower`` with M = 100 clients (25 per node),
   T = 2^12, Fed-PE, one seed: wall time of the command (submission to results written), the
   median per-round latency split from ``seed_0.latency.csv``, and whether the regret curve equals
   a local run's byte for byte.
2. **echo**: a bare Flower Message-API app (``fedbandit/flower/echo_app``) on the same nodes right
   after step 1, exchanging per round the payload sizes of step 1's ``seed_0.comm.csv`` (bytes
   divided over the nodes) with the same push/pull loop and poll interval: fedbandit's exchange
   seconds per round against the echo's.
3. **memory**: the nodes restarted with 2,500 clients each (M = 10,000), a Fed-PE run while the
   resident memory (VmRSS) of each node's process tree (SuperNode and its ClientApp executor) is
   sampled every 0.2 s: the peak per node, and the wall time.
4. **in-memory**: every process stopped, a SuperLink started with ``--in-memory`` (Flower's
   ``:flwr-in-memory:`` state instead of a SQLite file) and four fresh SuperNodes, then step 1's
   run again: its wall time and median exchange as ratios to step 1's.
5. **contextual**: the per-step protocols with run-ahead on four fresh SuperNodes (20 clients).
6. **secure**: on those nodes, Fed-PE without and with ``--secure-aggregation`` (SecAgg+), side
   by side: wall time, the summed rounds' median exchange and counted uplink bytes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedbandit.bench.common import Table
from fedbandit.flower.deployment import CONNECTION, DEPLOYMENT_POLL_SECONDS, Submission

#: The echo app submitted with ``flwr run`` in step 2.
ECHO_APP_DIR = Path(__file__).parent.parent / "flower" / "echo_app"
#: Ports the benchmark may listen on (other tools use 9092, 9500-9510 and 9700-9799).
PORTS = range(9800, 9900)
NUM_NODES = 4
SAMPLE_SECONDS = 0.2
TARGET_WALL_S = 180.0
TARGET_RATIO = 1.5
TARGET_PEAK_MB = 2048.0
#: A summed round (secure aggregation) against a plain one, median over the run (issue 39).
TARGET_SECURE_RATIO = 3.0
#: Seconds allowed for one ``fedbandit run`` or echo run before the benchmark gives up.
RUN_TIMEOUT = 1800.0


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


# --- pure helpers -------------------------------------------------------------------------------


def client_ranges(num_clients: int, num_nodes: int) -> list[str]:
    """Contiguous ``FIRST-LAST`` ranges of ``num_clients`` over ``num_nodes`` nodes."""
    if not 0 < num_nodes <= num_clients:
        raise ValueError(f"{num_clients} clients cannot fill {num_nodes} nodes")
    parts = np.array_split(np.arange(num_clients), num_nodes)
    return [f"{part[0]}-{part[-1]}" for part in parts]


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


def median_p90(values: Iterable[float]) -> tuple[float, float]:
    """The median and the 90th percentile (linear interpolation) of ``values``."""
    array = np.asarray(list(values), dtype=float)
    if array.size == 0:
        return math.nan, math.nan
    return float(np.median(array)), float(np.percentile(array, 90))


def _children_map() -> dict[int, list[int]]:
    """Parent pid -> child pids of every process visible in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def process_tree(pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """``pid`` and all its descendants."""
    children = _children_map() if children is None else children
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def rss_kb(pid: int) -> int:
    """VmRSS of process ``pid`` in KiB (0 when it is gone or a zombie)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :].split()[0] != b"Z"


def tree_rss_kb(pid: int, children: dict[int, list[int]] | None = None) -> int:
    """Summed VmRSS (KiB) of ``pid`` and its descendants (shared pages count once per process)."""
    return sum(rss_kb(p) for p in process_tree(pid, children))


class RssSampler:
    """Samples every ``interval`` seconds, in a thread, the summed VmRSS of each named process
    tree and keeps the peak (MiB) per name."""

    def __init__(self, roots: dict[str, int], interval: float = SAMPLE_SECONDS) -> None:
        self.roots, self.interval = dict(roots), interval
        self.peak_mb = dict.fromkeys(self.roots, 0.0)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def sample(self) -> None:
        children = _children_map()
        for name, pid in self.roots.items():
            mb = tree_rss_kb(pid, children) / 1024
            self.peak_mb[name] = max(self.peak_mb[name], mb)
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.sample()
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --- the deployment -----------------------------------------------------------------------------


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_for_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1.0):
            return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


@dataclass
class Cluster:
    """A SuperLink and SuperNodes on loopback, each process in its own session, logs in ``root``.
    ``close`` stops them all (SIGTERM to the process group, SIGKILL after 10 s)."""

    root: Path
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    superlink: str = ""
    #: Processes that must be running (``check_alive``): started and not stopped.
    alive: set[str] = field(default_factory=set)
    _ports: set[int] = field(default_factory=set)

    def port(self) -> int:
        """A free port of ``PORTS`` not handed out before (random order: concurrent runs)."""
        candidates = [p for p in PORTS if p not in self._ports]
        random.shuffle(candidates)
        for port in candidates:
            if _port_free(port):
                self._ports.add(port)
                return port
        raise RuntimeError(f"no free port in {PORTS.start}-{PORTS.stop - 1}")

    def start(self, name: str, argv: Sequence[str]) -> subprocess.Popen:
        """``fedbandit ARGV`` as process ``name``."""
        return self.launch(name, [sys.executable, "-m", "fedbandit.cli", *argv])

    def launch(self, name: str, command: Sequence[str]) -> subprocess.Popen:
        """``command`` in a session of its own, output to ``ROOT/NAME.log``."""
        with open(self.root / f"{name}.log", "wb") as log:
            process = subprocess.Popen(
                list(command),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                cwd=self.root,
            )
        self.processes[name] = process
        self.alive.add(name)
        return process

    def start_superlink(self, name: str = "superlink", in_memory: bool = False) -> str:
        """A SuperLink named ``name`` (state in ``ROOT/NAME``); with ``in_memory`` it keeps its
        state in memory instead of a database file. Its address becomes ``self.superlink``."""
        port = self.port()
        argv = [
            "superlink",
            "--insecure",
            "--port",
            str(port),
            "--state-dir",
            str(self.root / name),
        ]
        self.start(name, [*argv, "--in-memory"] if in_memory else argv)
        wait_for_port(port)
        self.superlink = f"127.0.0.1:{port}"
        return self.superlink

    def start_nodes(self, num_clients: int, tag: str, num_nodes: int = NUM_NODES) -> list[str]:
        """One SuperNode per range of ``client_ranges(num_clients, num_nodes)``; their names."""
        names = []
        for i, clients in enumerate(client_ranges(num_clients, num_nodes)):
            name = f"{tag}-node{i}"
            self.start(
                name,
                [
                    "supernode",
                    "--insecure",
                    "--superlink",
                    self.superlink,
                    "--clients",
                    clients,
                    "--port",
                    str(self.port()),
                    "--state-dir",
                    str(self.root / name),
                ],
            )
            names.append(name)
        return names

    def stop(self, names: Iterable[str]) -> None:
        """SIGTERM each process group and every descendant (a SuperLink's ServerApp runs in a
        session of its own; a SuperNode leaves the federation on SIGTERM), SIGKILL what is left
        after 10 s; waits for the processes to end."""
        names = list(names)
        self.alive -= set(names)
        chosen = [self.processes[name] for name in names]
        children = _children_map()
        descendants = {pid for process in chosen for pid in process_tree(process.pid, children)[1:]}
        self._signal(chosen, descendants, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in chosen:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
        while any(map(_running, descendants)) and time.monotonic() < deadline:
            time.sleep(0.1)
        self._signal(chosen, descendants, signal.SIGKILL)
        for process in chosen:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)

    @staticmethod
    def _signal(groups: list[subprocess.Popen], pids: set[int], sig: int) -> None:
        for process in groups:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, sig)
        for pid in pids:
            if _running(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)

    def close(self) -> None:
        self.stop(list(self.processes))

    def check_alive(self) -> None:
        """Raise with the end of its log when a process that should run has exited."""
        for name in sorted(self.alive):
            process = self.processes[name]
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited ({process.returncode}):\n{self.tail(name)}")

    def tail(self, name: str, lines: int = 15) -> str:
        path = self.root / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def logs(self, names: Iterable[str] | None = None) -> str:
        return "\n".join(
            f"--- {name} ---\n{self.tail(name)}" for name in (names or list(self.processes))
        )


def wait_for_nodes(
    cluster: Cluster,
    submission: Submission,
    exclude: set[str],
    timeout: float = 180.0,
    count: int = NUM_NODES,
) -> set[str]:
    """Wait until ``count`` nodes not in ``exclude`` are online, and none of ``exclude``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cluster.check_alive()
        nodes = submission.online_nodes()
        if len(nodes - exclude) >= count and not nodes & exclude:
            return nodes
        time.sleep(1.0)
    raise TimeoutError(f"{count} SuperNodes not online after {timeout} s:\n{cluster.logs()}")


def experiment_args(num_clients: int, horizon: int) -> list[str]:
    """``fedbandit run`` arguments: fedpe_tiny, Fed-PE only, one seed, M and T set."""
    return [
        "fedpe_tiny",
        "--seeds",
        "1",
        "--set",
        f"instance.num_clients={num_clients}",
        "--set",
        f"horizon={horizon}",
        "--set",
        'algorithms=["fedpe"]',
        "--quiet",
    ]


def run_fedbandit(args: Sequence[str], log: Path) -> float:
    """``fedbandit ARGS`` in a child process (interpreter start-up included); its wall seconds.
    The child runs in a session of its own; when interrupted (or past ``RUN_TIMEOUT``) it gets
    one SIGINT, so that it stops its Flower run, and SIGKILL 30 s later."""
    started = time.perf_counter()
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "fedbandit.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        process.wait(timeout=RUN_TIMEOUT)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        raise
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"`fedbandit {' '.join(args)}` failed ({process.returncode}):\n{tail}")
    return seconds


# --- the three measurements ---------------------------------------------------------------------


def _seed_file(out: Path, suffix: str) -> Path:
    return out / "runs" / "fedpe" / f"seed_0.{suffix}"


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
    latency = pd.read_csv(_seed_file(flower_out, "latency.csv"))
    seed = json.loads(_seed_file(flower_out, "json").read_text())
    identical = (
        _seed_file(flower_out, "regret.csv").read_bytes()
        == _seed_file(local_out, "regret.csv").read_bytes()
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
        "_comm": _seed_file(flower_out, "comm.csv"),
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
    rounds = len(pd.read_csv(_seed_file(out, "latency.csv")))
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


def machine_cpu_seconds(stat: Path = Path("/proc/stat")) -> float | None:
    """CPU seconds the whole machine has been busy since boot (every process: the SuperLink,
    the SuperNodes and their executors, the ServerApp, the driver), from the first line of
    ``/proc/stat``: user, nice, system, irq and softirq (guest time is inside user and nice
    already; idle, iowait and a hypervisor's steal are not this machine's work); None where
    there is no such file. In a container that file may count the host's CPUs, other tenants'
    work included."""
    try:
        fields = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    ticks = [int(value) for value in fields[1:8]] + [0] * 7
    user, nice, system, _, _, irq, softirq = ticks[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


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
        latency = pd.read_csv(_seed_file(out, "latency.csv"))
        comm = pd.read_csv(_seed_file(out, "comm.csv"))
        explore = latency[latency["kind"] == "explore"].iloc[1:]  # phase 0 stays in the clear
        rounds = set(explore["round"])
        uplink = comm[(comm["direction"] == "uplink") & comm["round"].isin(rounds)]
        runs[tag] = {
            "wall_s": wall,
            "cpu_s": None if cpu_before is None or cpu_after is None else cpu_after - cpu_before,
            "traffic_bytes": new_run_traffic(before, run_traffic(submission)),
            "median_exchange_s": float(explore["exchange_s"].median()),
            "uplink_bytes_per_round": float(uplink["bytes"].mean()),
            "regret": _seed_file(out, "regret.csv").read_bytes(),
            "report": json.loads(_seed_file(out, "json").read_text()).get("report") or {},
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


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """In the main thread, SIGTERM raises ``KeyboardInterrupt`` (so that ``finally`` blocks stop
    the deployment) until the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def bench_deploy(quick: bool = False, workdir: Path | None = None) -> dict[str, Any]:
    """Steps 1-3 on one SuperLink and four SuperNodes started (and stopped) here. State and logs
    go to a temporary folder, removed after a successful run (kept after a failure); with
    ``workdir`` they go there and are kept."""
    sizes = QUICK if quick else FULL
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="fedbandit-bench-deploy-", dir=workdir))
    cluster = Cluster(root)
    ok = False
    with sigterm_as_interrupt():
        try:
            started = time.perf_counter()
            cluster.start_superlink()
            submission = Submission(
                cluster.superlink, root / "flwr-cli", insecure=True, run_timeout=RUN_TIMEOUT
            )
            nodes = cluster.start_nodes(sizes.clients, "latency")
            wait_for_nodes(cluster, submission, exclude=set())
            startup = time.perf_counter() - started
            fedpe = measure_fedpe(cluster, sizes, root)
            echo = measure_echo(cluster, submission, fedpe, root)
            memory = measure_memory(cluster, submission, sizes, root, nodes)
            in_memory = measure_in_memory(cluster, root / "flwr-cli-in-memory", sizes, root, fedpe)
            later = Submission(cluster.superlink, root / "flwr-cli-in-memory", insecure=True)
            contextual = measure_contextual(cluster, later, sizes, root)
            secure = measure_secure(cluster, later, sizes, root)
            ok = True
        except BaseException:
            print(f"fedbandit bench deploy: failed; logs kept in {root}", file=sys.stderr)
            raise
        finally:
            cluster.close()
            if ok and workdir is None:
                shutil.rmtree(root, ignore_errors=True)
    return {
        "quick": quick,
        "nodes": NUM_NODES,
        "startup_s": startup,
        "fedpe": {k: v for k, v in fedpe.items() if not k.startswith("_")},
        "echo": echo,
        "memory": memory,
        "in_memory": in_memory,
        "contextual": contextual,
        "secure": secure,
    }


def format_deploy(result: dict[str, Any]) -> Table:
    """Title and rows (part, measure, value, target) of ``fedbandit bench deploy``."""
    fedpe, echo, memory = result["fedpe"], result["echo"], result["memory"]
    split = (
        f"{fedpe['median_server_s']:.3f} / {fedpe['median_transport_s']:.3f} / "
        f"{fedpe['median_client_s']:.3f} s"
    )
    part1 = f"1 fedpe M={fedpe['M']} T={fedpe['T']}"
    part2 = "2 fedbandit vs echo"
    part3 = f"3 memory M={memory['M']} T={memory['T']}"
    part4 = "4 part 1, SuperLink --in-memory"
    in_memory = result["in_memory"]
    per_node = " ".join(f"{mb:.0f}" for mb in memory["peak_rss_mb_per_node"])
    rows: list[tuple[str, ...]] = [
        ("part", "measure", "value", "target"),
        (part1, "wall time of `fedbandit run`", f"{fedpe['wall_s']:.1f} s",
         f"<= {fedpe['target_wall_s']:.0f} s"),
        ("", "rounds; ServerApp seconds", f"{fedpe['rounds']}; {fedpe['serverapp_s']:.1f} s", ""),
        ("", "median round: server / transport / client", split, ""),
        ("", "regret identical to local run", str(fedpe["identical"]).lower(), "true"),
        (part2, "median exchange: fedbandit / echo",
         f"{echo['fedbandit_median_s']:.3f} / {echo['echo_median_s']:.3f} s", ""),
        ("", "median ratio", f"{echo['ratio']:.2f}", f"<= {echo['target_ratio']:g}"),
        ("", "p90 exchange: fedbandit / echo",
         f"{echo['fedbandit_p90_s']:.3f} / {echo['echo_p90_s']:.3f} s",
         ""),
        ("", "p90 ratio", f"{echo['ratio_p90']:.2f}", ""),
        ("", "median transport: fedbandit / echo",
         f"{echo['fedbandit_median_transport_s']:.3f} / {echo['echo_median_transport_s']:.3f} s",
         ""),
        ("", "median payload per node: down / up",
         f"{echo['median_downlink_bytes_per_node']:.0f} / "
         f"{echo['median_uplink_bytes_per_node']:.0f} B", ""),
        (part3, "wall time of `fedbandit run`", f"{memory['wall_s']:.1f} s", ""),
        ("", f"peak RSS per node ({memory['clients_per_node']} clients), MB", per_node,
         f"<= {memory['target_peak_mb']:.0f}"),
        ("", "peak RSS SuperLink tree (with ServerApp), MB",
         f"{memory['peak_rss_mb_superlink']:.0f}", ""),
        (part4, "wall time of `fedbandit run`",
         f"{in_memory['wall_s']:.1f} s ({in_memory['wall_ratio']:.2f} x part 1)", ""),
        ("", "median exchange",
         f"{in_memory['median_exchange_s']:.3f} s ({in_memory['exchange_ratio']:.2f} x part 1)",
         ""),
        ("", "regret identical to local run", str(in_memory["identical"]).lower(), "true"),
    ]  # fmt: skip
    for index, (algorithm, run) in enumerate(result["contextual"].items()):
        part = f"5 fed_contextual T={run['T']}" if index == 0 else ""
        rows += [
            (part, f"{algorithm}: Flower rounds (per-step: T + syncs)",
             f"{run['flower_rounds']} ({run['communication_rounds']} with messages)", ""),
            ("", f"{algorithm}: wall time; median round",
             f"{run['wall_s']:.1f} s; {run['median_exchange_s']:.3f} s", ""),
            ("", f"{algorithm}: regret and communication identical to local",
             str(run["identical"]).lower(), "true"),
        ]  # fmt: skip
    secure = result["secure"]
    rows += [
        (f"6 fedpe M={secure['M']} T={secure['T']}, --secure-aggregation",
         "wall time: plain / secure",
         f"{secure['wall_s']['plain']:.1f} / {secure['wall_s']['secure']:.1f} s "
         f"({secure['wall_ratio']:.2f} x)", ""),
        ("", f"median summed round ({secure['secure_exchanges']} rounds): plain / secure",
         f"{secure['median_exchange_s']['plain']:.3f} / {secure['median_exchange_s']['secure']:.3f}"
         f" s ({secure['exchange_ratio']:.2f} x)",
         f"<= {secure.get('target_exchange_ratio', TARGET_SECURE_RATIO):g} x"),
        ("", "summed rounds with keys set up ahead; with a count",
         f"{secure.get('keys_set_up_ahead', 0)}; {secure.get('count_exchanges', 0)}", ""),
        ("", "uplink bytes per summed round (counted): plain / secure",
         f"{secure['uplink_bytes_per_round']['plain']:.0f} / "
         f"{secure['uplink_bytes_per_round']['secure']:.0f} B", ""),
        ("", "SuperLink traffic of the run: plain / secure",
         f"{secure['traffic_bytes']['plain'] / 1e6:.2f} / "
         f"{secure['traffic_bytes']['secure'] / 1e6:.2f} MB ({secure['traffic_ratio']:.2f} x)", ""),
        ("", "regret identical with and without", str(secure["identical"]).lower(), "true"),
    ]  # fmt: skip
    cpu = secure.get("cpu_s") or {}
    if cpu.get("plain") is not None and cpu.get("secure") is not None:
        rows.append(
            ("", "machine CPU busy during the run (every process): plain / secure",
             f"{cpu['plain']:.1f} / {cpu['secure']:.1f} s ("
             f"{cpu['plain'] / secure['wall_s']['plain']:.2f} / "
             f"{cpu['secure'] / secure['wall_s']['secure']:.2f} of {secure['cores']} cores)", "")
        )  # fmt: skip
    title = (
        f"deploy: SuperLink + {result['nodes']} SuperNodes on loopback (started in "
        f"{result['startup_s']:.1f} s); fedbandit and echo ran on the same nodes in one run; "
        f"RSS = VmRSS of each node's process tree, sampled every {memory['sample_s']:g} s"
        + (" [quick]" if result["quick"] else "")
    )
    return title, rows
