"""The processes of a deployment on this machine, as /proc shows them: process trees, their
resident memory (VmRSS) sampled in a thread, the machine's busy CPU seconds, and SIGTERM turned
into ``KeyboardInterrupt`` so that a benchmark's ``finally`` blocks stop what it started."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

#: Seconds between two samples of ``RssSampler``.
SAMPLE_SECONDS = 0.2


def children_map() -> dict[int, list[int]]:
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
    children = children_map() if children is None else children
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


def is_running(pid: int) -> bool:
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
        children = children_map()
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
