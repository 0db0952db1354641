"""Tests of zoo.architectures: shapes, names, functional_call / vmap, forward order."""
import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call, vmap

from zoo.architectures import (
    ACTIVATIONS,
    ARCHITECTURES,
    MLP,
    LeNet300100,
    MultiLSTM,
    SelfAttention,
    SmallCNN,
    TransformerClassifier,
    build_architecture,
    output_modules,
    parametrised_modules_in_forward_order,
)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _perturbed(net: nn.Module, scale: float = 0.5) -> dict:
    return {k: v.detach() + scale * torch.randn_like(v) for k, v in net.named_parameters()}


def _assert_vmap_matches_loop(net: nn.Module, x: torch.Tensor, n_sets: int = 3) -> None:
    """vmap over parameter sets equals a loop.  Compared in float64: float32 convolution and
    matmul kernels sum in CPU-dependent orders (errors ~1e-4 over reductions of a few hundred
    terms), whereas float64 leaves ~1e-13, far below any real batching bug."""
    net = copy.deepcopy(net).double()
    x = x.double() if x.is_floating_point() else x
    sets = [_perturbed(net) for _ in range(n_sets)]
    stacked = {k: torch.stack([s[k] for s in sets]) for k in sets[0]}
    with torch.no_grad():
        batched = vmap(lambda p, inp: functional_call(net, p, (inp,)), in_dims=(0, None))(stacked, x)
        looped = torch.stack([functional_call(net, s, (x,)) for s in sets])
    assert batched.shape == looped.shape
    torch.testing.assert_close(batched, looped, rtol=1e-9, atol=1e-9)
    assert not torch.allclose(looped[0], looped[1])  # the parameter sets really differ


def _assert_functional_call_changes_output(net: nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        base = net(x)
        same = functional_call(net, dict(net.named_parameters()), (x,))
        other = functional_call(net, _perturbed(net), (x,))
    torch.testing.assert_close(same, base)
    assert other.shape == base.shape
    assert not torch.allclose(other, base)


# ---------------------------------------------------------------------------- MLP / LeNet


def test_mlp_shapes_and_names():
    net = MLP(4, 2, hidden=(8, 6))
    assert [n for n, _ in net.named_parameters()] == [
        "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "out.weight", "out.bias"
    ]
    assert net(torch.randn(5, 4)).shape == (5, 2)
    assert MLP(3, 1, hidden=()).out.in_features == 3
    assert MLP(3, 1, hidden=7).fc1.out_features == 7


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_mlp_activations(activation):
    assert MLP(3, 2, hidden=(4,), activation=activation)(torch.randn(2, 3)).shape == (2, 2)


def test_mlp_unknown_activation_lists_valid():
    with pytest.raises(ValueError, match="relu, tanh, sigmoid, gelu, elu, silu"):
        MLP(3, 1, activation="swish")


def test_lenet300100_flattens_images():
    net = LeNet300100()
    assert (net.fc1.out_features, net.fc2.out_features, net.out.out_features) == (300, 100, 10)
    assert net(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    assert net(torch.randn(2, 784)).shape == (2, 10)


# ---------------------------------------------------------------------------- MultiLSTM


@pytest.mark.parametrize("steps", [1, 5, 18])
@pytest.mark.parametrize("features", [1, 3])
def test_multilstm_sequence_lengths(steps, features):
    net = MultiLSTM(input_size=features, hidden_size=8)
    assert net(torch.randn(4, steps, features)).shape == (4, 3)


def test_multilstm_figure1_structure():
    net = MultiLSTM()  # defaults: 3 input features, 64 units
    names = dict(net.named_children())
    assert list(names) == ["lstm_phi1", "lstm_phi", "lstm_phi2", "head_phi1", "head_phi", "head_phi2"]
    for n in ("phi1", "phi", "phi2"):
        assert names[f"lstm_{n}"].batch_first
        # Fig. 1: 17,408 = 4*64*(3+64+1) parameters per LSTM, i.e. 3 input features (Keras has
        # one bias vector, PyTorch two: +4*64), and 193 = 192+1 per head.
        assert sum(p.numel() for p in names[f"lstm_{n}"].parameters()) == 17_408 + 4 * 64
        assert sum(p.numel() for p in names[f"head_{n}"].parameters()) == 193
    assert MultiLSTM(input_size=1)(torch.randn(2, 15)).shape == (2, 3)  # [B, T] for one feature


def test_multilstm_heads_read_all_lstms():
    net = MultiLSTM(input_size=3, hidden_size=4)
    x = torch.randn(2, 5, 3)
    base = net(x).detach()
    params = dict(net.named_parameters())
    params["lstm_phi2.weight_ih_l0"] = params["lstm_phi2.weight_ih_l0"] + 1.0
    changed = functional_call(net, params, (x,)).detach()
    assert (changed - base).abs().min() > 0  # every head depends on every LSTM


def test_multilstm_bad_input_and_names():
    with pytest.raises(ValueError, match=r"\[B, T, 3\]"):
        MultiLSTM()(torch.randn(2, 5, 2))
    with pytest.raises(ValueError, match="n_outputs=2"):
        MultiLSTM(n_outputs=2)


def test_multilstm_builds_one_lstm_per_target_whose_head_gives_every_output_of_that_target():
    """A heteroscedastic likelihood (2 outputs per target) on 3 angles: 3 LSTMs, not 6; output
    ``k·3 + t`` (means, then log-variances) comes from target t's LSTM and head."""
    net = build_architecture("multilstm", 3, 6, hidden=4, heads=2)
    children = dict(net.named_children())
    assert list(children) == ["lstm_phi1", "lstm_phi", "lstm_phi2", "head_phi1", "head_phi", "head_phi2"]
    assert all(children[f"head_{n}"].out_features == 2 and children[f"head_{n}"].in_features == 12
               for n in net.names)
    x = torch.randn(5, 7, 3)
    base = net(x).detach()
    assert base.shape == (5, 6)
    params = dict(net.named_parameters())
    params["head_phi.weight"] = params["head_phi.weight"] + 1.0
    changed = (functional_call(net, params, (x,)).detach() - base).abs().amax(0)
    assert changed.nonzero().flatten().tolist() == [1, 4]  # the mean and the log-variance of target 1 only
    with pytest.raises(ValueError, match="heads"):
        build_architecture("multilstm", 3, 6, heads=4)
    with pytest.raises(ValueError, match="n_outputs=3"):
        MultiLSTM(n_outputs=3, heads=2)


def test_multilstm_with_one_head_per_target_is_unchanged():
    """heads=1 keeps the layout (and, for a seed, the weights and outputs) of one Linear(n*H, 1) per angle."""
    torch.manual_seed(3)
    built = build_architecture("multilstm", 3, 3, hidden=4)
    torch.manual_seed(3)
    plain = MultiLSTM(input_size=3, hidden_size=4)
    assert [(n, p.shape) for n, p in built.named_parameters()] == [(n, p.shape) for n, p in plain.named_parameters()]
    assert built.head_phi.weight.shape == (1, 12)
    x = torch.randn(2, 5, 3)
    base = plain(x).detach()
    expected = torch.cat([getattr(plain, f"head_{n}")(torch.cat(
        [getattr(plain, f"lstm_{m}")(x)[1][0][-1] for m in plain.names], -1)) for n in plain.names], -1)
    torch.testing.assert_close(built(x), base)
    torch.testing.assert_close(base, expected.detach())


def test_multilstm_heads_round_trip_through_the_network_spec():
    from inference.storage.net_spec import build_net, net_spec

    net = build_architecture("multilstm", 3, 6, hidden=4, heads=2)
    spec = net_spec(net)
    assert spec["zoo"] == "multilstm" and spec["args"]["heads"] == 2
    rebuilt = build_net(spec)
    rebuilt.load_state_dict(net.state_dict())
    x = torch.randn(2, 5, 3)
    torch.testing.assert_close(rebuilt(x), net(x))
    assert "heads" not in net_spec(MultiLSTM(hidden_size=4))["args"]  # one head per target: the spec as before


def test_multilstm_functional_call_fused():
    """Fused nn.LSTM works under functional_call (but not vmap: no aten::lstm batching rule)."""
    net = MultiLSTM(input_size=3, hidden_size=6)
    _assert_functional_call_changes_output(net, torch.randn(3, 5, 3))


def test_multilstm_unrolled_matches_fused_and_vmaps():
    fused = MultiLSTM(input_size=3, hidden_size=6)
    unrolled = MultiLSTM(input_size=3, hidden_size=6, unrolled=True)
    assert [n for n, _ in fused.named_parameters()] == [n for n, _ in unrolled.named_parameters()]
    unrolled.load_state_dict(fused.state_dict())
    x = torch.randn(3, 7, 3)
    torch.testing.assert_close(unrolled(x), fused(x), rtol=1e-5, atol=1e-6)
    _assert_vmap_matches_loop(unrolled, x)


# ---------------------------------------------------------------------------- CNN


@pytest.mark.parametrize("size", [8, 28])
def test_small_cnn_shapes(size):
    net = SmallCNN(in_channels=1, image_size=size, num_classes=10)
    assert [n for n, _ in net.named_children()] == ["conv1", "conv2", "fc1", "fc2", "out"]
    assert net(torch.randn(2, 1, size, size)).shape == (2, 10)
    assert net(torch.randn(2, size * size)).shape == (2, 10)


def test_small_cnn_rejects_wrong_flat_size():
    with pytest.raises(ValueError, match="64 features"):
        SmallCNN(image_size=8)(torch.randn(2, 60))


# ---------------------------------------------------------------------------- Transformer


def test_transformer_tokens_names_and_shapes():
    net = TransformerClassifier(vocab_size=30, num_classes=2, d_model=16, n_heads=4, d_ff=32, max_len=20)
    names = [n for n, _ in net.named_parameters()]
    assert "ffn.fc1.weight" in names and "ffn.fc2.bias" in names and "head.weight" in names
    assert isinstance(net.attention, nn.MultiheadAttention) and net.attention.batch_first
    assert net(torch.randint(0, 30, (3, 11))).shape == (3, 2)
    with pytest.raises(ValueError, match="max_len=20"):
        net(torch.randint(0, 30, (1, 21)))


def test_transformer_padding_is_ignored():
    net = TransformerClassifier(vocab_size=30, num_classes=3, d_model=16, n_heads=2, d_ff=16, padding_idx=0)
    tokens = torch.randint(1, 30, (2, 6))
    padded = torch.cat([tokens, torch.zeros(2, 4, dtype=torch.long)], dim=1)
    torch.testing.assert_close(net(padded), net(tokens), rtol=1e-5, atol=1e-6)


def test_transformer_real_valued_sequences():
    net = TransformerClassifier(vocab_size=None, num_classes=10, input_dim=8, d_model=16, n_heads=2, d_ff=16)
    x = torch.randn(4, 8, 8)
    assert "input_proj.weight" in dict(net.named_parameters())
    torch.testing.assert_close(net(x.reshape(4, 64)), net(x))  # digits rows as a sequence
    with pytest.raises(ValueError, match="input_dim"):
        TransformerClassifier(vocab_size=None, num_classes=2)


def test_self_attention_matches_multihead_attention():
    ref = nn.MultiheadAttention(8, 2, batch_first=True)
    ours = SelfAttention(8, 2)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 5, 8)
    mask = torch.tensor([[False] * 5, [False, False, False, True, True]])
    expected = ref(x, x, x, key_padding_mask=mask, need_weights=False)[0]
    torch.testing.assert_close(ours(x, key_padding_mask=mask), expected, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- functional_call / vmap

_SMALL_NETS = {
    "mlp": (lambda: MLP(4, 2, hidden=(8, 8)), lambda: torch.randn(5, 4)),
    "lenet300100": (lambda: LeNet300100(), lambda: torch.randn(2, 784)),
    "cnn": (lambda: SmallCNN(image_size=8), lambda: torch.randn(3, 64)),
    "transformer": (
        lambda: TransformerClassifier(20, 2, d_model=8, n_heads=2, d_ff=8, max_len=8),
        lambda: torch.randint(0, 20, (3, 6)),
    ),
    "transformer-real": (
        lambda: TransformerClassifier(None, 2, d_model=8, n_heads=2, d_ff=8, input_dim=3),
        lambda: torch.randn(3, 5, 3),
    ),
}


@pytest.mark.parametrize("name", sorted(_SMALL_NETS))
def test_functional_call_and_vmap(name):
    make_net, make_x = _SMALL_NETS[name]
    net, x = make_net(), make_x()
    _assert_functional_call_changes_output(net, x)
    _assert_vmap_matches_loop(net, x)


# ---------------------------------------------------------------------------- last layer


def test_forward_order_and_output_modules():
    mlp = MLP(4, 2, hidden=(8, 8))
    x = torch.randn(2, 4)
    assert parametrised_modules_in_forward_order(mlp, x) == ["fc1", "fc2", "out"]
    assert output_modules(mlp, x) == ("out",)
    with pytest.raises(ValueError, match="example_input"):
        output_modules(mlp)

    lstm = MultiLSTM(input_size=3, hidden_size=4)
    assert parametrised_modules_in_forward_order(lstm, torch.randn(2, 5, 3))[-3:] == [
        "head_phi1", "head_phi", "head_phi2"
    ]
    assert output_modules(lstm) == ("head_phi1", "head_phi", "head_phi2")

    cnn = SmallCNN(image_size=8)
    assert parametrised_modules_in_forward_order(cnn, torch.randn(1, 64)) == ["conv1", "conv2", "fc1", "fc2", "out"]

    tr = TransformerClassifier(20, 2, d_model=8, n_heads=2, d_ff=8)
    order = parametrised_modules_in_forward_order(tr, torch.randint(0, 20, (1, 4)))
    assert order.index("ffn.fc1") < order.index("ffn.fc2") < order.index("head") == len(order) - 1
    assert output_modules(tr, torch.randint(0, 20, (1, 4))) == ("head",)


def test_forward_order_lists_owners_whose_forward_is_skipped():
    # nn.MultiheadAttention reads out_proj.weight without calling out_proj.
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(1, 3, 8)
    assert parametrised_modules_in_forward_order(mha, (x, x, x)) == ["out_proj", ""]


# ---------------------------------------------------------------------------- registry


def test_build_architecture_defaults():
    assert set(ARCHITECTURES) == {"mlp", "lenet300100", "multilstm", "cnn", "transformer"}
    mlp = build_architecture("mlp", 13, 1)
    assert mlp.hidden == (50,) and mlp.activation == "relu"
    assert build_architecture("mlp", 13, 1, hidden=[20, 20], activation="tanh").hidden == (20, 20)
    assert build_architecture("lenet300100", 784, 10)(torch.randn(1, 784)).shape == (1, 10)
    lstm = build_architecture("multilstm", 3, 3, hidden=16)
    assert lstm(torch.randn(2, 18, 3)).shape == (2, 3)
    two = build_architecture("multilstm", 1, 2, hidden=4)
    assert two(torch.randn(2, 5, 1)).shape == (2, 2) and len(two.last_layer_names) == 2
    assert build_architecture("cnn", 64, 10).image_size == 8
    assert build_architecture("cnn", (1, 28, 28), 10).image_size == 28
    tok = build_architecture("transformer", None, 2, vocab_size=50, d_model=8, n_heads=2)
    assert tok(torch.randint(0, 50, (2, 9))).shape == (2, 2)
    digits = build_architecture("transformer", 64, 10, token_dim=8, hidden=16)
    assert digits.ffn.fc1.out_features == 16 and digits(torch.randn(2, 64)).shape == (2, 10)


def test_build_architecture_errors():
    with pytest.raises(ValueError, match="mlp, lenet300100, multilstm, cnn, transformer"):
        build_architecture("resnet", 3, 1)
    with pytest.raises(ValueError, match="activation"):
        build_architecture("multilstm", 3, 3, activation="tanh")
    with pytest.raises(ValueError, match="300, 100"):
        build_architecture("lenet300100", 784, 10, hidden=(50,))
    with pytest.raises(ValueError, match="in_channels"):
        build_architecture("cnn", 65, 10)


def test_package_reexports_every_public_name_from_its_family_module():
    import importlib

    import zoo.architectures as package

    homes = {
        "mlp": ["MLP", "LeNet300100"],
        "lstm": ["UnrolledLSTM", "MultiLSTM"],
        "cnn": ["SmallCNN"],
        "transformer": ["FeedForward", "SelfAttention", "TransformerClassifier"],
        "registry": ["Architecture", "ARCHITECTURES", "register_architecture", "registered_architecture",
                     "build_architecture"],
        "forward_order": ["parametrised_modules_in_forward_order", "output_modules"],
        "_common": ["ACTIVATIONS"],
    }
    assert sorted(package.__all__) == sorted(name for names in homes.values() for name in names)
    for module, names in homes.items():
        family = importlib.import_module(f"zoo.architectures.{module}")
        for name in names:
            assert getattr(package, name) is getattr(family, name), name
