"""The variational fits' length chosen on held-out rows (issue 38, :mod:`inference.variational.length`): longer
where the held-out predictive keeps improving, shorter where the fit starts to chase noise, a given length kept,
the choice reproducible from the seed, the refit a plain fit for the chosen length, bad options refused."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from inference import fit
from inference.backends import BACKENDS, parse_config
from inference.fitting import batch_blocker
from inference.optim.early_stopping import ValidationMonitor
from inference.variational.length import FIXED_EPOCHS, chooses_length, max_epochs
from zoo import BayesianNetwork, GaussianLikelihood, NormalPrior


def _slow_line():
    """y = 3x + ε (sd 0.1) on 160 rows, one Linear(1, 1) from a weight near 0: the mean has far to travel at
    Adam's 1e-2 steps, so the held-out predictive improves for most of the run."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(160, 1, generator=g) * 2 - 1
    y = 3 * x + 0.1 * torch.randn(160, 1, generator=g)
    torch.manual_seed(0)
    net = nn.Linear(1, 1)
    with torch.no_grad():
        net.weight.fill_(0.0), net.bias.fill_(0.0)
    return BayesianNetwork(net, "all", NormalPrior(10.0), GaussianLikelihood(0.1), example_input=x[:2]), x, y


def _pure_noise():
    """y = ε (sd 1) on 40 rows, a 1-64-64-1 tanh net with a fixed noise sd of 0.2 and a wide prior: the best
    held-out predictive is the flat mean near the start, and training on chases the rows' noise."""
    g = torch.Generator().manual_seed(1)
    x = torch.rand(40, 1, generator=g) * 6 - 3
    y = torch.randn(40, 1, generator=g)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    return BayesianNetwork(net, "all", NormalPrior(3.0), GaussianLikelihood(0.2), example_input=x[:2]), x, y


OPTIONS = {"early_stopping": True, "epochs": 120, "batch_size": 32, "progress": False, "seed": 0}


@pytest.mark.parametrize("backend", ["svi", "graves", "radial"])
def test_the_length_is_long_where_the_predictive_keeps_improving_and_short_where_the_fit_chases_noise(backend):
    line, noise = fit(*_slow_line(), backend=backend, **OPTIONS), fit(*_pure_noise(), backend=backend, **OPTIONS)
    long, short = line.info["early_stopping"], noise.info["early_stopping"]
    assert long["max_epochs"] == short["max_epochs"] == 120
    assert long["epochs"] >= 90, long["validation_ll"][::10]  # still improving near the end
    assert short["epochs"] <= 40 and short["epochs_run"] < 120, short["validation_ll"][::10]  # stopped by patience
    assert line.info["config"]["epochs"] == long["epochs"] == len(line.info["history"]["loss"])
    curve = short["validation_ll"]
    assert max(curve) - curve[-1] > 0.1  # the held-out predictive did fall after its best epoch


def test_a_given_length_is_kept_and_nothing_is_chosen():
    bnn, x, y = _slow_line()
    post = fit(bnn, x, y, backend="svi", epochs=7, batch_size=32, progress=False)
    assert "early_stopping" not in post.info and len(post.info["history"]["loss"]) == 7
    fixed = fit(*_slow_line(), backend="svi-lrt", early_stopping=False, batch_size=80, progress=False)
    assert "early_stopping" not in fixed.info and fixed.info["config"]["epochs"] == FIXED_EPOCHS == 200


def test_the_choice_is_reproducible_from_the_seed_and_the_refit_is_a_plain_fit():
    first, again = (fit(*_pure_noise(), backend="svi", **OPTIONS) for _ in range(2))
    assert first.info["early_stopping"] == again.info["early_stopping"]
    epochs = first.info["early_stopping"]["epochs"]
    plain = fit(*_pure_noise(), backend="svi", **{**OPTIONS, "early_stopping": None, "epochs": epochs})
    for name, value in first.guide.state_dict().items():
        assert torch.equal(value, again.guide.state_dict()[name]) and torch.equal(value, plain.guide.state_dict()[name])
    record = first.info["early_stopping"]
    assert (f"after {epochs} epochs (chosen on {record['num_validation']} held-out rows, of at most "
            f"{record['max_epochs']})") in repr(first)
    assert "held-out" not in repr(plain)
    other = fit(*_pure_noise(), backend="svi", **{**OPTIONS, "seed": 1})
    assert other.info["early_stopping"]["validation_ll"] != first.info["early_stopping"]["validation_ll"]


def test_the_default_cap_comes_from_the_data_size():
    config = parse_config(BACKENDS["svi"], {})
    assert config.epochs is None and chooses_length(config, torch.zeros(3, 1))
    assert max_epochs(config, 691) == 910  # UCI energy's training split: ⌈10 000 / 11⌉ epochs of 64 rows
    assert max_epochs(config, 200) == 2500 and max_epochs(config, 100_000) == FIXED_EPOCHS
    assert max_epochs(parse_config(BACKENDS["radial"], {"max_steps": 400}), 200) == FIXED_EPOCHS
    assert max_epochs(parse_config(BACKENDS["graves"], {"epochs": 30}), 200) == 30
    assert max_epochs(parse_config(BACKENDS["svi"], {"early_stopping": False}), 200) == FIXED_EPOCHS


def test_a_data_loader_trains_the_fixed_length_and_refuses_a_forced_choice():
    bnn, x, y = _slow_line()
    loader = DataLoader(TensorDataset(x, y), batch_size=80)
    post = fit(bnn, loader, backend="svi", progress=False)
    assert "early_stopping" not in post.info and len(post.info["history"]["loss"]) == FIXED_EPOCHS
    with pytest.raises(ValueError, match="early_stopping=True holds out rows"):
        fit(*_slow_line()[:1], loader, backend="graves", early_stopping=True, progress=False)


@pytest.mark.parametrize("options, message", [
    ({"epochs": 0}, "epochs must be at least 1"),
    ({"max_steps": 0}, "max_steps .* must be at least 1"),
    ({"validation_fraction": 1.5}, "validation_fraction"),
    ({"selection": "last"}, "unknown selection 'last'"),
    ({"patience": 0}, "patience must be at least 1"),
])
@pytest.mark.parametrize("backend", ["svi", "svi-lrt", "radial"])
def test_bad_length_options_are_refused_before_fitting(backend, options, message):
    with pytest.raises(ValueError, match=message):
        parse_config(BACKENDS[backend], options)


def test_a_fit_that_chooses_its_length_does_not_join_a_stacked_batch():
    bnn = _slow_line()[0]
    for backend in ("svi", "radial"):
        engine = BACKENDS[backend]
        assert "chooses its length on its own held-out rows" in batch_blocker(bnn, backend, parse_config(engine, {}))
        assert batch_blocker(bnn, backend, parse_config(engine, {"epochs": 50})) is None


def test_the_monitor_scores_the_monte_carlo_predictive_and_skips_a_ramp():
    """``predictive``: a row's score is log (1/S) Σ_s p(y|x, w_s); ``min_epochs``: earlier epochs score −∞, are never
    chosen and do not use up the patience."""
    bnn, x, y = _slow_line()
    values = {name: torch.randn(5, *bnn.initial_values()[name].shape, generator=torch.Generator().manual_seed(3))
              for name in bnn.site_names}
    monitor = ValidationMonitor(bnn, x[:20], y[:20], patience=2, predictive=True, min_epochs=3)
    log_lik = bnn.log_likelihood(values, x[:20], y[:20])
    expected = float((torch.logsumexp(log_lik, 0) - math.log(5)).mean())
    assert [monitor(e, values) for e in range(3)] == [False] * 3 and monitor.curve == [-math.inf] * 3
    assert not monitor(3, values) and monitor.curve[3] == pytest.approx(expected) and monitor.best == 3
    assert not monitor(4, values) and monitor(5, values)  # two epochs without a better score after the ramp
    assert monitor.chosen("best") == monitor.chosen("one-se") == 3


def test_the_monitor_reads_a_window_of_epochs_so_one_lucky_epoch_is_not_chosen():
    """``window`` w: the rule reads the mean of the last w scores and the chosen epoch is the middle of the best
    window; w = 1 is the ``map`` backend's per-epoch rule."""
    scores = iter([0.0, 3.0, 0.0, 0.0, 2.0, 2.0, 2.0, 0.0, 0.0, 0.0])
    monitor = ValidationMonitor(None, None, None, patience=3, window=3)
    monitor.score = lambda values: torch.full((4,), next(scores))
    stops = [monitor(epoch, {}) for epoch in range(10)]
    assert stops == [False] * 9 + [True]  # three epochs after the best window (epochs 4-6)
    assert monitor.smoothed[:2] == [-math.inf] * 2 and monitor.smoothed[6] == pytest.approx(2.0)
    assert monitor.best == 6 and monitor.chosen("best") == 5  # not the lucky epoch 1
    assert smoothing_window(910) == 19 and smoothing_window(2500) == 50 and smoothing_window(200) == 4
