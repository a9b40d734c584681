"""Issue 39, item 2: no sum is unmasked over fewer than k contributing clients (default 3).

Whole runs through Flower's SecAgg+ workflow and mod with fedbandit's real ClientApp on in-memory
nodes (``test_secure_aggregation.NodesGrid``: the real secure-sum path without Ray or processes).
Contributors are counted here independently of the count the server runs: every masked reply a
node builds is recorded (``apps.secure_reply`` wrapped), and per exchange and per block (the index
after the client axis of a summed field) a node contributes when any of its clients' values there
is not zero. The plaintext run of the same seed shows the leak the rule closes: DisLinUCB syncs in
the sequential order where one client alone has new data (its sum is that client's statistics).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from test_secure_aggregation import flower_identity, secure_run  # noqa: F401 (a fixture)

from fedbandit.algorithms.phased_elimination import PhasedEliminationServer
from fedbandit.algorithms.private_linucb import BatchedLinUCBServer
from fedbandit.flower import apps
from fedbandit.flower.secure_aggregation import MIN_CONTRIBUTORS, _blocks

#: The sequential order (one client acts per step): 5 clients on 4 nodes, T = 400.
SEQUENTIAL = ("fed_contextual_published_tiny", "dislinucb")


@pytest.fixture
def masked(monkeypatch):
    """Every masked reply built on a node: (round, client ids, per summed field the (clients,
    blocks) flags of non-zero values)."""
    calls: list[tuple[int, tuple[int, ...], dict[str, np.ndarray]]] = []
    original = apps.secure_reply

    def recording(reply, summed, seconds):
        names = sorted(summed & set(reply.fields))
        filled = {name: _blocks(reply.fields[name]) for name in names}
        calls.append((reply.round, tuple(reply.client_ids.tolist()), filled))
        return original(reply, summed, seconds)

    monkeypatch.setattr(apps, "secure_reply", recording)
    return calls


def contributors(calls) -> list[tuple[int, str, int, int, int]]:
    """(round, field, block, contributing nodes, contributing clients) of every non-empty block
    of every secure sum."""
    by_round: dict[int, list[dict[str, np.ndarray]]] = defaultdict(list)
    for round_, _, filled in calls:
        by_round[round_].append(filled)
    found = []
    for round_, nodes in sorted(by_round.items()):
        for name in nodes[0]:
            per_node = np.array([node[name].any(axis=0) for node in nodes])  # (nodes, blocks)
            clients = np.sum([node[name].sum(axis=0) for node in nodes], axis=0)
            for block in np.flatnonzero(per_node.any(axis=0)):
                found.append(
                    (round_, name, int(block), int(per_node[:, block].sum()), int(clients[block]))
                )
    return found


def senders(seen) -> list[int]:
    """Per sync (DisLinUCB's upload replies, plaintext): how many clients sent statistics."""
    return [int(np.asarray(r.fields["send"]).any(axis=1).sum()) for r in seen if r.kind == "upload"]


def test_a_lone_sender_is_held_back_until_three_clients_contribute(masked):
    """DisLinUCB in the sequential order: in plaintext some syncs carry one client's statistics
    alone. Under secure aggregation (k = 3, 4 nodes) every block unmasked holds 3 or more
    contributing clients; the others' statistics wait for a later sync (held), the run
    completes, and no clear flag names the senders (``send`` is all True in a secure reply)."""
    _, plain, _, _ = secure_run(*SEQUENTIAL, secure=False)
    # the leak: syncs whose sum holds fewer than 3 clients' statistics (2 here; 1 with 20 clients)
    assert min(senders(plain)) < MIN_CONTRIBUTORS
    outcome, seen, _, runtime = secure_run(*SEQUENTIAL)
    assert outcome.status == "complete"
    found = contributors(masked)
    assert found and min(clients for *_, clients in found) == MIN_CONTRIBUTORS
    report = runtime.session.report()
    assert report["held_blocks"] > 0 and report["fewest_contributing_clients"] >= MIN_CONTRIBUTORS
    uploads = [r for r in seen if r.kind == "upload"]
    assert uploads and all(r.summed and np.asarray(r.fields["send"]).all() for r in uploads)


@pytest.mark.slow
@pytest.mark.parametrize("k", [2])
def test_k_is_configurable(masked, k):
    outcome, _, _, runtime = secure_run(*SEQUENTIAL, min_contributors=k)
    assert outcome.status == "complete"
    assert min(clients for *_, clients in contributors(masked)) >= k
    assert runtime.session.report()["fewest_contributing_clients"] >= k


SUPPORTED = [
    ("contextual_tiny", "dislinucb", []),
    ("fedpe_tiny", "fedpe", []),
    ("fedpe_shared_tiny", "fedpe_shared", []),
    ("fed_private_pe", "private_fedpe", []),
    ("fed_heterogeneous_tiny", "hlinucb", ["instance.heterogeneity=0.05"]),
    ("fed_private", "batched_fedlinucb", ["horizon=500"]),
    ("fed_private", "private_fedlinucb", ["horizon=500"]),
]


@pytest.mark.slow
@pytest.mark.parametrize(("experiment", "algorithm", "overrides"), SUPPORTED)
def test_every_supported_algorithm_unmasks_no_sum_below_k(masked, experiment, algorithm, overrides):
    """Whole runs of every supported algorithm under the default k = 3 on 4 nodes: every block
    of every sum unmasked has 3 or more contributing clients; an algorithm that cannot hold
    contributions back is refused before anything is unmasked (its seed stops)."""
    outcome, _, _, runtime = secure_run(experiment, algorithm, overrides=overrides)
    found = contributors(masked)
    report = runtime.session.report()
    print(algorithm, outcome.status, report, outcome.failure)
    assert outcome.status == "complete" or "refused" in outcome.failure, outcome.failure
    assert found
    assert min(clients for *_, clients in found) >= MIN_CONTRIBUTORS, outcome.failure


#: Algorithms whose server declares the contributors (``ServerLogic.secure_contributors``).
DECLARING = [
    ("fedpe_tiny", "fedpe", ()),
    ("fedpe_shared_tiny", "fedpe_shared", ()),
    ("fed_private_pe", "private_fedpe", ()),
    ("fed_private", "private_fedlinucb", ("horizon=200",)),
]


@pytest.fixture
def declared(monkeypatch):
    """Every declaration of the contributors: (round, client ids, per field (clients, blocks))."""
    calls: list[tuple[int, tuple[int, ...], dict[str, np.ndarray]]] = []
    for server in (PhasedEliminationServer, BatchedLinUCBServer):
        original = server.secure_contributors

        def recording(self, message, original=original):
            masks = original(self, message)
            if masks is not None:
                calls.append((message.round, tuple(message.client_ids.tolist()), masks))
            return masks

        monkeypatch.setattr(server, "secure_contributors", recording)
    return calls


@pytest.mark.parametrize(("experiment", "algorithm", "overrides"), DECLARING)
def test_declared_contributors_are_exactly_the_blocks_the_clients_fill(
    masked, declared, experiment, algorithm, overrides
):
    """The server knows from its own request which client fills which block: Fed-PE's design
    fixes every pull (within each client's horizon), private FedLinUCB's noise fills every block
    of every silo. No count exchange runs, and the declared flags equal, client by client, the
    non-zero blocks of the values the nodes sum."""
    outcome, _, _, runtime = secure_run(experiment, algorithm, overrides=overrides)
    assert outcome.status == "complete", outcome.failure
    report = runtime.session.report()
    assert report["count_exchanges"] == 0
    assert report["declared_exchanges"] == len(declared) == runtime.secure_report["exchanges"] > 0
    filled: dict[tuple[int, int], dict[str, np.ndarray]] = {}
    for round_, clients, fields in masked:
        for row, client in enumerate(clients):
            filled[round_, client] = {name: flags[row] for name, flags in fields.items()}
    compared = 0
    for round_, clients, fields in declared:
        for row, client in enumerate(clients):
            for name, flags in fields.items():
                np.testing.assert_array_equal(flags[row], filled[round_, client][name])
                compared += 1
    assert compared == sum(len(clients) * len(fields) for _, clients, fields in declared)
    assert report["fewest_contributing_clients"] >= MIN_CONTRIBUTORS


@pytest.mark.parametrize(
    ("flip", "found"),
    [(True, "filled but not declared"), (False, "declared but left empty")],
)
def test_a_node_refuses_to_send_values_that_do_not_match_the_declaration(
    monkeypatch, masked, flip, found
):
    """A wrong server: its declaration leaves out a block that client 0 fills (``flip`` True),
    or gives client 0 a block it does not fill. The node serving client 0 refuses to send (its
    error names the field, the blocks and why, and it is lost), so no sum holds that client's
    values uncounted, nor counts it without its values."""
    original = PhasedEliminationServer.secure_contributors

    wrong_rounds = []

    def wrong(self, message):
        masks = original(self, message)
        if masks is not None:
            flags = masks["weighted_estimate"].copy()
            candidates = np.flatnonzero(flags[0] == flip)
            if candidates.size:
                flags[0, candidates[0]] = not flip
                wrong_rounds.append(message.round)
            masks = {"weighted_estimate": flags}
        return masks

    monkeypatch.setattr(PhasedEliminationServer, "secure_contributors", wrong)
    outcome, _, _, _ = secure_run("fedpe_tiny", "fedpe")
    assert outcome.status != "complete"
    assert "do not match the contributors the server declared" in outcome.failure
    assert "weighted_estimate: blocks [" in outcome.failure and found in outcome.failure
    assert wrong_rounds and f"round {wrong_rounds[0]}: lost clients 0-4" in outcome.failure
    assert not [c for r, c, _ in masked if r == wrong_rounds[0] and 0 in c]
