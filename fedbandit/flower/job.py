"""What the driver, the ServerApp and every ClientApp of a Flower run share: the job.

In a deployment the job travels as JSON in the run config (key ``job``) and every host validates
it again with the algorithms and instance kinds registered there (plugins included).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from pydantic import ValidationError

from fedbandit.config import ExperimentConfig
from fedbandit.errors import describe_validation
from fedbandit.federation.runtime import FederationResult
from fedbandit.runspec import RunSpec


@dataclass(frozen=True)
class FlowerJob:
    """What the ServerApp and every node share: the run's ``RunSpec`` (experiment, algorithm,
    seed, runtime options), the number of nodes and the server's poll interval. In a deployment
    it travels as JSON in the run config (key ``job``) and each node validates it again, with the
    algorithms and instance kinds registered where it runs (plugins included)."""

    spec: RunSpec
    num_nodes: int
    poll_seconds: float = 0.01
    #: Clients lost for good in an earlier seed of the command (``on_client_failure = "drop"``):
    #: discovery does not wait for them, and when no node serves them they are dropped in the
    #: seed's first exchange (``fedbandit.flower.grid_runtime``).
    absent_clients: tuple[int, ...] = ()
    results: list[FederationResult] = field(default_factory=list, compare=False)
    #: Per-exchange latency of the last run (see ``FlowerGridRuntime.timings``).
    timings: list[dict[str, Any]] = field(default_factory=list, compare=False)

    @property
    def config(self) -> ExperimentConfig:
        return self.spec.experiment

    @property
    def algorithm(self) -> str:
        return self.spec.algorithm

    @property
    def entropy(self) -> list[int]:
        return self.spec.entropy

    @property
    def round_timeout(self) -> float:
        return self.spec.options.round_timeout

    @property
    def start_deadline(self) -> float:
        return self.spec.options.start_deadline

    @property
    def reconnect_seconds(self) -> float:
        return self.spec.options.reconnect_timeout

    @property
    def on_client_failure(self) -> str:
        return self.spec.options.on_client_failure


def job_to_json(job: FlowerJob) -> str:
    """The job as the JSON text a deployment passes in the run config (key ``job``)."""
    data: dict[str, Any] = {
        "spec": job.spec.model_dump(mode="json"),
        "num_nodes": job.num_nodes,
        "poll_seconds": job.poll_seconds,
    }
    if job.absent_clients:
        data["absent_clients"] = list(job.absent_clients)
    return json.dumps(data, sort_keys=True)


@lru_cache(maxsize=4)
def job_from_json(text: str) -> FlowerJob:
    """The job of a run config; a job that does not validate here names the problem."""
    if not text:
        raise ValueError(
            "the run config has no 'job': submit runs with `fedbandit run --runtime flower`"
        )
    data = json.loads(text)
    if unknown := set(data) - {"spec", "num_nodes", "poll_seconds", "absent_clients"}:
        raise ValueError(
            f"unknown job keys {sorted(unknown)}; known: absent_clients, num_nodes, "
            "poll_seconds, spec"
        )
    try:
        spec = RunSpec.model_validate(data.get("spec"))
    except ValidationError as err:
        raise ValueError(
            f"the job does not validate on this host: {describe_validation(err)}"
        ) from None
    return FlowerJob(
        spec,
        int(data.get("num_nodes", 0)),
        float(data.get("poll_seconds", 0.01)),
        tuple(int(client) for client in data.get("absent_clients", ())),
    )
