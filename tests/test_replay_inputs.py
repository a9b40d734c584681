"""What the replay's readers accept and how they refuse (issue 49, item 5): a byte-order mark (as
spreadsheet programs save CSV) is skipped, a comma-separated pool is refused with the hint that
pool items are separated by spaces, and a Parquet file is refused in one line saying the formats
accepted and how to convert it. The other text readers skip a byte-order mark too."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_errors import one_line_error

from fedbandit.datasets import movielens
from fedbandit.datasets.replay import AUTHORS_HEADER, ReplayParams, build_replay
from fedbandit.datasets.tables import load_table
from fedbandit.errors import DataError

BOM = "\ufeff"
FEATURES_CSV = "item,f1,f2\na,1,0\nb,0,1\nc,1,1\n"
EVENTS_CSV = "user,time,pool,chosen\nu1,1,a b c,b\nu2,2,c a b,a\nu1,3,b c a,c\n"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def csv_replay(folder: Path, events: str, features: str = FEATURES_CSV):
    """The replay instance of CSV ``events`` and ``features`` written in ``folder``."""
    write(folder / "features.csv", features)
    file = write(folder / "events.csv", events)
    return build_replay(ReplayParams(path=str(file), features="features.csv", shuffle_pools=False))


def test_a_byte_order_mark_is_skipped_in_csv_events_and_features(tmp_path):
    plain = csv_replay(tmp_path / "plain", EVENTS_CSV)
    marked = csv_replay(tmp_path / "bom", BOM + EVENTS_CSV, BOM + FEATURES_CSV)
    assert marked.users == plain.users == ("u1", "u2")
    assert marked.item_ids == plain.item_ids
    assert (marked.features == plain.features).all() and (marked.chosen == plain.chosen).all()


def test_a_byte_order_mark_is_skipped_in_the_authors_format(tmp_path):
    write(tmp_path / "Arm_FeatureVectors_2.dat", BOM + "ArticleID\tFeatureVector\n1\t0;1\n2\t1;0\n")
    write(tmp_path / "events.dat", BOM + f"{AUTHORS_HEADER}\n7\t10\t[2, 1]\n")
    instance = build_replay(ReplayParams(path=str(tmp_path)))
    assert instance.users == ("7",) and set(instance.item_ids) == {"1", "2"}


def test_a_comma_separated_pool_gets_the_hint_that_items_are_space_separated(tmp_path):
    with pytest.raises(DataError) as err:
        csv_replay(tmp_path, 'user,time,pool,chosen\nu1,1,"a,b,c",b\n')
    message = str(err.value)
    assert "line 2: the chosen item 'b' is not in the pool" in message
    assert "pool items are separated by spaces, not commas" in message
    assert "write the pool as 'a b c'" in message
    with pytest.raises(DataError, match=r"item a, has no feature vector .*not commas"):
        csv_replay(tmp_path, 'user,time,pool,chosen\nu1,1,"a, b, c",c\n')


def test_a_space_separated_pool_missing_its_choice_gets_no_comma_hint(tmp_path):
    with pytest.raises(DataError) as err:
        csv_replay(tmp_path, "user,time,pool,chosen\nu1,1,a b,c\n")
    assert str(err.value).endswith("the chosen item 'c' is not in the pool")


@pytest.mark.parametrize("name", ["events.parquet", "events.csv"])
def test_a_parquet_event_file_is_refused_with_the_formats_and_how_to_convert(tmp_path, name):
    """By its name, or by its first bytes (``PAR1``) whatever its name."""
    write(tmp_path / "features.csv", FEATURES_CSV)
    events = tmp_path / name
    events.write_bytes(b"PAR1\x15\x04\x15\x00" + bytes(range(200)))
    with pytest.raises(DataError) as err:
        build_replay(ReplayParams(path=str(events), features="features.csv"))
    message = str(err.value)
    assert message.startswith(f"{events}: a Parquet file, which fedbandit does not read")
    assert "CSV (header user,time,pool,chosen; pool items separated by spaces)" in message
    assert f"pandas.read_parquet('{events}').to_csv('events.csv', index=False)" in message


def test_the_command_line_refuses_a_parquet_event_file_in_one_line(tmp_path):
    write(tmp_path / "features.csv", FEATURES_CSV)
    events = tmp_path / "events.parquet"
    events.write_bytes(b"PAR1" + bytes(64))
    toml = write(
        tmp_path / "p.toml",
        'horizon = 3\nseeds = 1\nalgorithms = ["oful"]\n[instance]\nkind = "replay"\n'
        f'path = "{events}"\nfeatures = "features.csv"\n',
    )
    line = one_line_error("run", str(toml), "--out", str(tmp_path / "out"), "--quiet")
    assert "a Parquet file, which fedbandit does not read" in line and "read_parquet" in line
    assert not (tmp_path / "out").exists()


def test_a_table_csv_with_a_byte_order_mark_names_its_first_column(tmp_path):
    table = write(tmp_path / "t.csv", BOM + "label,x\n0,1.5\n1,2.5\n")
    data = load_table(table, label="label")
    assert data.feature_names == ["x"] and data.labels.tolist() == ["0", "1"]


def test_movielens_ratings_with_a_byte_order_mark_are_read(tmp_path):
    users, items, ratings, _ = movielens.generate_ratings(20, 30, 400, seed=0, min_per_user=10)
    (tmp_path / "plain").mkdir(), (tmp_path / "bom").mkdir()
    plain = movielens.write_u_data(tmp_path / "plain" / "u.data", users, items, ratings)
    marked = tmp_path / "bom" / "u.data"
    marked.write_bytes(BOM.encode() + plain.read_bytes())
    ours, theirs = movielens.read_ratings(marked), movielens.read_ratings(plain)
    assert (ours.ratings == theirs.ratings).all()
