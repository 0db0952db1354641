"""The Pyro-native view (``bnn.to_pyro_module()``) and ``bnn.model`` under stock Pyro.

The PyroModule copy must have the same sample sites and the same log joint density as
``bnn.model`` for every kind of selection (all, last, module glob, element masks), stock
``pyro.infer.SVI`` must train the deterministic weights of ``bnn.model`` while our own
``fit`` gives the same numbers as without the registration, and ``Predictive`` and
``az.from_pyro`` must work on ``bnn.model``.
"""
from __future__ import annotations

import copy
import pickle
import warnings

import arviz as az
import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import MCMC, NUTS, SVI, Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from torch import nn

import zoo.bnn
from inference import fit
from zoo import BayesianNetwork, CategoricalLikelihood, ElementMasks, GaussianLikelihood, LaplacePrior
from zoo.architectures import MultiLSTM
from zoo.pyro_module import pointwise_log_likelihood


class Net(nn.Module):
    def __init__(self, outputs=1):
        super().__init__()
        self.fc1 = nn.Linear(3, 6)
        self.out = nn.Linear(6, outputs)

    def forward(self, x):
        return self.out(torch.tanh(self.fc1(x)))


def _data(n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return x, torch.sin(x[:, :1]) + 0.1 * torch.randn(n, 1, generator=g)


def _mask():
    g = torch.Generator().manual_seed(3)
    return torch.rand(6, 3, generator=g) > 0.5


SELECTIONS = {
    "all": "all",
    "last": "last",
    "glob": "fc*",
    "masks": ElementMasks({"fc1.weight": _mask(), "out.bias": torch.tensor([True])}, fixed_values=0.25),
}


def _bnn(stochastic="last", likelihood=None, **kwargs):
    torch.manual_seed(0)
    x, _ = _data()
    likelihood = likelihood or GaussianLikelihood(learn_noise=True)
    return BayesianNetwork(Net(), stochastic=stochastic, likelihood=likelihood, example_input=x, **kwargs)


def _sample_sites(trace):
    return {n: s for n, s in trace.nodes.items() if s["type"] == "sample" and not s["is_observed"] and n != "data"}


def _compare(bnn, module, x, y, num_data):
    reference = poutine.trace(bnn.model).get_trace(x, y, num_data)
    values = {n: s["value"] for n, s in _sample_sites(reference).items()}
    converted = poutine.trace(poutine.condition(module, data=values)).get_trace(x, y, num_data)
    shapes = lambda t: [(n, tuple(s["value"].shape)) for n, s in t.nodes.items() if s["type"] == "sample"]
    assert shapes(converted) == shapes(reference)
    # the same float32 operations in the same order: equal to rounding of the sum
    assert torch.allclose(converted.log_prob_sum(), reference.log_prob_sum(), rtol=1e-6)
    assert torch.equal(converted.nodes["_RETURN"]["value"], reference.nodes["_RETURN"]["value"])
    return values


@pytest.mark.parametrize("selection", list(SELECTIONS))
def test_pyro_module_has_the_sites_and_log_joint_of_model(selection):
    bnn = _bnn(SELECTIONS[selection])
    module = bnn.to_pyro_module()
    assert isinstance(module, pyro.nn.PyroModule)
    x, y = _data()
    values = _compare(bnn, module, x, y, num_data=100)  # minibatch of 24 out of 100: likelihood × 100/24
    assert sorted(values) == sorted(bnn.site_names)
    deterministic = {n for n, p in bnn.net.named_parameters() if p.requires_grad}
    assert {n for n, _ in module.named_parameters()} == deterministic
    if selection == "masks":
        site = bnn.site("fc1.weight")
        assert values["fc1.weight"].shape == (int(_mask().sum()),)
        seen = []  # the weight fc1 reads during a call (outside a call PyroSample ignores handlers)
        module.fc1.register_forward_pre_hook(lambda m, args: seen.append(m.weight))
        poutine.condition(module, data=values)(x, y)
        weight = seen[0]
        assert weight.shape == (6, 3)
        assert torch.equal(weight[_mask()], values["fc1.weight"])
        assert bool((weight[~_mask()] == 0.25).all()) and torch.equal(weight, site.to_param(values["fc1.weight"]))


def test_pyro_module_survives_copy_and_pickle():
    bnn = _bnn(SELECTIONS["masks"])
    module = bnn.to_pyro_module()
    x, y = _data()
    for twin in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        assert type(twin) is type(module) and type(twin.fc1) is type(module.fc1)
        _compare(bnn, twin, x, y, num_data=None)


def test_pyro_module_classification_and_prototype_trace():
    x, _ = _data()
    labels = (x[:, 0] > 0).long()
    torch.manual_seed(0)
    bnn = BayesianNetwork(Net(outputs=2), stochastic="last", likelihood=CategoricalLikelihood(), example_input=x)
    module = bnn.to_pyro_module()
    _compare(bnn, module, x, labels, num_data=None)
    # without x only the latent sites are sampled, as in bnn.model
    assert list(_sample_sites(poutine.trace(module).get_trace())) == bnn.site_names


def test_pyro_module_is_a_copy_with_frozen_weights_as_buffers():
    bnn = _bnn("last", train_deterministic=False)
    before = {k: v.clone() for k, v in bnn.state_dict().items()}
    module = bnn.to_pyro_module()
    assert list(module.named_parameters()) == []  # frozen fc1 became buffers, out is sampled
    assert {n for n, _ in module.named_buffers()} == {"fc1.weight", "fc1.bias"}
    module.fc1.bias.add_(1.0)
    assert all(torch.equal(v, before[k]) for k, v in bnn.state_dict().items())
    # .double() converts the sites, so the priors follow
    module.double()
    trace = poutine.trace(module).get_trace(_data()[0].double(), _data()[1].double())
    assert trace.nodes["out.weight"]["value"].dtype == torch.float64
    assert trace.log_prob_sum().dtype == torch.float64


def test_fused_lstm_parameters_are_a_clear_error():
    x = torch.randn(4, 3, 1)
    net = lambda: MultiLSTM(input_size=1, hidden_size=2, n_outputs=1, names=("a",))
    bnn = BayesianNetwork(net(), stochastic="all", example_input=x)
    with pytest.raises(NotImplementedError, match="unrolled=True"):
        bnn.to_pyro_module()
    # the heads of a fused LSTM can be random: its own weights stay ordinary parameters
    last = BayesianNetwork(net(), stochastic="last", example_input=x)
    _compare(last, last.to_pyro_module(), x, torch.randn(4, 1), num_data=None)


def _stock_svi(model, guide, x, y, steps=30):
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.02}), Trace_ELBO())
    return [svi.step(x, y) for _ in range(steps)]


def test_stock_svi_trains_the_deterministic_weights_of_model():
    bnn = _bnn("last")
    before = {k: v.clone() for k, v in bnn.net.state_dict().items()}
    x, y = _data()
    _stock_svi(bnn.model, AutoNormal(bnn.model), x, y)
    after = bnn.net.state_dict()
    assert not torch.equal(after["fc1.weight"], before["fc1.weight"])
    assert not torch.equal(after["fc1.bias"], before["fc1.bias"])
    # the random parameters' slots in bnn.net are never read, and stay as they were
    assert torch.equal(after["out.weight"], before["out.weight"])
    # the network's parameters stay in the network: the store holds the guide's only
    assert all(k.startswith("AutoNormal.") for k in pyro.get_param_store().keys())
    pickle.dumps(bnn)


def test_stock_svi_keeps_frozen_weights_and_trains_the_copy_only():
    frozen = _bnn("last", train_deterministic=False)
    before = frozen.net.fc1.weight.detach().clone()
    x, y = _data()
    _stock_svi(frozen.model, AutoNormal(frozen.model), x, y, steps=5)
    assert torch.equal(frozen.net.fc1.weight, before)
    pyro.clear_param_store()
    bnn = _bnn("last")
    module = bnn.to_pyro_module()
    _stock_svi(module, AutoNormal(module), x, y, steps=5)
    assert not torch.equal(module.fc1.weight, bnn.net.fc1.weight)
    assert torch.equal(bnn.net.fc1.weight, before)  # the same initial weights (seeded), untouched


@pytest.mark.parametrize("backend", ["svi", "radial"])
def test_our_fit_gives_the_same_numbers_with_and_without_the_registration(monkeypatch, backend):
    # svi on the Pyro-trace path runs bnn.model every step; the Radial guide (module-local
    # parameters) also traces bnn.model inside its own call to find the sites
    x, y = _data()
    options = dict(backend=backend, seed=0, progress=False, epochs=3, batch_size=8)
    if backend == "svi":
        options["elbo_path"] = "pyro-trace"

    def run():
        bnn = _bnn("last", prior=LaplacePrior(1.0) if backend == "svi" else None)
        post = fit(bnn, x, y, **options)
        return post.sample_params(5, seed=1), bnn.net.fc1.weight.detach().clone(), post.info["history"]["loss"]

    with_registration = run()
    assert len(pyro.get_param_store().keys()) == 0  # our fits leave the global store alone
    monkeypatch.setattr(zoo.bnn, "register_parameters", lambda *args: None)
    without = run()
    assert with_registration[2] == without[2]
    assert torch.equal(with_registration[1], without[1])
    assert all(torch.equal(with_registration[0][k], without[0][k]) for k in without[0])


def test_predictive_on_model_and_on_the_pyro_module():
    bnn = _bnn("last")
    x, y = _data()
    guide = AutoNormal(bnn.model)
    _stock_svi(bnn.model, guide, x, y, steps=2)
    draws = Predictive(bnn.model, guide=guide, num_samples=5)(x)
    assert draws["obs"].shape == (5, 24, 1)
    assert draws["out.weight"].reshape(5, -1).shape == (5, 6) and draws["noise_precision"].numel() == 5
    module = bnn.to_pyro_module()
    prior_draws = Predictive(module, num_samples=4)(x)
    assert prior_draws["obs"].shape == (4, 24, 1) and prior_draws["out.bias"].reshape(4, -1).shape == (4, 1)


def test_arviz_from_stock_mcmc_with_log_likelihood():
    bnn = _bnn("last", likelihood=GaussianLikelihood(noise_sd=0.3))
    x, y = _data()
    mcmc = MCMC(NUTS(bnn.model, max_tree_depth=4), num_samples=8, warmup_steps=8, disable_progbar=True)
    mcmc.run(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # from_pyro's own vectorised log-likelihood fails (documented)
        idata = az.from_pyro(mcmc)
    idata.add_groups(log_likelihood=pointwise_log_likelihood(bnn, mcmc.get_samples(group_by_chain=True), x, y))
    assert idata.log_likelihood["obs"].shape == (1, 8, 24)
    # the first draw's pointwise values are the log densities of bnn.model's "obs" site
    first = {k: v[0] for k, v in mcmc.get_samples().items()}
    trace = poutine.trace(poutine.condition(bnn.model, data=first)).get_trace(x, y)
    obs = trace.nodes["obs"]
    expected = obs["fn"].log_prob(obs["value"]).detach().numpy()
    assert idata.log_likelihood["obs"].values[0, 0] == pytest.approx(expected, rel=1e-5, abs=1e-5)
    with pytest.raises(ValueError, match="every latent site"):
        pointwise_log_likelihood(bnn, {"out.weight": torch.zeros(1, 2, 1, 6)}, x, y)


def test_jit_trace_elbo_trains_bnn_model_after_pyro_module():
    """JitTrace_ELBO compiles against Pyro's global parameter store: ``pyro.module("net", bnn.net)``
    puts the network's own trainable tensors there (same objects), after which the compiled ELBO
    trains them and reaches the loss of the uncompiled Trace_ELBO."""
    from pyro.infer import JitTrace_ELBO

    x, y = _data(64)
    final = {}
    for elbo in (Trace_ELBO(num_particles=2), JitTrace_ELBO(num_particles=2)):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        bnn = _bnn("last")
        pyro.module("net", bnn.net)
        before = bnn.net.fc1.weight.detach().clone()
        assert pyro.param("net$$$fc1.weight").unconstrained() is bnn.net.fc1.weight
        svi = SVI(bnn.model, AutoNormal(bnn.model), pyro.optim.Adam({"lr": 2e-2}), elbo)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            losses = [svi.step(x, y) for _ in range(250)]
        assert not torch.equal(bnn.net.fc1.weight.detach(), before), f"{type(elbo).__name__} did not train fc1"
        final[type(elbo).__name__] = sum(losses[-80:]) / 80
    assert abs(final["JitTrace_ELBO"] - final["Trace_ELBO"]) < 0.15 * abs(final["Trace_ELBO"]) + 3, final
