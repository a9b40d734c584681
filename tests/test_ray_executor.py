"""The Ray executor: identical files to in-process runs, on a private local Ray instance and (slow)
on a real two-node Ray cluster started on this machine; retries of a killed worker; user errors.

Every Ray process a test starts is a descendant of this process or of a ``ray start --block``
process it started; each is stopped by its id (never ``ray stop``, which would stop every Ray
process on the machine, other people's included), and every temporary folder is removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fedbandit.config import load_experiment
from fedbandit.errors import ConfigError, DeploymentError
from fedbandit.executors import ray_executor
from fedbandit.executors.ray_executor import run_on_ray
from fedbandit.results.files import write_files
from fedbandit.runspec import RunSpec
from fedbandit.runtimes import local_seed_files

pytest.importorskip("ray")

RAY = Path(sys.executable).with_name("ray")


def tiny_tasks(seeds: int = 2, horizon: int = 256) -> list[RunSpec]:
    config = load_experiment(
        "fedpe_tiny", [f"horizon={horizon}", f"seeds={seeds}", "instance.num_clients=4"]
    )
    return [
        RunSpec(experiment=config, algorithm=algorithm, seed=seed)
        for algorithm in ("fedpe", "local_ucb")
        for seed in range(seeds)
    ]


def without_seconds(text: str) -> dict:
    info = json.loads(text)
    info.pop("seconds"), info.pop("compile_seconds")
    return info


def assert_same_as_local(run_dir: Path, tasks: list[RunSpec]) -> None:
    """Every file the executor wrote equals the in-process run's (the json without 'seconds')."""
    for spec in tasks:
        for relative, expected in local_seed_files(spec).items():
            written = (run_dir / relative).read_text()
            if relative.endswith(".json"):
                assert without_seconds(written) == without_seconds(expected), relative
            else:
                assert written == expected, relative
    assert not list(run_dir.rglob(".*.tmp*"))


def collect(run_dir: Path) -> tuple[list[RunSpec], object]:
    done: list[RunSpec] = []

    def on_done(spec: RunSpec, files: dict[str, str]) -> None:
        assert list(files)[-1].endswith(".json")
        write_files(run_dir, files)
        done.append(spec)

    return done, on_done


def test_local_ray_instance_writes_the_same_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks = tiny_tasks()
    done, on_done = collect(tmp_path)
    shown: list[RunSpec] = []
    made: list[str] = []  # this run's own folder: another worker may make its own fb-ray-*

    def record_temp_dir() -> str:
        made.append(make_temp_dir())
        return made[-1]

    make_temp_dir = ray_executor._private_temp_dir
    monkeypatch.setattr(ray_executor, "_private_temp_dir", record_temp_dir)
    run_on_ray(tasks, on_done, progress=shown.append)  # type: ignore[arg-type]
    assert sorted((s.algorithm, s.seed) for s in done) == sorted(
        (s.algorithm, s.seed) for s in tasks
    )
    assert shown == done
    assert_same_as_local(tmp_path, tasks)
    import ray

    assert not ray.is_initialized()
    assert len(made) == 1 and Path(made[0]).name.startswith("fb-ray-")
    assert not Path(made[0]).exists()  # the private temp folder is gone


def test_user_errors_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = tiny_tasks(seeds=1)[:1]
    with pytest.raises(ConfigError, match="not HOST:PORT"):
        run_on_ray(tasks, lambda spec, files: None, address="nonsense")
    with socket.socket() as probe:  # a free port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(DeploymentError, match=f"127.0.0.1:{port}.*ray start --head"):
        run_on_ray(tasks, lambda spec, files: None, address=f"127.0.0.1:{port}")
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    missing = r"needs ray, which is not installed: pip install 'fedbandit\[ray\]'"
    with pytest.raises(ConfigError, match=missing):
        run_on_ray(tasks, lambda spec, files: None)


def _descendants(root: int) -> dict[int, str]:
    """Processes below ``root`` and their command lines (Linux /proc)."""
    parents: dict[int, int] = {}
    lines: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            lines[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: dict[int, str] = {}
    for pid in parents:
        ancestor = parents.get(pid)
        while ancestor:
            if ancestor == root:
                found[pid] = lines[pid]
                break
            ancestor = parents.get(ancestor)
    return found


@dataclass
class WorkerKiller:
    """Kills, once, the Ray worker (a descendant of this process) that runs the named task."""

    title: str
    killed: list[int] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set() and not self.killed:
            for pid, line in _descendants(os.getpid()).items():
                if line.startswith(self.title):
                    os.kill(pid, signal.SIGKILL)
                    self.killed.append(pid)
                    return
            time.sleep(0.01)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_killed_worker_is_retried_then_reported(tmp_path: Path) -> None:
    tasks = tiny_tasks()[:2]  # fedpe seeds 0 and 1
    target = tasks[1]
    # Ray names a worker process after the task it runs: "ray::<task name>".
    title = f"ray::{ray_executor._task_name(target)}"

    killer = WorkerKiller(title)
    thread = threading.Thread(target=killer.run, daemon=True)
    thread.start()
    done, on_done = collect(tmp_path / "retried")
    try:
        run_on_ray(tasks, on_done, max_retries=2)  # type: ignore[arg-type]
    finally:
        killer.stop.set()
        thread.join()
    if not killer.killed:
        pytest.skip("the task finished before its worker could be found and killed")
    assert len(done) == len(tasks)
    assert_same_as_local(tmp_path / "retried", tasks)

    killer = WorkerKiller(title)
    thread = threading.Thread(target=killer.run, daemon=True)
    thread.start()
    done, on_done = collect(tmp_path / "failed")
    failure: DeploymentError | None = None
    try:
        run_on_ray([target], on_done, max_retries=0)  # type: ignore[arg-type]
    except DeploymentError as err:
        failure = err
    finally:
        killer.stop.set()
        thread.join()
    if failure is None and not killer.killed:  # a race the killer lost, as above
        pytest.skip("the task finished before its worker could be found and killed")
    assert killer.killed and failure is not None
    assert re.search(r"fedpe_tiny/fedpe/seed_1 failed .* 0 retries", str(failure))
    import ray

    assert not ray.is_initialized()


# --- a real two-node cluster on this machine (slow) ---------------------------------------------

#: Ray rewrites 127.0.0.1 (and localhost) to the host's network address when it starts a node that
#: may join a multi-node cluster (``services.resolve_ip_for_localhost``); another loopback address
#: is taken as given, so every node and the driver talk over loopback.
LOOPBACK = "127.0.0.2"


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@dataclass
class RayNode:
    process: subprocess.Popen
    log: Path
    temp_dir: Path


def _start_node(args: list[str], temp_dir: Path, env: dict[str, str]) -> RayNode:
    temp_dir.mkdir()
    log = temp_dir / "start.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                str(RAY),
                "start",
                *args,
                f"--node-ip-address={LOOPBACK}",
                "--num-cpus=1",
                "--disable-usage-stats",
                f"--temp-dir={temp_dir}",
                "--block",  # the node lives as long as this process: stopped by its id
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    node = RayNode(process, log, temp_dir)
    deadline = time.monotonic() + 120
    while "Ray runtime started" not in log.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"ray start {' '.join(args)} failed:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return node


def _stop_nodes(nodes: list[RayNode], root: Path) -> None:
    """SIGTERM each ``ray start --block`` (it stops its node's processes), then SIGKILL its
    process group and any process still naming our temp folder: all of them ours, by id."""
    for node in reversed(nodes):
        if node.process.poll() is None:
            node.process.send_signal(signal.SIGTERM)
    for node in reversed(nodes):
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.process.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.process.pid, signal.SIGKILL)
        node.process.wait(timeout=10)
    deadline = time.monotonic() + 15
    while True:
        left = [pid for pid, line in _all_commands().items() if str(root) in line]
        if not left or time.monotonic() > deadline:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    assert not left, f"Ray processes left behind: {left}"


def _all_commands() -> dict[int, str]:
    commands = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if line:
                commands[int(entry.name)] = line
    return commands


@pytest.fixture
def two_node_cluster() -> Iterator[tuple[str, list[RayNode]]]:
    if not RAY.exists():
        pytest.skip(f"no ray executable next to {sys.executable}")
    if not Path("/proc/self/stat").exists():
        pytest.skip("needs Linux /proc")
    try:
        port = _free_port(LOOPBACK)
    except OSError:
        pytest.skip(f"{LOOPBACK} is not a loopback address here")
    root = Path(tempfile.mkdtemp(prefix="fbrc-", dir="/tmp"))  # short: Ray's socket paths
    env = dict(
        os.environ,
        RAY_USAGE_STATS_ENABLED="0",
        RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0",
    )
    env.pop("RAY_ADDRESS", None)
    nodes: list[RayNode] = []
    try:
        nodes.append(
            _start_node(
                [
                    "--head",
                    f"--port={port}",
                    f"--ray-client-server-port={_free_port(LOOPBACK)}",
                    "--include-dashboard=false",
                ],
                root / "head",
                env,
            )
        )
        nodes.append(_start_node([f"--address={LOOPBACK}:{port}"], root / "node", env))
        yield f"{LOOPBACK}:{port}", nodes
    finally:
        _stop_nodes(nodes, root)
        shutil.rmtree(root, ignore_errors=True)


def _task_nodes(nodes: list[RayNode]) -> dict[str, set[str]]:
    """Task names each node's workers logged (Ray marks a task's log lines with its name)."""
    seen: dict[str, set[str]] = {}
    for node in nodes:
        names = set()
        for log in node.temp_dir.glob("session_*/logs/worker-*.out"):
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith(":task_name:"):
                    names.add(line.removeprefix(":task_name:"))
        seen[node.temp_dir.name] = names
    return seen


@pytest.mark.slow
def test_two_node_cluster_writes_the_same_files(
    tmp_path: Path, two_node_cluster: tuple[str, list[RayNode]]
) -> None:
    address, nodes = two_node_cluster
    tasks = tiny_tasks(seeds=3)
    alive: list[int] = []
    done, write = collect(tmp_path)

    def on_done(spec: RunSpec, files: dict[str, str]) -> None:
        import ray

        alive.append(sum(1 for node in ray.nodes() if node["Alive"]))
        write(spec, files)  # type: ignore[operator]

    run_on_ray(tasks, on_done, address=address)
    assert len(done) == len(tasks)
    assert set(alive) == {2}
    assert_same_as_local(tmp_path, tasks)
    names = {ray_executor._task_name(spec) for spec in tasks}
    ran = _task_nodes(nodes)
    assert set().union(*ran.values()) >= names, ran
    assert all(ran[node] & names for node in ran), f"a node ran no task: {ran}"
    # the cluster stays up for its owner: the driver only disconnected
    assert all(node.process.poll() is None for node in nodes)
