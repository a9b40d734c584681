"""FedGLB-UCB and ons_glm with ``fidelity = "authors_code"`` against the authors' code, which
creates its clients as they arrive.

The transcriptions below follow ``cyrilli/FedGLB-UCB`` (``lib/FedGLB_UCB.py`` and
``lib/N_ONS_GLM.py``) line by line in plain loops: the server's ``self.clients`` dict is filled by
``decide``, so a client that has not pulled yet is not collected from, not asked for gradients and
not synced, and joins with empty statistics (its first pull usually triggers a global update).
They replay our recorded streams (actor, contexts, reward of every global step) in the authors'
order (``round_robin``: ``for iter_: for uid in range(n_users)``) and in one random client per
step. The one borrowed piece is the declared deviation: the ONS projection onto the ball
(``project_to_ball``) instead of the code's cvxopt projection onto the simplex.

The instance uses the authors' arms (``bias_coordinate`` and ``basis_points``: a pool of unit
vectors in d - 1 coordinates with a constant 1 appended, the basis in front)."""

from __future__ import annotations

import numpy as np
import pytest
from step_recorder import record_steps

from fedbandit.algorithms.glm_ucb import project_to_ball, sync_threshold
from fedbandit.contextual.instances import GLMContextualParams, glm_contextual_instance
from fedbandit.federation.runtime import InProcessRuntime, run_federation
from fedbandit.simulation import build_federation, simulate

M, K, D_DIM, ROUNDS = 6, 8, 5, 25
HORIZON = M * ROUNDS
LAM, S, R, DELTA, SCALE = 2.0, 1.0, 0.5, 0.01, 0.1  # RunSyntheticDataset.py


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


C_MU = _sigmoid(1.0) * (1 - _sigmoid(1.0))  # dsigmoid(S)


def _instance(arrival: str = "round_robin", seed: int = 3, authors_arms: bool = True):
    return glm_contextual_instance(
        GLMContextualParams(
            setting="shared",
            contexts="points",
            num_points=60,
            num_clients=M,
            num_arms=K,
            dim=D_DIM,
            arrival=arrival,
            theta_norm=1.0,
            bias_coordinate=authors_arms,
            basis_points=authors_arms,
            seed=seed,
        )
    )


def _run_ours(algorithm: str, params: dict, arrival: str = "round_robin", seed: int = 3):
    """Our run, recorded: per global step the actor, contexts, arm and reward; the steps after
    which a global update ran, the AGD gradient exchanges of each, and the ledger's totals."""
    instance = _instance(arrival, seed)
    server, groups = build_federation(instance, algorithm, HORIZON, [seed, 0], params)
    steps = record_steps(groups)
    runtime = InProcessRuntime(groups)
    syncs: list[int] = []
    iterations: list[int] = []

    class Recording:
        def exchange(self, message):
            if message.kind == "collect":
                syncs.append(groups[0].env.round - 1)
                iterations.append(0)
            if message.kind == "gradient":
                iterations[-1] += 1
            return runtime.exchange(message)

        def __getattr__(self, name):
            return getattr(runtime, name)

    result = run_federation(server, Recording())
    assert sorted(steps) == list(range(HORIZON))
    arms = [steps[s]["arm"] for s in range(HORIZON)]
    return steps, {"arms": arms, "syncs": syncs, "iterations": iterations}, result


class _LocalClient:
    """``FedGLB_UCB.py``'s ``LocalClient.__init__``: empty statistics."""

    def __init__(self, d):
        self.A = np.zeros((d, d))
        self.b = np.zeros(d)
        self.X = np.zeros((0, d))
        self.y = np.zeros((0,))
        self.A_uploadbuffer = np.zeros((d, d))
        self.numObs_uploadbuffer = 0
        self.AInv = C_MU / LAM * np.identity(d)
        self.ThetaONS = np.zeros(d)
        self.ThetaRidge = np.zeros(d)
        self.loss_diff_bound_B2 = 0.5 * C_MU * LAM * S**2
        self.beta_t_global_part = 0
        self.beta_t_local_part = 0
        self.sum_z_sqr = 0

    def local_update_ons_step(self, x, click, n_users):
        """``localUpdate_ONSStep``."""
        d = len(x)
        z = x.dot(self.ThetaONS)
        self.b += z * x
        self.sum_z_sqr += z**2
        tmp = self.AInv.dot(x)
        self.AInv -= np.outer(tmp, tmp) / (1 + x.dot(tmp))
        grad = -click + _sigmoid(z)
        theta_prime = self.ThetaONS - grad / C_MU * self.AInv.dot(x)
        metric = self.A + LAM / C_MU * np.identity(d)
        self.ThetaONS = project_to_ball(theta_prime[None], metric[None], S)[0]  # (declared)
        self.ThetaRidge = np.dot(self.AInv, self.b)
        self.loss_diff_bound_B2 += (0.5 / C_MU) * np.dot(grad * x, np.dot(self.AInv, grad * x))
        B2 = self.loss_diff_bound_B2
        self.beta_t_local_part = (
            1
            + 4 * B2 / C_MU
            + 8
            * R**2
            / C_MU**2
            * np.log(
                n_users / DELTA * np.sqrt(4 + 8 * B2 / C_MU + 64 * R**4 / (C_MU**4 * 4 * DELTA**2))
            )
        )

    def sync_round_triggered(self, threshold):
        """``syncRoundTriggered``."""
        shift = LAM / C_MU * np.identity(self.A.shape[0])
        numerator = np.linalg.det(self.A + shift)
        denominator = np.linalg.det(self.A - self.A_uploadbuffer + shift)
        return np.log(numerator / denominator) * self.numObs_uploadbuffer >= threshold


def _authors_fedglb_ucb(steps, threshold, join="first_pull"):
    """``FedGLB_UCB`` (``decide`` / ``updateParameters``) with the synthetic script's constants
    (``init_x`` = 0, ``max_iters`` None: 2 n). ``join``: ``first_pull`` (the code: ``decide``
    creates the client) or ``up_front`` (every client created before the first step, the
    paper's federation). Returns the arms, the steps with a global update, the AGD gradient
    evaluations of each, and what our messages carry for it (the clients in the federation J,
    so that communication can be counted as ours counts it)."""
    d, n_users = D_DIM, M
    clients: dict[int, _LocalClient] = {}
    if join == "up_front":
        clients = {uid: _LocalClient(d) for uid in range(n_users)}
    A_g = LAM / C_MU * np.identity(d)
    numObs_g = 0
    out = {"arms": [], "syncs": [], "iterations": [], "members": []}
    for s in range(HORIZON):
        uid = steps[s]["actor"]
        arm_matrix = steps[s]["contexts"]
        # decide
        if uid not in clients:
            clients[uid] = _LocalClient(d)
        me = clients[uid]
        ucbs = np.sqrt((np.matmul(arm_matrix, me.AInv) * arm_matrix).sum(axis=1))
        alpha_t = SCALE * np.sqrt(
            LAM / C_MU * S**2
            + me.beta_t_local_part
            + me.beta_t_global_part
            - me.sum_z_sqr
            + np.dot(me.ThetaRidge, me.b)
        )
        mu = np.matmul(arm_matrix, me.ThetaRidge) + alpha_t * ucbs
        arm = int(np.flatnonzero(mu == mu.max())[0])  # the code: at random among equal values
        out["arms"].append(arm)
        x, click = arm_matrix[arm], steps[s]["reward"]
        # updateParameters
        me.numObs_uploadbuffer += 1
        me.A += np.outer(x, x)
        me.A_uploadbuffer += np.outer(x, x)
        me.X = np.concatenate((me.X, x.reshape(1, d)), axis=0)
        me.y = np.concatenate((me.y, np.array([click])), axis=0)
        if not me.sync_round_triggered(threshold):
            me.local_update_ons_step(x, click, n_users)
            continue
        out["syncs"].append(s)
        out["members"].append(len(clients))
        for clientModel in clients.values():
            A_g += clientModel.A_uploadbuffer
            numObs_g += clientModel.numObs_uploadbuffer
            clientModel.A_uploadbuffer = np.zeros((d, d))
            clientModel.numObs_uploadbuffer = 0
        x_agd = np.zeros(d)  # init_x
        lambda_prev, lambda_curr, gamma, y_prev = 0, 1, 1, x_agd
        step_size = 1 / (0.25 + LAM / numObs_g) * 0.1
        done = 0
        for _ in range(numObs_g * 2):
            gradient = np.zeros(d)
            for clientModel in clients.values():
                z = np.dot(clientModel.X, x_agd)
                gradient += np.dot(np.transpose(clientModel.X), -clientModel.y + _sigmoid(z))
            gradient += LAM * x_agd
            gradient = gradient / numObs_g
            done += 1
            if np.linalg.norm(gradient) <= np.sqrt((2 * LAM) / numObs_g**3):
                break
            y_curr = x_agd - step_size * gradient
            x_agd = (1 - gamma) * y_curr + gamma * y_prev
            y_prev = y_curr
            lambda_tmp = lambda_curr
            lambda_curr = (1 + np.sqrt(1 + 4 * lambda_prev * lambda_prev)) / 2
            lambda_prev = lambda_tmp
            gamma = (1 - lambda_prev) / lambda_curr
        out["iterations"].append(done)
        B1 = LAM * 0.5 + 1.0 / numObs_g
        width_ons = (
            1 / C_MU * np.sqrt(np.dot(np.dot(gradient * numObs_g, A_g), gradient * numObs_g))
            + R
            / C_MU
            * np.sqrt(d * np.log(1 + numObs_g * C_MU / (d * LAM)) + 2 * np.log(1 / DELTA))
            + np.sqrt(LAM / C_MU) * S
        )
        B2 = 0.5 / C_MU * width_ons**2
        log_det = np.log(1 / DELTA) + d / 2 * np.log(1 + (1 + numObs_g) / d)
        beta_global = (
            8 * R**2 / C_MU**2 * log_det
            + B1
            + 4 * R / C_MU * np.sqrt(2 * log_det) * (np.linalg.norm(x_agd) + S + np.sqrt(B1))
        )
        sum_z_sqr_global = 0.0
        for clientModel in clients.values():
            z_per_client = np.dot(clientModel.X, x_agd)
            sum_z_sqr_global += np.dot(z_per_client, z_per_client)
        shift = LAM / C_MU * np.identity(d)
        b_g = np.dot(A_g - shift, x_agd)
        AInv_g = np.linalg.inv(A_g)
        for clientModel in clients.values():  # only the clients that have pulled
            clientModel.A = A_g - shift
            clientModel.b = b_g.copy()
            clientModel.AInv = AInv_g.copy()
            clientModel.ThetaRidge = np.dot(AInv_g, b_g)
            clientModel.ThetaONS = x_agd.copy()
            clientModel.loss_diff_bound_B2 = B2
            clientModel.beta_t_global_part = beta_global
            clientModel.beta_t_local_part = B2
            clientModel.sum_z_sqr = sum_z_sqr_global
    return out


def _communication(code: dict, joined: int) -> tuple[int, int]:
    """(uplink, downlink) scalars of the code's run counted as our messages count them, J the
    clients in the federation at an update and g its gradient evaluations: up J (d^2 + 1)
    (uploads), g J d (gradients), J (sums of squares), 1 trigger bit and, once a client, 1 joined
    flag; down J (collect requests), g J d (points), J d (finish), J (d^2 + d + 3) (the result,
    with the next step: none after the last step)."""
    d = D_DIM
    up, down = joined, 0
    for step, members, g in zip(code["syncs"], code["members"], code["iterations"], strict=True):
        up += members * (d * d + 1) + g * members * d + members + 1
        down += members + g * members * d + members * d
        if step < HORIZON - 1:
            down += members * (d * d + d + 3)
    return up, down


def _threshold() -> float:
    return sync_threshold(ROUNDS, M, D_DIM)


@pytest.mark.parametrize("arrival", ["round_robin", "sequential"])
def test_authors_code_makes_the_codes_decisions_global_updates_and_communication(arrival):
    steps, ours, result = _run_ours("fedglb_ucb", {"fidelity": "authors_code"}, arrival)
    code = _authors_fedglb_ucb(steps, _threshold(), "first_pull")
    assert ours["arms"] == code["arms"]
    assert ours["syncs"] == code["syncs"]
    assert ours["iterations"] == code["iterations"]
    assert result.report["global_updates"] == len(code["syncs"])
    joined = len({steps[s]["actor"] for s in range(HORIZON)})
    up, down = _communication(code, joined)
    totals = result.ledger.totals()
    assert (totals["uplink_scalars"], totals["downlink_scalars"]) == (up, down)
    # the joining rule is visible: some updates ran before every client had pulled, and a
    # client's first pull triggered one
    assert min(code["members"]) < M
    first_pulls = {min(s for s in range(HORIZON) if steps[s]["actor"] == c) for c in range(M)}
    assert first_pulls & set(code["syncs"])


def test_the_comparison_fails_on_the_paper_rule():
    """Our paper mode is the code with every client created up front, and differs from the
    code as it creates clients (the authors' order)."""
    steps, ours, _ = _run_ours("fedglb_ucb", {})
    up_front = _authors_fedglb_ucb(steps, _threshold(), "up_front")
    assert (ours["arms"], ours["syncs"], ours["iterations"]) == (
        up_front["arms"],
        up_front["syncs"],
        up_front["iterations"],
    )
    first_pull = _authors_fedglb_ucb(steps, _threshold(), "first_pull")
    assert (ours["arms"], ours["syncs"]) != (first_pull["arms"], first_pull["syncs"])


def test_authors_code_in_synchronous_rounds_is_the_paper_rule_when_everyone_acts():
    """Every client pulls in the first round, so all are in the federation before the first
    global update: the two modes are the same run (participation 1); the joined flags are the
    only extra messages (M scalars of bookkeeping)."""
    instance = _instance("synchronous")
    paper = simulate(instance, "fedglb_ucb", 20, [2, 2])
    authors = simulate(instance, "fedglb_ucb", 20, [2, 2], params={"fidelity": "authors_code"})
    np.testing.assert_array_equal(paper.regret.client_regret, authors.regret.client_regret)
    assert paper.report == authors.report and paper.report["global_updates"] >= 2
    extra = (
        authors.totals["uplink_bookkeeping_scalars"] - paper.totals["uplink_bookkeeping_scalars"]
    )
    assert extra == M


def test_authors_code_with_partial_participation_leaves_absent_clients_out():
    """In synchronous rounds with participation < 1 a client that has not acted receives no
    global update; grouping does not change the run."""
    instance = glm_contextual_instance(
        GLMContextualParams(
            setting="shared",
            contexts="points",
            num_points=60,
            num_clients=8,
            num_arms=K,
            dim=D_DIM,
            participation=0.15,
            bias_coordinate=True,
            basis_points=True,
            seed=4,
        )
    )
    params = {"fidelity": "authors_code"}
    runs = [simulate(instance, "fedglb_ucb", 30, [1, 5], params, group_size=g) for g in (None, 3)]
    np.testing.assert_array_equal(runs[0].regret.client_regret, runs[1].regret.client_regret)
    assert runs[0].totals == runs[1].totals
    paper = simulate(instance, "fedglb_ucb", 30, [1, 5])
    # the paper's federation sends every update to all 8 clients, the code's to those that acted
    assert runs[0].totals["downlink_scalars"] < paper.totals["downlink_scalars"]


# --- ons_glm: the code's N_ONS_GLM -------------------------------------------------------------


def _authors_n_ons_glm(steps):
    """``N_ONS_GLM`` (``LocalClient``, ``decide``, ``updateParameters``), alpha_t_scaling 0.1."""
    d = D_DIM
    clients: dict[int, dict] = {}

    def alpha(c):
        return np.sqrt(
            LAM * S**2
            + 1
            + 4 / C_MU * c["Bt"]
            + (8 * R**2)
            / C_MU**2
            * np.log(
                2 / DELTA * np.sqrt(1 + 2 / C_MU * c["Bt"] + (4 * R**4) / (C_MU**4 * DELTA**2))
            )
            + np.dot(c["ThetaRidge"], c["b"])
            - c["sum_z_sqr"]
        )

    arms = []
    for s in range(HORIZON):
        uid = steps[s]["actor"]
        if uid not in clients:
            c = {
                "A": np.zeros((d, d)),
                "b": np.zeros(d),
                "AInv": 1 / LAM * np.identity(d),
                "ThetaRidge": np.zeros(d),
                "ThetaONS": np.zeros(d),
                "Bt": 2 * C_MU * LAM * S**2,
                "sum_z_sqr": 0.0,
            }
            c["alpha_t"] = alpha(c)
            clients[uid] = c
        c = clients[uid]
        arm_matrix = steps[s]["contexts"]
        ucbs = np.sqrt((np.matmul(arm_matrix, c["AInv"]) * arm_matrix).sum(axis=1))
        mu = np.matmul(arm_matrix, c["ThetaRidge"]) + c["alpha_t"] * SCALE * ucbs
        arm = int(np.flatnonzero(mu == mu.max())[0])
        arms.append(arm)
        x, click = arm_matrix[arm], steps[s]["reward"]
        c["A"] += np.outer(x, x)
        z = x.dot(c["ThetaONS"])
        c["b"] += z * x
        c["sum_z_sqr"] += z**2
        tmp = c["AInv"].dot(x)
        c["AInv"] -= np.outer(tmp, tmp) / (1 + x.dot(tmp))
        grad = -click + _sigmoid(np.dot(x, c["ThetaONS"]))
        theta_prime = c["ThetaONS"] - grad / C_MU * c["AInv"].dot(x)
        metric = c["A"] + LAM / C_MU * np.identity(d)
        c["ThetaONS"] = project_to_ball(theta_prime[None], metric[None], S)[0]  # (declared)
        c["ThetaRidge"] = np.dot(c["AInv"], c["b"])
        c["Bt"] += 1 / (2 * C_MU) * (grad**2) * np.dot(np.dot(x, c["AInv"]), x)
        c["alpha_t"] = alpha(c)
    return arms


def test_ons_glm_authors_code_is_the_codes_n_ons_glm():
    steps, ours, result = _run_ours("ons_glm", {"fidelity": "authors_code"}, "sequential")
    assert ours["arms"] == _authors_n_ons_glm(steps)
    assert result.ledger.totals()["uplink_scalars"] == 0
    paper_steps, paper, _ = _run_ours("ons_glm", {}, "sequential")
    assert paper["arms"] != _authors_n_ons_glm(paper_steps)


# --- seed-averaged ------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_authors_setting_makes_a_third_more_global_updates_than_fed_glms():
    """Issue 38's comparison, N = 20, T = 150 rounds, d = 10, K = 25 in the authors' order: the
    code's setting (authors_code, the authors' arms) against ours before it (the paper rule on
    fed_glm's unit-norm arms), 1.3x the global updates or more over 2 seeds (measured 92 against
    62.5). Most of it is the arms (norm sqrt 2: a pull grows log det by more); on the same
    arms the two rules differ by 0-26% (docs/algorithms/glm.md)."""
    n, rounds = 20, 150
    updates = {"authors": 0, "paper": 0}
    for seed in range(2):
        for label, authors in (("authors", True), ("paper", False)):
            instance = glm_contextual_instance(
                GLMContextualParams(
                    setting="shared",
                    contexts="points",
                    num_points=1000,
                    num_clients=n,
                    num_arms=25,
                    dim=10,
                    arrival="round_robin",
                    bias_coordinate=authors,
                    basis_points=authors,
                    seed=seed,
                )
            )
            params = {"fidelity": "authors_code" if authors else "paper"}
            result = simulate(instance, "fedglb_ucb", n * rounds, [seed, 1], params)
            updates[label] += result.report["global_updates"]
    assert updates["authors"] >= 1.3 * updates["paper"]
