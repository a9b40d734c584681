"""fedbandit.flower.internals.pull_backoff: the object-pull waits of Flower's SuperNode and
ServerApp."""

from __future__ import annotations

import sys
import types

import pytest

from fedbandit.flower.internals import pull_backoff


@pytest.fixture
def fake_module(monkeypatch):
    """A module calling ``pull_objects`` as Flower's do, recording the waits it was given."""
    calls = []

    def pull_objects(
        object_ids, pull_object_fn, *, initial_backoff=1, backoff_cap=10, max_time=7200
    ):
        calls.append((initial_backoff, backoff_cap))
        module.max_times.append(max_time)
        return {}

    module = types.ModuleType("fake_flower_puller")
    module.pull_objects = pull_objects
    module.max_times = []
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module, calls


def test_install_shortens_the_waits_and_can_be_repeated(fake_module, monkeypatch):
    module, calls = fake_module
    monkeypatch.delenv(pull_backoff.ENV, raising=False)
    assert pull_backoff.install(module.__name__) is True
    module.pull_objects(["a"], lambda i: b"")
    assert calls[-1] == pull_backoff.DEFAULT_BACKOFF == (0.02, 0.2)
    assert pull_backoff.install(module.__name__, (0.05, 0.5)) is True  # wraps the original once
    module.pull_objects(["a"], lambda i: b"", initial_backoff=0.3)  # an explicit wait stays
    assert calls[-1] == (0.3, 0.5)
    # a message whose sender died mid-upload is given up after a bounded time, not two hours
    assert module.max_times[-1] == pull_backoff.OBJECT_WAIT_SECONDS == 20.0
    # the ServerApp works to a round's deadline: a dead uploader costs a quarter of it at most,
    # so the live nodes' replies, pulled after it, are still in time
    pull_backoff.install(module.__name__, round_timeout=20.0)
    module.pull_objects(["a"], lambda i: b"")
    assert module.max_times[-1] == 5.0
    pull_backoff.install(module.__name__, round_timeout=120.0)
    module.pull_objects(["a"], lambda i: b"")
    assert module.max_times[-1] == 20.0
    # the SuperNode waits a default round for its message: giving up early only loses it
    pull_backoff.install(module.__name__, max_time=pull_backoff.SUPERNODE_OBJECT_WAIT_SECONDS)
    module.pull_objects(["a"], lambda i: b"")
    assert module.max_times[-1] == 60.0


def test_the_environment_chooses_the_waits_or_flowers(fake_module, monkeypatch):
    module, calls = fake_module
    monkeypatch.setenv(pull_backoff.ENV, "flower")
    assert pull_backoff.install(module.__name__) is False
    module.pull_objects(["a"], lambda i: b"")
    assert calls[-1] == (1, 10) and module.max_times[-1] == 7200  # Flower's own limit
    monkeypatch.setenv(pull_backoff.ENV, "0.1,0.4")
    assert pull_backoff.install(module.__name__) is True
    module.pull_objects(["a"], lambda i: b"")
    assert calls[-1] == (0.1, 0.4)
    for bad in ("0.1", "a,b", "0.5,0.1", "0,1"):
        with pytest.raises(ValueError, match=pull_backoff.ENV):
            pull_backoff.backoff_from_env(bad)


def test_another_flower_version_is_refused(fake_module, monkeypatch):
    module, _ = fake_module
    monkeypatch.setattr(pull_backoff.importlib.metadata, "version", lambda name: "1.43.0")
    with pytest.raises(RuntimeError, match=r"flwr 1\.43\.0"):
        pull_backoff.install(module.__name__, (0.02, 0.2))


def test_the_unavailable_objects_code_is_flowers():
    from flwr.common.constant import ErrorCode

    assert pull_backoff.MESSAGE_UNAVAILABLE == ErrorCode.MESSAGE_UNAVAILABLE


def test_flowers_own_modules_have_the_function_it_replaces():
    import importlib

    for name in (pull_backoff.SUPERNODE_MODULE, pull_backoff.SERVERAPP_MODULE):
        assert callable(importlib.import_module(name).pull_objects), name


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (pull_backoff.ENV, "fast", "FEDBANDIT_PULL_BACKOFF must be FIRST,CAP seconds"),
        ("FEDBANDIT_SUPERNODE_POLL", "soon", "FEDBANDIT_SUPERNODE_POLL must be seconds in"),
        ("FEDBANDIT_SUPERNODE_POLL", "5", "FEDBANDIT_SUPERNODE_POLL must be seconds in"),
        (
            pull_backoff.SUPERNODE_OBJECT_WAIT_ENV,
            "0.5",
            "FEDBANDIT_SUPERNODE_OBJECT_WAIT must be seconds in [1, 3600]",
        ),
    ],
)
def test_supernode_refuses_a_wrong_setting_in_one_line_before_starting_anything(
    monkeypatch, capsys, name, value, message
):
    from fedbandit.flower.internals import supernode_main

    def no_process(*args, **kwargs):
        raise AssertionError("a process was started before the settings were checked")

    monkeypatch.setattr(supernode_main.subprocess, "Popen", no_process)
    monkeypatch.setenv(name, value)
    code = supernode_main.main(["--warm-executor", "--insecure", "--superlink", "127.0.0.1:1"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"fedbandit: {message}"), lines
