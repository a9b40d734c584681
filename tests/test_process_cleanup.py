"""No Flower process of a run outlives it: after a run ends (cleanly, or with its ``fedbandit run``
SIGTERMed mid-run) no ServerApp is left, running or as a zombie, while the SuperLink goes on; after
the deployment stops no SuperLink, SuperExec, ServerApp, SuperNode or ClientApp executor of it is
left. The SuperExec that Flower's SuperLink starts runs in a session of its own, and a ServerApp
whose SuperExec is gone retries the SuperLink for minutes: stopping the SuperLink's process group
alone does not stop them.

Slow tier: about 40 s.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from flower_deploy import FEDBANDIT, Deployment, start_loopback, wait_for_rounds

pytestmark = pytest.mark.slow

#: Seconds a process of a run may outlive the run's end or the deployment's stop.
OUTLIVE_SECONDS = 12.0
#: Flower's process names (``/proc/PID/comm``: a zombie has no command line left).
FLOWER_NAMES = ("flower-superlin", "flower-superexe", "flwr-serverapp", "flwr-clientapp")
EXPERIMENT = [
    "fedpe_tiny", "--seeds", "1", "--quiet", "--set", "instance.num_clients=4",
    "--set", 'algorithms=["fedpe"]',
]  # fmt: skip


def _processes() -> dict[int, tuple[int, str, str, str]]:
    """pid -> (parent pid, state, name, command line) of every process on this machine."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            head, tail = (entry / "stat").read_text().rsplit(")", 1)
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        fields = tail.split()
        found[int(entry.name)] = (int(fields[1]), fields[0], head.split("(", 1)[1], command)
    return found


def _descendants(roots: set[int], table: dict[int, tuple[int, str, str, str]]) -> set[int]:
    found, frontier = set(), set(roots)
    while frontier:
        frontier = {pid for pid, (parent, *_) in table.items() if parent in frontier} - found
        found |= frontier
    return found


def serverapps(deploy: Deployment) -> list[str]:
    """The ServerApps (running or zombie) under the SuperLink's process."""
    table = _processes()
    tree = _descendants({deploy.processes["superlink"].pid}, table)
    return [
        f"{pid} {table[pid][1]} {table[pid][2]}"
        for pid in tree
        if table[pid][2] == "flwr-serverapp" or "flwr-serverapp" in table[pid][3]
    ]


def leftovers(marks: tuple[str, ...], seen: set[int]) -> list[str]:
    """Live or zombie processes naming one of ``marks`` (the deployment's folder, the
    SuperLink's address, a node's port) in their command line, or one of ``seen`` (every
    descendant the deployment had) that is a Flower process."""
    found = []
    for pid, (_, state, name, command) in _processes().items():
        if pid == os.getpid():
            continue
        if any(mark in f"{command} " for mark in marks) or (
            pid in seen and (name in FLOWER_NAMES or "fedbandit" in command)
        ):
            found.append(f"{pid} {state} {name}: {command[:200]}")
    return found


def wait_until_none(what, describe: str, deploy: Deployment) -> float:
    """Poll ``what()`` until it is empty; fail after ``OUTLIVE_SECONDS``. Seconds it took."""
    started = time.monotonic()
    while left := what():
        assert time.monotonic() - started < OUTLIVE_SECONDS, (
            f"{describe} after {OUTLIVE_SECONDS} s: {left}\n{deploy.logs()}"
        )
        time.sleep(0.1)
    return time.monotonic() - started


def test_no_process_of_a_run_outlives_it_nor_the_deployment(tmp_path):
    deploy = Deployment(tmp_path)
    seen: set[int] = set()
    try:
        superlink = start_loopback(deploy, ["0-1", "2-3"])
        ports = [arg for arg in deploy.processes["node0"].args if arg.isdigit()]
        marks = (str(tmp_path), f"{superlink} ", *(f"127.0.0.1:{p} " for p in ports))

        def run(name: str, horizon: int) -> None:
            deploy.start(name, [*FEDBANDIT, "run", *EXPERIMENT, "--set", f"horizon={horizon}",
                                "--runtime", "flower", "--superlink", superlink, "--insecure",
                                "--out", str(tmp_path / name)])  # fmt: skip

        def remember() -> None:
            table = _processes()
            seen.update(_descendants({p.pid for p in deploy.processes.values()}, table))

        # a clean end: the ServerApp is gone (no zombie either) while the SuperLink runs on
        run("clean", 256)
        deadline = time.monotonic() + 300
        while deploy.processes["clean"].poll() is None:
            assert time.monotonic() < deadline, deploy.logs()
            remember()
            time.sleep(0.2)
        assert deploy.processes["clean"].returncode == 0, deploy.log("clean")
        wait_until_none(lambda: serverapps(deploy), "a finished run's ServerApp is left", deploy)

        # SIGTERM to `fedbandit run` mid-run: it stops the Flower run, and its ServerApp ends
        run("stopped", 100_000)
        wait_for_rounds(deploy, "node0", 3 + deploy.log("node0").count("Receiving: train.step"))
        remember()
        assert serverapps(deploy), "no ServerApp while the run goes on"
        os.kill(deploy.processes["stopped"].pid, signal.SIGTERM)
        deploy.processes["stopped"].wait(timeout=120)
        wait_until_none(lambda: serverapps(deploy), "a stopped run's ServerApp is left", deploy)

        # a third run stopped with the deployment, mid-run
        run("cut", 100_000)
        wait_for_rounds(deploy, "node0", 3 + deploy.log("node0").count("Receiving: train.step"))
        remember()
    finally:
        deploy.close()
    wait_until_none(lambda: leftovers(marks, seen), "processes outlive the deployment", deploy)
