"""K mean-field SVI fits (the ``svi`` backend on its fused ELBO path) as one stacked program.

Each fit follows :func:`inference.variational.fit.fit_guide` with the default guide (Pyro's ``AutoNormal``,
:class:`inference.variational.guides.NormalGuide`) on a model whose weight priors are all Normal:

1. deterministic pretraining (``pretrain_epochs``; :func:`inference.optim.training.pretrain`): the fits'
   weights stacked, one Adam, each fit's mean loss on its own minibatches, then per fit the
   likelihood's latents at their MAP (:func:`inference.optim.latent_fit.fit_latents`) on its last
   epoch's batches and ``update_reference`` of its model;
2. fit k's guide built as one fit builds it (under ``torch.manual_seed(seed_k)``), so its
   starting parameters are the one-at-a-time fit's;
3. the KL-weighted ELBO of every fit per step (:func:`inference.variational.elbo.mean_field_normal_elbo_terms`
   stacked): w = μ + softplus(ρ) ε, the closed-form Normal KL of the family
   (:func:`inference.variational.families.normal_kl`, Blundell et al. 2015), the latents' one-sample
   log q − log p, the network once for all fits.

Random numbers: fit k draws its noise from its own generator, which continues the global stream
its one-at-a-time fit would use (the state after its guide's construction), one ``normal_`` per
site in the model's order and the data plate's ``randperm(N)`` per minibatch step, exactly as the
fused path draws them.  So every fit sees its one-at-a-time fit's random numbers, and its result
does not depend on which other fits share its batch; what differs is float rounding.
The trained parameters are copied into each fit's own guide, so prediction, saving and the ArviZ
export are those of a one-at-a-time ``svi`` fit.
"""
from __future__ import annotations

import math
import time

import pyro
import torch
import torch.nn.functional as F
from torch.distributions import biject_to

from inference.multifit.stacked import (StackedBatches, stacked_body, stacked_forward, stacked_log_likelihood,
                                        write_body)
from inference.optim.latent_fit import fit_latents
from inference.optim.map import run_info
from inference.optim.stacked_training import run_stacked_loop
from inference.optim.training import HISTORY_KEYS, NonFiniteLossError
from inference.variational.elbo_paths import choose_elbo_path
from inference.variational.families import normal_kl
from inference.variational.guides import build_guide
from inference.variational.latents import normal_prior_params
from inference.variational.length import HELD_OUT_LENGTH_BLOCKER, chooses_length
from inference.variational.posterior import VariationalPosterior

__all__ = ["fit_svi_stacked", "svi_stack_blocker", "pretrain_stacked", "stacked_guides", "stacked_noise",
           "stacked_normal_priors", "latent_draw"]

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def stacked_normal_priors(bnns: list, name: str, like: torch.Tensor) -> tuple:
    """``(m, s)`` of site ``name``'s Normal prior in every fit: floats when all fits share them, else
    ``[K, *shape]`` tensors."""
    params = [normal_prior_params(bnn.prior_distributions()[name], name) for bnn in bnns]
    if all(not isinstance(m, torch.Tensor) and not isinstance(s, torch.Tensor) for m, s in params) \
            and len(set(params)) == 1:
        return params[0]
    return tuple(torch.stack([torch.as_tensor(p[i], dtype=like.dtype, device=like.device).expand(like.shape[1:])
                              for p in params]) for i in (0, 1))


def pretrain_stacked(bnns: list, data: StackedBatches, epochs: int, lr: float) -> list:
    """:func:`inference.optim.training.pretrain` of K fits at once; returns per fit ``{site: value}`` (weights and
    latents).  Each fit's loss is its mean −log-likelihood per minibatch, with the latents at their prior means.
    Trained deterministic parameters (a last-layer model's body, :func:`stacked_body`) train with the sites, and
    each fit's are written into its network, where a one-at-a-time pretraining leaves them."""
    template, count = bnns[0], len(bnns)
    body = stacked_body(bnns)
    forward = stacked_forward(template, body=bool(body))

    def outputs(values, xb):
        return forward(values, body, xb) if body else forward(values, xb)

    latents = {n: d.mean.expand(count, *d.mean.shape) for n, d in template.latent_priors().items()}
    values = {n: torch.stack([bnn.initial_values()[n] for bnn in bnns]).to(data.x).requires_grad_(True)
              for n in (s.name for s in template.sites)}
    params = list(values.values()) + list(body.values())
    optimizer = torch.optim.Adam(params, lr=lr, foreach=True) if params else None
    last_epoch = []
    for _ in range(epochs if params else 0):
        last_epoch.clear()
        for xb, yb in data.epoch():
            last_epoch.append((xb, yb))
            f = outputs(values, xb)
            loss = -stacked_log_likelihood(template.likelihood, f, yb, latents) / yb.shape[1]
            optimizer.zero_grad()
            loss.sum().backward()
            optimizer.step()
    fitted = [{n: v[k].detach().clone() for n, v in values.items()} for k in range(count)]
    for k, bnn in enumerate(bnns):
        write_body(bnn, body, k)
    if latents:
        batches = last_epoch or [(data.x, data.y)]
        with torch.no_grad():
            f = torch.cat([outputs(values, xb) for xb, _ in batches], dim=1)
        y = torch.cat([yb for _, yb in batches], dim=1)
        start = {n: d.mean for n, d in template.latent_priors().items()}
        for k in range(count):
            fitted[k].update(fit_latents(template.likelihood, f[k], y[k], start))
    return fitted


def stacked_guides(bnns: list, xs: torch.Tensor, ys: torch.Tensor, config, seeds: list, guide_name: str,
                   guide_kwargs: dict) -> tuple:
    """What every stacked variational engine does before its loop: ``(data, guides, noise_generators)``.

    Fit k's minibatches come from a generator seeded with ``seeds[k]`` (:class:`StackedBatches`); with
    ``config.pretrain_epochs`` the fits are pretrained together (:func:`pretrain_stacked`) and each model's
    reference updated; then fit k's guide ``guide_name`` is built as one fit builds it, under
    ``torch.manual_seed(seeds[k])``, and ``noise_generators[k]`` = (the device's generator for its noise, the CPU
    one for the data plate's ``randperm``) continue the global streams its one-at-a-time fit would use."""
    count = len(bnns)
    generators = [torch.Generator().manual_seed(int(seed)) for seed in seeds]
    data = StackedBatches(xs, ys, config.batch_size, generators)
    init = [None] * count
    if config.pretrain_epochs:
        init = pretrain_stacked(bnns, data, config.pretrain_epochs, config.pretrain_lr or config.lr)
        for bnn, values in zip(bnns, init):
            bnn.update_reference({s.name: values[s.name] for s in bnn.sites})
    device = xs.device
    guides, noise_generators = [], []
    for bnn, values, seed in zip(bnns, init, seeds):
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(int(seed))
            guides.append(build_guide(guide_name, bnn, init_values=values, **guide_kwargs))
            cpu = torch.Generator().set_state(torch.get_rng_state())
            on_device = cpu if device.type == "cpu" else \
                torch.Generator(device).set_state(torch.cuda.get_rng_state(device) if device.type == "cuda"
                                                  else torch.get_rng_state())
            noise_generators.append((on_device, cpu))
    return data, guides, noise_generators


def stacked_noise(locs: dict, noise_generators: list, batch_rows: int, num_data: int, fill) -> dict:
    """One step's base noise ``{site: [K, *shape]}`` (``locs``' shapes), each fit's drawn from its own generators
    in its one-at-a-time fit's order: ``fill(site, out, generator)`` writes fit k's row ``out`` of each site in
    ``locs``' order, then, for a minibatch (``batch_rows < num_data``), the data plate's subsample permutation
    is drawn from the fit's CPU generator (the fused path draws it; the rows come from the stacked batches)."""
    noise = {n: torch.empty_like(loc) for n, loc in locs.items()}
    for k, (generator, cpu) in enumerate(noise_generators):
        for n in noise:
            fill(n, noise[n][k], generator)
        if batch_rows < num_data:
            torch.randperm(num_data, generator=cpu)
    return noise


def latent_draw(loc: torch.Tensor, scale: torch.Tensor, log_scale: torch.Tensor, noise: torch.Tensor,
                prior) -> tuple:
    """``(z, kl [K])``: each fit's likelihood latent z = T(μ + σ ε), T = ``biject_to(prior.support)``, and the
    one-sample estimate log q(z) − log p(z) (with log N(u | μ, σ) at u = μ + σ ε = −ε²/2 − log σ − log √(2π))."""
    count = loc.shape[0]
    u = torch.addcmul(loc, scale, noise)
    transform = biject_to(prior.support)
    z = transform(u)
    log_q = (-0.5 * noise * noise - log_scale - _HALF_LOG_2PI).reshape(count, -1).sum(1) \
        - transform.log_abs_det_jacobian(u, z).reshape(count, -1).sum(1)
    return z, log_q - prior.log_prob(z).reshape(count, -1).sum(1)


def svi_stack_blocker(bnn, config):
    """Why an ``svi`` fit cannot join a stacked batch (the backend's own reason), or ``None``: the stacked
    engine runs the fused ELBO path only (:func:`inference.variational.elbo_paths.choose_elbo_path`)."""
    if chooses_length(config):
        return HELD_OUT_LENGTH_BLOCKER
    path, reason = choose_elbo_path(bnn, config)
    return None if path == "fused" else f"the svi fit takes the Pyro-trace ELBO path ({reason})"


def fit_svi_stacked(bnns: list, xs: torch.Tensor, ys: torch.Tensor, config, seeds: list, progress: bool) -> list:
    """K ``svi`` fits on the fused path; per fit a :class:`~inference.variational.posterior.VariationalPosterior`, or a
    :class:`~inference.optim.training.NonFiniteLossError` carrying its last finite posterior.

    Args as :func:`inference.optim.stacked_map.fit_map_stacked`; ``config`` is an
    :class:`~inference.backends.svi.SVIConfig` with the ``normal`` guide.
    """
    started = time.perf_counter()
    template, count = bnns[0], len(bnns)
    guide_kwargs = {"init_scale": config.init_scale, **(config.guide_options or {})}
    data, guides, noise_generators = stacked_guides(bnns, xs, ys, config, seeds, config.guide, guide_kwargs)
    num_data = data.num_data
    sites = [name for name, _, _ in guides[0]._site_parameters()]
    weights = [s.name for s in template.sites]
    locs = {n: torch.stack([p.detach() for g in guides for name, p, _ in g._site_parameters() if name == n])
            .clone().requires_grad_(True) for n in sites}
    raws = {n: torch.stack([r.detach() for g in guides for name, _, r in g._site_parameters() if name == n])
            .clone().requires_grad_(True) for n in sites}
    priors = {n: stacked_normal_priors(bnns, n, locs[n]) for n in weights}
    latent_priors = template.latent_priors()
    body = stacked_body(bnns)  # a last-layer model's body, trained jointly (after pretraining: its pretrained values)
    forward = stacked_forward(template, body=bool(body))
    histories = [{key: [] for key in HISTORY_KEYS} for _ in bnns]
    snapshots: dict = {}

    def step_terms(xb, yb):
        noise = stacked_noise(locs, noise_generators, xb.shape[1], num_data,
                              lambda n, out, generator: out.normal_(generator=generator))
        kl, values, latent_values = 0.0, {}, {}
        for n in weights:
            sigma = torch.log1p(torch.exp(raws[n]))  # softplus(ρ) as the fused path computes it
            values[n] = torch.addcmul(locs[n], sigma, noise[n])
            kl = kl + normal_kl(locs[n], sigma, *priors[n]).reshape(count, -1).sum(1)  # the family's one KL
        for n, prior in latent_priors.items():
            scale = F.softplus(raws[n])
            latent_values[n], estimate = latent_draw(locs[n], scale, torch.log(scale), noise[n], prior)
            kl = kl + estimate
        f = forward(values, body, xb) if body else forward(values, xb)
        log_lik = stacked_log_likelihood(template.likelihood, f, yb, latent_values)
        return log_lik * (num_data / xb.shape[1]), kl

    def on_stop(k, step, what):
        snapshots[k] = (step, what, {n: (locs[n][k].detach().clone(), raws[n][k].detach().clone()) for n in sites},
                        {n: v[k].detach().clone() for n, v in body.items()})

    with pyro.validation_enabled(False):
        stopped = run_stacked_loop(step_terms, list(locs.values()) + list(raws.values()) + list(body.values()), data,
                                   config, histories, f"svi x{count} ({template.num_random} random)", progress, on_stop)
    seconds = (time.perf_counter() - started) / count
    results = []
    for k, (bnn, guide) in enumerate(zip(bnns, guides)):
        with torch.no_grad():
            for n, loc, raw in guide._site_parameters():
                fitted = snapshots[k][2][n] if k in snapshots else (locs[n][k], raws[n][k])
                loc.copy_(fitted[0])
                raw.copy_(fitted[1])
        write_body(bnn, *((snapshots[k][3], None) if k in snapshots else (body, k)))
        info = run_info("svi", config, int(seeds[k]), xs[k], started, num_samples=config.num_samples,
                        history=histories[k], elbo_path="fused", multifit={"fits": count, "index": k})
        info["fit_seconds"] = seconds  # this fit's share of the batch's wall time
        posterior = VariationalPosterior(bnn, guide, config.guide, guide_kwargs, info)
        results.append(posterior if stopped[k] is None else NonFiniteLossError(stopped[k], snapshots[k][1], posterior))
    return results
