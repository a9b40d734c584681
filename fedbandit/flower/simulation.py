"""Run seeds under Flower's simulation runtime (Ray), with the same results as in-process: same
server and client logic, same seeds, same communication counts. The seeds of one command share
one simulation: Ray and the virtual SuperNodes start once."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence

from fedbandit.errors import ConfigError, import_extra
from fedbandit.federation.runtime import FederationResult
from fedbandit.flower.internals import simulation_poll, simulation_stop
from fedbandit.flower.job import FlowerJob
from fedbandit.flower.processes import FLOWER_ENVIRONMENT
from fedbandit.instances import data_files
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


def simulate_flower_seeds(
    specs: Sequence[RunSpec], on_seed: Callable[[RunSpec, SeedResult], bool]
) -> None:
    """Run the seeds of ``specs`` one after another in one Flower simulation: Ray and the
    virtual SuperNodes start once, and every seed runs on them with client groups of its own
    (``fedbandit.flower.apps``: a node forgets one seed's state before the next). ``on_seed``
    receives each finished seed's result (its seconds: that seed's own federation, from the
    first hello to the regret records); returning False ends the simulation before the next
    seed. The specs share the experiment's instance and the number of nodes
    (``spec.options.nodes``, default: up to 4, each hosting a contiguous range of clients).

    An exception in a seed ends the simulation and is raised here; so is an interrupt, after the
    ServerApp was told to stop waiting for its nodes."""
    if not specs:
        return
    first = specs[0]
    if any(
        s.experiment.instance != first.experiment.instance or s.options != first.options
        for s in specs
    ):
        raise ValueError("the seeds of one Flower simulation share the instance and the options")
    for key, value in FLOWER_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    # Flower and Ray: imported here, after the environment that keeps them quiet is set; Ray
    # comes with the `simulation` extra.
    import_extra("ray", extra="simulation", needed_by="--runtime flower-sim")
    from flwr.simulation import run_simulation

    from fedbandit.flower.apps import build_client_app, build_server_app

    simulation_poll.install()
    simulation_stop.install()  # a Ctrl-C during a round: the worker threads end before Ray
    instance = build_instance(first.experiment.instance)
    num_clients, files = instance.num_clients, data_files(instance)
    nodes = first.options.nodes or min(4, num_clients)
    if not 1 <= nodes <= num_clients:
        raise ConfigError(f"--nodes must lie in [1, {num_clients}] (the clients), got {nodes}")
    jobs = [FlowerJob(spec, num_nodes=nodes) for spec in specs]

    def seed_done(job: FlowerJob, outcome: FederationResult, seconds: float) -> bool:
        result = SeedResult.of(job.algorithm, job.entropy, outcome, seconds, data_files=files)
        return on_seed(job.spec, result)

    stop = threading.Event()
    # Ray's socket paths must stay short: a private folder under the system temp dir.
    ray_dir = tempfile.mkdtemp(prefix="fb-ray-")
    quiet = _QuietFlower()
    logging.getLogger("flwr").addFilter(quiet)
    try:
        run_simulation(
            server_app=build_server_app(jobs, seed_done, stop),
            client_app=build_client_app(jobs),
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
        stop.set()  # an interrupted simulation: its ServerApp thread stops waiting for replies
        logging.getLogger("flwr").removeFilter(quiet)
        shutil.rmtree(ray_dir, ignore_errors=True)


def simulate_flower(spec: RunSpec) -> SeedResult:
    """Run one seed of ``spec`` in a Flower simulation of its own (``simulate_flower_seeds``)."""
    results: list[SeedResult] = []

    def keep(_: RunSpec, result: SeedResult) -> bool:
        results.append(result)
        return True

    simulate_flower_seeds([spec], keep)
    if not results:
        raise RuntimeError(
            f"the Flower simulation of {spec.algorithm!r} ended without a result; its log above "
            "says why"
        )
    return results[0]
