"""K Radial fits (the ``radial`` backend on its fused ELBO path, exact cross-entropy) as one stacked program.

Each fit follows :func:`inference.variational.fit.fit_guide` with the Radial guide
(:class:`inference.variational.radial.AutoRadial`, Farquhar, Osborne & Gal 2020) on a model whose weight
priors are all Normal, as :mod:`inference.variational.stacked_svi` does for the mean-field guide:

1. deterministic pretraining (``pretrain_epochs``), stacked
   (:func:`~inference.variational.stacked_svi.pretrain_stacked`);
2. fit k's guide built as one fit builds it (under ``torch.manual_seed(seed_k)``);
3. per step and fit, :meth:`AutoRadial.elbo_terms` with the exact cross-entropy: w = μ + e^s ⊙ ξ with
   ξ = r ε/‖ε‖ per weight tensor, and

       KL(q ‖ N(m, p²)) = Σ_i [log p_i + ½ log 2π + ((μ_i − m_i)² + σ_i²/D) / (2 p_i²)] − Σ_i s_i − H(ξ_D)

   (:func:`inference.variational.radial_kl.radial_exact_kl_rows`, the family's one Radial KL), the
   likelihood latents' one-sample log q − log p, and the network once for all fits.

Random numbers: fit k draws from its own generator, which continues the global stream its
one-at-a-time fit would use, in that fit's order — each Radial site's ε then r, then the other sites'
Normal noise, then the data plate's ``randperm(N)`` on a minibatch step.  The rule-based sparsity
(``track_sparsity``) is recorded per epoch from each fit's own guide, as one fit records it.  What
differs from one-at-a-time fits is float rounding (the KL's gradient comes from autograd here, from
a written-out backward there).
"""
from __future__ import annotations

import math
import time
from typing import Optional

import pyro
import torch

from inference.multifit.stacked import stacked_body, stacked_forward, stacked_log_likelihood, write_body
from inference.optim.stacked_training import run_stacked_loop
from inference.optim.map import run_info
from inference.optim.training import HISTORY_KEYS, NonFiniteLossError
from inference.variational.guides import normal_prior_blocker, stock_model_blocker
from inference.variational.length import HELD_OUT_LENGTH_BLOCKER, chooses_length
from inference.variational.pruning import guide_sparsity
from inference.variational.radial import radial_noise
from inference.variational.radial_kl import radial_exact_kl_rows, resolve_mc_kl
from inference.variational.stacked_svi import latent_draw, stacked_guides, stacked_noise, stacked_normal_priors
from inference.variational.posterior import VariationalPosterior

__all__ = ["fit_radial_stacked", "radial_stack_blocker"]


def radial_stack_blocker(bnn, config) -> Optional[str]:
    """Why a ``radial`` fit cannot join a stacked batch (the backend's own reason), or ``None``: the stacked
    engine runs the fused path with the exact cross-entropy and Normal weight priors."""
    if chooses_length(config):
        return HELD_OUT_LENGTH_BLOCKER
    if config.elbo_path == "pyro-trace":
        return "the radial fit takes the Pyro-trace ELBO path (requested)"
    if resolve_mc_kl(config.mc_kl_samples, config.mc_kl_estimator)[1] != "exact":
        return "the radial fit estimates the cross-entropy by Monte Carlo (mc_kl_samples / mc_kl_estimator)"
    reason = stock_model_blocker(bnn)
    if reason is not None:
        return f"the radial fit cannot take the fused path ({reason})"
    reason = normal_prior_blocker(bnn)
    return None if reason is None else f"{reason}; the exact Radial cross-entropy needs a Normal one"


def fit_radial_stacked(bnns: list, xs: torch.Tensor, ys: torch.Tensor, config, seeds: list, progress: bool) -> list:
    """K ``radial`` fits on the fused path with the exact cross-entropy; per fit a
    :class:`~inference.variational.posterior.VariationalPosterior`, or a :class:`~inference.optim.training.NonFiniteLossError`
    carrying its last finite posterior.

    Args as :func:`inference.optim.stacked_map.fit_map_stacked`; ``config`` is a
    :class:`~inference.backends.variational.RadialConfig` whose estimator resolves to ``"exact"``.
    """
    started = time.perf_counter()
    template, count = bnns[0], len(bnns)
    guide_kwargs = {"init_scale": config.init_scale, "mc_kl_samples": config.mc_kl_samples,
                    "mc_kl_estimator": config.mc_kl_estimator}
    data, guides, noise_generators = stacked_guides(bnns, xs, ys, config, seeds, "radial", guide_kwargs)
    num_data = data.num_data
    radial_sites = dict(guides[0]._radial_sites)  # name -> event dims, the model's order
    other_sites = list(guides[0]._other_sites)
    sites = list(radial_sites) + other_sites
    locs = {n: torch.stack([g.site_params(n)[0].detach() for g in guides]).clone().requires_grad_(True) for n in sites}
    log_scales = {n: torch.stack([g.site_params(n)[1].detach() for g in guides]).clone().requires_grad_(True)
                  for n in sites}
    priors = {n: stacked_normal_priors(bnns, n, locs[n]) for n in radial_sites}
    latent_priors = template.latent_priors()
    weight_names = {s.name for s in template.sites}
    body = stacked_body(bnns)  # a last-layer model's body, trained jointly (after pretraining: its pretrained values)
    forward = stacked_forward(template, body=bool(body))
    threshold, track = config.prune_threshold, config.track_sparsity
    histories = [{key: [] for key in HISTORY_KEYS + ("sparsity", "layer_sparsity")} for _ in bnns]
    snapshots: dict = {}

    def fill_noise(n, out, generator):  # locs' order: the radial sites, then the others, as the guide draws them
        if n in radial_sites:
            out.copy_(radial_noise(out.shape, radial_sites[n], locs[n], generator))
        else:
            out.normal_(generator=generator)

    def step_terms(xb, yb):
        noise = stacked_noise(locs, noise_generators, xb.shape[1], num_data, fill_noise)
        kl, values, latent_values = 0.0, {}, {}
        for n in radial_sites:
            values[n] = torch.addcmul(locs[n], torch.exp(log_scales[n]), noise[n])
            kl = kl + radial_exact_kl_rows(locs[n], log_scales[n], *priors[n])  # the family's one Radial KL
        for n in other_sites:
            latent_values[n], estimate = latent_draw(locs[n], torch.exp(log_scales[n]), log_scales[n], noise[n],
                                                     latent_priors[n])
            kl = kl + estimate
        weights = {n: v for n, v in values.items() if n in weight_names}
        f = forward(weights, body, xb) if body else forward(weights, xb)
        log_lik = stacked_log_likelihood(template.likelihood, f, yb, latent_values)
        return log_lik * (num_data / xb.shape[1]), kl

    def load(k: int, fitted: dict) -> None:
        with torch.no_grad():
            for n in sites:
                loc, log_scale = guides[k].site_params(n)
                loc.copy_(fitted[n][0])
                log_scale.copy_(fitted[n][1])

    def current(k: int) -> dict:
        return {n: (locs[n][k].detach().clone(), log_scales[n][k].detach().clone()) for n in sites}

    def on_stop(k, step, what):
        snapshots[k] = (step, what, current(k), {n: v[k].detach().clone() for n, v in body.items()})

    rule = guides[0].pruning_rule()
    rule_threshold = rule.check_threshold(threshold)
    pruned_sites = [n for n in radial_sites if n in weight_names]

    def on_epoch(epoch, alive):
        """Each fit's rule-based sparsity (:func:`inference.variational.pruning.guide_sparsity` on its guide:
        |μ| / (σ/√D) below the threshold, or already pruned), computed on the stacked tensors."""
        with torch.no_grad():
            counts, layers = {}, {}
            for n in pruned_sites:
                loc = locs[n].detach()
                scale = torch.exp(log_scales[n].detach() - 0.5 * math.log(max(1, loc[0].numel())))
                mask = ((loc == 0) & (scale == 0)) | rule.mask(loc.abs() / scale, rule_threshold)
                counts[n] = mask.reshape(count, -1).sum(1).tolist()
                layers[n] = mask.reshape(count, -1).float().mean(1).tolist() if mask[0].numel() else [0.0] * count
        total = sum(locs[n][0].numel() for n in pruned_sites)
        for k in alive:
            histories[k]["layer_sparsity"].append({n: layers[n][k] for n in pruned_sites})
            histories[k]["sparsity"].append(sum(counts[n][k] for n in pruned_sites) / total if total else 0.0)

    with pyro.validation_enabled(False):
        stopped = run_stacked_loop(step_terms, list(locs.values()) + list(log_scales.values()) + list(body.values()),
                                   data, config, histories, f"radial x{count} ({template.num_random} random)", progress, on_stop,
                                   on_epoch if track else None)
    seconds = (time.perf_counter() - started) / count
    results = []
    for k, (bnn, guide) in enumerate(zip(bnns, guides)):
        load(k, snapshots[k][2] if k in snapshots else current(k))
        write_body(bnn, *((snapshots[k][3], None) if k in snapshots else (body, k)))
        info = run_info("radial", config, int(seeds[k]), xs[k], started, num_samples=config.num_samples,
                        history=histories[k], mc_kl_samples=None, mc_kl_estimator="exact", elbo_path="fused",
                        sparsity=guide_sparsity(guide, bnn, threshold), multifit={"fits": count, "index": k})
        info["fit_seconds"] = seconds  # this fit's share of the batch's wall time
        posterior = VariationalPosterior(bnn, guide, "radial", guide_kwargs, info)
        results.append(posterior if stopped[k] is None else NonFiniteLossError(stopped[k], snapshots[k][1], posterior))
    return results
