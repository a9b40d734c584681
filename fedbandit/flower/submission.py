"""Submitting and awaiting Flower runs with Flower's own CLI: ``Submission`` (``flwr run``,
``flwr ls``, ``flwr log``, ``flwr stop``, ``flwr supernode``), the errors of a run the SuperLink
forgot or lost, and a run's log followed as it arrives (``LogStream``).

Submitting uses Flower's own CLI (``flwr run``) on the Flower App in ``flwr_app/`` with a run-config
file carrying the job; ``flwr run`` exits 0 even when the ServerApp fails, so the outcome is read
from ``flwr ls --run-id``.

Errors: ``flwr`` failures, an unreachable SuperLink, a refused or failed run raise
``fedbandit.errors.DeploymentError``; a run folder's options without ``--superlink`` raise
``ConfigError``.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from fedbandit.errors import ConfigError, DeploymentError
from fedbandit.flower.processes import CONNECTION, flower_environment, unreachable, write_connection
from fedbandit.flower.result_log import END_MARK, decode_files
from fedbandit.flower.run_record import split_record
from fedbandit.runspec import RuntimeOptions

#: Where ``flwr run`` finds the ServerApp and ClientApp (a shim over this package).
APP_DIR = Path(__file__).with_name("flwr_app")
#: Start of the ServerApp log line that carries a foreseen error's one-line message.
ERROR_MARK = "fedbandit-error: "
#: Seconds ``fedbandit run`` waits for an unreachable SuperLink to come back before giving up.
UNREACHABLE_GRACE_SECONDS = 15.0
#: How often the driver asks ``flwr ls`` again when a reachable SuperLink failed to answer (a
#: transient error: HTTP 500, "database is locked" under load), with back-off from
#: ``RETRY_SECONDS`` doubling each time, before the failure counts.
STATUS_RETRIES = 3
RETRY_SECONDS = 1.0
#: Seconds the driver keeps asking for a finished run's log until its result files are there.
LOG_WAIT_SECONDS = 15.0
#: Seconds between the lines that say a run is still waiting for its ServerApp to start.
START_REPORT_SECONDS = 30.0
#: Seconds Flower 1.42 gives a ServerApp from its launch to its first report: the SuperLink's
#: claim of the run's task lives ``HEARTBEAT_DEFAULT_INTERVAL`` (``flwr.common.constant``, read
#: by ``claim_task`` in ``flwr.supercore.corestate``, no setting). A ServerApp that reports later
#: is refused ("Runtime task-token authentication failed") and the task goes back to pending,
#: so the SuperExec launches another ServerApp, with no limit.
SERVERAPP_REPORT_SECONDS = 30


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
    #: Seconds a submitted run's ServerApp may take to start (``--start-deadline``).
    start_deadline: float = 120.0

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
        for the run to finish (``wait``); its run id. ``done_file``, a file the app writes last
        on this machine (an app of ours run beside its SuperLink, as ``bench deploy``'s echo
        app), lets a finished run be noticed without polling ``flwr``."""
        run_id = self.submit(run_config, label, app_dir)
        done = (lambda: done_file.is_file()) if done_file is not None else None
        self.wait(run_id, label, done)
        return run_id

    def wait(self, run_id: int, label: str, ending: Callable[[], bool] | None = None) -> None:
        """Wait for Flower run ``run_id`` to finish, asking ``flwr ls`` every ``status_seconds``
        and at once while ``ending()`` says the run is ending (its last output has arrived).

        Raises ``DeploymentError`` when the run fails: with the ServerApp's one-line message for a
        foreseen error (a line marked ``ERROR_MARK`` in its log), else the end of its log;
        ``StartDeadlineError`` when its ServerApp has not started within ``start_deadline``
        (``wait_started``); ``SuperLinkLostError`` when the SuperLink stays unreachable. Stops
        the run (``flwr stop``) and says so when interrupted (Ctrl-C, SIGTERM), past
        ``start_deadline`` before its ServerApp started, or past ``run_timeout``."""
        env = self.environment()
        deadline = time.monotonic() + self.run_timeout
        try:
            self.wait_started(env, run_id, label)
            while True:
                next_check = time.monotonic() + self.status_seconds
                while time.monotonic() < next_check:
                    if ending is not None and ending():
                        break  # the run is ending: ask for its status now
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
        except StartDeadlineError as err:
            stopped = self._stop(env, run_id, label, quiet=True)
            raise StartDeadlineError(
                f"{err}; "
                + (
                    "the run was stopped: rerun with the same --out to resume"
                    if stopped
                    else f"`flwr stop {run_id}` failed, the run may still start"
                ),
                may_start=not stopped,
            ) from None
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

    def wait_started(
        self,
        env: dict[str, str],
        run_id: int,
        label: str,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        """Wait until the run's ServerApp has started (Flower status "running", or "finished"),
        asking ``flwr ls`` every ``status_seconds`` and saying on standard error every
        ``START_REPORT_SECONDS`` that it still waits, and what for.

        Past ``start_deadline``: ``StartDeadlineError`` in one line naming why (never launched,
        launched and not reported yet, or launched again and again because the SuperLink refused
        every ServerApp that reported late) and what the SuperLink says of the run. Its
        ``may_start`` is False once the SuperLink has given up on a ServerApp (Flower launches
        another without limit: the caller must stop the run), else True."""
        clock = clock or time.monotonic
        sleep = sleep or time.sleep
        started = clock()
        launches: list[str] = []
        next_report = started + START_REPORT_SECONDS
        while True:
            info = self._info_or_lost(env, run_id, label)
            status = str(info.get("status", ""))
            if status.startswith(("running", "finished")):
                return
            starting_at = str(info.get("starting-at") or "")
            if status == "starting" and starting_at not in ("", "N/A", *launches):
                launches.append(starting_at)
                if len(launches) == 1 and relaunched(info):  # one given up before we looked
                    launches.insert(0, str(info.get("pending-at")))
            waited = clock() - started
            if waited >= self.start_deadline:
                why = why_not_started(status, launches, str(info.get("status-details") or ""))
                raise StartDeadlineError(
                    f"Flower run {run_id} ({label}) did not start within "
                    f"{self.start_deadline:g} s (--start-deadline): {why}",
                    may_start=len(launches) < 2,
                )
            if clock() >= next_report:
                print(
                    f"fedbandit: Flower run {run_id} ({label}) waits for its ServerApp "
                    f"({waited:.0f} s of {self.start_deadline:g} s): "
                    f"{why_not_started(status, launches, '')}",
                    file=sys.stderr,
                    flush=True,
                )
                next_report += START_REPORT_SECONDS
            sleep(max(0.0, min(self.status_seconds, started + self.start_deadline - clock())))

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
            start_deadline=options.start_deadline,
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
        """The run's status, as ``_info_or_lost``."""
        return str(self._info_or_lost(env, run_id, label)["status"])

    def _info_or_lost(self, env: dict[str, str], run_id: int, label: str) -> dict[str, object]:
        """The run's row in ``flwr ls``; ``SuperLinkLostError`` when the SuperLink stays
        unreachable for ``UNREACHABLE_GRACE_SECONDS`` (a restart within that time is waited
        for). A reachable SuperLink that fails to answer is asked again ``STATUS_RETRIES`` times,
        with back-off, before its error counts (a run must not be given up for one locked
        database)."""
        lost_since: float | None = None
        failures = 0
        while True:
            try:
                return self.run_info(env, run_id)
            except DeploymentError as err:
                why = unreachable(self.superlink)
                if why is None:
                    if lost_since is None:
                        if isinstance(err, UnknownRunError) or failures >= STATUS_RETRIES:
                            raise
                        time.sleep(RETRY_SECONDS * 2**failures)
                        failures += 1
                        continue
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

    def online_nodes(self, timeout: float = 120.0) -> set[str]:
        """Ids of the SuperNodes the SuperLink lists as online (``flwr supernode ls``)."""
        reply = json.loads(
            self.flwr(
                self.environment(),
                "supernode",
                "ls",
                CONNECTION,
                "--format",
                "json",
                timeout=timeout,
            )
        )
        return {str(n["node-id"]) for n in reply.get("nodes", []) if n.get("status") == "online"}

    def status(self, env: dict[str, str], run_id: int) -> str:
        """The run's Flower status (``flwr ls``), e.g. "running" or "finished:failed"."""
        return self.run_status(env, run_id)[0]

    def run_status(self, env: dict[str, str], run_id: int) -> tuple[str, str]:
        """The run's Flower status and its details (why a run failed, as the SuperLink says)."""
        info = self.run_info(env, run_id)
        return str(info["status"]), str(info.get("status-details") or "")

    def run_info(self, env: dict[str, str], run_id: int) -> dict[str, object]:
        """The run's row in ``flwr ls --format json`` (``status``, ``status-details``,
        ``starting-at``, ...)."""
        reply = json.loads(
            self.flwr(env, "ls", CONNECTION, "--run-id", str(run_id), "--format", "json")
        )
        runs = reply.get("runs", [])
        if not runs:
            raise UnknownRunError(
                f"the SuperLink at {self.superlink} does not know Flower run {run_id} (was it "
                "restarted without its --state-dir?)"
            )
        return dict(runs[0])

    def log_tail(self, env: dict[str, str], run_id: int, lines: int = 40) -> str:
        try:
            text = self.flwr(env, "log", str(run_id), CONNECTION, "--show", timeout=60)
        except DeploymentError as err:
            return f"(log unavailable: {err})"
        return "\n".join(text.splitlines()[-lines:])

    def fetch_result_files(self, run_id: int, label: str, streamed: str = "") -> dict[str, str]:
        """A finished run's result files (relative path -> text) from its log, each checked
        against its SHA-256 (``fedbandit.flower.result_log``), without the run's record
        (``RUN_RECORD``). ``streamed``, the log as a ``LogStream`` saw it, is read first; else,
        or when it holds no whole emission, the log is asked for (``flwr log --show``): the
        ServerApp's last lines may reach the SuperLink a few seconds after the run has finished,
        so it asks again for up to ``LOG_WAIT_SECONDS``."""
        what = f"Flower run {run_id} ({label})"
        if streamed:
            try:
                files = decode_files(streamed, what)
            except DeploymentError:
                files = None  # a stream that missed a line: the stored log has it
            if files is not None:
                return split_record(files)[1]
        deadline = time.monotonic() + LOG_WAIT_SECONDS
        while True:
            try:
                log = self.log_text(run_id)
            except DeploymentError:  # a failed `flwr log`: asked again until the deadline
                if time.monotonic() > deadline:
                    raise
                log = ""
            files = decode_files(log, what)
            if files is not None:
                return split_record(files)[1]
            if time.monotonic() > deadline:
                raise DeploymentError(
                    f"{what} finished, but its log carries no result files after "
                    f"{LOG_WAIT_SECONDS:g} s: see `flwr log {run_id}` on the SuperLink"
                )
            time.sleep(1.0)

    def _stop(self, env: dict[str, str], run_id: int, label: str, quiet: bool = False) -> bool:
        """``flwr stop`` the run; whether it was stopped, also said on standard error unless
        ``quiet``."""
        try:
            self.flwr(env, "stop", str(run_id), CONNECTION, timeout=60)
        except DeploymentError as err:
            if not quiet:
                print(
                    f"fedbandit: could not stop Flower run {run_id} ({label}): {err}",
                    file=sys.stderr,
                )
            return False
        if not quiet:
            print(f"fedbandit: stopped Flower run {run_id} ({label})", file=sys.stderr)
        return True

    def stop_unstarted(self, run_id: int, label: str) -> bool:
        """``flwr stop`` a run whose ServerApp never started (quietly); whether it stopped."""
        return self._stop(self.environment(), run_id, label, quiet=True)


def moment(text: object) -> dt.datetime | None:
    """A time of ``flwr ls`` ("2026-12-07 21:30:01.25Z"; "N/A" when unset)."""
    try:
        return dt.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None


def relaunched(info: dict[str, object]) -> bool:
    """Whether the SuperLink has given up on a ServerApp of this run and launched another: its
    latest launch (``starting-at``) came more than ``SERVERAPP_REPORT_SECONDS`` after the run
    was queued (``pending-at``), which only an expired claim does (Flower 1.42's SuperExec
    launches a queued run's ServerApp within its poll, a second)."""
    queued, launched = moment(info.get("pending-at")), moment(info.get("starting-at"))
    if queued is None or launched is None:
        return False
    return (launched - queued).total_seconds() > SERVERAPP_REPORT_SECONDS


def why_not_started(status: str, launches: list[str], details: str) -> str:
    """Why a run's ServerApp has not started, from its Flower status and the distinct times the
    SuperLink launched a ServerApp for it (``starting-at`` in ``flwr ls``, which changes on each
    launch), with the SuperLink's own words on the run."""
    details = "" if details == "N/A" else details
    said = f"SuperLink: status {status!r}" + (f", {details!r}" if details else "")
    if len(launches) >= 2:
        return (
            f"the SuperLink launched its ServerApp {len(launches)} times and refused each one "
            "that reported after its window (Flower 1.42: 'Runtime task-token authentication "
            "failed', then it launches another; the window is 30 s with flower-superlink, 300 s "
            "with fedbandit superlink and FEDBANDIT_SERVERAPP_START_WINDOW); the SuperLink's "
            f"host is too loaded to start a ServerApp in time ({said}, last launch at "
            f"{launches[-1]})"
        )
    if launches:
        return (
            f"its ServerApp, launched at {launches[0]}, has not reported to the SuperLink yet "
            f"(a loaded SuperLink host starts it slowly; {said})"
        )
    return (
        "the SuperLink has not launched its ServerApp (its SuperExec has not taken the run; "
        f"{said})"
    )


class StartDeadlineError(DeploymentError):
    """A submitted run's ServerApp did not start within ``--start-deadline``. ``may_start``:
    the run was left as it was and may still start (a slow start); False once the SuperLink
    refused a ServerApp and launched another (it would go on doing so: the run is stopped)."""

    def __init__(self, message: str, may_start: bool) -> None:
        super().__init__(message)
        self.may_start = may_start


class UnknownRunError(DeploymentError):
    """The SuperLink answers but does not know the Flower run (restarted without its state)."""


class SuperLinkLostError(DeploymentError):
    """The SuperLink stopped answering during a run (it was not stopped: there is nobody to ask)."""


class LogStream:
    """``flwr log RUN --stream`` in the background: the run's log as it arrives (``text``), and
    ``ended`` set once an emission's end line has come (the seed's files are all in the log and
    the run is ending). Only a hint: a stream that fails or misses lines changes nothing but
    when the run's end is noticed (``Submission.wait`` also asks ``flwr ls``) and where its
    files are read from (``Submission.fetch_result_files`` checks them and falls back on the
    stored log). A context manager: leaving it stops the ``flwr`` process."""

    def __init__(self, submission: Submission, run_id: int) -> None:
        self.ended = threading.Event()
        self._lines: list[str] = []
        self._process: subprocess.Popen[str] | None = None
        try:
            self._process = subprocess.Popen(
                ["flwr", "log", str(run_id), CONNECTION, "--stream"],
                env=submission.environment(),
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
            )
        except OSError:
            return  # no stream: the run's end is noticed by flwr ls alone
        self._reader = threading.Thread(target=self._read, name="flwr-log-stream", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.append(line)
            if line.startswith(END_MARK + " "):
                self.ended.set()

    def text(self) -> str:
        return "".join(self._lines)

    def close(self) -> None:
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._reader.join(timeout=5)

    def __enter__(self) -> LogStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
