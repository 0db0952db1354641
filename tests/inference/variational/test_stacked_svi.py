"""The stacked SVI fit (inference.variational.stacked_svi, through fit_many) against one-at-a-time fits."""
import torch

from tests.inference.conftest import SVI_OPTIONS, _model, _stacked
from inference import fit
from inference.optim.batches import minibatches


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
