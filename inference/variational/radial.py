"""The Radial variational family (Farquhar, Osborne & Gal 2020) as a Pyro AutoGuide, with an
M-independent Monte Carlo KL (Nazarovs, Mehta, Lokhande & Singh 2021).

**Family.**  For one parameter tensor with D entries (Farquhar, Osborne & Gal 2020)

    w = μ + σ ⊙ ξ,   ξ = r · ε/‖ε‖,   ε ~ N(0, I_D),  r ~ N(0, 1),

normalised over the whole tensor, per draw.  ξ = |r| d with d uniform on the sphere, so its
density at u is  2φ(‖u‖) / (S_{D−1} ‖u‖^{D−1}),  S_{D−1} = 2π^{D/2}/Γ(D/2), and the entropy is
analytic (Farquhar et al. 2020 eq. 5, with the constant made explicit):

    H(q) = Σ_i log σ_i + ½ log(πe/2) + log S_{D−1} − (D−1)(γ + log 2)/2.

**Prior cross-entropy** E_q[−log p(w)] by M Monte Carlo draws ξ_1..ξ_M:

* ``"naive"``: (1/M) Σ_m −log p(μ + σ ⊙ ξ_m) with autograd through all M weight draws — the
  graph (and memory) grows linearly in M; works for any prior;
* ``"reparameterized"``: for a Normal prior N(m, s²) the integrand is a polynomial of degree 2
  in ξ,

      −log p(w_i) = log s_i + ½ log 2π + [(μ_i−m_i)² + 2(μ_i−m_i)σ_i ξ_i + σ_i² ξ_i²] / (2 s_i²),

  so the ξ draws (which carry no gradient) enter only through the per-weight averages
  ξ̄_i = (1/M) Σ_m ξ_mi and (ξ²)‾_i = (1/M) Σ_m ξ_mi².  They are accumulated in chunks under
  ``no_grad`` and the graph holds the three terms μ², 2μσξ̄, σ²(ξ²)‾ — its size and the memory
  are independent of M, and with the same random stream the value and gradients equal the
  naive estimator's exactly.

:class:`AutoRadial` is an ``AutoGuide`` for any Pyro model: Radial factors on real-valued sites,
the ``AutoNormal`` construction on constrained ones (e.g. a noise precision).  Its
``site_kl(name, prior)`` hook returns −H(q) + cross-entropy, which :mod:`inference.elbo` uses
in place of a one-sample estimate.  It implements :class:`~inference.variational.protocol.PrunableGuide`
with the marginal sd σ/√D per weight (E ξ_i² = 1/D) and the signal-to-noise rule of Graves (2011),
and runs in Pyro's module-local parameter mode (:class:`~inference.variational.protocol.ModuleLocalParams`).
"""
from __future__ import annotations

import math
from operator import attrgetter
from typing import Iterator, Optional

import pyro
import torch
from pyro.distributions import TorchDistribution, constraints
from pyro.infer.autoguide import AutoGuide
from pyro.infer.autoguide.initialization import InitMessenger, init_to_feasible
from pyro.infer.autoguide.utils import deep_setattr
from pyro.nn import PyroModule, PyroParam
from torch.distributions import biject_to

from .families import fast_exp
from .latents import is_real_support, normal_prior_params, sample_unconstrained
from .protocol import SNR_RULE, ModuleLocalParams, PruningRule

__all__ = [
    "RadialNormal",
    "AutoRadial",
    "MC_KL_ESTIMATORS",
    "radial_entropy_constant",
    "radial_noise_chunks",
    "radial_cross_entropy",
    "check_mc_kl_options",
]

MC_KL_ESTIMATORS = ("reparameterized", "naive")
#: elements of noise held at once while accumulating ξ̄ and (ξ²)‾: bounds the memory independently
#: of M (4 MiB in float32); larger chunks mean fewer, bigger kernels (faster on a GPU)
DEFAULT_CHUNK_ELEMENTS = 2**20
_EULER_GAMMA = 0.5772156649015329


def radial_entropy_constant(dim: int) -> float:
    """H(ξ) of the D-dimensional radial noise ξ = r ε/‖ε‖ (so H(q) = Σ log σ + this)."""
    log_sphere = math.log(2.0) + 0.5 * dim * math.log(math.pi) - math.lgamma(0.5 * dim)
    return 0.5 * math.log(math.pi * math.e / 2) + log_sphere - 0.5 * (dim - 1) * (_EULER_GAMMA + math.log(2.0))


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
        shape = self._extended_shape(sample_shape)
        eps = torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        norm = torch.linalg.vector_norm(eps, dim=self._event_dims, keepdim=True) if self.event_shape else eps.abs()
        radius_shape = shape[: len(shape) - len(self.event_shape)] + (1,) * len(self.event_shape)
        radius = torch.randn(radius_shape, dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + self.scale * eps * (radius / norm)

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


def _draw_chunk(num: int, dim: int, options: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``num`` Gaussian vectors ε ``[num, D]`` and their radial factors c = r/‖ε‖ ``[num]``."""
    eps = torch.randn(num, dim, **options)
    return eps, torch.randn(num, **options) / torch.linalg.vector_norm(eps, dim=1)


def _chunk_sizes(dim: int, num_draws: int, chunk_elements: int) -> Iterator[int]:
    per_chunk = max(1, chunk_elements // dim)
    for start in range(0, num_draws, per_chunk):
        yield min(per_chunk, num_draws - start)


def radial_noise_chunks(
    shape: torch.Size, num_draws: int, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS, like: Optional[torch.Tensor] = None
) -> Iterator[torch.Tensor]:
    """``num_draws`` radial noise vectors ξ = c ε for a tensor of ``shape``, as ``[m, D]`` chunks.

    Both cross-entropy estimators consume this one random stream, so with the same seed they
    see the same draws.  Each chunk holds at most ``max(D, chunk_elements)`` numbers, with the
    dtype and device of ``like`` (default: float32 on the CPU).
    """
    dim = max(1, int(torch.Size(shape).numel()))
    options = {"dtype": like.dtype, "device": like.device} if like is not None else {}
    for num in _chunk_sizes(dim, num_draws, chunk_elements):
        eps, scale = _draw_chunk(num, dim, options)
        yield eps.mul_(scale.unsqueeze(1))


def _xi_moments(shape, num_draws: int, chunk_elements: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-weight ξ̄ and (ξ²)‾ over ``num_draws`` draws (no gradient; memory independent of M).

    Per chunk: Σ_m ξ_m = εᵀc and Σ_m ξ_m² = (ε²)ᵀc² — two matrix-vector products, the same
    random stream as :func:`radial_noise_chunks`.
    """
    dim = max(1, int(torch.Size(shape).numel()))
    options = {"dtype": like.dtype, "device": like.device}
    first, second = like.new_zeros(dim), like.new_zeros(dim)
    for num in _chunk_sizes(dim, num_draws, chunk_elements):
        eps, scale = _draw_chunk(num, dim, options)
        first.addmv_(eps.T, scale)
        second.addmv_(eps.square_().T, scale.square_())
    return (first / num_draws).view(shape), (second / num_draws).view(shape)


def radial_cross_entropy(
    loc: torch.Tensor,
    scale: torch.Tensor,
    prior,
    num_draws: int,
    estimator: str = "reparameterized",
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    site: str = "site",
) -> torch.Tensor:
    """Monte Carlo E_q[−log p(w)] for a Radial factor (see the module docstring).

    Args:
        loc, scale: μ and σ, the site's shape (differentiable).
        prior: the site's prior distribution (event shape = site shape); Normal for
            ``"reparameterized"``, anything with ``log_prob`` for ``"naive"``.
        num_draws: M ≥ 1.
        estimator: ``"reparameterized"`` (graph independent of M) or ``"naive"``.
    Returns:
        a scalar with gradients w.r.t. ``loc`` and ``scale``.
    """
    if estimator == "naive":
        chunks = radial_noise_chunks(loc.shape, num_draws, chunk_elements, loc)
        xi = torch.cat(list(chunks)).view(num_draws, *loc.shape)
        return -prior.log_prob(loc + scale * xi).mean()
    prior_loc, prior_scale = normal_prior_params(prior, site)
    with torch.no_grad():
        mean_xi, mean_xi_sq = _xi_moments(loc.shape, num_draws, chunk_elements, loc)
    centred = loc - prior_loc
    quad = centred * centred + 2 * centred * scale * mean_xi + scale * scale * mean_xi_sq
    log_scale = math.log(prior_scale) if isinstance(prior_scale, float) else torch.log(prior_scale)
    return (log_scale + 0.5 * math.log(2 * math.pi) + quad / (2 * prior_scale**2)).sum()


def check_mc_kl_options(mc_kl_samples, mc_kl_estimator):
    if isinstance(mc_kl_samples, bool) or not isinstance(mc_kl_samples, int) or mc_kl_samples < 1:
        raise ValueError(f"mc_kl_samples (M) must be an integer >= 1, got {mc_kl_samples!r}")
    if mc_kl_estimator not in MC_KL_ESTIMATORS:
        raise ValueError(f"unknown mc_kl_estimator {mc_kl_estimator!r}; valid: {', '.join(MC_KL_ESTIMATORS)}")


class AutoRadial(ModuleLocalParams, AutoGuide):
    """Radial posterior (Farquhar, Osborne & Gal 2020) on every real-valued latent site of a Pyro model.

    Args:
        model: a Pyro model (e.g. ``bnn.model``); sites must lie outside plates (global latents).
        init_loc_fn: per-site initialisation of μ (Pyro's ``init_to_*`` functions).
        init_scale: initial σ of every entry (and of the constrained sites' Normal factors).
        mc_kl_samples: M, Monte Carlo draws of the prior cross-entropy per step (≥ 1).
        mc_kl_estimator: ``"reparameterized"`` (M-independent; Normal priors) or ``"naive"``.
        chunk_elements: noise elements held at once while accumulating (memory bound).
    """

    def __init__(
        self,
        model,
        *,
        init_loc_fn=init_to_feasible,
        init_scale: float = 1e-3,
        mc_kl_samples: int = 1,
        mc_kl_estimator: str = "reparameterized",
        chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    ):
        check_mc_kl_options(mc_kl_samples, mc_kl_estimator)
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
            return loc.detach(), fast_exp(log_scale - 0.5 * math.log(max(1, loc.numel())))

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
        """−H(q_site) + M-draw cross-entropy for a Radial site; ``None`` for the others (MC KL)."""
        if name not in self._radial_sites:
            return None
        loc, log_scale = self.site_params(name)
        entropy = log_scale.sum() + radial_entropy_constant(max(1, loc.numel()))
        cross = radial_cross_entropy(
            loc, log_scale.exp(), prior, self.mc_kl_samples, self.mc_kl_estimator, self.chunk_elements, name
        )
        return cross - entropy


def _raw_param(container: PyroModule, name: str) -> torch.nn.Parameter:
    path, _, leaf = name.rpartition(".")
    owner = attrgetter(path)(container) if path else container
    return getattr(owner, leaf + "_unconstrained")


def build_radial_guide(bnn, init_values, init_scale: float = 1e-3, mc_kl_samples: int = 1,
                       mc_kl_estimator: str = "reparameterized", chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> AutoRadial:
    """Guide builder for :data:`inference.guides.GUIDES`: an :class:`AutoRadial` of ``bnn.model``."""
    from pyro.infer.autoguide.initialization import init_to_median, init_to_value

    return AutoRadial(
        bnn.model,
        init_loc_fn=init_to_value(values=dict(init_values), fallback=init_to_median),
        init_scale=float(init_scale),
        mc_kl_samples=mc_kl_samples,
        mc_kl_estimator=mc_kl_estimator,
        chunk_elements=chunk_elements,
    )
