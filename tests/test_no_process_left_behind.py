"""Issue 39, item 3: a SuperNode killed at any point of a run leaves no process behind.

A SuperLink and four warm SuperNodes (``fedbandit supernode``: Flower's SuperNode plus fedbandit's
warm ClientApp executor, its child). A plain DisLinUCB run and then a secure one (SecAgg+'s four
stages per sync) run as ``fedbandit run`` processes; in each, one SuperNode process is SIGKILLed
(the process alone, not its group: its executor is orphaned, as when a node's launcher dies) after
a seeded random number of messages and a seeded random delay, so the kills land in different
places of a task (pulling the message, running the ClientApp, pushing the reply, idle). Every
process of the node must be gone within a few seconds: its children and descendants as they were
before the kill, and any live process whose command line names the node (its runtime API port,
or its pid as ``--parent-pid``: a process reparented to init).

Slow tier: about 30 s.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest
from flower_deploy import FEDBANDIT, Deployment, free_port, wait_for_port

pytestmark = pytest.mark.slow

#: Seconds a killed node's processes may outlive it: the executor notices its parent within
#: 0.2 s and ends within its grace period (``warm_executor.STOP_GRACE_SECONDS``, 5 s) at worst.
OUTLIVE_SECONDS = 7.0
EXPERIMENT = [
    "contextual_tiny", "--seeds", "1", "--quiet", "--algorithms", "dislinucb",
    "--set", "instance.num_clients=8", "--set", "horizon=400",
    "--on-client-failure", "drop", "--round-timeout", "10", "--steps-per-round", "1",
]  # fmt: skip


def _proc() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, state, command line) of every process on this machine."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        found[int(entry.name)] = (int(stat[1]), stat[0], command)
    return found


def descendants(pid: int) -> set[int]:
    table = _proc()
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, (parent, _, _) in table.items() if parent in frontier} - found
        found |= frontier
    return found


def node_processes(pid: int, port: int, tree: set[int]) -> list[str]:
    """Live (not zombie) processes of the node whose launcher was ``pid``: those of ``tree``
    (its descendants before it was killed) and any naming its runtime API port or its pid."""
    names = (f":{port} ", f"--port {port} ", f"--parent-pid {pid} ")
    return [
        f"{p} (parent {parent}): {command}"
        for p, (parent, state, command) in _proc().items()
        if state != "Z" and (p == pid or p in tree or any(name in f"{command} " for name in names))
    ]


def kill_node_after(
    deploy: Deployment, name: str, port: int, messages: int, delay: float, timeout: float = 60
) -> float:
    """SIGKILL node ``name`` (its process only) once its log shows ``messages`` received
    messages, ``delay`` s later; the seconds its last process outlived it."""
    process = deploy.processes[name]
    deadline = time.monotonic() + timeout
    messages += deploy.log(name).count("Receiving: ")  # those of earlier runs do not count
    while deploy.log(name).count("Receiving: ") < messages:
        assert time.monotonic() < deadline, f"{name} got fewer than {messages}:\n{deploy.logs()}"
        assert process.poll() is None, deploy.log(name)
        time.sleep(0.02)
    time.sleep(delay)
    tree = descendants(process.pid)
    assert tree, f"{name} has no executor child"
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
    killed = time.monotonic()
    while left := node_processes(process.pid, port, tree):
        assert time.monotonic() - killed < OUTLIVE_SECONDS, (
            f"{name}'s processes outlived it by {OUTLIVE_SECONDS} s: {left}\n"
            + deploy.log(name)[-3000:]
        )
        time.sleep(0.05)
    return time.monotonic() - killed


def start_run(deploy: Deployment, name: str, superlink: str, *extra: str) -> None:
    out = str(deploy.root / name)
    deploy.start(name, [*FEDBANDIT, "run", *EXPERIMENT, "--runtime", "flower",
                        "--superlink", superlink, "--insecure", "--out", out, *extra])  # fmt: skip


def test_a_killed_supernode_leaves_no_process_behind(tmp_path):
    rng = random.Random(39)
    deploy = Deployment(tmp_path)
    ranges = ["0-1", "2-3", "4-5", "6-7"]
    try:
        link = free_port()
        superlink = deploy.superlink(link, "--insecure")
        wait_for_port("127.0.0.1", link, timeout=60)
        ports = {f"node{i}": free_port() for i in range(len(ranges))}
        for (name, port), clients in zip(ports.items(), ranges, strict=True):
            deploy.supernode(name, superlink, clients, port, "--insecure")
        outlived = []
        # a plain run: node0 killed after 2-12 messages (hello, then one per round)
        start_run(deploy, "plain", superlink)
        outlived.append(
            kill_node_after(deploy, "node0", ports["node0"], rng.randint(2, 12), rng.random() / 4)
        )
        deploy.kill("plain", signal.SIGTERM)
        # a secure run on the three others and a new node0: node1 killed after 6-24 messages
        # (SecAgg+ sends four per sync), in any stage
        ports["node4"] = free_port()
        deploy.supernode("node4", superlink, ranges[0], ports["node4"], "--insecure")
        start_run(deploy, "secure", superlink, "--secure-aggregation")
        outlived.append(
            kill_node_after(deploy, "node1", ports["node1"], rng.randint(6, 24), rng.random() / 4)
        )
        assert "Receiving: train message" in deploy.log("node1")  # a SecAgg+ stage
        print(f"the killed nodes' processes outlived them by {outlived} s")
    finally:
        deploy.close()
    left = [c for p, (_, s, c) in _proc().items() if s != "Z" and str(tmp_path) in c]
    assert not left, left
    for port in ports.values():
        assert not node_processes(-1, port, set()), port
