"""Communication in the authors' units as a series: the ``authors_comm_cost`` column of
``seed_K.comm.csv`` (the authors' ``totalCommCost``, cumulative, after each exchange), its
reading back, and the communication plot in those units (``--comm-units authors``)."""

import json

import numpy as np
import pandas as pd
import pytest

import fedbandit
from fedbandit.cli import main
from fedbandit.errors import ConfigError, DataError
from fedbandit.federation.messages import Message
from fedbandit.federation.runtime import CommunicationLedger

CONTEXTUAL = {
    "kind": "contextual", "setting": "shared", "contexts": "gaussian", "num_clients": 4,
    "num_arms": 5, "dim": 3, "noise_sigma": 0.5, "seed": 0,
}  # fmt: skip
GLM = {
    "kind": "glm_contextual", "link": "logistic", "setting": "shared", "contexts": "points",
    "num_points": 100, "num_clients": 4, "num_arms": 10, "dim": 4, "theta_norm": 1.0,
    "noise_sigma": 0.5, "seed": 0,
}  # fmt: skip
OWN_COLUMNS = "round,kind,direction,t,messages,scalars,bytes,bookkeeping_scalars"

#: Per algorithm at seed 1: the instance, the horizon and the values the cumulative count takes
#: (each sync, push or global update adds to it), the last being the seed's total.
EXPECTED = {
    "dislinucb": (CONTEXTUAL, 60, [0, 104, 208, 312, 416, 520, 624, 728]),
    "async_linucb": (CONTEXTUAL, 60, [8, 12, 17, 21, 26, 30, 34, 38, 42, 46, 50, 54]),
    "fedglb_ucb": (GLM, 80, [0, 34, 454, 471, 727, 744, 1048, 1082, 1706, 1740, 2480]),
}


def _increments(frame: pd.DataFrame) -> pd.Series:
    """What each row adds to the cumulative count (the first row: its value)."""
    counts = frame["authors_comm_cost"]
    return counts.diff().fillna(counts.iloc[0]).astype(int)


@pytest.mark.parametrize("algorithm", sorted(EXPECTED))
def test_the_authors_series_ends_at_the_seeds_total(algorithm):
    instance, horizon, values = EXPECTED[algorithm]
    result = fedbandit.simulate(instance, algorithm, horizon, seed=1)
    frame = result.communication
    assert ",".join(frame.columns) == OWN_COLUMNS + ",authors_comm_cost"
    counts = frame["authors_comm_cost"]
    assert counts.is_monotonic_increasing and sorted(set(counts)) == values
    assert counts.iloc[-1] == result.report["authors_comm_cost"] == values[-1]
    # both rows of an exchange (down, up) carry the count after the server took its replies
    assert (frame.groupby("round")["authors_comm_cost"].nunique() == 1).all()


def test_ons_glm_counts_zero_and_sends_nothing():
    result = fedbandit.simulate(GLM, "ons_glm", 80, seed=1)
    assert result.report["authors_comm_cost"] == 0
    assert ",".join(result.communication.columns) == OWN_COLUMNS + ",authors_comm_cost"
    assert result.communication.empty


def test_dislinucb_adds_a_sync_where_it_is_decided():
    """2 (d^2 + d + 1) M per sync (paper mode: every client), in the collect's exchange."""
    frame = fedbandit.simulate(CONTEXTUAL, "dislinucb", 60, seed=1).communication
    steps = _increments(frame)
    grown = frame[steps > 0]
    assert set(grown["kind"]) == {"collect"} and len(grown) == 7
    assert set(steps[steps > 0]) == {2 * (3 * 3 + 3 + 1) * 4}
    assert len(grown) == (frame["kind"] == "collect").sum()  # every sync, at its collect


def test_async_linucb_counts_each_upload_and_the_pushes_it_decides():
    """1 per upload of the exchange and 1 per push it decides (sent with the next round)."""
    frame = fedbandit.simulate(CONTEXTUAL, "async_linucb", 60, seed=1).communication
    count = frame.groupby("round")["authors_comm_cost"].max()
    uploads = frame[frame.direction == "uplink"].set_index("round")["messages"]
    pushes = frame[frame.direction == "downlink"].set_index("round")["messages"]
    before = 0
    for round_ in count.index[:-1]:
        expected = uploads.get(round_, 0) + pushes.get(round_ + 1, 0)
        assert count[round_] - before == expected, round_
        before = count[round_]
    assert pushes.sum() > 10 and uploads.sum() > 10  # both terms are exercised


def test_fedglb_ucb_counts_collect_agd_and_download_when_they_are_decided():
    """Collect: (d^2 + 1)(m - 1); finish: 2 d (m - 1)(k - 1) for k gradient exchanges, plus
    (d^2 + d + 1) m unless the trigger came from the client created last (m = 4, d = 4)."""
    frame = fedbandit.simulate(GLM, "fedglb_ucb", 80, seed=1).communication
    steps = _increments(frame)
    grown = frame[steps > 0]
    assert set(grown["kind"]) == {"collect", "finish"} and len(grown) == 10
    gradient = (frame["kind"] == "gradient") & (frame["direction"] == "downlink")
    others, start, downloads = 0, 0, 0
    for index, row in grown.iterrows():
        added = int(steps[index])
        if row["kind"] == "collect":
            assert added % 17 == 0
            others, start = added // 17, index
        else:
            k = int(gradient[start:index].sum())
            assert k > 1
            download = added - 2 * 4 * others * (k - 1)
            assert download in (0, 21 * 4), (index, added, others, k)
            downloads += download > 0
    assert downloads > 0


def test_the_ledger_puts_a_count_on_the_rows_of_its_exchange_or_the_next():
    ledger = CommunicationLedger(authors=True)
    ids = np.arange(2)

    def exchange(round_, data):
        down = Message("round", round_, ids, {"x": np.ones((2, 1))} if data else {})
        reply = Message("step", round_, ids, {"y": np.ones((2, 1))} if data else {},
                        meta={"pulls": np.array([round_ + 1] * 2)})  # fmt: skip
        ledger.record_exchange(down, reply)

    exchange(0, 1)
    ledger.count_authors(5)
    exchange(1, 0)  # nothing carried: no row, its count shows on the next row
    ledger.count_authors(7)
    exchange(2, 1)
    ledger.count_authors(7)
    exchange(3, 0)
    ledger.count_authors(9)  # after the last row: the run's total goes on the last row
    frame = ledger.frame()
    assert frame["round"].tolist() == [0, 0, 2, 2]
    assert frame["authors_comm_cost"].tolist() == [5, 5, 7, 9]
    assert "authors_comm_cost" not in CommunicationLedger().frame().columns


OVERRIDES = {
    "horizon": 80, "seeds": 2,
    "algorithms": ["dislinucb", "fedlinucb", "oful", "async_linucb"],
}  # fmt: skip


@pytest.fixture(scope="module")
def contextual_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("authors") / "run"
    fedbandit.run("contextual_tiny", overrides=OVERRIDES, out=out, progress=False, workers=1)
    return out


def test_other_algorithms_write_the_columns_they_always_wrote(contextual_run):
    for algorithm in ("fedlinucb", "oful"):
        text = (contextual_run / "runs" / algorithm / "seed_0.comm.csv").read_text()
        assert text.splitlines()[0] == OWN_COLUMNS
    text = (contextual_run / "runs" / "dislinucb" / "seed_0.comm.csv").read_text()
    assert text.splitlines()[0] == OWN_COLUMNS + ",authors_comm_cost"


def test_the_plot_in_authors_units_draws_the_counted_algorithms_and_names_the_others(
    contextual_run,
):
    from matplotlib.figure import Figure

    results = fedbandit.load_results(contextual_run)
    ax = Figure().gca()
    assert results.plot_communication(ax=ax, units="authors") is ax
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["dislinucb", "async_linucb"]
    for line, algorithm in zip(ax.get_lines(), labels, strict=True):
        seed = pd.read_csv(contextual_run / "runs" / algorithm / "seed_0.comm.csv")
        counted = seed[seed["authors_comm_cost"] > 0]
        assert line.get_ydata().tolist() == counted["authors_comm_cost"].tolist()
        assert line.get_xdata().tolist() == counted["t"].tolist()
        report = json.loads((contextual_run / "runs" / algorithm / "seed_0.json").read_text())
        assert line.get_ydata()[-1] == report["report"]["authors_comm_cost"]
    notes = [text.get_text() for text in ax.texts]
    assert notes == ["no authors' count: fedlinucb\nno communication: oful"]
    assert "authors' units" in ax.get_ylabel()
    default = Figure().gca()
    results.plot_communication(ax=default)  # fedbandit's units: unchanged, every direction
    assert [line.get_label() for line in default.get_lines()] == [
        f"{a} {d}"
        for a in ("dislinucb", "fedlinucb", "async_linucb")
        for d in ("uplink", "downlink")
    ]
    with pytest.raises(ConfigError, match="must be one of fedbandit, authors, got 'scalars'"):
        results.plot_communication(units="scalars")


def test_plot_comm_units_authors_writes_its_own_file(contextual_run, capsys):
    assert main(["plot", "--comm-units", "authors", str(contextual_run)]) == 0
    printed = capsys.readouterr().out.split()
    assert str(contextual_run / "plots" / "communication_authors.png") in printed
    assert str(contextual_run / "plots" / "communication.png") not in printed
    assert (contextual_run / "plots" / "communication_authors.png").stat().st_size > 10_000


def test_files_from_before_the_column_are_read_and_a_falling_column_is_refused(
    contextual_run, tmp_path
):
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(contextual_run, folder)
    old = folder / "runs" / "async_linucb" / "seed_0.comm.csv"
    frame = pd.read_csv(old)
    frame.drop(columns="authors_comm_cost").to_csv(old, index=False)  # as written before
    results = fedbandit.load_results(folder)
    assert pd.api.types.is_numeric_dtype(results.communication["authors_comm_cost"])
    async_rows = results.communication[results.communication.algorithm == "async_linucb"]
    assert async_rows[async_rows.seed == 0]["authors_comm_cost"].isna().all()
    assert async_rows[async_rows.seed == 1]["authors_comm_cost"].notna().all()
    falling = frame.assign(authors_comm_cost=frame["authors_comm_cost"][::-1].to_numpy())
    falling.to_csv(old, index=False)
    with pytest.raises(DataError, match=r"seed_0.comm.csv: the authors_comm_cost column falls"):
        fedbandit.load_results(folder)
    frame.assign(authors_comm_cost="many").to_csv(old, index=False)
    with pytest.raises(DataError, match="non-numeric values in authors_comm_cost"):
        fedbandit.load_results(folder)


def test_authors_units_without_any_counting_algorithm_is_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    overrides = {"horizon": 40, "seeds": 1, "algorithms": ["fedlinucb", "oful"]}
    fedbandit.run("contextual_tiny", overrides=overrides, out=out, progress=False, workers=1)
    capsys.readouterr()
    assert main(["plot", "--comm-units", "authors", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedbandit: error: ")
    assert f"{out}: no algorithm of this run (fedlinucb, oful) counts communication" in lines[0]
    assert not (out / "plots" / "communication_authors.png").exists()
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text("{}")
    assert main(["plot", "--comm-units", "authors", str(sweep)]) == 2
    assert "--comm-units applies to a results folder" in capsys.readouterr().err


def test_the_command_offers_the_plotting_units():
    from fedbandit import plotting
    from fedbandit.cli import plot

    assert plot.COMM_UNITS == plotting.COMM_UNITS
