"""Run one (algorithm, seed) under Flower's simulation runtime (Ray), with the same results as
in-process: same server and client logic, same seeds, same communication counts."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time

from fedbandit.errors import ConfigError
from fedbandit.flower.deployment import FLOWER_ENVIRONMENT
from fedbandit.flower.job import FlowerJob
from fedbandit.registry import build_instance
from fedbandit.runspec import RunSpec
from fedbandit.simulation import SeedResult


class _QuietFlower(logging.Filter):
    """Drops Flower's notice that ``run_simulation`` is deprecated (fedbandit uses it on purpose:
    the simulation runs inside this process, which ``flwr run`` cannot do) and its per-round
    INFO lines; warnings and errors about the run itself still reach the terminal."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "DEPRECATED FEATURE" in message or "deprecated feature" in message:
            return False
        return record.levelno >= logging.WARNING


def simulate_flower(spec: RunSpec) -> SeedResult:
    """Run one seed of ``spec`` on ``spec.options.nodes`` virtual SuperNodes (default: up to 4),
    each hosting a contiguous range of clients."""
    for key, value in FLOWER_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    # Flower and Ray: imported here, after the environment that keeps them quiet is set.
    from flwr.simulation import run_simulation

    from fedbandit.flower.apps import build_client_app, build_server_app

    num_clients = build_instance(spec.experiment.instance).num_clients
    nodes = spec.options.nodes or min(4, num_clients)
    if not 1 <= nodes <= num_clients:
        raise ConfigError(f"--nodes must lie in [1, {num_clients}] (the clients), got {nodes}")
    job = FlowerJob(spec, num_nodes=nodes)
    # Ray's socket paths must stay short: a private folder under the system temp dir.
    ray_dir = tempfile.mkdtemp(prefix="fb-ray-")
    start = time.perf_counter()
    quiet = _QuietFlower()
    logging.getLogger("flwr").addFilter(quiet)
    try:
        run_simulation(
            server_app=build_server_app(job),
            client_app=build_client_app(job),
            num_supernodes=nodes,
            backend_config={
                "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                "init_args": {
                    "_temp_dir": ray_dir,
                    "num_cpus": os.cpu_count() or 1,
                    "include_dashboard": False,
                    # Ray's worker lines (actors ending as the simulation stops) stay in its logs.
                    "log_to_driver": False,
                },
            },
        )
    finally:
        logging.getLogger("flwr").removeFilter(quiet)
        shutil.rmtree(ray_dir, ignore_errors=True)
    if not job.results:
        raise RuntimeError(
            f"the Flower simulation of {spec.algorithm!r} ended without a result; its log above "
            "says why"
        )
    return SeedResult.of(spec.algorithm, spec.entropy, job.results[0], time.perf_counter() - start)
