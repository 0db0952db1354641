"""Every architecture × stochastic selection builds, fits a few SVI steps and predicts with the right shapes;
fixed entries of element-wise / structured masks stay exactly fixed through fitting."""
import pytest
import torch

from inference import fit, load_posterior
from lab.runs.model import build_model
from lab.runs.spec import RunSpec
from lab.runs.execution import execute
from zoo import BayesianNetwork, CategoricalLikelihood, GaussianLikelihood
from zoo.architectures import build_architecture
from zoo.data import load_uci_full_random_split
from zoo.structured import STRUCTURED_PRESETS, parse_structured, preset_masks

N = 24


def _data(arch):
    """(build kwargs, x, y, task, output_dim) for a tiny problem each architecture reads."""
    g = torch.Generator().manual_seed(0)
    if arch == "mlp":
        return {"input_dim": 5, "output_dim": 2, "hidden": [8, 8]}, torch.randn(N, 5, generator=g), \
            torch.randn(N, 2, generator=g), "regression", 2
    if arch == "lenet300100":
        return {"input_dim": 64, "output_dim": 10}, torch.randn(N, 64, generator=g), \
            torch.randint(0, 10, (N,), generator=g), "classification", 10
    if arch in ("multilstm", "multilstm-unrolled"):
        kw = {"input_dim": 3, "output_dim": 3, "hidden": 6, "unrolled": arch.endswith("unrolled")}
        return kw, torch.randn(N, 7, 3, generator=g), torch.randn(N, 3, generator=g), "regression", 3
    if arch == "cnn":
        return {"input_dim": 64, "output_dim": 10}, torch.randn(N, 1, 8, 8, generator=g), \
            torch.randint(0, 10, (N,), generator=g), "classification", 10
    if arch == "transformer":
        kw = {"input_dim": None, "output_dim": 2, "vocab_size": 20, "d_model": 8, "n_heads": 2, "d_ff": 16, "max_len": 16}
        return kw, torch.randint(0, 20, (N, 6), generator=g), torch.randint(0, 2, (N,), generator=g), \
            "classification", 2
    raise AssertionError(arch)


#: a named (glob) selection per architecture
NAMED = {"mlp": "fc2", "lenet300100": "fc2", "multilstm": "head_phi", "multilstm-unrolled": "lstm_phi1,head_*",
         "cnn": "conv1", "transformer": "ffn.*"}
#: the parameter that gets an element-wise mask
MASKED = {"mlp": "fc1.weight", "lenet300100": "fc2.weight", "multilstm": "head_phi2.weight",
          "multilstm-unrolled": "lstm_phi.weight_hh_l0", "cnn": "fc1.weight", "transformer": "ffn.fc1.weight"}


def _build(arch):
    kw, x, y, task, out = _data(arch)
    name = "multilstm" if arch.startswith("multilstm") else arch
    torch.manual_seed(0)
    net = build_architecture(name, kw.pop("input_dim"), kw.pop("output_dim"), hidden=kw.pop("hidden", None), **kw)
    return net, x, y, task, out


def _selection(arch, selection, net):
    if selection in ("all", "last"):
        return selection
    if selection == "named":
        return NAMED[arch]
    param = dict(net.named_parameters())[MASKED[arch]]
    mask = torch.rand(param.shape, generator=torch.Generator().manual_seed(1)) < 0.5
    return {MASKED[arch]: mask}


ARCHES = ["mlp", "lenet300100", "multilstm", "multilstm-unrolled", "cnn", "transformer"]


@pytest.mark.parametrize("selection", ["all", "last", "named", "masked"])
@pytest.mark.parametrize("arch", ARCHES)
def test_architecture_selection_fits_and_predicts(arch, selection):
    if arch == "multilstm" and selection == "all":
        pytest.skip("random LSTM weights need the vmap-able unrolled LSTM (multilstm-unrolled covers it)")
    net, x, y, task, out = _build(arch)
    likelihood = GaussianLikelihood(learn_noise=True) if task == "regression" else CategoricalLikelihood()
    stochastic = _selection(arch, selection, net)
    before = {k: v.detach().clone() for k, v in net.named_parameters()}
    bnn = BayesianNetwork(net, stochastic=stochastic, likelihood=likelihood, example_input=x[:2])
    assert bnn.sites, "the selection picked no parameter"
    posterior = fit(bnn, x, y, backend="svi", epochs=2, batch_size=12, num_samples=4, progress=False, seed=0)
    pred = posterior.predict(x[:5], num_samples=4, seed=0)
    assert pred.f.shape == (4, 5, out)
    assert torch.isfinite(pred.f).all()
    if selection == "masked":
        site = bnn.site(MASKED[arch])
        draws = posterior.sample_params(3, seed=1)[site.name]
        full = site.to_param(draws)  # [3, *param_shape]
        fixed = ~site.mask
        assert torch.equal(full[:, fixed], before[site.name][fixed].expand(3, -1))
        assert draws.shape == (3, int(site.mask.sum()))


@pytest.mark.parametrize("steps", [1, 3, 12])
def test_multilstm_reads_any_sequence_length(steps):
    net, x, y, _, _ = _build("multilstm")
    bnn = BayesianNetwork(net, stochastic="last", example_input=x[:2], likelihood=GaussianLikelihood(noise_sd=0.5))
    posterior = fit(bnn, x, y, epochs=1, batch_size=12, num_samples=3, progress=False)
    seq = torch.randn(4, steps, 3)
    assert posterior.predict(seq, num_samples=3).f.shape == (3, 4, 3)
    unrolled, *_ = _build("multilstm-unrolled")
    unrolled.load_state_dict(net.state_dict())
    assert torch.allclose(unrolled(seq), net(seq), atol=1e-5)  # same names, same function


def test_build_model_unrolls_multilstm_only_when_lstm_weights_are_random():
    data = _euler_like()
    for stochastic, unrolled in (("all", True), ("last", False), ("none", False)):
        bnn = build_model(RunSpec(data="x", model="multilstm", hidden=[4], stochastic=stochastic), data)
        assert bnn.net.unrolled is unrolled
        draws = {n: v.unsqueeze(0).expand(2, *v.shape) for n, v in bnn.initial_values().items()}
        assert bnn.forward_draws(draws, data.x_test).shape[1:] == (data.n_test, 3)


def _euler_like():
    from zoo.data import Dataset

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(20, 5, 3, generator=g), torch.randn(20, 3, generator=g)
    return Dataset("seq", "regression", x[:16], y[:16], x[16:], y[16:], torch.zeros(1, 1, 3), torch.ones(1, 1, 3),
                   torch.zeros(3), torch.ones(3))


@pytest.fixture(scope="module")
def energy():
    return load_uci_full_random_split("energy", 0.2, 0, standardise_on="all")


@pytest.mark.parametrize("preset", ["heavy-const", "light-zero", "heavy-map", "random-const"])
def test_structured_fixed_values_stay_fixed_after_fitting(preset, energy, tmp_path):
    spec = RunSpec(data="uci:energy", hidden=[12, 12], stochastic=f"structured:{preset}", noise=0.1, epochs=3,
                   pretrain_epochs=0, num_samples=5)
    metrics = execute(spec, tmp_path, progress=False, data=energy).metrics
    posterior = load_posterior(tmp_path / "posterior")
    bnn = posterior.bnn
    torch.manual_seed(0)
    reference = build_architecture("mlp", 8, 1, hidden=[12, 12])
    expected = preset_masks(reference, preset, pretrained_state=reference.state_dict(), seed=0)
    draws = posterior.sample_params(6, seed=3)
    masked = [s for s in bnn.sites if s.mask is not None]
    assert {s.name for s in masked} == {n for n, m in expected.stochastic_masks.items() if not m.all()}
    assert metrics["num_random"] == sum(int(m.sum()) for m in expected.stochastic_masks.values())
    for site in masked:
        assert torch.equal(site.mask, expected.stochastic_masks[site.name])
        full = site.to_param(draws[site.name])
        fixed = ~site.mask
        values = full[:, fixed]
        assert torch.equal(values, site.fixed_value[fixed].expand_as(values)), "a fixed weight moved"
        if STRUCTURED_PRESETS[preset]["fixed_value"] != "map":  # zero / ±c exactly as specified
            assert torch.equal(site.fixed_value[fixed], expected.fixed_values[site.name][fixed])
        else:  # MAP values: those of a deterministic fit, not the initial weights
            assert not torch.equal(site.fixed_value[fixed], reference.state_dict()[site.name][fixed])


def test_structured_selection_string_errors():
    assert parse_structured("all") is None and parse_structured("structured:heavy-zero") == "heavy-zero"
    with pytest.raises(ValueError, match="structured:heavy-zero"):
        parse_structured("structured:medium")
