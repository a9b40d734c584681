"""Build a federation by name (the registry's algorithm on an instance) and run one seed of it
in-process; every runtime builds its server and client groups through here."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numba.core import event as numba_event
from pydantic import ValidationError

from fedbandit.algorithms.base import AlgorithmSpec, Hyperparameters, ProblemSpec
from fedbandit.errors import ConfigError, describe_validation
from fedbandit.federation.protocol import ClientLogic, ServerLogic
from fedbandit.federation.runtime import FederationResult, InProcessRuntime, run_federation
from fedbandit.group_environment import RegretRecord
from fedbandit.instances import Instance, data_files
from fedbandit.registry import algorithms

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class SeedResult:
    """One (algorithm, seed) run: the true regret, the communication ledger and the run time.

    ``seconds`` is the seed's wall time less ``compile_seconds``, the one-time cost of compiling
    or loading compiled kernels that fell inside it (the first seed a process runs pays it; None
    where it is not measured: Flower runtimes, whose clients compile in their own processes)."""

    algorithm: str
    seed: int
    regret: RegretRecord
    communication: pd.DataFrame
    totals: dict[str, int]
    seconds: float
    #: "complete", or "aborted" when lost clients stopped the run (results so far).
    status: str = "complete"
    failure: str | None = None
    #: Clients removed under the "drop" failure policy -> the round they were lost in.
    dropped: Mapping[int, int] = field(default_factory=dict)
    #: The algorithm's own report (``ServerLogic.report``), such as its privacy accounting.
    report: Mapping[str, Any] = field(default_factory=dict)
    compile_seconds: float | None = None
    #: The files the seed's instance was built from, path -> SHA-256 (``instances.data_files``).
    data_files: Mapping[str, str] = field(default_factory=dict)

    @staticmethod
    def of(
        algorithm: str,
        entropy: list[int],
        outcome: FederationResult,
        seconds: float,
        compile_seconds: float | None = None,
        data_files: Mapping[str, str] | None = None,
    ) -> SeedResult:
        """The record of a finished federation (any runtime) on the instance whose data files
        are ``data_files`` (``instances.data_files``)."""
        return SeedResult(
            algorithm=algorithm,
            seed=int(entropy[-1]),
            regret=outcome.regret,
            communication=outcome.ledger.frame(),
            totals=outcome.ledger.totals(),
            seconds=seconds,
            status=outcome.status,
            failure=outcome.failure,
            dropped=dict(outcome.dropped),
            report=dict(outcome.report),
            compile_seconds=compile_seconds,
            data_files=dict(data_files or {}),
        )


@contextlib.contextmanager
def compile_timer() -> Iterator[list[float]]:
    """Seconds this process spends holding numba's compiler lock inside the block, set as the
    one element of the list it yields when the block ends: compiling a kernel, or loading one
    from numba's cache (the cost the first call of each kernel pays once per process, unrelated
    to the run's size)."""
    spent = [0.0]

    def record(duration: float) -> None:
        spent[0] = duration

    with numba_event.install_timer("numba:compiler_lock", record):
        yield spent


def problem_spec(instance: Instance, horizon: int) -> ProblemSpec:
    return ProblemSpec(
        num_clients=instance.num_clients,
        num_arms=instance.num_arms,
        dim=instance.dim,
        horizon=horizon,
        shared_parameter=instance.shared_parameter,
        noise_sigma=instance.noise_sigma,
        contextual=instance.contextual,
        reward_link=getattr(instance, "link", None),
        context_floats_per_round=getattr(instance, "context_floats_per_round", None),
        instance_bytes=getattr(instance, "memory_bytes", None),
    )


def client_groups(num_clients: int, group_size: int | None) -> list[np.ndarray]:
    """Contiguous groups of logical client ids (one group when ``group_size`` is None)."""
    ids = np.arange(num_clients, dtype=np.int64)
    if group_size is None or group_size >= num_clients:
        return [ids]
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    return [ids[i : i + group_size] for i in range(0, num_clients, group_size)]


def _hyperparameters(spec_entry: AlgorithmSpec, params: Any) -> Hyperparameters:
    """Validated hyperparameters from a dict, or the algorithm's own model as given."""
    if isinstance(params, spec_entry.params):
        return params
    if isinstance(params, Hyperparameters):
        raise ConfigError(
            f"algorithm {spec_entry.name!r} takes {spec_entry.params.__name__}, "
            f"got {type(params).__name__}"
        )
    try:
        return spec_entry.params(**dict(params or {}))
    except ValidationError as err:
        raise ConfigError(f"params.{spec_entry.name}: {describe_validation(err)}") from None


def build_server(
    instance: Instance,
    algorithm: str,
    horizon: int,
    params: Mapping[str, Any] | Hyperparameters | None = None,
) -> ServerLogic:
    """The server logic of one run (the ServerApp of a Flower runtime needs nothing else)."""
    spec_entry = algorithms().get(algorithm)
    spec = problem_spec(instance, horizon)
    spec_entry.check_problem(spec)
    return spec_entry.make_server(spec, _hyperparameters(spec_entry, params))


def build_federation(
    instance: Instance,
    algorithm: str,
    horizon: int,
    entropy: list[int],
    params: Mapping[str, Any] | Hyperparameters | None = None,
    group_size: int | None = None,
    client_ids: np.ndarray | None = None,
) -> tuple[ServerLogic, list[ClientLogic]]:
    """The server logic and the client groups (each with its own environment) of one run; with
    ``client_ids``, a single group of just those clients (a node of a distributed runtime)."""
    spec_entry = algorithms().get(algorithm)
    hyper = _hyperparameters(spec_entry, params)
    spec = problem_spec(instance, horizon)
    spec_entry.check_problem(spec)
    id_groups = (
        [np.asarray(client_ids, dtype=np.int64)]
        if client_ids is not None
        else client_groups(instance.num_clients, group_size)
    )
    groups = [
        spec_entry.make_client(spec, hyper, instance.make_environment(ids, horizon, entropy))
        for ids in id_groups
    ]
    return spec_entry.make_server(spec, hyper), groups


def simulate(
    instance: Instance,
    algorithm: str,
    horizon: int,
    entropy: list[int],
    params: Mapping[str, Any] | Hyperparameters | None = None,
    group_size: int | None = None,
) -> SeedResult:
    """Run ``algorithm`` over T = ``horizon`` pulls per client; rewards seeded by ``entropy``."""
    start = time.perf_counter()
    with compile_timer() as compiling:
        server, groups = build_federation(instance, algorithm, horizon, entropy, params, group_size)
        outcome = run_federation(server, InProcessRuntime(groups))
    wall = time.perf_counter() - start
    return SeedResult.of(
        algorithm, entropy, outcome, wall - compiling[0], compiling[0], data_files(instance)
    )
