"""Per-member and mixture metrics of a multi-chain posterior (deep ensembles, multi-chain MCMC, ...).

A :class:`~inference.posterior.SamplePosterior` with C > 1 chains is one Bayesian model
average: its prediction is the equally weighted mixture over all draws of all chains
(:meth:`~inference.posterior.Posterior.predict`).  :func:`member_metrics` adds what each
chain ("member") predicts on its own — the same metrics over that chain's draws only — and
how much the members disagree:

* regression: ``disagreement`` = mean over points and outputs of sd_c(μ_c) / σ_mix, the
  spread (population sd across members) of the members' predictive means μ_c relative to
  the mixture's predictive sd σ_mix (noise included); 0 when the members agree, and
  sd_c(μ_c)² ≤ σ_mix² always (law of total variance), so it lies in [0, 1];
* classification: ``disagreement`` = mean over points of the mutual information
  H(p̄) − (1/C) Σ_c H(p_c) between the prediction and the member (in nats), with p_c the
  member's mean class probabilities and p̄ their average (the ensemble disagreement of
  Lakshminarayanan et al. 2017, the BALD quantity of Houlsby et al. 2011).
"""
from __future__ import annotations

import torch

from zoo.likelihoods.mixture import PredictiveMixture

from inference.evaluation.metrics import evaluate
from inference.prediction import Prediction

__all__ = ["member_predictions", "member_metrics", "disagreement"]


def member_predictions(mixture: Prediction, num_chains: int, y=None) -> list[Prediction]:
    """Each chain's prediction, read off the prediction over all draws of all chains (chain-major, as
    :meth:`~inference.posterior.SamplePosterior.predict` draws them): rows ``[c·D, (c+1)·D)`` of its draws,
    log-likelihoods and predictive mixture; PIT values at targets ``y`` (original units) from that mixture.
    No network is evaluated again."""
    size = mixture.num_samples // num_chains
    parts = []
    for c in range(num_chains):
        rows = slice(c * size, (c + 1) * size)
        components = None
        if mixture.mixture is not None:
            full = mixture.mixture

            def take(value):
                return None if value is None else value.expand(full.loc.shape[0], *value.shape[1:])[rows]

            components = PredictiveMixture(full.loc[rows], take(full.scale), take(full.df))
        parts.append(Prediction(
            task=mixture.task, f=mixture.f[rows], y=mixture.y[rows],
            noise_var=None if mixture.noise_var is None else mixture.noise_var[rows],
            log_lik=None if mixture.log_lik is None else mixture.log_lik[rows],
            pit=components.cdf(y) if (components is not None and y is not None and mixture.pit is not None) else None,
            mixture=components))
    return parts


def disagreement(members: list[Prediction], mixture: Prediction) -> float:
    """The members' disagreement (see the module docstring); ``members`` are the chains' predictions."""
    if mixture.task == "regression":
        means = torch.stack([m.mean for m in members])  # [C, N, O]
        return float((means.std(0, unbiased=False) / mixture.sd).mean())
    probs = torch.stack([m.mean for m in members])  # [C, N, K]
    return float((_entropy(probs.mean(0)) - _entropy(probs).mean(0)).mean())


def _entropy(p: torch.Tensor) -> torch.Tensor:
    return -(p * p.clamp_min(1e-30).log()).sum(-1)


@torch.no_grad()
def member_metrics(posterior, x: torch.Tensor, y: torch.Tensor, mixture: Prediction,
                   seed: int = 0) -> dict:
    """Metrics of each chain and of their mixture at test data ``(x, y)``.

    Each member's prediction is its chains' rows of ``mixture`` (:func:`member_predictions`): the test set
    is predicted once.

    Args:
        posterior: a posterior with ``C > 1`` chains.
        x, y: test inputs and targets (``y`` in original units, as for ``predict``).
        mixture: the prediction ``posterior.predict(x, y=y, seed=seed)`` over all draws.
        seed: the seed ``mixture`` was predicted with (kept for the callers; the members are read off it).
    Returns:
        ``{"num_members": C, "mixture": {...}, "per_member": [{...} × C], "member_mean": {...},
        "disagreement": float}``; each ``{...}`` is :func:`inference.evaluation.metrics.evaluate`'s dict.
    Raises:
        ValueError: fewer than two chains, or a ``mixture`` that is not over all draws.
    """
    if posterior.num_chains < 2:
        raise ValueError(f"member metrics need a posterior with at least 2 chains, got {posterior.num_chains}")
    if mixture.num_samples != posterior.default_num_samples:
        raise ValueError(f"the mixture prediction has {mixture.num_samples} draws but the posterior holds "
                         f"{posterior.default_num_samples}; predict with all of them")
    if mixture.f.shape[1] != x.shape[0]:
        raise ValueError(f"the mixture prediction has {mixture.f.shape[1]} points but x has {x.shape[0]} rows")
    predictions = member_predictions(mixture, posterior.num_chains, posterior.check_targets(x, y))
    per_member = [evaluate(p, y) for p in predictions]
    return {
        "num_members": posterior.num_chains,
        "mixture": evaluate(mixture, y),
        "per_member": per_member,
        "member_mean": {k: sum(m[k] for m in per_member) / len(per_member) for k in per_member[0]},
        "disagreement": disagreement(predictions, mixture),
    }

