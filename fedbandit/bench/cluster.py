"""A Flower deployment on loopback for the benchmarks (``fedbandit bench deploy`` and ``nodes``):
a SuperLink and SuperNodes started as ``fedbandit superlink`` / ``fedbandit supernode``, each
process in its own session, on free ports of ``PORTS``, and always stopped (``Cluster``); the
``fedbandit run`` commands submitted to it, and where their result files are."""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedbandit.bench.processes import children_map, is_running, process_tree
from fedbandit.flower.submission import Submission

#: Ports the benchmark may listen on (other tools use 9092, 9500-9510 and 9700-9799).
PORTS = range(9800, 9900)
NUM_NODES = 4
#: Seconds allowed for one ``fedbandit run`` or echo run before the benchmark gives up.
RUN_TIMEOUT = 1800.0


def client_ranges(num_clients: int, num_nodes: int) -> list[str]:
    """Contiguous ``FIRST-LAST`` ranges of ``num_clients`` over ``num_nodes`` nodes."""
    if not 0 < num_nodes <= num_clients:
        raise ValueError(f"{num_clients} clients cannot fill {num_nodes} nodes")
    parts = np.array_split(np.arange(num_clients), num_nodes)
    return [f"{part[0]}-{part[-1]}" for part in parts]


def median_p90(values: Iterable[float]) -> tuple[float, float]:
    """The median and the 90th percentile (linear interpolation) of ``values``."""
    array = np.asarray(list(values), dtype=float)
    if array.size == 0:
        return math.nan, math.nan
    return float(np.median(array)), float(np.percentile(array, 90))


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
        """SIGTERM each process group and every descendant (a SuperLink's SuperExec stops its
        ServerApps; the descendants also cover processes that left the group; a SuperNode leaves
        the federation on SIGTERM), SIGKILL what is left after 10 s; waits for the processes to
        end."""
        names = list(names)
        self.alive -= set(names)
        chosen = [self.processes[name] for name in names]
        children = children_map()
        descendants = {pid for process in chosen for pid in process_tree(process.pid, children)[1:]}
        self._signal(chosen, descendants, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in chosen:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
        while any(map(is_running, descendants)) and time.monotonic() < deadline:
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
            if is_running(pid):
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


#: Colour codes and Flower's level prefix ("ERROR :     ") of a log line.
_LOG_NOISE = re.compile(r"\x1b\[[0-9;]*m|^\s*(ERROR|WARNING|INFO)\s*:\s*")


def telling_line(lines: Sequence[str], limit: int = 240) -> str:
    """The line of a log's end that says most of why it failed: the last one naming an error or
    exception (else the last non-empty one), without colour codes or level prefix, shortened to
    ``limit`` characters."""
    clean = [_LOG_NOISE.sub("", _LOG_NOISE.sub("", line)).strip() for line in lines]
    clean = [line for line in clean if line]
    errors = [line for line in clean if re.search(r"error|exception|failed", line, re.IGNORECASE)]
    line = (errors or clean or [""])[-1]
    return line if len(line) <= limit else line[: limit - 3] + "..."


class CommandFailedError(RuntimeError):
    """A ``fedbandit`` command of the benchmark exited non-zero: ``reason`` is its last
    ``fedbandit: error:`` line (else the last line of its log), completed by the log's telling
    line when that error goes on in the log (``telling_line``); ``log`` the log file."""

    def __init__(self, args: Sequence[str], returncode: int, log: Path) -> None:
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        marks = [i for i, line in enumerate(lines) if line.startswith("fedbandit: error:")]
        if marks:
            last = lines[marks[-1]].removeprefix("fedbandit: error:").strip()
            if last.endswith(":"):  # "...; end of its log:" and the log follows
                last = f"{last} {telling_line(lines[marks[-1] + 1 :])}".strip()
        else:
            last = next((ln for ln in reversed(lines) if ln.strip()), "")
        self.reason = f"exit {returncode}: {last}"
        self.log = log
        tail = "\n".join(lines[-30:])
        super().__init__(f"`fedbandit {' '.join(args)}` failed ({returncode}):\n{tail}")


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
        raise CommandFailedError(args, process.returncode, log)
    return seconds


def seed_file(out: Path, suffix: str) -> Path:
    """Fed-PE's seed-0 file ``seed_0.SUFFIX`` in the result folder ``out``."""
    return out / "runs" / "fedpe" / f"seed_0.{suffix}"
