"""fed_ucb: phased federated UCB for fixed-feature instances.

Time is cut into phases of doubling length: phase p = 0, 1, 2, ... has L_p = L_0 2^p steps per
client (L_0 = ``first_phase_steps``), the last one cut at the horizon T, so a run has about
log2(T / L_0) phases and one message exchange per phase. Within a phase every client picks its arm
each step by a UCB index computed from the *global* statistics the server broadcast at the start
of the phase plus the client's *own* statistics gathered since; at the end of the phase it uploads
those new statistics and the server adds them to the global ones. No other communication happens.

Messages (communication is counted from their fields; nothing else travels):

- ``play`` (server -> clients, round p): the global statistics of every client's pulls in phases
  0..p-1 (no fields in phase 0: nothing is known yet). ``counts`` (K,) pulls per arm, then
  ``sums`` (K,) reward sums (pooling "counts"), or ``gram`` = sum x x^T and ``xy`` = sum x y
  per arm, (K, d, d) and (K, d) (pooling "least_squares"; (d, d) and (d,) pooled over every arm
  when the instance has one shared parameter). The same values go to every client.
- ``report`` (clients -> server): each client's statistics of phase p only: ``counts`` (K,) and
  ``sums`` or ``gram``/``xy``. Per-arm fields are sparse over the arms the client pulled in the
  phase (the mask ``pulled`` = counts > 0 follows from ``counts`` and is not counted).
- ``done`` (clients -> server): replaces ``report`` after the phase that reaches the horizon; it
  carries no fields (an upload nobody would read is not sent).

Index of client i for arm a (``alpha`` = exploration scale, sigma = noise level, n_i = number of
samples in the client's view: global pulls plus its own pulls since the last broadcast):

    radius  beta_i = alpha * sigma * sqrt(2 log(2 + n_i))
    counts:         U_{i,a} = S_a / N_a + beta_i / sqrt(N_a)      (+inf while N_a = 0)
                    with N_a = N^glob_a + N^own_{i,a}, S_a = S^glob_a + S^own_{i,a}
    least squares:  U_{i,a} = x_{i,a}^T theta_{i,a} + beta_i ||x_{i,a}||_{V_{i,a}^-1}
                    V_{i,a} = lambda I + G_a + G^own_{i,a}
                    theta_{i,a} = V_{i,a}^-1 (g_a + g^own_{i,a})
                    (shared parameter: one V_i and theta_i per client, pooled over the arms)

Ties go to the first maximiser in the client's cyclic arm order i mod K, i+1 mod K, ..., so that
clients with nothing to go on start on different arms. "counts" pooling assumes every client sees
the same arm means (it ignores the features); "least_squares" pooling assumes only the linear
model x_{i,a}^T theta_a and gives each client its own mean estimate, which is what heterogeneous
clients (such as the ``two_groups`` instance kind) need.

The client groups hold no algorithm state between messages: each ``play`` message carries the
complete global statistics and the phase's own statistics are uploaded in the reply, so the
environment's state (pulls, random streams, regret) is all a fresh process needs (``STATE = ()``).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from fedbandit import (
    AlgorithmSpec,
    BanditEnvironment,
    ClientLogic,
    Hyperparameters,
    Message,
    ProblemSpec,
    ServerLogic,
)

Pooling = Literal["counts", "least_squares"]


class FedUCBParams(Hyperparameters):
    """Hyperparameters of fed_ucb (frozen; unknown keys are rejected).

    - ``alpha`` > 0: exploration scale in beta = alpha sigma sqrt(2 log(2 + n)), n = samples in the
      client's view. alpha = 1 is UCB's usual sqrt(2 log n) bonus.
    - ``pooling``: "counts" (per-arm pull counts and reward sums; assumes arm means common to all
      clients) or "least_squares" (per-arm sums of x x^T and x y, or one pooled pair on a
      shared-parameter instance; each client gets x_{i,a}^T theta_a and ||x_{i,a}||_{V^-1}).
    - ``ridge`` > 0: lambda in V = lambda I + sum x x^T (least squares only).
    - ``noise_sigma`` > 0: sigma in the radius; default (None) the instance's noise level.
    - ``first_phase_steps`` >= 1: L_0; phase p has L_0 2^p steps per client.
    """

    alpha: float = Field(1.0, gt=0, description="exploration scale in the UCB radius")
    pooling: Pooling = Field(
        "least_squares", description="what is shared: per-arm counts or least-squares statistics"
    )
    ridge: float = Field(1.0, gt=0, description="ridge lambda of the least-squares statistics")
    noise_sigma: float | None = Field(
        None, gt=0, description="sigma in the radius (default: the instance's)"
    )
    first_phase_steps: int = Field(1, ge=1, description="steps of phase 0; phases double")


# --------------------------------------------------------------------------------------------
# The math, as free functions (exact-value tests in tests/test_math.py)
# --------------------------------------------------------------------------------------------


def phase_length(phase: int, first_phase_steps: int, played: int, horizon: int) -> int:
    """Steps per client of ``phase``: L_0 2^phase, cut to the ``horizon - played`` steps left."""
    return max(0, min(first_phase_steps * 2**phase, horizon - played))


def row_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sum_j a[..., j] b[..., j] (broadcasting), added in index order.

    Element-wise operations only (no BLAS), so each client's value is bit-identical whatever the
    size of the batch it is computed in: results do not depend on how clients are grouped."""
    out = a[..., 0] * b[..., 0]
    for j in range(1, a.shape[-1]):
        out = out + a[..., j] * b[..., j]
    return out


def exploration_radius(alpha: float, sigma: float, samples: np.ndarray) -> np.ndarray:
    """beta = alpha sigma sqrt(2 log(2 + samples)), element-wise."""
    return alpha * sigma * np.sqrt(2.0 * np.log(2.0 + np.asarray(samples, dtype=np.float64)))


def count_index(counts: np.ndarray, sums: np.ndarray, radius: np.ndarray) -> np.ndarray:
    """U_a = sums_a / counts_a + radius / sqrt(counts_a), +inf where counts_a = 0.

    ``counts`` and ``sums`` are (n, K); ``radius`` is (n,)."""
    counts = np.asarray(counts, dtype=np.float64)
    tried = counts > 0
    mean = np.divide(sums, counts, out=np.zeros_like(counts), where=tried)
    bonus = np.divide(
        np.asarray(radius, dtype=np.float64)[:, None] * np.ones_like(counts),
        np.sqrt(counts),
        out=np.full_like(counts, np.inf),
        where=tried,
    )
    return mean + bonus


def ridge_estimate(gram: np.ndarray, xy: np.ndarray, ridge: float) -> tuple[np.ndarray, np.ndarray]:
    """(V^-1, theta) for V = ridge I + gram and theta = V^-1 xy, over any leading axes.

    ``gram`` (..., d, d), ``xy`` (..., d). The inverse is LAPACK's, one matrix at a time (the same
    bits for a matrix whatever the stack it is in); the product is ``row_dot``."""
    d = gram.shape[-1]
    inverse = np.linalg.inv(ridge * np.eye(d) + gram)
    theta = row_dot(inverse, xy[..., None, :])
    return inverse, theta


def ridge_index(
    features: np.ndarray, inverse: np.ndarray, theta: np.ndarray, radius: np.ndarray
) -> np.ndarray:
    """U = x^T theta + radius sqrt(x^T V^-1 x), element-wise over leading axes.

    ``features`` (..., d), ``inverse`` (..., d, d), ``theta`` (..., d), ``radius`` broadcastable
    to the leading shape."""
    mean, width = ridge_mean_width(features, inverse, theta)
    return mean + radius * width


def ridge_mean_width(
    features: np.ndarray, inverse: np.ndarray, theta: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(x^T theta, ||x||_{V^-1}) element-wise over leading axes."""
    mean = row_dot(features, theta)
    width_sq = row_dot(features, row_dot(inverse, features[..., None, :]))
    return mean, np.sqrt(np.maximum(width_sq, 0.0))


def select_arms(index: np.ndarray, client_ids: np.ndarray) -> np.ndarray:
    """argmax_a index[i, a] per client; ties go to the first arm in the cyclic order starting at
    arm (client id mod K)."""
    n, K = index.shape
    order = (np.asarray(client_ids, dtype=np.int64)[:, None] + np.arange(K)) % K
    rotated = np.take_along_axis(index, order, axis=1)
    return order[np.arange(n), rotated.argmax(axis=1)]


def pool(total: np.ndarray, uploads: np.ndarray) -> np.ndarray:
    """The server's aggregation: the global statistic plus every client's upload (axis 0)."""
    return total + uploads.sum(axis=0)


# --------------------------------------------------------------------------------------------
# Server and clients
# --------------------------------------------------------------------------------------------


def _statistic_shapes(spec: ProblemSpec, pooling: Pooling) -> dict[str, tuple[int, ...]]:
    """Shapes of the global statistics (without the client axis)."""
    K, d = spec.num_arms, spec.dim
    if pooling == "counts":
        return {"counts": (K,), "sums": (K,)}
    if spec.shared_parameter:
        return {"counts": (K,), "gram": (d, d), "xy": (d,)}
    return {"counts": (K,), "gram": (K, d, d), "xy": (K, d)}


class FedUCBServer(ServerLogic):
    """Broadcasts the global statistics at each phase start and adds the phase's uploads."""

    def __init__(self, spec: ProblemSpec, params: FedUCBParams) -> None:
        self.spec, self.params = spec, params
        self.clients = spec.client_ids.copy()
        self.stats = {
            name: np.zeros(shape, dtype=np.int64 if name == "counts" else np.float64)
            for name, shape in _statistic_shapes(spec, params.pooling).items()
        }
        self.phase = 0
        self.played = 0  # steps per client done in the phases aggregated so far
        self.finished = False

    def _steps(self) -> int:
        return phase_length(
            self.phase, self.params.first_phase_steps, self.played, self.spec.horizon
        )

    def configure(self) -> Message | None:
        if self.finished or len(self.clients) == 0:
            return None
        n = len(self.clients)
        fields = (
            {}
            if self.phase == 0
            else {k: np.broadcast_to(v, (n, *v.shape)) for k, v in self.stats.items()}
        )
        return Message("play", self.phase, self.clients.copy(), fields)

    def aggregate(self, reply: Message) -> None:
        steps = self._steps()
        last = self.played + steps >= self.spec.horizon
        expected = "done" if last else "report"
        if reply.kind != expected or reply.round != self.phase:
            raise RuntimeError(
                f"expected {expected!r} replies for round {self.phase}, got {reply.kind!r} for "
                f"round {reply.round}"
            )
        if not np.array_equal(reply.client_ids, self.clients):
            raise RuntimeError(
                f"round {reply.round}: replies of clients {reply.client_ids.tolist()}, expected "
                f"{self.clients.tolist()}"
            )
        if expected == "report":
            for name, total in self.stats.items():
                self.stats[name] = pool(total, reply.fields[name])
        self.played += steps
        self.phase += 1
        self.finished = last

    def drop_clients(self, client_ids: np.ndarray) -> None:
        """Stop addressing ``client_ids``. Their uploads so far stay in the global statistics;
        the phase they were lost in is aggregated from the surviving replies. No client left:
        the run ends."""
        ids = np.unique(np.asarray(client_ids, dtype=np.int64))
        unknown = np.setdiff1d(ids, self.clients)
        if unknown.size:
            raise ValueError(f"FedUCBServer cannot drop clients {unknown.tolist()}: not addressed")
        self.clients = np.setdiff1d(self.clients, ids)
        if len(self.clients) == 0:
            self.finished = True


class FedUCBClient(ClientLogic):
    """A group of clients: plays a whole phase per ``play`` message, vectorised over clients
    (one ``env.pull_arms`` call per step for the group)."""

    #: Nothing algorithmic survives a message (see the module docstring): the environment's own
    #: state is the whole state of the group.
    STATE = ()

    def __init__(self, spec: ProblemSpec, params: FedUCBParams, env: BanditEnvironment) -> None:
        super().__init__(env)
        self.spec, self.params = spec, params
        self.sigma = params.noise_sigma if params.noise_sigma is not None else spec.noise_sigma
        self.shapes = _statistic_shapes(spec, params.pooling)

    def handle(self, message: Message) -> Message:
        if message.kind != "play":
            raise ValueError(f"unknown message kind {message.kind!r} for fed_ucb")
        if not np.array_equal(message.client_ids, self.client_ids):
            raise ValueError(
                "fed_ucb clients play every step together: a message must address the whole "
                f"group {self.client_ids.tolist()}, got {message.client_ids.tolist()}"
            )
        env = self.env
        played = int(env.pulls[0])
        steps = phase_length(message.round, self.params.first_phase_steps, played, env.horizon)
        if steps <= 0:
            raise RuntimeError(f"play message for round {message.round} after the horizon")
        glob = {
            name: (
                np.asarray(message.fields[name][0])
                if name in message.fields
                else np.zeros(shape, dtype=np.int64 if name == "counts" else np.float64)
            )
            for name, shape in self.shapes.items()
        }
        if self.params.pooling == "counts":
            own = self._play_counts(glob, steps)
        elif self.spec.shared_parameter:
            own = self._play_shared(glob, steps)
        else:
            own = self._play_disjoint(glob, steps)
        meta = {"pulls": env.pulls.copy()}
        if int(env.pulls[0]) >= env.horizon:
            return Message("done", message.round, message.client_ids, {}, meta=meta)
        pulled = own["counts"] > 0
        sparse = {name: "pulled" for name, value in own.items() if name != "counts"}
        if self.spec.shared_parameter and self.params.pooling == "least_squares":
            sparse = {}  # one pooled statistic, not per arm
        return Message(
            "report",
            message.round,
            message.client_ids,
            {**own, "pulled": pulled},
            sparse=sparse,
            known=frozenset({"pulled"}),
            meta=meta,
        )

    # One phase, three flavours. Each returns this phase's own statistics with a client axis.

    def _play_counts(self, glob: dict[str, np.ndarray], steps: int) -> dict[str, np.ndarray]:
        env, ids = self.env, self.client_ids
        n, K = env.num_clients, self.spec.num_arms
        rows = np.arange(n)
        view_counts = np.broadcast_to(glob["counts"].astype(np.float64), (n, K)).copy()
        view_sums = np.broadcast_to(glob["sums"], (n, K)).copy()
        own_counts = np.zeros((n, K), dtype=np.int64)
        own_sums = np.zeros((n, K))
        samples = int(glob["counts"].sum())
        for step in range(steps):
            radius = exploration_radius(self.params.alpha, self.sigma, np.full(n, samples + step))
            arms = select_arms(count_index(view_counts, view_sums, radius), ids)
            rewards = env.pull_arms(arms)
            view_counts[rows, arms] += 1.0
            view_sums[rows, arms] += rewards
            own_counts[rows, arms] += 1
            own_sums[rows, arms] += rewards
        return {"counts": own_counts, "sums": own_sums}

    def _play_disjoint(self, glob: dict[str, np.ndarray], steps: int) -> dict[str, np.ndarray]:
        env, ids = self.env, self.client_ids
        n, K, d = env.num_clients, self.spec.num_arms, self.spec.dim
        rows = np.arange(n)
        x = env.features  # (n, K, d)
        ridge = self.params.ridge
        own_counts = np.zeros((n, K), dtype=np.int64)
        own_gram = np.zeros((n, K, d, d))
        own_xy = np.zeros((n, K, d))
        # Phase start: the global estimate per arm, the same for every client.
        inverse, theta = ridge_estimate(glob["gram"], glob["xy"], ridge)  # (K, d, d), (K, d)
        mean, width = ridge_mean_width(x, inverse[None], theta[None])  # (n, K)
        samples = int(glob["counts"].sum())
        for step in range(steps):
            radius = exploration_radius(self.params.alpha, self.sigma, np.full(n, samples + step))
            arms = select_arms(mean + radius[:, None] * width, ids)
            rewards = env.pull_arms(arms)
            xa = x[rows, arms]  # (n, d)
            own_counts[rows, arms] += 1
            own_gram[rows, arms] += xa[:, :, None] * xa[:, None, :]
            own_xy[rows, arms] += xa * rewards[:, None]
            # Only the pulled arm's statistics changed: refresh its estimate and width.
            inv_a, theta_a = ridge_estimate(
                glob["gram"][arms] + own_gram[rows, arms],
                glob["xy"][arms] + own_xy[rows, arms],
                ridge,
            )
            mean[rows, arms], width[rows, arms] = ridge_mean_width(xa, inv_a, theta_a)
        return {"counts": own_counts, "gram": own_gram, "xy": own_xy}

    def _play_shared(self, glob: dict[str, np.ndarray], steps: int) -> dict[str, np.ndarray]:
        env, ids = self.env, self.client_ids
        n, K, d = env.num_clients, self.spec.num_arms, self.spec.dim
        rows = np.arange(n)
        x = env.features
        ridge = self.params.ridge
        own_counts = np.zeros((n, K), dtype=np.int64)
        own_gram = np.zeros((n, d, d))
        own_xy = np.zeros((n, d))
        samples = int(glob["counts"].sum())
        for step in range(steps):
            inverse, theta = ridge_estimate(glob["gram"] + own_gram, glob["xy"] + own_xy, ridge)
            radius = exploration_radius(self.params.alpha, self.sigma, np.full(n, samples + step))
            index = ridge_index(x, inverse[:, None], theta[:, None], radius[:, None])
            arms = select_arms(index, ids)
            rewards = env.pull_arms(arms)
            xa = x[rows, arms]
            own_counts[rows, arms] += 1
            own_gram += xa[:, :, None] * xa[:, None, :]
            own_xy += xa * rewards[:, None]
        return {"counts": own_counts, "gram": own_gram, "xy": own_xy}


FED_UCB = AlgorithmSpec(
    name="fed_ucb",
    description="Phased federated UCB: doubling phases, pooled counts or least squares (plugin)",
    params=FedUCBParams,
    make_server=lambda spec, params: FedUCBServer(spec, params),
    make_client=lambda spec, params, env: FedUCBClient(spec, params, env),
    needs_shared_parameter=False,
    contextual=False,
)
