"""The mean-field guide over a :class:`~zoo.bnn.BayesianNetwork`'s sites, with a fused training path.

:class:`MeanFieldGuide` puts one of the families of :mod:`inference.variational.families`
(Graves / sparse VD / Kingma VD) on every random weight site of any zoo model, and a
mean-field Normal factor on the likelihood's constrained latents.  Its parameters are two
flat vectors over all random weights — ``loc`` (μ or θ, ``[P]``) and ``scale_param``
(``log σ``, or ``log α`` for Kingma VD) — plus the latent factors.

It implements :class:`~inference.variational.protocol.PrunableGuide` (per-site mean and sd, the
family's pruning rule, log α, in-place pruning) and is used two ways:

* as a Pyro guide (``guide()`` / :func:`inference.variational.elbo.elbo_terms`): every weight site is
  sampled as ``Normal(μ, σ).to_event(...)`` and its KL comes from the family through the
  ``site_kl(name, prior)`` hook; :class:`~inference.variational.posterior.VariationalPosterior` draws
  predictions this way;
* through :meth:`MeanFieldGuide.elbo_terms`, the fused training path of the variational
  backends: one ``[P]`` noise draw for all weight sites, weights ``μ + σ ⊙ ε`` and the
  family's KL computed together by one autograd function with closed-form gradients
  (:class:`_MeanFieldDraw`), so a step costs little more than the deterministic network's —
  or, with ``estimator="lrt"``, local reparameterisation (:mod:`inference.variational.lrt`)
  for every eligible Linear/Conv layer and weight sampling for the other sites.  The network
  itself runs unchanged through :meth:`zoo.bnn.BayesianNetwork.forward_single`.
  Weight sampling with one draw per step is Graves (2011); local reparameterisation is Kingma,
  Salimans & Welling (2015).

Both give unbiased one-sample estimates of the same objective
``E_q[(N/n) Σ_batch log p(y|x,w)]`` and ``KL(q ‖ p)`` (tested against each other).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Mapping, Optional, Sequence

import pyro
import pyro.distributions as dist
import torch
from torch import nn

from inference.variational.families import Family, get_family
from inference.variational.latents import LatentFactors, normal_prior_params
from inference.variational.lrt import lrt_forward, lrt_modules, substituted_forwards
from inference.variational.protocol import PruningRule
from inference.variational.workspace import Workspace

__all__ = ["MeanFieldGuide", "ESTIMATORS", "build_mean_field_guide"]

#: training-path estimators of the expected log-likelihood
ESTIMATORS = ("weights", "lrt")


@dataclass(frozen=True)
class _Segment:
    """Where one weight site lives in the flat parameter vectors."""

    name: str
    offset: int
    numel: int
    shape: torch.Size

    @property
    def span(self) -> slice:
        return slice(self.offset, self.offset + self.numel)


@dataclass
class _DrawSpec:
    """How :class:`_MeanFieldDraw` treats each segment: weight sample or LRT moments."""

    segments: list  # [_Segment]
    moments: list  # [bool] per segment: True → output (mean, variance), False → one sample
    eps_offsets: list  # [int] offset of each sampled segment in the noise vector (−1 for moments)
    num_sampled: int
    priors: list  # [(loc, scale)] per segment (only used when the family uses the model prior)


class _MeanFieldDraw(torch.autograd.Function):
    """Fused draw of every weight site plus the family's total KL, with closed-form gradients.

    Inputs: flat ``loc`` and ``scale_param`` ``[P]``, noise ``eps`` ``[P_sampled]`` (or
    ``None``), the family and a :class:`_DrawSpec`.  Outputs: ``(KL, *per-site tensors)`` where a
    sampled site gives ``w = μ + σ ε`` (site-shaped) and an LRT site gives ``(μ, σ²)``.
    Backward: with g_σ = g_w ε (sampled) or 2σ g_{σ²} (moments),
    ∂/∂μ = g_w|g_μ + g_σ ∂σ/∂μ + g_KL ∂KL/∂μ and ∂/∂s = g_σ ∂σ/∂s + g_KL ∂KL/∂s, the KL terms
    added in place by the family — no per-site slice gradients, no intermediate graph over the
    ``[P]`` vectors.
    """

    @staticmethod
    def forward(ctx, loc, scale_param, eps, family: Family, spec: _DrawSpec, workspace: Workspace):
        taken = []  # the family's work tensors, given back to the workspace after backward

        def new(like):
            taken.append(workspace.take(like))
            return taken[-1]

        cache = {"new": new}  # intermediates a family keeps from forward for backward, and its allocator
        sigma = family.sigma(loc, scale_param, cache)
        if family.uses_model_prior:
            parts = [
                (seg.span, *family.kl_and_grads(loc[seg.span], scale_param[seg.span], sigma[seg.span], *prior))
                for seg, prior in zip(spec.segments, spec.priors)
            ]
            kl = sum(part[1] for part in parts)
            accumulators = [(span, part) for span, _, part in parts]
        else:
            kl, accumulate = family.kl_and_grads(loc, scale_param, sigma, cache=cache)
            accumulators = [(slice(None), accumulate)]
        outputs = []
        all_sampled = spec.num_sampled == loc.numel()
        flat_w = torch.addcmul(loc, sigma, eps) if all_sampled else None
        for seg, moments, eps_offset in zip(spec.segments, spec.moments, spec.eps_offsets):
            if all_sampled:
                outputs.append(flat_w[seg.span].view(seg.shape))
            elif moments:
                sig = sigma[seg.span]
                outputs += [loc[seg.span].view(seg.shape).clone(), (sig * sig).view(seg.shape)]
            else:
                noise = eps[eps_offset : eps_offset + seg.numel]
                outputs.append(torch.addcmul(loc[seg.span], sigma[seg.span], noise).view(seg.shape))
        ctx.family, ctx.spec, ctx.accumulators, ctx.cache = family, spec, accumulators, cache
        ctx.workspace, ctx.taken = workspace, taken
        ctx.save_for_backward(loc, scale_param, sigma, eps)
        return (kl, *outputs)

    @staticmethod
    def backward(ctx, g_kl, *g_outputs):
        if ctx.accumulators is None:  # its work tensors went back to the workspace after the first backward
            raise RuntimeError("the fused mean-field step supports one backward pass per forward pass "
                               "(retain_graph=True is not supported); draw a new step instead")
        loc, scale_param, sigma, eps = ctx.saved_tensors
        spec = ctx.spec
        grad_loc = torch.empty_like(loc)
        g_sigma = torch.empty_like(loc)
        outputs = iter(g_outputs)
        for seg, moments, eps_offset in zip(spec.segments, spec.moments, spec.eps_offsets):
            first = next(outputs)
            target, g_sig = grad_loc[seg.span], g_sigma[seg.span]
            if first is None:
                target.zero_()
            else:
                target.copy_(first.reshape(-1))
            if moments:
                g_var = next(outputs)
                if g_var is None:
                    g_sig.zero_()
                else:
                    torch.mul(g_var.reshape(-1), sigma[seg.span], out=g_sig).mul_(2.0)
            elif first is None:
                g_sig.zero_()
            else:
                torch.mul(first.reshape(-1), eps[eps_offset : eps_offset + seg.numel], out=g_sig)
        dsigma_dloc, dsigma_ds = ctx.family.sigma_grads(loc, scale_param, sigma, ctx.cache)
        if dsigma_dloc is not None:
            grad_loc.addcmul_(g_sigma, dsigma_dloc)
        grad_s = g_sigma.mul_(dsigma_ds)
        if g_kl is not None:
            g = float(g_kl)
            for span, accumulate in ctx.accumulators:
                accumulate(grad_loc[span], grad_s[span], g)
        ctx.workspace.give(ctx.taken)
        ctx.accumulators = ctx.cache = ctx.taken = None  # a second backward is refused (above)
        return grad_loc, grad_s, None, None, None, None


class MeanFieldGuide(nn.Module):
    """A variational family on every random weight site of a :class:`~zoo.bnn.BayesianNetwork`.

    Args:
        bnn: the model (its sites, priors and likelihood latents define the guide).
        init_values: ``{site: site-shaped tensor}`` initial means (default: the net's weights; the
            likelihood's latents, where given, e.g. by pretraining, else their prior means).
        family: ``"graves"``, ``"sparse-vd"`` or ``"kingma-vd"``.
        init_scale: initial posterior sd of every weight (and of the latents' factors).
        prior_mean, prior_sd: Graves family only — replace the model's Normal weight prior by
            N(prior_mean, prior_sd²) in the KL (either may be given; the other keeps the model's).
        fixed_latents: likelihood latents held at their ``init_values`` as point masses
            (:class:`~inference.variational.latents.LatentFactors`' ``fixed``; the dropout families' pretrained
            noise, :func:`inference.variational.fit.fit_guide`).

    Raises:
        ValueError: the model has no random weight sites, the family is unknown, or the Graves
            family meets a non-Normal prior without ``prior_mean``/``prior_sd``.
    """

    def __init__(
        self,
        bnn,
        init_values: Optional[Mapping[str, torch.Tensor]] = None,
        family: str = "graves",
        init_scale: float = 1e-3,
        prior_mean: Optional[float] = None,
        prior_sd: Optional[float] = None,
        fixed_latents: Sequence[str] = (),
    ):
        super().__init__()
        self.family = get_family(family)
        if not bnn.sites:
            raise ValueError(
                f"the {family!r} family needs random weights but the model has none (stochastic='none'); "
                f"choose stochastic='all', 'last' or a module pattern"
            )
        if not (math.isfinite(init_scale) and init_scale > 0):
            raise ValueError(f"init_scale must be positive, got {init_scale}")
        if (prior_mean is not None or prior_sd is not None) and not self.family.uses_model_prior:
            raise ValueError(f"prior_mean/prior_sd apply to the Graves family only; {family!r} uses a log-uniform prior")
        if prior_sd is not None and not (math.isfinite(prior_sd) and prior_sd > 0):
            raise ValueError(f"prior_sd must be positive, got {prior_sd}")
        init_values = dict(init_values) if init_values is not None else bnn.initial_values()
        segments, offset = [], 0
        for site in bnn.sites:
            segments.append(_Segment(site.name, offset, site.numel, site.shape))
            offset += site.numel
        self.segments = segments
        self._by_name = {seg.name: seg for seg in segments}
        self._sites = {site.name: site for site in bnn.sites}
        loc = torch.cat([init_values[seg.name].detach().reshape(-1) for seg in segments])
        self.loc = nn.Parameter(loc)
        self.scale_param = nn.Parameter(self.family.init_param(loc, float(init_scale)))
        self.prior_override = (prior_mean, prior_sd)
        self._priors = [self._site_prior(seg.name, bnn.prior_distributions()[seg.name]) for seg in segments]
        self.latents = LatentFactors(bnn.latent_priors(), float(init_scale), init_values, fixed_latents)
        self._specs: dict = {}
        self._workspace = Workspace()  # the fused step's reusable [P] work tensors

    # ------------------------------------------------------------------ VariationalGuide protocol
    def sites(self) -> list[str]:
        """The random weight sites, in the model's order."""
        return [seg.name for seg in self.segments]

    def _segment(self, name: str) -> _Segment:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"{name!r} is not a weight site of this guide; its sites: {', '.join(self.sites())}") from None

    def site_params(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loc, scale_param)`` of weight site ``name``: site-shaped views of the trained vectors."""
        seg = self._segment(name)
        return self.loc[seg.span].view(seg.shape), self.scale_param[seg.span].view(seg.shape)

    def site_loc_scale(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(μ, σ)`` of weight site ``name`` (σ from the family's parameterisation), detached."""
        with torch.no_grad():
            loc, s = self.site_params(name)
            return loc.detach(), self.family.sigma(loc, s)

    def pruning_rule(self) -> PruningRule:
        return self.family.pruning_rule

    def log_alpha(self, name: str) -> torch.Tensor:
        """The family's log α of weight site ``name`` (clipped as in its KL for the dropout families)."""
        with torch.no_grad():
            return self.family.log_alpha(*self.site_params(name))

    def prune_(self, name: str, mask: torch.Tensor) -> None:
        """Set μ = 0 and σ = 0 (log σ = −∞; Kingma VD: σ = |θ|√α = 0 with θ = 0) where ``mask`` holds."""
        loc, s = self.site_params(name)
        with torch.no_grad():
            loc[mask] = 0.0
            if self.family.param_name == "log_sigma":
                s[mask] = -math.inf

    def sigma(self) -> torch.Tensor:
        """Posterior sd of every weight, flat ``[P]``."""
        return self.family.sigma(self.loc, self.scale_param)

    def _site_prior(self, name, prior):
        if not self.family.uses_model_prior:
            return (0.0, 1.0)
        mean, sd = self.prior_override
        if mean is not None and sd is not None:
            return (float(mean), float(sd))
        model_mean, model_sd = normal_prior_params(prior, name)
        return (
            float(mean) if mean is not None else model_mean,
            float(sd) if sd is not None else model_sd,
        )

    def _prior_flat(self, value):
        return value if isinstance(value, float) else value.reshape(-1).to(self.loc.dtype)

    # ------------------------------------------------------------------ Pyro guide
    def forward(self, *args, **kwargs) -> dict:
        """Pyro guide: sample every weight site and latent (same ``*args`` as ``bnn.model``)."""
        sigma = self.sigma()
        values = {}
        for seg in self.segments:
            loc = self.loc[seg.span].view(seg.shape)
            scale = sigma[seg.span].view(seg.shape)
            # validate_args=False: pruned weights have σ = 0 exactly (a point mass at 0)
            values[seg.name] = pyro.sample(
                seg.name, dist.Normal(loc, scale, validate_args=False).to_event(len(seg.shape))
            )
        values.update(self.latents.pyro_sample())
        return values

    def site_kl(self, name: str, prior) -> Optional[torch.Tensor]:
        """KL(q_site ‖ prior) for a weight site (the family's formula), ``None`` for latents."""
        seg = self._by_name.get(name)
        if seg is None:
            return None
        loc, scale_param = self.loc[seg.span], self.scale_param[seg.span]
        prior_loc, prior_scale = self._site_prior(name, prior)
        return self.family.kl(
            loc, scale_param, self._prior_flat(prior_loc), self._prior_flat(prior_scale)
        ).sum()

    # ------------------------------------------------------------------ fused training path
    def _spec(self, bnn, estimator: str) -> tuple[_DrawSpec, dict]:
        if estimator not in ESTIMATORS:
            raise ValueError(f"unknown estimator {estimator!r}; valid estimators: {', '.join(ESTIMATORS)}")
        if estimator not in self._specs:
            plan = lrt_modules(bnn.net, self._sites) if estimator == "lrt" else {}
            lrt_sites = {name for pair in plan.values() for name in pair if name is not None}
            moments, eps_offsets, num_sampled = [], [], 0
            for seg in self.segments:
                is_moment = seg.name in lrt_sites
                moments.append(is_moment)
                eps_offsets.append(-1 if is_moment else num_sampled)
                num_sampled += 0 if is_moment else seg.numel
            priors = [
                (self._prior_flat(m), self._prior_flat(s)) for m, s in self._priors
            ]
            self._specs[estimator] = (_DrawSpec(self.segments, moments, eps_offsets, num_sampled, priors), plan)
        return self._specs[estimator]

    def lrt_module_names(self, bnn) -> list[str]:
        """Modules that ``estimator="lrt"`` locally reparameterises (the rest sample weights)."""
        return list(self._spec(bnn, "lrt")[1])

    def elbo_terms(self, bnn, x, y, num_data: int, estimator: str = "weights") -> tuple[torch.Tensor, torch.Tensor]:
        """One-sample ``(E_q[(N/n) Σ log p(y|x,w)], KL(q‖p))`` on a minibatch, fused.

        Args:
            bnn: the model this guide was built for.
            x, y: minibatch ``[n, ...]``, targets as for :func:`inference.fit`.
            num_data: ``N``, the full data size.
            estimator: ``"weights"`` (one weight draw per step, Graves 2011) or ``"lrt"``.
        Returns:
            scalars with gradients: the scaled expected log-likelihood and the total KL
            (weights: the family's closed form; latents: one-sample Monte Carlo).
        """
        spec, plan = self._spec(bnn, estimator)
        eps = (torch.randn(spec.num_sampled, dtype=self.loc.dtype, device=self.loc.device)
               if spec.num_sampled else None)
        kl, *outputs = _MeanFieldDraw.apply(self.loc, self.scale_param, eps, self.family, spec, self._workspace)
        drawn, outputs = {}, iter(outputs)
        for seg, moments in zip(spec.segments, spec.moments):
            drawn[seg.name] = (next(outputs), next(outputs)) if moments else next(outputs)
        modules = dict(bnn.net.named_modules())
        forwards = {}
        for module_name, (weight, bias) in plan.items():
            module = modules[module_name]
            w_mean, w_var = drawn.pop(weight)
            b_mean, b_var = drawn.pop(bias) if bias is not None else (None, None)
            forwards[module_name] = partial(_lrt_call, module, w_mean, w_var, b_mean, b_var)
        latents, latent_kl = self.latents.rsample_with_kl()
        with substituted_forwards(bnn.net, forwards):
            f = bnn.forward_single(drawn, x)
        log_lik = bnn.likelihood.training_log_prob(f.unsqueeze(0), y, {k: v.unsqueeze(0) for k, v in latents.items()})
        return log_lik.sum() * (num_data / x.shape[0]), kl + latent_kl


def _lrt_call(module, w_mean, w_var, b_mean, b_var, x):
    if b_mean is None and getattr(module, "bias", None) is not None:
        b_mean = module.bias  # deterministic bias (read at call time: functional_call may swap it)
    return lrt_forward(module, x, w_mean, w_var, b_mean, b_var)


def build_mean_field_guide(bnn, init_values, **kwargs) -> MeanFieldGuide:
    """Guide builder for :data:`inference.variational.guides.GUIDES` (keyword arguments of :class:`MeanFieldGuide`)."""
    return MeanFieldGuide(bnn, init_values, **kwargs)
