"""The stacked multi-fit engine (inference.multifit) against one-at-a-time fits."""
import pytest
import torch
from torch import nn

from inference import fit
from inference.optim.batches import minibatches
from inference.fitting import fit_many
from inference.multifit.stacked import StackedBatches
from inference.optim.training import NonFiniteLossError
from zoo import GaussianLikelihood
from zoo.bnn import BayesianNetwork

K = 3


def _model(seed, stochastic="all", d=3):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(d, 8), nn.Tanh(), nn.Linear(8, 1))
    return BayesianNetwork(net, stochastic=stochastic, example_input=torch.zeros(2, d))


def _data(seed, n=40, d=3, scale=1.0):
    g = torch.Generator().manual_seed(100 + seed)
    x = torch.randn(n, d, generator=g)
    return x, scale * (0.7 * x[:, :1] + 0.3 * torch.randn(n, 1, generator=g))


def _stacked(backend, seeds=(10, 11, 12), **options):
    data = [_data(k) for k in range(len(seeds))]
    return fit_many([_model(k) for k in range(len(seeds))], [d[0] for d in data], [d[1] for d in data],
                    backend=backend, seeds=list(seeds), **options), data


MAP_OPTIONS = dict(epochs=15, batch_size=16)
SVI_OPTIONS = dict(epochs=15, batch_size=16, pretrain_epochs=4)


def test_map_matches_one_at_a_time_fits():
    """Different data, inits and seeds per fit: each stacked fit is its own fit, to float rounding."""
    fits, data = _stacked("map", **MAP_OPTIONS)
    for k, posterior in enumerate(fits):
        single = fit(_model(k), *data[k], backend="map", seed=10 + k, progress=False, **MAP_OPTIONS)
        for name, value in single.draws.items():
            torch.testing.assert_close(posterior.draws[name], value, atol=1e-5, rtol=1e-5)
        assert posterior.info["history"]["loss"] == pytest.approx(single.info["history"]["loss"], rel=1e-5)
        assert posterior.info["multifit"] == {"fits": K, "index": k}


def test_svi_matches_one_at_a_time_fits_and_predictions_within_mc_error():
    """Pretraining, guide start, noise draws (each fit continues its own seeded stream) and minibatches are the
    one-at-a-time fit's: parameters agree to float rounding and the predictives within Monte Carlo error."""
    fits, data = _stacked("svi", **SVI_OPTIONS)
    x_test = torch.linspace(-2, 2, 25).unsqueeze(1).expand(-1, 3)
    for k, posterior in enumerate(fits):
        single = fit(_model(k), *data[k], backend="svi", seed=10 + k, progress=False, **SVI_OPTIONS)
        stacked_params = dict(posterior.guide.named_parameters())
        for name, value in single.guide.named_parameters():
            torch.testing.assert_close(stacked_params[name].detach(), value.detach(), atol=1e-4, rtol=1e-4)
        assert posterior.info["elbo_path"] == single.info["elbo_path"] == "fused"
        a = posterior.predict(x_test, num_samples=400, seed=1)
        b = single.predict(x_test, num_samples=400, seed=2)  # independent draws: compare within MC error
        se = (a.sd ** 2 / 400 + b.sd ** 2 / 400).sqrt()
        assert bool(((a.mean - b.mean).abs() < 4 * se).all())
        assert bool(((a.sd / b.sd - 1).abs() < 0.15).all())


def test_radial_matches_one_at_a_time_fits_with_learned_noise_and_sparsity():
    """Radial (exact cross-entropy, fused path): each fit's ε, r, the noise precision's Normal noise and its
    minibatches are the one-at-a-time fit's; parameters agree to float rounding, and the per-epoch rule-based
    sparsity and the info records are the same."""
    def model(seed):
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
        return BayesianNetwork(net, stochastic="all", likelihood=GaussianLikelihood(learn_noise=True), output_dim=1)

    data = [_data(k) for k in range(K)]
    fits = fit_many([model(k) for k in range(K)], [d[0] for d in data], [d[1] for d in data], backend="radial",
                    seeds=[10, 11, 12], **SVI_OPTIONS)
    for k, posterior in enumerate(fits):
        single = fit(model(k), *data[k], backend="radial", seed=10 + k, progress=False, **SVI_OPTIONS)
        stacked_params = dict(posterior.guide.named_parameters())
        assert set(stacked_params) == {name for name, _ in single.guide.named_parameters()}
        for name, value in single.guide.named_parameters():
            torch.testing.assert_close(stacked_params[name].detach(), value.detach(), atol=1e-5, rtol=1e-5)
        history, expected = posterior.info["history"], single.info["history"]
        assert history["loss"] == pytest.approx(expected["loss"], rel=1e-5)
        assert history["sparsity"] == expected["sparsity"] and len(history["sparsity"]) == SVI_OPTIONS["epochs"]
        assert history["layer_sparsity"] == expected["layer_sparsity"]
        assert {key: posterior.info[key] for key in ("mc_kl_estimator", "mc_kl_samples", "elbo_path", "sparsity")} == \
            {key: single.info[key] for key in ("mc_kl_estimator", "mc_kl_samples", "elbo_path", "sparsity")}


@pytest.mark.parametrize("backend", ["map", "svi", "radial"])
def test_a_last_layer_models_body_trains_stacked_as_it_trains_alone(backend):
    """stochastic='last': each fit's deterministic body is stacked, (pre)trained with its sites or guide, and
    written into its own network; the fit and the body equal the one-at-a-time fit's to float rounding."""
    def model(seed):
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
        return BayesianNetwork(net, stochastic="last", likelihood=GaussianLikelihood(learn_noise=True), output_dim=1)

    data = [_data(k) for k in range(K)]
    bnns = [model(k) for k in range(K)]
    start = [bnn.net[0].weight.detach().clone() for bnn in bnns]
    # map: a body's epochs are otherwise chosen on each fit's own held-out rows (not stacked)
    options = {**MAP_OPTIONS, "early_stopping": False} if backend == "map" else SVI_OPTIONS
    fits = fit_many(bnns, [d[0] for d in data], [d[1] for d in data], backend=backend, seeds=[10, 11, 12], **options)
    for k, posterior in enumerate(fits):
        alone = model(k)
        single = fit(alone, *data[k], backend=backend, seed=10 + k, progress=False, **options)
        if backend == "map":
            stacked_params, expected = posterior.draws, single.draws.items()
        else:
            stacked_params, expected = dict(posterior.guide.named_parameters()), single.guide.named_parameters()
        for name, value in expected:
            torch.testing.assert_close(stacked_params[name].detach(), value.detach(), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(bnns[k].net[0].weight, start[k], atol=1e-3)  # the body was trained
        for ours, theirs in zip(bnns[k].net.parameters(), alone.net.parameters()):
            torch.testing.assert_close(ours.detach(), theirs.detach(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend,stochastic", [("sgld", "all"), ("sghmc", "all")])
def test_sgmcmc_fits_stack_their_map_starts_then_run_their_own_chains(backend, stochastic):
    """The samplers' MAP starts train as one program, each equal to its fit's own start; the chains from there
    are the one-at-a-time fit's (draws and default step size to float rounding).  (A last-layer model's start
    chooses its body's epochs on its own held-out rows and is not stacked: tests/inference/optim/test_start.py.)"""
    def model(seed):
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
        return BayesianNetwork(net, stochastic=stochastic, likelihood=GaussianLikelihood(learn_noise=True), output_dim=1)

    options = dict(map_steps=100, num_samples=30, warmup_steps=30, num_chains=2)
    data = [_data(k) for k in range(K)]
    bnns = [model(k) for k in range(K)]
    fits = fit_many(bnns, [d[0] for d in data], [d[1] for d in data], backend=backend, seeds=[10, 11, 12], **options)
    for k, posterior in enumerate(fits):
        alone = model(k)
        single = fit(alone, *data[k], backend=backend, seed=10 + k, progress=False, **options)
        for name, value in single.draws.items():
            torch.testing.assert_close(posterior.draws[name], value, atol=1e-4, rtol=1e-4)
        assert posterior.info["step_size_rule"]["step_size"] == pytest.approx(
            single.info["step_size_rule"]["step_size"], rel=1e-4)
        assert posterior.info["multifit"] == {"fits": K, "index": k} and posterior.info["map_steps"] == single.info["map_steps"]
        for ours, theirs in zip(bnns[k].net.parameters(), alone.net.parameters()):
            torch.testing.assert_close(ours.detach(), theirs.detach(), atol=1e-5, rtol=1e-5)


def test_a_sampler_without_a_map_start_is_not_stacked():
    data = [_data(k) for k in range(2)]
    with pytest.raises(ValueError, match="no MAP start to stack"):
        fit_many([_model(k) for k in range(2)], [d[0] for d in data], [d[1] for d in data], backend="sgld",
                 init="current", num_samples=5, warmup_steps=5)


def test_radial_with_a_monte_carlo_cross_entropy_is_not_stacked():
    data = [_data(k) for k in range(2)]
    with pytest.raises(ValueError, match="estimates the cross-entropy by Monte Carlo"):
        fit_many([_model(k) for k in range(2)], [d[0] for d in data], [d[1] for d in data], backend="radial",
                 mc_kl_samples=4, **SVI_OPTIONS)


def test_radial_with_a_non_normal_prior_is_not_stacked():
    from zoo import LaplacePrior

    def model(seed):
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
        return BayesianNetwork(net, stochastic="all", prior=LaplacePrior(1.0), output_dim=1)

    data = [_data(k) for k in range(2)]
    with pytest.raises(ValueError, match="has a Laplace prior; the exact Radial cross-entropy needs a Normal one"):
        fit_many([model(k) for k in range(2)], [d[0] for d in data], [d[1] for d in data], backend="radial",
                 **SVI_OPTIONS)


def test_a_fit_does_not_depend_on_its_batch():
    """Fit 1 alone and fit 1 among others: the same result (its own data, order and random stream)."""
    fits, data = _stacked("svi", **SVI_OPTIONS)
    alone = fit_many([_model(1)], [data[1][0]], [data[1][1]], backend="svi", seeds=[11], **SVI_OPTIONS)[0]
    ours = dict(fits[1].guide.named_parameters())
    for name, value in alone.guide.named_parameters():
        torch.testing.assert_close(ours[name].detach(), value.detach(), atol=1e-5, rtol=1e-5)


def test_each_fit_has_its_own_minibatch_order():
    """Fit k's batches are minibatches() of its own seeded generator, epoch after epoch (rows = their index)."""
    x = torch.arange(20.0).reshape(1, 20, 1).expand(2, 20, 1)
    reference = [torch.Generator().manual_seed(s) for s in (3, 4)]
    batches = StackedBatches(x, x, 8, [torch.Generator().manual_seed(s) for s in (3, 4)])
    for _ in range(2):  # two epochs: each generator advances as a one-at-a-time fit's does
        stacked = [xb[..., 0].long() for xb, _ in batches.epoch()]
        for k in range(2):
            expected = list(minibatches(20, 8, reference[k]))
            assert [b[k].tolist() for b in stacked] == [e.tolist() for e in expected]
        assert stacked[0][0].tolist() != stacked[0][1].tolist()


def test_a_diverging_fit_stops_alone():
    """A fit whose loss overflows stops with NonFiniteLossError (its last finite point attached); the others
    finish and equal their one-at-a-time fits."""
    data = [_data(0), _data(1, scale=1e19), _data(2)]
    fits = fit_many([_model(k) for k in range(3)], [d[0] for d in data], [d[1] for d in data], backend="map",
                    seeds=[10, 11, 12], **MAP_OPTIONS)
    assert isinstance(fits[1], NonFiniteLossError) and fits[1].posterior is not None
    assert all(bool(torch.isfinite(v).all()) for v in fits[1].posterior.draws.values())
    single = fit(_model(2), *data[2], backend="map", seed=12, progress=False, **MAP_OPTIONS)
    for name, value in single.draws.items():
        torch.testing.assert_close(fits[2].draws[name], value, atol=1e-5, rtol=1e-5)


def test_the_callers_session_is_left_as_it_was():
    models, data = [_model(k) for k in range(2)], [_data(k) for k in range(2)]
    torch.manual_seed(123)
    before = torch.get_rng_state()
    fit_many(models, [d[0] for d in data], [d[1] for d in data], backend="svi", epochs=2, batch_size=16)
    assert torch.equal(torch.get_rng_state(), before)


def test_bad_batches_are_refused_before_any_work():
    x, y = _data(0)
    with pytest.raises(ValueError, match="one x, y and seed per model"):
        fit_many([_model(0), _model(1)], [x], [y], backend="map")
    bnn = _model(0)
    with pytest.raises(ValueError, match="separate model per fit"):
        fit_many([bnn, bnn], [x, x], [y, y], backend="map")
    with pytest.raises(ValueError, match="cannot be stacked: the model trains deterministic parameters .* only the .*map"):
        fit_many([_model(0, "last"), _model(1, "last")], [x, x], [y, y], backend="ensemble")
    with pytest.raises(ValueError, match="cannot be stacked: backend 'swag'"):
        fit_many([_model(0), _model(1)], [x, x], [y, y], backend="swag")
    x2, y2 = _data(1, n=30)
    with pytest.raises(ValueError, match="differ from fit 0"):
        fit_many([_model(0), _model(1)], [x, x2], [y, y2], backend="map")
    with pytest.raises(ValueError, match="unknown option"):
        fit_many([_model(0)], [x], [y], backend="map", epoch=3)


def test_ensemble_members_train_as_one_stacked_program():
    """The ensemble backend's stacked members equal its member-by-member fits (own starts and seeds)."""
    x, y = _data(0)
    options = dict(num_members=3, **MAP_OPTIONS)
    stacked = fit(_model(0), x, y, backend="ensemble", seed=5, progress=False, **options)
    looped = fit(_model(0), x, y, backend="ensemble", seed=5, progress=False, vectorise=False, **options)
    assert stacked.info["vectorised"] and not looped.info["vectorised"]
    for name, value in looped.draws.items():
        torch.testing.assert_close(stacked.draws[name], value, atol=1e-5, rtol=1e-5)
    assert stacked.info["member_histories"][2]["loss"] == pytest.approx(looped.info["member_histories"][2]["loss"],
                                                                        rel=1e-5)


def test_a_last_layer_ensemble_trains_its_shared_body_member_by_member():
    """Members of a last-layer ensemble share one deterministic body, which member 0 fits: the members are not
    stacked (a regression: once the stacked MAP engine took trained bodies, they were, and the body stayed at
    its initial values — energy, ensemble `last`, test LL −2.40 instead of −0.28)."""
    x, y = _data(0)
    options = dict(num_members=3, **MAP_OPTIONS)
    model = _model(0, "last")
    start = model.net[0].weight.detach().clone()
    default = fit(model, x, y, backend="ensemble", seed=5, progress=False, **options)
    looped = fit(_model(0, "last"), x, y, backend="ensemble", seed=5, progress=False, vectorise=False, **options)
    assert not default.info["vectorised"] and not torch.allclose(model.net[0].weight, start, atol=1e-3)
    for name, value in looped.draws.items():
        torch.testing.assert_close(default.draws[name], value)


def test_ensemble_runs_stack_their_members_across_runs():
    """K ensemble runs of M members as one program: each run equals its own ensemble fit."""
    options = dict(num_members=2, **MAP_OPTIONS)
    fits, data = _stacked("ensemble", seeds=(10, 11), **options)
    for k, posterior in enumerate(fits):
        single = fit(_model(k), *data[k], backend="ensemble", seed=10 + k, progress=False, **options)
        assert posterior.num_chains == 2 and posterior.info["member_seeds"] == single.info["member_seeds"]
        for name, value in single.draws.items():
            torch.testing.assert_close(posterior.draws[name], value, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="one after another"):
        _stacked("ensemble", seeds=(1, 2), vectorise=False, **options)
