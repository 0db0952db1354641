"""A likelihood's own latents (noise precision, Student-t scale and ν) at their optimum for a fixed network.

Given the network's outputs ``f [N, P]`` on the training data and the targets ``y [N, T]``, the
latents θ of the likelihood (:meth:`~zoo.likelihoods.Likelihood.latent_priors`) are set to

    θ̂ = argmax_θ  Σ_n log p(y_n | f_n, θ) + log p(θ),

the likelihood's training objective plus the latents' log prior: with the network held fixed
this is the MAP of θ, a smooth problem in a few scalars per target.  It is solved by L-BFGS
(Liu & Nocedal 1989) with a strong-Wolfe line search in the unconstrained coordinates
``u = T⁻¹(θ)`` (``T = biject_to(support)``, as the guides parametrise them), in float64.
Deterministic pretraining (:func:`inference.optim.training.pretrain`) calls it once, after its Adam
epochs on the weights, on the last epoch's batches, so the latents reach their optimum whatever
the weights' learning rate, and the variational guide starts there.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping

import torch
from torch.distributions import biject_to

__all__ = ["fit_latents", "fit_predictive_latents", "network_outputs", "latents_at_map"]


def fit_latents(likelihood, f: torch.Tensor, y: torch.Tensor, start: Mapping[str, torch.Tensor],
                max_iter: int = 200, use_prior: bool = True) -> dict[str, torch.Tensor]:
    """The MAP of ``likelihood``'s latents for fixed outputs (see the module docstring); with ``use_prior=False``
    their maximum-likelihood value (the log prior left out: a maximum-likelihood fit's own latents).

    Args:
        likelihood: a :class:`~zoo.likelihoods.Likelihood`; its latents are its
            ``latent_priors(T)`` sites (none: ``{}`` is returned).
        f: network outputs ``[N, P]`` (standardised units, ``P = heads · T``); not differentiated.
        y: targets ``[N, T]`` (standardised units).
        start: ``{site: [T]}`` starting values; the result has their dtype and device.
        max_iter: L-BFGS iterations at most.
    Returns:
        ``{site: [T]}``, detached; ``start`` itself where the optimum is not finite.
    """
    f64, y64 = f.detach().double().unsqueeze(0), y.detach().double()
    return _latent_map(likelihood, y64.shape, f.device, start, max_iter,
                       lambda latents: likelihood.training_log_prob(f64, y64, latents).sum(), use_prior)


def fit_predictive_latents(likelihood, f: torch.Tensor, y: torch.Tensor, start: Mapping[str, torch.Tensor],
                           max_iter: int = 200) -> dict[str, torch.Tensor]:
    """The latents that maximise the *predictive* log density of a mixture over S output draws:

        θ̂ = argmax_θ  Σ_n log (1/S) Σ_s p(y_n | f_sn, θ) + log p(θ),

    for a posterior whose predictive is that mixture with the latents shared by every draw
    (MC dropout's mask draws).  With one draw it is :func:`fit_latents` on the honest density.

    Args:
        f: output draws ``[S, N, P]`` (standardised units); ``y`` ``[N, T]``; ``start`` ``{site: [T]}``.
    Returns:
        ``{site: [T]}``, detached; ``start`` itself where the optimum is not finite.
    """
    f64, y64 = f.detach().double(), y.detach().double()
    log_s = math.log(f64.shape[0])
    return _latent_map(likelihood, y64.shape, f.device, start, max_iter,
                       lambda latents: (likelihood.log_prob(f64, y64, latents).logsumexp(0) - log_s).sum())


def _latent_map(likelihood, shape: torch.Size, device, start: Mapping[str, torch.Tensor], max_iter: int,
                log_lik: Callable[[dict], torch.Tensor], use_prior: bool = True) -> dict[str, torch.Tensor]:
    """argmax over the latents θ of ``log_lik({site: [1, T]})`` + log p(θ) (without it: ``use_prior=False``) by
    L-BFGS in unconstrained float64 coordinates (the module docstring), the objective per data point (``shape`` is
    ``y``'s, ``[N, T]``)."""
    priors = likelihood.latent_priors(shape[-1], dtype=torch.float64, device=device)
    if not priors:
        return {}
    transforms = {name: biject_to(prior.support) for name, prior in priors.items()}
    raw = {name: transforms[name].inv(start[name].detach().double()).clone().requires_grad_(True) for name in priors}

    def objective() -> torch.Tensor:
        latents = {name: transforms[name](u) for name, u in raw.items()}
        log_prior = sum(priors[name].log_prob(value) for name, value in latents.items()) if use_prior else 0.0
        return -(log_lik({n: v.unsqueeze(0) for n, v in latents.items()}) + log_prior) / shape[0]

    optimizer = torch.optim.LBFGS(list(raw.values()), lr=1.0, max_iter=max_iter, tolerance_grad=1e-10,
                                  tolerance_change=1e-14, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = objective()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        fitted = {name: transforms[name](u) for name, u in raw.items()}
        if not (torch.isfinite(objective()) and all(bool(torch.isfinite(v).all()) for v in fitted.values())):
            return {name: value.detach().clone() for name, value in start.items()}
    return {name: value.to(start[name]) for name, value in fitted.items()}


def network_outputs(bnn, values: Mapping[str, torch.Tensor], batches: Iterable) -> tuple[torch.Tensor, torch.Tensor]:
    """``(f [N, P], y [N, T])``: ``bnn``'s outputs at weight values ``values`` over ``(x, y)`` ``batches``,
    without gradients, in the mode the network is in (as it trains)."""
    outputs, targets = [], []
    with torch.no_grad():
        for xb, yb in batches:
            outputs.append(bnn.forward_single(values, xb))
            targets.append(yb)
    return torch.cat(outputs), torch.cat(targets)


def latents_at_map(bnn, values: dict, batches: Iterable, use_prior: bool = True) -> dict:
    """The likelihood's latents ``{site: [T]}`` at their MAP (``use_prior=False``: maximum likelihood) for the
    weights in ``values`` (:func:`fit_latents` on the network's outputs over the ``(x, y)`` ``batches``,
    :func:`network_outputs`; eval mode for the samplers and Laplace), started from the values there."""
    weights = {k: v for k, v in values.items() if k not in bnn.latent_priors()}
    f, y = network_outputs(bnn, weights, batches)
    return fit_latents(bnn.likelihood, f, y, {k: values[k] for k in bnn.latent_priors()}, use_prior=use_prior)
