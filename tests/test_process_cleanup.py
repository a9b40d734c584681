"""No Flower process of a run outlives it: after a run ends (cleanly, or with its ``fedbandit run``
SIGTERMed mid-run) no ServerApp, nor ClientApp of a cold SuperNode (``--cold``: Flower's SuperExec
starts one per message), is left, running or as a zombie, while the SuperLink and SuperNodes go on;
after the deployment stops mid-run no SuperLink, SuperExec, ServerApp, SuperNode or ClientApp
executor of it is left. The SuperExec that Flower's SuperLink starts runs in a session of its
own, and a ServerApp whose SuperExec is gone retries the SuperLink for minutes: stopping the
SuperLink's process group alone does not stop them.

Slow tier: about 100 s (4 min on a loaded machine).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from flower_deploy import FEDBANDIT, Deployment, free_port, start_loopback, wait_for_rounds

pytestmark = pytest.mark.slow

#: Seconds a process of a run may outlive the run's end or the deployment's stop (measured: 0 s
#: after a clean end, 3-10 s after a SIGTERM to `fedbandit run` on a loaded machine, while its
#: ServerApp notices the stopped run).
OUTLIVE_SECONDS = 20.0
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


def task_processes(
    deploy: Deployment, names: tuple[str, ...] = ("superlink", "node1")
) -> list[str]:
    """The ServerApps and ClientApps (running or zombie) under the SuperLink and the cold node."""
    table = _processes()
    tree = _descendants({deploy.processes[name].pid for name in names}, table)
    return [
        f"{pid} {table[pid][1]} {table[pid][2]}"
        for pid in tree
        if table[pid][2] in FLOWER_NAMES[2:] or any(n in table[pid][3] for n in FLOWER_NAMES[2:])
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
        superlink = start_loopback(deploy, ["0-1"])  # a warm node, and a cold one:
        deploy.supernode("node1", superlink, "2-3", free_port(), "--insecure", "--cold")
        ports = [
            a for name in ("node0", "node1") for a in deploy.processes[name].args if a.isdigit()
        ]
        marks = (str(tmp_path), f"{superlink} ", *(f"127.0.0.1:{p} " for p in ports))

        def run(name: str, horizon: int) -> None:
            deploy.start(name, [*FEDBANDIT, "run", *EXPERIMENT, "--set", f"horizon={horizon}",
                                "--runtime", "flower", "--superlink", superlink, "--insecure",
                                "--out", str(tmp_path / name)])  # fmt: skip

        def remember() -> None:
            table = _processes()
            seen.update(_descendants({p.pid for p in deploy.processes.values()}, table))

        # a clean end: the ServerApp and ClientApps are gone (no zombie either) while the
        # SuperLink and the SuperNodes run on
        run("clean", 256)
        deadline = time.monotonic() + 600
        while deploy.processes["clean"].poll() is None:
            assert time.monotonic() < deadline, deploy.logs()
            remember()
            time.sleep(0.2)
        assert deploy.processes["clean"].returncode == 0, deploy.log("clean")
        took = wait_until_none(
            lambda: task_processes(deploy),
            "a finished run's ServerApp or ClientApp is left",
            deploy,
        )
        print(f"a finished run's ServerApp and ClientApps were gone {took:.1f} s after the run")

        def mid_run(name: str, rounds: int) -> None:
            """A long run ``name`` started and ``rounds`` rounds into it, its processes noted."""
            run(name, 100_000)
            seen_rounds = deploy.log("node0").count("Receiving: train.step")
            wait_for_rounds(deploy, "node0", rounds + seen_rounds, timeout=300)
            remember()
            assert task_processes(deploy, ("superlink",)), "no ServerApp while the run goes on"

        # SIGTERM to `fedbandit run` mid-run: it stops the Flower run, and its ServerApp ends
        mid_run("stopped", 3)
        os.kill(deploy.processes["stopped"].pid, signal.SIGTERM)
        deploy.processes["stopped"].wait(timeout=120)
        took = wait_until_none(
            lambda: task_processes(deploy), "a stopped run's ServerApp or ClientApp is left", deploy
        )
        print(f"a stopped run's ServerApp and ClientApps were gone {took:.1f} s after its driver")

        # a third run stopped with the deployment, mid-run
        mid_run("cut", 1)
    finally:
        deploy.close()
    took = wait_until_none(
        lambda: leftovers(marks, seen), "processes outlive the deployment", deploy
    )
    print(f"the deployment's last process was gone {took:.1f} s after it was stopped")
