"""The training length of ``map`` and ``ensemble`` chosen on held-out rows, then a refit (issue 39):
the split, the stopping rule, the default (a likelihood with a variance head), the refit, the ensemble's
member 0 = the ``map`` fit, and every bad-input path."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from inference.evaluation.metrics import evaluate
from inference.fitting import fit
from inference.fitting import batch_blocker
from inference.backends import get_backend, parse_config
from inference.optim.early_stopping import ValidationMonitor, default_patience, held_out_split, uses_early_stopping
from zoo.architectures import build_architecture
from zoo.bnn import BayesianNetwork
from zoo.likelihoods import GaussianLikelihood, HeteroscedasticGaussianLikelihood


def _data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g)
    return x, torch.sin(x[:, :1]) + 0.5 * torch.randn(n, 1, generator=g)


def _bnn(likelihood=None):
    torch.manual_seed(0)
    likelihood = likelihood or HeteroscedasticGaussianLikelihood()
    net = build_architecture("mlp", 5, likelihood.heads, hidden=[32])
    return BayesianNetwork(net, stochastic="all", likelihood=likelihood, example_input=torch.zeros(2, 5))


def test_held_out_split_is_seeded_disjoint_and_complete():
    kept, held = held_out_split(100, 0.2, seed=3)
    assert kept.numel() == 80 and held.numel() == 20
    assert torch.equal(torch.sort(torch.cat([kept, held])).values, torch.arange(100))
    again, _ = held_out_split(100, 0.2, seed=3)
    other, _ = held_out_split(100, 0.2, seed=4)
    assert torch.equal(kept, again) and not torch.equal(kept, other)
    with pytest.raises(ValueError, match="both need at least one row"):
        held_out_split(1, 0.2, seed=0)


def test_monitor_records_the_held_out_curve_and_stops_after_patience():
    bnn = _bnn(GaussianLikelihood(noise_sd=1.0))
    x, y = _data(30, 0)
    values = bnn.initial_values()
    monitor = ValidationMonitor(bnn, x, y, patience=2)
    scale = {n: 1.0 for n in values}
    stops = []
    for epoch, factor in enumerate([1.0, 0.5, 0.0, 0.5, 1.0]):  # the zero network is best (targets ~ mean 0)
        stops.append(monitor(epoch, {n: v * factor * scale[n] for n, v in values.items()}))
    assert monitor.best == 2 and len(monitor.curve) == 5 and stops == [False, False, False, False, True]
    expected = float(bnn.log_likelihood({n: (0 * v).unsqueeze(0) for n, v in values.items()}, x, y).mean())
    assert monitor.curve[2] == pytest.approx(expected)
    assert default_patience(40) == 10 and default_patience(625) == 63
    assert monitor.errors[2] == pytest.approx(float(bnn.log_likelihood(
        {n: (0 * v).unsqueeze(0) for n, v in values.items()}, x, y)[0].std()) / 30 ** 0.5)


def test_one_standard_error_rule_takes_the_earliest_epoch_it_cannot_tell_from_the_best():
    monitor = ValidationMonitor(None, None, None, patience=5)
    monitor.curve, monitor.errors, monitor.best = [-3.0, -2.5, -2.29, -2.2, -2.25, -2.4], [0.1] * 6, 3
    assert monitor.chosen("best") == 3 and monitor.chosen("one-se") == 2  # -2.29 >= -2.2 - 0.1 > -2.5
    monitor.errors = [0.0] * 6
    assert monitor.chosen("one-se") == 3


def test_heteroscedastic_map_stops_before_it_memorises_its_residuals():
    """On 80 rows the variance head of a 200-epoch full-batch fit memorises the training residuals (the test
    density collapses); the held-out choice stops early and the refit keeps an honest predictive."""
    x, y = _data(80, 0)
    x_test, y_test = _data(2000, 1)
    full = fit(_bnn(), x, y, backend="map", seed=0, epochs=200, batch_size=None, progress=False, early_stopping=False)
    chosen = fit(_bnn(), x, y, backend="map", seed=0, epochs=200, batch_size=None, progress=False)
    record = chosen.info["early_stopping"]
    assert record["epochs"] < record["epochs_run"] <= 200 and record["max_epochs"] == 200
    assert record["num_validation"] == 16 and len(record["validation_ll"]) == record["epochs_run"]
    assert chosen.info["config"]["epochs"] == record["epochs"] and len(chosen.info["history"]["loss"]) == record["epochs"]
    full_metrics = evaluate(full.predict(x_test, y=y_test, seed=0), y_test)
    chosen_metrics = evaluate(chosen.predict(x_test, y=y_test, seed=0), y_test)
    assert chosen_metrics["test_ll"] > full_metrics["test_ll"] + 1.0, (chosen_metrics, full_metrics)
    assert 0.8 <= chosen_metrics["coverage_90"] <= 0.97 and full_metrics["coverage_90"] < 0.7
    assert "early_stopping" not in full.info


def test_the_refit_is_a_plain_fit_for_the_chosen_epochs_and_other_likelihoods_are_unchanged():
    x, y = _data(60, 2)
    chosen = fit(_bnn(), x, y, backend="map", seed=1, epochs=60, batch_size=16, progress=False)
    epochs = chosen.info["early_stopping"]["epochs"]
    plain = fit(_bnn(), x, y, backend="map", seed=1, epochs=epochs, batch_size=16, progress=False,
                early_stopping=False)
    assert all(torch.equal(chosen.draws[n], plain.draws[n]) for n in plain.draws)
    gaussian = fit(_bnn(GaussianLikelihood(learn_noise=True)), x, y, backend="map", seed=1, epochs=5, progress=False)
    assert "early_stopping" not in gaussian.info and len(gaussian.info["history"]["loss"]) == 5
    forced = fit(_bnn(GaussianLikelihood(learn_noise=True)), x, y, backend="map", seed=1, epochs=5, progress=False,
                 early_stopping=True)
    assert forced.info["early_stopping"]["max_epochs"] == 5


def test_ensemble_members_refit_with_member_zeros_choice_and_member_zero_is_the_map_fit():
    x, y = _data(60, 3)
    ensemble = fit(_bnn(), x, y, backend="ensemble", seed=0, epochs=60, batch_size=16, num_members=3, progress=False)
    single = fit(_bnn(), x, y, backend="map", seed=0, epochs=60, batch_size=16, progress=False)
    assert ensemble.info["early_stopping"]["epochs"] == single.info["early_stopping"]["epochs"]
    assert ensemble.info["vectorised"] and ensemble.num_chains == 3
    for name, draws in single.draws.items():
        assert torch.allclose(ensemble.draws[name][0], draws[0], atol=1e-4), name


def test_a_dataloader_fits_every_row_and_refuses_forced_early_stopping():
    x, y = _data(40, 4)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    posterior = fit(_bnn(), loader, backend="map", seed=0, epochs=3, progress=False)
    assert "early_stopping" not in posterior.info
    with pytest.raises(ValueError, match="DataLoader"):
        fit(_bnn(), loader, backend="map", seed=0, epochs=3, progress=False, early_stopping=True)


@pytest.mark.parametrize("backend", ["map", "ensemble"])
@pytest.mark.parametrize("options, message", [
    ({"validation_fraction": 0.0}, "validation_fraction"),
    ({"validation_fraction": 1.0}, "validation_fraction"),
    ({"patience": 0}, "patience"),
    ({"early_stopping": "yes"}, "early_stopping"),
])
def test_bad_options(backend, options, message):
    x, y = _data(20, 5)
    with pytest.raises(ValueError, match=message):
        fit(_bnn(), x, y, backend=backend, progress=False, **options)


def test_fits_that_choose_their_epochs_do_not_join_a_stacked_batch():
    bnn = _bnn()
    config = parse_config(get_backend("map"), {})
    assert uses_early_stopping(bnn, config) and "held-out rows" in batch_blocker(bnn, "map", config)
    assert batch_blocker(bnn, "map", parse_config(get_backend("map"), {"early_stopping": False})) is None
    assert batch_blocker(_bnn(GaussianLikelihood(learn_noise=True)), "ensemble",
                         parse_config(get_backend("ensemble"), {})) is None


def test_a_fit_that_chose_its_epochs_saves_and_reloads_exactly(tmp_path):
    from inference import load_posterior

    x, y = _data(40, 6)
    posterior = fit(_bnn(), x, y, backend="map", seed=0, epochs=30, batch_size=16, progress=False)
    posterior.save(tmp_path / "p")
    loaded = load_posterior(tmp_path / "p")
    assert loaded.info["early_stopping"]["epochs"] == posterior.info["early_stopping"]["epochs"]
    assert torch.equal(loaded.predict(x, seed=1).f, posterior.predict(x, seed=1).f)


def test_a_trained_body_chooses_its_epochs_by_default_with_the_best_held_out_epoch():
    """A last-layer model's body is fitted to the training rows and kept by every posterior over its head, and a
    learned noise follows its residuals: by default its epochs are chosen on held-out rows (selection "best"; a
    variance head keeps "one-se"); with a fixed noise the budget stands."""
    from inference.optim.early_stopping import EarlyStoppingOptions, selection_for, trains_body

    x, y = _data(60, 0)

    def model(stochastic, likelihood):
        torch.manual_seed(0)
        net = build_architecture("mlp", 5, likelihood.heads, hidden=[32])
        return BayesianNetwork(net, stochastic=stochastic, likelihood=likelihood, example_input=x[:2])

    last = model("last", GaussianLikelihood(learn_noise=True))
    options = EarlyStoppingOptions()
    assert trains_body(last) and uses_early_stopping(last, options, x) and selection_for(last, options) == "best"
    everything = model("all", GaussianLikelihood(learn_noise=True))
    assert not trains_body(everything) and not uses_early_stopping(everything, options, x)
    assert selection_for(model("all", HeteroscedasticGaussianLikelihood()), options) == "one-se"
    assert selection_for(last, EarlyStoppingOptions(selection="one-se")) == "one-se"
    fixed_noise = model("last", GaussianLikelihood(noise_sd=0.5))  # no noise to follow the body: the budget stands
    assert trains_body(fixed_noise) and not uses_early_stopping(fixed_noise, options, x)
    posterior = fit(last, x, y, backend="map", seed=0, epochs=60, batch_size=16, progress=False)
    record = posterior.info["early_stopping"]
    assert record["selection"] == "best" and record["epochs"] <= 60
    assert len(posterior.info["history"]["loss"]) == record["epochs"]
    assert "held-out rows" in batch_blocker(last, "map", parse_config(get_backend("map"), {}))
