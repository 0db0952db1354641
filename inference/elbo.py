"""A KL-weighted evidence lower bound on Pyro traces.

For a guide q(z) and model p(y, z) the loss on a minibatch of size n out of N is

    L(β) = −(N/n) Σ_{i∈batch} E_q[log p(y_i | z)] + β · KL(q(z) ‖ p(z))

(Blundell et al. 2015, eq. 8; β < 1 during KL annealing, Bowman et al. 2016).  The
KL is computed per latent site: analytically where ``torch.distributions.kl_divergence``
knows the pair (mean-field Normal guide on an unconstrained site against a Normal
prior), through a guide's own ``site_kl(name, prior)`` hook where the guide provides one
(e.g. the Radial guide's M-sample cross-entropy), and otherwise by the single-sample
Monte Carlo estimate log q(z) − log p(z) at the guide's draw.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from pyro import poutine
from pyro.distributions import Delta
from pyro.poutine.util import site_is_subsample
from torch.distributions import kl_divergence

__all__ = ["ElboTerms", "elbo_terms"]


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
