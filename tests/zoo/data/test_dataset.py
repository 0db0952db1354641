"""Tests of zoo.data: Dataset, the standardiser, validation, the spec registry, toys, CSV and digits."""

import numpy as np
import pandas as pd
import pytest
import torch
from tests.zoo.data.data_asserts import assert_train_standardised

from zoo.data import (
    BUNDLED_UCI,
    DATASET_SPECS,
    TOY1D_TRAIN_INTERVALS,
    DataError,
    check_finite_array,
    check_xy,
    load_csv,
    load_dataset,
    load_digits_dataset,
    make_moons_dataset,
    make_toy1d,
    random_split,
    standardiser,
    toy1d_curve,
)

# ---------------------------------------------------------------------------------- standardiser & split


def test_standardiser_mean_sd_and_constant_columns():
    values = np.array([[1.0, 5.0], [3.0, 5.0], [8.0, 5.0]])
    loc, scale = standardiser(values, 0)
    assert np.allclose(loc, [4.0, 5.0]) and np.allclose(scale, [np.std([1.0, 3.0, 8.0]), 1.0])  # ddof 0
    sequences = np.arange(24.0).reshape(2, 4, 3)
    loc, scale = standardiser(sequences, (0, 1))
    assert loc.shape == scale.shape == (3,) and np.allclose(loc, sequences.reshape(-1, 3).mean(0))


def test_random_split_is_seeded_disjoint_and_checked():
    train, test = random_split(10, 0.3, seed=1)
    assert len(test) == 3 and sorted(np.concatenate([train, test]).tolist()) == list(range(10))
    assert np.array_equal(test, random_split(10, 0.3, seed=1)[1])
    with pytest.raises(DataError, match="strictly between 0 and 1"):
        random_split(10, 1.0, seed=0)
    with pytest.raises(DataError, match="empty training or test split"):
        random_split(3, 0.1, seed=0)


# ---------------------------------------------------------------------------------- toy1d


def test_toy1d_shapes_gap_and_grid():
    ds = make_toy1d()
    assert ds.x_train.shape == (40, 1) and ds.y_train.shape == (40, 1)
    assert ds.x_test.shape == (500, 1) and ds.y_test.shape == (500, 1)
    assert_train_standardised(ds)
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
    with pytest.raises(DataError, match="n_train >= 2"):
        make_toy1d(n_train=1)


def test_toy1d_test_range_moves_only_the_test_grid():
    default, narrow = make_toy1d(seed=2), make_toy1d(seed=2, test_range=(-0.3, 1.0))
    assert torch.equal(default.x_train, narrow.x_train) and torch.equal(default.y_train, narrow.y_train)
    x = narrow.x_to_original(narrow.x_test).squeeze(-1)
    assert float(x.min()) == pytest.approx(-0.3, abs=1e-5) and float(x.max()) == pytest.approx(1.0, abs=1e-5)
    for bad in [(1.0, -0.3), (0.0, float("inf")), (0.5,), "wide"]:
        with pytest.raises(DataError, match="test_range"):
            make_toy1d(test_range=bad)


def test_toy1d_targets_follow_the_curve():
    """To first order in ε the residual about the noiseless curve is ε g(x) with
    g = 1 + 0.6π cos(2πx) + 1.2π cos(4πx), so its rms is 0.02 · rms(g) over the test grid; with
    500 points the rms has a relative standard error of about 1 / sqrt(2 · 500) = 3%, so 15% is 5 of them."""
    ds = make_toy1d(seed=1)
    x = ds.x_to_original(ds.x_test).double().squeeze(1).numpy()
    residual = ds.y_test_original().double().squeeze(1).numpy() - toy1d_curve(x)
    g = 1 + 0.6 * np.pi * np.cos(2 * np.pi * x) + 1.2 * np.pi * np.cos(4 * np.pi * x)
    expected = 0.02 * np.sqrt(np.mean(g**2))
    assert abs(np.sqrt(np.mean(residual**2)) / expected - 1) < 0.15
    assert toy1d_curve(np.array([0.25]))[0] == pytest.approx(0.55)  # 0.25 + 0.3 sin(π/2) + 0.3 sin(π)


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
    assert_train_standardised(ds)
    two = load_csv(path, "a, y")
    assert two.feature_names == ["b"] and two.y_train.shape == (16, 2)


def test_csv_errors_name_the_file_line(tmp_path):
    """More cases, each also through the CLI, are in tests/zoo/data/test_checks.py."""
    frame = _frame()
    frame.loc[3, "b"] = np.nan
    frame.loc[11, "y"] = np.inf
    path = _write_csv(tmp_path / "nan.csv", frame)
    with pytest.raises(DataError, match=r"line 5 column 'b' \(nan\), line 13 column 'y' \(inf\) \(lines are 1-based, "
                                        r"the header is line 1\)"):
        load_csv(path, "y")
    frame = _frame()
    frame["colour"] = "red"
    path = _write_csv(tmp_path / "text.csv", frame)
    with pytest.raises(DataError, match=r"line 2 column 'colour' holds 'red', not a number"):
        load_csv(path, "y")
    with pytest.raises(DataError, match=r"\['nope'\] not found.*available columns: \['a', 'b', 'y', 'colour'\]"):
        load_csv(path, "y,nope")
    with pytest.raises(DataError, match="name a column more than once"):
        load_csv(path, "y,y")
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
    assert_train_standardised(ds)


def test_moons():
    ds = load_dataset("moons", seed=2)
    assert ds.x_train.shape == (400, 2) and ds.n_test == 100 and ds.num_classes == 2
    assert ds.summary() == {
        "name": "moons", "task": "classification", "n_train": 400, "n_test": 100,
        "input_dim": 2, "output_dim": 2, "split": None,
    }


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
    with pytest.raises(DataError, match="must be numeric"):
        check_finite_array(np.array([["a"], ["b"]]), "text")


def test_dataset_rejects_bad_labels_and_shapes():
    good = make_moons_dataset(n=40)
    fields = dict(vars(good))
    with pytest.raises(DataError, match=r"labels must lie in 0\.\.1"):
        type(good)(**{**fields, "y_test": good.y_test + 5})
    with pytest.raises(DataError, match="task must be one of"):
        type(good)(**{**fields, "task": "ranking"})
    with pytest.raises(DataError, match="all but the first dimension must match"):
        type(good)(**{**fields, "x_test": torch.zeros(good.n_test, 3)})
