"""Tests of zoo.datasets: loaders, standardisation, validation and error messages."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from zoo.datasets import (
    BUNDLED_UCI,
    DATASET_SPECS,
    DEFAULT_EULER_DIR,
    EULER_DIR_ENV,
    TOY1D_TRAIN_INTERVALS,
    DataError,
    check_finite_array,
    check_xy,
    load_csv,
    load_dataset,
    load_digits_dataset,
    load_euler,
    load_uci,
    load_uci_full_random_split,
    make_moons_dataset,
    make_toy1d,
)


def _assert_train_standardised(ds, dims=0):
    x = ds.x_train.double()
    assert torch.allclose(x.mean(dims), torch.zeros(()).double(), atol=1e-5)
    sd = x.std(dims, unbiased=False)
    assert torch.all(((sd - 1).abs() < 1e-4) | (sd < 1e-6))  # constant columns stay 0
    if ds.task == "regression":
        assert torch.allclose(ds.y_train.double().mean(0), torch.zeros(()).double(), atol=1e-5)
        assert torch.allclose(ds.y_train.double().std(0, unbiased=False), torch.ones(()).double(), atol=1e-4)


# ---------------------------------------------------------------------------------- UCI


@pytest.mark.parametrize("name", BUNDLED_UCI)
def test_bundled_uci_shapes_and_train_only_standardisation(name):
    folder = Path(__file__).resolve().parent.parent / "data" / "uci" / name
    raw = np.loadtxt(folder / "data.txt")
    train_idx = np.loadtxt(folder / "index_train_2.txt", dtype=int)
    test_idx = np.loadtxt(folder / "index_test_2.txt", dtype=int)
    target = int(np.loadtxt(folder / "index_target.txt"))

    ds = load_uci(name, split=2)

    assert ds.task == "regression" and ds.split == 2
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.float32
    assert ds.x_train.shape == (len(train_idx), raw.shape[1] - 1)
    assert ds.y_train.shape == (len(train_idx), 1) and ds.y_test.shape == (len(test_idx), 1)
    assert ds.y_loc.shape == (1,) and ds.y_scale.shape == (1,)
    assert len(ds.feature_names) == ds.input_dim and len(ds.target_names) == ds.output_dim == 1
    assert ds.info["n_splits"] == 20 and ds.info["n_hidden"] == 50 and ds.info["n_epochs"] == 40
    _assert_train_standardised(ds)
    # statistics come from the training rows only
    assert np.isclose(ds.y_loc.item(), raw[train_idx, target].mean(), rtol=1e-5)
    assert np.allclose(ds.y_test_original().squeeze(1).numpy(), raw[test_idx, target], rtol=1e-4, atol=1e-4)
    assert np.allclose(ds.y_train_original().squeeze(1).numpy(), raw[train_idx, target], rtol=1e-4, atol=1e-4)
    assert np.allclose(ds.x_to_original(ds.x_test).numpy(), np.delete(raw[test_idx], target, 1), rtol=1e-4, atol=1e-3)


def test_uci_split_out_of_range_lists_valid_range():
    with pytest.raises(DataError, match=r"valid splits are 0\.\.19"):
        load_uci("yacht", split=20)


def test_uci_unknown_name_lists_bundled_names():
    with pytest.raises(DataError, match="bostonHousing"):
        load_uci("no-such-dataset")


def _write_uci_folder(folder: Path, n_rows=30, n_splits=3, nan_at=None):
    """A small UCI-layout folder: 3 features (col 1 constant), 2 targets (cols 3, 4)."""
    folder.mkdir()
    rng = np.random.default_rng(1)
    data = rng.normal(size=(n_rows, 5)) * [1, 0, 2, 3, 4] + [0, 7, 1, 10, -5]
    if nan_at is not None:
        data[nan_at] = np.nan
    np.savetxt(folder / "data.txt", data)
    np.savetxt(folder / "index_features.txt", [0, 1, 2], fmt="%d")
    np.savetxt(folder / "index_target.txt", [3], fmt="%d")
    (folder / "n_splits.txt").write_text(f"{n_splits}\n")
    for k in range(n_splits):
        order = np.random.default_rng(k).permutation(n_rows)
        np.savetxt(folder / f"index_train_{k}.txt", order[5:], fmt="%d")
        np.savetxt(folder / f"index_test_{k}.txt", order[:5], fmt="%d")
    return data


def test_uci_path_spec_on_generated_folder(tmp_path):
    data = _write_uci_folder(tmp_path / "small")
    ds = load_dataset(f"uci:{tmp_path / 'small'}", split=1)
    assert ds.n_train == 25 and ds.n_test == 5 and ds.input_dim == 3 and ds.output_dim == 1
    assert ds.feature_names == ["col0", "col1", "col2"] and ds.target_names == ["col3"]
    assert ds.x_scale[1] == 1.0 and torch.all(ds.x_train[:, 1] == 0)  # constant column
    _assert_train_standardised(ds)
    assert "n_hidden" not in ds.info

    two = load_uci(tmp_path / "small", split=0, targets=[3, 4])
    assert two.y_train.shape == (25, 2) and two.y_loc.shape == (2,)
    test_idx = np.loadtxt(tmp_path / "small" / "index_test_0.txt", dtype=int)
    assert np.allclose(two.y_test_original().numpy(), data[test_idx][:, [3, 4]], atol=1e-4)

    with pytest.raises(DataError, match=r"valid splits are 0\.\.2"):
        load_uci(tmp_path / "small", split=3)
    with pytest.raises(DataError, match=r"targets must be distinct column indices in 0\.\.4"):
        load_uci(tmp_path / "small", targets=[5])


def test_uci_folder_with_nan_names_row_and_column(tmp_path):
    _write_uci_folder(tmp_path / "bad", nan_at=(7, 2))
    with pytest.raises(DataError, match=r"rows \[7\].*columns \[col2\]"):
        load_uci(tmp_path / "bad")


def test_uci_missing_folder_and_file(tmp_path):
    with pytest.raises(DataError, match="neither a bundled name"):
        load_uci(tmp_path / "absent")
    _write_uci_folder(tmp_path / "small")
    (tmp_path / "small" / "index_test_1.txt").unlink()
    with pytest.raises(DataError, match="index_test_1.txt"):
        load_uci(tmp_path / "small", split=1)


def test_uci_full_random_split_is_seeded_and_80_20():
    a = load_uci_full_random_split("energy", seed=4)
    b = load_uci_full_random_split("energy", seed=4)
    c = load_uci_full_random_split("energy", seed=5)
    assert (a.n_train, a.n_test) == (614, 154) and a.split is None
    assert torch.equal(a.y_test, b.y_test) and not torch.equal(a.y_test, c.y_test)
    _assert_train_standardised(a)
    full = load_uci_full_random_split("energy", seed=4, standardise_on="all")
    y_all = torch.cat([full.y_train, full.y_test]).double()
    assert abs(y_all.mean().item()) < 1e-5
    assert torch.allclose(full.y_test_original(), a.y_test_original(), atol=1e-3)


# ---------------------------------------------------------------------------------- toy1d


def test_toy1d_shapes_gap_and_grid():
    ds = make_toy1d()
    assert ds.x_train.shape == (40, 1) and ds.y_train.shape == (40, 1)
    assert ds.x_test.shape == (500, 1) and ds.y_test.shape == (500, 1)
    _assert_train_standardised(ds)
    x_train = ds.x_to_original(ds.x_train).squeeze(1).numpy()
    x_test = ds.x_to_original(ds.x_test).squeeze(1).numpy()
    (low_a, high_a), (low_b, high_b) = TOY1D_TRAIN_INTERVALS
    in_a = (x_train >= low_a - 1e-6) & (x_train <= high_a + 1e-6)
    in_b = (x_train >= low_b - 1e-6) & (x_train <= high_b + 1e-6)
    assert in_a.sum() == 20 and in_b.sum() == 20
    assert ((x_test > high_a) & (x_test < low_b)).sum() > 50  # test grid covers the gap
    assert x_test.min() < low_a and x_test.max() > high_b
    assert torch.equal(make_toy1d(seed=3).y_train, make_toy1d(seed=3).y_train)
    assert not torch.equal(make_toy1d(seed=3).y_train, ds.y_train)


# ---------------------------------------------------------------------------------- csv


def _write_csv(path, frame):
    frame.to_csv(path, index=False)
    return path


def _frame(n=20):
    rng = np.random.default_rng(0)
    return pd.DataFrame({"a": rng.normal(size=n), "b": rng.normal(size=n), "y": rng.normal(size=n) + 3})


def test_csv_loader_and_spec_with_colon_split(tmp_path):
    path = _write_csv(tmp_path / "table.csv", _frame())
    ds = load_dataset(f"csv:{path}:y", seed=1)
    assert (ds.n_train, ds.n_test) == (16, 4) and ds.feature_names == ["a", "b"] and ds.target_names == ["y"]
    _assert_train_standardised(ds)
    two = load_csv(path, "a, y")
    assert two.feature_names == ["b"] and two.y_train.shape == (16, 2)


def test_csv_nan_names_rows_and_columns(tmp_path):
    frame = _frame()
    frame.loc[3, "b"] = np.nan
    frame.loc[11, "y"] = np.inf
    path = _write_csv(tmp_path / "nan.csv", frame)
    with pytest.raises(DataError, match=r"rows \[3, 11\].*columns \[b, y\]"):
        load_csv(path, "y")


def test_csv_non_numeric_missing_column_and_missing_file(tmp_path):
    frame = _frame()
    frame["colour"] = "red"
    path = _write_csv(tmp_path / "text.csv", frame)
    with pytest.raises(DataError, match=r"non-numeric columns \['colour'\]"):
        load_csv(path, "y")
    with pytest.raises(DataError, match=r"\['nope'\] not found.*available columns: \['a', 'b', 'y', 'colour'\]"):
        load_csv(path, "y,nope")
    with pytest.raises(DataError, match="does not exist"):
        load_csv(tmp_path / "absent.csv", "y")


# ---------------------------------------------------------------------------------- classification


def test_digits_stratified_split():
    ds = load_digits_dataset()
    assert ds.task == "classification" and ds.num_classes == ds.output_dim == 10
    assert ds.x_train.shape == (1347, 64) and ds.x_test.shape == (450, 64)
    assert ds.y_train.dtype == torch.int64 and ds.y_train.shape == (1347,)
    assert torch.equal(torch.unique(ds.y_test), torch.arange(10))
    train_share = torch.bincount(ds.y_train) / ds.n_train
    test_share = torch.bincount(ds.y_test) / ds.n_test
    assert torch.allclose(train_share, test_share, atol=0.01)
    assert torch.equal(ds.y_loc, torch.zeros(1)) and torch.equal(ds.y_test_original(), ds.y_test)
    _assert_train_standardised(ds)


def test_moons():
    ds = load_dataset("moons", seed=2)
    assert ds.x_train.shape == (400, 2) and ds.n_test == 100 and ds.num_classes == 2
    assert ds.summary() == {
        "name": "moons", "task": "classification", "n_train": 400, "n_test": 100,
        "input_dim": 2, "output_dim": 2, "split": None,
    }


# ---------------------------------------------------------------------------------- euler


def _write_euler(folder: Path, n_pixels=30, skip=(6,)):
    folder.mkdir()
    rng = np.random.default_rng(0)
    xs, ys = np.meshgrid(np.arange(6), np.arange(n_pixels // 6))
    base = rng.uniform([0, 0, 0], [360, 180, 90], size=(n_pixels, 3))
    for step in range(1, 21):
        if step in skip:
            continue
        angles = base + step * 0.5 + rng.normal(scale=0.1, size=base.shape)
        pd.DataFrame({
            "Phase": 1, "Phi1": angles[:, 0], "Phi": angles[:, 1], "Phi2": angles[:, 2],
            "KAM": rng.uniform(size=n_pixels), "Y": ys.ravel(), "X": xs.ravel(),
        }).to_csv(folder / f"IPF_Final_{step}.csv", index=False)
    return base


def test_euler_on_generated_files(tmp_path):
    _write_euler(tmp_path / "euler")
    ds = load_dataset(f"euler:{tmp_path / 'euler'}", seed=3)
    assert ds.x_train.shape == (24, 18, 3) and ds.x_test.shape == (6, 18, 3)
    assert ds.y_train.shape == (24, 3) and ds.target_names == ["Phi1", "Phi", "Phi2"]
    assert ds.x_loc.shape == (1, 1, 3) and ds.x_scale.shape == (1, 1, 3) and ds.y_loc.shape == (3,)
    assert ds.input_dim == 3 and ds.output_dim == 3 and ds.info["units"] == "degrees"
    assert ds.info["xy_train"].shape == (24, 2)
    _assert_train_standardised(ds, dims=(0, 1))
    step20 = pd.read_csv(tmp_path / "euler" / "IPF_Final_20.csv")
    xy = ds.info["xy_test"].numpy()
    rows = [int(np.flatnonzero((step20.X == x) & (step20.Y == y))[0]) for x, y in xy]
    expected = step20.loc[rows, ["Phi1", "Phi", "Phi2"]].to_numpy()
    assert np.allclose(ds.y_test_original().numpy(), expected, atol=1e-3)

    small = load_euler(tmp_path / "euler", max_pixels=10)
    assert small.n_train + small.n_test == 10


def test_euler_env_var(tmp_path, monkeypatch):
    _write_euler(tmp_path / "via_env")
    monkeypatch.setenv(EULER_DIR_ENV, str(tmp_path / "via_env"))
    assert load_euler().n_train == 24


def test_euler_missing_folder_step_and_mismatched_rows(tmp_path):
    with pytest.raises(DataError, match=rf"{tmp_path / 'absent'} does not exist.*{EULER_DIR_ENV}"):
        load_euler(tmp_path / "absent")
    _write_euler(tmp_path / "gap", skip=(6, 13))
    with pytest.raises(DataError, match="IPF_Final_13.csv"):
        load_euler(tmp_path / "gap")
    _write_euler(tmp_path / "short")
    frame = pd.read_csv(tmp_path / "short" / "IPF_Final_9.csv")
    frame.iloc[:-1].to_csv(tmp_path / "short" / "IPF_Final_9.csv", index=False)
    with pytest.raises(DataError, match="IPF_Final_9.csv does not list the same pixels"):
        load_euler(tmp_path / "short")


@pytest.mark.skipif(not DEFAULT_EULER_DIR.is_dir(), reason="shared Euler data not present")
def test_euler_shared_data_if_present(monkeypatch):
    monkeypatch.delenv(EULER_DIR_ENV, raising=False)
    ds = load_euler(max_pixels=500)
    assert ds.x_train.shape == (400, 18, 3) and ds.y_test.shape == (100, 3)


# ---------------------------------------------------------------------------------- dispatch & checks


def test_unknown_spec_lists_valid_forms():
    with pytest.raises(DataError) as err:
        load_dataset("mnist")
    for form in DATASET_SPECS:
        assert form in str(err.value)
    for name in BUNDLED_UCI:
        assert name in str(err.value)
    with pytest.raises(DataError, match="unknown dataset spec"):
        load_dataset("csv:only-a-path")


def test_check_helpers_on_user_tensors():
    x = torch.zeros(4, 2)
    x[2, 1] = float("nan")
    with pytest.raises(DataError, match=r"rows \[2\].*columns \[1\]"):
        check_finite_array(x, "x")
    with pytest.raises(DataError, match="no rows"):
        check_finite_array(np.zeros((0, 3)), "x")
    with pytest.raises(DataError, match="4 input rows but 3 target rows"):
        check_xy(torch.zeros(4, 2), torch.zeros(3, 1))
    with pytest.raises(DataError, match="2-D"):
        check_xy(torch.zeros(4), torch.zeros(4))
    many = np.full((30, 30), np.nan)
    with pytest.raises(DataError, match=r"\(30 in total\)"):
        check_finite_array(many, "many")
    with pytest.raises(DataError, match="real-valued"):
        check_finite_array(torch.zeros(2, 2, dtype=torch.complex64), "z")


def test_dataset_rejects_bad_labels_and_shapes():
    good = make_moons_dataset(n=40)
    fields = dict(vars(good))
    with pytest.raises(DataError, match=r"labels must lie in 0\.\.1"):
        type(good)(**{**fields, "y_test": good.y_test + 5})
    with pytest.raises(DataError, match="task must be one of"):
        type(good)(**{**fields, "task": "ranking"})
    with pytest.raises(DataError, match="all but the first dimension must match"):
        type(good)(**{**fields, "x_test": torch.zeros(good.n_test, 3)})


def test_uci_empty_data_file(tmp_path):
    _write_uci_folder(tmp_path / "empty")
    (tmp_path / "empty" / "data.txt").write_text("")
    with pytest.warns(UserWarning), pytest.raises(DataError, match="holds no data"):
        load_uci(tmp_path / "empty")
