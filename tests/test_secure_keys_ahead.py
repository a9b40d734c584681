"""Issue 39, cost: SecAgg+'s key set-up and key sharing of Fed-PE's summed exploration run ahead,
while the elimination before it is out (``PreparedKeys``; deployments only, where a SuperNode
answers one message at a time). On ``NodesGrid`` (fedbandit's real ClientApp and Flower's SecAgg+
mod, in this process), with the runtime's ``prepare_keys`` on as in a deployment."""

from __future__ import annotations

import numpy as np
import pytest
from test_secure_aggregation import _stage, flower_identity, secure_run  # noqa: F401 (a fixture)

from fedbandit.config import load_experiment
from fedbandit.flower.secure_aggregation import SLOT_STATE_PREFIX
from fedbandit.registry import build_instance
from fedbandit.runspec import RunSpec
from fedbandit.simulation import simulate


def local_regret(experiment: str, algorithm: str, overrides: tuple[str, ...] = ()) -> np.ndarray:
    config = load_experiment(experiment, list(overrides))
    return simulate(
        build_instance(config.instance),
        algorithm,
        config.horizon,
        RunSpec(experiment=config, algorithm=algorithm, seed=0).entropy,
        config.hyperparameters(algorithm),
    ).regret.increment_diff


def stage_counts(grid) -> dict[str, int]:
    """How many messages of each SecAgg+ stage the nodes answered."""
    counts: dict[str, int] = {}
    for _, message, _ in grid.replies:
        stage = _stage(message)
        if stage is not None:
            counts[stage] = counts.get(stage, 0) + 1
    return counts


#: Servers that announce their secure exchanges (``ServerLogic.secure_follows``); the last two
#: are private FedLinUCB's batch uploads, declared with noise and counted without.
ANNOUNCING = [
    ("fedpe_tiny", "fedpe", (), False),
    ("fedpe_shared_tiny", "fedpe_shared", (), False),
    ("fed_private", "private_fedlinucb", ("horizon=200",), False),
    ("fed_private", "batched_fedlinucb", ("horizon=200",), True),
]


@pytest.mark.parametrize(("experiment", "algorithm", "overrides", "counted"), ANNOUNCING)
def test_keys_set_up_ahead_serve_every_summed_round_with_the_same_results(
    experiment, algorithm, overrides, counted
):
    """Every secure exchange goes on from keys set up while the exchanges before it were out:
    its first SecAgg+ run (the count when one runs) skips the key stages, one key set-up per
    run and node (none wasted), the regret of a local run, and the masked-vector stage still
    carries nothing in the clear but the unsummed fields."""
    outcome, seen, grid, runtime = secure_run(
        experiment, algorithm, overrides=overrides, prepare_keys=True
    )
    assert outcome.status == "complete", outcome.failure
    np.testing.assert_array_equal(
        outcome.regret.increment_diff, local_regret(experiment, algorithm, overrides)
    )
    exchanges = runtime.secure_report["exchanges"]
    assert exchanges > 0 and runtime.secure_report["keys_set_up_ahead"] == exchanges
    count_exchanges = runtime.session.report()["count_exchanges"]
    assert count_exchanges == (exchanges if counted else 0)
    runs = exchanges + count_exchanges
    counts = stage_counts(grid)
    nodes = len(runtime.ranges)
    assert counts == {
        stage: runs * nodes for stage in ("setup", "share_keys", "collect_masked_vectors", "unmask")
    }
    summed = [r for r in seen if r.summed]
    assert len(summed) == exchanges
    assert all(r.fields[name].shape[0] == 1 for r in summed for name in r.summed)
    # each node keeps the SecAgg+ state of the newest two runs only
    for context in grid.contexts.values():
        slots = [k for k in context.state.config_records if k.startswith(SLOT_STATE_PREFIX)]
        assert 1 <= len(slots) <= 2


@pytest.mark.parametrize("stage", ["setup", "share_keys"])
def test_a_node_lost_while_keys_are_set_up_ahead_is_lost_as_in_a_plain_run(stage):
    """Node 103 goes silent at its third message of a key stage run ahead (the third summed
    exploration's keys), while the elimination is out too: whichever of the two it missed
    first (the elimination, round 5, or the exploration, round 6), the run goes on without it
    (``drop``) exactly as a plaintext run losing it in that round, and the summed rounds after
    it use keys set up ahead with the survivors."""
    secure, seen, _, runtime = secure_run(
        "fedpe_tiny", "fedpe", policy="drop", prepare_keys=True, silent_at_stage={103: (stage, 3)}
    )
    assert secure.status == "complete", secure.failure
    assert sorted(secure.dropped) == [15, 16, 17, 18, 19]  # node 103's clients
    (round_,) = set(secure.dropped.values())
    plain, _, _, _ = secure_run(
        "fedpe_tiny", "fedpe", secure=False, policy="drop", silent_from={103: round_}
    )
    assert plain.dropped == secure.dropped
    np.testing.assert_array_equal(secure.regret.increment_diff, plain.regret.increment_diff)
    assert "node 103 (clients 15-19): no reply" in secure.failure
    later = [r for r in seen if r.summed and r.round > round_]
    assert later and 15 not in np.concatenate([r.client_ids for r in later])
    # only the exchange whose keys included the lost node set up its own
    report = runtime.secure_report
    assert report["keys_set_up_ahead"] == report["exchanges"] - 1


def test_a_node_lost_in_the_masked_stage_is_left_out_of_the_next_keys():
    """Node 103 goes silent in the masked-vector stage of the third summed exploration: that
    exchange unmasks the three others' sum, the next exploration's keys are set up with the
    nodes asked to unmask (no key set-up message reaches the lost node after its third), and
    every exploration still goes on from keys set up ahead; the run equals a plaintext run
    losing the node in that round."""
    secure, seen, grid, runtime = secure_run(
        "fedpe_tiny",
        "fedpe",
        policy="drop",
        prepare_keys=True,
        silent_at_stage={103: ("collect_masked_vectors", 3)},
    )
    assert secure.status == "complete", secure.failure
    (round_,) = set(secure.dropped.values())
    survivors = next(reply for reply in seen if reply.round == round_)
    assert survivors.summed and survivors.client_ids.tolist() == list(range(15))
    plain, _, _, _ = secure_run(
        "fedpe_tiny", "fedpe", secure=False, policy="drop", silent_from={103: round_}
    )
    assert plain.dropped == secure.dropped
    np.testing.assert_array_equal(secure.regret.increment_diff, plain.regret.increment_diff)
    report = runtime.secure_report
    assert report["keys_set_up_ahead"] == report["exchanges"] and report["lost_nodes"] == 1
    assert [node for node, stage in grid.pushed if stage == "setup"].count(103) == 3
