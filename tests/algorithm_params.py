"""Parameters for the tests that run every registered algorithm: most need none; a private
algorithm has no default privacy target or clipping bounds, so it needs these."""

from typing import Any

#: Required hyperparameters by algorithm name (the tests pass nothing to the others).
REQUIRED: dict[str, dict[str, Any]] = {
    "private_fedlinucb": {
        "epsilon": 2.0,
        "delta": 1e-3,
        "feature_bound": 3.0,
        "reward_bound": 3.0,
        "batch_size": 10,
    },
    "private_fedpe": {"epsilon": 2.0, "delta": 1e-3, "reward_bound": 3.0},
}


def params_for(algorithm: str) -> dict[str, Any] | None:
    return REQUIRED.get(algorithm)
