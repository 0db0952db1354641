"""Stochastic selection: which parameters become sample sites, masks, errors."""
import pyro
import pytest
import torch
from torch import nn

from inference import fit
from zoo import BayesianNetwork, ElementMasks, GaussianLikelihood, ModuleNames, PretrainedNormalPrior
from zoo.architectures import MLP, MultiLSTM


def mlp():
    torch.manual_seed(0)
    return MLP(3, 2, hidden=(8, 6))


def sample_site_names(bnn):
    trace = pyro.poutine.trace(bnn.model).get_trace(torch.randn(4, 3), torch.randn(4, 2))
    return [n for n, s in trace.nodes.items() if s["type"] == "sample" and not s["is_observed"] and n != "data"]


@pytest.mark.parametrize(
    "selection, expected",
    [
        ("all", ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "out.weight", "out.bias"]),
        ("last", ["out.weight", "out.bias"]),
        ("fc2", ["fc2.weight", "fc2.bias"]),
        ("fc*", ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]),
        ("out.weight,fc1.bias", ["fc1.bias", "out.weight"]),
        (["fc1", "out.bias"], ["fc1.weight", "fc1.bias", "out.bias"]),
        ("none", []),
    ],
)
def test_only_chosen_parameters_become_sample_sites(selection, expected):
    bnn = BayesianNetwork(mlp(), selection, example_input=torch.randn(2, 3))
    assert [s.name for s in bnn.sites] == expected
    assert sample_site_names(bnn) == expected
    random = set(expected)
    for name, param in bnn.net.named_parameters():
        assert param.requires_grad == (name not in random)


def test_last_follows_multi_head_networks():
    net = MultiLSTM(input_size=3, hidden_size=4)
    bnn = BayesianNetwork(net, "last", output_dim=3)
    assert [s.name for s in bnn.sites] == [
        "head_phi1.weight", "head_phi1.bias", "head_phi.weight", "head_phi.bias", "head_phi2.weight", "head_phi2.bias"
    ]


def test_unknown_module_name_lists_valid_names():
    with pytest.raises(ValueError, match=r"'fc9'.*valid module names: fc1, fc2, out"):
        BayesianNetwork(mlp(), "fc9", output_dim=2)


def test_empty_selection_is_an_error():
    with pytest.raises(ValueError, match="selected no parameters"):
        BayesianNetwork(mlp(), {"fc1.weight": torch.zeros(8, 3, dtype=torch.bool)}, output_dim=2)
    with pytest.raises(ValueError, match="empty stochastic selection"):
        BayesianNetwork(mlp(), " ", output_dim=2)


def test_mask_errors_name_the_problem():
    with pytest.raises(ValueError, match="valid parameter names"):
        ElementMasks({"fc7.weight": torch.ones(2, 2, dtype=torch.bool)}).select(mlp())
    with pytest.raises(ValueError, match=r"shape \(2, 2\), parameter has \(8, 3\)"):
        ElementMasks({"fc1.weight": torch.ones(2, 2, dtype=torch.bool)}).select(mlp())
    with pytest.raises(ValueError, match="bool tensor"):
        ElementMasks({"fc1.weight": torch.ones(8, 3)}).select(mlp())


@pytest.mark.parametrize("fixed", ["current", 0.0, 2.5, "tensor"])
def test_masked_entries_stay_exactly_fixed_after_fitting(fixed):
    net = mlp()
    mask = torch.rand(8, 3, generator=torch.Generator().manual_seed(1)) > 0.5
    current = net.fc1.weight.detach().clone()
    if fixed == "tensor":
        values = {"fc1.weight": torch.arange(24.0).reshape(8, 3)}
        expected = values["fc1.weight"]
    elif fixed == "current":
        values, expected = "current", current
    else:
        values, expected = fixed, torch.full((8, 3), fixed)
    selector = ElementMasks({"fc1.weight": mask, "out.weight": torch.ones(2, 6, dtype=torch.bool)}, fixed_values=values)
    bnn = BayesianNetwork(net, selector, likelihood=GaussianLikelihood(0.3), output_dim=2)
    assert bnn.site("fc1.weight").shape == (int(mask.sum()),)
    x, y = torch.randn(30, 3), torch.randn(30, 2)
    post = fit(bnn, x, y, progress=False, epochs=20, batch_size=None, pretrain_epochs=5, lr=0.05)
    draws = post.sample_params(7, seed=0)
    full = bnn.site("fc1.weight").to_param(draws["fc1.weight"])  # [7, 8, 3]
    assert torch.equal(full[:, ~mask], expected[~mask].expand(7, -1))
    assert not torch.equal(full[0, mask], full[1, mask])  # masked-in entries are random


def test_none_gives_a_deterministic_fit():
    bnn = BayesianNetwork(mlp(), "none", likelihood=GaussianLikelihood(0.3), output_dim=2)
    before = bnn.net.fc1.weight.detach().clone()
    x = torch.randn(40, 3)
    y = x[:, :2] * 2.0
    post = fit(bnn, x, y, progress=False, epochs=200, batch_size=None, lr=0.02)
    assert not torch.equal(before, bnn.net.fc1.weight)  # trained as a point estimate
    pred = post.predict(x, num_samples=30)
    assert pred.num_samples == 1
    assert float(pred.epistemic_sd.max()) == 0.0
    assert float(((pred.mean - y) ** 2).mean()) < 0.1


def test_frozen_deterministic_parameters_do_not_move():
    net = mlp()
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    bnn = BayesianNetwork(net, "last", train_deterministic=False, likelihood=GaussianLikelihood(0.3),
                          example_input=torch.randn(2, 3))
    fit(bnn, torch.randn(20, 3), torch.randn(20, 2), progress=False, epochs=10, batch_size=None)
    for name in ("fc1.weight", "fc2.bias"):
        assert torch.equal(before[name], dict(net.named_parameters())[name])


def test_pretrained_prior_is_centred_at_the_reference_weights():
    net = mlp()
    bnn = BayesianNetwork(net, "out", prior=PretrainedNormalPrior(0.5), output_dim=2)
    prior = bnn.prior_distributions()["out.weight"]
    assert torch.equal(prior.mean, net.out.weight.detach())
    assert torch.allclose(prior.stddev, torch.full((2, 6), 0.5))


def test_bad_prior_and_likelihood_scales_are_rejected():
    from zoo import NormalPrior, make_prior

    with pytest.raises(ValueError, match="positive"):
        NormalPrior(0.0)
    with pytest.raises(ValueError, match="valid priors"):
        make_prior("cauchy")
    with pytest.raises(ValueError, match="noise_sd must be positive"):
        GaussianLikelihood(noise_sd=-1)


def test_module_names_selector_needs_patterns():
    with pytest.raises(ValueError, match="at least one"):
        ModuleNames([])


def test_not_a_module_is_rejected():
    with pytest.raises(ValueError, match="torch.nn.Module"):
        BayesianNetwork(lambda x: x, "all", output_dim=1)
    assert not BayesianNetwork(nn.Linear(2, 1), "all").is_built  # neither output_dim nor example_input: the fit builds it


@pytest.mark.parametrize("stochastic", ["all", {"fc2.weight": torch.rand(6, 8) > 0.5}])
@pytest.mark.parametrize("prior", [None, PretrainedNormalPrior(0.5)])
def test_priors_and_sites_follow_the_module_dtype(stochastic, prior):
    """``bnn.double()`` converts the priors, the latent priors and the sites' tensors with the
    network, so the Pyro model, log_prior and log_joint run in float64 end to end."""
    torch.manual_seed(0)
    bnn = BayesianNetwork(
        mlp(), stochastic, prior=prior, likelihood=GaussianLikelihood(learn_noise=True), output_dim=2
    ).double()
    for name, d in bnn.prior_distributions().items():
        assert d.sample().dtype == torch.float64, name
    for site in bnn.sites:
        assert site.reference.dtype == torch.float64
        assert site.fixed_value is None or site.fixed_value.dtype == torch.float64
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 2, dtype=torch.float64)
    trace = pyro.poutine.trace(bnn.model).get_trace(x, y)
    assert trace.nodes["_RETURN"]["value"].dtype == torch.float64
    values = {name: d.sample((4,)) for name, d in bnn.prior_distributions().items()}
    assert bnn.log_joint(values, x, y).dtype == torch.float64
    bnn.set_target_scaling([1.0, 2.0], [3.0, 4.0])
    assert bnn.target_scale.dtype == torch.float64
    assert bnn.log_likelihood(values, x, y, original_units=True).dtype == torch.float64
    # converting back gives the float32 priors of a freshly built network
    bnn.float()
    fresh = BayesianNetwork(mlp(), stochastic, prior=prior, likelihood=GaussianLikelihood(learn_noise=True), output_dim=2)
    for name, d in bnn.prior_distributions().items():
        other = fresh.prior_distributions()[name]
        assert d.sample().dtype == torch.float32
        point = other.sample()
        assert torch.allclose(d.log_prob(point), other.log_prob(point), rtol=1e-6), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_priors_and_sites_follow_the_module_to_cuda():
    bnn = BayesianNetwork(
        mlp(), {"fc2.weight": torch.rand(6, 8) > 0.5}, likelihood=GaussianLikelihood(learn_noise=True), output_dim=2
    ).to("cuda")
    assert all(d.sample().is_cuda for d in bnn.prior_distributions().values())
    x, y = torch.randn(5, 3, device="cuda"), torch.randn(5, 2, device="cuda")
    assert pyro.poutine.trace(bnn.model).get_trace(x, y).nodes["_RETURN"]["value"].is_cuda
    values = {name: d.sample((4,)) for name, d in bnn.prior_distributions().items()}
    assert bnn.log_joint(values, x, y).is_cuda
