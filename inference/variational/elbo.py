"""A KL-weighted evidence lower bound, on Pyro traces and on a fused path for mean-field Normal guides.

For a guide q(z) and model p(y, z) the loss on a minibatch of size n out of N is

    L(β) = −(N/n) Σ_{i∈batch} E_q[log p(y_i | z)] + β · KL(q(z) ‖ p(z))

(Blundell et al. 2015, eq. 8; β < 1 during KL annealing, Bowman et al. 2016).  The
KL is computed per latent site: analytically where ``torch.distributions.kl_divergence``
knows the pair (mean-field Normal guide on an unconstrained site against a Normal
prior), through a guide's own ``site_kl(name, prior)`` hook where the guide provides one
(e.g. the Radial guide's M-sample cross-entropy), and otherwise by the single-sample
Monte Carlo estimate log q(z) − log p(z) at the guide's draw.

:func:`elbo_terms` works for any guide and model through Pyro traces.
:func:`mean_field_normal_elbo_terms` is the same estimator for a mean-field Normal guide
(``AutoNormal``) whose weight sites all have Normal priors, without traces: one noise tensor per
site, the weights and their closed-form KL from one autograd function with a written-out
backward pass, and the network run once (used by :class:`inference.variational.guides.NormalGuide`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn.functional as F
from pyro import poutine
from pyro.distributions import Delta
from pyro.poutine.util import site_is_subsample
from torch.distributions import Normal, biject_to, kl_divergence

from inference.variational.families import normal_kl_sum

__all__ = ["ElboTerms", "elbo_terms", "NormalFactor", "mean_field_normal_elbo_terms"]


@dataclass
class ElboTerms:
    """One-particle ELBO pieces (scalars with gradients)."""

    expected_log_likelihood: torch.Tensor
    kl: torch.Tensor

    def loss(self, kl_weight: float = 1.0) -> torch.Tensor:
        return -self.expected_log_likelihood + kl_weight * self.kl


def _scaled_log_prob(site) -> torch.Tensor:
    lp = site["fn"].log_prob(site["value"]).sum()
    return lp * site["scale"] if site["scale"] != 1.0 else lp


def _analytic_site_kl(guide, name, guide_trace, prior):
    hook = getattr(guide, "site_kl", None)
    if hook is not None:
        value = hook(name, prior)
        if value is not None:
            return value, {name, name + "_unconstrained"}
    q_site = guide_trace.nodes[name]
    aux = guide_trace.nodes.get(name + "_unconstrained")
    if aux is None or not isinstance(q_site["fn"], Delta):
        return None, set()
    if prior.support is not torch.distributions.constraints.real and not (
        getattr(prior.support, "base_constraint", None) is torch.distributions.constraints.real
    ):
        return None, set()
    try:
        kl = kl_divergence(aux["fn"], prior)
    except NotImplementedError:
        return None, set()
    return kl.sum(), {name, name + "_unconstrained"}


def elbo_terms(model, guide, *args, **kwargs) -> ElboTerms:
    """Run guide and model once and return the ELBO's likelihood and KL terms."""
    guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
    model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args, **kwargs)
    log_lik = torch.zeros(())
    kl = torch.zeros(())
    handled: set[str] = set()
    for name, site in model_trace.nodes.items():
        if site["type"] != "sample" or site_is_subsample(site):
            continue
        if site["is_observed"]:
            log_lik = log_lik + _scaled_log_prob(site)
            continue
        analytic, covered = _analytic_site_kl(guide, name, guide_trace, site["fn"])
        if analytic is not None:
            kl = kl + analytic
            handled |= covered
        else:
            kl = kl - _scaled_log_prob(site)
    for name, site in guide_trace.nodes.items():
        if site["type"] == "sample" and name not in handled and not site_is_subsample(site):
            kl = kl + _scaled_log_prob(site)
    return ElboTerms(log_lik, kl)


# ---------------------------------------------------------------------- fused mean-field Normal path
@dataclass(frozen=True)
class NormalFactor:
    """One weight site of a mean-field Normal guide against a Normal prior.

    Attributes:
        loc: μ, the guide's location parameter (site-shaped, with gradient).
        raw_scale: ρ, the unconstrained scale parameter; σ = softplus(ρ) = log(1 + e^ρ)
            (Pyro's ``softplus_positive`` constraint of ``AutoNormal``'s scales).
        prior_loc, prior_scale: m and s of the prior N(m, s²) (floats, or tensors broadcastable
            against ``loc``).
    """

    loc: torch.Tensor
    raw_scale: torch.Tensor
    prior_loc: object
    prior_scale: object


class _SoftplusNormalDraw(torch.autograd.Function):
    """w_k = μ_k + softplus(ρ_k) ε_k for every site k, and Σ_k KL(N(μ_k, σ_k²) ‖ N(m_k, s_k²)).

    The KL is the closed form (Kingma & Welling 2014, appendix B; Blundell et al. 2015)

        KL = Σ_i log(s / σ_i) + (σ_i² + (μ_i − m)²) / (2 s²) − ½

    (:func:`inference.variational.families.normal_kl_sum`, the family's one Gaussian KL), and the backward pass is written out, so each site costs a handful of element-wise passes and
    no autograd graph:  ∂/∂μ = g_w + g_KL (μ − m)/s²,  ∂/∂ρ = (g_w ε + g_KL (σ/s² − 1/σ)) · sigmoid(ρ).
    σ is computed as log1p(e^ρ) and sigmoid(ρ) as e^ρ / (1 + e^ρ) from the same e^ρ (equal to
    ``F.softplus`` below its threshold; e^ρ overflows, and the loop stops on the non-finite loss,
    only for σ > 88).
    Inputs: the factors' ``(m, s)`` list, the noise list (site-shaped, standard Normal) and the
    flat ``(μ_1, ρ_1, μ_2, ρ_2, ...)``.  Outputs: ``(KL, w_1, w_2, ...)``.
    """

    @staticmethod
    def forward(ctx, priors, noise, *params):
        kl = params[0].new_zeros(())
        weights, sigmas, exps = [], [], []
        for (m, s), eps, loc, raw in zip(priors, noise, params[0::2], params[1::2]):
            exp_raw = torch.exp(raw)
            sigma = torch.log1p(exp_raw)  # softplus(ρ): these two vectorised passes beat F.softplus
            exps.append(exp_raw)
            weights.append(torch.addcmul(loc, sigma, eps))
            kl = kl + normal_kl_sum(loc, sigma, m, s)  # the family's one Gaussian KL
            sigmas.append(sigma)
        ctx.priors, ctx.noise = priors, noise
        ctx.save_for_backward(*params, *sigmas, *exps)
        return (kl, *weights)

    @staticmethod
    def backward(ctx, g_kl, *g_weights):
        saved, k = ctx.saved_tensors, len(ctx.priors)
        params, sigmas, exps = saved[: 2 * k], saved[2 * k : 3 * k], saved[3 * k :]
        beta = 0.0 if g_kl is None else float(g_kl)
        grads = []
        for (m, s), eps, loc, sigma, exp_raw, g_w in zip(ctx.priors, ctx.noise, params[0::2], sigmas, exps, g_weights):
            if g_w is None:
                g_w = torch.zeros_like(loc)
            grad_loc, g_sigma = g_w, g_w * eps
            if beta != 0.0:
                diff = loc - m if isinstance(m, torch.Tensor) or m != 0.0 else loc
                if isinstance(s, torch.Tensor):
                    grad_loc = grad_loc + beta * diff / (s * s)
                    g_sigma = g_sigma + beta * (sigma / (s * s) - sigma.reciprocal())
                else:
                    grad_loc = torch.add(grad_loc, diff, alpha=beta / (s * s))
                    g_sigma.add_(sigma, alpha=beta / (s * s)).sub_(sigma.reciprocal_(), alpha=beta)
            # dσ/dρ = sigmoid(ρ) = e^ρ / (1 + e^ρ); σ and e^ρ are this function's own buffers, updated in
            # place (fewer large temporaries per step; a second backward pass is refused by autograd)
            grads += [grad_loc, g_sigma.mul_(exp_raw).div_(exp_raw.add_(1.0))]
        return (None, None, *grads)


def mean_field_normal_elbo_terms(
    bnn, factors: Mapping[str, NormalFactor], latents: Mapping[str, tuple], x, y, num_data: int
) -> ElboTerms:
    """One-draw ELBO terms of a mean-field Normal guide without Pyro traces (the fused path).

    The same estimator as :func:`elbo_terms` on the same guide — reparameterised draws
    w = μ + σ ε (Kingma & Welling 2014), the analytic Normal–Normal KL for the weight sites
    (Blundell et al. 2015) and the one-sample estimate log q(z) − log p(z) for the likelihood
    latents — computed directly: one noise tensor per site, drawn in the model's site order with
    the generator Pyro's path uses (and, with minibatches, the data plate's permutation drawn and
    discarded), so for a seed both paths see the same random numbers; weights and KL from
    :class:`_SoftplusNormalDraw`; the likelihood through
    :meth:`~zoo.bnn.BayesianNetwork.forward_single` and the likelihood's ``training_log_prob`` (β-NLL for a heteroscedastic likelihood).

    Args:
        bnn: the model (a :class:`~zoo.bnn.BayesianNetwork` whose Pyro model is the stock one).
        factors: ``{weight site: NormalFactor}`` in the model's order.
        latents: ``{latent site: (loc, raw_scale)}`` (unconstrained-space Normal factors of the
            likelihood's latents, σ = softplus(ρ)), in the model's order.
        x, y: minibatch ``[n, ...]`` and its targets.
        num_data: ``N``, the full data size; the log-likelihood is scaled by N/n.
    Returns:
        :class:`ElboTerms` (scalars with gradients).
    """
    noise = [torch.empty_like(f.loc).normal_() for f in factors.values()]
    latent_noise = [torch.empty_like(loc).normal_() for loc, _ in latents.values()]
    if x.shape[0] < num_data:
        torch.randperm(num_data)  # the data plate's subsample draw on Pyro's path (keeps the stream aligned)
    priors = [(f.prior_loc, f.prior_scale) for f in factors.values()]
    params = [t for f in factors.values() for t in (f.loc, f.raw_scale)]
    kl, *weights = _SoftplusNormalDraw.apply(priors, noise, *params) if factors else (x.new_zeros(()),)
    values = dict(zip(factors, weights))
    latent_values, latent_priors = {}, bnn.latent_priors()
    for (name, (loc, raw)), eps in zip(latents.items(), latent_noise):
        scale = F.softplus(raw)
        u = torch.addcmul(loc, scale, eps)
        transform = biject_to(latent_priors[name].support)
        z = transform(u)
        log_q = Normal(loc, scale).log_prob(u).sum() - transform.log_abs_det_jacobian(u, z).sum()
        kl = kl + log_q - latent_priors[name].log_prob(z).sum()
        latent_values[name] = z.unsqueeze(0)
    f = bnn.forward_single(values, x)
    log_lik = bnn.likelihood.training_log_prob(f.unsqueeze(0), y, latent_values).sum() * (num_data / x.shape[0])
    return ElboTerms(log_lik, kl)
