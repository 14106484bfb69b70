"""User data files: CIFAR-10 python batches (read with a restricted unpickler), LIBSVM text
and CSV. Tiny fixtures are generated into tmp_path; nothing is ever downloaded."""

from __future__ import annotations

import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest

from geomx.ml import DatasetFormatError, DatasetNotFoundError, build_model, load_dataset
from geomx.ml.cifar import TEST_BATCH, TRAIN_BATCHES, load_cifar10, write_cifar_batch
from geomx.ml.tabular import read_csv, read_libsvm, write_libsvm

from tests.helpers.paths import ROOT


# -- CIFAR-10 --------------------------------------------------------------------------------


def _cifar_dir(root: Path, per_batch: int = 4, seed: int = 0) -> tuple[Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    images, labels = [], []
    for name in (*TRAIN_BATCHES, TEST_BATCH):
        x = rng.integers(0, 256, size=(per_batch, 3, 32, 32), dtype=np.uint8)
        y = rng.integers(0, 10, size=per_batch)
        write_cifar_batch(d / name, x, y)
        images.append(x)
        labels.append(y)
    return d, np.concatenate(images), np.concatenate(labels)


def test_cifar10_batches_load_as_nchw_floats(tmp_path: Path) -> None:
    d, images, labels = _cifar_dir(tmp_path)
    data = load_dataset("cifar10", path=tmp_path)  # the parent of cifar-10-batches-py works too
    assert (data.num_train, data.num_test, data.input_shape, data.num_classes) == (20, 4, (3, 32, 32), 10)
    np.testing.assert_array_equal(data.x_train, images[:20].astype(np.float32) / 255)
    np.testing.assert_array_equal(data.y_test, labels[20:])
    assert data.x_train.dtype == np.float32 and data.y_train.dtype == np.int64
    build_model("cnn", data.input_shape, data.num_classes, np.random.default_rng(0))


def test_cifar10_reads_the_archive_without_extracting(tmp_path: Path) -> None:
    d, images, _ = _cifar_dir(tmp_path / "src")
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(d, arcname="cifar-10-batches-py")
    data = load_cifar10(archive)
    np.testing.assert_array_equal(data.x_test, images[20:].astype(np.float32) / 255)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cifar-10-python.tar.gz", "src"]


class _RunsCode:
    """A pickle payload that would call a function on load (what the unpickler must refuse)."""

    def __reduce__(self):
        return (Path.touch, (Path("/tmp/geomx-cifar-pwned"),))


def test_cifar10_refuses_pickles_that_call_functions(tmp_path: Path) -> None:
    d, _, _ = _cifar_dir(tmp_path)
    target = Path("/tmp/geomx-cifar-pwned")
    target.unlink(missing_ok=True)
    (d / "data_batch_3").write_bytes(pickle.dumps({b"data": _RunsCode(), b"labels": []}, protocol=2))
    with pytest.raises(DatasetFormatError, match=r"data_batch_3: the pickle asks for .*refusing to load it"):
        load_cifar10(d)
    assert not target.exists()


@pytest.mark.parametrize("batch, match", [
    ({b"data": np.zeros((2, 3072), np.float32), b"labels": [0, 1]}, "uint8 array"),
    ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}, "one label per image"),
    ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, "0..9"),
    ([1, 2, 3], "expected a dict"),
])
def test_cifar10_rejects_batches_of_the_wrong_shape(tmp_path: Path, batch, match: str) -> None:
    d, _, _ = _cifar_dir(tmp_path)
    (d / TEST_BATCH).write_bytes(pickle.dumps(batch, protocol=2))
    with pytest.raises(DatasetFormatError, match=match):
        load_cifar10(d)
    (d / TEST_BATCH).write_bytes(b"not a pickle")
    with pytest.raises(DatasetFormatError, match="not a CIFAR-10 batch"):
        load_cifar10(d)


def test_cifar10_missing_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEOMX_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(DatasetNotFoundError, match=r"cifar10 data not found .*never downloads"):
        load_dataset("cifar10")


# -- LIBSVM ---------------------------------------------------------------------------------


def test_libsvm_parses_sparse_rows_comments_and_blank_lines(tmp_path: Path) -> None:
    f = tmp_path / "a.svm"
    f.write_text("# a comment line\n+1 1:0.5 3:2 # trailing comment\n\n-1 2:1e-1\n-1\n")
    rows, labels = read_libsvm(f)
    np.testing.assert_array_equal(labels, [1, -1, -1])
    assert rows.n_features == 3
    np.testing.assert_array_equal(rows.to_dense(), np.array([[0.5, 0, 2], [0, 0.1, 0], [0, 0, 0]], np.float32))
    assert read_libsvm(f, n_features=10)[0].to_dense().shape == (3, 10)


@pytest.mark.parametrize("line, match", [
    ("1 3:1 2:1", "must increase, 2 follows 3"),
    ("1 0:1", "index '0' must be an integer >= 1"),
    ("1 x:1", "index 'x'"),
    ("1 2=1", "expected index:value"),
    ("1 2:abc", "value of feature 2 'abc' is not a number"),
    ("cat 1:1", "label 'cat' is not a number"),
    ("1 2:nan", "not finite"),
    ("1 12:1", "feature index 12 exceeds n_features = 5"),
])
def test_libsvm_bad_lines_name_file_and_line(tmp_path: Path, line: str, match: str) -> None:
    f = tmp_path / "bad.svm"
    f.write_text(f"1 1:1\n{line}\n")
    with pytest.raises(DatasetFormatError, match=rf"bad.svm:2: .*{match}"):
        read_libsvm(f, n_features=5)


def test_libsvm_dataset_uses_the_dot_t_file_as_test_set(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    x = np.round(rng.random((30, 6)) * (rng.random((30, 6)) < 0.4), 3).astype(np.float32)
    y = np.where(x[:, 0] > 0.2, 1, -1)
    write_libsvm(tmp_path / "d.svm", x[:24], y[:24])
    write_libsvm(tmp_path / "d.svm.t", x[24:], y[24:])
    data = load_dataset("libsvm", path=tmp_path / "d.svm", n_features=6)
    assert (data.num_train, data.num_test, data.input_shape, data.num_classes) == (24, 6, (6,), 2)
    np.testing.assert_array_equal(data.y_train, (y[:24] > 0).astype(np.int64))  # -1 -> 0, +1 -> 1
    assert data.x_train.min() >= 0.0 and data.x_train.max() <= 1.0 and data.x_test.max() <= 1.0
    (tmp_path / "d.svm.t").unlink()
    split = load_dataset("libsvm", path=tmp_path / "d.svm", seed=3)
    assert (split.num_train, split.num_test) == (19, 5)


def test_file_datasets_need_a_path_and_an_existing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs a path"):
        load_dataset("libsvm")
    with pytest.raises(DatasetNotFoundError, match=r"LIBSVM file .*nope.svm does not exist; geomx never downloads"):
        load_dataset("libsvm", path=tmp_path / "nope.svm")
    with pytest.raises(DatasetNotFoundError, match=r"CSV file .*nope.csv does not exist"):
        load_dataset("csv", path=tmp_path / "nope.csv")


# -- CSV ------------------------------------------------------------------------------------


def test_csv_detects_a_header_and_finds_the_label_column_by_name(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("a,species,b\n1.0,setosa,2\n3,virginica,4\n5,setosa,6\n7,versicolor,8\n9,setosa,10\n")
    x, labels, header = read_csv(f, label_column="species")
    assert header == ["a", "species", "b"]
    np.testing.assert_array_equal(x, [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]])
    data = load_dataset("csv", path=f, label_column="species", test_fraction=0.4)
    assert (data.num_train, data.num_test, data.num_classes, data.input_shape) == (3, 2, 3, (2,))
    by_label = dict(zip(labels, np.concatenate([data.y_train, data.y_test])))
    assert set(by_label.values()) <= {0, 1, 2}


def test_csv_without_header_takes_the_last_column_as_label(tmp_path: Path) -> None:
    f = tmp_path / "n.csv"
    f.write_text("0.5,1,0\n0.25,2,1\n1e-3,3,1\n")
    x, labels, header = read_csv(f)
    assert header is None and list(labels) == ["0", "1", "1"]
    np.testing.assert_allclose(x, [[0.5, 1], [0.25, 2], [1e-3, 3]])
    assert read_csv(f, label_column=0)[0].shape == (3, 2)


@pytest.mark.parametrize("text, kwargs, error, match", [
    ("a,b,y\n1,2,0\n3,oops,1\n", {}, DatasetFormatError, r"t.csv:3: b 'oops' is not a number"),
    ("1,2,0\n3,1\n", {}, DatasetFormatError, r"t.csv:2: 2 fields, expected 3"),
    ("1,2,0\n", {"label_column": "y"}, ValueError, "no header row"),
    ("a,b,y\n1,2,0\n", {"label_column": "z"}, ValueError, "no column named 'z'; columns: a, b, y"),
    ("1,2,0\n", {"label_column": 5}, ValueError, "out of range for 3 columns"),
    ("x\n", {}, DatasetFormatError, "a header and no data rows"),
])
def test_csv_errors_are_clear(tmp_path: Path, text: str, kwargs, error, match: str) -> None:
    f = tmp_path / "t.csv"
    f.write_text(text)
    with pytest.raises(error, match=match):
        read_csv(f, **kwargs)


# -- the scenario ---------------------------------------------------------------------------


def test_the_libsvm_example_scenario_trains_on_its_committed_file(scenario_of) -> None:
    from geomx.experiment import run_scenario

    data_file = ROOT / "scenarios" / "data" / "libsvm_example.svm"
    assert data_file.stat().st_size < 50_000
    s = scenario_of("libsvm_example.toml", "metrics.trace=false", "metrics.plot=false")
    assert s.training.data_path == str(data_file)
    summary = run_scenario(s).summary
    assert summary.final_accuracy >= 0.9


def test_file_datasets_need_data_path_in_the_scenario(scenario_of) -> None:
    from geomx.scenario.errors import ScenarioError

    with pytest.raises(ScenarioError, match="training.data_path.*needs data_path"):
        scenario_of("quickstart.toml", "training.dataset=csv")


def test_csv_scenario_passes_the_label_column_to_the_loader(scenario_of, tmp_path: Path) -> None:
    from geomx.cluster import plan_job
    from geomx.node.trainer import load_data

    f = tmp_path / "iris.csv"
    rng = np.random.default_rng(0)
    rows = [f"{a:.3f},{b:.3f},{'ab'[int(a > 0.5)]}" for a, b in rng.random((40, 2))]
    f.write_text("x1,x2,kind\n" + "\n".join(rows) + "\n")
    for column, expected in (("kind", "kind"), ("-1", -1)):
        plan = plan_job(scenario_of("quickstart.toml", "training.dataset=csv", f"training.data_path={f}",
                                    f"training.label_column={column}", "training.model=softmax"))
        assert plan.train.dataset_kwargs == {"label_column": expected}
    data = load_data(plan.train)
    assert (data.num_train + data.num_test, data.num_classes, data.input_shape) == (40, 2, (2,))
