"""The ensembles stacked (inference.ensembles.stacked): members as one program, K ensemble runs as one program,
against member-by-member and one-at-a-time fits."""
import pytest
import torch

from tests.inference.conftest import K, MAP_OPTIONS, _data, _model, _stacked
from inference import fit


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
