"""Tests of zoo.structured (structured partial stochasticity, Rochussen 2024).

Run with ``-s`` to see the printed patterns.
"""
import pytest
import torch
from torch import nn

from zoo.architectures import MLP, MultiLSTM, SmallCNN, TransformerClassifier
from zoo.structured import (
    STRUCTURED_PRESETS,
    format_pattern,
    heavy_pattern,
    light_pattern,
    preset_masks,
    random_pattern,
    structured_masks,
    symmetric_neuron_counts,
)


def _grid(text: str) -> torch.Tensor:
    """``X`` = fixed, ``.`` = free, one row per line."""
    rows = [line.split() for line in text.strip().splitlines()]
    return torch.tensor([[c == "X" for c in row] for row in rows])


EXPECTED = {
    ("light", 4, 4, False): """
        . . . .
        X . . .
        . X . .
        . . X .""",
    ("light", 6, 5, False): """
        . . . . .
        . . . . .
        X . . . .
        . X . . .
        . . X . .
        . . . X .""",
    ("heavy", 4, 4, False): """
        . . . .
        X . . .
        X X . .
        X X X .""",
    ("heavy", 6, 5, False): """
        . . . . .
        . . . . .
        X . . . .
        X X . . .
        X X X . .
        X X X X .""",
    ("light", 4, 4, True): """
        . . . .
        . . . X
        . . X .
        . X . .""",
    ("heavy", 4, 4, True): """
        . . . .
        . . . X
        . . X X
        . X X X""",
    ("light", 3, 5, False): """
        . . . . .
        X . . . .
        . X . . .""",
    ("heavy", 3, 5, True): """
        . . . . .
        . . X . .
        . X X . .""",
}

_FUNCTIONS = {"light": light_pattern, "heavy": heavy_pattern}


@pytest.mark.parametrize("key", list(EXPECTED), ids=lambda k: f"{k[0]}-{k[1]}x{k[2]}{'-flip' if k[3] else ''}")
def test_pattern_exact(key):
    kind, n_out, n_in, flip = key
    fixed = _FUNCTIONS[kind](n_out, n_in, flip=flip)
    print(f"\n{kind} pattern, W [{n_out}, {n_in}], flip={flip} (X = fixed):\n{format_pattern(fixed)}")
    assert fixed.dtype == torch.bool and fixed.shape == (n_out, n_in)
    assert torch.equal(fixed, _grid(EXPECTED[key]))


@pytest.mark.parametrize("kind", ["light", "heavy"])
@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("n", [1, 2, 5, 12])
def test_square_patterns_give_every_neuron_a_unique_row(kind, flip, n):
    fixed = _FUNCTIONS[kind](n, n, flip=flip)
    assert len({tuple(row.tolist()) for row in fixed}) == n
    expected_count = n - 1 if kind == "light" else n * (n - 1) // 2
    assert int(fixed.sum()) == expected_count
    assert not fixed.all(dim=1).any()  # no neuron loses all its inputs


@pytest.mark.parametrize("pattern", ["light", "heavy"])
def test_network_neurons_unique_when_paper_condition_holds(pattern):
    # [8, 50, 50, 2]: the UCI energy network of Rochussen 2024 (D_fc <= 1 in both hidden layers).
    net = MLP(8, 2, hidden=(50, 50))
    masks, _ = structured_masks(net, pattern=pattern)
    assert symmetric_neuron_counts(net, masks) == {"fc1": 0, "fc2": 0}
    masks, _ = structured_masks(net, pattern=pattern, include_output=True)
    assert symmetric_neuron_counts(net, masks) == {"fc1": 0, "fc2": 0}
    small = MLP(4, 2, hidden=(6, 6))
    masks, _ = structured_masks(small, pattern=pattern)
    assert symmetric_neuron_counts(small, masks) == {"fc1": 0, "fc2": 0}


def test_symmetric_neuron_counts_reports_remaining_symmetry():
    net = MLP(8, 1, hidden=(50,))  # one wide hidden layer: 50 - 8 - 1 + 2 = 43 symmetric neurons
    masks, _ = structured_masks(net, pattern="heavy")
    assert symmetric_neuron_counts(net, masks) == {"fc1": 43}
    vanilla = {n: torch.ones_like(p, dtype=torch.bool) for n, p in net.named_parameters()}
    assert symmetric_neuron_counts(net, vanilla) == {"fc1": 50}


def test_random_pattern_count_and_determinism():
    g = torch.Generator().manual_seed(3)
    fixed = random_pattern(6, 5, 10, g)
    print(f"\nrandom pattern, W [6, 5], 10 fixed:\n{format_pattern(fixed)}")
    assert int(fixed.sum()) == 10
    again = random_pattern(6, 5, 10, torch.Generator().manual_seed(3))
    assert torch.equal(fixed, again)
    with pytest.raises(ValueError, match="n_fixed"):
        random_pattern(2, 2, 5)


@pytest.mark.parametrize("like", ["heavy", "light"])
def test_random_masks_copy_pattern_counts(like):
    net = MLP(5, 2, hidden=(7, 6))
    structured, _ = structured_masks(net, pattern=like)
    randomised, _ = structured_masks(net, pattern="random", random_like=like, seed=1)
    for name in ("fc1.weight", "fc2.weight"):
        assert int((~randomised[name]).sum()) == int((~structured[name]).sum())
    assert not torch.equal(randomised["fc2.weight"], structured["fc2.weight"])
    other, _ = structured_masks(net, pattern="random", random_like=like, seed=2)
    assert not all(torch.equal(other[n], randomised[n]) for n in ("fc1.weight", "fc2.weight"))


def test_masks_cover_every_parameter():
    net = MLP(4, 3, hidden=(6, 5))
    masks, fixed = structured_masks(net, pattern="heavy")
    params = dict(net.named_parameters())
    assert set(masks) == set(params)
    for name, p in params.items():
        assert masks[name].dtype == torch.bool and masks[name].shape == p.shape
    for name in ("fc1.bias", "fc2.bias", "out.weight", "out.bias"):
        assert masks[name].all()
    assert torch.equal(~masks["fc1.weight"], heavy_pattern(6, 4))
    assert torch.equal(~masks["fc2.weight"], heavy_pattern(5, 6, flip=True))  # odd position: flipped
    assert set(fixed) == {"fc1.weight", "fc2.weight"}
    no_alt, _ = structured_masks(net, pattern="heavy", alternate=False)
    assert torch.equal(~no_alt["fc2.weight"], heavy_pattern(5, 6))
    with_out, _ = structured_masks(net, pattern="heavy", include_output=True)
    assert torch.equal(~with_out["out.weight"], heavy_pattern(3, 5))  # position 2: not flipped


def test_fixed_values_zero_constant_map():
    net = MLP(4, 2, hidden=(5, 5))
    masks, zero = structured_masks(net, pattern="heavy", fixed_value="zero")
    for name, values in zero.items():
        assert values.shape == masks[name].shape and (values == 0).all()

    masks, const = structured_masks(net, pattern="heavy", fixed_value="constant", c=2.5)
    w = const["fc1.weight"]
    fixed = ~masks["fc1.weight"]
    print(f"\nheavy ±c values on fc1 [5, 4], c=2.5:\n{w}")
    expected = torch.tensor([2.5, -2.5, 2.5, -2.5, 2.5, -2.5])  # row-major over fixed entries
    torch.testing.assert_close(w[fixed], expected)
    assert (w[~fixed] == 0).all()

    trained = MLP(4, 2, hidden=(5, 5))
    for source in (trained.state_dict(), trained):
        masks, mapped = structured_masks(net, pattern="light", fixed_value="map", pretrained_state=source)
        for name in ("fc1.weight", "fc2.weight"):
            fixed = ~masks[name]
            torch.testing.assert_close(mapped[name][fixed], trained.state_dict()[name][fixed])
            assert (mapped[name][~fixed] == 0).all()


def test_non_mlp_defaults():
    cnn = SmallCNN(image_size=8)
    masks, _ = structured_masks(cnn, pattern="light")
    assert masks["conv1.weight"].all() and masks["out.weight"].all()
    assert not masks["fc1.weight"].all() and not masks["fc2.weight"].all()

    tr = TransformerClassifier(20, 2, d_model=8, n_heads=2, d_ff=16)
    masks, _ = structured_masks(tr, pattern="heavy")
    patterned = sorted(n for n, m in masks.items() if not m.all())
    assert patterned == ["ffn.fc1.weight", "ffn.fc2.weight"]  # not the head, not attention.out_proj

    lstm = MultiLSTM(input_size=3, hidden_size=4)
    with pytest.raises(ValueError, match="no hidden nn.Linear"):
        structured_masks(lstm)
    masks, fixed = structured_masks(lstm, layers=["head_phi"])
    # a [1, 192]-style head has m = min(1, n_in) = 1: a single neuron has no symmetry to break
    assert all(m.all() for m in masks.values()) and fixed == {}

    mlp = MLP(4, 3, hidden=(5,))
    masks, _ = structured_masks(mlp, layers=["out"])
    assert masks["fc1.weight"].all() and torch.equal(~masks["out.weight"], heavy_pattern(3, 5, flip=True))


def test_presets():
    net = MLP(4, 2, hidden=(6, 6))
    trained = MLP(4, 2, hidden=(6, 6)).state_dict()
    for preset, settings in STRUCTURED_PRESETS.items():
        kw = {"pretrained_state": trained} if settings["fixed_value"] == "map" else {}
        masks, fixed = preset_masks(net, preset, **kw)
        direct = structured_masks(net, **settings, **kw)
        assert all(torch.equal(masks[n], direct.stochastic_masks[n]) for n in masks)
        assert set(fixed) == {"fc1.weight", "fc2.weight"}
    _, fixed = preset_masks(net, "light-const", c=0.5)
    assert fixed["fc1.weight"].abs().max() == 0.5
    with pytest.raises(ValueError, match="light-zero, light-const"):
        preset_masks(net, "medium-zero")


def test_error_paths():
    net = MLP(4, 2, hidden=(6, 6))
    with pytest.raises(ValueError, match="valid patterns: light, heavy, random"):
        structured_masks(net, pattern="medium")
    with pytest.raises(ValueError, match="valid fixed values"):
        structured_masks(net, fixed_value="one")
    for c in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="c must be"):
            structured_masks(net, fixed_value="constant", c=c)
    with pytest.raises(ValueError, match="unknown layer 'fc9'.*fc1, fc2, out"):
        structured_masks(net, layers=["fc9"])
    with pytest.raises(ValueError, match="Conv2d.*nn.Linear layers: fc1, fc2, out"):
        structured_masks(SmallCNN(image_size=8), layers=["conv1"])
    with pytest.raises(ValueError, match="pretrained_state"):
        structured_masks(net, fixed_value="map")
    with pytest.raises(ValueError, match="no entry 'fc2.weight'"):
        structured_masks(net, fixed_value="map", pretrained_state={"fc1.weight": torch.zeros(6, 4)})
    with pytest.raises(ValueError, match="expected \\(6, 4\\)"):
        structured_masks(net, fixed_value="map", pretrained_state={"fc1.weight": torch.zeros(4, 6)})
    with pytest.raises(ValueError, match="n_out"):
        light_pattern(0, 3)


def test_masks_usable_with_torch_where():
    """Fixed entries really are held: where(mask, sample, fixed) gives the fixed values."""
    net = MLP(3, 1, hidden=(4, 4))
    masks, fixed = structured_masks(net, pattern="light", fixed_value="constant", c=3.0)
    params = {n: torch.where(masks[n], p.detach(), fixed.get(n, torch.zeros(()))) for n, p in net.named_parameters()}
    w = params["fc2.weight"]
    assert set(w[~masks["fc2.weight"]].abs().tolist()) == {3.0}
    assert isinstance(net, nn.Module)
