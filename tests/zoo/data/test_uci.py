"""Tests of zoo.data.uci: the bundled sets, UCI-layout folders and the full random split."""

from pathlib import Path

import numpy as np
import pytest
import torch
from tests.zoo.data.data_asserts import assert_train_standardised

from zoo.data import BUNDLED_UCI, STANDARDISE_ON, DataError, load_dataset, load_uci, load_uci_full_random_split


@pytest.mark.parametrize("name", BUNDLED_UCI)
def test_bundled_uci_shapes_and_train_only_standardisation(name):
    folder = Path(__file__).resolve().parents[3] / "zoo" / "data" / "bundled" / "uci" / name
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
    assert_train_standardised(ds)
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
    assert_train_standardised(ds)
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
    with pytest.raises(DataError, match=r"line 8 column 'col2' \(nan\) \(lines are 1-based, no header\)"):
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
    assert_train_standardised(a)
    full = load_uci_full_random_split("energy", seed=4, standardise_on="all")
    y_all = torch.cat([full.y_train, full.y_test]).double()
    assert abs(y_all.mean().item()) < 1e-5
    assert torch.allclose(full.y_test_original(), a.y_test_original(), atol=1e-3)
    assert STANDARDISE_ON == ("train", "all")
    with pytest.raises(DataError, match=r"standardise_on must be one of \('train', 'all'\), got 'test'"):
        load_uci_full_random_split("energy", standardise_on="test")
