"""The Radial variational family (Farquhar, Osborne & Gal 2020) as a Pyro AutoGuide, with an
exact or M-independent Monte Carlo KL (Nazarovs, Mehta, Lokhande & Singh 2021).

**Family.**  For one parameter tensor with D entries (Farquhar, Osborne & Gal 2020)

    w = μ + σ ⊙ ξ,   ξ = r · ε/‖ε‖,   ε ~ N(0, I_D),  r ~ N(0, 1),

normalised over the whole tensor, per draw.  ξ = |r| d with d uniform on the sphere, so its
density at u is  2φ(‖u‖) / (S_{D−1} ‖u‖^{D−1}),  S_{D−1} = 2π^{D/2}/Γ(D/2), and the entropy is
analytic (Farquhar et al. 2020 eq. 5, with the constant made explicit):

    H(q) = Σ_i log σ_i + ½ log(πe/2) + log S_{D−1} − (D−1)(γ + log 2)/2.

**Prior cross-entropy** E_q[−log p(w)]: in closed form for Normal priors (the default), or by
M Monte Carlo draws with the M-independent "reparameterized" estimator of Nazarovs et al. (2021)
or the naive one — see :mod:`inference.variational.radial_kl`.

:class:`AutoRadial` is an ``AutoGuide`` for any Pyro model: Radial factors on real-valued sites,
the ``AutoNormal`` construction on constrained ones (e.g. a noise precision).  Its
``site_kl(name, prior)`` hook returns −H(q) + cross-entropy, which :mod:`inference.variational.elbo` uses
in place of a one-sample estimate.  It implements :class:`~inference.variational.protocol.PrunableGuide`
with the marginal sd σ/√D per weight (E ξ_i² = 1/D) and the signal-to-noise rule of Graves (2011),
and runs in Pyro's module-local parameter mode (:class:`~inference.variational.protocol.ModuleLocalParams`).
"""
from __future__ import annotations

import math
from operator import attrgetter
from typing import Optional

import pyro
import torch
from pyro.distributions import TorchDistribution, constraints
from pyro.infer.autoguide import AutoGuide
from pyro.infer.autoguide.initialization import InitMessenger, init_to_feasible
from pyro.infer.autoguide.utils import deep_setattr
from pyro.nn import PyroModule, PyroParam
from torch.distributions import biject_to

from inference.variational.latents import is_real_support, normal_prior_params, sample_unconstrained, unconstrained_draw
from inference.variational.protocol import SNR_RULE, ModuleLocalParams, PruningRule
from inference.variational.radial_kl import (
    DEFAULT_CHUNK_ELEMENTS,
    MC_KL_ESTIMATORS,
    _normal_cross_entropy,
    radial_cross_entropy,
    radial_entropy_constant,
    radial_noise_chunks,
    resolve_mc_kl,
)

__all__ = [
    "RadialNormal",
    "AutoRadial",
    "MC_KL_ESTIMATORS",
    "radial_noise",
    "radial_noise_chunks",
    "radial_cross_entropy",
    "resolve_mc_kl",
]


def radial_noise(shape: torch.Size, event_dim: int, like: torch.Tensor,
                 generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """ξ = r ε/‖ε‖ of ``shape``, normalised over the last ``event_dim`` dims (no gradient).

    Draws ε ``[shape]`` then r ``[batch, 1, ..]`` from ``generator`` (default: the global one, the
    stream of :meth:`RadialNormal.rsample`), with the dtype and device of ``like``.
    """
    options = {"dtype": like.dtype, "device": like.device, "generator": generator}
    eps = torch.randn(shape, **options)
    dims = tuple(range(-event_dim, 0))
    norm = torch.linalg.vector_norm(eps, dim=dims, keepdim=True) if event_dim else eps.abs()
    radius = torch.randn(shape[: len(shape) - event_dim] + (1,) * event_dim, **options)
    return eps.mul_(radius.div_(norm))


class RadialNormal(TorchDistribution):
    """The Radial distribution over tensors: ``μ + σ ⊙ r ε/‖ε‖``, normalised over the event dims.

    Args:
        loc, scale: tensors of shape ``batch_shape + event_shape``.
        event_dim: number of rightmost dims forming one Radial vector (default: all of them).
    """

    arg_constraints = {}
    has_rsample = True

    def __init__(self, loc: torch.Tensor, scale: torch.Tensor, event_dim: Optional[int] = None, validate_args=None):
        loc, scale = torch.broadcast_tensors(loc, scale)
        self.loc, self.scale = loc, scale
        event_dim = loc.dim() if event_dim is None else int(event_dim)
        split = loc.dim() - event_dim
        super().__init__(loc.shape[:split], loc.shape[split:], validate_args=False)

    @constraints.dependent_property
    def support(self):
        return constraints.independent(constraints.real, len(self.event_shape))

    @property
    def _event_dims(self) -> tuple:
        return tuple(range(-len(self.event_shape), 0))

    def expand(self, batch_shape, _instance=None):
        shape = torch.Size(batch_shape) + self.event_shape
        return RadialNormal(self.loc.expand(shape), self.scale.expand(shape), len(self.event_shape))

    def rsample(self, sample_shape=torch.Size()):
        xi = radial_noise(self._extended_shape(sample_shape), len(self.event_shape), self.loc)
        return self.loc + self.scale * xi

    def log_prob(self, value):
        dim = max(1, self.event_shape.numel())
        u = (value - self.loc) / self.scale
        rho = torch.linalg.vector_norm(u, dim=self._event_dims) if self.event_shape else u.abs()
        log_sphere = math.log(2.0) + 0.5 * dim * math.log(math.pi) - math.lgamma(0.5 * dim)
        log_scale = self.scale.log().sum(self._event_dims) if self.event_shape else self.scale.log()
        return 0.5 * math.log(2 / math.pi) - 0.5 * rho**2 - log_sphere - (dim - 1) * torch.log(rho) - log_scale

    def entropy(self):
        log_scale = self.scale.log().sum(self._event_dims) if self.event_shape else self.scale.log()
        return log_scale + radial_entropy_constant(max(1, self.event_shape.numel()))


class _RadialExactDraw(torch.autograd.Function):
    """w_k = μ_k + e^{s_k} ⊙ ξ_k for every Radial site k, and Σ_k KL(q_k ‖ N(m_k, p_k²)) with the exact
    cross-entropy (:mod:`inference.variational.radial_kl`) minus the entropy (module docstring):

        KL_k = Σ_i [log p_i + ½ log 2π + ((μ_i − m_i)² + σ_i²/D) / (2 p_i²)] − Σ_i s_i − H(ξ_D).

    The backward pass is written out, so a site costs a handful of element-wise passes and no
    autograd graph:  ∂/∂μ = g_w + g_KL (μ − m)/p²,  ∂/∂s = g_w ξ σ + g_KL (σ²/(D p²) − 1).
    Inputs: the sites' ``(m, p)`` (floats or broadcastable tensors), their noise ξ (site-shaped;
    this function's own: the backward pass reuses it) and the flat ``(μ_1, s_1, μ_2, s_2, ...)``.
    Outputs: ``(KL, w_1, w_2, ...)``.
    """

    @staticmethod
    def forward(ctx, priors, noise, *params):
        kl = params[0].new_zeros(())
        weights, sigmas = [], []
        for (m, p), xi, loc, log_scale in zip(priors, noise, params[0::2], params[1::2]):
            sigma = torch.exp(log_scale)
            weights.append(torch.addcmul(loc, sigma, xi))
            entropy = log_scale.sum() + radial_entropy_constant(max(1, loc.numel()))
            kl = kl + _normal_cross_entropy(loc, sigma, m, p) - entropy  # as site_kl, without its graph
            sigmas.append(sigma)
        ctx.priors, ctx.noise = priors, noise
        ctx.save_for_backward(*params[0::2], *sigmas)
        return (kl, *weights)

    @staticmethod
    def backward(ctx, g_kl, *g_weights):
        saved, k = ctx.saved_tensors, len(ctx.priors)
        beta = 0.0 if g_kl is None else float(g_kl)
        grads = []
        for (m, p), xi, loc, sigma, g_w in zip(ctx.priors, ctx.noise, saved[:k], saved[k:], g_weights):
            if g_w is None:
                g_w = torch.zeros_like(loc)
            grad_loc, grad_s = g_w, xi.mul_(g_w).mul_(sigma)  # ξ is this function's own buffer
            if beta != 0.0:
                dim = max(1, loc.numel())
                centred = loc - m if isinstance(m, torch.Tensor) or m != 0.0 else loc
                if isinstance(p, torch.Tensor):
                    grad_loc = grad_loc + beta * centred / (p * p)
                    grad_s = grad_s + beta * (sigma * sigma / (dim * p * p) - 1.0)
                else:
                    grad_loc = torch.add(grad_loc, centred, alpha=beta / (p * p))
                    grad_s.addcmul_(sigma, sigma, value=beta / (dim * p * p)).sub_(beta)
            grads += [grad_loc, grad_s]
        return (None, None, *grads)


class AutoRadial(ModuleLocalParams, AutoGuide):
    """Radial posterior (Farquhar, Osborne & Gal 2020) on every real-valued latent site of a Pyro model.

    Args:
        model: a Pyro model (e.g. ``bnn.model``); sites must lie outside plates (global latents).
        init_loc_fn: per-site initialisation of μ (Pyro's ``init_to_*`` functions).
        init_scale: initial σ of every entry (and of the constrained sites' Normal factors).
        mc_kl_samples: M, Monte Carlo draws of the prior cross-entropy per step (≥ 1); give it to
            use a Monte Carlo estimator (default: none, the exact cross-entropy).
        mc_kl_estimator: ``"exact"`` (closed form; Normal priors), ``"reparameterized"``
            (M-independent; Normal priors) or ``"naive"`` (any prior); default from
            :func:`~inference.variational.radial_kl.resolve_mc_kl`.
        chunk_elements: noise elements held at once while accumulating (memory bound).
    """

    def __init__(
        self,
        model,
        *,
        init_loc_fn=init_to_feasible,
        init_scale: float = 1e-3,
        mc_kl_samples: Optional[int] = None,
        mc_kl_estimator: Optional[str] = None,
        chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    ):
        mc_kl_samples, mc_kl_estimator = resolve_mc_kl(mc_kl_samples, mc_kl_estimator)
        if not (math.isfinite(init_scale) and init_scale > 0):
            raise ValueError(f"init_scale must be positive, got {init_scale}")
        self.init_scale = float(init_scale)
        self.mc_kl_samples = int(mc_kl_samples)
        self.mc_kl_estimator = mc_kl_estimator
        self.chunk_elements = int(chunk_elements)
        super().__init__(InitMessenger(init_loc_fn)(model))

    def _setup_prototype(self, *args, **kwargs):
        super()._setup_prototype(*args, **kwargs)
        self.locs = PyroModule()
        self.log_scales = PyroModule()
        self._radial_sites: dict[str, int] = {}
        self._other_sites: dict[str, tuple] = {}
        for name, site in self.prototype_trace.iter_stochastic_nodes():
            if any(frame.vectorized for frame in site["cond_indep_stack"]):
                raise ValueError(f"AutoRadial supports global latent sites only; {name!r} lies inside a plate")
            support = site["fn"].support
            init = biject_to(support).inv(site["value"].detach()).detach()
            deep_setattr(self.locs, name, PyroParam(init, constraints.real))
            deep_setattr(self.log_scales, name, PyroParam(torch.full_like(init, math.log(self.init_scale)), constraints.real))
            if is_real_support(support):
                self._radial_sites[name] = site["fn"].event_dim
            else:
                self._other_sites[name] = (support, site["fn"].event_dim)

    def site_params(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(μ, log σ)`` of site ``name`` (the trainable tensors themselves)."""
        return _raw_param(self.locs, name), _raw_param(self.log_scales, name)

    # ------------------------------------------------------------------ VariationalGuide protocol
    def sites(self) -> list[str]:
        """The Radial (real-valued) sites, in the model's order."""
        return list(self._radial_sites)

    def _radial_params(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        if name not in self._radial_sites:
            raise KeyError(f"{name!r} is not a Radial site of this guide; its sites: {', '.join(self.sites())}")
        return self.site_params(name)

    def site_loc_scale(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(μ, σ/√D)``: the mean and the marginal sd of each of the site's D entries, detached."""
        with torch.no_grad():
            loc, log_scale = self._radial_params(name)
            return loc.detach(), torch.exp(log_scale - 0.5 * math.log(max(1, loc.numel())))

    def pruning_rule(self) -> PruningRule:
        """|μ|/(σ/√D) < λ (Graves 2011's signal-to-noise rule on the marginal sd)."""
        return SNR_RULE

    def log_alpha(self, name: str) -> torch.Tensor:
        """−2 log(|μ| √D / σ) of every entry of site ``name`` (α = marginal variance / μ²)."""
        loc, scale = self.site_loc_scale(name)
        return -2.0 * torch.log(loc.abs() / scale)

    def prune_(self, name: str, mask: torch.Tensor) -> None:
        """Set μ = 0 and σ = 0 (log σ = −∞) where ``mask`` holds: w = 0 in every draw."""
        loc, log_scale = self._radial_params(name)
        with torch.no_grad():
            loc[mask] = 0.0
            log_scale[mask] = -math.inf

    def forward(self, *args, **kwargs) -> dict:
        if self.prototype_trace is None:
            self._setup_prototype(*args, **kwargs)
        values = {}
        for name, event_dim in self._radial_sites.items():
            loc, log_scale = self.site_params(name)
            values[name] = pyro.sample(name, RadialNormal(loc, log_scale.exp(), event_dim))
        for name, (support, event_dim) in self._other_sites.items():
            loc, log_scale = self.site_params(name)
            values[name] = sample_unconstrained(name, loc, log_scale.exp(), support, event_dim)
        return values

    def site_kl(self, name: str, prior) -> Optional[torch.Tensor]:
        """−H(q_site) + the prior cross-entropy (exact, or from M draws) for a Radial site; ``None`` for
        the others (one-sample MC KL)."""
        if name not in self._radial_sites:
            return None
        loc, log_scale = self.site_params(name)
        entropy = log_scale.sum() + radial_entropy_constant(max(1, loc.numel()))
        cross = radial_cross_entropy(
            loc, log_scale.exp(), prior, self.mc_kl_samples, self.mc_kl_estimator, self.chunk_elements, name,
            self._normal_params(name, prior) if self.mc_kl_estimator != "naive" else None,
        )
        return cross - entropy

    def _normal_params(self, name: str, prior) -> tuple:
        """``normal_prior_params(prior, name)``, cached while ``prior`` is the same object (no per-step scan)."""
        cache = self.__dict__.setdefault("_normal_params_cache", {})
        if name not in cache or cache[name][0] is not prior:
            cache[name] = (prior, normal_prior_params(prior, name))
        return cache[name][1]

    def elbo_terms(self, bnn, x, y, num_data: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One-draw ``(E_q[(N/n) Σ log p(y|x,w)], KL(q‖p))`` on a minibatch without Pyro traces.

        The estimator of :func:`inference.variational.elbo.elbo_terms` on this guide and ``bnn.model`` (valid for a
        model whose Pyro program is the stock :meth:`~zoo.bnn.BayesianNetwork.model`), with the same
        random numbers in the same order for a seed: the guide's draws (each Radial site's ε and r,
        then the constrained sites' Normal noise), the data plate's permutation when ``n < N``
        (drawn and discarded), then the M cross-entropy draws (Monte Carlo estimators only) of every
        Radial site in the model's order (:meth:`site_kl`); the constrained sites' KL is the one-sample log q(z) − log p(z).
        With the exact estimator the Radial sites' draws and KL come from :class:`_RadialExactDraw`.

        Args:
            bnn: the model this guide was built from.
            x, y: minibatch ``[n, ...]`` and its targets.
            num_data: ``N``; the log-likelihood is scaled by N/n.
        Returns:
            scalars with gradients: the scaled expected log-likelihood and the KL.
        """
        priors = bnn.prior_distributions()
        params = {name: self.site_params(name) for name in self._radial_sites}
        noise = {name: radial_noise(loc.shape, self._radial_sites[name], loc) for name, (loc, _) in params.items()}
        exact = self.mc_kl_estimator == "exact"
        if exact and noise:  # weights and the closed-form KL in one function with a written-out backward
            kl, *weights = _RadialExactDraw.apply([self._normal_params(name, priors[name]) for name in noise],
                                                  list(noise.values()), *[t for pair in params.values() for t in pair])
            values = dict(zip(noise, weights))
        else:
            kl = x.new_zeros(())
            values = {name: torch.addcmul(loc, log_scale.exp(), noise[name]) for name, (loc, log_scale) in params.items()}
        for name in self._other_sites:
            loc, log_scale = self.site_params(name)
            values[name], estimate = unconstrained_draw(loc, log_scale.exp(), priors[name])
            kl = kl + estimate
        if x.shape[0] < num_data:
            torch.randperm(num_data)  # the data plate's subsample draw on Pyro's path (keeps the stream aligned)
        weights = {site.name for site in bnn.sites}
        f = bnn.forward_single({n: v for n, v in values.items() if n in weights}, x)
        latents = {n: v.unsqueeze(0) for n, v in values.items() if n not in weights}
        log_lik = bnn.likelihood.training_log_prob(f.unsqueeze(0), y, latents).sum() * (num_data / x.shape[0])
        if not exact:
            for name in self._radial_sites:
                kl = kl + self.site_kl(name, priors[name])
        return log_lik, kl


def _raw_param(container: PyroModule, name: str) -> torch.nn.Parameter:
    path, _, leaf = name.rpartition(".")
    owner = attrgetter(path)(container) if path else container
    return getattr(owner, leaf + "_unconstrained")


def build_radial_guide(bnn, init_values, init_scale: float = 1e-3, mc_kl_samples: Optional[int] = None,
                       mc_kl_estimator: Optional[str] = None, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> AutoRadial:
    """Guide builder for :data:`inference.variational.guides.GUIDES`: an :class:`AutoRadial` of ``bnn.model``."""
    from pyro.infer.autoguide.initialization import init_to_median, init_to_value

    return AutoRadial(
        bnn.model,
        init_loc_fn=init_to_value(values=dict(init_values), fallback=init_to_median),
        init_scale=float(init_scale),
        mc_kl_samples=mc_kl_samples,
        mc_kl_estimator=mc_kl_estimator,
        chunk_elements=chunk_elements,
    )
