"""Flower deployments: start a SuperLink or SuperNode with safe defaults; submit and await a seed.

``fedbandit superlink`` and ``fedbandit supernode`` build the plain Flower command lines
(``flower-superlink`` / ``flower-supernode``; print them with ``--print-command``) and run them
with an environment that keeps Flower quiet and local: no telemetry, no update check, no run-time
``uv sync``, Flower's state (``FLWR_HOME``) in a folder of our own, and a SuperLink database file
so that nodes survive a SuperLink restart. A SuperNode hosts one contiguous range of logical
clients (``--node-config "first-client=F num-clients=N"``), i.e. one client group.

Submitting uses Flower's own CLI (``flwr run``) on the Flower App in ``flwr_app/`` with a run-config
file carrying the job; ``flwr run`` exits 0 even when the ServerApp fails, so the outcome is read
from ``flwr ls --run-id``.

Errors: a deployment that cannot start or went wrong (addresses, client ranges, TLS files, keys,
``flwr`` failures, a refused or failed run) raises ``fedbandit.errors.DeploymentError``; a
combination of arguments this module does not support raises ``ConfigError``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from fedbandit.errors import ConfigError, DeploymentError
from fedbandit.flower.job import FlowerJob, job_to_json
from fedbandit.flower.result_log import decode_all, decode_files, read_progress
from fedbandit.runspec import RunSpec, RuntimeOptions

# fedbandit.results (pandas, a fifth of a second) is imported by run_seed, which reads a seed's
# files: the command lines and the SuperLink probe stay quick to import for `fedbandit --help`.

#: Flower phones home and installs dependencies unless told not to; set before Flower is used.
FLOWER_ENVIRONMENT = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}

#: Where ``flwr run`` finds the ServerApp and ClientApp (a shim over this package).
APP_DIR = Path(__file__).with_name("flwr_app")
DEFAULT_SUPERLINK_PORT = 9092
DEFAULT_SUPERNODE_PORT = 9094
#: Name of the SuperLink connection written to ``$FLWR_HOME/config.toml`` for ``flwr`` commands.
CONNECTION = "fedbandit"
#: How often a SuperNode's SuperExec looks for a new ClientApp to start (Flower's default: 1 s).
TASK_POLL_SECONDS = "0.1"
#: Seconds between the ServerApp's pulls for replies (each is a request to the SuperLink).
DEPLOYMENT_POLL_SECONDS = 0.05
#: Start of the ServerApp log line that carries a foreseen error's one-line message.
ERROR_MARK = "fedbandit-error: "
#: Seconds ``fedbandit run`` waits for an unreachable SuperLink to come back before giving up.
UNREACHABLE_GRACE_SECONDS = 15.0
#: Seconds the driver keeps asking for a finished run's log until its result files are there.
LOG_WAIT_SECONDS = 15.0
#: Seconds a finished run's log may take to arrive (it holds every seed's files).
FINISHED_LOG_WAIT_SECONDS = 120.0


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


@dataclass(frozen=True)
class Submission:
    """How to reach a SuperLink with the ``flwr`` CLI."""

    superlink: str
    state_dir: Path
    insecure: bool = False
    root_certificates: Path | None = None
    run_timeout: float = 3600.0
    #: Seconds between ``flwr ls`` status checks (each starts a ``flwr`` process).
    status_seconds: float = 5.0

    def environment(self) -> dict[str, str]:
        env = flower_environment(self.state_dir)
        write_connection(
            Path(env["FLWR_HOME"]), self.superlink, self.insecure, self.root_certificates
        )
        return env

    def flwr(self, env: dict[str, str], *args: str, timeout: float = 120.0) -> str:
        """``flwr ARGS`` in ``env``; its standard output, or ``DeploymentError`` with its output
        (also when it does not finish within ``timeout`` seconds)."""
        try:
            done = subprocess.run(
                ["flwr", *args], env=env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise DeploymentError(
                f"`flwr {' '.join(args)}` did not finish within {timeout} s"
            ) from None
        if done.returncode != 0:
            raise DeploymentError(
                f"`flwr {' '.join(args)}` failed ({done.returncode}): "
                f"{(done.stdout + done.stderr).strip()[-2000:]}"
            )
        return done.stdout

    def register_node(self, public_key: Path, name: str | None = None) -> int:
        """Register a SuperNode's public key (``flwr supernode register``); its node id."""
        env = self.environment()
        args = ["supernode", "register", str(public_key), CONNECTION, "--format", "json"]
        if name:
            args += ["--name", name]
        reply = json.loads(self.flwr(env, *args))
        if not reply.get("success", False):
            raise DeploymentError(f"registering {public_key} failed: {reply}")
        return int(reply["node-id"])

    def run(
        self,
        run_config: dict[str, object],
        label: str,
        done_file: Path | None = None,
        app_dir: Path = APP_DIR,
    ) -> int:
        """Submit the Flower App in ``app_dir`` (fedbandit's by default) with ``run_config``, wait
        for the run to finish; its run id.

        Raises ``DeploymentError`` when the SuperLink is unreachable or refuses the run, and when
        the run fails: with the ServerApp's one-line message for a foreseen error (a line marked
        ``ERROR_MARK`` in its log), else the end of its log. Stops the run (``flwr stop``) and
        says so when interrupted (Ctrl-C, SIGTERM) or past ``run_timeout``. ``done_file``, a file
        the ServerApp writes last, lets a finished run be noticed without polling ``flwr``."""
        env = self.environment()
        run_id = self.submit(run_config, label, app_dir)
        deadline = time.monotonic() + self.run_timeout
        try:
            while True:
                next_check = time.monotonic() + self.status_seconds
                while time.monotonic() < next_check:
                    if done_file is not None and done_file.is_file():
                        next_check = 0.0  # written last: the run is ending, ask for its status
                        break
                    time.sleep(0.1)
                status = self._status_or_lost(env, run_id, label)
                if status.startswith("finished"):
                    break
                if time.monotonic() > deadline:
                    raise DeploymentError(
                        f"Flower run {run_id} ({label}) not finished after {self.run_timeout:g} "
                        "s (--run-timeout); stopped"
                    )
        except SuperLinkLostError:
            raise
        except BaseException:
            self._stop(env, run_id, label)
            raise
        if status != "finished:completed":
            tail = self.log_tail(env, run_id)
            marked = [
                line.split(ERROR_MARK, 1)[1] for line in tail.splitlines() if ERROR_MARK in line
            ]
            if marked:
                raise DeploymentError(f"Flower run {run_id} ({label}) failed: {marked[-1]}")
            raise DeploymentError(
                f"Flower run {run_id} ({label}) ended {status!r}; end of its log:\n{tail}"
            )
        return run_id

    @classmethod
    def of(cls, options: RuntimeOptions, run_dir: Path) -> Submission:
        """The submission of a run folder's seeds: Flower's state in ``run_dir/flower``."""
        if options.superlink is None:
            raise ConfigError("the flower runtime needs --superlink HOST:PORT")
        return cls(
            superlink=options.superlink,
            state_dir=Path(run_dir).resolve() / "flower",
            insecure=options.insecure,
            root_certificates=options.root_certificates,
            run_timeout=options.run_timeout,
        )

    def submit(self, run_config: dict[str, object], label: str, app_dir: Path = APP_DIR) -> int:
        """Submit the Flower App in ``app_dir`` with ``run_config`` (``flwr run``, which returns
        once the run is queued); its run id. ``DeploymentError`` when the SuperLink is
        unreachable or refuses the run."""
        if why := unreachable(self.superlink):
            raise DeploymentError(
                f"the SuperLink at {self.superlink} is unreachable ({why}): start it "
                "(`fedbandit superlink`) or check --superlink"
            )
        env = self.environment()
        config_file = Path(env["FLWR_HOME"]) / f"run-config-{label}.toml"
        config_file.write_text(tomli_w.dumps(run_config))
        reply = json.loads(
            self.flwr(
                env,
                "run",
                str(app_dir),
                CONNECTION,
                "--run-config",
                str(config_file),
                "--format",
                "json",
            )
        )
        if not reply.get("success", False) or "run-id" not in reply:
            raise DeploymentError(f"the SuperLink at {self.superlink} refused the run: {reply}")
        return int(reply["run-id"])

    def log_text(self, run_id: int, timeout: float = 120.0) -> str:
        """The run's log as the SuperLink holds it now (``flwr log --show``; it answers once the
        run has logged something or has finished)."""
        return self.flwr(
            self.environment(), "log", str(run_id), CONNECTION, "--show", timeout=timeout
        )

    def _status_or_lost(self, env: dict[str, str], run_id: int, label: str) -> str:
        """The run's status; ``SuperLinkLostError`` when the SuperLink stays unreachable for
        ``UNREACHABLE_GRACE_SECONDS`` (a restart within that time is waited for)."""
        lost_since: float | None = None
        while True:
            try:
                return self.status(env, run_id)
            except DeploymentError:
                why = unreachable(self.superlink)
                if why is None:
                    if lost_since is None:
                        raise
                    why = "it came back without the run"
                lost_since = lost_since if lost_since is not None else time.monotonic()
                if time.monotonic() - lost_since >= UNREACHABLE_GRACE_SECONDS:
                    raise SuperLinkLostError(
                        f"the SuperLink at {self.superlink} is unreachable ({why}) during Flower "
                        f"run {run_id} ({label}); the run ended with it and its ServerApp stops "
                        "by itself: restart the SuperLink with the same --state-dir (its nodes "
                        "reconnect)"
                    ) from None
                time.sleep(1.0)

    def online_nodes(self) -> set[str]:
        """Ids of the SuperNodes the SuperLink lists as online (``flwr supernode ls``)."""
        reply = json.loads(
            self.flwr(self.environment(), "supernode", "ls", CONNECTION, "--format", "json")
        )
        return {str(n["node-id"]) for n in reply.get("nodes", []) if n.get("status") == "online"}

    def status(self, env: dict[str, str], run_id: int) -> str:
        reply = json.loads(
            self.flwr(env, "ls", CONNECTION, "--run-id", str(run_id), "--format", "json")
        )
        runs = reply.get("runs", [])
        if not runs:
            raise UnknownRunError(
                f"the SuperLink at {self.superlink} does not know Flower run {run_id} (was it "
                "restarted without its --state-dir?)"
            )
        return str(runs[0]["status"])

    def log_tail(self, env: dict[str, str], run_id: int, lines: int = 40) -> str:
        try:
            text = self.flwr(env, "log", str(run_id), CONNECTION, "--show", timeout=60)
        except DeploymentError as err:
            return f"(log unavailable: {err})"
        return "\n".join(text.splitlines()[-lines:])

    def fetch_result_files(self, run_id: int, label: str) -> dict[str, str]:
        """A finished run's result files (relative path -> text) from its log, each checked
        against its SHA-256 (``fedbandit.flower.result_log``). The ServerApp's last log lines
        may reach the SuperLink a few seconds after the run has finished: asks again for up to
        ``LOG_WAIT_SECONDS``."""
        what = f"Flower run {run_id} ({label})"
        deadline = time.monotonic() + LOG_WAIT_SECONDS
        while True:
            files = decode_files(self.log_text(run_id), what)
            if files is not None:
                return files
            if time.monotonic() > deadline:
                raise DeploymentError(
                    f"{what} finished, but its log carries no result files after "
                    f"{LOG_WAIT_SECONDS:g} s: see `flwr log {run_id}` on the SuperLink"
                )
            time.sleep(1.0)

    def _stop(self, env: dict[str, str], run_id: int, label: str) -> None:
        """``flwr stop`` the run; says on standard error whether it was stopped."""
        try:
            self.flwr(env, "stop", str(run_id), CONNECTION, timeout=60)
        except DeploymentError as err:
            print(
                f"fedbandit: could not stop Flower run {run_id} ({label}): {err}", file=sys.stderr
            )
        else:
            print(f"fedbandit: stopped Flower run {run_id} ({label})", file=sys.stderr)


class UnknownRunError(DeploymentError):
    """The SuperLink answers but does not know the Flower run (restarted without its state)."""


class SuperLinkLostError(DeploymentError):
    """The SuperLink stopped answering during a run (it was not stopped: there is nobody to ask)."""


class AskAgainError(DeploymentError):
    """A detached run's state could not be read now (the SuperLink is down or busy); the run
    itself goes on, or waits for the SuperLink: ``status`` and ``pull`` exit 75, try again."""


def run_seed(
    submission: Submission, spec: RunSpec, run_dir: Path, same_host: bool | None = None
) -> int:
    """Run one seed of ``spec`` on the deployment and write its result files into ``run_dir``
    (on this machine). Returns the Flower run id.

    The files come back through the Flower run's log (``fetch_result_files``), from a SuperLink
    on any host. ``same_host`` (default: whether the SuperLink's address is a loopback one) lets
    the ServerApp write them into ``run_dir`` itself instead: its seed JSON then tells the driver
    at once that the run is ending (otherwise it asks ``flwr ls`` every ``status_seconds``), and
    the log is read only when the files are not there."""
    from fedbandit.results import seed_status, seed_stem, write_files

    job = FlowerJob(spec, num_nodes=0, poll_seconds=DEPLOYMENT_POLL_SECONDS)
    algorithm, seed = spec.algorithm, spec.seed
    run_dir = Path(run_dir).resolve()
    if same_host is None:
        same_host = is_loopback(split_address(submission.superlink)[0])
    done_file = seed_stem(run_dir, algorithm, seed).with_suffix(".json") if same_host else None
    run_config: dict[str, object] = {"job": job_to_json(job), "seed": seed}
    if same_host:
        run_config["result-dir"] = str(run_dir)
    run_id = submission.run(run_config, f"{algorithm}-seed{seed}", done_file)
    if not (same_host and seed_status(run_dir, algorithm, seed) is not None):
        write_files(run_dir, submission.fetch_result_files(run_id, f"{algorithm} seed {seed}"))
    return run_id


def submit_detached(submission: Submission, specs: list[RunSpec]) -> int:
    """Submit ``specs`` (one command's seeds) as one Flower run whose ServerApp runs them one
    after another, and return at once with its run id: each seed's files reach the run's log as
    the seed ends (``detached_state`` reads them back)."""
    jobs = [
        job_to_json(FlowerJob(spec, num_nodes=0, poll_seconds=DEPLOYMENT_POLL_SECONDS))
        for spec in specs
    ]
    return submission.submit({"jobs": json.dumps(jobs), "seed": -1}, "detached")


@dataclass(frozen=True)
class DetachedState:
    """What a detached Flower run has done so far: its Flower status, the files of every seed
    that has ended (by (algorithm, seed)), each seed's last progress event, the one-line error
    of a failed run, and the emissions that arrived broken."""

    status: str
    files: dict[tuple[str, int], dict[str, str]]
    progress: dict[tuple[str, int], str]
    error: str | None
    #: Why an emission of result files in the log could not be read (skipped).
    broken: list[str]


def detached_state(submission: Submission, run_id: int) -> DetachedState:
    """Ask the SuperLink about a detached run (``flwr ls`` and ``flwr log``); every seed's files
    checked against their SHA-256."""
    if why := unreachable(submission.superlink):
        raise AskAgainError(
            f"the SuperLink at {submission.superlink} is unreachable ({why}): Flower run "
            f"{run_id} and its results are kept there; ask again when it is back"
        )
    env = submission.environment()
    try:
        status = submission.status(env, run_id)
    except UnknownRunError:
        raise
    except DeploymentError as err:
        raise AskAgainError(
            f"the SuperLink at {submission.superlink} did not say how Flower run {run_id} "
            f"stands ({err}); ask again"
        ) from None
    if not status.startswith(("running", "finished")):
        return DetachedState(status, {}, {}, None, [])  # queued: its log is still empty
    finished = status.startswith("finished")
    wait = FINISHED_LOG_WAIT_SECONDS if finished else LOG_WAIT_SECONDS
    deadline = time.monotonic() + LOG_WAIT_SECONDS
    while True:
        try:
            log = submission.log_text(run_id, timeout=wait)
        except DeploymentError:
            # Not an empty log: a running run that has logged nothing yet and a SuperLink too
            # busy to answer in time look alike, and a finished seed must not look queued.
            raise AskAgainError(
                f"could not read the log of Flower run {run_id} ({status}) within {wait:g} s: "
                "the SuperLink is busy or the run has logged nothing yet; it goes on, ask again"
            ) from None
        broken: list[str] = []
        files: dict[tuple[str, int], dict[str, str]] = {}
        for emission in decode_all(log, f"Flower run {run_id}", broken):
            for path, text in emission.items():
                if path.endswith(".json"):  # the seed's info names it
                    info = json.loads(text)
                    files[(str(info["algorithm"]), int(info["seed"]))] = emission
        progress = read_progress(log)
        # A finished run's last lines may reach the SuperLink seconds after it ended.
        late = [key for key in progress if key not in files]
        if not (finished and late) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    marked = [line.split(ERROR_MARK, 1)[1] for line in log.splitlines() if ERROR_MARK in line]
    error = marked[-1] if marked else None
    if error is None and finished and status != "finished:completed":
        error = f"the Flower run ended {status!r}"
    return DetachedState(status, files, progress, error, broken)
