"""Deployment commands and job encoding, without starting Flower processes."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from test_flower_runtime import flower_identity  # noqa: F401 - the fixture Flower messages need

from fedbandit.cli import main
from fedbandit.config import load_experiment
from fedbandit.errors import DeploymentError
from fedbandit.flower import seeds
from fedbandit.flower.apps import FlowerJob, job_from_json, job_to_json
from fedbandit.flower.processes import (
    ServerTls,
    flower_environment,
    parse_client_range,
    split_address,
    superlink_command,
    supernode_command,
    write_connection,
)
from fedbandit.flower.seeds import NODE_POLL_SECONDS, wait_for_secure_nodes
from fedbandit.runspec import RunSpec, RuntimeOptions


def test_client_ranges_and_addresses_parse_or_name_the_problem():
    assert parse_client_range("0-49") == (0, 50)
    assert parse_client_range("7") == (7, 1)
    for bad in ("a-b", "5-2", "-3"):
        with pytest.raises(DeploymentError, match="--clients"):
            parse_client_range(bad)
    assert split_address("10.0.0.1:9092") == ("10.0.0.1", 9092)
    assert split_address("[::1]:9092") == ("::1", 9092)
    for bad in ("host", "host:", "host:99999", ":80"):
        with pytest.raises(DeploymentError, match="HOST:PORT"):
            split_address(bad)


def test_superlink_command_has_safe_defaults(tmp_path):
    command = superlink_command(tmp_path, "127.0.0.1", 9300, insecure=True)
    assert command[:2] == ["flower-superlink", "--insecure"]
    assert "--disable-runtime-dependency-installation" in command
    assert command[command.index("--database") + 1] == str(tmp_path.resolve() / "superlink.db")
    in_memory = superlink_command(tmp_path, insecure=True, in_memory=True)
    assert in_memory[in_memory.index("--database") + 1] == ":flwr-in-memory:"
    with pytest.raises(DeploymentError, match="--insecure explicitly"):
        superlink_command(tmp_path)
    with pytest.raises(DeploymentError, match="needs TLS"):
        superlink_command(tmp_path, insecure=True, node_auth=True)
    with pytest.raises(DeploymentError, match="not found"):
        ServerTls.from_dir(tmp_path)


def test_supernode_command_names_its_clients_and_state(tmp_path):
    command = supernode_command(
        "127.0.0.1:9300", (50, 25), 9510, insecure=True, state_dir=tmp_path, fast_poll=False,
        warm=False,
    )  # fmt: skip
    assert command[0] == "flower-supernode"
    config = command[command.index("--node-config") + 1]
    assert config.startswith("first-client=50 num-clients=25")
    assert f'state-dir="{tmp_path.resolve() / "clients"}"' in config
    assert command[command.index("--port") + 1] == "9510"
    with pytest.raises(DeploymentError, match="not found"):
        supernode_command("h:1", (0, 1), insecure=True, auth_key=tmp_path / "missing")


def test_environment_keeps_flower_quiet_and_local(tmp_path):
    env = flower_environment(tmp_path, base={"PATH": "/usr/bin"})
    assert env["FLWR_TELEMETRY_ENABLED"] == "0"
    assert env["FLWR_DISABLE_UPDATE_CHECK"] == "1"
    assert env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"
    assert env["FLWR_HOME"].startswith(str(tmp_path.resolve()))
    assert env["PATH"].endswith("/usr/bin") and env["PATH"] != "/usr/bin"


def test_connection_file_for_tls_and_insecure(tmp_path):
    write_connection(tmp_path, "10.0.0.1:9092", False, tmp_path / "ca.crt")
    data = tomllib.loads((tmp_path / "config.toml").read_text())
    assert data["superlink"]["default"] == "fedbandit"
    assert data["superlink"]["fedbandit"] == {
        "address": "10.0.0.1:9092",
        "root-certificates": str((tmp_path / "ca.crt").resolve()),
    }
    with pytest.raises(DeploymentError):
        write_connection(tmp_path, "h:1", False, None)


def test_job_survives_the_run_config():
    options = RuntimeOptions(
        runtime="flower", superlink="h:9092", insecure=True, round_timeout=9.0,
        on_client_failure="drop",
    )  # fmt: skip
    spec = RunSpec(experiment=load_experiment("fedpe_tiny"), algorithm="fedpe", seed=2,
                   options=options)  # fmt: skip
    job = FlowerJob(spec, num_nodes=0, poll_seconds=0.05)
    back = job_from_json(job_to_json(job))
    assert back == job and back.entropy == [0, 2] and back.round_timeout == 9.0
    with pytest.raises(ValueError, match="unknown job keys"):
        job_from_json('{"spec": {}, "colour": 1}')
    broken = job_to_json(job).replace('"fedpe"', '"fedpe_from_elsewhere"')
    with pytest.raises(ValueError, match=r"does not validate on this host.*fedpe_from_elsewhere"):
        job_from_json(broken)
    with pytest.raises(ValueError, match="no 'job'"):
        job_from_json("")


def test_cli_refuses_unsafe_or_incomplete_deployment_options(tmp_path, capsys):
    assert main(["superlink", "--state-dir", str(tmp_path), "--print-command"]) == 2
    assert "--insecure explicitly" in capsys.readouterr().err
    assert main(["run", "fedpe_tiny", "--runtime", "flower", "--out", str(tmp_path / "o")]) == 2
    assert "--superlink" in capsys.readouterr().err
    code = main(["run", "fedpe_tiny", "--runtime", "flower", "--superlink", "h:1",
                 "--out", str(tmp_path / "o")])  # fmt: skip
    assert code == 2
    assert "--root-certificates" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "database"), [([], "superlink.db"), (["--in-memory"], ":flwr-in-memory:")]
)
def test_cli_superlink_database_follows_in_memory(flags, database, tmp_path, capsys):
    argv = ["superlink", "--insecure", "--state-dir", str(tmp_path), "--print-command", *flags]
    assert main(argv) == 0
    printed = capsys.readouterr().out.split()
    assert printed[printed.index("--database") + 1].endswith(database)


def test_supernode_refuses_to_start_without_a_client_range(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["supernode", "--superlink", "127.0.0.1:9092", "--insecure"])
    assert caught.value.code == 2
    assert "--clients" in capsys.readouterr().err


def test_an_unreachable_superlink_is_one_line_and_leaves_the_folder_resumable(tmp_path, capsys):
    """Nothing listens at --superlink: one error line naming it, exit 3, the folder incomplete
    with the reason, and no traceback."""
    import socket

    from fedbandit.results.files import read_json

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # free once closed: nothing listens there
    out = tmp_path / "out"
    code = main(
        ["run", "fedpe_tiny", "--seeds", "1", "--quiet", "--runtime", "flower", "--insecure",
         "--superlink", f"127.0.0.1:{port}", "--out", str(out)]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 3
    errors = [line for line in err.splitlines() if line.startswith("fedbandit: error:")]
    assert errors == [
        f"fedbandit: error: the SuperLink at 127.0.0.1:{port} is unreachable (connection "
        "refused): start it (`fedbandit superlink`) or check --superlink"
    ]
    manifest = read_json(out / "manifest.json")
    assert manifest["status"] == "incomplete" and "unreachable" in manifest["stopped"]
    assert "Traceback" not in err


class SlowSuperLink:
    """A stand-in for ``Submission`` whose SuperLink is listening (``address``) but answers
    ``flwr ls`` with ``status`` and ``flwr log`` only after a delay (it raises, as ``flwr``'s
    timeout does, when the caller's limit is shorter)."""

    def __init__(self, address: str, status: str, log: str = "", log_seconds: float = 0.0):
        self.superlink, self._status, self._log, self._log_seconds = (
            address, status, log, log_seconds,
        )  # fmt: skip
        self.log_timeouts: list[float] = []

    def environment(self) -> dict[str, str]:
        return {}

    def status(self, env, run_id):
        return self.run_status(env, run_id)[0]

    def run_status(self, env, run_id):
        if isinstance(self._status, Exception):
            raise self._status
        return self._status, self.details

    details = ""

    def log_text(self, run_id, timeout=120.0):
        self.log_timeouts.append(timeout)
        if self._log_seconds > timeout:
            raise DeploymentError(f"`flwr log {run_id}` did not finish within {timeout} s")
        return self._log


def test_a_slow_log_is_not_taken_for_an_empty_one(listening):
    """Under load `flwr log --show` can take longer than the wait: the seeds are then not shown
    as queued, nor pulled as absent; the caller is told to ask again (issue 40, item 3)."""
    from fedbandit.flower.run_log import RUNNING_LOG_WAIT_SECONDS, AskAgainError, detached_state

    busy = SlowSuperLink(listening, "running", log="", log_seconds=18.0)  # measured at load 15-19
    assert detached_state(busy, 7).files == {}  # waited for: 18 s is within the wait
    slow = SlowSuperLink(listening, "running", log="", log_seconds=RUNNING_LOG_WAIT_SECONDS + 3)
    with pytest.raises(AskAgainError, match=r"could not read the log of Flower run 7 .* in 60 s"):
        detached_state(slow, 7)
    assert slow.log_timeouts == [RUNNING_LOG_WAIT_SECONDS]
    quick = SlowSuperLink(listening, "running", log="", log_seconds=1.0)
    assert detached_state(quick, 7).files == {}  # read in time: empty means empty
    queued = SlowSuperLink(listening, "pending", log_seconds=1e9)
    assert detached_state(queued, 7).status == "pending"  # no log asked for


def test_an_unreachable_or_failing_superlink_means_ask_again(listening):
    """A SuperLink that is down, or that fails to answer `flwr ls`, is a reason to ask again,
    not a mistake of the user's (issue 40, item 4); a SuperLink that forgot the run is final."""
    import socket

    from fedbandit.flower.run_log import AskAgainError, detached_state
    from fedbandit.flower.submission import UnknownRunError

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(AskAgainError, match="is unreachable"):
        detached_state(SlowSuperLink(closed, "running"), 7)
    failing = SlowSuperLink(listening, DeploymentError("`flwr ls` did not finish within 120 s"))
    with pytest.raises(AskAgainError, match="did not say how Flower run 7 stands"):
        detached_state(failing, 7)
    forgot = SlowSuperLink(listening, UnknownRunError("does not know Flower run 7"))
    with pytest.raises(UnknownRunError):
        detached_state(forgot, 7)


@pytest.mark.parametrize("command", ["status", "pull"])
def test_status_and_pull_exit_75_while_the_superlink_cannot_answer(
    command, tmp_path, monkeypatch, capsys
):
    """The documented wait loop (`while fedbandit pull OUT; [ $? -eq 75 ]`) keeps waiting
    through an outage: one line on standard error, exit 75, the folder untouched."""
    import fedbandit.runs.detached as detached
    from fedbandit.flower.run_log import AskAgainError

    def down(*args, **kwargs):
        raise AskAgainError("the SuperLink at 127.0.0.1:9 is unreachable (connection refused)")

    monkeypatch.setattr(
        detached, "detached_status" if command == "status" else "pull_detached", down
    )
    assert main([command, str(tmp_path)]) == 75
    err = capsys.readouterr().err
    assert err == "fedbandit: the SuperLink at 127.0.0.1:9 is unreachable (connection refused)\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.usefixtures("flower_identity")
def test_clients_lost_in_an_earlier_seed_are_dropped_at_once():
    """Under drop, clients the command lost for good (named by the driver in the job, or
    dropped by an earlier seed on the same Grid, as in a detached run) are not waited for:
    discovery ends as soon as the live nodes cover the other clients, and the seed's first
    exchange drops them, so the seed completes with the survivors instead of waiting the start
    deadline and failing (issue 40, item 5). A node serving them again takes them back."""
    import dataclasses
    import time

    from test_flower_runtime import INSTANCE, FakeGrid, client_node, job_with

    from fedbandit.federation.runtime import run_federation
    from fedbandit.flower.grid_runtime import FlowerGridRuntime, discover_nodes
    from fedbandit.simulation import build_federation

    survivor, logic = client_node([0, 1, 2])
    replacement, _ = client_node([3, 4, 5])
    grid = FakeGrid({1: survivor})
    drop = job_with(start_deadline=30, on_client_failure="drop")
    told = dataclasses.replace(drop, absent_clients=(3, 4, 5))
    started = time.monotonic()
    ranges = discover_nodes(grid, told, 6)
    assert time.monotonic() - started < 5  # not the 30 s deadline
    assert list(ranges) == [1] and ranges.absent.tolist() == [3, 4, 5]

    class Runtime(FlowerGridRuntime):
        def regret_records(self):
            return [logic.regret_record()]

    server, _ = build_federation(INSTANCE, "fedpe", 300, [0, 0])
    runtime = Runtime(grid, ranges, timeout=5, poll_seconds=0.001)
    outcome = run_federation(server, runtime, "drop")
    assert outcome.status == "complete" and outcome.dropped == {3: 0, 4: 0, 5: 0}
    assert "clients 3-5: lost in an earlier seed of this command" in str(outcome.failure)
    assert outcome.regret.client_ids.tolist() == [0, 1, 2]
    assert (outcome.regret.client_pulls == 300).all()
    # The Grid remembers for its later seeds; a node serving the clients again takes them back.
    assert discover_nodes(grid, drop, 6).absent.tolist() == [3, 4, 5]
    again = discover_nodes(FakeGrid({1: survivor, 2: replacement}), told, 6)
    assert sorted(again) == [1, 2] and again.absent.size == 0
    with pytest.raises(DeploymentError, match=r"no node serves clients 3-5 after 0\.3 s"):
        discover_nodes(grid, job_with(start_deadline=0.3), 6)  # abort: waited for, as before


def test_pull_by_run_id_rebuilds_a_lost_folder_from_the_log(tmp_path, listening, monkeypatch):
    """`fedbandit pull --run-id ID --superlink ... OUT` with no folder: the run's record in the
    log (job, configuration, every seed of the run) makes the manifest and config.toml, the
    seeds come as `pull` fetches them, and the record itself is not written (issue 40, item 4).
    The SuperLink is a stand-in here; tests/test_deployment.py rebuilds from a real one."""
    import types

    import fedbandit.runs.detached as detached
    from fedbandit.flower.run_log import DetachedState
    from fedbandit.flower.run_record import RUN_RECORD, run_record
    from fedbandit.results.files import read_json
    from fedbandit.runtimes import local_seed_files

    options = RuntimeOptions(runtime="flower", superlink="10.0.0.5:9092", insecure=True)
    experiment = load_experiment("fedpe_tiny", ["horizon=64", "seeds=2", 'algorithms=["fedpe"]'])
    specs = [RunSpec(experiment=experiment, algorithm="fedpe", seed=s, options=options)
             for s in (0, 1)]  # fmt: skip
    jobs = [job_to_json(FlowerJob(spec, num_nodes=0)) for spec in specs]
    context = types.SimpleNamespace(run_id=7, run_config={"jobs": json.dumps(jobs)})
    emitted = {("fedpe", spec.seed): local_seed_files(spec) for spec in specs}
    state = {"now": DetachedState("running", {}, {("fedpe", 0): "round 3"}, None, [])}
    monkeypatch.setattr(detached, "detached_state", lambda submission, run_id: state["now"])
    out = tmp_path / "rebuilt"
    argv = ["pull", str(out), "--run-id", "7", "--superlink", listening, "--insecure", "--quiet"]
    assert main(argv) == 75  # nothing has finished: nothing to rebuild from yet
    assert not (out / "manifest.json").exists()
    first = {("fedpe", 0): emitted[("fedpe", 0)]}
    record = json.loads(run_record(FlowerJob(specs[0], 0), context)[RUN_RECORD])
    state["now"] = DetachedState("running", first, {}, None, [], record)
    assert main(argv) == 75  # rebuilt; seed 1 goes on
    manifest = read_json(out / "manifest.json")
    assert manifest["detached"]["runs"] == ["fedpe/seed_0", "fedpe/seed_1"]
    assert manifest["detached"]["flower_run"] == 7
    assert manifest["runtime_options"]["superlink"] == listening
    assert tomllib.loads((out / "config.toml").read_text())["horizon"] == 64
    state["now"] = DetachedState("finished:completed", emitted, {}, None, [], record)
    assert main(["pull", str(out), "--quiet"]) == 0  # an ordinary pull from then on
    assert read_json(out / "manifest.json")["status"] == "complete"
    assert not (out / RUN_RECORD).exists()
    for files in emitted.values():
        for path, text in files.items():
            assert (out / path).read_text() == text
    assert main(["pull", str(tmp_path / "other"), "--run-id", "7", "--insecure"]) == 2


def test_a_transient_superlink_error_is_asked_again(listening, monkeypatch):
    """A reachable SuperLink whose `flwr ls` fails now and then (HTTP 500, "database is locked"
    under load) is asked again with back-off before the failure counts: a seed is not given up
    for one locked database (issue 40, item 2, the driver's side); a lasting error still is."""
    import fedbandit.flower.submission as submission

    monkeypatch.setattr(submission, "RETRY_SECONDS", 0.01)
    locked = DeploymentError("`flwr ls` failed (1): HTTP 500: database is locked")

    class Flaky(submission.Submission):
        def __init__(self, failures: int) -> None:
            super().__init__(superlink=listening, state_dir=Path("."), insecure=True)
            object.__setattr__(self, "answers", [locked] * failures + ["finished:completed"])

        def run_info(self, env, run_id):
            answer = self.answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return {"status": answer}

    assert Flaky(submission.STATUS_RETRIES)._status_or_lost({}, 7, "x") == "finished:completed"
    with pytest.raises(DeploymentError, match="database is locked"):
        Flaky(submission.STATUS_RETRIES + 1)._status_or_lost({}, 7, "x")


class _Listing:
    """A submission whose SuperLink lists ``counts[i]`` SuperNodes online at its i-th look (the
    last count from then on); ``fails``: the listing fails."""

    superlink = "127.0.0.1:9093"

    def __init__(self, counts: list[int], fails: bool = False) -> None:
        self.counts, self.fails, self.looks = counts, fails, 0

    def online_nodes(self, timeout: float = 120.0) -> set[str]:
        assert 5.0 <= timeout <= 30.0  # a look never outlasts the deadline by much
        if self.fails:
            raise DeploymentError("flwr supernode ls failed")
        count = self.counts[min(self.looks, len(self.counts) - 1)]
        self.looks += 1
        return {str(n) for n in range(count)}


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def reachable(monkeypatch):
    """The fake SuperLink accepts connections (the node check asks only reachable ones)."""
    monkeypatch.setattr(seeds, "unreachable", lambda address: None)


def _secure_options(**extra) -> RuntimeOptions:
    return RuntimeOptions(
        runtime="flower",
        superlink="127.0.0.1:9093",
        insecure=True,
        secure_aggregation=True,
        **extra,
    )


def test_a_secure_run_waits_for_enough_supernodes_before_it_is_submitted(capsys, reachable):
    listing, clock = _Listing([1, 2, 3]), _Clock()
    wait_for_secure_nodes(listing, _secure_options(), clock, clock.sleep)
    assert listing.looks == 3 and clock.now == 2 * NODE_POLL_SECONDS
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "waiting up to 120 s for 3 SuperNodes" in err
    ready = _Listing([4])
    wait_for_secure_nodes(ready, _secure_options(), clock, clock.sleep)
    assert ready.looks == 1 and capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("extra", "online", "needed", "names"),
    [
        ({}, 2, 3, "fewer than 3 nodes"),
        ({"secure_threshold": 5}, 4, 5, "--secure-threshold 5"),
    ],
)
def test_too_few_supernodes_refuse_a_secure_run_in_one_line_before_submission(
    extra, online, needed, names, reachable
):
    listing, clock = _Listing([online]), _Clock()
    options = _secure_options(start_deadline=10.0, **extra)
    with pytest.raises(DeploymentError) as caught:
        wait_for_secure_nodes(listing, options, clock, clock.sleep)
    text = str(caught.value)
    assert "\n" not in text and f"needs {needed} or more SuperNodes" in text and names in text
    assert f"lists {online} online after 10 s" in text and "nothing was submitted" in text
    assert clock.now == pytest.approx(10.0)
    assert ("lower --secure-threshold" in text) == ("secure_threshold" in extra)


def test_the_node_check_is_skipped_without_secure_aggregation_or_a_listing(reachable):
    clock = _Clock()
    plain = RuntimeOptions(runtime="flower", superlink="127.0.0.1:9093", insecure=True)
    listing = _Listing([0])
    wait_for_secure_nodes(listing, plain, clock, clock.sleep)
    assert listing.looks == 0
    wait_for_secure_nodes(_Listing([0], fails=True), _secure_options(), clock, clock.sleep)
    assert clock.now == 0  # the ServerApp checks the nodes that serve the run


def test_an_unreachable_superlink_is_left_to_the_submission():
    listing, clock = _Listing([0]), _Clock()  # nothing listens at 127.0.0.1:9 (discard)
    listing.superlink = "127.0.0.1:9"
    wait_for_secure_nodes(listing, _secure_options(), clock, clock.sleep)
    assert listing.looks == 0


def test_a_failed_run_says_why_the_superlink_ended_it(listening):
    """A run whose ServerApp stopped reporting (its SuperLink restarted mid-run) is said to have
    lost its ServerApp, not only to have "ended 'finished:failed'"."""
    from fedbandit.flower.run_log import detached_state

    lost = SlowSuperLink(listening, "finished:failed")
    lost.details = "No heartbeat received from the task"  # seen after a SuperLink restart
    error = detached_state(lost, 7).error
    assert error.startswith("the Flower run ended 'finished:failed' mid-run: its ServerApp ")
    assert "the SuperLink was restarted or unreachable" in error and "heartbeat" in error
    lost.details = "Task failed because the run expired"
    assert "mid-run: its ServerApp stopped reporting" in detached_state(lost, 7).error
    other = SlowSuperLink(listening, "finished:failed")
    other.details = "Task failed with unknown error."
    assert detached_state(other, 7).error == (
        "the Flower run ended 'finished:failed' (Flower: 'Task failed with unknown error.')"
    )
    assert detached_state(SlowSuperLink(listening, "finished:failed"), 7).error == (
        "the Flower run ended 'finished:failed'"
    )
