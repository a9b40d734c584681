"""What every algorithm provides: validated hyperparameters and a server/client factory."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from fedbandit.errors import ConfigError
from fedbandit.federation.messages import Message
from fedbandit.federation.protocol import ClientLogic, ServerLogic, remove_clients
from fedbandit.group_environment import GroupEnvironment


@dataclass(frozen=True)
class ProblemSpec:
    """What server and clients both know: sizes, horizon, noise level, and the client ids."""

    num_clients: int
    num_arms: int
    dim: int
    horizon: int
    shared_parameter: bool
    noise_sigma: float
    contextual: bool = False
    #: The link of Bernoulli rewards mu(x^T theta) (``logistic``, ``probit``), None for linear
    #: rewards x^T theta plus Gaussian noise.
    reward_link: str | None = None
    #: Floats of context an environment buffers per client and round, when the instance says
    #: (a compact context such as a query index: 1); None: K d with a shared parameter, else d.
    context_floats_per_round: int | None = None
    #: Bytes the instance itself holds (its data), when it says; None: counted from the sizes.
    instance_bytes: float | None = None

    @property
    def client_ids(self) -> np.ndarray:
        return np.arange(self.num_clients, dtype=np.int64)


class Hyperparameters(BaseModel):
    """Base of every algorithm's hyperparameters: frozen, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


Params = TypeVar("Params", bound=Hyperparameters)
Env = TypeVar("Env", bound=GroupEnvironment)


@dataclass(frozen=True)
class AlgorithmSpec(Generic[Params]):
    """A registry entry: name, description, hyperparameter model and the two factories.

    ``make_server(problem, params)`` builds the ``ServerLogic``; ``make_client(problem, params,
    env)`` builds the ``ClientLogic`` of one group of clients playing in ``env`` (narrow it with
    ``environment_of``). ``contextual`` says whether the algorithm runs on contextual instances
    (fresh contexts each round) or on fixed-feature ones; ``needs_shared_parameter`` refuses
    instances with per-arm parameters; ``needs_reward_link`` refuses linear rewards;
    ``citation`` is the BibTeX of its paper."""

    name: str
    description: str
    params: type[Params]
    make_server: Callable[[ProblemSpec, Params], ServerLogic]
    make_client: Callable[[ProblemSpec, Params, GroupEnvironment], ClientLogic]
    needs_shared_parameter: bool = False
    contextual: bool = False
    #: The algorithm models Bernoulli rewards through a link (``ProblemSpec.reward_link``).
    needs_reward_link: bool = False
    #: Bytes one seed needs per client (for the estimate made before a run); None: the generic
    #: formula of ``fedbandit.resources`` for the algorithm's kind of instance.
    memory_per_client: Callable[[ProblemSpec], float] | None = None
    #: The paper(s) to cite for the algorithm, as BibTeX ("" for none); ``fedbandit cite`` prints
    #: it and every results folder's ``CITATIONS.bib`` holds it. A plugin sets its own.
    citation: str = ""

    def check_problem(self, spec: ProblemSpec) -> None:
        if self.contextual != spec.contextual:
            wanted = "a contextual" if self.contextual else "a fixed-feature"
            raise ConfigError(
                f"algorithm {self.name!r} needs {wanted} instance (kind 'contextual' draws fresh "
                "contexts each round; the other kinds hold fixed features per client and arm)"
            )
        if self.needs_shared_parameter and not spec.shared_parameter:
            raise ConfigError(
                f"algorithm {self.name!r} assumes one parameter shared by all arms, but the "
                "instance has disjoint per-arm parameters"
            )
        if self.needs_reward_link and spec.reward_link is None:
            raise ConfigError(
                f"algorithm {self.name!r} models Bernoulli rewards through a link function, but "
                "the instance has linear rewards; use an instance of kind 'glm_contextual'"
            )


def environment_of(env: GroupEnvironment, kind: type[Env]) -> Env:
    """``env`` as the environment class a client logic needs (``BanditEnvironment`` for fixed
    features, ``ContextualEnvironment`` for fresh contexts); a clear error otherwise."""
    if not isinstance(env, kind):
        raise ConfigError(
            f"this algorithm's clients need a {kind.__name__}, but the instance made a "
            f"{type(env).__name__} (is the algorithm meant for this kind of instance?)"
        )
    return env


class NoCommunicationServer(ServerLogic):
    """For algorithms whose clients learn alone: one empty start message (not counted as
    communication), after which each client group runs the whole horizon and replies ``done``.
    Dropping clients only removes them from ``clients`` (there is nothing to aggregate)."""

    def __init__(self, spec: ProblemSpec) -> None:
        self.spec = spec
        self.clients = spec.client_ids.copy()
        self.started = False

    def configure(self) -> Message | None:
        if self.started or len(self.clients) == 0:
            return None
        self.started = True
        return Message("start", 0, self.clients, {})

    def aggregate(self, reply: Message) -> None:
        if reply.kind != "done":
            raise RuntimeError(f"expected 'done' replies, got {reply.kind!r}")

    def drop_clients(self, client_ids: np.ndarray) -> None:
        self.clients = remove_clients(self.clients, client_ids, type(self).__name__)
