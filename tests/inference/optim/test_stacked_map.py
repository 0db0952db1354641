"""The stacked MAP fit (inference.optim.stacked_map on the stacked loop, through fit_many) against one-at-a-time
fits, and a diverging fit stopping alone."""
import pytest
import torch

from tests.inference.conftest import K, MAP_OPTIONS, _data, _model, _stacked
from inference import fit
from inference.fitting import fit_many
from inference.optim.training import NonFiniteLossError


def test_map_matches_one_at_a_time_fits():
    """Different data, inits and seeds per fit: each stacked fit is its own fit, to float rounding."""
    fits, data = _stacked("map", **MAP_OPTIONS)
    for k, posterior in enumerate(fits):
        single = fit(_model(k), *data[k], backend="map", seed=10 + k, progress=False, **MAP_OPTIONS)
        for name, value in single.draws.items():
            torch.testing.assert_close(posterior.draws[name], value, atol=1e-5, rtol=1e-5)
        assert posterior.info["history"]["loss"] == pytest.approx(single.info["history"]["loss"], rel=1e-5)
        assert posterior.info["multifit"] == {"fits": K, "index": k}


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
