"""FedGLB-UCB: federated generalised linear bandits (Li & Wang, "Communication Efficient Federated
Learning for Generalized Linear Bandits", NeurIPS 2022; the authors' code ``cyrilli/FedGLB-UCB``,
``lib/FedGLB_UCB.py``, with the settings of ``RunSyntheticDataset.py``), and ``ons_glm``, its
clients learning alone.

Rewards are Bernoulli with mean mu(x^T theta), one theta shared by every client and arm. Each client
keeps A (the Gram matrix of everything it knows), an online Newton (ONS) estimate theta_ONS and a
ridge fit theta_ridge of the ONS predictions z = x^T theta_ONS (Jun et al. 2017, "Scalable
generalized linear bandits"); it plays argmax x^T theta_ridge + alpha_t ||x||_{A_inv}. After a pull:

- the sample joins A, the upload buffer (dA, n_buf) and the client's data (x, y);
- trigger (``syncRoundTriggered``): log(det(A + lambda/c_mu I) / det(A - dA + lambda/c_mu I))
  n_buf >= D, D = T / (M d ln(M T)) with T the rounds (the script's ``threshold``);
- no trigger: one ONS step (``localUpdate_ONSStep``): z = x^T theta_ONS, b += z x,
  sum_z2 += z^2, A_inv by Sherman-Morrison, g = mu(z) - y,
  theta_ONS = Proj_{A + lambda/c_mu I}(theta_ONS - g/c_mu A_inv x), theta_ridge = A_inv b,
  B2 += g^2 x^T A_inv x / (2 c_mu), beta_local = ``local_beta(B2)``;
- a trigger (the triggering client skips its ONS step) starts a global update, as message rounds:
  ``collect`` (every client uploads dA and n_buf: d^2 + 1 scalars), then accelerated gradient
  descent on the regularised negative log-likelihood of all data, each iteration one exchange
  (``gradient``: the server sends the point x, every client returns sum_i (mu(x_i^T x) - y_i) x_i,
  d scalars each way), then ``finish`` (x once more; every client returns sum_i (x_i^T x)^2), and
  the next round carries the new global statistics to every client (A_g, x, B2, beta_global,
  sum_z2: d^2 + d + 3 scalars).

The AGD is the code's loop (``updateParameters``): x from 0 (``init_x`` of the script) or, with
``warm_start``, from the last global x; step 0.1 / (0.25 + lambda / n); at most 2 n iterations
(``max_iterations``); it stops when ||grad f(x)|| <= sqrt(2 lambda / n^3), f the NLL plus
lambda/2 ||x||^2 over n samples; the momentum is the code's lagged Nesterov sequence
(``agd_step``). After it every client sets A = A_g - lambda/c_mu I, b = (A_g - lambda/c_mu I) x,
A_inv = A_g^-1, theta_ridge = A_inv b, theta_ONS = x and the confidence parts of
``global_confidence``.

The width is alpha_t = s sqrt(lambda S^2 / c_mu + beta_local + beta_global - sum_z2 +
theta_ridge^T b) with s = 0.1 (``alpha_t_scaling`` of the script), clipped at 0 under the root.

Where ours differs from the code:

- the projection of the ONS step is by default onto the paper's feasible set, the ball
  ||theta|| <= S, in the norm of A + lambda/c_mu I (``project_to_ball``; ``projection = "none"``
  skips it). The code projects onto the probability simplex {theta >= 0, sum theta = 1} in the
  same norm (``projection_in_norm``, a cvxopt QP), which excludes the normalised Gaussian theta*
  of its own script: ``projection = "simplex"`` does that (``project_to_simplex``, exact), in
  either fidelity;
- the argmax breaks ties by the lowest arm index (the code: at random among equal values, which
  with a shared theta only happens between identical arm vectors, so the regret is the same);
- in synchronous rounds every client acts in a round and a global update follows the round; in the
  code's order (``round_robin``: ``for iter: for uid in range(N)``) ours makes the decisions of
  the code with every client created before the first step (checked in
  ``tests/test_glm_ucb.py`` against a transcription of the code's loop), and with
  ``fidelity = "authors_code"`` those of the code as it is, clients created at their first pull
  (below);
- communication is counted from the messages: ours counts every message, the trigger bits,
  ``finish`` and the one-scalar ``collect`` request. The code's ``totalCommCost`` (d^2 + 1 per
  client per collect and 2 d per client and AGD iteration, leaving out the triggering client and
  the last iteration, and d^2 + d + 1 per client per download unless its stale ``clientID`` is
  the triggering client) is reported beside it as ``authors_comm_cost``
  (``FedGLBServer.report``).

``fidelity = "authors_code"`` (``fedglb_ucb``): the code's joining rule. Its server creates a
client at the client's first ``decide`` (``self.clients``), and a global update collects from,
asks gradients of and overwrites only the clients created so far; a client that has not pulled
keeps empty statistics (A = 0, A_inv = c_mu / lambda I, no global confidence parts), so its first
pull grows log det(A + lambda/c_mu I) by log(1 + c_mu ||x||^2 / lambda) over one sample, which
triggers a global update whenever that reaches D (with the script's norm-sqrt-2 arms and D, every
client's first pull does). Ours: each client sends a one-scalar ``joined`` flag with its first
pull (bookkeeping), and the server's collect request, AGD points and the result of a global
update go to the joined clients only (their replies likewise); in the paper mode every client is
in the federation from the start. With every client acting in the first synchronous round the
two modes are the same run. The AGD's cold start (``init_x`` = 0) and cap (2 n) are the
synthetic script's in both modes (the real-data script warm-starts and caps at 1000:
``warm_start``, ``max_iterations``). ``ons_glm`` with ``authors_code`` is the code's
``N_ONS_GLM``: A_inv starts at I / lambda (not c_mu / lambda I; the projection keeps the metric
A + lambda/c_mu I), B at 2 c_mu lambda S^2, and alpha_t = s sqrt(lambda S^2 + ``alone_beta``(B)
+ theta_ridge^T b - sum_z2). Both are checked against transcriptions of the code's loops,
creating clients as the code does, in ``tests/test_glm_reference.py``.

Every per-client field of the global update's messages has a unit axis and is sparse on a mask
of the clients in the federation (all of them in the paper mode), so communication counts only
what the federation's members send and receive.

The model's link is the instance's unless ``link`` says otherwise: logistic (the code's
``sigmoid``) or probit. Both use the GLM score (mu(z) - y) x, which is the gradient of the negative
log-likelihood for the logistic link only: with probit the AGD solves the GLM's quasi-likelihood
equation, not the probit likelihood, and the code's stopping rule keeps its form. c_mu defaults to
mu'(S), the script's ``dsigmoid(S)``.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numba
import numpy as np
from pydantic import Field

from fedbandit import compile_notice
from fedbandit.algorithms import citations
from fedbandit.algorithms.base import AlgorithmSpec, Hyperparameters, ProblemSpec, environment_of
from fedbandit.contextual.environment import ContextualEnvironment, round_of_step
from fedbandit.federation.messages import Message, broadcast
from fedbandit.federation.protocol import ClientLogic, ServerLogic
from fedbandit.resources import contextual_bytes_per_client

compile_notice.install()  # one line on stderr when numba compiles these kernels

Link = Literal["logistic", "probit"]
Fidelity = Literal["paper", "authors_code"]

#: Bisection steps of ``project_to_ball``: the bracket shrinks by 2^-80, below float resolution.
BISECTION_STEPS = 80


class FedGLBParams(Hyperparameters):
    """FedGLB-UCB's constants; defaults are those of the authors' ``RunSyntheticDataset.py``.

    - ``regularization``: lambda (2); ``delta``: confidence (0.01); ``theta_bound``: S (1);
      ``reward_bound``: R, the rewards' sub-Gaussian constant (0.5 for rewards in [0, 1]);
    - ``link``: the model's link (default: the instance's); ``c_mu``: the lower bound on mu'
      (default mu'(S));
    - ``width_scale``: s in alpha_t = s sqrt(...) (0.1); ``width``: a fixed alpha_t instead;
    - ``threshold``: D of the sync trigger (default T / (M d ln(M T)), T the rounds; inf never
      syncs);
    - ``max_iterations``: of the AGD (default 2 n); ``warm_start``: start the AGD from the last
      global x (the script starts from 0);
    - ``projection``: the ONS step's feasible set, in the norm of A + lambda/c_mu I: ``ball``
      ||theta|| <= S (the paper's), ``simplex`` {theta >= 0, sum theta = 1} (the code's
      ``projection_in_norm``; S unused), or ``none``;
    - ``fidelity``: ``paper`` (default) or ``authors_code`` (the authors' code's joining rule:
      a client is part of the federation from its first pull; for ``ons_glm`` the constants of
      the code's ``N_ONS_GLM``; see the module docstring). The AGD's start (0) and cap (2 n) are
      those of the synthetic script in both modes."""

    regularization: float = Field(2.0, gt=0)
    delta: float = Field(0.01, gt=0, lt=1)
    theta_bound: float = Field(1.0, gt=0)
    reward_bound: float = Field(0.5, gt=0)
    link: Link | None = None
    c_mu: float | None = Field(None, gt=0, le=1)
    width_scale: float = Field(0.1, ge=0)
    width: float | None = Field(None, ge=0)
    threshold: float | None = Field(None, ge=0)
    max_iterations: int | None = Field(None, ge=1)
    warm_start: bool = False
    projection: Literal["ball", "simplex", "none"] = "ball"
    fidelity: Fidelity = "paper"


class OnsGLMParams(FedGLBParams):
    """``ons_glm``: FedGLB-UCB's constants; the clients never sync (``threshold`` is ignored).
    ``fidelity = "authors_code"``: the code's ``N_ONS_GLM`` (A_inv from I / lambda, B from
    2 c_mu lambda S^2, its own alpha_t: ``alone_beta``)."""


def model_link(params: FedGLBParams, spec: ProblemSpec) -> str:
    """The link the algorithm models: ``params.link``, else the instance's, else logistic."""
    return params.link or spec.reward_link or "logistic"


@numba.njit(cache=True)
def client_sums(values: np.ndarray, weights: np.ndarray, count: np.ndarray) -> np.ndarray:
    """sum_{l < count_n} weights[n, l] values[n, l] per client n: (n, L, d), (n, L), (n,) ->
    (n, d). Added in sample order from the first term (the last entry of a running sum), so the
    result never depends on the padding beyond count_n or on how many clients share the array;
    one pass, where NumPy would form the (n, L, d) products and their running sums."""
    n, _, d = values.shape
    out = np.zeros((n, d))
    for i in range(n):
        if count[i] == 0:
            continue
        for j in range(d):
            out[i, j] = values[i, 0, j] * weights[i, 0]
        for sample in range(1, count[i]):
            weight = weights[i, sample]
            for j in range(d):
                out[i, j] += values[i, sample, j] * weight
    return out


@numba.njit(cache=True)
def sample_dots(values: np.ndarray, point: np.ndarray, count: np.ndarray) -> np.ndarray:
    """z[n, l] = values[n, l]^T point[n] for l < count_n, 0 beyond: (n, L, d), (n, d), (n,) ->
    (n, L). Summed over the d coordinates in order (NumPy's ``(values * point).sum(axis=2)``
    pairs terms from d = 9 on, so the two can differ in the last bit)."""
    n, length, d = values.shape
    out = np.zeros((n, length))
    for i in range(n):
        for sample in range(count[i]):
            acc = 0.0
            for j in range(d):
                acc += values[i, sample, j] * point[i, j]
            out[i, sample] = acc
    return out


def client_gradients(
    data_x: np.ndarray, data_y: np.ndarray, point: np.ndarray, count: np.ndarray, link: str
) -> np.ndarray:
    """sum_{l < count_n} (mu(x_l^T x) - y_l) x_l per client n, the GLM score at ``point`` x over
    each client's data: (n, L, d), (n, L), (n, d), (n,) -> (n, d) (``sample_dots``, then
    ``client_sums``)."""
    residual = link_mean(link, sample_dots(data_x, point, count)) - data_y
    return client_sums(data_x, residual, count)


def link_mean(link: str, z: np.ndarray) -> np.ndarray:
    """mu(z): logistic 1 / (1 + e^-z) or probit Phi(z)."""
    from scipy.special import expit, ndtr  # SciPy: deferred, as by the GLM instances

    return expit(z) if link == "logistic" else ndtr(z)


def link_slope(link: str, z: float) -> float:
    """mu'(z): logistic mu(z)(1 - mu(z)) (the script's ``dsigmoid``); probit the normal density."""
    if link == "logistic":
        mu = 1.0 / (1.0 + math.exp(-z))
        return mu * (1.0 - mu)
    return math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def sync_threshold(rounds: int, num_clients: int, dim: int) -> float:
    """D = T / (M d ln(M T)), T the rounds (``RunSyntheticDataset.py``: ``testing_iterations /
    (n_users * context_dimension * np.log(n_users * testing_iterations))``)."""
    total = max(num_clients * rounds, 2)
    return rounds / (num_clients * dim * math.log(total))


def local_beta(
    bound_b2: np.ndarray, c_mu: float, reward_bound: float, num_clients: int, delta: float
) -> np.ndarray:
    """beta_local = 1 + 4 B2 / c_mu + 8 R^2 / c_mu^2 ln(M / delta sqrt(4 + 8 B2 / c_mu
    + 64 R^4 / (4 c_mu^4 delta^2))) (``localUpdate_ONSStep``)."""
    R, c = reward_bound, c_mu
    inner = 4 + 8 * bound_b2 / c + 64 * R**4 / (c**4 * 4 * delta**2)
    return 1 + 4 * bound_b2 / c + 8 * R**2 / c**2 * np.log(num_clients / delta * np.sqrt(inner))


def alone_beta(bound_b: np.ndarray, c_mu: float, reward_bound: float, delta: float) -> np.ndarray:
    """The code's ``N_ONS_GLM`` (``LocalClient.alpha_t`` less lambda S^2 and theta_ridge^T b
    - sum z^2): 1 + 4 B / c_mu + 8 R^2 / c_mu^2 ln(2 / delta sqrt(1 + 2 B / c_mu
    + 4 R^4 / (c_mu^4 delta^2)))."""
    R, c = reward_bound, c_mu
    inner = 1 + 2 / c * bound_b + 4 * R**4 / (c**4 * delta**2)
    return 1 + 4 / c * bound_b + 8 * R**2 / c**2 * np.log(2 / delta * np.sqrt(inner))


def global_confidence(
    gradient_sum: np.ndarray,
    gram: np.ndarray,
    point: np.ndarray,
    count: int,
    params: FedGLBParams,
    c_mu: float,
) -> tuple[float, float]:
    """(B2, beta_global) after a global update (``updateParameters``), from n = ``count`` samples,
    the AGD's last gradient times n (``gradient_sum``), A_g (``gram``) and x (``point``):
    B1 = lambda/2 + 1/n; w = ||n grad||_{A_g} / c_mu + R / c_mu sqrt(d ln(1 + n c_mu / (d lambda))
    + 2 ln(1/delta)) + sqrt(lambda / c_mu) S; B2 = w^2 / (2 c_mu); L = ln(1/delta)
    + d/2 ln(1 + (1 + n) / d); beta_global = 8 R^2 / c_mu^2 L + B1 + 4 R / c_mu sqrt(2 L)
    (||x|| + S + sqrt(B1))."""
    lam, R, S, delta = params.regularization, params.reward_bound, params.theta_bound, params.delta
    d, n, c = len(point), count, c_mu
    b1 = lam * 0.5 + 1.0 / n
    width = (
        math.sqrt(float(gradient_sum @ gram @ gradient_sum)) / c
        + R / c * math.sqrt(d * math.log(1 + n * c / (d * lam)) + 2 * math.log(1.0 / delta))
        + math.sqrt(lam / c) * S
    )
    b2 = 0.5 / c * width**2
    log_det = math.log(1 / delta) + d / 2 * math.log(1 + (1 + n) / d)
    beta = (
        8 * R**2 / c**2 * log_det
        + b1
        + 4 * R / c * math.sqrt(2 * log_det) * (float(np.linalg.norm(point)) + S + math.sqrt(b1))
    )
    return b2, beta


def agd_step(
    point: np.ndarray,
    previous: np.ndarray,
    gradient: np.ndarray,
    step: float,
    momentum: tuple[float, float, float],
) -> tuple[np.ndarray, np.ndarray, tuple[float, float, float]]:
    """One iteration of the code's accelerated gradient descent: y = x - step grad,
    x' = (1 - gamma) y + gamma y_prev; then lambda_prev, lambda = lambda,
    (1 + sqrt(1 + 4 lambda_prev^2)) / 2 (the *old* lambda_prev, as the code updates it after) and
    gamma = (1 - lambda_prev) / lambda. ``momentum`` is (lambda_prev, lambda, gamma), starting at
    (0, 1, 1): the first iteration leaves x where it is. Returns (x', y, momentum')."""
    lam_prev, lam_curr, gamma = momentum
    current = point - step * gradient
    new_point = (1 - gamma) * current + gamma * previous
    new_curr = (1 + math.sqrt(1 + 4 * lam_prev * lam_prev)) / 2
    new_prev = lam_curr
    return new_point, current, (new_prev, new_curr, (1 - new_prev) / new_curr)


def project_to_ball(theta: np.ndarray, metric: np.ndarray, radius: float) -> np.ndarray:
    """argmin_{||y|| <= radius} (y - theta)^T M (y - theta) for each row: theta itself inside the
    ball; outside it y = Q diag(w / (w + nu)) Q^T theta with M = Q diag(w) Q^T and nu > 0 where
    ||y|| = radius (the KKT condition M (y - theta) + nu y = 0), nu by bisection. (n, d), (n, d, d)
    -> (n, d)."""
    out = theta.copy()
    outside = np.sqrt((theta * theta).sum(axis=1)) > radius
    if not outside.any():
        return out
    w, q = np.linalg.eigh(metric[outside])
    c = np.einsum("nde,nd->ne", q, theta[outside])
    low = np.zeros(len(c))
    high = w.max(axis=1) * np.sqrt((c * c).sum(axis=1)) / radius
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (low + high)
        scaled = w * c / (w + mid[:, None])
        too_long = (scaled * scaled).sum(axis=1) > radius * radius
        low = np.where(too_long, mid, low)
        high = np.where(too_long, high, mid)
    coords = w * c / (w + high[:, None])
    out[outside] = np.einsum("nde,ne->nd", q, coords)
    return out


def project_to_simplex(theta: np.ndarray, metric: np.ndarray) -> np.ndarray:
    """argmin (y - theta)^T M (y - theta) over the probability simplex {y >= 0, sum y = 1} for
    each row: the QP of the authors' ``projection_in_norm`` (``cyrilli/FedGLB-UCB``,
    ``lib/FedGLB_UCB.py``:14-27 and ``lib/N_ONS_GLM.py``, cvxopt ``solvers.qp`` with P = 2 M,
    q = -2 M theta, G = -I, h = 0, A = 1^T, b = 1), solved exactly by the primal active-set
    method (Nocedal & Wright, Numerical Optimization, Algorithm 16.3). On the free set F (the
    others 0) the minimiser solves M_FF y_F - (M theta)_F = nu 1, 1^T y_F = 1; a step blocked by
    a coordinate reaching 0 fixes it, and at a minimiser of the working set the bound whose
    multiplier mu_i = (M (y - theta))_i - nu is most negative is freed; y is optimal when no
    mu_i < 0 (the KKT conditions). Starts at the vertex e_k nearest theta in M's norm; M
    symmetric positive definite. (n, d), (n, d, d) -> (n, d)."""
    out = np.empty_like(theta)
    for row in range(len(theta)):
        out[row] = _simplex_row(theta[row], metric[row])
    return out


def _simplex_row(theta: np.ndarray, metric: np.ndarray) -> np.ndarray:
    """``project_to_simplex`` for one point."""
    d = len(theta)
    pull = metric @ theta
    vertex_cost = np.diag(metric) - 2.0 * pull
    y = np.zeros(d)
    y[int(np.argmin(vertex_cost))] = 1.0
    free = y > 0
    scale = 1e-12 * (1.0 + np.abs(metric).max() * (1.0 + np.abs(theta).max()))
    for _ in range(20 * d + 20):
        index = np.flatnonzero(free)
        system = np.zeros((len(index) + 1, len(index) + 1))
        system[:-1, :-1] = metric[np.ix_(index, index)]
        system[:-1, -1] = -1.0
        system[-1, :-1] = 1.0
        solution = np.linalg.solve(system, np.append(pull[index], 1.0))
        target, nu = solution[:-1], solution[-1]
        step = target - y[index]
        shrinking = step < 0
        ratios = np.where(shrinking, -y[index] / np.where(shrinking, step, -1.0), np.inf)
        blocking = int(np.argmin(ratios))
        if ratios[blocking] < 1.0:
            y[index] += ratios[blocking] * step
            y[index[blocking]] = 0.0
            free[index[blocking]] = False
            continue
        y[:] = 0.0
        y[index] = target
        multipliers = metric @ (y - theta) - nu
        multipliers[free] = 0.0
        worst = int(np.argmin(multipliers))
        if multipliers[worst] >= -scale:
            return y
        free[worst] = True
    raise RuntimeError("project_to_simplex: the active-set method did not converge")


def _logdet(matrices: np.ndarray) -> np.ndarray:
    return np.linalg.slogdet(matrices)[1]


class FedGLBClient(ClientLogic):
    """A group of FedGLB-UCB clients (see the module docstring)."""

    STATE = (
        "gram",
        "buffer_gram",
        "buffer_count",
        "inverse",
        "theta_ons",
        "theta_ridge",
        "target",
        "sum_z2",
        "bound_b2",
        "beta_local",
        "beta_global",
        "data_x",
        "data_y",
        "data_count",
    )

    env: ContextualEnvironment

    def __init__(
        self, spec: ProblemSpec, params: FedGLBParams, env: ContextualEnvironment, sync: bool
    ) -> None:
        super().__init__(env)
        self.spec, self.params = spec, params
        n, d = env.num_clients, spec.dim
        self.link = model_link(params, spec)
        self.c_mu = params.c_mu or link_slope(self.link, params.theta_bound)
        self.shift = params.regularization / self.c_mu  # lambda / c_mu
        rounds = round_of_step(env.instance, env.horizon - 1)
        self.threshold = math.inf
        if sync:
            self.threshold = (
                params.threshold
                if params.threshold is not None
                else sync_threshold(rounds, spec.num_clients, d)
            )
        authors_code = params.fidelity == "authors_code"
        #: authors_code with syncs: the joining rule (a ``joined`` flag at a client's first pull)
        self.joining = authors_code and sync
        #: authors_code alone (``ons_glm``): the constants of the code's ``N_ONS_GLM``
        self.alone_code = authors_code and not sync
        lam, S = params.regularization, params.theta_bound
        self.gram = np.zeros((n, d, d))
        self.buffer_gram = np.zeros((n, d, d))
        self.buffer_count = np.zeros(n, dtype=np.int64)
        first_inverse = np.eye(d) / (lam if self.alone_code else self.shift)
        self.inverse = np.broadcast_to(first_inverse, (n, d, d)).copy()
        self.theta_ons = np.zeros((n, d))
        self.theta_ridge = np.zeros((n, d))
        self.target = np.zeros((n, d))
        self.sum_z2 = np.zeros(n)
        first_b2 = (2.0 if self.alone_code else 0.5) * self.c_mu * lam * S**2
        self.bound_b2 = np.full(n, first_b2)
        self.beta_local = np.zeros(n)
        if self.alone_code:  # N_ONS_GLM computes its alpha_t at creation
            self.beta_local = alone_beta(
                self.bound_b2, self.c_mu, params.reward_bound, params.delta
            )
        self.beta_global = np.zeros(n)
        self.data_x = np.zeros((n, 0, d))
        self.data_y = np.zeros((n, 0))
        self.data_count = np.zeros(n, dtype=np.int64)

    # --- rounds -------------------------------------------------------------------------------

    def handle(self, message: Message) -> Message:
        if message.kind == "round":
            return self._round(message)
        if message.kind == "collect":
            return self._collect(message)
        if message.kind in ("gradient", "finish"):
            return self._evaluate(message)
        raise ValueError(f"unknown message kind {message.kind!r} for {type(self).__name__}")

    def width(self) -> np.ndarray:
        """alpha_t per client: the fixed ``width``, or s sqrt(lambda S^2 / c_mu + beta_local
        + beta_global - sum_z2 + theta_ridge^T b), the root's argument clipped at 0
        (``N_ONS_GLM``, ``ons_glm`` with ``authors_code``: lambda S^2 in place of
        lambda S^2 / c_mu, beta_local from ``alone_beta``, beta_global 0)."""
        if self.params.width is not None:
            return np.full(self.env.num_clients, self.params.width)
        p = self.params
        prior = p.regularization * p.theta_bound**2
        inner = (
            (prior if self.alone_code else prior / self.c_mu)
            + self.beta_local
            + self.beta_global
            - self.sum_z2
            + (self.theta_ridge * self.target).sum(axis=1)
        )
        return p.width_scale * np.sqrt(np.maximum(inner, 0.0))

    def select(self, contexts: np.ndarray) -> np.ndarray:
        """argmax_k x_k^T theta_ridge + alpha_t sqrt(x_k^T A_inv x_k) per client (lowest k on
        ties); contexts (n, K, d)."""
        mean = np.einsum("nkd,nd->nk", contexts, self.theta_ridge)
        spread = np.einsum("nkd,nde,nke->nk", contexts, self.inverse, contexts)
        ucb = mean + self.width()[:, None] * np.sqrt(np.maximum(spread, 0.0))
        return np.asarray(ucb.argmax(axis=1), dtype=np.int64)

    def _round(self, message: Message) -> Message:
        if "gram" in message.fields:
            self._download(message)
        contexts, active = self.env.observe()
        arms = self.select(contexts)
        rewards = self.env.pull(arms)
        rows = np.flatnonzero(active)
        x = contexts[rows, arms[rows]]
        y = rewards[rows]
        outer = x[:, :, None] * x[:, None, :]
        self.gram[rows] += outer
        self.buffer_gram[rows] += outer
        self.buffer_count[rows] += 1
        if math.isfinite(self.threshold):  # alone, a client never needs its data again
            self._store(rows, x, y)
        eye = self.shift * np.eye(self.spec.dim)
        trigger = np.zeros(self.env.num_clients, dtype=bool)
        if math.isfinite(self.threshold) and len(rows):
            growth = _logdet(self.gram[rows] + eye) - _logdet(
                self.gram[rows] - self.buffer_gram[rows] + eye
            )
            trigger[rows] = growth * self.buffer_count[rows] >= self.threshold
        local = ~trigger[rows]
        self._ons_step(rows[local], x[local], y[local])
        fields, sparse = {"trigger": trigger}, {"trigger": "trigger"}
        if self.joining:
            # The code's server creates a client at its first ``decide``: from then on it is
            # collected from, asked for gradients and synced. One flag, once a client.
            fields["joined"] = active & (self.env.pulls == 1)
            sparse["joined"] = "joined"
        return Message(
            "trigger", message.round, message.client_ids, fields, sparse=sparse, meta=self._meta()
        )

    def _store(self, rows: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
        """Append each row's sample to its data (capacity doubled when full)."""
        if len(rows) and self.data_count[rows].max() >= self.data_x.shape[1]:
            capacity = max(64, 2 * self.data_x.shape[1])
            n, d = self.data_x.shape[0], self.spec.dim
            grown_x, grown_y = np.zeros((n, capacity, d)), np.zeros((n, capacity))
            grown_x[:, : self.data_x.shape[1]] = self.data_x
            grown_y[:, : self.data_y.shape[1]] = self.data_y
            self.data_x, self.data_y = grown_x, grown_y
        slot = self.data_count[rows]
        self.data_x[rows, slot] = x
        self.data_y[rows, slot] = y
        self.data_count[rows] += 1

    def _ons_step(self, rows: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
        """One online Newton step of each of the ``rows`` on its new sample (x, y)."""
        if len(rows) == 0:
            return
        p, c = self.params, self.c_mu
        z = (x * self.theta_ons[rows]).sum(axis=1)
        self.target[rows] += z[:, None] * x
        self.sum_z2[rows] += z * z
        inverse = self.inverse[rows]
        tmp = np.einsum("nde,ne->nd", inverse, x)
        inverse = (
            inverse - tmp[:, :, None] * tmp[:, None, :] / (1 + (x * tmp).sum(axis=1))[:, None, None]
        )
        self.inverse[rows] = inverse
        grad = link_mean(self.link, z) - y
        direction = np.einsum("nde,ne->nd", inverse, x)
        candidate = self.theta_ons[rows] - (grad / c)[:, None] * direction
        if p.projection != "none":
            metric = self.gram[rows] + self.shift * np.eye(self.spec.dim)
            if p.projection == "ball":
                candidate = project_to_ball(candidate, metric, p.theta_bound)
            else:
                candidate = project_to_simplex(candidate, metric)
        self.theta_ons[rows] = candidate
        self.theta_ridge[rows] = np.einsum("nde,ne->nd", inverse, self.target[rows])
        self.bound_b2[rows] += 0.5 / c * grad * grad * (x * direction).sum(axis=1)
        if self.alone_code:
            self.beta_local[rows] = alone_beta(self.bound_b2[rows], c, p.reward_bound, p.delta)
            return
        self.beta_local[rows] = local_beta(
            self.bound_b2[rows], c, p.reward_bound, self.spec.num_clients, p.delta
        )

    # --- the global update --------------------------------------------------------------------

    def _collect(self, message: Message) -> Message:
        """The requested clients upload dA and n_buf since their last sync and empty their
        buffers. Every per-client field has a unit axis and is sent only where ``member`` (the
        request) is set (in paper mode every client)."""
        member = np.asarray(message.fields["request"], dtype=bool)[:, None]
        fields = {
            "gram_delta": np.where(member[..., None, None], self.buffer_gram[:, None], 0.0),
            "count_delta": np.where(member, self.buffer_count[:, None], 0),
            "member": member,
        }
        self.buffer_gram[member[:, 0]] = 0.0
        self.buffer_count[member[:, 0]] = 0
        return self._reply("upload", message, fields)

    def _reply(self, kind: str, message: Message, fields: dict[str, np.ndarray]) -> Message:
        """A reply whose fields travel only for the clients in its (known) ``member`` mask."""
        sparse = {name: "member" for name in fields if name != "member"}
        return Message(
            kind,
            message.round,
            message.client_ids,
            fields,
            sparse=sparse,
            known=frozenset({"member"}),
            meta=self._meta(),
        )

    def _evaluate(self, message: Message) -> Message:
        """``gradient``: sum_i (mu(x_i^T x) - y_i) x_i over each client's data; ``finish``:
        sum_i (x_i^T x)^2; both summed in sample order (``client_sums``), for the clients in
        the message's ``member`` mask."""
        point = message.fields["point"][:, 0]
        member = np.asarray(message.fields["member"], dtype=bool)
        used = int(self.data_count.max(initial=0))
        data_x, data_y = self.data_x[:, :used], self.data_y[:, :used]
        if message.kind == "finish":
            z = sample_dots(data_x, point, self.data_count)
            sumsq = np.where(member, client_sums(z[:, :, None], z, self.data_count), 0.0)
            return self._reply("sumsq", message, {"sumsq": sumsq, "member": member})
        gradient = client_gradients(data_x, data_y, point, self.data_count, self.link)
        gradient = np.where(member, gradient, 0.0)[:, None]
        return self._reply("gradient", message, {"gradient": gradient, "member": member})

    def _meta(self) -> dict[str, np.ndarray]:
        """The pulls so far (a measurement: where the exchange stands on the regret curve)."""
        return {"pulls": self.env.pulls.copy()}

    def _download(self, message: Message) -> None:
        """A = A_g - lambda/c_mu I, b = A x, A_inv = A_g^-1, theta_ridge = A_inv b,
        theta_ONS = x, and the global confidence parts (``updateParameters``)."""
        rows = np.flatnonzero(message.fields["receive"][:, 0])
        if len(rows) == 0:
            return
        gram_g = message.fields["gram"][rows, 0]
        point = message.fields["center"][rows, 0]
        bound_b2, beta_global, sum_z2 = message.fields["confidence"][rows, 0].T
        own = gram_g - self.shift * np.eye(self.spec.dim)
        self.gram[rows] = own
        self.target[rows] = np.einsum("nde,ne->nd", own, point)
        self.inverse[rows] = np.linalg.inv(gram_g)
        self.theta_ridge[rows] = np.einsum("nde,ne->nd", self.inverse[rows], self.target[rows])
        self.theta_ons[rows] = point
        self.bound_b2[rows] = bound_b2
        self.beta_local[rows] = bound_b2
        self.beta_global[rows] = beta_global
        self.sum_z2[rows] = sum_z2

    def quiet(self, reply: Message) -> bool:
        """No trigger: the server's next message is an empty round."""
        return reply.kind == "trigger" and not reply.fields["trigger"].any()

    def steps_left(self) -> int:
        return int(self.env.horizon - self.env.round)


class FedGLBServer(ServerLogic):
    """Keeps A_g (lambda/c_mu I + every uploaded dA), n and the last global x; runs a global update
    (collect, AGD exchanges, finish) after any round with a trigger, and sends its result with the
    next round."""

    def __init__(self, spec: ProblemSpec, params: FedGLBParams) -> None:
        self.spec, self.params = spec, params
        d = spec.dim
        self.c_mu = params.c_mu or link_slope(model_link(params, spec), params.theta_bound)
        self.gram = params.regularization / self.c_mu * np.eye(d)
        self.count = 0
        self.point = np.zeros(d)  # the last global x
        self.clients = spec.client_ids.copy()
        self.authors_code = params.fidelity == "authors_code"
        #: authors_code: the clients that have pulled (their ``joined`` flags), by client id
        self.registered = np.zeros(spec.num_clients, dtype=bool)
        self.rounds_done = 0
        self.exchange = 0
        self.stage = "rounds"  # or "collect", "gradient", "finish"
        self.download: np.ndarray | None = None  # (B2, beta_global, sum_z2) to send
        # the AGD in progress
        self.iterate = np.zeros(d)
        self.previous = np.zeros(d)
        self.momentum = (0.0, 1.0, 1.0)
        self.step_size = 0.0
        self.iterations = 0
        self.max_iterations = 0
        self.gradient_sum = np.zeros(d)
        #: measurements for the seed's report
        self.global_updates = 0
        self.agd_iterations = 0
        #: The authors' ``totalCommCost`` (``report``): the clients in the federation other than
        #: the triggering ones at the trigger, the gradient exchanges of the update in progress,
        #: and the client the authors' code created last (the paper mode: the last client id).
        self.authors_comm = 0
        self.others = 0
        self.members = 0
        self.gradients = 0
        self.triggered_last = False
        self.last_created = -1 if self.authors_code else int(spec.client_ids[-1])

    def configure(self) -> Message | None:
        ids = self.clients
        n = len(ids)
        self.exchange += 1
        # The clients in the federation: every client (paper), or those that have pulled
        # (authors_code: the code's ``self.clients``, filled by ``decide``).
        member = (self.registered[ids] if self.authors_code else np.ones(n, dtype=bool))[:, None]
        if self.stage == "collect":
            fields = {"request": member[:, 0].copy()}
            return Message("collect", self.exchange - 1, ids, fields, sparse={"request": "request"})
        if self.stage in ("gradient", "finish"):
            fields = {"point": broadcast(self.iterate[None], n), "member": member}
            return Message(
                self.stage,
                self.exchange - 1,
                ids,
                fields,
                sparse={"point": "member"},
                known=frozenset({"member"}),
            )
        if self.rounds_done >= self.spec.horizon:
            return None
        self.rounds_done += 1
        if self.download is None:
            return Message("round", self.exchange - 1, ids, {})
        fields = {
            "gram": broadcast(self.gram[None], n),
            "center": broadcast(self.point[None], n),
            "confidence": broadcast(self.download[None], n),
            "receive": member,
        }
        self.download = None
        sparse = {"gram": "receive", "center": "receive", "confidence": "receive"}
        return Message(
            "round", self.exchange - 1, ids, fields, sparse=sparse, known=frozenset({"receive"})
        )

    def bookkeeping_fields(self) -> frozenset[str]:
        """The clients' trigger flags, the server's collect request and (authors_code) the
        clients' joined flags: no statistics."""
        return frozenset({"trigger", "request", "joined"})

    def aggregate(self, reply: Message) -> None:
        if reply.round != self.exchange - 1:
            raise RuntimeError(f"reply for exchange {reply.round}, expected {self.exchange - 1}")
        if reply.kind == "trigger":
            if "joined" in reply.fields:
                joined = np.asarray(reply.fields["joined"], dtype=bool)
                self.registered[reply.client_ids[joined]] = True
                if joined.any():  # several in one round: in client-id order (ours)
                    self.last_created = int(reply.client_ids[joined][-1])
            trigger = np.asarray(reply.fields["trigger"], dtype=bool)
            if trigger.any():
                self.stage = "collect"
                ids = self.clients
                members = self.registered[ids] if self.authors_code else np.ones(len(ids), bool)
                self.members = int(np.count_nonzero(members))
                self.others = int(
                    np.count_nonzero(members & ~np.isin(ids, reply.client_ids[trigger]))
                )
                self.triggered_last = self.last_created in reply.client_ids[trigger]
        elif reply.kind == "upload":
            self._start(reply)
        elif reply.kind == "gradient":
            self._descend(reply.fields["gradient"].sum(axis=0)[0])
        elif reply.kind == "sumsq":
            self._finish(float(reply.fields["sumsq"].sum(axis=0)[0]))
        else:
            raise RuntimeError(f"unexpected reply kind {reply.kind!r}")

    def _start(self, reply: Message) -> None:
        """Fold the uploads into A_g and n; the AGD starts at 0 (or the last x)."""
        self.gram = self.gram + reply.fields["gram_delta"].sum(axis=0)[0]
        self.count += int(reply.fields["count_delta"].sum(axis=0)[0])
        start = self.point if self.params.warm_start else np.zeros(self.spec.dim)
        self.iterate, self.previous = start.copy(), start.copy()
        self.momentum = (0.0, 1.0, 1.0)
        self.step_size = 0.1 / (0.25 + self.params.regularization / self.count)
        self.iterations = 0
        self.max_iterations = self.params.max_iterations or 2 * self.count
        self.stage = "gradient"
        self.global_updates += 1
        d = self.spec.dim
        self.authors_comm += (d * d + 1) * self.others
        self.gradients = 0

    def _descend(self, data_gradient: np.ndarray) -> None:
        """grad f(x) = (sum of the clients' gradients + lambda x) / n; stop when ||grad f|| <=
        sqrt(2 lambda / n^3) or after ``max_iterations`` steps, else one ``agd_step``."""
        lam, n = self.params.regularization, self.count
        self.gradient_sum = data_gradient + lam * self.iterate
        gradient = self.gradient_sum / n
        self.agd_iterations += 1
        self.gradients += 1
        if np.linalg.norm(gradient) <= math.sqrt(2 * lam / n**3):
            self.stage = "finish"
            return
        self.iterate, self.previous, self.momentum = agd_step(
            self.iterate, self.previous, gradient, self.step_size, self.momentum
        )
        self.iterations += 1
        if self.iterations >= self.max_iterations:
            self.stage = "finish"

    def _finish(self, sum_z2: float) -> None:
        """The confidence parts at the final x; every client downloads with the next round."""
        b2, beta = global_confidence(
            self.gradient_sum, self.gram, self.iterate, self.count, self.params, self.c_mu
        )
        self.point = self.iterate.copy()
        self.download = np.array([b2, beta, sum_z2])
        self.stage = "rounds"
        d = self.spec.dim
        self.authors_comm += 2 * d * self.others * (self.gradients - 1)
        if not self.triggered_last:
            self.authors_comm += (d * d + d + 1) * self.members

    def report(self) -> dict[str, Any]:
        """How many global updates ran and how many AGD gradient exchanges they took, and the
        authors' ``totalCommCost`` (``authors_comm_cost``; ``cyrilli/FedGLB-UCB``,
        ``lib/FedGLB_UCB.py``, ``updateParameters``), per global update with m clients in the
        federation (every client in the paper mode, those that have pulled with
        ``authors_code``), one of them triggering and k gradient exchanges:
        (d^2 + 1)(m - 1) for the collect, 2 d (m - 1)(k - 1) for the AGD (the code multiplies by
        ``iter``, the loop's last index: one less than the gradients asked for, whether the loop
        stopped on the gradient's norm or at its cap), and (d^2 + d + 1) m for the download,
        except when the triggering client is the one the code created last: the download loop
        tests ``clientID``, a variable its collect loop left at the last client created, so it
        counts every client or none. Counted when the update is decided, one after the last
        round included. Several triggering clients in one round (ours: one update): m - 1 is
        the clients that did not trigger. ``ons_glm`` (the code's ``N_ONS_GLM``) counts 0."""
        return {
            "global_updates": self.global_updates,
            "agd_iterations": self.agd_iterations,
            "authors_comm_cost": self.authors_comm_cost(),
            "authors_comm_cost_rule": "cyrilli/FedGLB-UCB lib/FedGLB_UCB.py: (d^2 + 1)(m - 1) "
            "per collect, 2 d (m - 1)(AGD gradients - 1), (d^2 + d + 1) m per download unless "
            "the trigger came from the client created last; m the clients in the federation"
            if not isinstance(self.params, OnsGLMParams)
            else "cyrilli/FedGLB-UCB: 0 without global updates (lib/N_ONS_GLM.py never syncs)",
        }

    def authors_comm_cost(self) -> int:
        """The authors' ``totalCommCost`` so far, by the rule of ``report`` (0 for ``ons_glm``)."""
        return self.authors_comm


def _fedglb_client(spec: ProblemSpec, params: FedGLBParams, env: Any, sync: bool) -> FedGLBClient:
    return FedGLBClient(spec, params, environment_of(env, ContextualEnvironment), sync)


def glm_bytes_per_client(problem: ProblemSpec) -> float:
    """A client's data (x, y for every pull, capacity up to twice the pulls) and its d x d
    matrices, on top of the contextual environment's chunk."""
    pulls = 2 * problem.horizon
    return contextual_bytes_per_client(problem) + 8.0 * (
        pulls * (problem.dim + 1) + 4 * problem.dim**2
    )


#: Declared in ``pyproject.toml`` under ``fedbandit.algorithms``.
FEDGLB_UCB: AlgorithmSpec[Any] = AlgorithmSpec(
    name="fedglb_ucb",
    description="FedGLB-UCB: local ONS, log-det trigger, global AGD (Li & Wang 2022)",
    params=FedGLBParams,
    make_server=lambda spec, p: FedGLBServer(spec, p),
    make_client=lambda spec, p, env: _fedglb_client(spec, p, env, sync=True),
    needs_shared_parameter=True,
    contextual=True,
    needs_reward_link=True,
    memory_per_client=glm_bytes_per_client,
    citation=citations.FEDGLB_UCB,
)
ONS_GLM: AlgorithmSpec[Any] = AlgorithmSpec(
    name="ons_glm",
    description="ONS-GLM-UCB alone per client: FedGLB-UCB's local rule, never syncing",
    params=OnsGLMParams,
    make_server=lambda spec, p: FedGLBServer(spec, p),
    make_client=lambda spec, p, env: _fedglb_client(spec, p, env, sync=False),
    needs_shared_parameter=True,
    contextual=True,
    needs_reward_link=True,
    memory_per_client=glm_bytes_per_client,
    # the N-ONS-GLM baseline of the FedGLB-UCB paper; ONS for GLM bandits: Jun et al. 2017
    citation=citations.FEDGLB_UCB + "\n\n" + citations.ONS_GLM,
)
