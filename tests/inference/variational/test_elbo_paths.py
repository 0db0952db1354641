"""The ``svi`` backend's fused ELBO path for ``AutoNormal``: same estimator, same numbers, fallbacks.

The conjugate linear-regression recovery on the fused path is ``tests/inference/variational/test_svi.py``'s
``test_svi_recovers_conjugate_posterior_mean`` (it asserts the path).
"""
import dataclasses

import pyro
import pytest
import torch
import pyro.distributions as dist
from torch import nn

from inference import fit, load_posterior
from inference.backends.svi import SVIConfig
from inference.variational.guides import build_guide, fused_elbo_blocker
from inference.variational.elbo_paths import choose_elbo_path
from inference.variational.fit import trace_particle
from zoo import (
    BayesianNetwork,
    CategoricalLikelihood,
    FanInNormalPrior,
    GaussianLikelihood,
    LaplacePrior,
    NormalPrior,
    PretrainedNormalPrior,
    StudentTPrior,
)
from zoo.priors import Prior


class VaryingScaleNormalPrior(Prior):
    """Normal(0.1, s) with an sd that differs entry by entry (a tensor prior scale in the fused KL)."""

    def _base(self, site):
        scale = torch.linspace(0.5, 1.5, site.numel).reshape(site.shape)
        return dist.Normal(torch.full(site.shape, 0.1), scale)


def small_net():
    torch.manual_seed(2)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def data(n=24, classes=False):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, 3, generator=g)
    y = torch.randint(0, 2, (n,), generator=g) if classes else torch.randn(n, 2, generator=g)
    return x, y


CASES = {
    "normal-fixed-noise": lambda: BayesianNetwork(small_net(), "all", prior=NormalPrior(0.7), output_dim=2),
    "fan-in-learned-noise": lambda: BayesianNetwork(
        small_net(), "all", prior=FanInNormalPrior(), likelihood=GaussianLikelihood(learn_noise=True), output_dim=2
    ),
    "pretrained-last-layer": lambda: BayesianNetwork(small_net(), "last", prior=PretrainedNormalPrior(0.3), output_dim=2),
    "varying-scale-classes": lambda: BayesianNetwork(
        small_net(), "all", prior=VaryingScaleNormalPrior(), likelihood=CategoricalLikelihood(), output_dim=2
    ),
}


def spread_guide(bnn, seed=3):
    """A guide with non-trivial means and sds (so KL and noise terms all matter)."""
    guide = build_guide("normal", bnn, init_scale=0.3)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in guide.named_parameters():
            param.add_(0.3 * torch.randn(param.shape, generator=g))
    return guide


def terms_and_grads(particle, params):
    ell, kl = particle()
    loss = kl - ell
    grads = torch.autograd.grad(loss, params)
    return torch.stack([ell.detach(), kl.detach()]), torch.cat([g.reshape(-1) for g in grads])


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("batch", [None, 8])
def test_fused_and_trace_paths_give_the_same_numbers_for_a_seed(case, batch):
    bnn = CASES[case]()
    assert fused_elbo_blocker(bnn, "normal") is None
    x, y = data(classes=case.endswith("classes"))
    guide = spread_guide(bnn)
    params = list(guide.parameters()) + bnn.deterministic_parameters()
    n = batch or x.shape[0]
    pyro.set_rng_seed(10)  # three consecutive draws: the random streams stay aligned draw after draw
    fused = [terms_and_grads(lambda: guide.elbo_terms(bnn, x[:n], y[:n], x.shape[0]), params) for _ in range(3)]
    pyro.set_rng_seed(10)
    trace = [terms_and_grads(lambda: trace_particle(bnn, guide, x[:n], y[:n], x.shape[0]), params) for _ in range(3)]
    for (fused_terms, fused_grad), (trace_terms, trace_grad) in zip(fused, trace):
        torch.testing.assert_close(fused_terms, trace_terms, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(fused_grad, trace_grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["fan-in-learned-noise", "varying-scale-classes"])
def test_fused_elbo_and_gradients_agree_with_the_trace_path_in_expectation(case):
    """Independent draws (different seeds): means agree within Monte Carlo error."""
    bnn = CASES[case]()
    x, y = data(classes=case.endswith("classes"))
    guide = spread_guide(bnn)
    params = list(guide.parameters()) + bnn.deterministic_parameters()
    draws = 1500
    pyro.set_rng_seed(100)
    fused = [terms_and_grads(lambda: guide.elbo_terms(bnn, x[:8], y[:8], 24), params) for _ in range(draws)]
    pyro.set_rng_seed(200)
    trace = [terms_and_grads(lambda: trace_particle(bnn, guide, x[:8], y[:8], 24), params) for _ in range(draws)]
    for index in (0, 1):  # (terms, gradient)
        a = torch.stack([d[index] for d in fused]).double()
        b = torch.stack([d[index] for d in trace]).double()
        se = ((a.var(0) + b.var(0)) / draws).sqrt()
        gap = (a.mean(0) - b.mean(0)).abs()
        # each gap / se ~ |N(0, 1)| under equal expectations (a few dozen coordinates): 5 se is far in
        # the tail; float32 rounding (relative 1e-5) covers the terms with no Monte Carlo noise (the KL)
        assert (gap <= 5 * se + 1e-5 * b.mean(0).abs() + 1e-6).all(), (index, gap / se)
    # the draws are random (not one fixed value) — the comparison above is not vacuous
    assert torch.stack([d[0][0] for d in fused]).std() > 0.1


def test_svi_backend_takes_the_fused_path_and_matches_the_trace_fit_for_a_seed():
    x, y = data(n=30)
    fits = {}
    for path in ("auto", "pyro-trace"):
        bnn = BayesianNetwork(small_net(), "last", prior=NormalPrior(0.7), likelihood=GaussianLikelihood(learn_noise=True),
                              output_dim=2)
        fits[path] = fit(bnn, x, y, backend="svi", seed=4, progress=False, epochs=15, batch_size=8, num_particles=2,
                         kl_warmup_epochs=2, kl_anneal_epochs=3, elbo_path=path)
    fused, trace = fits["auto"], fits["pyro-trace"]
    assert fused.info["elbo_path"] == "fused" and "elbo_path_reason" not in fused.info
    assert trace.info["elbo_path"] == "pyro-trace" and "requested" in trace.info["elbo_path_reason"]
    a, b = fused.guide.state_dict(), trace.guide.state_dict()
    assert list(a) == list(b)  # the same parameters, so the same saved form
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-4)
    for p, q in zip(fused.bnn.deterministic_parameters(), trace.bnn.deterministic_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.tensor(fused.info["history"]["loss"]), torch.tensor(trace.info["history"]["loss"]),
                               rtol=1e-4, atol=1e-3)


class OwnModel(BayesianNetwork):
    def model(self, x=None, y=None, num_data=None):
        return super().model(x, y, num_data)


@pytest.mark.parametrize(
    "make, guide, reason",
    [
        (lambda: BayesianNetwork(small_net(), "all", prior=LaplacePrior(1.0), output_dim=2), "normal", "Laplace prior"),
        (lambda: BayesianNetwork(small_net(), "all", prior=StudentTPrior(), output_dim=2), "normal", "StudentT prior"),
        (lambda: BayesianNetwork(small_net(), "all", output_dim=2), "mean-field", "not the built-in"),
        (lambda: BayesianNetwork(small_net(), "all", output_dim=2), "radial", "not the built-in"),
        (lambda: BayesianNetwork(small_net(), "none", output_dim=2), "normal", "no latent sites"),
        (lambda: OwnModel(small_net(), "all", output_dim=2), "normal", "overrides the Pyro model"),
    ],
)
def test_other_models_and_guides_fall_back_to_pyro_traces(make, guide, reason):
    bnn = make()
    path, why = choose_elbo_path(bnn, SVIConfig(guide=guide))
    assert path == "pyro-trace" and reason in why
    with pytest.raises(ValueError, match="elbo_path='fused' is not available.*" + reason):
        choose_elbo_path(bnn, SVIConfig(guide=guide, elbo_path="fused"))


def test_fallback_is_recorded_and_a_laplace_fit_still_trains():
    x, y = data()
    bnn = BayesianNetwork(small_net(), "all", prior=LaplacePrior(1.0), output_dim=2)
    post = fit(bnn, x, y, backend="svi", seed=0, progress=False, epochs=3, batch_size=None)
    assert post.info["elbo_path"] == "pyro-trace" and "Laplace" in post.info["elbo_path_reason"]
    with pytest.raises(ValueError, match="unknown elbo_path"):
        dataclasses.replace(SVIConfig(), elbo_path="fast").validate()
    with pytest.raises(ValueError, match="elbo_path"):
        fit(bnn, x, y, backend="svi", progress=False, elbo_path="fast")


def test_fused_posterior_saves_and_loads_like_a_trace_posterior(tmp_path):
    x, y = data()
    posts = {}
    for path in ("auto", "pyro-trace"):
        bnn = BayesianNetwork(small_net(), "all", likelihood=GaussianLikelihood(learn_noise=True), output_dim=2)
        posts[path] = fit(bnn, x, y, backend="svi", seed=1, progress=False, epochs=5, batch_size=None, elbo_path=path)
        posts[path].save(tmp_path / path)
    loaded = {path: load_posterior(tmp_path / path) for path in posts}
    assert loaded["auto"].info["elbo_path"] == "fused"
    assert list(loaded["auto"].guide.state_dict()) == list(loaded["pyro-trace"].guide.state_dict())
    a = posts["auto"].predict(x, num_samples=20, y=y, seed=3)
    b = loaded["auto"].predict(x, num_samples=20, y=y, seed=3)
    assert torch.equal(a.f, b.f) and torch.equal(a.log_lik, b.log_lik)
    c = loaded["pyro-trace"].predict(x, num_samples=20, y=y, seed=3)
    torch.testing.assert_close(a.f, c.f, rtol=1e-4, atol=1e-4)  # same seed, same fit up to float error
