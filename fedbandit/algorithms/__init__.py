"""The algorithm registry: every algorithm by its stable name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fedbandit.algorithms.base import (
    AlgorithmSpec,
    Hyperparameters,
    NoCommunicationServer,
    ProblemSpec,
    environment_of,
)
from fedbandit.algorithms.federated_linucb import (
    AsyncLinUCBClient,
    AsyncLinUCBServer,
    AsyncParams,
    CentralLinUCBClient,
    CentralLinUCBServer,
    CentralParams,
    DisLinUCBClient,
    DisLinUCBParams,
    DisLinUCBServer,
    FederatedRidgeClientBase,
    FederatedRidgeServerBase,
    FedLinUCBClient,
    FedLinUCBParams,
    FedLinUCBServer,
)
from fedbandit.algorithms.linucb import LocalRidgeClient, RidgeParams
from fedbandit.algorithms.local_ucb import LocalUCBClient, LocalUCBParams
from fedbandit.algorithms.phased_elimination import (
    PhasedEliminationClient,
    PhasedEliminationParams,
    PhasedEliminationServer,
    Variant,
)
from fedbandit.contextual.environment import ContextualEnvironment
from fedbandit.contextual.ridge import DeltaSchedule, RadiusRule
from fedbandit.environment import BanditEnvironment

P = TypeVar("P", bound=Hyperparameters)


def _phased(name: str, description: str, variant: Variant) -> AlgorithmSpec[Any]:
    return AlgorithmSpec(
        name=name,
        description=description,
        params=PhasedEliminationParams,
        make_server=lambda spec, params: PhasedEliminationServer(spec, params, variant),
        make_client=lambda spec, params, env: PhasedEliminationClient(
            spec, params, variant, environment_of(env, BanditEnvironment)
        ),
        needs_shared_parameter=variant.shared,
    )


def _local(
    name: str, description: str, rule: RadiusRule, schedule: DeltaSchedule
) -> AlgorithmSpec[Any]:
    return AlgorithmSpec(
        name=name,
        description=description,
        params=RidgeParams,
        make_server=lambda spec, params: NoCommunicationServer(spec),
        make_client=lambda spec, params, env: LocalRidgeClient(
            spec, params, rule, schedule, environment_of(env, ContextualEnvironment)
        ),
        contextual=True,
    )


def _federated(
    name: str,
    description: str,
    params: type[P],
    server: Callable[[ProblemSpec, P], FederatedRidgeServerBase],
    client: Callable[[ProblemSpec, P, ContextualEnvironment], FederatedRidgeClientBase],
) -> AlgorithmSpec[Any]:
    return AlgorithmSpec(
        name=name,
        description=description,
        params=params,
        make_server=lambda spec, p: server(spec, p),
        make_client=lambda spec, p, env: client(
            spec, p, environment_of(env, ContextualEnvironment)
        ),
        contextual=True,
    )


#: fedbandit's own algorithms; ``fedbandit.registry.algorithms()`` adds the plugins'.
BUILTIN_ALGORITHMS: dict[str, AlgorithmSpec[Any]] = {
    spec.name: spec
    for spec in (
        _phased(
            "fedpe",
            "Fed-PE, disjoint parameters (Huang et al. 2021)",
            Variant("direction", "phase", shared=False),
        ),
        _phased(
            "fedpe_shared",
            "Fed-PE, one parameter shared by all arms (Huang et al. 2021)",
            Variant("direction", "phase", shared=True),
        ),
        _phased(
            "fedpe_enhanced",
            "Enhanced Fed-PE: all past phases, log-based width",
            Variant("direction", "cumulative", shared=False),
        ),
        _phased(
            "collaborative",
            "Full-information least squares with the same phases (reference)",
            Variant("least_squares", "cumulative", shared=False),
        ),
        AlgorithmSpec(
            name="local_ucb",
            description="Every client runs UCB on its own arms (no communication)",
            params=LocalUCBParams,
            make_server=lambda spec, params: NoCommunicationServer(spec),
            make_client=lambda spec, params, env: LocalUCBClient(
                spec, params, environment_of(env, BanditEnvironment)
            ),
        ),
        _local(
            "linucb_d",
            "LinUCB-d: self-normalised radius, delta_t = 1/t^2 (Wu et al. 2020)",
            "self_normalized",
            "inverse_square",
        ),
        _local(
            "linucb", "LinUCB with a fixed alpha (Li et al. 2010), per client", "fixed", "constant"
        ),
        _local(
            "oful",
            "OFUL: self-normalised radius, constant delta (Abbasi-Yadkori 2011)",
            "self_normalized",
            "constant",
        ),
        _local(
            "greedy", "Ridge estimates without an exploration bonus, per client", "zero", "constant"
        ),
        _federated(
            "dislinucb",
            "DisLinUCB: log-det sync trigger (Wang et al. 2020)",
            DisLinUCBParams,
            DisLinUCBServer,
            DisLinUCBClient,
        ),
        _federated(
            "async_linucb",
            "Async-LinUCB: upload and push ratios (Li & Wang 2022)",
            AsyncParams,
            AsyncLinUCBServer,
            AsyncLinUCBClient,
        ),
        _federated(
            "fedlinucb",
            "FedLinUCB: determinant-ratio sync (He et al. 2022)",
            FedLinUCBParams,
            FedLinUCBServer,
            FedLinUCBClient,
        ),
        _federated(
            "central_linucb",
            "Centralised LinUCB: every sample shared every round",
            CentralParams,
            CentralLinUCBServer,
            CentralLinUCBClient,
        ),
    )
}


#: Kept for code written against earlier versions: the built-in algorithms only.
ALGORITHMS = BUILTIN_ALGORITHMS


def get_algorithm(name: str) -> AlgorithmSpec[Any]:
    """The registered algorithm ``name``, built in or a plugin's (``fedbandit.registry``)."""
    from fedbandit.registry import algorithms

    return algorithms().get(name)


__all__ = [
    "BUILTIN_ALGORITHMS",
    "AlgorithmSpec",
    "Hyperparameters",
    "ProblemSpec",
    "get_algorithm",
]
