"""Tests of zoo.data.euler on generated files (the real data is not bundled): loader and increments."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from tests.zoo.data.data_asserts import assert_train_standardised

from lab.cli import main
from zoo.data import (
    DEFAULT_EULER_DIR,
    EULER_DIR_ENV,
    DataError,
    euler_increments,
    load_dataset,
    load_euler,
    wrap_degrees,
)


def _write_euler(folder: Path, n_pixels=30, skip=(6,), wrap_pixel=False):
    """Generated files: angles drift +0.5°/step; with ``wrap_pixel`` pixel 0's Phi1 crosses 360° -> 0°."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    xs, ys = np.meshgrid(np.arange(6), np.arange(n_pixels // 6))
    base = rng.uniform([0, 0, 0], [350, 180, 90], size=(n_pixels, 3))
    if wrap_pixel:
        base[0, 0] = 352.0  # 352 + 0.5 * 20 = 362 -> written as 2
    for step in range(1, 21):
        if step in skip:
            continue
        angles = base + step * 0.5 + rng.normal(scale=0.01, size=base.shape)
        pd.DataFrame({
            "Phase": 1, "Phi1": angles[:, 0] % 360, "Phi": angles[:, 1], "Phi2": angles[:, 2],
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
    assert_train_standardised(ds, dims=(0, 1))
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
    _write_euler(tmp_path / "ok")
    with pytest.raises(DataError, match="max_pixels must be at least 2"):
        load_euler(tmp_path / "ok", max_pixels=1)


def _edit_cell(folder: Path, step: int, row: int, column: str, value) -> None:
    path = folder / f"IPF_Final_{step}.csv"
    frame = pd.read_csv(path).astype({column: object})
    frame.loc[row, column] = value
    frame.to_csv(path, index=False)


def _duplicate_phi(folder: Path, step: int) -> None:
    path = folder / f"IPF_Final_{step}.csv"
    frame = pd.read_csv(path)
    frame.insert(len(frame.columns), "Phi", 0.0, allow_duplicates=True)
    frame.to_csv(path, index=False)


def _directory(folder: Path, step: int) -> None:
    (folder / f"IPF_Final_{step}.csv").unlink()
    (folder / f"IPF_Final_{step}.csv").mkdir()


EULER_ERRORS = {  # data row r of a step file is on line r + 2 (the header is line 1)
    "NaN": (lambda f: _edit_cell(f, 9, 4, "Phi", np.nan),
            r"IPF_Final_9\.csv has 1 missing or NaN/inf value\(s\): line 6 column 'Phi' \(nan\) \(lines are "
            r"1-based, the header is line 1\)"),
    "float32 overflow": (lambda f: _edit_cell(f, 20, 0, "Phi2", 1e300),
                         r"IPF_Final_20\.csv has 1 value\(s\) beyond the float32 range .* line 2 column 'Phi2' "
                         r"\(1e\+300\)"),
    "text": (lambda f: _edit_cell(f, 3, 10, "Phi1", "abc"),
             r"IPF_Final_3\.csv line 12 column 'Phi1' holds 'abc', not a number"),
    "duplicated column": (lambda f: _duplicate_phi(f, 4),
                          r"IPF_Final_4\.csv: column name 'Phi' appears 2 times in the header \(columns 3 and 8"),
    "moved pixel": (lambda f: _edit_cell(f, 9, 3, "X", 99),
                    r"IPF_Final_9\.csv does not list the same pixels .*: line 5 has \(X, Y\) = \(99, 0\), not "
                    r"\(3, 0\)"),
    "directory": (lambda f: _directory(f, 7), r"IPF_Final_7\.csv is a directory, not a file"),
}


@pytest.mark.parametrize("case", list(EULER_ERRORS))
def test_euler_file_errors_name_file_line_and_column_and_cli_exits_2(case, tmp_path, capsys):
    edit, pattern = EULER_ERRORS[case]
    _write_euler(tmp_path / "euler")
    edit(tmp_path / "euler")
    with pytest.raises(DataError, match=pattern) as err:
        load_euler(tmp_path / "euler")
    code = main(["fit", "--data", f"euler:{tmp_path / 'euler'}", "--quiet", "--epochs", "1",
                 "--out", str(tmp_path / "run")])
    assert code == 2 and capsys.readouterr().err.strip() == f"error: {err.value}"


@pytest.mark.skipif(not DEFAULT_EULER_DIR.is_dir(), reason="shared Euler data not present")
def test_euler_shared_data_if_present(monkeypatch):
    monkeypatch.delenv(EULER_DIR_ENV, raising=False)
    ds = load_euler(max_pixels=500)
    assert ds.x_train.shape == (400, 18, 3) and ds.y_test.shape == (100, 3)


def test_euler_increments_remove_the_wrap(tmp_path):
    _write_euler(tmp_path / "euler", n_pixels=42, wrap_pixel=True)
    raw = load_euler(tmp_path / "euler", seed=0)
    raw_steps = torch.cat([raw.x_to_original(raw.x_train), raw.x_to_original(raw.x_test)]).diff(dim=1)
    assert raw_steps.min() < -300  # as plain numbers, pixel 0's Phi1 jumps from ~360° to ~0°
    inc = euler_increments(raw)
    assert inc.name == "euler-increments" and inc.feature_names == inc.target_names == ["dPhi1", "dPhi", "dPhi2"]
    assert inc.x_train.shape == (raw.n_train, 17, 3) and inc.y_train.shape == (raw.n_train, 3)
    assert inc.x_loc.shape == (1, 1, 3) and inc.y_loc.shape == (3,) and inc.info["euler_target"] == "increments"
    assert_train_standardised(inc, dims=(0, 1))
    steps = inc.x_to_original(torch.cat([inc.x_train, inc.x_test]))
    assert steps.abs().max() < 1.2  # 0.5° per step (1° over the missing step 6), never ±360°
    assert torch.allclose(torch.cat([inc.y_train_original(), inc.y_test_original()]), torch.tensor(0.5), atol=0.06)
    target = torch.as_tensor(inc.info["target_test"])
    predicted = torch.as_tensor(inc.info["last_test"]) + inc.y_test_original().double()  # x_19 + Δ
    assert wrap_degrees(predicted - target).abs().max() < 1e-3


def test_wrap_degrees():
    assert wrap_degrees(torch.tensor([359.0, -359.0, 181.0, 180.0, -180.0])).tolist() == [-1.0, 1.0, -179.0, -180.0,
                                                                                           -180.0]
    assert np.array_equal(wrap_degrees(np.array([720.5, 0.0])), np.array([0.5, 0.0]))


def test_euler_increments_standardisation_is_unchanged(tmp_path):
    """The increments are standardised exactly as lab's former ``_standardised_sequences`` did:
    mean / sd (ddof 0) of the training split over pixels and steps per angle for x, per angle for y."""
    _write_euler(tmp_path / "euler", n_pixels=60, wrap_pixel=True)
    raw = load_euler(tmp_path / "euler", seed=2)
    inc = euler_increments(raw)

    def increments(x, y):
        x = np.unwrap(raw.x_to_original(x).double().numpy(), period=360.0, axis=1)
        return np.diff(x, axis=1), wrap_degrees(raw.y_to_original(y).double().numpy() - x[:, -1, :])

    x_tr, y_tr = increments(raw.x_train, raw.y_train)
    x_te, y_te = increments(raw.x_test, raw.y_test)
    x_loc, x_scale = x_tr.mean((0, 1), keepdims=True), x_tr.std((0, 1), keepdims=True)
    y_loc, y_scale = y_tr.mean(0), y_tr.std(0)
    expected = {
        "x_train": (x_tr - x_loc) / x_scale, "x_test": (x_te - x_loc) / x_scale,
        "y_train": (y_tr - y_loc) / y_scale, "y_test": (y_te - y_loc) / y_scale,
        "x_loc": x_loc, "x_scale": x_scale, "y_loc": y_loc, "y_scale": y_scale,
    }
    for name, value in expected.items():
        assert torch.equal(getattr(inc, name), torch.as_tensor(value.astype(np.float32))), name


def test_euler_increments_spec_in_load_dataset_and_cli(tmp_path):
    _write_euler(tmp_path / "euler", n_pixels=42, wrap_pixel=True)
    folder = tmp_path / "euler"
    via_spec = load_dataset(f"euler-increments:{folder}", seed=0)
    direct = euler_increments(load_euler(folder, seed=0))
    assert via_spec.name == "euler-increments" and torch.equal(via_spec.x_train, direct.x_train)
    assert torch.equal(via_spec.y_test, direct.y_test)
    out = tmp_path / "run"
    assert main(["fit", "--data", f"euler-increments:{folder}", "--model", "multilstm", "--stochastic", "last",
                 "--backend", "map", "--epochs", "2", "--quiet", "--out", str(out)]) == 0
    assert (out / "COMPLETE").is_file()
