"""Notebook use: short text / HTML summaries of posteriors and predictions."""
from __future__ import annotations

import torch

from zoo.bnn import BayesianNetwork
from zoo.likelihoods import CategoricalLikelihood, GaussianLikelihood

from inference import SamplePosterior, fit


def _words(text: str) -> str:
    return " ".join(text.split())  # the columns' padding aside


def _regression():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, 3, generator=g)
    y = x[:, :1] + 0.1 * torch.randn(500, 1, generator=g)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return BayesianNetwork(net, "all", likelihood=GaussianLikelihood(learn_noise=True), output_dim=1), x, y


def test_posterior_repr_is_a_short_summary_and_an_html_table():
    bnn, x, y = _regression()
    post = fit(bnn, x, y, progress=False, epochs=2, seed=4)
    text = repr(post)
    assert text.startswith("VariationalPosterior\n") and "object at 0x" not in text and len(text) < 1000
    for expected in ("backend svi", "4 weight sites + 1 likelihood latents, 42 random scalars",
                     "200 fresh guide draws per prediction", "after 2 epochs", "seed 4"):
        assert expected in _words(text), expected
    page = post._repr_html_()
    assert page.startswith("<table>") and "<td style='text-align:left'>svi</td>" in page
    draws = {n: torch.zeros(3, 10, *bnn.site_shapes[n]) for n in bnn.site_names}
    draws["noise_precision"] = torch.ones(3, 10, 1)
    stats = {"diverging": torch.zeros(3, 10, dtype=torch.bool), "acceptance_rate": torch.full((3, 10), 0.8)}
    text = _words(repr(SamplePosterior(bnn, draws, stats, info={"backend": "nuts"})))
    assert "draws 3 chains × 10 draws" in text and "divergences 0 of 30" in text and "mean acceptance rate 0.8" in text


def test_prediction_repr_shows_shapes_and_summaries_never_tensors():
    bnn, x, y = _regression()
    post = fit(bnn, x, y, progress=False, epochs=2)
    pred = post.predict(x, y=y, seed=0)
    text = repr(pred)
    assert len(text) < 1000 and "tensor(" not in text
    assert "200 draws × 500 points × 1 outputs" in text and "mean log predictive density" in text
    assert f"mean predictive sd {float(pred.sd.mean()):.4g} (epistemic {float(pred.epistemic_sd.mean()):.4g})" in _words(text)
    assert "<th style='text-align:left;padding-right:1em'>mean PIT</th>" in pred._repr_html_()
    labels = (x[:, 0] > 0).long()
    classifier = BayesianNetwork(torch.nn.Linear(3, 2), "all", likelihood=CategoricalLikelihood(), output_dim=2)
    text = repr(fit(classifier, x, labels, progress=False, epochs=2).predict(x, seed=0))
    assert "200 draws × 500 points × 2 classes" in text and "top-class probability" in text and len(text) < 600
