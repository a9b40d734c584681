"""fedbandit: simulate and run federated linear bandits (Fed-PE, LinUCB-d and their baselines).

The public API is what this module exports (``__all__``); everything else may change. Names are
loaded on first use, so ``import fedbandit`` stays cheap for Flower's worker processes.

Running experiments::

    import fedbandit
    results = fedbandit.run("fedpe_tiny", seeds=3)        # a name, a TOML path or a config
    results.plot_regret()

Extending it (see ``fedbandit docs plugins``): an ``AlgorithmSpec`` of a ``ServerLogic`` and a
``ClientLogic`` exchanging ``Message``s, or an ``InstanceKindSpec`` building an ``Instance``,
registered through the entry-point groups ``fedbandit.algorithms`` and ``fedbandit.instances``.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from fedbandit._version import __version__

#: Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    # running and reading experiments
    "run": "fedbandit.api",
    "load_results": "fedbandit.results",
    "simulate": "fedbandit.api",
    "Results": "fedbandit.results",
    "run_sweep": "fedbandit.api",
    "load_sweep": "fedbandit.sweep",
    "SweepResults": "fedbandit.sweep",
    "SeedResult": "fedbandit.simulation",
    "ExperimentConfig": "fedbandit.config",
    "load_experiment": "fedbandit.config",
    "RunSpec": "fedbandit.runspec",
    "RuntimeOptions": "fedbandit.runspec",
    # what is registered
    "get_algorithm": "fedbandit.api",
    "get_instance_kind": "fedbandit.api",
    "list_algorithms": "fedbandit.api",
    "list_instance_kinds": "fedbandit.api",
    "build_instance": "fedbandit.registry",
    # extending: algorithms
    "AlgorithmSpec": "fedbandit.algorithms.base",
    "Hyperparameters": "fedbandit.algorithms.base",
    "ProblemSpec": "fedbandit.algorithms.base",
    "NoCommunicationServer": "fedbandit.algorithms.base",
    "ServerLogic": "fedbandit.federation.protocol",
    "ClientLogic": "fedbandit.federation.protocol",
    "Message": "fedbandit.federation.messages",
    "broadcast": "fedbandit.federation.messages",
    "remove_clients": "fedbandit.federation.protocol",
    # running a federation by hand (tests of an algorithm, a runtime of your own)
    "build_federation": "fedbandit.simulation",
    "run_federation": "fedbandit.federation.runtime",
    "Runtime": "fedbandit.federation.runtime",
    "InProcessRuntime": "fedbandit.federation.runtime",
    "ClientFailure": "fedbandit.federation.runtime",
    "FederationResult": "fedbandit.federation.runtime",
    # randomness
    "domain_generator": "fedbandit.rng",
    "client_generators": "fedbandit.rng",
    "INSTANCE_DOMAIN": "fedbandit.rng",
    # extending: instances
    "InstanceKindSpec": "fedbandit.instances",
    "Instance": "fedbandit.instances",
    "LinearBanditInstance": "fedbandit.instances",
    "GroupEnvironment": "fedbandit.group_environment",
    "BanditEnvironment": "fedbandit.environment",
    # errors
    "FedbanditError": "fedbandit.errors",
    "ConfigError": "fedbandit.errors",
    "DataError": "fedbandit.errors",
    "DeploymentError": "fedbandit.errors",
    "RunStoppedError": "fedbandit.errors",
}

__all__ = [
    "INSTANCE_DOMAIN",
    "AlgorithmSpec",
    "BanditEnvironment",
    "ClientFailure",
    "ClientLogic",
    "ConfigError",
    "DataError",
    "DeploymentError",
    "ExperimentConfig",
    "FedbanditError",
    "FederationResult",
    "GroupEnvironment",
    "Hyperparameters",
    "InProcessRuntime",
    "Instance",
    "InstanceKindSpec",
    "LinearBanditInstance",
    "Message",
    "NoCommunicationServer",
    "ProblemSpec",
    "Results",
    "RunSpec",
    "RunStoppedError",
    "Runtime",
    "RuntimeOptions",
    "SeedResult",
    "ServerLogic",
    "SweepResults",
    "__version__",
    "broadcast",
    "build_federation",
    "build_instance",
    "client_generators",
    "domain_generator",
    "get_algorithm",
    "get_instance_kind",
    "list_algorithms",
    "list_instance_kinds",
    "load_experiment",
    "load_results",
    "load_sweep",
    "remove_clients",
    "run",
    "run_federation",
    "run_sweep",
    "simulate",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fedbandit' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
    from fedbandit.algorithms.base import (
        AlgorithmSpec,
        Hyperparameters,
        NoCommunicationServer,
        ProblemSpec,
    )
    from fedbandit.api import (
        get_algorithm,
        get_instance_kind,
        list_algorithms,
        list_instance_kinds,
        run,
        run_sweep,
        simulate,
    )
    from fedbandit.config import ExperimentConfig, load_experiment
    from fedbandit.environment import BanditEnvironment
    from fedbandit.errors import (
        ConfigError,
        DataError,
        DeploymentError,
        FedbanditError,
        RunStoppedError,
    )
    from fedbandit.federation.messages import Message, broadcast
    from fedbandit.federation.protocol import ClientLogic, ServerLogic, remove_clients
    from fedbandit.federation.runtime import (
        ClientFailure,
        FederationResult,
        InProcessRuntime,
        Runtime,
        run_federation,
    )
    from fedbandit.group_environment import GroupEnvironment
    from fedbandit.instances import Instance, InstanceKindSpec, LinearBanditInstance
    from fedbandit.registry import build_instance
    from fedbandit.results import Results, load_results
    from fedbandit.rng import INSTANCE_DOMAIN, client_generators, domain_generator
    from fedbandit.runspec import RunSpec, RuntimeOptions
    from fedbandit.simulation import SeedResult, build_federation
    from fedbandit.sweep import SweepResults, load_sweep
