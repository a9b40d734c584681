"""Private Fed-PE: Fed-PE whose clients release each phase's mean rewards through a Gaussian
mechanism, with the guarantee accounted by ``dp-accounting`` (``fedbandit.privacy``).

Huang, Zhang, Melis, Shen, Hejazinia, Yang, "Federated Linear Contextual Bandits with User-level
Differential Privacy" (ICML 2023) study this setting; no code of theirs is public and their
mechanism could not be read here, so this follows the Gaussian mechanism on the per-arm local
statistics (``phase_accounting`` has the derivation):

- every single reward is clipped to [-R, R] (``reward_bound``) before it enters a statistic
  (``BanditEnvironment.clip_block_rewards``); the number clipped is reported;
- a client's upload for arm a of a phase is theta_hat = (ybar_a + N(0, tau_a^2)) x_a / ||x_a||^2,
  the noise drawn from the client's own stream (``PRIVACY_DOMAIN``): Fed-PE's estimate of the
  noisy mean. Counts, the phase-0 minimum of ||x||^2 and the active sets depend on the features
  and on earlier releases only: the guarantee protects rewards, not the arms' features (the
  server learns their directions in phase 0, as in Fed-PE);
- the server weighs each estimate by its effective count n / (1 + n tau^2 / sigma^2) instead of
  n (weighted least squares with the variance sigma^2 / n + tau^2 of a noisy mean), so the
  elimination widths cover the privacy noise too.

``unit = "pull"`` protects one pull's reward of a client (tau = z 2R / n: the noise fades as the
phases grow); ``unit = "client"`` protects all of a client's rewards (user-level local DP, tau =
z 2R sqrt(k) on every phase: the price the lower bound of Huang et al. predicts). With ``noise =
false`` and a bound no reward reaches, the run equals ``fedpe`` bit for bit.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from pydantic import Field

from fedbandit.algorithms import citations
from fedbandit.algorithms.base import AlgorithmSpec, ProblemSpec, environment_of
from fedbandit.algorithms.phased_elimination import (
    PhasedEliminationClient,
    PhasedEliminationParams,
    PhasedEliminationServer,
    Variant,
)
from fedbandit.environment import BanditEnvironment
from fedbandit.errors import ConfigError
from fedbandit.estimators import last_phase
from fedbandit.federation.messages import Message
from fedbandit.privacy import (
    BOUND_RANGE,
    DELTA_RANGE,
    EPSILON_RANGE,
    PhaseAccounting,
    PhaseUnit,
    phase_accounting,
    require_finite,
)
from fedbandit.rng import PRIVACY_DOMAIN, REWARD_DETAIL_DOMAIN
from fedbandit.state import strip_prefix, with_prefix
from fedbandit.streams import ClientStreams

#: Fed-PE with disjoint parameters: the member of the family that is made private.
_VARIANT = Variant("direction", "phase", shared=False)


class PrivateFedPEParams(PhasedEliminationParams):
    """Hyperparameters of ``private_fedpe``: those of ``fedpe`` and
    - ``epsilon``, ``delta``: the target guarantee over the whole run (required; finite,
      epsilon in ``EPSILON_RANGE`` = [1e-3, 1e3], delta in ``DELTA_RANGE`` = [1e-15, 1), and
      the accountant's answer for the run finite).
    - ``reward_bound``: R, every reward is clipped to [-R, R] (required: it fixes the
      sensitivity; finite, in ``BOUND_RANGE`` = [1e-6, 1e6]).
    - ``unit``: what the guarantee protects: ``pull`` (one reward of a client) or ``client``
      (all of a client's rewards).
    - ``noise``: false releases the clean statistics (for testing only: no guarantee).
    """

    epsilon: float = Field(ge=EPSILON_RANGE[0], le=EPSILON_RANGE[1], allow_inf_nan=False)
    delta: float = Field(ge=DELTA_RANGE[0], lt=DELTA_RANGE[1], allow_inf_nan=False)
    reward_bound: float = Field(ge=BOUND_RANGE[0], le=BOUND_RANGE[1], allow_inf_nan=False)
    unit: PhaseUnit = "pull"
    noise: bool = True


def _accounting(spec: ProblemSpec, params: PrivateFedPEParams, report: bool) -> PhaseAccounting:
    phases = last_phase(spec.horizon, spec.num_arms) + 1
    accounting = phase_accounting(
        params.unit, params.epsilon, params.delta, phases, params.reward_bound, report
    )
    spent = {"noise_multiplier": accounting.noise_multiplier}
    if report:
        spent["epsilon"] = accounting.epsilon
    require_finite("private_fedpe", params.epsilon, params.delta, spent)
    return accounting


def disclosures(summed: bool) -> list[dict[str, str]]:
    """What the server of ``private_fedpe`` sees, field by field: who sends it, when, in what
    form, and whether the guarantee covers it (the privacy report's ``server_sees``)."""
    return [
        {
            "field": "report.estimate",
            "when": "each phase's report",
            "seen": "per silo and pulled arm in phase 0; from phase 1, only sum_i of the weighted "
            "estimates (secure aggregation)"
            if summed
            else "per silo and pulled arm",
            "guarantee": "inside: (ybar_a + N(0, tau_a^2)) x_a / ||x_a||^2, the noisy release",
        },
        {
            "field": "report.counts (and the pulled mask)",
            "when": "each phase's report",
            "seen": "per silo and arm, in the clear",
            "guarantee": "inside as post-processing: fixed by the server's design and the "
            "active sets, not by this phase's rewards",
        },
        {
            "field": "report.min_sq_norm",
            "when": "phase 0",
            "seen": "per silo, in the clear",
            "guarantee": "outside: a function of the features, which the guarantee does not "
            "protect",
        },
        {
            "field": "active_set.active",
            "when": "each phase's elimination",
            "seen": "per silo and arm, in the clear",
            "guarantee": "inside as post-processing: from the server's broadcast and the "
            "silo's features",
        },
        {
            "field": "meta.pulls",
            "when": "every reply",
            "seen": "per silo, in the clear",
            "guarantee": "outside, data-independent: the pulls a silo has made",
        },
        {
            "field": "meta.clipped_rewards",
            "when": "once, in the last phase's report",
            "seen": "per silo, in the clear: the run's total",
            "guarantee": "outside: how many of the silo's rewards left [-R, R]",
        },
        {
            "field": "regret record",
            "when": "once, at the end",
            "seen": "per silo, in the clear",
            "guarantee": "outside: the simulation's true regret, a measurement that a silo with "
            "real data would not have",
        },
    ]


def effective_counts(
    counts: np.ndarray, accounting: PhaseAccounting, noise_sigma: float
) -> np.ndarray:
    """n / (1 + n tau^2 / sigma^2): the count of clean pulls whose mean has the variance
    sigma^2 / n + tau^2 of a released noisy mean (tau from ``accounting``)."""
    tau = accounting.mean_noise_std(counts)
    return counts / (1.0 + counts * tau**2 / noise_sigma**2)


class PrivateFedPEServer(PhasedEliminationServer):
    """Fed-PE's server on noisy estimates: effective counts as weights; reports the accounting
    and the rewards the clients clipped."""

    def __init__(self, spec: ProblemSpec, params: PrivateFedPEParams) -> None:
        super().__init__(spec, params, _VARIANT)
        self.private = params
        self.accounting = _accounting(spec, params, report=True)
        self.sigma = params.noise_sigma if params.noise_sigma is not None else spec.noise_sigma
        if params.noise and not self.sigma > 0:
            raise ConfigError(
                "private_fedpe weighs its noisy estimates by the reward noise level: it needs "
                f"noise_sigma > 0 (the instance's is {spec.noise_sigma}); set "
                "params.private_fedpe.noise_sigma"
            )
        self.clipped = np.zeros(spec.num_clients, dtype=np.int64)
        self.summed = False  # whether a report's estimates arrived as a secure sum

    def aggregate(self, reply: Message) -> None:
        if "clipped_rewards" in reply.meta:
            self.clipped[reply.client_ids] = reply.meta["clipped_rewards"]
        self.summed |= bool(reply.summed)
        super().aggregate(reply)

    def _weights(self, counts: np.ndarray) -> np.ndarray:
        """The effective counts of the noisy estimates (the counts themselves without noise)."""
        if not self.private.noise:
            return counts
        return effective_counts(counts, self.accounting, self.sigma)

    def report(self) -> dict[str, Any]:
        """The guarantee and its accounting, what the server saw (``disclosures``), and how many
        rewards the clients clipped (the run totals of the clients that reached the last phase).
        The guarantee is each client's own (silo-level local DP): a secure sum changes what the
        server sees, not the epsilon."""
        return {
            "privacy": {
                **self.accounting.as_dict(),
                "noise": self.private.noise,
                "server_saw": "each client's noisy estimates"
                if not self.summed
                else "each client's noisy estimates in phase 0, then their weighted sum",
                "server_sees": disclosures(self.summed),
            },
            "clipped": {"features": 0, "rewards": int(self.clipped.sum())},
        }


class PrivateFedPEClient(PhasedEliminationClient):
    """Fed-PE's clients, clipping every reward and adding noise to each phase's mean rewards."""

    def __init__(
        self, spec: ProblemSpec, params: PrivateFedPEParams, env: BanditEnvironment
    ) -> None:
        super().__init__(spec, params, _VARIANT, env)
        self.private = params
        self.accounting = _accounting(spec, params, report=False)
        self.clipped_rewards = np.zeros(env.num_clients, dtype=np.int64)
        # Each client's own streams, held as arrays and drawn in compiled loops (the same PCG64
        # streams as ``client_generators``): the clipping's draws and the released noise.
        self.detail_streams = ClientStreams.seeded(
            env.entropy, env.client_ids, REWARD_DETAIL_DOMAIN
        )
        self.noise_streams = ClientStreams.seeded(env.entropy, env.client_ids, PRIVACY_DOMAIN)

    STATE = (*PhasedEliminationClient.STATE, "clipped_rewards")

    def state_dict(self) -> dict[str, np.ndarray]:
        return {
            **super().state_dict(),
            **with_prefix("detail_rng.", self.detail_streams.to_arrays()),
            **with_prefix("noise_rng.", self.noise_streams.to_arrays()),
        }

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        super().load_state_dict(state)
        self.detail_streams = ClientStreams(strip_prefix("detail_rng.", state))
        self.noise_streams = ClientStreams(strip_prefix("noise_rng.", state))

    def _observe(self, requested: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        executed, sums = self.env.pull_counts(requested)
        sums, clipped = self.env.clip_block_rewards(
            executed, sums, self.private.reward_bound, self.detail_streams
        )
        self.clipped_rewards += clipped
        if self.private.noise:
            tau = self.accounting.mean_noise_std(executed)
            noise = self.noise_streams.standard_normal(self.spec.num_arms)  # K per client
            sums = sums + executed * tau * noise  # the noisy mean times n
        return executed, sums

    def _weights(self, counts: np.ndarray) -> np.ndarray:
        """The server's weights: the effective counts of the noisy estimates."""
        if not self.private.noise:
            return counts
        return effective_counts(counts, self.accounting, self.sigma)

    def _explore(self, message: Message, rows: np.ndarray) -> Message:
        """Fed-PE's report; the last phase's also carries the clients' clipping counts (the run
        totals: sent each phase, they would tell the server which phase had a clipped
        reward)."""
        reply = super()._explore(message, rows)
        if int(message.fields["phase"][0]) < last_phase(self.spec.horizon, self.spec.num_arms):
            return reply
        return dataclasses.replace(
            reply, meta={**reply.meta, "clipped_rewards": self.clipped_rewards[rows].copy()}
        )


def _make_client(spec: ProblemSpec, params: PrivateFedPEParams, env: Any) -> PrivateFedPEClient:
    return PrivateFedPEClient(spec, params, environment_of(env, BanditEnvironment))


#: Declared in ``setup.cfg`` under ``fedbandit.algorithms``.
PRIVATE_FEDPE = AlgorithmSpec(
    name="private_fedpe",
    description="Fed-PE with Gaussian noise on each phase's mean rewards, clipped rewards (DP)",
    params=PrivateFedPEParams,
    make_server=lambda spec, params: PrivateFedPEServer(spec, params),
    make_client=_make_client,
    citation=citations.FEDPE + "\n\n" + citations.FEDPE_USER_LEVEL_DP,
)
