"""The samplers' and Laplace's MAP start (:mod:`inference.optim.start`): a trained deterministic body's
epochs are chosen on held-out rows, since the chains never move the body and the noise follows its residuals."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from inference.optim.latent_fit import latents_at_map
from inference.optim.map import MAPOptions, fit_map
from inference.optim.potential import Potential
from inference.optim.early_stopping import default_patience
from inference.optim.start import initial_point, map_epochs, start_stack_blocker, trains_body
from zoo import BayesianNetwork, GaussianLikelihood

NOISE_SD = 0.3


def _problem(seed=0):
    """40 rows in 8 dimensions, only the first informative: a 8-32-32-1 body can memorise the noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(40, 8, generator=g)
    return x, torch.sin(x[:, :1]) + NOISE_SD * torch.randn(40, 1, generator=g)


def _model(x, stochastic="last"):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    return BayesianNetwork(net, stochastic, likelihood=GaussianLikelihood(learn_noise=True), example_input=x[:2])


def test_a_trained_body_stops_on_held_out_rows_and_keeps_an_honest_noise():
    """The full budget memorises the training rows (noise sd 0.02 against the data's 0.3); the held-out choice
    of the epochs stops well before it, and the start's noise (its MAP for the fitted weights) stays near 0.3."""
    x, y = _problem()
    bnn = _model(x)
    potential = Potential(bnn, x, y)
    z, record = initial_point(potential, "map", map_steps=600, map_lr=0.01)
    chosen = record["early_stopping"]
    assert chosen["max_epochs"] == map_epochs(40, None, 600) and chosen["epochs"] < chosen["max_epochs"] / 4
    assert record["map_steps"] == chosen["epochs"] and chosen["num_validation"] == 8  # one batch per epoch
    noise_sd = float(potential.unpack(z.unsqueeze(0))[0]["noise_precision"][0]) ** -0.5
    assert 0.5 * NOISE_SD < noise_sd < 1.5 * NOISE_SD
    overfit = _model(x)  # the same budget without the held-out choice
    values = fit_map(overfit, x, y, MAPOptions(epochs=chosen["max_epochs"]), 0, False).values
    assert float(latents_at_map(overfit, values, [(x, y)])["noise_precision"]) ** -0.5 < NOISE_SD / 3


def test_a_fully_random_model_keeps_its_budget():
    """No deterministic body: the chains move every weight, and the start takes its whole budget."""
    x, y = _problem()
    bnn = _model(x, "all")
    assert not trains_body(bnn)
    _, record = initial_point(Potential(bnn, x, y), "map", map_steps=30, map_lr=0.01)
    assert "early_stopping" not in record and record["map_steps"] == 30


def test_the_held_out_start_is_not_stacked():
    x, _ = _problem()
    assert trains_body(_model(x)) and "held-out" in start_stack_blocker(_model(x), "map", 100)
    assert start_stack_blocker(_model(x), "current", 100) is None
    assert start_stack_blocker(_model(x), "map", 0) is None
    assert start_stack_blocker(_model(x, "all"), "map", 100) is None


@pytest.mark.parametrize("backend", ["sgld"])
def test_a_sampler_on_a_last_layer_model_records_the_choice(backend):
    from inference import fit

    x, y = _problem()
    posterior = fit(_model(x), x, y, backend=backend, seed=0, progress=False, map_steps=200, num_samples=20,
                    warmup_steps=20, num_chains=1)
    assert posterior.info["early_stopping"]["epochs"] < 200
    assert not fit_stack_allowed(backend, _model(x))


def fit_stack_allowed(backend, bnn) -> bool:
    from inference.backends import BACKENDS, parse_config

    engine = BACKENDS[backend]
    return engine.stack_blocker(bnn, parse_config(engine, {})) is None


def _watched_start(bnn, x, y, map_steps):
    """``initial_point`` with a watch recording each announced run and the steps it then took."""
    runs = []

    def watch(run):
        runs.append([run, 0])

        def on_step():
            runs[-1][1] += 1
        return on_step

    _, record = initial_point(Potential(bnn, x, y), "map", map_steps=map_steps, map_lr=0.01, watch=watch)
    return runs, record


def test_the_watch_sees_each_map_run_and_each_step_and_the_announced_steps_are_the_least_taken():
    """A sampler's time budget watches the start (inference.mcmc.budget.start_budget): a held-out choice announces
    its trial with the fewest steps it can take (patience + 1 epochs of the kept rows' batches) and at least one
    refit epoch after it; the refit, its exact steps."""
    x, y = _problem()
    runs, record = _watched_start(_model(x), x, y, 600)  # 40 rows: one batch an epoch; trial on 32 kept rows
    (trial, trial_steps), (refit, refit_steps) = runs
    chosen = record["early_stopping"]
    assert trial.desc == "MAP start (held-out epochs)" and trial.batch_rows == 32 and trial.later_steps == 1
    assert trial.steps == default_patience(600) + 1 <= trial_steps == chosen["epochs_run"]
    assert refit.desc == "MAP start" and refit.later_steps == 0 and refit.batch_rows == 40
    assert refit.steps == refit_steps == record["map_steps"] == chosen["epochs"]
    runs, record = _watched_start(_model(x, "all"), x, y, 30)  # no held-out choice: one run, announced exactly
    assert [(run.steps, taken) for run, taken in runs] == [(30, 30)] and record["map_steps"] == 30


def test_what_the_watch_raises_ends_the_start():
    x, y = _problem()

    class Stop(Exception):
        pass

    def watch(run):
        def on_step():
            raise Stop(run.desc)
        return on_step

    with pytest.raises(Stop, match="MAP start"):
        initial_point(Potential(_model(x, "all"), x, y), "map", map_steps=30, map_lr=0.01, watch=watch)
