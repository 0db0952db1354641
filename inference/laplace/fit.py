"""The Laplace fit: a Gaussian around the MAP of the random subset (MacKay 1992), assembled from the parts
of :mod:`inference.laplace` (the ``laplace`` backend's options are
:class:`~inference.backends.laplace.LaplaceConfig`; :func:`fit_laplace` reads them):

1. MAP and curvature (:func:`inference.laplace.map_ggn.map_and_curvature`): the MAP
   (:func:`inference.optim.start.initial_point`; ``init="current"`` keeps the network's weights, post-hoc
   Laplace, Daxberger et al. 2021, and sets the likelihood's latents to their MAP for them), then the GGN of
   the negative log-likelihood over the random *weights* there (:mod:`inference.laplace.curvature`; every
   likelihood): dense ``[P, P]`` for small subsets (last layer, named modules: subnetwork Laplace,
   Daxberger et al. 2021); for large ones Kronecker-factored per ``nn.Linear`` layer (KFAC, Martens &
   Grosse 2015; Ritter et al. 2018) or diagonal.  The network runs in eval mode (its modes are restored):
   no dropout, batch normalisation on its running statistics, never updated.  Likelihood latents are
   fixed at their MAP values for the curvature and in every draw.
2. Prior precision δ·P₀ (:mod:`inference.laplace.evidence`): ``P₀`` is the model prior's precision and
   ``μ₀`` its mean.  ``prior_precision="model"`` keeps δ = 1 (the model's own prior; exact for Bayesian
   linear regression); a number λ is the precision of an isotropic prior N(μ₀, λ⁻¹ I) (P₀ = 1, δ = λ;
   laplace-torch's ``prior_precision``); ``"marglik"`` maximises the Laplace evidence log Z(δ) by MacKay's
   fixed point with the MAP held (Immer et al. 2021); ``"validation"`` holds out a seeded random
   ``validation_fraction`` (0.2) of the rows (or each of ``validation_folds`` folds in turn), fits the MAP
   and GGN on the rest for the refit's epochs, takes the δ of
   ``prior_precision_grid`` (default 10^-4 … 10^6, five a decade) with the lowest validation NLL of the
   classification predictive (probit, bridge in closed form; glm by ``num_samples`` Monte Carlo draws of the
   logits; Kristiadi, Hein & Hennig 2020), and fits the MAP and GGN again on all rows (search, then refit;
   ``info["validation"]``).  ``"auto"`` (the default) is ``"validation"`` for a classifier's probit, bridge
   and glm predictives from a MAP fit, ``"marglik"`` otherwise (regression; the ``sample`` predictive; a
   network taken as it is): on a classifier whose MAP separates its training rows the evidence's δ leaves
   every predictive near-uniform (:mod:`inference.laplace.evidence`).  ``info["log_evidence"]`` is log Z
   at the chosen δ (laplace-torch's ``log_marginal_likelihood``).
3. Posterior N(w*, (G + δP₀)⁻¹); ``num_samples`` draws are taken at fit end into a
   :class:`~inference.laplace.laplace_posterior.LaplacePosterior` (one chain).  Predictives
   (:mod:`inference.laplace.laplace_posterior`): ``"glm"`` Monte Carlo over the network linearised at the
   MAP (Immer et al. 2021), ``"sample"`` the network itself at the draws (which Immer et al. 2021
   show to underfit when the random subset is large), and for classification ``"probit"``
   (MacKay 1992) and ``"bridge"`` (Hobbhahn et al. 2022) in closed form.  ``"auto"`` (default):
   probit for a categorical likelihood, glm otherwise.  Where the network is linear in its random
   weights (``stochastic="last"``) glm and sample coincide.
"""
from __future__ import annotations

import time

import torch

from inference.laplace.curvature import WeightLayout, effective_dim, evaluation_mode, jacobian_path
from inference.laplace.evidence import log_evidence, mackay_precision, prior_moments, validation_search
from inference.laplace.laplace_posterior import KronRoot, LaplacePosterior, gaussian_draws
from inference.laplace.map_ggn import covariance_root, hessian_structure, map_and_curvature
from inference.optim.map import run_info
from inference.optim.start import map_budget

__all__ = ["fit_laplace"]


def fit_laplace(bnn, x, y, config, seed: int, progress: bool, name: str = "laplace") -> LaplacePosterior:
    """The Laplace posterior of ``bnn`` on ``(x [N, ...], y [N, T] or [N])`` (module docstring).

    ``config`` is a :class:`~inference.backends.laplace.LaplaceConfig` (validated; its
    ``resolved_predictive`` and ``resolved_prior_precision`` resolve ``"auto"``); ``name`` is the backend
    recorded in ``info``.  The network runs in eval mode and its modes are given back after the fit.

    Raises:
        ValueError: no random weights, a network ``torch.func.vmap`` cannot batch over weight draws,
            ``prior_precision="model"`` without a Normal weight prior, a KFAC structure the sites or
            priors do not allow, or a Jacobian path that cannot be taken (all before the MAP fit).
    """
    with evaluation_mode(bnn.net):  # the network's modes are given back after the fit
        return _fit(bnn, x, y, config, seed, progress, name)


def _fit(bnn, x, y, config, seed, progress, name):
    started = time.perf_counter()
    layout = WeightLayout(bnn)
    if layout.dim == 0:
        raise ValueError("the laplace backend needs random weights; choose stochastic='all', 'last' or a pattern")
    if bnn.batched_draws is False:  # the GLM predictive vmaps over the network's weights
        raise ValueError(f"the laplace backend needs a network that torch.func.vmap can batch over weight draws; "
                         f"this one cannot ({bnn.batching_error}); use svi, map, ensemble or sgld, or make the "
                         f"layer without a batching rule deterministic")
    predictive = config.resolved_predictive(bnn.likelihood)
    rule = config.resolved_prior_precision(predictive, bnn.likelihood)
    mu0, p0, normal = prior_moments(bnn, layout)
    if rule == "model" and not normal:
        raise ValueError(f"prior_precision='model' needs a Normal prior on the weights, got {bnn.prior!r}; "
                         f"use prior_precision='marglik' (an isotropic Gaussian prior tuned by the evidence)")
    if not isinstance(rule, str):  # an isotropic prior of the given precision
        p0 = torch.ones_like(p0)
    structure = hessian_structure(config.hessian, config.max_full_dim, layout)
    if structure == "kfac":  # unsupported sites or layer priors: clear errors before the MAP fit
        KronRoot.check_prior(layout, p0)
    path = jacobian_path(layout, layout.flatten(bnn.initial_values()).detach(), x)  # refuses before the fit
    map_steps = map_budget(x.shape[0]) if config.map_steps is None else int(config.map_steps)
    fit_options = {"init": config.init, "map_steps": map_steps, "map_lr": config.map_lr}
    search = {}
    if rule == "validation":
        search = validation_search(bnn, layout, x, y, structure, path, p0, predictive, seed, progress,
                                   validation_fraction=config.validation_fraction, folds=config.validation_folds,
                                   grid=config.prior_precision_grid, num_samples=config.num_samples, **fit_options)
    w, latents, log_lik, eigenvalues, basis, record = map_and_curvature(bnn, layout, x, y, structure, path, p0,
                                                                        progress=progress, seed=seed, **fit_options)
    mu0 = mu0.to(w.device)
    sq_norm = float((p0.to(w.device) * (w.double() - mu0) ** 2).sum())
    if rule == "marglik":
        delta = mackay_precision(eigenvalues, sq_norm)
    elif rule == "validation":
        delta = search.pop("prior_precision_scale")
    else:
        delta = 1.0 if rule == "model" else float(rule)
    scale = covariance_root(structure, basis, (eigenvalues + delta).rsqrt(), w.dtype)
    draws = gaussian_draws(layout, w, scale, latents, config.num_samples, seed)
    info = run_info(name, config, seed, x, started, **{
        "num_random": layout.dim, "hessian_structure": structure, "jacobian_path": path, "predictive": predictive,
        "prior_precision_scale": delta, "effective_dim": effective_dim(eigenvalues, delta),
        "log_evidence": log_evidence(log_lik, eigenvalues, sq_norm, delta),
        "map_log_likelihood": log_lik, **record, **search,
    })  # fmt: skip
    return LaplacePosterior(bnn, draws, w.detach(), scale, predictive, info=info)
