"""Network-namespace harness for multi-host tests (Linux, root, iproute2).

Each virtual host is a network namespace with its own loopback and one interface ``eth0`` (a
veth pair whose other end is attached to a bridge in the root namespace). All hosts share one
``/24`` subnet chosen not to clash with any route on the machine; host ``i`` is ``10.X.Y.(i+1)``
and the bridge itself is ``10.X.Y.254``, so the test process (root namespace) can reach servers
in the namespaces directly, and processes in the namespaces can reach servers that the test
process binds on ``network.root_address`` (or ``0.0.0.0``). There is no default route in the
namespaces: nothing in them can reach the outside world. Loopback is per namespace: ``127.0.0.1``
in one host is not ``127.0.0.1`` in another.

Usage::

    from netns import netns_available, virtual_hosts

    reason = netns_available()
    if reason:
        pytest.skip(reason)
    with virtual_hosts(3) as net:
        server = net.hosts[0].popen([sys.executable, "-m", "http.server", "8000",
                                     "--bind", net.hosts[0].address])
        net.wait_for_tcp(net.hosts[0].address, 8000)       # probed from the root namespace
        result = net.hosts[1].run(["curl", f"http://{net.hosts[0].address}:8000/"])
    # every process started, every process left in the namespaces, the namespaces, the veths
    # and the bridge are gone here, also if the body raised.

Cleanup runs on exit of :func:`virtual_hosts` (normal or exception) and, as a fallback, at
interpreter exit (``atexit``), e.g. after a KeyboardInterrupt. A run killed outright (SIGKILL)
leaves resources behind; :func:`virtual_hosts` calls :func:`sweep_stale` first, which removes
leftovers of runs whose owning process is dead (each process holds an ``flock`` on
``/run/fedbandit-netns/<prefix><pid>.lock`` while alive, so concurrent test runs, e.g. by other
people on the same machine, are left alone).

Names: ``<prefix><pid hex>-<counter><kind>`` with kind ``b`` (bridge), ``v<i>`` (root end of
host ``i``'s veth), ``p<i>`` (namespace end before it is moved and renamed ``eth0``) and ``h<i>``
(namespace of host ``i``). Linux interface names are at most 15 characters, so the prefix is
short (default ``fbn``).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import functools
import ipaddress
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

__all__ = [
    "DEFAULT_PREFIX",
    "NetnsError",
    "VirtualHost",
    "VirtualNetwork",
    "netns_available",
    "sweep_stale",
    "virtual_hosts",
]

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "fbn"
IFNAMSIZ = 15  # usable characters of a Linux interface name
TERM_GRACE = 5.0  # seconds between SIGTERM and SIGKILL
KILL_GRACE = 2.0  # seconds to wait for processes to vanish after SIGKILL
STATE_DIR = Path("/run/fedbandit-netns")
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,5}$")

_StdStream = int | IO[Any] | None


class NetnsError(RuntimeError):
    """An ``ip`` command failed while building a virtual network."""


# ---------------------------------------------------------------------------------------------
# Low-level helpers


def _ip_binary() -> str | None:
    return shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip") if os.path.exists(p)),
        None,
    )


def _ip(*args: str, check: bool = True, timeout: float = 20.0) -> subprocess.CompletedProcess:
    binary = _ip_binary()
    if binary is None:
        raise NetnsError("`ip` (iproute2) not found")
    proc = subprocess.run(
        [binary, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _ip_quiet(*args: str) -> bool:
    """Run ``ip`` for cleanup: never raises, logs failures; True on success."""
    try:
        proc = _ip(*args, check=False)
    except (OSError, subprocess.SubprocessError, NetnsError) as exc:
        log.warning("ip %s: %s", " ".join(args), exc)
        return False
    if proc.returncode != 0:
        log.warning("ip %s failed (%d): %s", " ".join(args), proc.returncode, proc.stderr.strip())
        return False
    return True


def _ip_json(*args: str) -> list[dict[str, Any]]:
    out = _ip("-j", *args).stdout.strip()
    return json.loads(out) if out else []


def _list_namespaces() -> set[str]:
    try:
        return {entry["name"] for entry in _ip_json("netns", "list")}
    except (OSError, subprocess.SubprocessError, NetnsError, ValueError) as exc:
        log.warning("cannot list namespaces: %s", exc)
        return set()


def _list_links() -> set[str]:
    try:
        return {entry["ifname"] for entry in _ip_json("link", "show")}
    except (OSError, subprocess.SubprocessError, NetnsError, ValueError) as exc:
        log.warning("cannot list links: %s", exc)
        return set()


def _namespace_pids(namespace: str) -> set[int]:
    """Live processes whose network namespace is ``namespace`` (zombies excluded)."""
    try:
        proc = _ip("netns", "pids", namespace, check=False)
    except (OSError, subprocess.SubprocessError, NetnsError) as exc:
        log.warning("ip netns pids %s: %s", namespace, exc)
        return set()
    pids = {int(tok) for tok in proc.stdout.split() if tok.isdigit()}
    return {pid for pid in pids if _process_state(pid) not in (None, "Z", "X")}


def _process_state(pid: int) -> str | None:
    """Single-letter state of a process (``Z`` for zombie), None if it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()[0]


def _group_pids(pgid: int) -> set[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    found: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found.add(int(entry.name))
    return found


def _signal_pid(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


# ---------------------------------------------------------------------------------------------
# Ownership: one flock per (prefix, process), so sweeps can tell crashed runs from live ones.

_owner_lock = threading.Lock()
_owner_fds: dict[str, int] = {}


def _owner_file(prefix: str, pid: int) -> Path:
    return STATE_DIR / f"{prefix}{pid:x}.lock"


def _claim_ownership(prefix: str) -> None:
    """Hold an exclusive flock for (prefix, this pid) until the process exits."""
    with _owner_lock:
        if prefix in _owner_fds:
            return
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        fd = os.open(_owner_file(prefix, os.getpid()), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        fcntl.flock(fd, fcntl.LOCK_EX)
        _owner_fds[prefix] = fd


def _owner_alive(prefix: str, pid: int) -> bool:
    if pid == os.getpid():
        return True
    path = _owner_file(prefix, pid)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        # No lock file (e.g. wiped state dir): fall back to "does the pid exist".
        return _process_state(pid) not in (None, "Z", "X")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        path.unlink()
    return False


@contextlib.contextmanager
def _global_lock() -> Iterator[None]:
    """Serialise subnet selection across processes (check-then-claim would race otherwise)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(STATE_DIR / "subnet.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# Availability


@functools.cache
def netns_available() -> str | None:
    """None if namespaces, veths and bridges can be created here, else the reason to skip.

    Probes once (cached) by creating and deleting a throwaway namespace, veth pair and bridge.
    """
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (platform is {sys.platform})"
    if os.geteuid() != 0:
        return "network namespaces need root"
    if _ip_binary() is None:
        return "`ip` (iproute2) not found"
    tag = f"fbprobe{uuid.uuid4().hex[:6]}"  # 13 characters
    namespace, bridge, veth, peer = f"{tag}-ns", f"{tag}b", f"{tag}v", f"{tag}p"
    try:
        _ip("netns", "add", namespace)
        _ip("link", "add", bridge, "type", "bridge")
        _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", namespace)
        _ip("-n", namespace, "link", "set", "lo", "up")
    except (OSError, subprocess.SubprocessError, NetnsError) as exc:
        return f"cannot create network namespaces/veths/bridges: {exc}"
    finally:
        links = _list_links()
        for name in (veth, peer, bridge):
            if name in links:
                _ip_quiet("link", "del", name)
        if namespace in _list_namespaces():
            _ip_quiet("netns", "del", namespace)
    return None


# ---------------------------------------------------------------------------------------------
# Naming and sweeping


def _check_prefix(prefix: str) -> None:
    if not _PREFIX_RE.match(prefix):
        raise ValueError(f"prefix must match {_PREFIX_RE.pattern}, got {prefix!r}")


def _name_re(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(prefix)}([0-9a-f]+)-(\d+)(b|[vph]\d+)$")


def sweep_stale(prefix: str = DEFAULT_PREFIX, *, force: bool = False) -> list[str]:
    """Delete namespaces and links left by earlier (crashed) runs using ``prefix``.

    Only resources whose owning process is dead are touched, unless ``force`` (then everything
    with the prefix goes, including resources of concurrent runs: use with care). Processes
    still running inside a stale namespace are killed first. Never raises; returns the names
    removed.
    """
    _check_prefix(prefix)
    pattern = _name_re(prefix)
    alive: dict[int, bool] = {}

    def stale(name: str) -> bool:
        match = pattern.match(name)
        if match is None:
            return False
        if force:
            return True
        owner = int(match.group(1), 16)
        if owner not in alive:
            try:
                alive[owner] = _owner_alive(prefix, owner)
            except OSError as exc:
                log.warning("cannot check owner %d of %s: %s", owner, name, exc)
                alive[owner] = True
        return not alive[owner]

    for lock in STATE_DIR.glob(f"{prefix}*.lock"):  # forget owners that are gone
        owner = re.fullmatch(rf"{re.escape(prefix)}([0-9a-f]+)\.lock", lock.name)
        if owner is not None and int(owner.group(1), 16) not in alive:
            with contextlib.suppress(OSError):
                alive[int(owner.group(1), 16)] = _owner_alive(prefix, int(owner.group(1), 16))
    namespaces = sorted(n for n in _list_namespaces() if stale(n))
    links = sorted(n for n in _list_links() if stale(n))
    if namespaces:
        _kill_processes([], namespaces)
    removed: list[str] = []
    # Veths first (deleting one end deletes its peer too), then bridges, then namespaces.
    for name in sorted(links, key=lambda n: (n.endswith("b"), n)):
        if name in _list_links():
            _ip_quiet("link", "del", name)
    remaining = _list_links()
    removed.extend(name for name in links if name not in remaining)
    for name in namespaces:
        if _ip_quiet("netns", "del", name):
            removed.append(name)
    if removed:
        log.info("swept stale netns resources: %s", ", ".join(removed))
    return removed


# ---------------------------------------------------------------------------------------------
# Killing


def _kill_processes(procs: Sequence[subprocess.Popen], namespaces: Sequence[str]) -> None:
    """SIGTERM every process group in ``procs`` and every process inside ``namespaces``; wait
    up to TERM_GRACE seconds, SIGKILL what is left, wait up to KILL_GRACE seconds more."""
    groups = {proc.pid for proc in procs}

    def survivors() -> tuple[set[int], set[int]]:
        for proc in procs:
            with contextlib.suppress(Exception):
                proc.poll()  # reap our direct children so they do not linger as zombies
        live_groups = {pgid for pgid in groups if _group_pids(pgid)}
        live_pids: set[int] = set()
        for namespace in namespaces:
            live_pids |= _namespace_pids(namespace)
        return live_groups, live_pids

    def wait(grace: float) -> tuple[set[int], set[int]]:
        deadline = time.monotonic() + grace
        live_groups, live_pids = survivors()
        while (live_groups or live_pids) and time.monotonic() < deadline:
            time.sleep(0.05)
            live_groups, live_pids = survivors()
        return live_groups, live_pids

    live_groups, live_pids = survivors()
    if not (live_groups or live_pids):
        return
    for pgid in live_groups:
        _signal_group(pgid, signal.SIGTERM)
    for pid in live_pids:
        _signal_pid(pid, signal.SIGTERM)
    live_groups, live_pids = wait(TERM_GRACE)
    if not (live_groups or live_pids):
        return
    log.warning(
        "SIGKILL after %.0fs: process groups %s, namespace pids %s",
        TERM_GRACE,
        sorted(live_groups),
        sorted(live_pids),
    )
    for pgid in live_groups:
        _signal_group(pgid, signal.SIGKILL)
    for pid in live_pids:
        _signal_pid(pid, signal.SIGKILL)
    live_groups, live_pids = wait(KILL_GRACE)
    if live_groups or live_pids:
        log.warning("still alive after SIGKILL: %s %s", sorted(live_groups), sorted(live_pids))


# ---------------------------------------------------------------------------------------------
# Subnet selection


def _used_networks() -> list[ipaddress.IPv4Network]:
    used: list[ipaddress.IPv4Network] = []
    for entry in _ip_json("-4", "route", "show", "table", "all"):
        dst = entry.get("dst", "")
        if not dst or dst == "default":
            continue
        with contextlib.suppress(ValueError):
            used.append(ipaddress.IPv4Network(dst, strict=False))
    for link in _ip_json("-4", "addr", "show"):
        for info in link.get("addr_info", []):
            with contextlib.suppress(ValueError, KeyError):
                used.append(
                    ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False)
                )
    return used


def _choose_subnet(seed: int) -> ipaddress.IPv4Network:
    """A free 10.X.Y.0/24 (X in 200..254), starting from a seed-dependent candidate."""
    used = _used_networks()
    candidates = 55 * 256
    for k in range(candidates):
        index = (seed + k) % candidates
        net = ipaddress.IPv4Network(f"10.{200 + index // 256}.{index % 256}.0/24")
        if not any(net.overlaps(other) for other in used):
            return net
    raise NetnsError("no free 10.X.Y.0/24 subnet (X in 200..254) for the virtual network")


# ---------------------------------------------------------------------------------------------
# The network


@dataclass(eq=False)
class VirtualHost:
    """One network namespace with interface ``eth0`` at ``address``."""

    name: str
    address: str
    index: int
    network: VirtualNetwork = field(repr=False)
    interface: str = "eth0"

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside this namespace."""
        binary = _ip_binary()
        if binary is None:
            raise NetnsError("`ip` (iproute2) not found")
        return [binary, "netns", "exec", self.name, *map(str, argv)]

    def popen(
        self,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        stdout: _StdStream = None,
        stderr: _StdStream = None,
        stdin: _StdStream = subprocess.DEVNULL,
        **kwargs: Any,
    ) -> subprocess.Popen:
        """Start ``argv`` in this namespace, in a new session (its own process group), tracked
        for cleanup. stdout/stderr default to inheriting ours (pytest captures them); pass
        ``subprocess.PIPE`` only if you read the pipe, or a file."""
        return self.network._start(
            self.command(argv),
            env=env,
            cwd=cwd,
            stdout=stdout,
            stderr=stderr,
            stdin=stdin,
            **kwargs,
        )

    def run(
        self,
        argv: Sequence[str],
        timeout: float = 30.0,
        check: bool = False,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in this namespace to completion, capturing text stdout/stderr. On
        timeout the whole process group is killed and ``subprocess.TimeoutExpired`` raised."""
        proc = self.popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            out, err = proc.communicate(input=input, timeout=timeout)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(proc.args, timeout, output=out, stderr=err) from None
        finally:
            self.network._forget(proc)
        result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if check:
            result.check_returncode()
        return result


@dataclass(eq=False)
class VirtualNetwork:
    """Hosts on one bridge; ``root_address`` is the bridge's address in the root namespace."""

    tag: str
    bridge: str
    subnet: ipaddress.IPv4Network
    root_address: str
    hosts: list[VirtualHost] = field(default_factory=list)
    veths: list[str] = field(default_factory=list)
    _procs: list[subprocess.Popen] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _closed: bool = field(default=False, repr=False)

    @property
    def namespaces(self) -> list[str]:
        return [host.name for host in self.hosts]

    @property
    def processes(self) -> list[subprocess.Popen]:
        with self._lock:
            return list(self._procs)

    def _start(self, argv: list[str], **kwargs: Any) -> subprocess.Popen:
        kwargs.pop("start_new_session", None)
        kwargs.pop("process_group", None)
        with self._lock:
            if self._closed:
                raise NetnsError(f"virtual network {self.tag} is closed")
            proc = subprocess.Popen(argv, start_new_session=True, **kwargs)
            self._procs.append(proc)
        return proc

    def _forget(self, proc: subprocess.Popen) -> None:
        """Stop tracking a finished process whose group is empty (keeps the list short)."""
        if proc.poll() is not None and not _group_pids(proc.pid):
            with self._lock, contextlib.suppress(ValueError):
                self._procs.remove(proc)

    def stop_all(self) -> None:
        """Kill every process started here and every process inside the namespaces (SIGTERM,
        up to TERM_GRACE s, then SIGKILL). The network itself stays up. Never raises."""
        with self._lock:
            procs = list(self._procs)
        try:
            _kill_processes(procs, self.namespaces)
        except Exception:
            log.exception("stopping processes of %s", self.tag)
        with self._lock:
            for proc in procs:
                if proc.poll() is not None:
                    with contextlib.suppress(ValueError):
                        self._procs.remove(proc)
                for stream in (proc.stdin, proc.stdout, proc.stderr):
                    if stream is not None and proc.returncode is not None:
                        with contextlib.suppress(Exception):
                            stream.close()

    def close(self) -> None:
        """Stop all processes, then delete veths, bridge and namespaces. Idempotent, never
        raises (failures are logged)."""
        with self._lock:
            self._closed = True
        self.stop_all()
        links = _list_links()
        for name in [*self.veths, self.bridge]:
            if name in links:
                _ip_quiet("link", "del", name)
        present = _list_namespaces()
        for name in self.namespaces:
            if name in present:
                _ip_quiet("netns", "del", name)
        _live_networks.discard(self)

    def wait_for_tcp(
        self,
        address: str,
        port: int,
        timeout: float = 10.0,
        from_host: VirtualHost | None = None,
    ) -> None:
        """Wait until a TCP connect to ``address:port`` succeeds, from the root namespace (via
        the bridge) or from ``from_host``. Raises TimeoutError."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            if from_host is None:
                try:
                    with socket.create_connection((address, port), timeout=1.0):
                        return
                except OSError as exc:
                    last = exc
            else:
                code = (
                    "import socket,sys;"
                    f"socket.create_connection(({address!r},{int(port)}),timeout=1.0).close()"
                )
                result = from_host.run([sys.executable, "-c", code], timeout=5.0)
                if result.returncode == 0:
                    return
                last = result.stderr.strip().splitlines()[-1:] or result.returncode
            time.sleep(0.1)
        raise TimeoutError(f"{address}:{port} not reachable after {timeout}s: {last}")


_live_networks: set[VirtualNetwork] = set()
_counter_lock = threading.Lock()
_counter = 0


def _next_counter() -> int:
    global _counter
    with _counter_lock:
        _counter += 1
        return _counter


@atexit.register
def _cleanup_at_exit() -> None:
    for network in list(_live_networks):
        network.close()
    with _owner_lock:
        for prefix, fd in list(_owner_fds.items()):
            with contextlib.suppress(OSError):
                _owner_file(prefix, os.getpid()).unlink()
            os.close(fd)
            del _owner_fds[prefix]


@contextlib.contextmanager
def virtual_hosts(count: int, prefix: str | None = None) -> Iterator[VirtualNetwork]:
    """``count`` namespaces on a fresh bridge; everything is torn down on exit (see module doc).

    Host ``i`` has address ``10.X.Y.(i+1)``; the root namespace is ``network.root_address``
    (``10.X.Y.254``). Calls :func:`sweep_stale` for ``prefix`` first.
    """
    prefix = DEFAULT_PREFIX if prefix is None else prefix
    _check_prefix(prefix)
    if not 1 <= count <= 253:
        raise ValueError(f"count must be in 1..253, got {count}")
    _claim_ownership(prefix)
    sweep_stale(prefix)
    tag = f"{prefix}{os.getpid():x}-{_next_counter()}"
    longest = f"{tag}v{count - 1}"
    if len(longest) > IFNAMSIZ:
        raise ValueError(f"interface name {longest!r} exceeds {IFNAMSIZ} chars: shorter prefix")
    network: VirtualNetwork | None = None
    try:
        with _global_lock():
            subnet = _choose_subnet(seed=os.getpid() * 7 + _counter)
            network = VirtualNetwork(
                tag=tag,
                bridge=f"{tag}b",
                subnet=subnet,
                root_address=str(subnet.network_address + 254),
            )
            _live_networks.add(network)
            _ip("link", "add", network.bridge, "type", "bridge")
            _ip("addr", "add", f"{network.root_address}/{subnet.prefixlen}", "dev", network.bridge)
            _ip("link", "set", network.bridge, "up")
        _build_hosts(network, count, tag)
        log.info("virtual network %s: %s on %s", tag, network.namespaces, subnet)
        yield network
    finally:
        if network is not None:
            network.close()


def _build_hosts(network: VirtualNetwork, count: int, tag: str) -> None:
    """Create namespaces and veths; each name is recorded on ``network`` before the resource
    exists, so a failure midway leaves nothing ``close()`` does not know about."""
    for i in range(count):
        namespace, veth, peer = f"{tag}h{i}", f"{tag}v{i}", f"{tag}p{i}"
        host = VirtualHost(
            name=namespace,
            address=str(network.subnet.network_address + i + 1),
            index=i,
            network=network,
        )
        network.hosts.append(host)
        network.veths.append(veth)
        _ip("netns", "add", namespace)
        _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", veth, "master", network.bridge)
        _ip("link", "set", veth, "up")
        _ip("link", "set", peer, "netns", namespace)
        inside = ("-n", namespace)
        _ip(*inside, "link", "set", "lo", "up")
        _ip(*inside, "link", "set", peer, "name", host.interface)
        _ip(*inside, "addr", "add", f"{host.address}/{network.subnet.prefixlen}", "dev", "eth0")
        _ip(*inside, "link", "set", host.interface, "up")
