"""The stacked multi-fit machinery (inference.multifit, inference.fitting.fit_many): a last-layer model's stacked
body, each fit's own data order and random stream, the caller's session, the checks of a batch. The families'
stacked fits are tested in their folders (tests/inference/variational/test_stacked_svi.py, test_stacked_radial.py,
tests/inference/optim/test_stacked_map.py, tests/inference/ensembles/test_stacked.py, tests/inference/sgmcmc/test_fit.py)."""
import pytest
import torch
from torch import nn

from tests.inference.conftest import K, MAP_OPTIONS, SVI_OPTIONS, _data, _model, _stacked
from inference import fit
from inference.optim.batches import minibatches
from inference.fitting import fit_many
from inference.multifit.stacked import StackedBatches
from zoo import GaussianLikelihood
from zoo.bnn import BayesianNetwork


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
