"""The warm ClientApp executor (``fedbandit.flower.internals.warm_executor``) and its launch next
to a SuperNode: error replies as Flower makes them, the app cache, the command lines, exit on
signals and on the SuperNode's death, and (slow) a real deployment with identical results."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from flower_deploy import Deployment, free_port, wait_for_port
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.client_app import LoadClientAppError
from flwr.common.constant import ErrorCode, SubStatus
from flwr.supercore.task_identity import TaskIdentity

from fedbandit.config import ConfigError
from fedbandit.flower.internals import supernode_main
from fedbandit.flower.internals import warm_executor as wx
from fedbandit.flower.processes import supernode_command


@pytest.fixture
def task_identity():
    """Flower builds messages for the task in ``TaskIdentity`` (set by pulling a task)."""
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 11, 7, 5
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


def test_error_reply_has_flowers_code_and_reason():
    assert wx.error_of(ZeroDivisionError("division by zero")) == (
        ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
        "<class 'ZeroDivisionError'>:<'division by zero'>",
    )
    assert wx.error_of(LoadClientAppError("no module")) == (
        ErrorCode.LOAD_CLIENT_APP_EXCEPTION,
        "An exception was raised when attempting to load `ClientApp`",
    )


def fab(hash_str: str) -> SimpleNamespace:
    return SimpleNamespace(hash_str=hash_str, content=hash_str.encode())


def run(fab_id: str = "pub/app", version: str = "1.0") -> SimpleNamespace:
    return SimpleNamespace(fab_id=fab_id, fab_version=version)


def test_app_cache_installs_and_loads_once(tmp_path):
    installed, loaded = [], []
    cache = wx.AppCache(
        install=installed.append,
        load=lambda *key: loaded.append(key) or ClientApp(),
        project_dir=lambda *key: tmp_path / "-".join(key),
    )
    first = cache.client_app(run(), fab("aaa"))
    assert cache.client_app(run(), fab("aaa")) is first
    second = cache.client_app(run(version="2.0"), fab("aaa"))
    assert second is not first
    cache.client_app(run(), fab("bbb"))
    assert installed == [b"aaa", b"bbb"]
    assert loaded == [
        ("pub/app", "1.0", "aaa"),
        ("pub/app", "2.0", "aaa"),
        ("pub/app", "1.0", "bbb"),
    ]


def test_a_new_fab_does_not_reuse_an_old_fabs_modules(tmp_path, monkeypatch):
    """Flower imports an app module by name: the old FAB's module must be forgotten first."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    for version in ("old", "new"):
        (tmp_path / version / "fb_probe_app").mkdir(parents=True)
        (tmp_path / version / "fb_probe_app" / "__init__.py").write_text(f"VERSION = {version!r}")

    def load(fab_id: str, fab_version: str, fab_hash: str):
        sys.path.insert(0, str(tmp_path / fab_version))
        import fb_probe_app

        return fb_probe_app.VERSION

    cache = wx.AppCache(
        install=lambda content: None, load=load, project_dir=lambda *key: tmp_path / key[1]
    )
    try:
        assert cache.client_app(run(version="old"), fab("1")) == "old"
        assert cache.client_app(run(version="new"), fab("2")) == "new"
        assert str(tmp_path / "old") not in sys.path
        assert cache.client_app(run(version="old"), fab("1")) == "old"  # still cached
    finally:
        sys.modules.pop("fb_probe_app", None)


class FakeHeartbeat:
    def __init__(self, fn):
        self.is_running = False

    def start(self):
        self.is_running = True

    def stop(self):
        self.is_running = False


def test_a_raising_clientapp_gets_flowers_error_reply_and_the_executor_goes_on(
    task_identity, monkeypatch
):
    app = ClientApp()

    @app.train("step")
    def step(message: Message, context: Context) -> Message:
        context.state.config_records["seen"] = ConfigRecord({"calls": 1})
        if message.content.config_records["cfg"]["fail"]:
            raise ZeroDivisionError("division by zero")
        return Message(RecordDict(), reply_to=message)

    def task(fail: bool):
        content = RecordDict({"cfg": ConfigRecord({"fail": fail})})
        message = Message(content, dst_node_id=5, message_type="train.step")
        message.metadata.__dict__["_message_id"] = message.object_id
        context = Context(run_id=7, node_id=5, node_config={}, state=RecordDict(), run_config={})
        return message, context, run(), fab("h")

    tasks = [task(True), task(False)]
    pushed, outputs = [], []
    monkeypatch.setattr(wx, "pull_task_input", lambda client: tasks.pop(0))
    monkeypatch.setattr(wx, "push_message", lambda client, reply, context: pushed.append(reply))
    monkeypatch.setattr(wx, "push_task_output", lambda **kwargs: outputs.append(kwargs))
    monkeypatch.setattr(wx, "HeartbeatSender", FakeHeartbeat)
    monkeypatch.setattr(wx.WarmExecutor, "_client", lambda *a: SimpleNamespace(close=lambda: None))
    executor = wx.WarmExecutor(
        "127.0.0.1:1", apps=wx.AppCache(install=lambda c: None, load=lambda *key: app)
    )

    assert executor.run_task("token-1") == SubStatus.FAILED
    assert executor.run_task("token-2") == SubStatus.COMPLETED
    error = pushed[0]
    assert error.has_error() and error.error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    assert error.error.reason == "<class 'ZeroDivisionError'>:<'division by zero'>"
    assert not pushed[1].has_error()
    assert [o["sub_status"] for o in outputs] == [SubStatus.FAILED, SubStatus.COMPLETED]
    assert outputs[0]["details"] == error.error.reason and outputs[1]["details"] == ""
    # As in Flower, the context goes back as the handler left it, even when it raised.
    assert "seen" in outputs[0]["context"].state.config_records
    assert executor.tasks == 2


def test_retries_stop_once_closing():
    closing = SimpleNamespace(is_set=lambda: False, wait=lambda t: None)
    done = wx.threading.Event()
    invoker = wx.retry_invoker(closing, done)
    calls = []

    def fail():
        calls.append(1)
        if len(calls) == 3:
            done.set()
        raise wx.httpx.ConnectError("refused")

    with pytest.raises(wx.httpx.ConnectError):
        invoker.invoke(fail)
    assert len(calls) == 3


def test_warm_executor_command_follows_the_supernodes_runtime_api():
    command = supernode_main.warm_executor_command(["--port", "9710", "--insecure"], 42)
    assert command[1:3] == ["-m", "fedbandit.flower.internals.warm_executor"]
    assert command[3:] == [
        "--runtime-api-address",
        "127.0.0.1:9710",
        "--parent-pid",
        "42",
        "--insecure",
    ]
    tls = supernode_main.warm_executor_command(
        ["--host", "::1", "--ssl-ca-certfile", "ca.crt", "--isolation", "process"], 1
    )
    assert "[::1]:9094" in tls and tls[-2:] == ["--root-certificates", "ca.crt"]
    with pytest.raises(ValueError, match="isolation process"):
        supernode_main.warm_executor_command(["--isolation", "subprocess"], 1)


def test_supernode_command_warm_and_cold():
    warm = supernode_command("127.0.0.1:9700", (0, 25), 9710, insecure=True)
    assert warm[1:6] == [
        "-m",
        "fedbandit.flower.internals.supernode_main",
        "--warm-executor",
        "--isolation",
        "process",
    ]
    cold = supernode_command("127.0.0.1:9700", (0, 25), 9710, insecure=True, warm=False)
    assert "--warm-executor" not in cold and "--isolation" not in cold
    plain = supernode_command(
        "127.0.0.1:9700", (0, 25), 9710, insecure=True, fast_poll=False, warm=False
    )
    assert plain[0] == "flower-supernode" and "--warm-executor" not in plain
    with pytest.raises(ConfigError, match="launcher"):
        supernode_command("127.0.0.1:9700", (0, 25), 9710, insecure=True, fast_poll=False)


@pytest.mark.parametrize(
    ("flags", "warm", "launcher"),
    [
        ([], True, "supernode_main"),
        (["--cold"], False, "supernode_main"),
        (["--poll-interval", "0"], False, "flower-supernode"),
    ],
)
def test_cli_supernode_flags(flags, warm, launcher, tmp_path, capsys):
    from fedbandit.cli import main

    argv = ["supernode", "--superlink", "127.0.0.1:9700", "--clients", "0-3", "--insecure"]
    assert main([*argv, "--state-dir", str(tmp_path), "--print-command", *flags]) == 0
    printed = capsys.readouterr().out
    assert ("--warm-executor" in printed) == warm and launcher in printed


def test_capped_time_caps_idle_polls_and_local_waits(monkeypatch):
    slept = []
    monkeypatch.setattr(supernode_main.time, "sleep", slept.append)
    capped = supernode_main.capped_time(0.2, 0.02)
    capped.sleep(3)
    capped.sleep(0.5)
    capped.sleep(0.01)
    assert slept == [0.2, 0.02, 0.01]
    assert capped.monotonic is time.monotonic


def start_executor(tmp_path: Path, parent_pid: int) -> tuple[subprocess.Popen, Path]:
    """An executor polling a port where nothing listens (it retries), started like the
    SuperNode launcher starts it."""
    log = tmp_path / "executor.log"
    command = [
        sys.executable,
        "-m",
        "fedbandit.flower.internals.warm_executor",
        "--runtime-api-address",
        f"127.0.0.1:{free_port()}",
        "--parent-pid",
        str(parent_pid),
        "--insecure",
        "--preload",
        "json",
    ]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while "serving" not in log.read_text(errors="replace"):
        assert process.poll() is None, log.read_text(errors="replace")
        assert time.monotonic() < deadline, "the executor did not start"
        time.sleep(0.1)
    return process, log


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)


def test_executor_exits_on_sigterm(tmp_path):
    process, log = start_executor(tmp_path, os.getpid())
    try:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        assert "stopped after 0 tasks" in log.read_text(errors="replace")
    finally:
        stop(process)


def test_executor_exits_when_its_parent_dies(tmp_path):
    parent = subprocess.Popen(["sleep", "300"])
    try:
        process, log = start_executor(tmp_path, parent.pid)
        try:
            parent.kill()
            parent.wait()
            assert process.wait(timeout=20) == 0, log.read_text(errors="replace")
        finally:
            stop(process)
    finally:
        stop(parent)


def run_orphan(tmp_path: Path, body: str) -> tuple[int, float, str]:
    """Run ``body`` as an executor would (signal handlers and parent watch of ``warm_executor``),
    kill its parent once it printed "waiting": (exit code, seconds it outlived the parent, log)."""
    script = tmp_path / "orphan.py"
    script.write_text(
        "import sys, threading, time, concurrent.futures\n"
        "from fedbandit.flower.internals import warm_executor as wx\n"
        "wx._stop_on_signals()\n"
        "wx.watch_parent(int(sys.argv[1]))\n" + body
    )
    out = tmp_path / "orphan.log"
    parent = subprocess.Popen(["sleep", "300"])
    process = None
    try:
        with open(out, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, str(script), str(parent.pid)], stdout=log, stderr=log
            )
        deadline = time.monotonic() + 60
        while "waiting" not in out.read_text():
            assert process.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.05)
        stop(parent)
        started = time.monotonic()
        code = process.wait(timeout=20)
        return code, time.monotonic() - started, out.read_text()
    finally:
        stop(parent)
        if process is not None:
            stop(process)


def test_an_orphaned_executor_stuck_in_a_task_ends(tmp_path):
    """Issue 39: the executor's main thread waits without a timeout in Flower's object pulls and
    pushes (``as_completed`` over threads retrying a request to a SuperNode that is gone); a
    signal raised in the watching thread never interrupted that wait. Now the parent's death
    stops every retry and signals the process, whose main thread then exits at once."""
    code, seconds, log = run_orphan(
        tmp_path,
        "pool = concurrent.futures.ThreadPoolExecutor(2)\n"
        "def retrying():\n"  # a retried request: gives up once the executor stops
        "    while not wx.STOPPING.is_set():\n"
        "        time.sleep(0.05)\n"
        "future = pool.submit(retrying)\n"
        "print('waiting', flush=True)\n"
        "for done in concurrent.futures.as_completed([future]):\n"  # no timeout, as Flower's
        "    done.result()\n",
    )
    assert code == 0 and seconds < 2 and "stopping (the SuperNode" in log, log


def test_an_executor_whose_clean_up_hangs_is_ended_by_the_last_resort(tmp_path):
    """A thread that never ends (a request that never returns) keeps a Python process from
    exiting after SystemExit: ``os._exit`` ends it ``STOP_GRACE_SECONDS`` after the stop."""
    code, seconds, log = run_orphan(
        tmp_path,
        "wx.STOP_GRACE_SECONDS = 0.5\n"
        "threading.Thread(target=lambda: time.sleep(300)).start()\n"  # not a daemon
        "print('waiting', flush=True)\n"
        "time.sleep(300)\n",
    )
    assert code == 0 and 0.5 <= seconds < 3 and "exiting now" in log, log


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "\nState:\tZ" in status.read_text())


@pytest.mark.slow
def test_warm_deployment_gives_local_results_and_stops_with_its_supernode(tmp_path):
    """SuperLink + 2 warm SuperNodes: the local run's results, every message served by the warm
    executors (no flwr-clientapp process), and an executor ends when its SuperNode is killed."""
    from fedbandit.cli import main

    tiny = ["fedpe_tiny", "--seeds", "1", "--set", "instance.num_clients=4", "--set"]
    tiny += ["horizon=256", "--set", 'algorithms=["fedpe"]', "--quiet"]
    dirs = ("local", "deployed")
    deploy = Deployment(tmp_path)
    try:
        port = free_port()
        superlink = deploy.superlink(port, "--insecure")
        wait_for_port("127.0.0.1", port, timeout=60)
        for i, clients in enumerate(["0-1", "2-3"]):
            deploy.supernode(f"node{i}", superlink, clients, free_port(), "--insecure")
        assert main(["run", *tiny, "--out", str(tmp_path / "local")]) == 0
        code = main([
            "run", *tiny, "--runtime", "flower", "--superlink", superlink, "--insecure",
            "--out", str(tmp_path / "deployed"), "--round-timeout", "60",
        ])  # fmt: skip
        assert code == 0, deploy.logs()
        for suffix in ("regret.csv", "comm.csv", "clients.csv"):
            local, deployed = (tmp_path / d / "runs/fedpe" / f"seed_0.{suffix}" for d in dirs)
            assert local.read_bytes() == deployed.read_bytes(), suffix
        for i in range(2):
            log = deploy.log(f"node{i}")
            assert "[warm-executor] task" in log and "failed in" not in log, log[-3000:]
        node = deploy.processes["node0"]
        executors = children(node.pid)
        assert len(executors) == 1, executors
        os.kill(node.pid, signal.SIGKILL)
        node.wait(timeout=10)
        deadline = time.monotonic() + 15
        while alive(executors[0]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(executors[0]), "the warm executor outlived its SuperNode"
    finally:
        deploy.close()


def test_a_task_whose_message_never_arrives_is_given_up_and_the_executor_goes_on(
    task_identity, monkeypatch, caplog
):
    """The SuperLink died (or stopped the run) after the SuperNode took the task: its message's
    objects never arrive. Flower's own pull would retry for two hours; the executor gives up
    after OBJECT_PULL_SECONDS, reports the task failed and serves the next one."""
    from flwr.supercore.inflatable.inflatable_object import get_object_tree

    message = Message(RecordDict(), dst_node_id=5, message_type="train.step")
    pulls = []
    client = SimpleNamespace(
        PullTaskInput=lambda request: SimpleNamespace(
            task_id=3, run=SimpleNamespace(run_id=7), context=SimpleNamespace(node_id=5),
            fab=None,
        ),
        PullMessages=lambda request: SimpleNamespace(
            messages_list=[object()], message_object_trees=[get_object_tree(message)]
        ),
        PullObject=lambda request: pulls.append(request)
        or SimpleNamespace(object_found=True, object_available=False),
        ConfirmMessageReceived=lambda request: None,
    )  # fmt: skip
    monkeypatch.setattr(wx, "context_from_proto", lambda c: SimpleNamespace(node_id=5, run_id=7))
    monkeypatch.setattr(wx, "run_from_proto", lambda r: r)
    monkeypatch.setattr(wx, "fab_from_proto", lambda f: f)
    monkeypatch.setattr(wx, "OBJECT_PULL_SECONDS", 0.5)
    started = time.monotonic()
    with pytest.raises(wx.ObjectPullError):
        wx.pull_task_input(client)
    assert time.monotonic() - started < 5 and len(pulls) > 2  # asked again, then gave up

    outcomes = [wx.ObjectPullError("abc", "timeout or retry limit reached"), None]

    def pull(client):
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
        context = Context(run_id=8, node_id=5, node_config={}, state=RecordDict(), run_config={})
        return (
            Message(RecordDict(), dst_node_id=5, message_type="train.step"),
            context,
            run(),
            fab("h"),
        )

    app = ClientApp()

    @app.train("step")
    def step(message: Message, context: Context) -> Message:
        return Message(RecordDict(), reply_to=message)

    outputs = []
    monkeypatch.setattr(wx, "pull_task_input", pull)
    monkeypatch.setattr(wx, "push_message", lambda client, reply, context: None)
    monkeypatch.setattr(wx, "push_task_output", lambda **kwargs: outputs.append(kwargs))
    monkeypatch.setattr(wx, "HeartbeatSender", FakeHeartbeat)
    monkeypatch.setattr(wx.WarmExecutor, "_client", lambda *a: SimpleNamespace(close=lambda: None))
    executor = wx.WarmExecutor(
        "127.0.0.1:1", apps=wx.AppCache(install=lambda c: None, load=lambda *key: app)
    )
    with caplog.at_level("WARNING", logger="flwr"):
        assert executor.run_task("token-1") == SubStatus.FAILED
    assert "giving up on run 7" in caplog.text
    assert "did not arrive within 0.5 s" in outputs[0]["details"]
    assert executor.run_task("token-2") == SubStatus.COMPLETED
