"""Real-data instances: MovieLens-100K pipeline, bundled scikit-learn sets, user tables.

No real MovieLens file is available offline: the MovieLens tests use generated files in the exact
``u.data`` format (ratings from a known low-rank model).
"""

import gzip
import json
import multiprocessing
import re
import socket
import time

import numpy as np
import pytest
from scipy.stats import pearsonr

import fedbandit.datasets.common as common
import fedbandit.datasets.movielens as ml
from fedbandit.cli import main
from fedbandit.config import available_experiments, load_experiment
from fedbandit.datasets import (
    DatasetError,
    MissingDataError,
    MovieLensParams,
    SklearnParams,
    TableParams,
    build_movielens,
    build_sklearn,
    build_table,
    load_table,
)
from fedbandit.datasets.tables import bundled_dataset, classification_instance, fit_thetas
from fedbandit.errors import DataError, FedbanditError
from fedbandit.registry import build_instance
from fedbandit.runner import run_experiment
from fedbandit.simulation import simulate

# ---------------------------------------------------------------- MovieLens: generated files


def write_movielens(folder, num_users=60, num_items=80, num_ratings=1500, seed=0, info=False):
    folder.mkdir(parents=True, exist_ok=True)
    users, items, ratings, _ = ml.generate_ratings(
        num_users, num_items, num_ratings, seed=seed, min_per_user=10
    )
    ml.write_u_data(folder / "u.data", users, items, ratings)
    if info:
        (folder / "u.info").write_text(
            f"{num_users} users\n{num_items} items\n{num_ratings} ratings\n"
        )
    return folder, users, items


@pytest.fixture(scope="module")
def movielens_dir(tmp_path_factory):
    return write_movielens(tmp_path_factory.mktemp("ml") / "ml-100k")


def small_params(folder, **changes):
    values = dict(path=str(folder), num_clients=20, num_arms=5, dim=3, cache_dir="")
    return MovieLensParams(**{**values, **changes})


def test_movielens_pipeline_shapes_and_facts(movielens_dir):
    folder, users, items = movielens_dir
    instance = build_movielens(small_params(folder))
    assert instance.features.shape == (20, 5, 3) and instance.thetas.shape == (5, 3)
    assert not instance.shared_parameter and instance.name == "movielens100k"
    # x_{i,a} = W_i for every arm; NMF factors are non-negative.
    assert np.array_equal(instance.features, np.repeat(instance.features[:, :1], 5, axis=1))
    assert np.all(instance.features >= 0) and np.all(instance.thetas >= 0)
    info = instance.summary()
    assert info["num_users"] == users.max() and info["num_items"] == items.max()
    assert info["num_ratings"] == 1500 and info["source"].endswith("u.data")
    assert info["clients"] == "users 1..20" and sum(info["best_arm_counts"]) == 20
    json.dumps(info)  # goes into manifest.json
    # the file itself works as well as its folder
    same = build_movielens(small_params(folder / "u.data"))
    assert np.array_equal(same.features, instance.features)


def test_movielens_is_deterministic_per_seed(movielens_dir):
    folder = movielens_dir[0]
    one, two = (build_movielens(small_params(folder, seed=3)) for _ in range(2))
    assert np.array_equal(one.features, two.features) and np.array_equal(one.thetas, two.thetas)
    other = build_movielens(small_params(folder, seed=4))
    assert not np.allclose(other.features, one.features)


def reference_knn(R, mask, k):
    """Loop-by-loop user-based kNN with means (Surprise's KNNWithMeans), for checking."""
    n_users, n_items = R.shape
    means = np.array([R[u, mask[u]].mean() for u in range(n_users)])
    sim = np.zeros((n_users, n_users))
    for u in range(n_users):
        for v in range(n_users):
            common_items = mask[u] & mask[v]
            x, y = R[u, common_items], R[v, common_items]
            if common_items.sum() >= 2 and x.std() > 0 and y.std() > 0:
                sim[u, v] = pearsonr(x, y)[0]
    out = R.copy()
    for u in range(n_users):
        for i in range(n_items):
            if mask[u, i]:
                continue
            raters = [v for v in np.flatnonzero(mask[:, i]) if v != u]
            top = sorted(raters, key=lambda v: -sim[u, v])[:k]
            top = [v for v in top if sim[u, v] > 0]
            weight = sum(sim[u, v] for v in top)
            shift = sum(sim[u, v] * (R[v, i] - means[v]) for v in top) / weight if top else 0.0
            out[u, i] = np.clip(means[u] + shift, 1, 5)
    return out


def test_completion_matches_a_loop_reference():
    rng = np.random.default_rng(5)
    R = rng.integers(1, 6, size=(25, 18)).astype(float)
    mask = rng.random(R.shape) < 0.5
    mask[:, 0] = True  # every user has a rating
    R = np.where(mask, R, 0.0)
    # continuous similarities: no ties between neighbours, so the top-k sets are unambiguous
    R = np.where(mask, R + rng.uniform(-0.3, 0.3, R.shape), 0.0).clip(1, 5) * mask
    fast = ml.complete_ratings(R, mask, neighbours=4)
    np.testing.assert_allclose(fast, reference_knn(R, mask, 4), atol=1e-10)
    sim = ml.pearson_similarity(R, mask)
    both = mask[0] & mask[1]
    assert sim[0, 1] == pytest.approx(pearsonr(R[0, both], R[1, both])[0], abs=1e-12)


def test_completion_error_on_held_out_ratings():
    """Low-rank truth + noise (sigma 0.5, rounded to 1..5), 10% of ratings hidden: the completion's
    RMSE on them is <= 0.85 and <= 0.8 x that of predicting the global mean (measured: 0.73 vs
    1.08; the noise alone gives about 0.55)."""
    users, items, ratings, _ = ml.generate_ratings(300, 200, 15000, noise=0.5, seed=3)
    hidden = np.random.default_rng(0).random(len(users)) < 0.1
    R = np.zeros((300, 200))
    mask = np.zeros((300, 200), dtype=bool)
    R[users[~hidden] - 1, items[~hidden] - 1] = ratings[~hidden]
    mask[users[~hidden] - 1, items[~hidden] - 1] = True
    completed = ml.complete_ratings(R, mask, neighbours=10)
    assert np.array_equal(completed[mask], R[mask])
    assert completed.min() >= 1 and completed.max() <= 5
    truth = ratings[hidden]
    rmse = np.sqrt(np.mean((completed[users[hidden] - 1, items[hidden] - 1] - truth) ** 2))
    baseline = np.sqrt(np.mean((R[mask].mean() - truth) ** 2))
    assert rmse <= 0.85 and rmse <= 0.8 * baseline, (rmse, baseline)


def test_cache_hit_is_identical_fast_and_keyed_by_content(tmp_path, monkeypatch):
    folder = write_movielens(tmp_path / "ml-100k")[0]
    cache = tmp_path / "cache"
    params = small_params(folder, cache_dir=str(cache))
    first = build_movielens(params)
    assert len(list(cache.glob("*.npz"))) == 1 and not list(cache.glob("*.tmp"))

    def no_preprocessing(*args, **kwargs):
        raise AssertionError("a cache hit must not preprocess")

    with monkeypatch.context() as patch:
        patch.setattr(ml, "preprocess", no_preprocessing)
        start = time.perf_counter()
        again = build_movielens(params)
        assert time.perf_counter() - start < 1.0
        # M and sigma are not preprocessing parameters: still a hit
        fewer = build_movielens(small_params(folder, cache_dir=str(cache), num_clients=7))
    assert np.array_equal(again.features, first.features)
    assert np.array_equal(again.thetas, first.thetas) and again.info == first.info
    assert np.array_equal(fewer.features, first.features[:7])
    # changing one rating changes the file's hash, hence the key
    lines = (folder / "u.data").read_text().splitlines(keepends=True)
    fields = lines[0].split("\t")
    fields[2] = "1" if fields[2] != "1" else "2"
    lines[0] = "\t".join(fields)
    (folder / "u.data").write_text("".join(lines))
    changed = build_movielens(params)
    assert len(list(cache.glob("*.npz"))) == 2
    assert changed.info["data_sha256"] != first.info["data_sha256"]
    # other preprocessing parameters are part of the key too
    build_movielens(small_params(folder, cache_dir=str(cache), dim=2))
    assert len(list(cache.glob("*.npz"))) == 3


def test_unreadable_cache_entry_is_recomputed(tmp_path):
    folder = write_movielens(tmp_path / "ml-100k")[0]
    params = small_params(folder, cache_dir=str(tmp_path / "cache"))
    first = build_movielens(params)
    (entry,) = (tmp_path / "cache").glob("*.npz")
    entry.write_bytes(b"not an npz")
    again = build_movielens(params)
    assert np.array_equal(again.features, first.features)
    assert entry.read_bytes()[:2] == b"PK"  # rewritten


GOOD = "1\t1\t3\t881250949\n2\t1\t4\t881250950\n"

BAD_FILES = [
    (GOOD + "3\t1\t4\n", 3, "expected 4 tab-separated fields"),
    (GOOD + "3\t1\t4\t88125", 3, None),  # fine: the last line may lack its newline
    (GOOD + "3\t1", 3, "found 2.*truncated"),
    (GOOD + "3\t1\tfive\t881250951\n", 3, "rating 'five' is not a number"),
    (GOOD + "3\t1\t6\t881250951\n", 3, "rating 6 is outside 1..5"),
    (GOOD + "3\t1\t0.5\t881250951\n", 3, "rating 0.5 is outside 1..5"),
    ("u1\t1\t3\t881250949\n" + GOOD, 1, "user id 'u1' is not an integer"),
    (GOOD + "0\t1\t3\t881250949\n", 3, "user id 0 is out of range"),
    (GOOD + "3\t-2\t3\t881250949\n", 3, "item id -2 is out of range"),
    (GOOD + "3\t2\t3\tnoon\n", 3, "timestamp 'noon' is not an integer"),
    (GOOD + "\n3\t2\t3\t881250949\n", 3, "expected 4 tab-separated fields"),
    (GOOD + "1\t1\t5\t881250999\n", 3, "user 1 rates item 1 a second time .first at line 1"),
    ("", None, "no ratings"),
]


@pytest.mark.parametrize(("text", "line", "problem"), BAD_FILES)
def test_bad_u_data_names_file_and_line(tmp_path, text, line, problem):
    file = tmp_path / "u.data"
    file.write_text(text)
    if problem is None:
        assert len(ml.read_ratings(file).ratings) == line
        return
    where = re.escape(f"{file}, line {line}: " if line else f"{file}: ")
    with pytest.raises(DatasetError, match=f"^{where}.*{problem}"):
        ml.read_ratings(file)


def test_u_info_bounds_ids_and_counts(tmp_path):
    folder = tmp_path / "ml-100k"
    folder.mkdir()
    (folder / "u.info").write_text("3 users\n2 items\n3 ratings\n")
    (folder / "u.data").write_text(GOOD + "4\t1\t3\t881250951\n")
    with pytest.raises(DatasetError, match=r"line 3: user id 4 is out of range 1..3 \(from u.info"):
        ml.read_ratings(folder)
    (folder / "u.data").write_text(GOOD)
    with pytest.raises(DatasetError, match=r"2 ratings, but u.info says 3.*truncated"):
        ml.read_ratings(folder)
    (folder / "u.info").write_text("3 users\n2 items\n2 ratings\n")
    ratings = ml.read_ratings(folder)
    assert (ratings.num_users, ratings.num_items) == (3, 2)


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the data must never be downloaded")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


def test_missing_movielens_names_path_and_grouplens(tmp_path, no_network):
    with pytest.raises(MissingDataError) as err:
        build_movielens(MovieLensParams(path=str(tmp_path / "ml-100k")))
    message = str(err.value)
    assert str(tmp_path / "ml-100k" / "u.data") in message
    assert "GroupLens" in message and "grouplens.org/datasets/movielens/100k" in message
    with pytest.raises(MissingDataError, match=r"instance.path is empty.*GroupLens"):
        build_movielens(MovieLensParams())
    # through the registry too (the command line prints a FedbanditError as one line, status 2)
    with pytest.raises(MissingDataError, match="GroupLens") as err:
        build_instance(MovieLensParams(path=str(tmp_path / "nope")))
    assert isinstance(err.value, DataError) and isinstance(err.value, FedbanditError)


def test_movielens_experiment_validates_but_asks_for_the_data(tmp_path, capsys, no_network):
    config = load_experiment("fedpe_movielens")
    assert config.instance.kind == "movielens100k" and config.instance.path == ""
    assert main(["run", "fedpe_movielens", "--out", str(tmp_path / "run"), "--quiet"]) == 2
    assert "GroupLens" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_movielens_experiment_runs_on_a_supplied_file(movielens_dir, tmp_path):
    folder = movielens_dir[0]
    sets = [
        f"instance.path={folder}",
        f"instance.cache_dir={tmp_path / 'cache'}",
        "instance.num_clients=20",
        "instance.num_arms=5",
        "horizon=64",
    ]
    config = load_experiment("fedpe_movielens", sets)
    instance = build_instance(config.instance)
    result = simulate(instance, "fedpe", 64, [0, 0])
    assert np.all(np.isfinite(result.regret.mean_cumulative_regret()))


# ------------------------------------------------------------- bundled scikit-learn datasets

CLASSES = {"digits": 10, "wine": 3, "breast_cancer": 2, "iris": 3}


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_bundled_datasets_build_valid_instances(name):
    data = bundled_dataset(name)
    params = SklearnParams(dataset=name, num_clients=30, dim=3, clients="samples", seed=1)
    instance = classification_instance(data, params, name)
    K = CLASSES[name]
    assert instance.features.shape == (30, K, 3) and instance.thetas.shape == (K, 3)
    assert np.all(instance.features[:, :, 0] == 1.0)  # the intercept coordinate
    assert np.array_equal(instance.features, np.repeat(instance.features[:, :1], K, axis=1))
    # with an unpenalised intercept and centred components, the K scores of a client sum to 1
    np.testing.assert_allclose(instance.mean_rewards().sum(axis=1), 1.0, atol=1e-9)
    info = instance.summary()
    assert sum(info["class_counts"]) == len(data.labels) == info["num_samples"]
    assert sum(info["best_arm_counts"]) == 30 and len(info["best_arm_counts"]) == K
    assert info["client_label_entropy_bits_mean"] == 0.0  # one sample, one label
    assert info["client_majority_share_mean"] == 1.0 and info["min_gap"] >= 0
    assert 1.5 / K < info["fit_accuracy"] <= 1.0  # well above chance
    assert len(json.dumps(info)) < 2000  # summary statistics, not rows
    again = classification_instance(data, params, name)
    assert np.array_equal(again.features, instance.features)
    other = classification_instance(data, params.model_copy(update={"seed": 2}), name)
    assert not np.array_equal(other.features, instance.features)


def test_centroid_clients_report_label_heterogeneity():
    params = SklearnParams(dataset="digits", num_clients=40, dim=6, clients="centroids")
    instance = build_sklearn(params)
    assert instance.features.shape == (40, 10, 6)
    info = instance.summary()
    assert 0 < info["client_label_entropy_bits_mean"] < np.log2(10)
    assert 0.1 < info["client_majority_share_mean"] < 1.0
    assert sum(info["client_majority_class_counts"]) == 40
    assert info["clients"] == "centroids" and info["components"] == 5
    assert 0 <= info["best_arm_is_majority_label"] <= 1
    # built once per process, but every call returns independent arrays
    copy = build_sklearn(params)
    assert np.array_equal(copy.features, instance.features)
    assert copy.features is not instance.features


def test_zero_gap_is_reported():
    stats = common.gap_statistics(np.array([[0.5, 0.5, 0.1], [0.9, 0.2, 0.1]]))
    assert stats["zero_gap_clients"] == 1 and "gap_note" in stats
    assert stats["best_arm_counts"] == [2, 0, 0]


def test_fit_thetas_is_ridge_with_unpenalised_intercept():
    from sklearn.linear_model import Ridge

    rng = np.random.default_rng(0)
    Z = rng.standard_normal((80, 4))
    onehot = np.eye(3)[rng.integers(0, 3, 80)]
    thetas = fit_thetas(np.hstack([np.ones((80, 1)), Z]), onehot, 2.5, intercept=True)
    ridge = Ridge(alpha=2.5).fit(Z, onehot)
    np.testing.assert_allclose(thetas[:, 0], ridge.intercept_, atol=1e-10)
    np.testing.assert_allclose(thetas[:, 1:], ridge.coef_, atol=1e-10)


def _build_in_child(params):
    common._MEMO.clear()
    build_sklearn(params)


def test_kmeans_instances_build_in_forked_workers():
    """The runner builds the instance, then forks workers that build it again: k-means must not
    leave an OpenMP thread pool that deadlocks the forked child."""
    params = SklearnParams(dataset="digits", num_clients=50, dim=8, clients="centroids")
    common._MEMO.clear()
    build_sklearn(params)
    child = multiprocessing.get_context("fork").Process(target=_build_in_child, args=(params,))
    child.start()
    child.join(timeout=60)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail("building the instance in a forked worker hung")
    assert child.exitcode == 0


# --------------------------------------------------------------------------------- user tables


@pytest.fixture(scope="module")
def iris_tables(tmp_path_factory):
    """Iris written as CSV, gzipped CSV, .npy and .npz (labels as names, or 0/1/2 in order)."""
    folder = tmp_path_factory.mktemp("tables")
    data = bundled_dataset("iris")
    names = ["sepal length", "sepal width", "petal length", "petal width"]
    rows = [
        ",".join([*(repr(float(v)) for v in x), label])
        for x, label in zip(data.X, data.labels, strict=True)
    ]
    text = ",".join([*names, "species"]) + "\n" + "\n".join(rows) + "\n"
    (folder / "iris.csv").write_text(text)
    with gzip.open(folder / "iris.csv.gz", "wt") as fh:
        fh.write(text)
    codes = np.searchsorted(["setosa", "versicolor", "virginica"], data.labels)
    np.save(folder / "iris.npy", np.hstack([data.X, codes[:, None]]))
    np.savez(folder / "iris.npz", X=data.X, y=data.labels)
    return folder


@pytest.mark.parametrize("file", ["iris.csv", "iris.csv.gz", "iris.npy", "iris.npz"])
def test_tables_take_the_bundled_code_path(iris_tables, file):
    shared = dict(num_clients=15, dim=3, clients="centroids", seed=4)
    bundled = build_sklearn(SklearnParams(dataset="iris", **shared))
    label = "species" if ".csv" in file else None
    table = build_table(TableParams(path=str(iris_tables / file), label=label, **shared))
    assert np.array_equal(table.features, bundled.features)
    assert np.array_equal(table.thetas, bundled.thetas)
    assert table.info["class_counts"] == [50, 50, 50]
    assert table.info["source"].endswith(file) and table.name == f"table_{file}"


def test_table_classes_select_arms(iris_tables):
    params = TableParams(
        path=str(iris_tables / "iris.csv"),
        label="species",
        classes=["virginica", "setosa"],
        num_clients=20,
        dim=2,
    )
    instance = build_table(params)
    assert instance.num_arms == 2 and instance.info["classes"] == ["virginica", "setosa"]
    assert instance.info["num_samples"] == 100


CSV_HEADER = "a,b,label\n"
CSV_ROWS = "".join(f"{i},{i * 0.5 + (i % 3)},{'xyz'[i % 3]}\n" for i in range(12))


@pytest.mark.parametrize(
    ("name", "content", "label", "problem"),
    [
        ("cols.csv", CSV_HEADER + CSV_ROWS + "1,2\n", "label", r"line 14: expected 3 columns"),
        ("num.csv", CSV_HEADER + "1,abc,x\n" + CSV_ROWS, "label", r"line 2, column 'b': 'abc' is"),
        ("nan.csv", CSV_HEADER + CSV_ROWS + "nan,1,x\n", "label", r"line 14, column 'a'.*finite"),
        ("nolab.csv", CSV_HEADER + CSV_ROWS, "species", r"no label column 'species'.*a, b, label"),
        ("unset.csv", CSV_HEADER + CSV_ROWS, None, r"set instance.label"),
        ("emptylab.csv", CSV_HEADER + CSV_ROWS + "1,2, \n", "label", r"line 14: empty label"),
        ("empty.csv", "", "label", r"empty file"),
        ("header.csv", CSV_HEADER, "label", r"no data rows"),
        ("cut.csv", CSV_HEADER + CSV_ROWS[:-5], "label", r"line 13: expected 3 columns"),
        ("data.txt", "1,2,3\n", "label", r"unsupported file type"),
    ],
)
def test_bad_csv_names_file_and_line(tmp_path, name, content, label, problem):
    file = tmp_path / name
    file.write_text(content)
    with pytest.raises(DatasetError, match=f"^{re.escape(str(file))}.*{problem}"):
        load_table(file, label)


def test_bad_binary_tables(tmp_path):
    good = (CSV_HEADER + CSV_ROWS).encode()
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(gzip.compress(good * 50)[:-40])
    with pytest.raises(DatasetError, match=f"^{re.escape(str(cut))}, after line .*corrupt gzip"):
        load_table(cut, "label")
    np.save(tmp_path / "flat.npy", np.arange(5.0))
    with pytest.raises(DatasetError, match=r"flat.npy: expected a 2-d array"):
        load_table(tmp_path / "flat.npy")
    np.save(tmp_path / "text.npy", np.array([["a", "b"], ["c", "d"]]))
    with pytest.raises(DatasetError, match=r"text.npy: the array must be numeric"):
        load_table(tmp_path / "text.npy")
    np.save(tmp_path / "hole.npy", np.array([[1.0, 0.0], [np.nan, 1.0]]))
    with pytest.raises(DatasetError, match=r"hole.npy: the array has a missing .* \(1, 0\)"):
        load_table(tmp_path / "hole.npy")
    (tmp_path / "short.npy").write_bytes((tmp_path / "hole.npy").read_bytes()[:-8])
    with pytest.raises(DatasetError, match=r"short.npy: not a readable .npy array"):
        load_table(tmp_path / "short.npy")
    with pytest.raises(DatasetError, match="no column names"):
        load_table(tmp_path / "hole.npy", "label")
    np.savez(tmp_path / "noy.npz", X=np.ones((3, 2)), labels=np.arange(3))
    with pytest.raises(DatasetError, match=r"noy.npz: needs arrays named 'X'.*\['X', 'labels'\]"):
        load_table(tmp_path / "noy.npz")
    np.savez(tmp_path / "ok.npz", X=np.ones((3, 2)), y=np.arange(3))
    (tmp_path / "cut.npz").write_bytes((tmp_path / "ok.npz").read_bytes()[:-30])
    with pytest.raises(DatasetError, match=r"cut.npz: not a readable .npz archive"):
        load_table(tmp_path / "cut.npz")
    np.savez(tmp_path / "rows.npz", X=np.ones((3, 2)), y=np.arange(4))
    with pytest.raises(DatasetError, match="one label per row"):
        load_table(tmp_path / "rows.npz")
    with pytest.raises(MissingDataError, match=r"absent.csv: no such file"):
        load_table(tmp_path / "absent.csv", "label")


def test_table_sample_and_class_problems(tmp_path):
    file = tmp_path / "t.csv"
    file.write_text(CSV_HEADER + CSV_ROWS)
    with pytest.raises(DatasetError, match=r"too few samples for the requested clients: 12 .* 20"):
        build_table(TableParams(path=str(file), label="label", num_clients=20))
    with pytest.raises(DatasetError, match=r"class 'w' \(listed in instance.classes\) has no"):
        build_table(TableParams(path=str(file), label="label", num_clients=3, classes=["x", "w"]))
    (tmp_path / "one.csv").write_text(CSV_HEADER + "1,2,x\n3,4,x\n")
    with pytest.raises(DatasetError, match="only one class"):
        build_table(TableParams(path=str(tmp_path / "one.csv"), label="label", num_clients=2))
    with pytest.raises(DatasetError, match=r"dim = 5 needs 4 .*only 2 .*\(dim <= 3\)"):
        build_table(TableParams(path=str(file), label="label", num_clients=3, dim=5))
    with pytest.raises(DataError, match="too few samples"):
        build_instance(TableParams(path=str(file), label="label", num_clients=20))


# -------------------------------------------------------------------- experiments and harness

DATA_EXPERIMENTS = [
    name
    for name, path in available_experiments().items()
    if 'kind = "sklearn"' in path.read_text() or 'kind = "table"' in path.read_text()
]


def test_real_data_experiments_exist():
    assert {"fedpe_digits", "fedpe_wine", "fedpe_tiny_data"} <= set(DATA_EXPERIMENTS)


@pytest.mark.parametrize("name", DATA_EXPERIMENTS)
def test_real_data_experiments_run_a_few_rounds(name):
    config = load_experiment(name, ["horizon=64"])
    instance = build_instance(config.instance)
    for algorithm in config.algorithms:
        result = simulate(instance, algorithm, config.horizon, [0, 0])
        curve = result.regret.mean_cumulative_regret()
        assert len(curve) == 64 and np.all(np.diff(curve) >= -1e-12)


def test_harness_records_the_instance_facts(tmp_path):
    config = load_experiment("fedpe_tiny_data", ["horizon=128", "seeds=1"])
    out = run_experiment(config, tmp_path / "run", workers=1, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    facts = manifest["instance"]
    assert facts["name"] == "sklearn_iris" and facts["num_clients"] == 12
    assert facts["classes"] == ["setosa", "versicolor", "virginica"]
    assert {"client_label_entropy_bits_mean", "best_arm_counts", "gap_median"} <= set(facts)
    summary = json.loads((out / "summary.json").read_text())
    assert set(config.algorithms) <= set(summary)


def test_csv_without_a_header_line_is_detected_not_silently_shortened(tmp_path):
    """mnist-style files have no header: their first sample must not become the column names."""
    file = tmp_path / "nohead.csv"
    file.write_text("".join(f"{'xyz'[i % 3]},{i},{i * 0.5}\n" for i in range(12)))
    with pytest.raises(DatasetError, match=r"numbers where column names belong.*header = false"):
        load_table(file, 0)
    data = load_table(file, 0, header=False)
    assert data.X.shape == (12, 2) and data.feature_names == ["1", "2"]
    assert data.labels[0] == "x"  # the first line is a sample
    with pytest.raises(DatasetError, match=r"give instance\.label as the label column.s 0-based"):
        load_table(file, "0", header=False)
    numeric_names = tmp_path / "named.csv"
    numeric_names.write_text("label,1,2\n" + "".join(f"{'xy'[i % 2]},{i},{i}\n" for i in range(6)))
    assert load_table(numeric_names, "label", header=True).feature_names == ["1", "2"]


def test_csv_header_naming_a_column_twice_is_refused(tmp_path):
    file = tmp_path / "dup.csv"
    file.write_text("a,a,label\n" + "".join(f"{i},{i},{'xy'[i % 2]}\n" for i in range(6)))
    with pytest.raises(DatasetError, match=r"names columns twice \('a'\)"):
        load_table(file, "label")
