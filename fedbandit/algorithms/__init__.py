"""The algorithm registry: every algorithm by its stable name."""

from __future__ import annotations

from fedbandit.algorithms.base import AlgorithmSpec, Hyperparameters, ProblemSpec
from fedbandit.algorithms.local_ucb import LocalUCBClient, LocalUCBParams, LocalUCBServer
from fedbandit.algorithms.phased_elimination import (
    PhasedEliminationClient,
    PhasedEliminationParams,
    PhasedEliminationServer,
    Variant,
)


def _phased(name: str, description: str, variant: Variant) -> AlgorithmSpec:
    return AlgorithmSpec(
        name=name,
        description=description,
        params=PhasedEliminationParams,
        make_server=lambda spec, params: PhasedEliminationServer(spec, params, variant),
        make_client=lambda spec, params, env: PhasedEliminationClient(spec, params, variant, env),
        needs_shared_parameter=variant.shared,
    )


ALGORITHMS: dict[str, AlgorithmSpec] = {
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
            make_server=lambda spec, params: LocalUCBServer(spec, params),
            make_client=lambda spec, params, env: LocalUCBClient(spec, params, env),
        ),
    )
}


def get_algorithm(name: str) -> AlgorithmSpec:
    try:
        return ALGORITHMS[name]
    except KeyError:
        known = ", ".join(sorted(ALGORITHMS))
        raise ValueError(f"unknown algorithm {name!r}; known algorithms: {known}") from None


__all__ = ["ALGORITHMS", "AlgorithmSpec", "Hyperparameters", "ProblemSpec", "get_algorithm"]
