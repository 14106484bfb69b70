"""Dataset loaders: shipped digits, user-provided MNIST files, seeded synthetic data."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from geomx.ml import DatasetFormatError, DatasetNotFoundError, build_model, iter_batches, load_dataset
from geomx.ml.datasets import read_idx, write_idx


def test_digits_are_shipped_scaled_and_split_80_20() -> None:
    data = load_dataset("digits")
    assert data.num_train + data.num_test == 1797
    assert data.num_test == 359
    assert data.input_shape == (1, 8, 8) and data.x_train.shape[1:] == (1, 8, 8)
    assert data.x_train.dtype == np.float32 and data.y_train.dtype == np.int64
    assert 0.0 <= data.x_train.min() and data.x_train.max() == 1.0
    assert data.num_classes == 10 and set(np.unique(data.y_test)) == set(range(10))


def test_digits_split_depends_only_on_the_seed() -> None:
    a, b, c = load_dataset("digits", seed=1), load_dataset("digits", seed=1), load_dataset("digits", seed=2)
    np.testing.assert_array_equal(a.y_train, b.y_train)
    np.testing.assert_array_equal(a.x_test, b.x_test)
    assert not np.array_equal(a.y_train, c.y_train)


def _fake_mnist(rng: np.random.Generator, n_train: int = 12, n_test: int = 5) -> dict[str, np.ndarray]:
    return {
        "x_train": rng.integers(0, 256, size=(n_train, 28, 28), dtype=np.uint8),
        "y_train": rng.integers(0, 10, size=n_train).astype(np.uint8),
        "x_test": rng.integers(0, 256, size=(n_test, 28, 28), dtype=np.uint8),
        "y_test": rng.integers(0, 10, size=n_test).astype(np.uint8),
    }


_STEMS = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_mnist_loads_from_a_directory_of_idx_files(tmp_path: Path, suffix: str) -> None:
    arrays = _fake_mnist(np.random.default_rng(0))
    for key, stem in _STEMS.items():
        write_idx(tmp_path / (stem + suffix), arrays[key])
    if suffix:
        assert (tmp_path / "t10k-labels-idx1-ubyte.gz").read_bytes()[:2] == b"\x1f\x8b"
    data = load_dataset("mnist", path=tmp_path)
    assert data.x_train.shape == (12, 1, 28, 28) and data.x_test.shape == (5, 1, 28, 28)
    assert data.input_shape == (1, 28, 28) and data.num_classes == 10
    np.testing.assert_allclose(data.x_train[:, 0], arrays["x_train"] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(data.y_test, arrays["y_test"])
    assert data.y_test.dtype == np.int64


def test_fashion_mnist_accepts_the_dotted_file_names(tmp_path: Path) -> None:
    arrays = _fake_mnist(np.random.default_rng(1))
    for key, stem in _STEMS.items():
        write_idx(tmp_path / stem.replace("-idx", ".idx"), arrays[key])
    data = load_dataset("fashion_mnist", path=str(tmp_path))
    assert data.name == "fashion_mnist" and data.num_train == 12


def test_mnist_loads_from_an_npz_file_or_a_directory_holding_one(tmp_path: Path) -> None:
    arrays = _fake_mnist(np.random.default_rng(2))
    np.savez(tmp_path / "mnist.npz", **arrays)
    by_file = load_dataset("mnist", path=tmp_path / "mnist.npz")
    by_dir = load_dataset("mnist", path=tmp_path)
    np.testing.assert_array_equal(by_file.x_train, by_dir.x_train)
    assert by_file.x_train.shape == (12, 1, 28, 28)


def test_default_location_comes_from_geomx_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mnist").mkdir()
    np.savez(tmp_path / "mnist" / "mnist.npz", **_fake_mnist(np.random.default_rng(3)))
    monkeypatch.setenv("GEOMX_DATA_DIR", str(tmp_path))
    assert load_dataset("mnist").num_test == 5


def test_missing_mnist_names_the_path_and_never_downloads(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("mnist", path=missing)
    assert isinstance(info.value, FileNotFoundError)
    assert str(missing) in str(info.value) and "never downloads" in str(info.value)
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((1, 2, 2), np.uint8))
    with pytest.raises(DatasetNotFoundError, match="t10k-labels-idx1-ubyte"):
        load_dataset("mnist", path=tmp_path)


def test_malformed_files_raise_format_errors(tmp_path: Path) -> None:
    bad_magic = tmp_path / "bad"
    bad_magic.write_bytes(b"\x01\x02\x08\x01\x00\x00\x00\x01\x05")
    with pytest.raises(DatasetFormatError, match="magic"):
        read_idx(bad_magic)
    short = tmp_path / "short"
    short.write_bytes(bytes([0, 0, 0x08, 1]) + (10).to_bytes(4, "big") + b"\x00" * 3)
    with pytest.raises(DatasetFormatError, match="promises"):
        read_idx(short)
    broken_gz = tmp_path / "x.gz"
    broken_gz.write_bytes(gzip.compress(b"\x00\x00\x08\x01\x00\x00\x00\x01\x07")[:-6])
    with pytest.raises(DatasetFormatError, match="gzip"):
        read_idx(broken_gz)
    np.savez(tmp_path / "partial.npz", x_train=np.zeros((1, 2, 2), np.uint8))
    with pytest.raises(DatasetFormatError, match="lacks keys"):
        load_dataset("mnist", path=tmp_path / "partial.npz")


def test_idx_round_trip_keeps_dtype_and_shape(tmp_path: Path) -> None:
    for array in (np.arange(24, dtype=np.int32).reshape(2, 3, 4), np.linspace(0, 1, 5, dtype=np.float32)):
        out = read_idx(write_idx(tmp_path / "a.idx", array))
        assert out.dtype == array.dtype and out.dtype.isnative
        np.testing.assert_array_equal(out, array)


def test_synthetic_is_deterministic_scaled_and_learnable() -> None:
    a = load_dataset("synthetic", seed=4, n_samples=600, n_features=8, n_classes=3, separability=3.0)
    b = load_dataset("synthetic", seed=4, n_samples=600, n_features=8, n_classes=3, separability=3.0)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert a.input_shape == (8,) and a.num_classes == 3 and a.num_train == 480
    assert a.x_train.dtype == np.float32 and a.x_train.min() >= 0 and a.x_train.max() <= 1
    assert np.bincount(a.y_train, minlength=3).min() > 140
    model = build_model("softmax", a.input_shape, a.num_classes, np.random.default_rng(0))
    for _ in range(150):
        _, grads = model.loss_and_grads(a.x_train, a.y_train)
        for p, g in zip(model.params, grads):
            p -= 2.0 * g
    assert model.accuracy(a.x_test, a.y_test) > 0.9


def test_unknown_dataset_and_options_are_rejected() -> None:
    with pytest.raises(ValueError, match="allowed: digits, mnist, fashion_mnist, synthetic, cifar10, libsvm, csv"):
        load_dataset("cifar100")
    with pytest.raises(ValueError, match="n_featurez"):
        load_dataset("synthetic", n_featurez=3)
    with pytest.raises(ValueError, match="no path"):
        load_dataset("digits", path="/tmp")


def test_batches_keep_the_short_last_batch_like_the_demo_loader() -> None:
    batches = list(iter_batches(np.arange(15000), 32))
    assert len(batches) == 469 and len(batches[-1]) == 24
    np.testing.assert_array_equal(np.concatenate(batches), np.arange(15000))
    assert len(list(iter_batches(np.arange(15000), 32, drop_last=True))) == 468
