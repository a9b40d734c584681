"""Faults of a real Flower deployment across a whole ``fedbandit run`` (every algorithm and seed):
a node lost under ``abort`` and under ``drop``, the SuperLink killed, ``fedbandit run`` stopped
with SIGTERM, and misconfigured client ranges. Each runs ``fedbandit run`` as a process, as a user
would, and checks the exit code, that standard error holds one clear message and no traceback,
what the manifest records, and that no Flower process is left behind.

Slow tier (``make test-slow``): a few seconds per round. Every process is stopped by the fixture
even when a test fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from flower_deploy import (
    FEDBANDIT,
    deployment_closed_after,
    free_port,
    live_commands,
    start_loopback,
    wait_for_port,
    wait_for_rounds,
)

from fedbandit.results.files import read_json

pytestmark = pytest.mark.slow

#: A tiny Fed-PE run: 6 clients, T = 256 (about 10 rounds).
TINY = ["--set", "instance.num_clients=6", "--set", "horizon=256", "--quiet"]
TWO_ALGORITHMS = ["--set", 'algorithms=["fedpe", "fedpe_enhanced"]']


@pytest.fixture
def deployment(tmp_path):
    yield from deployment_closed_after(tmp_path)
    assert not flower_processes(tmp_path), "Flower processes outlived the test"


def flower_processes(root: Path) -> list[str]:
    """Command lines of live processes (not zombies) that mention ``root``, the test folder."""
    return [command for command in live_commands() if str(root) in command]


def serverapp_processes(port: int) -> list[str]:
    """Live ``flwr-serverapp`` processes connected to the SuperLink on ``port``."""
    return [
        command
        for command in live_commands()
        if "flwr-serverapp" in command and f"127.0.0.1:{port} " in f"{command} "
    ]


def start_run(tmp_path: Path, superlink: str, *argv: str) -> subprocess.Popen:
    """``fedbandit run fedpe_tiny ... --runtime flower`` as a process; output in run.out/run.err."""
    command = [
        *FEDBANDIT, "run", "fedpe_tiny", *TINY, "--runtime", "flower", "--superlink", superlink,
        "--insecure", "--out", str(tmp_path / "out"), *argv,
    ]  # fmt: skip
    return subprocess.Popen(
        command,
        stdout=open(tmp_path / "run.out", "wb"),
        stderr=open(tmp_path / "run.err", "wb"),
        start_new_session=True,
        cwd=tmp_path,
    )


def finish(process: subprocess.Popen, tmp_path: Path, timeout: float) -> tuple[int, str]:
    """The exit code and standard error of a run started with ``start_run``."""
    try:
        code = process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return code, (tmp_path / "run.err").read_text(errors="replace")


def assert_one_clear_message(stderr: str, *words: str) -> None:
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("fedbandit: error:")]
    assert len(errors) == 1, stderr
    for word in words:
        assert word in errors[0], stderr


def test_lost_node_under_abort_ends_the_whole_command(deployment, tmp_path):
    """Two algorithms x two seeds; a node is SIGKILLed in the first seed. The seed is aborted
    after one round timeout and the command ends at once with exit 3: no later seed waits for
    the dead node; the manifest lists the aborted seed with its reason and the runs not done."""
    superlink = start_loopback(deployment, ["0-1", "2-3", "4-5"])
    run = start_run(tmp_path, superlink, *TWO_ALGORITHMS, "--seeds", "2", "--round-timeout", "20")
    wait_for_rounds(deployment, "node2", 3)
    deployment.kill("node2")
    killed = time.monotonic()
    code, stderr = finish(run, tmp_path, timeout=180)
    assert code == 3, stderr + deployment.logs()
    assert time.monotonic() - killed < 75, "the command waited for the dead node"
    assert_one_clear_message(stderr, "4-5", "abort")
    manifest = read_json(tmp_path / "out" / "manifest.json")
    assert manifest["status"] == "incomplete"
    assert list(manifest["aborted_seeds"]) == ["fedpe/seed_0"]
    assert "4-5" in manifest["aborted_seeds"]["fedpe/seed_0"]
    assert set(manifest["missing_runs"]) == {
        "fedpe/seed_1", "fedpe_enhanced/seed_0", "fedpe_enhanced/seed_1",
    }  # fmt: skip
    assert "4-5" in manifest["stopped"]
    assert (tmp_path / "out" / "summary.json").is_file()
    # The aborted seed keeps the results so far: the survivors' regret, short of the horizon.
    seed = tmp_path / "out" / "runs" / "fedpe"
    info = read_json(seed / "seed_0.json")
    assert info["status"] == "aborted"
    assert "4-5" in info["failure"] and "no reply" in info["failure"]
    clients = pd.read_csv(seed / "seed_0.clients.csv")
    assert clients["client_id"].tolist() == [0, 1, 2, 3]
    assert (clients["pulls"] < 256).all()


def test_lost_node_under_drop_later_runs_use_the_live_nodes(deployment, tmp_path):
    """A node is SIGKILLed in the first run and a replacement serving its clients is started:
    the first run goes on without the lost clients; the next algorithm starts on the live nodes
    (the dead one, still listed by the SuperLink, is ignored) and is identical to a local run."""
    local = tmp_path / "local"
    experiment = ["fedpe_tiny", *TINY, *TWO_ALGORITHMS, "--seeds", "1"]
    subprocess.run([*FEDBANDIT, "run", *experiment, "--out", str(local)], check=True)
    superlink = start_loopback(deployment, ["0-1", "2-3", "4-5"])
    run = start_run(
        tmp_path, superlink, *TWO_ALGORITHMS, "--seeds", "1", "--round-timeout", "20",
        "--on-client-failure", "drop",
    )  # fmt: skip
    wait_for_rounds(deployment, "node2", 3)
    deployment.kill("node2")
    deployment.supernode("node2b", superlink, "4-5", free_port(), "--insecure")
    code, stderr = finish(run, tmp_path, timeout=300)
    assert code == 0, stderr + deployment.logs()
    assert "Traceback" not in stderr
    out = tmp_path / "out"
    manifest = read_json(out / "manifest.json")
    assert manifest["status"] == "complete"
    assert list(manifest["dropped_clients"]) == ["fedpe/seed_0"]
    assert set(manifest["dropped_clients"]["fedpe/seed_0"]) == {"4", "5"}
    # The first run finished without the lost clients and addressed no message to them after.
    seed = out / "runs" / "fedpe"
    info = read_json(seed / "seed_0.json")
    assert info["status"] == "complete"
    assert set(info["dropped"]) == {"4", "5"}
    assert info["dropped"] == manifest["dropped_clients"]["fedpe/seed_0"]
    clients = pd.read_csv(seed / "seed_0.clients.csv")
    assert clients["client_id"].tolist() == [0, 1, 2, 3]
    assert (clients["pulls"] == 256).all()
    comm = pd.read_csv(seed / "seed_0.comm.csv")
    assert comm[comm["direction"] == "downlink"].iloc[-1]["messages"] <= 4
    for suffix in ("regret", "comm", "clients"):
        name = f"runs/fedpe_enhanced/seed_0.{suffix}.csv"
        pd.testing.assert_frame_equal(pd.read_csv(local / name), pd.read_csv(out / name))


def test_lost_node_under_drop_without_a_replacement(deployment, tmp_path):
    """A node is SIGKILLed in the first of two seeds and nothing replaces it: the first seed
    goes on without its clients, the second starts at once on the live nodes without them (not
    after the 120 s --start-deadline) and completes; exit 0, and both seeds' records name the
    clients dropped and the round (issue 40, item 5). An in-memory SuperLink: shorter rounds."""
    superlink = start_loopback(deployment, ["0-1", "2-3", "4-5"], link_args=["--in-memory"])
    run = start_run(
        tmp_path, superlink, "--seeds", "2", "--set", 'algorithms=["fedpe"]',
        "--round-timeout", "10", "--on-client-failure", "drop",
    )  # fmt: skip
    wait_for_rounds(deployment, "node2", 3)
    deployment.kill("node2")
    killed = time.monotonic()
    code, stderr = finish(run, tmp_path, timeout=240)
    assert code == 0, stderr + deployment.logs()
    assert time.monotonic() - killed < 110, "the second seed waited for the lost clients"
    assert "Traceback" not in stderr
    out = tmp_path / "out"
    manifest = read_json(out / "manifest.json")
    assert manifest["status"] == "complete"
    assert set(manifest["dropped_clients"]) == {"fedpe/seed_0", "fedpe/seed_1"}
    second = read_json(out / "runs" / "fedpe" / "seed_1.json")
    assert second["status"] == "complete" and second["dropped"] == {"4": 0, "5": 0}
    assert "clients 4-5: lost in an earlier seed of this command" in second["failure"]
    clients = pd.read_csv(out / "runs" / "fedpe" / "seed_1.clients.csv")
    assert clients["client_id"].tolist() == [0, 1, 2, 3]
    assert (clients["pulls"] == 256).all()
    shown = (tmp_path / "run.out").read_text()
    assert "fedpe/seed_1 went on without clients [4, 5]" in shown, shown


def test_superlink_killed_mid_run(deployment, tmp_path):
    """SIGKILL of the SuperLink process alone: ``fedbandit run`` says the SuperLink is
    unreachable (exit 3, folder incomplete), the ServerApp it ran does not retry forever, and
    after the SuperLink restarts (same database) the same SuperNode serves a new run."""
    superlink = start_loopback(deployment, ["0-5"])
    port = int(superlink.rsplit(":", 1)[1])
    run = start_run(tmp_path, superlink, "--seeds", "1", "--set", 'algorithms=["fedpe"]')
    wait_for_rounds(deployment, "node0", 3)
    os.kill(deployment.processes["superlink"].pid, signal.SIGKILL)
    deployment.processes["superlink"].wait(timeout=10)
    code, stderr = finish(run, tmp_path, timeout=120)
    assert code == 3, stderr
    assert_one_clear_message(stderr, "SuperLink", "unreachable")
    manifest = read_json(tmp_path / "out" / "manifest.json")
    assert manifest["status"] == "incomplete" and "unreachable" in manifest["stopped"]
    deadline = time.monotonic() + 60
    while serverapp_processes(port) and time.monotonic() < deadline:
        time.sleep(1)
    assert not serverapp_processes(port), "the ServerApp outlived its SuperLink"

    deployment.superlink(port, "--insecure")
    wait_for_port("127.0.0.1", port)
    again = tmp_path / "again"
    again.mkdir()
    run = start_run(
        again, superlink, "--seeds", "1", "--set", 'algorithms=["fedpe"]',
        "--start-deadline", "120",
    )  # fmt: skip
    code, stderr = finish(run, again, timeout=400)
    assert code == 0, stderr + deployment.logs()
    # A node that had taken a task of the dead run when the SuperLink died gives up on it within
    # OBJECT_PULL_SECONDS (test_warm_executor.py); here it depends on when the kill lands.


def test_sigterm_stops_the_flower_run(deployment, tmp_path):
    """SIGTERM to ``fedbandit run`` mid-seed: it stops its Flower run, says so, marks the folder
    incomplete, and the ServerApp writes nothing into --out afterwards."""
    superlink = start_loopback(deployment, ["0-2", "3-5"])
    port = int(superlink.rsplit(":", 1)[1])
    run = start_run(tmp_path, superlink, "--seeds", "1", "--set", 'algorithms=["fedpe"]')
    wait_for_rounds(deployment, "node0", 3)
    os.kill(run.pid, signal.SIGTERM)
    code, stderr = finish(run, tmp_path, timeout=90)
    assert code == 130, stderr
    assert "Traceback" not in stderr
    assert "stopped Flower run" in stderr, stderr
    out = tmp_path / "out"
    assert read_json(out / "manifest.json")["status"] == "incomplete"
    deadline = time.monotonic() + 30
    while serverapp_processes(port) and time.monotonic() < deadline:
        time.sleep(1)
    assert not serverapp_processes(port), "the stopped run's ServerApp is still running"
    assert not list((out / "runs").glob("*/seed_0.json")), "a stopped run wrote its results"


def test_misconfigured_client_ranges_are_one_line_errors(deployment, tmp_path):
    """Overlapping ranges name both nodes; an unserved range names its clients. One line each,
    no traceback, nonzero exit, and the SuperNodes stay up for the next run."""
    superlink = start_loopback(deployment, ["0-3", "2-5"])
    run = start_run(tmp_path, superlink, "--seeds", "1", "--set", 'algorithms=["fedpe"]')
    code, stderr = finish(run, tmp_path, timeout=120)
    assert code != 0
    assert_one_clear_message(stderr, "clients 2-3", "served by two nodes")
    assert stderr.count("node ") >= 2

    deployment.kill("node1", signal.SIGTERM)  # a SIGTERMed node leaves the SuperLink's list
    second = tmp_path / "second"
    second.mkdir()
    run = start_run(
        second, superlink, "--seeds", "1", "--set", 'algorithms=["fedpe"]', "--start-deadline",
        "15",
    )  # fmt: skip
    code, stderr = finish(run, second, timeout=120)
    assert code != 0
    assert_one_clear_message(stderr, "clients 4-5", "no node serves")
