"""The network-namespace harness (tests/netns.py): hosts reach each other and the root namespace,
loopback is per namespace, and every process, namespace, veth and bridge is gone afterwards,
also when the test body raises or a previous run crashed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import netns
import pytest
from netns import VirtualNetwork, netns_available, sweep_stale, virtual_hosts

REASON = netns_available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

PREFIX = "fbt"  # distinct from the default prefix, so these tests never sweep other runs


def unique_prefix() -> str:
    """A prefix of this run only: the sweep tests fake dead owners, which any sweep removes."""
    return f"s{uuid.uuid4().hex[:3]}"


PORT = 8000
PY = sys.executable


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True).stdout
    return {entry["name"] for entry in json.loads(out or "[]")}


def links() -> set[str]:
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True).stdout
    return {entry["ifname"] for entry in json.loads(out or "[]")}


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (orphans may be reaped late by PID 1)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] not in ("Z", "X")


def assert_cleaned_up(net: VirtualNetwork, pids: list[int]) -> None:
    assert not set(net.namespaces) & namespaces()
    assert not {net.bridge, *net.veths} & links()
    assert not any(name.startswith(net.tag) for name in links())
    assert not [pid for pid in pids if alive(pid)]


def fetch(url: str) -> str:
    return (
        "import urllib.request,sys;"
        f"sys.stdout.write(urllib.request.urlopen({url!r}, timeout=5).read().decode())"
    )


def connect(address: str, port: int) -> str:
    return f"import socket;socket.create_connection(({address!r},{port}),timeout=2).close()"


def start_http_server(net: VirtualNetwork, root: Path) -> subprocess.Popen:
    (root / "index.txt").write_text("hello from host 0")
    host = net.hosts[0]
    argv = [PY, "-m", "http.server", str(PORT), "--bind", host.address, "--directory", str(root)]
    server = host.popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    net.wait_for_tcp(host.address, PORT)  # from the root namespace, through the bridge
    return server


def test_hosts_talk_over_the_bridge_and_everything_is_removed(tmp_path: Path) -> None:
    with virtual_hosts(3, prefix=PREFIX) as net:
        h0, h1, h2 = net.hosts
        assert len({h.address for h in net.hosts} | {net.root_address}) == 4
        assert all(h.address.startswith("10.") for h in net.hosts)
        assert net.root_address.endswith(".254")
        server = start_http_server(net, tmp_path)
        url = f"http://{h0.address}:{PORT}/index.txt"

        for client in (h1, h2):
            result = client.run([PY, "-c", fetch(url)], timeout=10)
            assert result.returncode == 0, result.stderr
            assert result.stdout == "hello from host 0"

        # Root namespace -> host 0 via the bridge address.
        root_side = subprocess.run([PY, "-c", fetch(url)], capture_output=True, text=True)
        assert root_side.stdout == "hello from host 0", root_side.stderr

        # Host 1 -> a server in the root namespace bound to the bridge address.
        with socket.create_server((net.root_address, 0)) as listener:
            port = listener.getsockname()[1]
            accepted = threading.Thread(target=lambda: listener.accept()[0].close(), daemon=True)
            accepted.start()
            result = h1.run([PY, "-c", connect(net.root_address, port)], timeout=10)
            assert result.returncode == 0, result.stderr
            accepted.join(5)

        # Loopback is per namespace: host 1's 127.0.0.1 server is invisible from host 0.
        local = h1.popen([PY, "-m", "http.server", str(PORT), "--bind", "127.0.0.1"])
        net.wait_for_tcp("127.0.0.1", PORT, from_host=h1)
        result = h0.run([PY, "-c", connect("127.0.0.1", PORT)], timeout=10)
        assert result.returncode != 0
        assert "ConnectionRefused" in result.stderr
        pids = [server.pid, local.pid]
        assert all(alive(pid) for pid in pids)

    assert_cleaned_up(net, pids)
    assert server.returncode is not None and local.returncode is not None
    net.close()  # idempotent: everything is already gone, nothing raises
    net.stop_all()


def test_exception_in_body_still_cleans_up(tmp_path: Path) -> None:
    # A grandchild that leaves the process group (setsid) is only found via `ip netns pids`.
    spawner = (
        "import subprocess,sys,time;"
        "p=subprocess.Popen([sys.executable,'-c','import time; time.sleep(120)'],"
        "start_new_session=True);print(p.pid,flush=True);time.sleep(120)"
    )
    pids: list[int] = []
    network: list[VirtualNetwork] = []

    def body() -> None:
        with virtual_hosts(3, prefix=PREFIX) as net:
            network.append(net)
            server = start_http_server(net, tmp_path)
            detacher = net.hosts[2].popen([PY, "-c", spawner], stdout=subprocess.PIPE, text=True)
            assert detacher.stdout is not None
            orphan = int(detacher.stdout.readline())
            pids.extend([server.pid, detacher.pid, orphan])
            assert all(alive(pid) for pid in pids)
            raise RuntimeError("test body failed")

    with pytest.raises(RuntimeError, match="test body failed"):
        body()
    assert len(pids) == 3
    assert_cleaned_up(network[0], pids)


def test_sigterm_ignoring_process_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns, "TERM_GRACE", 0.5)
    stubborn = (
        "import signal,time;signal.signal(signal.SIGTERM,signal.SIG_IGN);"
        "print('ready',flush=True);time.sleep(120)"
    )
    with virtual_hosts(1, prefix=PREFIX) as net:
        proc = net.hosts[0].popen([PY, "-c", stubborn], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        net.stop_all()  # the network stays usable after stop_all
        assert proc.returncode == -signal.SIGKILL
        assert net.hosts[0].run(["true"]).returncode == 0
    assert_cleaned_up(net, [proc.pid])


def test_run_timeout_kills_the_process_group() -> None:
    with virtual_hosts(1, prefix=PREFIX) as net:
        with pytest.raises(subprocess.TimeoutExpired):
            net.hosts[0].run([PY, "-c", "import time; time.sleep(60)"], timeout=0.5)
        assert not [p for p in net.processes if p.poll() is None]


def test_sweep_stale_removes_leftovers_of_dead_owners() -> None:
    prefix = unique_prefix()
    # Names in the harness's scheme whose owner pid cannot exist (> PID_MAX_LIMIT = 0x400000),
    # unique per run so concurrent runs of this test do not collide.
    dead = f"{prefix}{0xF00000 + (os.getpid() & 0xFFFFF):x}-1"
    stale_ns, stale_bridge, stale_veth, stale_peer = (dead + k for k in ("h0", "b", "v0", "p0"))
    subprocess.run(["ip", "netns", "add", stale_ns], check=True)
    subprocess.run(["ip", "link", "add", stale_bridge, "type", "bridge"], check=True)
    subprocess.run(
        ["ip", "link", "add", stale_veth, "type", "veth", "peer", "name", stale_peer], check=True
    )
    sleeper = subprocess.Popen(
        ["ip", "netns", "exec", stale_ns, PY, "-c", "import time; time.sleep(120)"],
        start_new_session=True,
    )
    # Ours (this process is alive): must survive the sweep.
    own_ns = f"{prefix}{os.getpid():x}-999h0"
    subprocess.run(["ip", "netns", "add", own_ns], check=True)
    try:
        removed = sweep_stale(prefix)
        assert {stale_ns, stale_bridge, stale_veth} <= set(removed)
        assert stale_ns not in namespaces()
        assert not {stale_bridge, stale_veth, stale_peer} & links()
        assert sleeper.wait(timeout=5) is not None
        assert own_ns in namespaces()
        assert sweep_stale(prefix) == []  # idempotent
    finally:
        subprocess.run(["ip", "netns", "del", own_ns], check=False)
        if sleeper.poll() is None:
            os.killpg(sleeper.pid, signal.SIGKILL)
            sleeper.wait()
        sweep_stale(prefix)


def test_sweep_spares_live_runs_and_reaps_crashed_ones() -> None:
    """A run in another process is left alone while it lives and swept once it is SIGKILLed
    (no context-manager exit, no atexit)."""
    prefix = unique_prefix()
    child = (
        "import json,os,signal,sys\n"
        "from netns import virtual_hosts\n"
        f"with virtual_hosts(2, prefix={prefix!r}) as net:\n"
        "    print(json.dumps([net.namespaces, [net.bridge, *net.veths]]), flush=True)\n"
        "    sys.stdin.read()\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    proc = subprocess.Popen(
        [PY, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        child_namespaces, child_links = json.loads(proc.stdout.readline())
        sweep_stale(prefix)
        assert set(child_namespaces) <= namespaces()
        assert set(child_links) <= links()
        proc.stdin.close()
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert set(child_namespaces) <= namespaces()  # a crash leaves them behind ...
        removed = sweep_stale(prefix)  # ... and the sweep removes them
        assert set(child_namespaces) | set(child_links) <= set(removed)
        assert not set(child_namespaces) & namespaces()
        assert not set(child_links) & links()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sweep_stale(prefix)
