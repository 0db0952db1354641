"""The prior precision of a classifier's Laplace GLM predictive (issue 37, the digits shift grid).

On a classifier whose MAP separates its training rows the GGN is ≈ 0 along most directions and the evidence's δ
leaves the Gaussian far too wide: the last-layer GLM predictive on digits was near-uniform (NLL 1.17 against
log 10 = 2.30 for uniform, 0.087 at the validation search's δ).  ``prior_precision="auto"`` is therefore the
validation search for the Monte Carlo GLM predictive as for the closed-form ones; its scores are the Monte Carlo
GLM predictive's held-out NLL, checked here against Laplace fits on the kept rows alone (every GGN structure).
"""
from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
from torch import nn

from inference import fit
from inference.laplace.curvature import WeightLayout
from inference.laplace.evidence import held_out_steps
from zoo import BayesianNetwork, CategoricalLikelihood, GaussianLikelihood, NormalPrior
from zoo.data import load_dataset


def _classifier(num_rows: int = 48, stochastic: str = "all"):
    generator = torch.Generator().manual_seed(0)
    y = torch.arange(3).repeat_interleave(-(-num_rows // 3))[:num_rows]
    x = torch.tensor([[0.0, 1.5], [-1.3, -0.8], [1.3, -0.8]])[y] + 0.9 * torch.randn(num_rows, 2, generator=generator)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 6), nn.Tanh(), nn.Linear(6, 3))
    return BayesianNetwork(net, stochastic, NormalPrior(1.0), CategoricalLikelihood(), output_dim=3), x, y


@pytest.mark.parametrize("hessian", ["full", "kfac", "diag"])
def test_glm_validation_scores_are_the_monte_carlo_glm_nll_of_a_fit_on_the_kept_rows(hessian):
    # Each score is −(1/N) Σ_n log p̂_n with p̂_n a Monte Carlo mean of q_n = softmax(f)_{y_n}: over S₁ logit draws
    # per row in the search, over S₂ weight draws shared by the rows in a fit on the kept rows alone.  By the delta
    # method the search's score has variance Σ_n Var q_n / (p_n² S₁ N²) (rows independent) and the fit's
    # Var_s[(1/N) Σ_n q_sn/p_n] / S₂ (rows correlated through the shared draws), both estimated from the fit's
    # draws (held-out rows of these blobs: p_n ≥ 0.13, no heavy tails); the log of a mean is biased by
    # −Var q_n/(2 p_n² S) each.  Neighbouring δ of the grid score further apart than their two tolerances.
    bnn, x, y = _classifier()
    fresh = copy.deepcopy(bnn)
    grid, draws_search, draws_fit = [0.1, 3.0, 100.0], 4000, 4000
    post = fit(bnn, x, y, backend="laplace", predictive="glm", prior_precision="validation", hessian=hessian,
               prior_precision_grid=grid, seed=0, progress=False, map_steps=40, num_samples=draws_search)
    order = torch.randperm(48, generator=torch.Generator().manual_seed(0))
    kept, held = order[:38], order[38:]
    scores, tolerances = [row["validation_nll"] for row in post.info["validation"]], []
    for delta, score in zip(grid, scores):
        alone = fit(copy.deepcopy(fresh), x[kept], y[kept], backend="laplace", predictive="glm", hessian=hessian,
                    prior_precision=delta, seed=0, progress=False, map_steps=held_out_steps(40, 48, 38),
                    num_samples=draws_fit)
        q = alone.predict(x[held], y=y[held]).log_lik.double().exp().reshape(draws_fit, len(held))  # [S₂, N]
        p = q.mean(0)
        relative = q.var(0) / p**2
        sd = math.sqrt(float(relative.sum()) / (draws_search * len(held) ** 2)
                       + float((q / p).mean(1).var()) / draws_fit)
        tolerances.append(5 * sd + float(relative.mean()) * (1 / draws_search + 1 / draws_fit) / 2)
        assert abs(score - float(-p.log().mean())) <= tolerances[-1]
    assert all(abs(scores[i] - scores[i + 1]) > tolerances[i] + tolerances[i + 1] for i in range(len(grid) - 1))


def test_auto_prior_precision_of_a_classifiers_glm_is_the_validation_search():
    bnn, x, y = _classifier()
    kwargs = dict(backend="laplace", seed=0, progress=False, map_steps=40, num_samples=8)
    glm = fit(copy.deepcopy(bnn), x, y, predictive="glm", prior_precision_grid=[0.1, 10.0], **kwargs)
    assert glm.predictive == "glm" and [r["prior_precision_scale"] for r in glm.info["validation"]] == [0.1, 10.0]
    # the sample predictive and a network taken as it is keep the evidence (no held-out refit to score)
    for options in ({"predictive": "sample"}, {"predictive": "glm", "init": "current"}):
        post = fit(copy.deepcopy(bnn), x, y, **{**kwargs, **options})
        assert "validation" not in post.info
    # regression keeps the evidence (the validation search there is a clear error: test_laplace.py's bad options)
    regression = BayesianNetwork(nn.Sequential(nn.Linear(2, 6), nn.Tanh(), nn.Linear(6, 1)), "all", NormalPrior(1.0),
                                 GaussianLikelihood(noise_sd=0.5), output_dim=1)
    assert "validation" not in fit(regression, x, x[:, :1] - x[:, 1:], predictive="glm", **kwargs).info


def test_last_layer_glm_on_digits_is_close_to_the_probit_and_far_from_uniform():
    # The shift grid's failure, small: LeNet-300-100's last layer on 600 digits, whose MAP (800 Adam steps, no prior
    # on the body) separates the training rows (log-likelihood −0.13 nats in all).  Measured at this commit: the
    # evidence's δ ≈ 5.6 gives the GLM predictive NLL 1.19 on the 450 test images (uniform: log 10 = 2.30); the
    # default (validation search, δ ≈ 63) 0.26, the probit at the same Gaussian 0.22, the MAP's softmax 0.35.
    data = load_dataset("digits", seed=0)
    x, y, x_test, y_test = data.x_train[:600], data.y_train[:600], data.x_test, data.y_test
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 300), nn.ReLU(), nn.Linear(300, 100), nn.ReLU(), nn.Linear(100, 10))
    bnn = BayesianNetwork(net, "last", NormalPrior(1.0), CategoricalLikelihood(), output_dim=10)
    post = fit(bnn, x, y, backend="laplace", predictive="glm", seed=0, progress=False, map_steps=800)

    def nll(posterior):
        return -float(posterior.predict(x_test, y=y_test, seed=0).log_predictive_density().mean())

    bnn.update_reference(WeightLayout(bnn).unflatten(post.mean))  # init="current" keeps the network at this MAP
    delta = post.info["prior_precision_scale"]
    at_map = dict(backend="laplace", init="current", seed=0, progress=False, num_samples=200)
    probit = fit(bnn, x, y, predictive="probit", prior_precision=delta, **at_map)
    evidence = fit(bnn, x, y, predictive="glm", prior_precision="marglik", **at_map)
    map_nll = float(torch.nn.functional.cross_entropy(post.glm_moments(x_test)[0], y_test))
    glm_nll, uniform = nll(post), math.log(10)
    assert "validation" in post.info
    assert glm_nll < 0.25 * uniform and abs(glm_nll - nll(probit)) < 0.1 and glm_nll < map_nll
    assert nll(evidence) > 0.4 * uniform  # what the default avoids: the evidence's near-uniform predictive


def test_a_validation_search_ending_at_its_grids_edge_warns_and_records_it():
    # issue 37: digits-last chose δ = 10^6, the default grid's top, on every seed.  The scores of a δ do not depend on
    # the rest of the grid (one held-out MAP, the closed-form probit), so the grid's points up to the best δ end the
    # search at the upper edge, those from it at the lower edge, and its two neighbours around it inside
    bnn, x, y = _classifier()
    kwargs = dict(backend="laplace", seed=0, progress=False, map_steps=100, num_samples=2)
    wide = [10.0**k for k in range(-2, 5)]  # held-out NLL 0.94, 0.74, 0.62, 0.611, 0.613, 0.614, 0.614
    post = fit(copy.deepcopy(bnn), x, y, prior_precision_grid=wide, **kwargs)
    scores = [row["validation_nll"] for row in post.info["validation"]]
    best = scores.index(min(scores))
    assert 0 < best < len(wide) - 1 and post.info["prior_precision_at_edge"] is None  # a minimum inside this grid
    for grid, edge in ((wide[: best + 1], "upper"), (wide[best:][::-1], "lower")):  # any order
        with pytest.warns(UserWarning, match=rf"chose prior precision δ = {wide[best]:.3g}, the {edge} edge of its grid") \
                as caught:
            post = fit(copy.deepcopy(bnn), x, y, prior_precision_grid=grid, **kwargs)
        assert post.info["prior_precision_scale"] == wide[best] and post.info["prior_precision_at_edge"] == edge
        message = [w for w in caught if "validation search" in str(w.message)]
        assert len(message) == 1 and message[0].filename == __file__  # points at the call of fit
        assert "prior_precision_grid" in str(message[0].message)
        assert f"(the {edge} edge of its grid)" in repr(post)
        assert ("collapses toward the MAP" if edge == "upper" else "prior_precision='marglik'") in str(message[0].message)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*validation search")
        inside = fit(copy.deepcopy(bnn), x, y, prior_precision_grid=wide[best - 1: best + 2], **kwargs)
    assert inside.info["prior_precision_scale"] == wide[best] and inside.info["prior_precision_at_edge"] is None


def test_grid_edge_reads_any_order_and_a_single_value_is_no_search():
    from inference.laplace.evidence import grid_edge

    assert grid_edge([1.0, 0.1, 10.0], 0.1) == "lower" and grid_edge([1.0, 0.1, 10.0], 10.0) == "upper"
    assert grid_edge([1.0, 0.1, 10.0], 1.0) is None and grid_edge([3.0], 3.0) is None
