"""Sparsity counts, principled vs random pruning, and repeated MC evaluation (Graves 2011; Molchanov, Ashukha & Vetrov 2017)."""
from __future__ import annotations

import math

import pytest
import torch

from inference import fit, load_posterior
from inference.variational.guides import build_guide
from inference.variational.posterior import VariationalPosterior
from inference.variational import evaluate_repeated, prune, sparsity
from zoo import BayesianNetwork, CategoricalLikelihood, GaussianLikelihood


def _bnn(out=1, likelihood=None, stochastic="all"):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, out))
    return BayesianNetwork(net, stochastic=stochastic, likelihood=likelihood or GaussianLikelihood(0.5), output_dim=out)


def _posterior(family, loc, spread, bnn=None):
    """A hand-built mean-field posterior with flat parameters ``loc``/``spread`` ``[P]``."""
    bnn = bnn or _bnn()
    guide = build_guide("mean-field", bnn, family=family)
    with torch.no_grad():
        guide.loc.copy_(loc)
        guide.scale_param.copy_(spread)
    return VariationalPosterior(bnn, guide, "mean-field", {"family": family}, {"backend": family})


P = 3 * 4 + 4 + 4 + 1  # 0.weight, 0.bias, 2.weight, 2.bias


def test_graves_sparsity_counts_are_exact():
    loc = torch.ones(P)
    log_sigma = torch.zeros(P)  # SNR 1 > 0.83: kept
    prune_idx = [0, 5, 11, 12, 17]  # 3 in 0.weight, 1 in 0.bias, 1 in 2.weight
    loc[prune_idx] = 0.5  # SNR 0.5 < 0.83
    loc[13] = -0.9  # |μ|/σ = 0.9: kept (the rule uses |μ|)
    report = sparsity(_posterior("graves", loc, log_sigma))
    assert report["pruned"] == {"0.weight": 3, "0.bias": 1, "2.weight": 1, "2.bias": 0}
    assert report["layers"]["0.weight"] == pytest.approx(3 / 12)
    assert report["sparsity"] == pytest.approx(5 / P) and report["num_weights"] == P
    assert sparsity(_posterior("graves", loc, log_sigma), threshold=0.95)["num_pruned"] == 6


def test_dropout_families_sparsity_counts_are_exact():
    loc = torch.ones(P)
    log_sigma = torch.full((P,), -2.0)  # log α = −4
    log_sigma[[1, 2, 17]] = 1.6  # log α = 3.2 > 3
    log_sigma[3] = 1.4  # log α = 2.8: kept
    assert sparsity(_posterior("sparse-vd", loc, log_sigma))["pruned"] == {"0.weight": 2, "0.bias": 0, "2.weight": 1, "2.bias": 0}
    log_alpha = torch.full((P,), -3.0)
    log_alpha[[4, 20]] = 0.0  # α at its cap
    report = sparsity(_posterior("kingma-vd", loc, log_alpha))
    assert report["num_pruned"] == 2 and report["pruned"]["2.bias"] == 1


@pytest.mark.parametrize("family", ["graves", "sparse-vd", "kingma-vd"])
def test_pruned_weights_contribute_exactly_nothing(family):
    torch.manual_seed(1)
    loc = torch.randn(P)
    spread = torch.full((P,), -1.0)
    post = _posterior(family, loc, spread)
    # make input feature 2 prunable: column 2 of 0.weight has tiny means (entries 2, 5, 8, 11)
    column = [2, 5, 8, 11]
    with torch.no_grad():
        post.guide.loc[column] = 1e-4
        if family == "sparse-vd":
            post.guide.scale_param[column] = 0.0  # log α ≈ 18 → clipped 8 > 3
        if family == "kingma-vd":
            post.guide.scale_param[column] = 0.0
    pruned, report = prune(post, mode="principled")
    assert report["pruned"]["0.weight"] >= 4
    draws = pruned.sample_params(300, seed=0)["0.weight"]
    assert bool((draws[:, :, 2] == 0).all())
    x = torch.randn(6, 3)
    x_changed = x.clone()
    x_changed[:, 2] = torch.randn(6) * 100
    a = pruned.predict(x, num_samples=50, seed=3).f
    b = pruned.predict(x_changed, num_samples=50, seed=3).f
    assert torch.equal(a, b)
    # the input posterior is untouched
    assert not bool((post.sample_params(5, seed=0)["0.weight"][:, :, 2] == 0).all())


def test_random_pruning_matches_per_layer_counts_and_is_seeded():
    torch.manual_seed(2)
    loc, spread = torch.randn(P), torch.randn(P)
    post = _posterior("graves", loc, spread)
    principled, rep_p = prune(post, "principled")
    random_a, rep_a = prune(post, "random", seed=5)
    random_b, rep_b = prune(post, "random", seed=5)
    assert rep_a["pruned"] == rep_p["pruned"] and rep_a["sparsity"] == pytest.approx(rep_p["sparsity"])
    assert rep_a["learned_sparsity"] == pytest.approx(rep_p["sparsity"])
    torch.testing.assert_close(random_a.guide.loc, random_b.guide.loc)
    assert not torch.equal(random_a.guide.loc == 0, principled.guide.loc == 0)


def test_pruned_posterior_round_trips_through_save(tmp_path):
    torch.manual_seed(3)
    post = _posterior("sparse-vd", torch.randn(P), torch.randn(P) * 3)
    pruned, _ = prune(post, "principled")
    pruned.save(tmp_path / "p")
    again = load_posterior(tmp_path / "p")
    x = torch.randn(4, 3)
    torch.testing.assert_close(again.predict(x, num_samples=8, seed=1).f, pruned.predict(x, num_samples=8, seed=1).f)
    assert sparsity(again)["sparsity"] == pytest.approx(sparsity(pruned)["sparsity"])


def test_radial_posterior_prunes_by_signal_to_noise():
    bnn = _bnn()
    x, y = torch.randn(10, 3), torch.randn(10, 1)
    post = fit(bnn, x, y, backend="radial", epochs=2, progress=False, init_scale=0.5)
    pruned, report = prune(post, "principled", threshold=100.0)  # prune everything
    assert report["sparsity"] == 1.0
    assert bool((pruned.predict(x, num_samples=3).f == pruned.predict(2 * x, num_samples=3).f).all())


def test_evaluate_repeated_reports_mean_and_sd():
    torch.manual_seed(0)
    x = torch.randn(60, 3)
    y = (x[:, 0] > 0).long()
    bnn = _bnn(out=2, likelihood=CategoricalLikelihood())
    post = fit(bnn, x, y, backend="graves", epochs=20, progress=False, init_scale=0.3)
    result = evaluate_repeated(post, x, y, T=5, n=4, seed=1)
    assert result["metric"] == "accuracy" and len(result["values"]) == 4
    assert result["mean"] == pytest.approx(sum(result["values"]) / 4)
    assert result["sd"] == pytest.approx(float(torch.tensor(result["values"], dtype=torch.float64).std()))
    assert evaluate_repeated(post, x, y, T=5, n=4, seed=1) == result


def test_bad_pruning_input_gives_clear_errors():
    bnn = _bnn()
    x, y = torch.randn(10, 3), torch.randn(10, 1)
    svi = fit(bnn, x, y, backend="svi", epochs=1, progress=False)
    with pytest.raises(ValueError, match="no variational-family weight sites"):
        prune(svi, "principled")
    with pytest.raises(ValueError, match="no variational-family weight sites"):
        sparsity(svi)
    assert prune(svi, "none")[1]["sparsity"] == 0.0  # 'none' works for any posterior
    det = fit(_bnn(stochastic="none"), x, y, backend="svi", epochs=1, progress=False)
    with pytest.raises(ValueError, match="no variational-family weight sites"):
        prune(det, "random")
    post = _posterior("sparse-vd", torch.ones(P), torch.zeros(P))
    with pytest.raises(ValueError, match="out of range"):
        prune(post, "principled", threshold=8.5)
    with pytest.raises(ValueError, match="out of range"):
        sparsity(_posterior("graves", torch.ones(P), torch.zeros(P)), threshold=math.nan)
    with pytest.raises(ValueError, match="out of range"):
        prune(_posterior("kingma-vd", torch.ones(P), torch.zeros(P)), "principled", threshold=3.0)
    with pytest.raises(ValueError, match="unknown pruning mode"):
        prune(post, "magnitude")
    with pytest.raises(ValueError, match="T must be a positive integer"):
        evaluate_repeated(post, x, y, T=0, n=2)
