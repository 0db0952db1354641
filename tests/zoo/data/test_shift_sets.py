"""Tests of the shift datasets: rotated digits, held-out-class digits and UCI gap splits (zoo.data)."""

import numpy as np
import pytest
import torch

from zoo.data import (
    DataError,
    ShiftSet,
    gap_split,
    load_dataset,
    load_digits_dataset,
    load_digits_ood,
    load_rotated_digits,
    load_uci,
    load_uci_gap,
    rotate_images,
    rotation_angles,
)
from zoo.data.digits_shift import parse_classes
from zoo.data.sklearn_sets import digits_split

# ---------------------------------------------------------------------------------- rotation


def _images(n=3, seed=0):
    return np.random.default_rng(seed).uniform(0, 1, size=(n, 8, 8))


def test_rotation_by_0_is_the_identity_and_by_90_180_270_the_grid_rotations():
    images = _images()
    assert np.array_equal(rotate_images(images, 0.0), images)
    assert np.allclose(rotate_images(images, 90.0), np.rot90(images, 1, axes=(1, 2)), atol=1e-12)
    assert np.allclose(rotate_images(images, 180.0), images[:, ::-1, ::-1], atol=1e-12)
    assert np.allclose(rotate_images(images, 270.0), np.rot90(images, 3, axes=(1, 2)), atol=1e-12)
    assert np.allclose(rotate_images(rotate_images(images, 90.0), -90.0), images, atol=1e-12)


def test_a_45_degree_rotation_is_bilinear_about_the_centre():
    """A centred 2x2 blob is symmetric under 90° turns; at 45° its centre pixels keep bilinear weights."""
    image = np.zeros((1, 8, 8))
    image[0, 3:5, 3:5] = 1.0
    turned = rotate_images(image, 45.0)[0]
    assert np.allclose(turned, np.rot90(turned), atol=1e-12)  # symmetric about the centre
    # centre pixel (3, 3) at offset (−0.5, −0.5) from the centre: its source is at distance 0.707 along an axis,
    # i.e. (3.5 − 0.707, 3.5) -> rows 2.79: bilinear between rows 2 (0) and 3 (1) with weight 0.79 -> 0.79
    assert turned[3, 3] == pytest.approx(3.5 - np.sqrt(0.5) - 2.0, abs=1e-9)
    assert 0.0 <= turned.min() and turned.max() <= 1.0


def test_rotation_refuses_bad_images_and_angles():
    with pytest.raises(DataError, match=r"\[N, H, W\]"):
        rotate_images(np.zeros((8, 8)), 10.0)
    with pytest.raises(DataError, match="finite number of degrees"):
        rotate_images(_images(), float("nan"))


def test_rotation_angles_cover_0_to_180():
    assert rotation_angles() == tuple(float(a) for a in range(0, 181, 15))
    assert rotation_angles(50) == (0.0, 50.0, 100.0, 150.0)
    assert rotation_angles(180) == (0.0, 180.0)


def test_rotated_digits_score_rotated_copies_of_the_test_images():
    data = load_rotated_digits(step=90, seed=1)
    x_train, x_test, y_train, y_test = digits_split(0.25, 1)
    assert [s.value for s in data.shift_sets] == [0.0, 90.0, 180.0]
    assert all(s.kind == "rotation" and torch.equal(s.y, data.y_test) for s in data.shift_sets)
    assert torch.equal(data.y_test, torch.as_tensor(y_test))  # the digits split of the same seed
    assert torch.equal(data.shift_sets[0].x, data.x_test)
    scale, loc = data.x_scale[0], data.x_loc[0]
    assert torch.all(data.x_scale == scale) and torch.all(data.x_loc == loc)  # one pixel scale
    assert float(loc) == pytest.approx(x_train.mean(), rel=1e-5) and float(scale) == pytest.approx(x_train.std(), rel=1e-5)
    turned = (data.shift_sets[1].x * scale + loc).reshape(-1, 8, 8).double().numpy()
    assert np.allclose(turned, np.rot90(x_test.reshape(-1, 8, 8), 1, axes=(1, 2)), atol=1e-5)
    assert data.summary()["shift_sets"] == {"rotation 0°": 450, "rotation 90°": 450, "rotation 180°": 450}


@pytest.mark.parametrize("spec", ["digits-rotated:0", "digits-rotated:200", "digits-rotated:abc", "digits-rotated:nan"])
def test_a_bad_rotation_step_names_the_option(spec):
    with pytest.raises(DataError, match=r"digits-rotated:STEP .*\(0, 180\]"):
        load_dataset(spec)


def test_rotation_angles_outside_0_180_are_refused():
    with pytest.raises(DataError, match=r"\[0, 180\].*got \[200.0\]"):
        load_rotated_digits(angles=[0, 200])


def test_the_registry_reaches_the_shift_datasets_by_name():
    rotated = load_dataset("digits-rotated:45", seed=2)
    assert rotated.name == "digits-rotated" and [s.value for s in rotated.shift_sets] == [0, 45, 90, 135, 180]
    assert len(load_dataset("digits-rotated").shift_sets) == 13
    assert load_dataset("digits-ood").target_names == ["0", "1", "2", "3", "4"]
    assert load_dataset("uci-gap:yacht", split=5).info["gap_feature"] == "froude_number"
    assert load_digits_dataset().shift_sets == ()


# ---------------------------------------------------------------------------------- held-out classes


def test_held_out_classes_are_out_of_distribution_and_labels_renumbered():
    data = load_digits_ood("1,3,5,7", seed=0)
    _, x_test, _, y_test = digits_split(0.25, 0)
    inside = np.isin(y_test, [1, 3, 5, 7])
    assert data.num_classes == 4 and data.target_names == ["1", "3", "5", "7"]
    assert torch.equal(data.y_test, torch.as_tensor(np.searchsorted([1, 3, 5, 7], y_test[inside])))
    (ood,) = data.shift_sets
    assert ood.kind == "ood" and ood.y is None and ood.x.shape == (int((~inside).sum()), 64)
    loc, scale = data.x_loc[0], data.x_scale[0]
    assert torch.allclose(ood.x * scale + loc, torch.as_tensor(x_test[~inside], dtype=torch.float32), atol=1e-5)
    assert int(data.y_train.max()) == 3 and data.info["held_out_classes"] == [0, 2, 4, 6, 8, 9]


def test_class_lists_parse_ranges_and_lists():
    assert parse_classes("0-4") == (0, 1, 2, 3, 4)
    assert parse_classes("7,0-2") == (0, 1, 2, 7)
    assert parse_classes([3, 1]) == (1, 3)


@pytest.mark.parametrize("text, detail", [("0-9", "between 2 and 9"), ("3", "between 2 and 9"),
                                          ("0,12", "not digits"), ("1,1,2", "distinct"), ("a-b", "range or a comma")])
def test_bad_class_lists_name_the_option(text, detail):
    with pytest.raises(DataError, match=f"digits-ood:CLASSES.*{detail}"):
        load_dataset(f"digits-ood:{text}")


def test_a_shift_set_must_match_the_dataset():
    data = load_digits_ood()
    with pytest.raises(DataError, match="shaped like the test inputs"):
        type(data)(**{**data.__dict__, "shift_sets": (ShiftSet("bad", "ood", float("nan"), torch.zeros(3, 5)),)})
    with pytest.raises(DataError, match="must have labels"):
        type(data)(**{**data.__dict__, "shift_sets": (ShiftSet("bad", "rotation", 0.0, torch.zeros(3, 64)),)})
    with pytest.raises(DataError, match="labels"):
        type(data)(**{**data.__dict__, "shift_sets": (
            ShiftSet("bad", "rotation", 0.0, torch.zeros(2, 64), torch.tensor([0, 7])),)})


# ---------------------------------------------------------------------------------- UCI gap splits


def test_a_gap_split_holds_out_the_middle_third_of_the_sorted_rows():
    values = np.random.default_rng(0).permutation(308).astype(float)  # distinct values 0..307
    train, test = gap_split(values)
    assert len(test) == 102 and len(train) == 206  # round(308/3) .. round(616/3)
    assert np.intersect1d(train, test).size == 0 and np.array_equal(np.union1d(train, test), np.arange(308))
    assert sorted(values[test]) == list(range(103, 205))
    assert (values[train] < 103).sum() == 103 and (values[train] >= 205).sum() == 103


def test_tied_values_are_split_in_file_order():
    values = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 2.0])  # sorted (stable): rows 1, 4, 0, 2, 3, 5
    train, test = gap_split(values)
    assert test.tolist() == [0, 2] and train.tolist() == [1, 3, 4, 5]


def test_uci_gap_splits_one_per_feature_with_training_statistics():
    standard = load_uci("bostonHousing", split=0)
    data = load_uci_gap("bostonHousing", split=0)  # CRIM: no ties at the boundaries, a clean gap
    raw = np.loadtxt(data.info["source"] + "/data.txt")[:, 0]
    assert data.info["n_splits"] == standard.input_dim == 13 and data.split == 0
    assert data.n_test == 168 and data.n_train == 338
    x_train = data.x_to_original(data.x_train)[:, 0].double().numpy()
    x_test = data.x_to_original(data.x_test)[:, 0].double().numpy()
    assert x_test.min() > np.sort(raw)[168] - 1e-4 and x_test.max() < np.sort(raw)[337] + 1e-4
    assert ((x_train < x_test.min()) | (x_train > x_test.max())).all()
    assert data.info["test_rows_sharing_values"] == 0 and data.info["gap_feature"] == "CRIM"
    assert abs(float(data.x_train.mean())) < 1e-4  # standardised with the training rows
    tied = load_uci_gap("energy", split=4)  # overall_height takes two values: no gap in it
    assert tied.info["test_rows_sharing_values"] == tied.n_test


@pytest.mark.parametrize("split", [8, -1, 2.0, True])
def test_a_gap_split_outside_the_features_names_the_option(split):
    with pytest.raises(DataError, match=r"--split .* uci-gap:energy.*features 0\.\.7 \(0=relative_compactness"):
        load_dataset("uci-gap:energy", split=split)
