"""The SuperLink and SuperNode processes: their command lines with safe defaults, Flower's quiet
environment, addresses, client ranges, TLS files and the SuperLink connection of ``flwr``.

``fedbandit superlink`` and ``fedbandit supernode`` build the plain Flower command lines
(``flower-superlink`` / ``flower-supernode``; print them with ``--print-command``) and run them
with an environment that keeps Flower quiet and local: no telemetry, no update check, no run-time
``uv sync``, Flower's state (``FLWR_HOME``) in a folder of our own, and a SuperLink database file
so that nodes survive a SuperLink restart. A SuperNode hosts one contiguous range of logical
clients (``--node-config "first-client=F num-clients=N"``), i.e. one client group.

Errors: what keeps a process from starting (a malformed address or client range, a missing TLS
file or key, TLS files and ``--insecure`` both or neither) raises
``fedbandit.errors.DeploymentError``; a combination of arguments this module does not support
raises ``ConfigError``.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from fedbandit.errors import ConfigError, DeploymentError

#: Flower phones home and installs dependencies unless told not to; set before Flower is used.
FLOWER_ENVIRONMENT = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}

DEFAULT_SUPERLINK_PORT = 9092
DEFAULT_SUPERNODE_PORT = 9094
#: Name of the SuperLink connection written to ``$FLWR_HOME/config.toml`` for ``flwr`` commands.
CONNECTION = "fedbandit"
#: What ``fedbandit superlink`` runs instead of ``flower-superlink`` (same arguments): Flower's
#: SuperLink with its SuperExec in the SuperLink's process group, reaping finished ServerApps
#: and stopping running ones when it stops (``fedbandit.flower.internals.superlink_main``).
SUPERLINK_LAUNCHER = (sys.executable, "-m", "fedbandit.flower.internals.superlink_main")
#: How often a SuperNode's SuperExec looks for a new ClientApp to start (Flower's default: 1 s).
TASK_POLL_SECONDS = "0.1"


def unreachable(address: str, timeout: float = 3.0) -> str | None:
    """Why nothing accepts TCP connections at ``HOST:PORT`` (e.g. "connection refused"), or None
    when something does."""
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as err:
        return (err.strerror or str(err) or type(err).__name__).lower()


def flower_environment(state_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for Flower processes: quiet, no installs, state under ``state_dir``, and
    this Python's ``bin`` first on PATH (Flower starts its helpers by name)."""
    env = dict(os.environ if base is None else base)
    env.update(FLOWER_ENVIRONMENT)
    env["FLWR_HOME"] = str(Path(state_dir).resolve() / "flwr-home")
    env["RAY_TMPDIR"] = str(Path(state_dir).resolve() / "ray")
    env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", TASK_POLL_SECONDS)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 as ``[::1]:PORT``) into its parts, with a clear error."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DeploymentError(f"expected HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


def parse_client_range(text: str) -> tuple[int, int]:
    """``"0-49"`` -> (first client, number of clients) = (0, 50); a single id ``"7"`` is (7, 1)."""
    first, sep, last = text.partition("-")
    try:
        lo, hi = int(first), int(last) if sep else int(first)
    except ValueError:
        raise DeploymentError(f"--clients expects FIRST-LAST (e.g. 0-49), got {text!r}") from None
    if lo < 0 or hi < lo:
        raise DeploymentError(f"--clients {text!r}: need 0 <= FIRST <= LAST")
    return lo, hi - lo + 1


@dataclass(frozen=True)
class ServerTls:
    """The SuperLink's TLS files: CA certificate, server certificate and its private key."""

    ca_certfile: Path
    certfile: Path
    keyfile: Path

    @staticmethod
    def from_dir(directory: Path) -> ServerTls:
        """The files ``fedbandit keys`` makes: ca.crt, server.pem, server.key."""
        tls = ServerTls(directory / "ca.crt", directory / "server.pem", directory / "server.key")
        for path in (tls.ca_certfile, tls.certfile, tls.keyfile):
            if not path.is_file():
                raise DeploymentError(f"TLS file {path} not found (make one with `fedbandit keys`)")
        return tls


def _security(insecure: bool, has_tls: bool, host: str, what: str) -> list[str]:
    if has_tls and insecure:
        raise DeploymentError(f"{what}: choose TLS files or --insecure, not both")
    if not has_tls and not insecure:
        raise DeploymentError(
            f"{what}: give TLS files (see `fedbandit keys`) or pass --insecure explicitly "
            "(plain HTTP, meant for loopback)"
        )
    if insecure and not is_loopback(host):
        print(
            f"fedbandit: warning: {what} without TLS on {host}: traffic is not encrypted",
            file=sys.stderr,
        )
    return ["--insecure"] if insecure else []


IN_MEMORY_DATABASE = ":flwr-in-memory:"
"""Flower's name for a SuperLink state that lives in memory only."""


def superlink_command(
    state_dir: Path,
    host: str = "127.0.0.1",
    port: int = DEFAULT_SUPERLINK_PORT,
    tls: ServerTls | None = None,
    insecure: bool = False,
    node_auth: bool = False,
    in_memory: bool = False,
) -> list[str]:
    """The ``flower-superlink`` command line (one port serves nodes, ``flwr`` and the ServerApp).

    The SuperLink keeps its state in ``state_dir/superlink.db`` so registered and connected nodes
    survive a SuperLink restart. ``in_memory`` uses Flower's ``:flwr-in-memory:`` store instead:
    rounds are faster (no SQLite writes per message) but a restart forgets every node, run and
    registered key."""
    command = ["flower-superlink", *_security(insecure, tls is not None, host, "SuperLink")]
    if tls is not None:
        command += [
            "--ssl-ca-certfile",
            str(tls.ca_certfile),
            "--ssl-certfile",
            str(tls.certfile),
            "--ssl-keyfile",
            str(tls.keyfile),
        ]
    if node_auth:
        if tls is None:
            raise DeploymentError(
                "SuperNode authentication needs TLS (Flower refuses it with HTTP)"
            )
        command.append("--enable-supernode-auth")
    command += [
        "--host",
        host,
        "--port",
        str(port),
        "--database",
        IN_MEMORY_DATABASE if in_memory else str(Path(state_dir).resolve() / "superlink.db"),
        "--disable-runtime-dependency-installation",
    ]
    return command


def supernode_command(
    superlink: str,
    clients: tuple[int, int],
    port: int = DEFAULT_SUPERNODE_PORT,
    root_certificates: Path | None = None,
    insecure: bool = False,
    auth_key: Path | None = None,
    state_dir: Path | None = None,
    fast_poll: bool = True,
    warm: bool = True,
) -> list[str]:
    """The ``flower-supernode`` command line for a node serving ``clients`` = (first, count).

    With ``state_dir`` the node's client statistics are also saved there after every message, so
    a restarted SuperNode resumes (see ``fedbandit.flower.apps``). With ``fast_poll`` Flower's
    SuperNode runs through ``fedbandit.flower.internals.supernode_main`` (shorter idle poll, same
    arguments). With ``warm`` (needs ``fast_poll``) that launcher also starts
    ``fedbandit.flower.internals.warm_executor``, which runs every ClientApp task in one warm
    process, and
    the SuperNode runs with ``--isolation process``; without it Flower starts a new
    ``flwr-clientapp`` process per message."""
    host, _ = split_address(superlink)
    if warm and not fast_poll:
        raise ConfigError(
            "the warm ClientApp executor runs through fedbandit's SuperNode launcher (fast_poll); "
            "plain flower-supernode starts a ClientApp process per message (warm=False)"
        )
    first, count = clients
    node_config = f"first-client={first} num-clients={count}"
    if state_dir is not None:
        node_config += f' state-dir="{Path(state_dir).resolve() / "clients"}"'
    launcher = (
        [sys.executable, "-m", "fedbandit.flower.internals.supernode_main"]
        if fast_poll
        else ["flower-supernode"]
    )
    if warm:
        launcher += ["--warm-executor", "--isolation", "process"]
    command = [*launcher, *_security(insecure, root_certificates is not None, host, "SuperNode")]
    if root_certificates is not None:
        command += ["--root-certificates", str(root_certificates)]
    if auth_key is not None:
        if not Path(auth_key).is_file():
            raise DeploymentError(f"node key {auth_key} not found (make one with `fedbandit keys`)")
        command += ["--auth-supernode-private-key", str(auth_key)]
    command += [
        "--superlink",
        superlink,
        "--port",
        str(port),
        "--node-config",
        node_config,
        "--max-wait-time",
        "600",
    ]
    return command


def write_connection(
    flwr_home: Path, superlink: str, insecure: bool, root_certificates: Path | None
) -> None:
    """``$FLWR_HOME/config.toml`` with the SuperLink connection the ``flwr`` commands use."""
    connection: dict[str, object] = {"address": superlink}
    if insecure:
        connection["insecure"] = True
    elif root_certificates is not None:
        connection["root-certificates"] = str(Path(root_certificates).resolve())
    else:
        raise DeploymentError("give --root-certificates (TLS) or --insecure for the SuperLink")
    flwr_home.mkdir(parents=True, exist_ok=True)
    text = tomli_w.dumps({"superlink": {"default": CONNECTION, CONNECTION: connection}})
    (flwr_home / "config.toml").write_text(text)
