"""A run whose ServerApp does not start: the driver's wait for it is bounded (``--start-deadline``)
and speaks, and it ends in one line naming why (``Submission.wait_started``).

Flower 1.42 gives a launched ServerApp 30 s to report to its SuperLink; one that reports later is
refused ("Runtime task-token authentication failed") and the SuperExec launches another, without
limit. The unit tests drive ``wait_started`` with a scripted ``flwr ls``; the slow tests make
every ServerApp of a real loopback deployment start too slowly (``tests/serverapp_delay``), or
load the machine with busy loops.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flower_deploy import FEDBANDIT, Deployment, free_port, live_commands, wait_for_port

from fedbandit.flower.submission import (
    START_REPORT_SECONDS,
    StartDeadlineError,
    Submission,
    relaunched,
)
from fedbandit.results.files import read_json

HERE = Path(__file__).parent
TINY = ["--seeds", "1", "--set", "instance.num_clients=4", "--set", "horizon=256", "--quiet"]


class ScriptedSubmission(Submission):
    """A submission whose ``flwr ls`` answers from a script of rows (the last one repeats) and
    whose ``flwr stop`` is recorded, on a clock that only moves when it sleeps."""

    def __init__(self, rows: list[dict[str, object]], deadline: float, stop_fails: bool = False):
        super().__init__("127.0.0.1:1", Path("/nonexistent"), start_deadline=deadline)
        object.__setattr__(self, "_rows", list(rows))
        object.__setattr__(self, "asked", [])
        object.__setattr__(self, "now", [0.0])
        object.__setattr__(self, "_stop_fails", stop_fails)

    def run_info(self, env: dict[str, str], run_id: int) -> dict[str, object]:
        self.asked.append(self.now[0])
        return self._rows.pop(0) if len(self._rows) > 1 else self._rows[0]

    def flwr(self, env: dict[str, str], *args: str, timeout: float = 120.0) -> str:
        from fedbandit.errors import DeploymentError

        self.asked.append(("flwr", *args[:2]))
        if self._stop_fails:
            raise DeploymentError("`flwr stop` failed (1): busy")
        return "{}"

    def environment(self) -> dict[str, str]:
        return {}

    def clock(self) -> float:
        return self.now[0]

    def sleep(self, seconds: float) -> None:
        self.now[0] += seconds


def row(status: str, starting_at: str = "N/A", pending_at: str = "2026-12-07 10:00:00.000Z"):
    return {
        "status": status,
        "status-details": "N/A",
        "pending-at": pending_at,
        "starting-at": starting_at,
    }


def launches(*seconds: int) -> list[dict[str, object]]:
    """Rows of a run that the SuperLink launched at these seconds after it was queued."""
    return [row("starting", f"2026-12-07 10:{s // 60:02d}:{s % 60:02d}.000Z") for s in seconds]


def wait(submission: ScriptedSubmission) -> None:
    submission.wait_started({}, 7, "fedpe-seed0", clock=submission.clock, sleep=submission.sleep)


def test_a_refused_serverapp_ends_the_wait_at_the_deadline_in_one_line(capsys):
    """The SuperLink launched the ServerApp at 1 s, 32 s and 63 s (each refused, then launched
    again): at the 90 s deadline the wait ends, naming the three launches, Flower's refusal and
    what the SuperLink says; the run cannot start by itself (Flower would go on launching)."""
    rows = launches(1) * 7 + launches(32) * 6 + launches(63)  # flwr ls every 5 s
    submission = ScriptedSubmission(rows, deadline=90)
    with pytest.raises(StartDeadlineError) as caught:
        wait(submission)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(
        "Flower run 7 (fedpe-seed0) did not start within 90 s (--start-deadline): the SuperLink "
        "launched its ServerApp 3 times and refused each one that reported after its window "
        "(Flower 1.42: 'Runtime task-token authentication failed', then it launches another; "
        "the window is 30 s with flower-superlink, 300 s with fedbandit superlink"
    )
    assert "SuperLink: status 'starting', last launch at 2026-12-07 10:01:03.000Z" in message
    assert not caught.value.may_start
    assert submission.now[0] == 90  # bounded: not a status check later
    # it spoke while waiting: a line every START_REPORT_SECONDS (at 30 s and 60 s), no more
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 90 // START_REPORT_SECONDS - 1
    assert said[0].startswith("fedbandit: Flower run 7 (fedpe-seed0) waits for its ServerApp (30 s")
    assert "launched at 2026-12-07 10:00:01.000Z, has not reported" in said[0]
    assert "launched its ServerApp 2 times" in said[1]


def test_a_launch_given_up_before_the_first_look_counts_as_a_refusal():
    """The first row the driver sees is already a second launch (63 s after the run was queued):
    only an expired claim launches that late, so the run cannot start by itself."""
    assert relaunched(launches(63)[0]) and not relaunched(launches(20)[0])
    submission = ScriptedSubmission(launches(63), deadline=20)
    with pytest.raises(StartDeadlineError) as caught:
        wait(submission)
    assert not caught.value.may_start
    assert "launched its ServerApp 2 times" in str(caught.value)


def test_a_slow_first_launch_may_still_start():
    submission = ScriptedSubmission(launches(1), deadline=25)
    with pytest.raises(StartDeadlineError) as caught:
        wait(submission)
    assert caught.value.may_start
    assert str(caught.value).endswith(
        "its ServerApp, launched at 2026-12-07 10:00:01.000Z, has not reported to the SuperLink "
        "yet (a loaded SuperLink host starts it slowly; SuperLink: status 'starting')"
    )


def test_a_run_never_launched_says_so():
    submission = ScriptedSubmission([row("pending")], deadline=12)
    with pytest.raises(StartDeadlineError, match="the SuperLink has not launched its ServerApp"):
        wait(submission)
    assert submission.now[0] == 12


def test_a_run_that_starts_ends_the_wait_at_once(capsys):
    submission = ScriptedSubmission([row("pending"), *launches(1), row("running")], deadline=60)
    wait(submission)
    assert submission.now[0] == 2 * submission.status_seconds
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("stop_fails", "may_start"), [(False, False), (True, True)])
def test_the_attached_wait_stops_the_run_past_the_deadline(monkeypatch, stop_fails, may_start):
    """``Submission.wait`` (one attached seed): past the start deadline the run is stopped
    (``flwr stop``), so that Flower launches no more ServerApps for it; the one line says so, or
    that the stop failed and the run may still start."""
    submission = ScriptedSubmission(launches(1, 32, 63), deadline=20, stop_fails=stop_fails)
    monkeypatch.setattr(time, "monotonic", submission.clock)
    monkeypatch.setattr(time, "sleep", submission.sleep)
    with pytest.raises(StartDeadlineError) as caught:
        submission.wait(7, "fedpe-seed0")
    assert ("flwr", "stop", "7") in submission.asked
    assert caught.value.may_start is may_start
    ending = "`flwr stop 7` failed" if stop_fails else "the run was stopped: rerun with"
    assert ending in str(caught.value)


# --- real deployments -------------------------------------------------------------------------


def start_slowly(
    deployment: Deployment, ranges: list[str], link_env: dict[str, str] | None = None
) -> str:
    """``flower_deploy.start_loopback``, waiting up to 180 s for the SuperLink to listen: these
    tests run on a loaded machine, where it took more than 30 s."""
    port = free_port()
    superlink = deployment.superlink(port, "--insecure", env=link_env)
    wait_for_port("127.0.0.1", port, timeout=180)
    for i, clients in enumerate(ranges):
        deployment.supernode(f"node{i}", superlink, clients, free_port(), "--insecure")
    return superlink


def left_behind(root: Path, superlink: str, patience: float = 60.0) -> list[str]:
    """Live processes of this test after ``patience`` seconds at most: those naming its folder,
    and the ServerApps of its SuperLink (their command line names only its address; one that
    still sleeps in ``tests/serverapp_delay`` exits when it wakes and finds its parent gone)."""
    deadline = time.monotonic() + patience
    while True:
        found = [
            command
            for command in live_commands()
            if str(root) in command or ("flwr-serverapp" in command and f"{superlink} " in command)
        ]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(1.0)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("fedbandit: error:")]


def late_serverapps(seconds: int, **more: str) -> dict[str, str]:
    """A SuperLink environment whose ServerApps sleep ``seconds`` before they load
    (``tests/serverapp_delay``), with ``more`` variables."""
    return {
        **more,
        "FEDBANDIT_TEST_SERVERAPP_DELAY": str(seconds),
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(HERE / "serverapp_delay"), os.environ.get("PYTHONPATH")])
        ),
    }


def run_tiny(
    superlink: str, out: Path, *options: str, timeout: float
) -> subprocess.CompletedProcess:
    """``fedbandit run`` of a tiny Fed-PE seed on ``superlink`` into ``out``."""
    command = [
        *FEDBANDIT, "run", "fedpe_tiny", *TINY, "--set", 'algorithms=["fedpe"]',
        "--runtime", "flower", "--superlink", superlink, "--insecure", "--out", str(out), *options,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.heavy
def test_serverapps_that_start_too_slowly_end_the_seed_in_one_line(tmp_path):
    """Every ServerApp of the deployment sleeps 45 s before it reports (as on an overloaded host),
    and the SuperLink keeps Flower's own 30 s for a first report
    (``FEDBANDIT_SERVERAPP_START_WINDOW=30``): it refuses each and launches another. ``fedbandit
    run`` says it is waiting, stops the run at its 50 s start deadline, ends in one line naming
    the refusals (exit 3), and the stopped run is launched no more. Nothing is left running."""
    environment = late_serverapps(45, FEDBANDIT_SERVERAPP_START_WINDOW="30")
    out = tmp_path / "out"
    deployment = Deployment(tmp_path)
    try:
        superlink = start_slowly(deployment, ["0-1", "2-3"], link_env=environment)
        run = run_tiny(superlink, out, "--start-deadline", "50", timeout=240)
        found = re.search(r"Flower run (\d+) \(", run.stderr)
        submission = Submission(superlink, tmp_path / "flwr-check", insecure=True)
        status = (
            submission.run_status(submission.environment(), int(found.group(1))) if found else ()
        )
        # Every ServerApp launched before the stop has woken (45 s), been refused and exited 60 s
        # later; one launched after the stop (within 31 s of the last launch) would still sleep.
        time.sleep(60)
        serverapps = [c for c in live_commands() if "flwr-serverapp" in c and superlink in c]
    finally:
        deployment.close()
    assert run.returncode == 3, run.stderr + deployment.logs()
    assert "Traceback" not in run.stderr
    [line] = error_lines(run.stderr)
    assert "did not start within 50 s (--start-deadline): the SuperLink launched its ServerApp" in (
        line
    )
    assert "the run was stopped: rerun with the same --out to resume" in line
    assert re.search(r"waits for its ServerApp \(\d+ s of 50 s\): \w", run.stderr)
    refused = (
        "[/v1/runtime/pull-task-input][ApiError:1008] Runtime task-token authentication failed"
    )
    assert refused in deployment.log("superlink")
    assert status[0] == "finished:stopped", status
    assert not serverapps
    manifest = read_json(out / "manifest.json")
    assert manifest["status"] == "incomplete" and "did not start within" in manifest["stopped"]
    assert not left_behind(tmp_path, superlink)


@pytest.mark.slow
def test_a_serverapp_that_reports_after_flowers_30_s_is_not_refused(tmp_path):
    """The same 45 s-late ServerApps on a SuperLink started by ``fedbandit superlink`` with its
    default window for a first report (300 s): the first launch is accepted, the run ends with
    exit 0, and the SuperLink refused no token."""
    out = tmp_path / "out"
    deployment = Deployment(tmp_path)
    try:
        superlink = start_slowly(deployment, ["0-1", "2-3"], link_env=late_serverapps(45))
        run = run_tiny(superlink, out, "--start-deadline", "150", timeout=400)
    finally:
        deployment.close()
    assert run.returncode == 0, run.stderr + deployment.logs()
    assert "authentication failed" not in deployment.log("superlink")
    assert read_json(out / "manifest.json")["status"] == "complete"
    assert not left_behind(tmp_path, superlink)


def test_a_wrong_serverapp_start_window_is_one_line_before_the_superlink_starts(
    monkeypatch, capsys
):
    from fedbandit.flower.internals import superlink_main

    monkeypatch.setenv(superlink_main.STARTUP_WINDOW_ENV, "10")
    monkeypatch.setattr(superlink_main, "install", lambda: pytest.fail("started"))
    assert superlink_main.main(["--insecure"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "fedbandit: FEDBANDIT_SERVERAPP_START_WINDOW must be seconds in [30, 3600], got '10'"
    ]


@pytest.mark.slow
@pytest.mark.heavy
def test_a_detached_run_whose_serverapp_is_slow_exits_75_and_pull_follows_it(tmp_path):
    """``run --detach`` waits for the ServerApp to start; one still in its first launch at the
    deadline (it may yet start) ends the command in one line with exit 75, the run recorded and
    left alone, and ``pull`` follows it as any detached run: to its end (exit 0) or, when the
    SuperLink refused the ServerApp and launched another (on a loaded machine the 25 s of sleep
    and Flower's loading can pass 30 s), until it stops the run (exit 3). The deadline is also the
    ServerApp's wait for the nodes' hello, which took more than 8 s at load 32."""
    environment = late_serverapps(25)
    out = tmp_path / "out"
    deployment = Deployment(tmp_path)
    try:
        superlink = start_slowly(deployment, ["0-1", "2-3"], link_env=environment)
        connect = ["--superlink", superlink, "--insecure"]
        run = subprocess.run(
            [
                *FEDBANDIT,
                "run",
                "fedpe_tiny",
                *TINY,
                "--set",
                'algorithms=["fedpe"]',
                "--runtime",
                "flower",
                *connect,
                "--out",
                str(out),
                "--start-deadline",
                "20",
                "--detach",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        pulled = None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            pulled = subprocess.run(
                [*FEDBANDIT, "pull", str(out), "--quiet"], capture_output=True, text=True
            )
            if pulled.returncode != 75:
                break
            time.sleep(3)
    finally:
        deployment.close()
    assert run.returncode == 75, run.stderr + deployment.logs()
    [line] = error_lines(run.stderr)
    assert "did not start within 20 s (--start-deadline): its ServerApp, launched at" in line
    assert f"it may still start: `fedbandit pull {out}` follows it" in line
    assert pulled is not None, deployment.logs()
    if pulled.returncode == 3:  # 10 s of sleep and loading at a load above ~30 passed Flower's 30 s
        [line] = error_lines(pulled.stderr)
        assert "did not start within 20 s (--start-deadline): the SuperLink launched its" in line
        assert "the run was stopped" in line
    else:
        assert pulled.returncode == 0, pulled.stderr + deployment.logs()
        assert read_json(out / "manifest.json")["status"] == "complete"
    assert not left_behind(tmp_path, superlink)


@pytest.mark.slow
@pytest.mark.heavy
def test_under_a_cpu_burner_a_deployment_finishes_or_ends_in_one_line(tmp_path):
    """8 busy loops (4 per core here) run beside a 4-node loopback deployment of ``fedpe_tiny``:
    ``fedbandit run`` either finishes, or ends in one ``fedbandit: error:`` line (exit 3) within
    its deadlines, and leaves no process. The burners are killed whatever happens."""
    out = tmp_path / "out"
    deployment = Deployment(tmp_path)
    burners: list[subprocess.Popen] = []
    try:
        superlink = start_slowly(deployment, ["0-4", "5-9", "10-14", "15-19"])  # M = 20
        burners = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(8)
        ]
        started = time.monotonic()
        run = subprocess.run(
            [
                *FEDBANDIT,
                "run",
                "fedpe_tiny",
                "--seeds",
                "1",
                "--set",
                'algorithms=["fedpe"]',
                "--quiet",
                "--runtime",
                "flower",
                "--superlink",
                superlink,
                "--insecure",
                "--out",
                str(out),
                "--start-deadline",
                "120",
                "--run-timeout",
                "900",
            ],
            capture_output=True,
            text=True,
            timeout=1500,
        )
        took = time.monotonic() - started
    finally:
        for burner in burners:
            burner.kill()
        for burner in burners:
            burner.wait()
        deployment.close()
    print(f"burner run: exit {run.returncode} in {took:.0f} s; stderr:\n{run.stderr}")
    assert "Traceback" not in run.stderr
    if run.returncode != 0:
        assert run.returncode == 3, run.stderr + deployment.logs()
        [line] = error_lines(run.stderr)
        timed_out = ("--start-deadline", "no reply within", "did not answer within")
        assert any(words in line for words in timed_out), run.stderr + deployment.logs()
    else:
        assert read_json(out / "manifest.json")["status"] == "complete"
    assert not left_behind(tmp_path, superlink)


class RefusingSuperLink(ScriptedSubmission):
    """A detached run's SuperLink, listening, whose run is ``starting``: queued ``queued_ago``
    seconds ago and launched again ``launched_ago`` seconds ago."""

    def __init__(self, address: str, queued_ago: float, launched_ago: float) -> None:
        import datetime as dt

        now = dt.datetime.now(dt.UTC)
        stamp = [
            (now - dt.timedelta(seconds=ago)).isoformat(sep=" ").replace("+00:00", "Z")
            for ago in (queued_ago, launched_ago)
        ]
        super().__init__([row("starting", stamp[1], pending_at=stamp[0])], deadline=120)
        object.__setattr__(self, "superlink", address)

    def run_status(self, env: dict[str, str], run_id: int) -> tuple[str, str]:
        return "starting", ""


def test_a_detached_run_refused_past_its_deadline_is_stopped_by_pull(listening, monkeypatch):
    """``pull`` of a detached run whose ServerApp the SuperLink refused and launched again, longer
    ago than --start-deadline after it was queued: the run is stopped and the folder's seeds end
    with the reason (``pull`` then exits 3). Refused but within the deadline, or only slow: left
    as it is (exit 75)."""
    import fedbandit.runs.detached as detached
    from fedbandit.flower.run_log import detached_state

    assert detached_state(RefusingSuperLink(listening, 100, 40), 7).refused is None
    assert detached_state(RefusingSuperLink(listening, 300, 290), 7).refused is None  # one launch
    submission = RefusingSuperLink(listening, 300, 200)
    refused = detached_state(submission, 7).refused
    assert refused is not None and refused.startswith(
        "Flower run 7 did not start within 120 s (--start-deadline): the SuperLink launched its "
        "ServerApp 2 times and refused each one that reported after its window"
    )
    taken = []
    found = ({"config": {}}, submission, 7)
    monkeypatch.setattr(detached, "_detached_run", lambda run_dir, reach: found)
    monkeypatch.setattr(detached, "validate_experiment", lambda config: None)
    monkeypatch.setattr(detached, "_take_seeds", lambda *args: taken.append(args[3]))
    detached.pull_detached(Path("unused"))
    assert ("flwr", "stop", "7") in submission.asked
    [state] = taken
    assert state.status == "finished:stopped"
    assert state.error == f"{refused}; the run was stopped"
