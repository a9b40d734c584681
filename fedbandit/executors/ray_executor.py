"""Run independent seeds (``RunSpec`` tasks) on Ray: a private local instance or a cluster.

Each task is a Ray task that runs ``fedbandit.runtimes.local_seed_files`` on a worker and returns
the seed's files as texts; the driver hands them to ``on_done`` as they arrive (it writes them),
so workers need no shared file system. A task whose worker dies is retried by Ray; an exception
raised by the seed itself is not retried (it would fail the same way).

Every node must run the same Python environment as the driver: the same Ray version, the same
fedbandit and the same plugins (the task function and the algorithms are imported on the worker).
Ray is imported only when ``run_on_ray`` runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from fedbandit.errors import ConfigError, DeploymentError, FedbanditError, import_extra
from fedbandit.runspec import RunSpec
from fedbandit.runtimes import local_seed_files
from fedbandit.threads import set_kernel_threads

#: The Ray version this executor is tested with (``tests/test_ray_executor.py``).
RAY_VERSION_TESTED = "2.55.1"

#: Set (unless already set) before Ray starts, so that the processes it starts inherit them:
#: Ray must not rewrite CUDA_VISIBLE_DEVICES for zero-GPU tasks, nor report usage statistics.
RAY_ENVIRONMENT = {
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
}

#: Seconds to wait for a TCP connection to the head's GCS port before ``ray.init``.
_CONNECT_SECONDS = 10.0

#: Seconds ``ray.wait`` blocks at a time, so that Ctrl-C is noticed promptly.
_WAIT_SECONDS = 0.5


def seed_files_from_json(spec_json: str) -> dict[str, str]:
    """The body of a Ray task: rebuild the ``RunSpec`` from its JSON and run the seed here."""
    set_kernel_threads(1)  # a Ray task holds one CPU (num_cpus=1)
    return local_seed_files(RunSpec.model_validate_json(spec_json))


def _task_name(spec: RunSpec) -> str:
    return f"{spec.experiment.name}/{spec.algorithm}/seed_{spec.seed}"


def _import_ray() -> Any:
    for key, value in RAY_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    ray = import_extra("ray", extra="ray", needed_by="--executor ray")
    if ray.__version__ != RAY_VERSION_TESTED:
        print(
            f"fedbandit: warning: Ray {ray.__version__} is installed; the Ray executor is tested "
            f"with Ray {RAY_VERSION_TESTED}",
            file=sys.stderr,
        )
    return ray


def _private_temp_dir() -> str:
    """A short private folder for a local Ray instance (Ray's socket paths must stay short)."""
    base = "/tmp" if os.path.isdir("/tmp") and os.access("/tmp", os.W_OK) else None
    return tempfile.mkdtemp(prefix="fb-ray-", dir=base)


@contextlib.contextmanager
def _loopback_only(enabled: bool) -> Iterator[None]:
    """While a private local instance starts, make Ray take 127.0.0.1 as this node's address.

    Ray otherwise advertises the host's network address and its servers (GCS, raylet, workers,
    the driver) listen on every interface, reachable from the network without authentication.
    With the node address 127.0.0.1 they listen on loopback only. Ray takes that address only
    when it believes multi-node clusters are off (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read
    by this process and inherited by the processes it starts); both are restored afterwards, so
    that a later ``ray.init`` that joins a cluster advertises the host's address again.
    """
    if not enabled:
        yield
        return
    from ray._private import ray_constants

    key = ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR
    saved_env = os.environ.get(key)
    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    os.environ[key] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = saved_env


def _check_reachable(address: str) -> None:
    """Fail fast on a cluster address nobody listens on (Ray itself retries for minutes)."""
    if address == "auto":
        return
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"Ray address {address!r} is not HOST:PORT or 'auto' (the head's `ray start --head "
            "--port=PORT`)"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=_CONNECT_SECONDS):
            pass
    except OSError as err:
        raise DeploymentError(
            f"cannot connect to the Ray cluster at {address} ({err.strerror or err}); start it "
            f"with `ray start --head --port={port}` on {host} and check that the port is open "
            "to this host, or omit --address to start a local Ray instance"
        ) from None


def _connect(ray: Any, address: str | None, temp_dir: str | None, num_cpus: int | None) -> None:
    options: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": logging.WARNING,
        "configure_logging": True,
    }
    if address is None:
        # "local" starts a new instance even when RAY_ADDRESS is set or a cluster runs here.
        options.update(address="local", _temp_dir=temp_dir, num_cpus=num_cpus)
    else:
        _check_reachable(address)
        options.update(address=address)
    try:
        with _loopback_only(address is None):
            ray.init(**options)
    except ConnectionError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DeploymentError(
            f"cannot connect to the Ray cluster at {address!r} ({first}); start it with "
            "`ray start --head --port=6379` on the head host and pass --address HEAD:6379, "
            "or omit --address to start a local Ray instance"
        ) from None
    except ValueError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"Ray address {address!r}: {first}") from None
    except RuntimeError as err:
        # Version mismatches between driver and cluster, a head that cannot start.
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        where = "a local Ray instance" if address is None else f"the Ray cluster at {address!r}"
        raise DeploymentError(
            f"cannot start or join {where}: {first}; every node needs the driver's Python "
            f"environment (Ray {ray.__version__}, fedbandit and its plugins)"
        ) from None


def _task_error(ray: Any, spec: RunSpec, err: Exception, max_retries: int) -> Exception:
    """The error a failed task is reported as, naming the experiment, algorithm and seed."""
    name = _task_name(spec)
    if isinstance(err, ray.exceptions.RayTaskError):
        cause = getattr(err, "cause", None)
        if isinstance(cause, FedbanditError):
            try:
                return type(cause)(f"{name} on a Ray worker: {cause}")
            except TypeError:  # an error class that takes other arguments
                return DeploymentError(f"{name} on a Ray worker: {cause}")
        return RuntimeError(f"{name} raised on a Ray worker:\n{err}")
    if isinstance(err, ray.exceptions.TaskCancelledError):
        return DeploymentError(f"{name} was cancelled on the Ray cluster")
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return DeploymentError(
        f"{name} failed on the Ray cluster after {max_retries} retries "
        f"({type(err).__name__}: {first})"
    )


def run_on_ray(
    tasks: Sequence[RunSpec],
    on_done: Callable[[RunSpec, dict[str, str]], None],
    address: str | None = None,
    max_retries: int = 3,
    progress: Callable[[RunSpec], None] | None = None,
    *,
    num_cpus: int | None = None,
) -> None:
    """Run every task on Ray and call ``on_done(spec, files)`` in the driver as each finishes.

    ``address``: ``None`` starts a private local Ray instance (in a private temp folder, with
    ``num_cpus`` CPUs, default all) and stops it at the end; ``"auto"`` or ``"HOST:PORT"`` joins
    a cluster started with ``ray start --head`` / ``ray start --address=...`` (the cluster stays
    up). ``files`` is ``runtimes.local_seed_files(spec)`` computed on a worker: paths relative to
    the run folder, the ``.json`` last. ``progress(spec)`` is called after ``on_done``.

    A task whose worker or node dies is retried up to ``max_retries`` times; after that, or when
    the seed itself raises, the error names the task. On any error or Ctrl-C, tasks still
    outstanding are cancelled and Ray is shut down; results already passed to ``on_done`` stay.
    """
    if max_retries < 0:
        raise ConfigError(f"max_retries must be >= 0, got {max_retries}")
    if not tasks:
        return
    ray = _import_ray()
    if ray.is_initialized():
        raise ConfigError(
            "Ray is already initialised in this process; call ray.shutdown() before running "
            "tasks on the Ray executor"
        )
    temp_dir = _private_temp_dir() if address is None else None
    pending: dict[Any, RunSpec] = {}
    try:
        _connect(ray, address, temp_dir, num_cpus)
        remote = ray.remote(num_cpus=1, max_retries=max_retries, retry_exceptions=False)(
            seed_files_from_json
        )
        for spec in tasks:
            ref = remote.options(name=_task_name(spec)).remote(spec.model_dump_json())
            pending[ref] = spec
        while pending:
            ready, _ = ray.wait(
                list(pending), num_returns=len(pending), timeout=_WAIT_SECONDS, fetch_local=True
            )
            for ref in ready:
                spec = pending.pop(ref)
                try:
                    files = ray.get(ref)
                except ray.exceptions.RayError as err:
                    raise _task_error(ray, spec, err, max_retries) from None
                on_done(spec, files)
                if progress is not None:
                    progress(spec)
    except BaseException:
        for ref in pending:
            # A task already finished, or the cluster is gone: nothing left to stop.
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        raise
    finally:
        try:
            if ray.is_initialized():
                ray.shutdown()
        finally:
            if temp_dir is not None:
                shutil.rmtree(temp_dir, ignore_errors=True)
