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
from inference.variational.length import FIXED_EPOCHS, RungMonitor, chooses_length, fit_held_out_length, ladder, max_epochs
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


OPTIONS = {"early_stopping": True, "epochs": 150, "first_rung_epochs": 10, "batch_size": 32, "progress": False, "seed": 0}


@pytest.mark.parametrize("backend", ["svi", "graves", "radial"])
def test_the_length_is_long_where_the_predictive_keeps_improving(backend):
    line = fit(*_slow_line(), backend=backend, **OPTIONS)
    long = line.info["early_stopping"]
    assert long["max_epochs"] == 150 and long["lengths"] == [10, 20, 40, 80, 150]
    assert long["epochs"] == 150 and long["rung"] == 4, long["validation_ll"]  # every rung better than the one before
    assert long["cap_untried"] and long["epochs_run"] == 10 + 20 + 40 + 80  # rising up to the cap: not tried
    assert line.info["config"]["epochs"] == 150 == len(line.info["history"]["loss"])


def test_a_given_length_is_kept_and_nothing_is_chosen():
    bnn, x, y = _slow_line()
    post = fit(bnn, x, y, backend="svi", epochs=7, batch_size=32, progress=False)
    assert "early_stopping" not in post.info and len(post.info["history"]["loss"]) == 7
    fixed = fit(*_slow_line(), backend="svi-lrt", early_stopping=False, batch_size=80, progress=False)
    assert "early_stopping" not in fixed.info and fixed.info["config"]["epochs"] == FIXED_EPOCHS == 200


def test_the_choice_is_reproducible_from_the_seed_and_the_refit_is_a_plain_fit():
    options = {**OPTIONS, "epochs": 60}  # rungs of 10, 20 and 60 epochs
    first, again = (fit(*_pure_noise(), backend="svi", **options) for _ in range(2))
    assert first.info["early_stopping"] == again.info["early_stopping"]
    epochs = first.info["early_stopping"]["epochs"]
    plain = fit(*_pure_noise(), backend="svi", **{**options, "early_stopping": None, "epochs": epochs})
    for name, value in first.guide.state_dict().items():
        assert torch.equal(value, again.guide.state_dict()[name]) and torch.equal(value, plain.guide.state_dict()[name])
    record = first.info["early_stopping"]
    assert (f"after {epochs} epochs (chosen on {record['num_validation']} held-out rows, of at most "
            f"{record['max_epochs']})") in repr(first)
    assert "held-out" not in repr(plain)
    other = fit(*_pure_noise(), backend="svi", **{**options, "seed": 1})
    assert other.info["early_stopping"]["validation_ll"] != record["validation_ll"]


def test_each_rung_is_a_fit_from_the_start_and_the_refit_fits_every_row_for_the_chosen_one():
    """The rungs train the kept rows for each length of the ladder, each from the network's own parameters, with
    the rung monitor; the first rung no better than the best ends the ladder; the refit trains every row for the
    best rung's length, without a monitor."""
    bnn, x, y = _slow_line()
    calls, starts, scores = [], [], iter([-3.0, -1.0, -2.0, -5.0])  # rung 2's window is two epochs
    config = parse_config(BACKENDS["svi"], {"max_steps": 700, "first_rung_epochs": 10, "batch_size": 32})

    def fake_fit(xs, ys, options, stop, held_out):
        calls.append((xs.shape[0], options.epochs, stop is not None, held_out))
        starts.append(float(bnn.net.weight))
        for epoch in range(options.epochs if stop else 0):
            with torch.no_grad():
                bnn.net.weight.add_(1.0)  # a fit moves the network's own weights
            stop(epoch, lambda: {})
        return type("Fit", (), {"info": {"history": {"loss": [0.0] * options.epochs}}})()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RungMonitor, "score", lambda self, draws: torch.full((4,), next(scores)))
        posterior = fit_held_out_length(fake_fit, bnn, x, y, config, seed=0)
    assert max_epochs(config, 160) == 200 and ladder(10, 200) == [10, 20, 40, 80, 200]
    assert calls == [(128, 10, True, True), (128, 20, True, True), (128, 40, True, True), (160, 20, False, False)]
    assert starts == [0.0] * 4 and float(bnn.net.weight) == 0.0
    record = posterior.info["early_stopping"]
    assert record["epochs"] == 20 and record["rung"] == 1 and record["epochs_run"] == 70  # rung 2 worse: stopped
    assert record["num_validation"] == 32 and record["validation_ll"] == [-3.0, -1.0, -3.5]


def test_the_default_cap_comes_from_the_data_size():
    config = parse_config(BACKENDS["svi"], {})
    assert config.epochs is None and chooses_length(config, torch.zeros(3, 1))
    assert max_epochs(config, 691) == 1819  # UCI energy's training split: ⌈20 000 / 11⌉ epochs of 64 rows
    assert max_epochs(config, 200) == 5000 and max_epochs(config, 100_000) == FIXED_EPOCHS
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
    ({"first_rung_epochs": 0}, "first_rung_epochs .* must be at least 1"),
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


@pytest.mark.parametrize("selection, tried", [("best", [10, 20, 40, 80]), ("one-se", [10, 20, 40, 80, 200])])
def test_a_curve_rising_up_to_the_cap_takes_the_cap_without_its_trial(selection, tried):
    """With ``"best"``, a rung before the cap that is the best so far leaves the cap as the only better length: it is
    taken without a trial as long as the refit; ``"one-se"`` reads every rung's error and tries them all."""
    bnn, x, y = _slow_line()
    lengths, scores = [], iter(range(100))
    config = parse_config(BACKENDS["svi"], {"max_steps": 700, "first_rung_epochs": 10, "batch_size": 32,
                                             "selection": selection})

    def fake_fit(xs, ys, options, stop, held_out):
        lengths.append(options.epochs)
        for epoch in range(options.epochs if stop else 0):
            stop(epoch, lambda: {})
        return type("Fit", (), {"info": {"history": {"loss": [0.0] * options.epochs}}})()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RungMonitor, "score", lambda self, draws: torch.full((4,), float(next(scores))))
        record = fit_held_out_length(fake_fit, bnn, x, y, config, seed=0).info["early_stopping"]
    assert lengths == tried + [200] and record["epochs"] == 200 and record["rung"] == 4
    assert record["cap_untried"] == (selection == "best") and record["epochs_run"] == sum(tried)


def test_the_ladder_doubles_its_lengths_up_to_the_cap():
    assert ladder(100, 910) == [100, 200, 400, 910]  # energy's cap (800 is within ⅔ of it: left out)
    assert ladder(100, 2500) == [100, 200, 400, 800, 1600, 2500] and ladder(100, 200) == [100, 200]
    assert ladder(100, 150) == [100, 150] and ladder(100, 149) == [149] and ladder(500, 200) == [200]
    assert all(ladder(f, c)[-1] == c and sorted(set(ladder(f, c))) == ladder(f, c)
               for f in (1, 3, 100) for c in (1, 5, 99, 1000))
    with pytest.raises(ValueError, match="at least one epoch"):
        ladder(0, 10)


def test_the_monitor_scores_the_end_of_each_rung_and_stops_after_its_patience():
    """Only a rung's last ⌈E/20⌉ epochs are scored (their mean, S-draw predictive per row); a rung inside the KL
    ramp is no candidate; the ladder stops once ``patience`` rungs pass without a better score."""
    bnn, x, y = _slow_line()
    draws = {name: torch.randn(5, *bnn.initial_values()[name].shape, generator=torch.Generator().manual_seed(3))
             for name in bnn.site_names}
    log_lik = bnn.log_likelihood(draws, x[:20], y[:20])
    expected = float((torch.logsumexp(log_lik, 0) - math.log(5)).mean())
    assert RungMonitor(bnn, x[:20], y[:20], [40]).score(draws).mean().item() == pytest.approx(expected)

    monitor = RungMonitor(None, None, None, [20, 40, 80, 160, 320], patience=2, min_epochs=20)
    values, scored, stops = iter([4.0, 6.0, 3.0, 3.0, 3.0, 4.0] + [0.0] * 8), [], []
    monitor.score = lambda draws: torch.full((2,), next(values))
    for rung, length in enumerate(monitor.lengths):
        monitor.start(rung)
        assert not any(monitor(epoch, lambda epoch=epoch: scored.append((rung, epoch)) or {}) for epoch in range(length))
        stops.append(monitor.finish())
        if stops[-1]:
            break
    assert monitor.windows == [1, 2, 4, 8, 16] and monitor.scores[0] == -math.inf  # rung 0 ends inside the ramp
    assert scored == [(1, 38), (1, 39)] + [(2, e) for e in range(76, 80)] + [(3, e) for e in range(152, 160)]
    assert monitor.scores[1:] == pytest.approx([5.0, 3.25, 0.0]) and monitor.best == 1
    assert stops == [False, False, False, True]  # rungs 2 and 3 no better than rung 1
    assert monitor.chosen("best") == 1


def test_one_standard_error_picks_the_shortest_rung_within_it():
    monitor = RungMonitor(None, None, None, [10, 20], patience=5)  # windows of one epoch
    rows = iter([torch.tensor([1.05, 1.25]), torch.tensor([1.1, 1.5])])
    monitor.score = lambda draws: next(rows)
    for rung, length in enumerate(monitor.lengths):
        monitor.start(rung)
        for epoch in range(length):
            monitor(epoch, lambda: {})
        monitor.finish()
    assert monitor.scores == pytest.approx([1.15, 1.3]) and monitor.best == 1
    assert monitor.errors[1] == pytest.approx(0.2)  # sd 0.283 / √2
    assert monitor.chosen("best") == 1 and monitor.chosen("one-se") == 0  # 1.15 ≥ 1.3 − 0.2


def test_a_rung_beats_the_best_where_the_mean_and_the_typical_row_gain():
    """The same held-out rows and draws score every rung: a rung is better when the per-row differences have a
    positive mean and a positive median — not a mean gain from a few rows, nor a typical gain with a mean loss."""
    monitor = RungMonitor(None, None, None, [10, 12, 14, 16], patience=2)  # windows of one epoch
    base, few = torch.linspace(-1.0, 1.0, 50), torch.arange(50) < 5
    rows = iter([base, base + 0.01, base + 0.01 + torch.where(few, 5.0, -0.1),  # mean +0.41, median −0.1
                 base + 0.01 + torch.where(few, -5.0, 0.1)])  # mean −0.41, median +0.1
    monitor.score = lambda draws: next(rows)
    stops = []
    for rung, length in enumerate(monitor.lengths):
        monitor.start(rung)
        for epoch in range(length):
            monitor(epoch, lambda: {})
        stops.append(monitor.finish())
    assert monitor.scores[2] > monitor.scores[1] > monitor.scores[0] > monitor.scores[3]
    assert monitor.best == 1 and stops == [False, False, False, True]
