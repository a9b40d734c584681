"""Start a real Flower deployment (SuperLink + SuperNodes) for tests, and always stop it.

Every process runs in its own session; ``Deployment.close`` terminates each process group (SIGTERM,
then SIGKILL) and is called by the fixture even when the test fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

FEDBANDIT = [sys.executable, "-m", "fedbandit.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout} s")


@dataclass
class Deployment:
    """Processes of one test deployment; ``wrap`` turns an argv into the launched argv (for
    example ``ip netns exec NAME ...``)."""

    root: Path
    #: How ``fedbandit`` is started: this interpreter's by default, or an installed command.
    command: list[str] = field(default_factory=lambda: list(FEDBANDIT))
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(
        self,
        name: str,
        argv: Sequence[str],
        wrap: Callable[[list[str]], list[str]] | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        command = wrap(list(argv)) if wrap else list(argv)
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            cwd=self.root,
        )
        log.close()
        self.processes[name] = process
        return process

    def superlink(
        self,
        port: int,
        *extra: str,
        host: str = "127.0.0.1",
        wrap=None,
        env: dict[str, str] | None = None,
    ) -> str:
        self.start(
            "superlink",
            [
                *self.command,
                "superlink",
                "--host",
                host,
                "--port",
                str(port),
                "--state-dir",
                str(self.root / "superlink"),
                *extra,
            ],
            wrap,
            env,
        )
        return f"{host}:{port}"

    def supernode(
        self,
        name: str,
        superlink: str,
        clients: str,
        port: int,
        *extra: str,
        wrap=None,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen:
        return self.start(
            name,
            [
                *self.command,
                "supernode",
                "--superlink",
                superlink,
                "--clients",
                clients,
                "--port",
                str(port),
                "--state-dir",
                str(self.root / name),
                *extra,
            ],
            wrap,
            env,
        )

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        process = self.processes[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        process.wait(timeout=10)

    def close(self) -> None:
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)

    def logs(self) -> str:
        """The end of every log, for a failing assertion's message."""
        return "\n".join(
            f"--- {name} ---\n" + "\n".join(self.log(name).splitlines()[-15:])
            for name in self.processes
        )


def start_loopback(
    deploy: Deployment,
    ranges: list[str],
    *node_args: str,
    link_args: Sequence[str] = (),
    link_env: dict[str, str] | None = None,
    node_env: dict[str, str] | None = None,
) -> str:
    """An insecure SuperLink on a free loopback port (with ``link_args``, e.g. ``--in-memory``,
    and ``link_env`` in its environment) and one SuperNode per client range (``node_env``)."""
    port = free_port()
    superlink = deploy.superlink(port, "--insecure", *link_args, env=link_env)
    wait_for_port("127.0.0.1", port)
    for i, clients in enumerate(ranges):
        deploy.supernode(
            f"node{i}", superlink, clients, free_port(), "--insecure", *node_args, env=node_env
        )
    return superlink


def wait_for_rounds(deploy: Deployment, node: str, rounds: int, timeout: float = 120) -> None:
    """Until ``node`` has received ``rounds`` round messages in all (its log says so)."""
    deadline = time.monotonic() + timeout
    while deploy.log(node).count("Receiving: train.step") < rounds:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{node} got fewer than {rounds} rounds:\n{deploy.logs()}")
        time.sleep(0.2)


def live_commands() -> list[str]:
    """The command lines of this machine's live processes (zombies left out)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(command)
    return found


@contextlib.contextmanager
def tcp_forwarder(target: tuple[str, int]) -> Iterator[str]:
    """A TCP forwarder on a free loopback port to ``target`` (HOST, PORT), standing for an SSH
    tunnel (``ssh -L PORT:HOST:PORT``): yields its ``127.0.0.1:PORT``; every connection is
    piped both ways until either side closes. Stopped (and its connections closed) on exit."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()
    open_sockets: list[socket.socket] = []

    def pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def serve() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            open_sockets.extend([client, upstream])
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    thread = threading.Thread(target=serve, name="tcp-forwarder", daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()
        for sock in open_sockets:
            with contextlib.suppress(OSError):
                sock.close()


def deployment_closed_after(root: Path) -> Iterator[Deployment]:
    """A ``Deployment`` in ``root``, closed when the caller (a pytest fixture) is done with it."""
    deploy = Deployment(root)
    try:
        yield deploy
    finally:
        deploy.close()
