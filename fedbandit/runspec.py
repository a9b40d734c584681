"""The run boundary: one frozen, validated description of what to run and where.

A ``RunSpec`` (experiment, algorithm, seed, runtime and its options) is what the command line,
the Python API, the process pool and both Flower runtimes pass around. Its ``RuntimeOptions`` are
recorded in ``manifest.json`` and compared when a results folder is resumed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fedbandit import secure_sum
from fedbandit.config import ExperimentConfig
from fedbandit.errors import ConfigError, describe_validation
from fedbandit.rng import run_entropy

#: The runtimes by name, with what each is: the command line's ``--runtime`` choices.
#: ``fedbandit.runtimes.RUNTIMES`` implements each one (a test checks that they agree).
RUNTIME_NAMES: dict[str, str] = {
    "local": "in-process, seeds in parallel worker processes",
    "flower-sim": "Flower's simulation runtime (Ray), virtual SuperNodes",
    "flower": "a Flower deployment: SuperLink and SuperNodes on hosts",
}
#: How the tasks of a sweep may run: this machine's worker processes, or a Ray cluster.
EXECUTORS = ("local", "ray")


class RuntimeOptions(BaseModel):
    """How a run is executed. Only ``runtime`` and the options that change what is computed
    (``nodes``, ``on_client_failure``) are compared when a folder is resumed; timeouts, the
    SuperLink address and ``steps_per_round`` (results are identical) may change between
    attempts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runtime: str = Field("local", description="a name of RUNTIME_NAMES")
    nodes: int | None = Field(None, ge=1, description="virtual SuperNodes of flower-sim")
    on_client_failure: Literal["abort", "drop"] = Field(
        "abort", description="a lost node stops the seed (abort) or its clients leave (drop)"
    )
    round_timeout: float = Field(120.0, gt=0, description="seconds a round waits for replies")
    start_deadline: float = Field(120.0, gt=0, description="seconds to wait for the nodes")
    reconnect_timeout: float = Field(0.0, ge=0, description="seconds to wait for a restarted node")
    run_timeout: float = Field(3600.0, gt=0, description="seconds per seed on a deployment")
    superlink: str | None = Field(None, description="HOST:PORT of a deployment's SuperLink")
    insecure: bool = Field(False, description="plain HTTP to the SuperLink (loopback only)")
    root_certificates: Path | None = Field(None, description="CA certificate of the SuperLink")
    steps_per_round: int = Field(
        256,
        ge=1,
        description="logical exchanges one Flower round may carry: protocols that talk every "
        "step let their clients run ahead until an event (results are identical)",
    )
    secure_aggregation: bool = Field(
        False,
        description="the fields a server only sums travel through Flower's SecAgg+: the server "
        "sees their sum over nodes (flower-sim and flower; 3 or more nodes)",
    )
    secure_threshold: int | None = Field(
        None,
        ge=3,
        description="SecAgg+ reconstruction threshold: nodes that must survive a secure round "
        "(default: a majority, at least 3)",
    )
    secure_min_contributors: int | None = Field(
        None,
        ge=2,
        description="fewest clients a block of a secure sum may hold to be unmasked; fewer wait "
        "for a later exchange where the algorithm can hold them, else the seed stops (default "
        "3: with 2, each contributor learns the other's values from the sum)",
    )

    @model_validator(mode="after")
    def _check(self) -> RuntimeOptions:
        if self.runtime not in RUNTIME_NAMES:
            raise ValueError(
                f"unknown runtime {self.runtime!r}; known runtimes: {', '.join(RUNTIME_NAMES)}"
            )
        if self.runtime == "flower":
            if not self.superlink:
                raise ValueError("runtime 'flower' needs superlink HOST:PORT (--superlink)")
            if self.insecure == (self.root_certificates is not None):
                raise ValueError(
                    "runtime 'flower': give root_certificates (TLS, --root-certificates CA.crt) "
                    "or insecure (--insecure, loopback)"
                )
        elif self.superlink:
            raise ValueError("superlink (--superlink) needs runtime 'flower'")
        if self.nodes is not None and self.runtime != "flower-sim":
            raise ValueError("nodes (--nodes) applies to runtime 'flower-sim' only")
        if self.secure_aggregation:
            if self.runtime == "local":
                raise ValueError(
                    "secure aggregation (--secure-aggregation) needs runtime 'flower-sim' or "
                    "'flower': in-process no message travels, so there is nothing to hide"
                )
            if self.runtime == "flower-sim" and self.nodes is not None and self.nodes < 3:
                raise ValueError(
                    f"secure aggregation needs 3 or more nodes (--nodes), got {self.nodes}: with "
                    "two, each node learns the other's values from the sum"
                )
            if self.runtime == "flower-sim" and (self.nodes or 0) > secure_sum.MAX_NODES:
                raise ValueError(
                    f"secure aggregation sums at most {secure_sum.MAX_NODES} nodes (SecAgg+'s "
                    f"modulus 2^32), got nodes {self.nodes} (--nodes)"
                )
            nodes = self.nodes or 4
            if self.runtime == "flower-sim" and (self.secure_threshold or 0) > nodes:
                raise ValueError(
                    f"secure_threshold {self.secure_threshold} asks for more surviving nodes "
                    f"than the {nodes} nodes of the simulation (--nodes)"
                )
        elif self.secure_threshold is not None:
            raise ValueError("secure_threshold (--secure-threshold) needs --secure-aggregation")
        elif self.secure_min_contributors is not None:
            raise ValueError(
                "secure_min_contributors (--secure-min-contributors) needs --secure-aggregation"
            )
        return self

    @property
    def run_ahead_budget(self) -> int:
        """``steps_per_round`` as used: 1 with ``reconnect_timeout`` (a SuperNode restarted
        from its saved state resumes from the state after a whole delivery, so each step must
        travel on its own)."""
        return 1 if self.reconnect_timeout > 0 else self.steps_per_round

    def identity(self) -> dict[str, Any]:
        """The options that change results: compared when a results folder is resumed."""
        return {
            "runtime": self.runtime,
            "nodes": self.nodes,
            "on_client_failure": self.on_client_failure,
            "secure_aggregation": self.secure_aggregation,
            # held-back blocks change results; recorded only when set (older folders lack it)
            **(
                {"secure_min_contributors": self.secure_min_contributors}
                if self.secure_min_contributors is not None
                else {}
            ),
        }

    @staticmethod
    def of(**values: Any) -> RuntimeOptions:
        """Validated options; a wrong value is a ``ConfigError`` naming the option."""
        try:
            return RuntimeOptions(**values)
        except ValidationError as err:
            raise ConfigError(f"runtime options: {describe_validation(err)}") from None


class RunSpec(BaseModel):
    """One (experiment, algorithm, seed) on a runtime. ``seed`` is the seed index: the reward
    streams come from ``entropy = [experiment.base_seed, seed]`` (``fedbandit.rng``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    experiment: ExperimentConfig
    algorithm: str
    seed: int = Field(ge=0)
    options: RuntimeOptions = Field(default_factory=lambda: RuntimeOptions())

    @model_validator(mode="after")
    def _check(self) -> RunSpec:
        if self.algorithm not in self.experiment.algorithms:
            raise ValueError(
                f"algorithm {self.algorithm!r} is not in the experiment's algorithms "
                f"{self.experiment.algorithms}"
            )
        return self

    @property
    def entropy(self) -> list[int]:
        return run_entropy(self.experiment.base_seed, self.seed)
