"""The mean-field Gaussian families: their parameterisations, KLs and pruning rules.

All three families are fully factorised Gaussians q(w_i) = N(μ_i, σ_i²) over every entry of a
:class:`~zoo.bnn.BayesianNetwork`'s random weight sites; they differ in how σ is parameterised,
which prior they use and hence which KL term enters the ELBO:

* :class:`GaussianFamily` — variational dense, "adaptive weight noise" (Graves 2011):
  parameter ``s = log σ``; Gaussian prior N(m, s_p²) (the model's Normal prior, or a
  configured mean/sd); analytic KL (Graves 2011 eq. 13)

      KL_i = log(s_p / σ_i) + (σ_i² + (μ_i − m)²) / (2 s_p²) − 1/2.

  Pruning rule (Graves 2011 eq. 19): prune w_i when |μ_i|/σ_i < λ = 0.83.
* :class:`SparseVDFamily` — sparse variational dropout (Molchanov, Ashukha & Vetrov 2017):
  additive reparameterisation w = θ + σ ε with parameter ``s = log σ`` and α = σ²/θ² (Molchanov
  et al. 2017 eq. 11), log α clipped to [−8, 8]; log-uniform prior with the approximation
  (Molchanov et al. 2017 eq. 14)

      KL_i ≈ k₁ − k₁ sigmoid(k₂ + k₃ log α_i) + ½ log(1 + 1/α_i),
      k₁ = 0.63576, k₂ = 1.87320, k₃ = 1.48695.

  Pruning rule (Molchanov et al. 2017): prune w_i when log α_i > 3.
* :class:`KingmaVDFamily` — variational dropout (Kingma, Salimans & Welling 2015): multiplicative
  noise w = θ (1 + √α ε), i.e. σ = |θ| √α, with parameter ``s = log α`` clipped to [−8, 0] (Kingma
  et al. restrict α ≤ 1, where their polynomial fit holds); log-uniform prior with the
  approximation (Kingma, Salimans & Welling 2015 eq. 10)

      −KL_i ≈ const + ½ log α_i + c₁ α_i + c₂ α_i² + c₃ α_i³,
      c₁ = 1.16145124, c₂ = −1.50204118, c₃ = 0.58629921.

  The constant is :data:`KINGMA_KL_CONST`, fitted (least squares over log α ∈ [−8, 0]) to the
  exact KL in Molchanov's normalisation (the exact KL tends to 0 as α → ∞), so both
  variational-dropout KLs are on one scale.  Because α ≤ 1, the sparse-VD
  rule log α > 3 can never fire; Kingma weights are pruned when α reached its cap
  (log α ≥ 0, a binary dropout rate of 1/2) unless another threshold in [−8, 0] is given.

Each family provides the KL both as a plain autograd expression (:meth:`Family.kl`, used by
the Pyro guide's ``site_kl`` hook) and as a value with closed-form derivatives that are added
in place into gradient buffers (:meth:`Family.kl_and_grads`, used by the fused training path
of :mod:`inference.variational.meanfield`); the tests check that the two agree.  Its pruning
rule is a :class:`~inference.variational.protocol.PruningRule` (``Family.pruning_rule``).

All tensors here are flat ``[P]`` (or any common shape); prior parameters may be Python floats
or tensors broadcastable against them.
"""
from __future__ import annotations

import math
from typing import Optional, Union

import torch

from inference.variational.protocol import SNR_RULE, PruningRule

__all__ = [
    "K1",
    "K2",
    "K3",
    "C1",
    "C2",
    "C3",
    "KINGMA_KL_CONST",
    "Family",
    "GaussianFamily",
    "SparseVDFamily",
    "KingmaVDFamily",
    "FAMILIES",
    "get_family",
    "sparse_vd_kl",
    "kingma_vd_kl",
    "gaussian_kl",
    "normal_kl",
    "normal_kl_sum",
]

K1, K2, K3 = 0.63576, 1.87320, 1.48695
C1, C2, C3 = 1.16145124, -1.50204118, 0.58629921
#: additive constant of the Kingma et al. KL (see the module docstring; checked in the tests)
KINGMA_KL_CONST = -0.6523
#: guards log θ² against θ = 0 in log α = log σ² − log θ² (as in Molchanov et al.'s code)
_THETA_EPS = 1e-8


Number = Union[float, torch.Tensor]


def _buffer(cache: Optional[dict], like: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor shaped like ``like``: from the step's workspace (``cache["new"]``, the fused
    path: :class:`~inference.variational.workspace.Workspace`), else newly allocated."""
    new = cache.get("new") if cache is not None else None
    return new(like) if new is not None else torch.empty_like(like)


def _zero_outside_(grad: torch.Tensor, value: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """``grad`` with its entries zeroed in place where ``value`` is not strictly inside (low, high): the
    derivative of ``value.clamp(low, high)`` applied, in one fused pass (``hardtanh``'s backward
    kernel; no boolean mask and no float copy of one)."""
    return torch.ops.aten.hardtanh_backward.grad_input(grad, value, low, high, grad_input=grad)


def normal_kl(loc, sigma, prior_loc: Number = 0.0, prior_scale: Number = 1.0,
              log_sigma: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The one Gaussian KL, elementwise: KL(N(μ, σ²) ‖ N(m, s²)) = log(s/σ) + (σ² + (μ − m)²)/(2 s²) − ½
    (Graves 2011 eq. 13; Blundell et al. 2015).  ``log_sigma``: log σ where the caller holds it (the log-σ
    parameterisation), used in place of log σ.  Used by every mean-field Normal fit: the Pyro-trace path
    (:func:`gaussian_kl`), the fused path (:func:`normal_kl_sum`) and the stacked fits
    (:mod:`inference.variational.stacked_svi`)."""
    diff = loc - prior_loc
    if log_sigma is not None:
        log_ratio = torch.log(torch.as_tensor(prior_scale, dtype=loc.dtype)) - log_sigma
    elif isinstance(prior_scale, torch.Tensor):
        log_ratio = torch.log(prior_scale / sigma)
    else:
        log_ratio = math.log(prior_scale) - torch.log(sigma)
    return log_ratio + (sigma * sigma + diff * diff) / (2 * prior_scale * prior_scale) - 0.5


def normal_kl_sum(loc, sigma, prior_loc: Number = 0.0, prior_scale: Number = 1.0) -> torch.Tensor:
    """Σ_i of :func:`normal_kl`; with a float prior sd s in its summed form
    n (log s − ½) − Σ_i log σ_i + (σ·σ + d·d) / (2 s²), d = μ − m (two dot products: fewer passes over [n])."""
    if isinstance(prior_scale, torch.Tensor):
        return normal_kl(loc, sigma, prior_loc, prior_scale).sum()
    diff = loc - prior_loc if isinstance(prior_loc, torch.Tensor) or prior_loc != 0.0 else loc
    flat_sigma, flat_diff = sigma.reshape(-1), diff.reshape(-1)
    return (flat_sigma.numel() * (math.log(prior_scale) - 0.5) - torch.log(flat_sigma).sum()
            + (torch.dot(flat_sigma, flat_sigma) + torch.dot(flat_diff, flat_diff)) / (2 * prior_scale * prior_scale))


def gaussian_kl(loc, log_sigma, prior_loc: Number = 0.0, prior_scale: Number = 1.0) -> torch.Tensor:
    """Elementwise KL(N(μ, σ²) ‖ N(m, s_p²)) in the log-σ parameterisation: :func:`normal_kl` at σ = e^{log σ}."""
    return normal_kl(loc, torch.exp(log_sigma), prior_loc, prior_scale, log_sigma=log_sigma)


def sparse_vd_kl(log_alpha: torch.Tensor) -> torch.Tensor:
    """Elementwise Molchanov et al. (2017, eq. 14) KL approximation; ``log_alpha`` is clipped to [−8, 8]."""
    log_alpha = log_alpha.clamp(-8.0, 8.0)
    return K1 - K1 * torch.sigmoid(K2 + K3 * log_alpha) + 0.5 * torch.nn.functional.softplus(-log_alpha)


def kingma_vd_kl(log_alpha: torch.Tensor) -> torch.Tensor:
    """Elementwise Kingma, Salimans & Welling (2015, eq. 10) KL approximation; ``log_alpha`` is clipped to [−8, 0]."""
    log_alpha = log_alpha.clamp(-8.0, 0.0)
    alpha = torch.exp(log_alpha)
    return -(KINGMA_KL_CONST + 0.5 * log_alpha + C1 * alpha + C2 * alpha**2 + C3 * alpha**3)


class Family:
    """A mean-field Gaussian family q(w) = N(μ, σ(μ, s)²) with its prior's KL and pruning rule.

    Attributes:
        name: registry name.
        param_name: meaning of the second parameter ``s`` (``"log_sigma"`` or ``"log_alpha"``).
        pruning_rule: the family's principled :class:`~inference.variational.protocol.PruningRule`.
        uses_model_prior: whether the KL is against the model's Normal prior (else the family's own).
    """

    name = ""
    param_name = "log_sigma"
    pruning_rule: PruningRule
    uses_model_prior = False

    # -- parameterisation -------------------------------------------------------------------
    def init_param(self, loc: torch.Tensor, init_scale: float) -> torch.Tensor:
        """Initial ``s`` giving posterior sd ``init_scale`` for every weight."""
        return torch.full_like(loc, math.log(init_scale))

    def sigma(self, loc: torch.Tensor, s: torch.Tensor, cache: Optional[dict] = None) -> torch.Tensor:
        """Posterior sd σ (autograd-differentiable).

        ``cache``: a dict shared by one step's :meth:`sigma`, :meth:`kl_and_grads` and
        :meth:`sigma_grads` calls on the same detached inputs (the fused path), where a family may
        keep intermediate tensors instead of recomputing them, and take its work tensors from
        ``cache["new"]`` (without autograd); ``None``: compute everything, differentiably.
        """
        return torch.exp(s) if cache is None else torch.exp(s, out=_buffer(cache, s))

    def sigma_grads(self, loc, s, sigma, cache: Optional[dict] = None) -> tuple[Optional[torch.Tensor], torch.Tensor]:
        """(∂σ/∂μ or ``None`` when σ does not depend on μ, ∂σ/∂s); ``cache`` as in :meth:`sigma`."""
        return None, sigma

    # -- KL ------------------------------------------------------------------------------------
    def kl(self, loc, s, prior_loc: Number = 0.0, prior_scale: Number = 1.0) -> torch.Tensor:
        """Elementwise KL(q ‖ prior) as an autograd expression."""
        raise NotImplementedError

    def kl_and_grads(self, loc, s, sigma, prior_loc: Number = 0.0, prior_scale: Number = 1.0, cache: Optional[dict] = None):
        """``(Σ KL, accumulate)`` without autograd (inputs are detached); ``cache`` as in :meth:`sigma`.

        ``accumulate(grad_loc, grad_s, g)`` adds ``g · ∂ΣKL/∂μ`` and ``g · ∂ΣKL/∂s`` in place
        into the two buffers (shaped like ``loc``); ``g`` is a float.
        """
        raise NotImplementedError

    def log_alpha(self, loc, s) -> torch.Tensor:
        """log α = −2 log(|μ|/σ) (α = σ²/μ², Kingma, Salimans & Welling 2015); the dropout families clip it."""
        return -2.0 * torch.log(loc.abs() / self.sigma(loc, s))

    def __repr__(self):
        return f"{type(self).__name__}()"


class GaussianFamily(Family):
    """Variational dense / adaptive weight noise (Graves 2011): see the module docstring."""

    name = "graves"
    pruning_rule = SNR_RULE
    uses_model_prior = True

    def kl(self, loc, s, prior_loc=0.0, prior_scale=1.0):
        return gaussian_kl(loc, s, prior_loc, prior_scale)

    def kl_and_grads(self, loc, s, sigma, prior_loc=0.0, prior_scale=1.0, cache=None):
        if isinstance(prior_loc, float) and isinstance(prior_scale, float):
            # constant prior (the common case): dot products, no [P] temporaries
            prec = 1.0 / prior_scale**2
            flat_loc, flat_sigma = loc.reshape(-1), sigma.reshape(-1)
            centred_sq = torch.dot(flat_loc, flat_loc) - 2 * prior_loc * flat_loc.sum() + loc.numel() * prior_loc**2
            kl = loc.numel() * (math.log(prior_scale) - 0.5) - s.sum() + 0.5 * prec * (torch.dot(flat_sigma, flat_sigma) + centred_sq)

            def accumulate(grad_loc, grad_s, g):
                grad_loc.add_(loc, alpha=g * prec)
                if prior_loc != 0.0:
                    grad_loc.sub_(g * prec * prior_loc)
                grad_s.addcmul_(sigma, sigma, value=g * prec).sub_(g)

            return kl, accumulate
        prec = 1.0 / torch.as_tensor(prior_scale, dtype=loc.dtype) ** 2
        centred = loc - prior_loc
        var_ratio = sigma * sigma * prec
        kl = (-0.5 * torch.log(prec) - s + 0.5 * (var_ratio + centred**2 * prec) - 0.5).sum()

        def accumulate(grad_loc, grad_s, g):
            grad_loc.addcmul_(centred, prec.expand_as(centred), value=g)
            grad_s.add_(var_ratio - 1.0, alpha=g)

        return kl, accumulate


class SparseVDFamily(Family):
    """Sparse variational dropout (Molchanov, Ashukha & Vetrov 2017), additive reparameterisation."""

    name = "sparse-vd"
    pruning_rule = PruningRule("sparse-vd", "log alpha > t (Molchanov et al. 2017)", "log_alpha", 3.0, (-8.0, 8.0))

    def init_param(self, loc, init_scale):
        """``log σ`` with σ = max(init_scale, |θ| e^{−3.5}): every log α starts at ≥ −7 (up to the θ guard),
        inside the clip range where the KL has a gradient (a weight below −8 would stay there)."""
        return torch.maximum(torch.full_like(loc, math.log(init_scale)), torch.log(loc.abs() + 1e-30) - 3.5)

    def log_alpha(self, loc, s):
        """log α = log σ² − log θ², clipped to [−8, 8]."""
        return (2 * s - torch.log(loc * loc + _THETA_EPS)).clamp(-8.0, 8.0)

    def kl(self, loc, s, prior_loc=0.0, prior_scale=1.0):
        return sparse_vd_kl(2 * s - torch.log(loc * loc + _THETA_EPS))

    def kl_and_grads(self, loc, s, sigma, prior_loc=0.0, prior_scale=1.0, cache=None):
        # in-place passes over [P] (a handful of temporaries): with e = e^{−log α},
        # softplus(−log α) = log1p(e) and sigmoid(−log α) = e / (1 + e); |log α| ≤ 8 keeps e finite
        theta_sq = torch.mul(loc, loc, out=_buffer(cache, loc)).add_(_THETA_EPS)
        raw_log_alpha = torch.log(theta_sq, out=_buffer(cache, loc)).neg_().add_(s, alpha=2.0)
        log_alpha = torch.clamp(raw_log_alpha, -8.0, 8.0, out=_buffer(cache, loc))
        gate = torch.mul(log_alpha, K3, out=_buffer(cache, loc)).add_(K2).sigmoid_()
        e = log_alpha.mul_(-1.0).exp_()
        work = _buffer(cache, loc)
        kl = K1 * loc.numel() - K1 * gate.sum() + 0.5 * torch.log1p(e, out=work).sum()
        # d KL / d log α = −K1 K3 gate (1 − gate) − ½ sigmoid(−log α), zero where the clip is active
        d_la = torch.addcmul(gate, gate, gate, value=-1.0, out=work).mul_(-K1 * K3)
        e.div_(torch.add(e, 1.0, out=gate))
        _zero_outside_(d_la.sub_(e, alpha=0.5), raw_log_alpha, -8.0, 8.0)
        loc_over_theta_sq = torch.div(loc, theta_sq, out=theta_sq)

        def accumulate(grad_loc, grad_s, g):
            grad_loc.addcmul_(d_la, loc_over_theta_sq, value=-2 * g)
            grad_s.add_(d_la, alpha=2 * g)

        return kl, accumulate


class KingmaVDFamily(Family):
    """Variational dropout (Kingma, Salimans & Welling 2015), multiplicative noise with α ≤ 1."""

    name = "kingma-vd"
    param_name = "log_alpha"
    pruning_rule = PruningRule(
        "kingma-vd", "log alpha >= t, alpha capped at 1 (Kingma et al. 2015)", "log_alpha", 0.0, (-8.0, 0.0), inclusive=True
    )

    def init_param(self, loc, init_scale):
        """``log α`` giving sd ``init_scale`` at the mean |θ|, kept in [−7, −0.5]: strictly inside the
        clip range, where the gradient is non-zero (a weight at the clip would never move)."""
        typical = loc.abs().mean().clamp_min(1e-6)
        return torch.full_like(loc, float(2 * math.log(init_scale / float(typical)))).clamp(-7.0, -0.5)

    def log_alpha(self, loc, s):
        """log α, clipped to [−8, 0]."""
        return s.clamp(-8.0, 0.0)

    def sigma(self, loc, s, cache=None):
        if cache is None:
            return loc.abs() * torch.exp(0.5 * s.clamp(-8.0, 0.0))
        log_alpha = torch.clamp(s, -8.0, 0.0, out=_buffer(cache, s))
        root_alpha = torch.mul(log_alpha, 0.5, out=_buffer(cache, s)).exp_()
        cache["log_alpha"], cache["root_alpha"] = log_alpha, root_alpha
        return torch.abs(loc, out=_buffer(cache, loc)).mul_(root_alpha)

    def sigma_grads(self, loc, s, sigma, cache=None):
        root_alpha = cache.get("root_alpha") if cache is not None else None
        if root_alpha is None:
            root_alpha = torch.exp(0.5 * s.clamp(-8.0, 0.0))
        d_loc = torch.sign(loc, out=_buffer(cache, loc)).mul_(root_alpha)
        return d_loc, _zero_outside_(torch.mul(sigma, 0.5, out=_buffer(cache, sigma)), s, -8.0, 0.0)

    def kl(self, loc, s, prior_loc=0.0, prior_scale=1.0):
        return kingma_vd_kl(s)

    def kl_and_grads(self, loc, s, sigma, prior_loc=0.0, prior_scale=1.0, cache=None):
        # the cubic in Horner form (no pow kernels), in-place passes over [P]
        log_alpha = cache.get("log_alpha") if cache is not None else None
        if log_alpha is None:
            log_alpha = s.clamp(-8.0, 0.0)
        alpha = torch.exp(log_alpha, out=_buffer(cache, s))
        poly = torch.mul(alpha, C3, out=_buffer(cache, s)).add_(C2).mul_(alpha).add_(C1).mul_(alpha)
        kl = -(KINGMA_KL_CONST * s.numel() + 0.5 * log_alpha.sum() + poly.sum())
        # d KL / d log α = −(½ + c₁α + 2c₂α² + 3c₃α³), zero where the clip is active
        d_s = torch.mul(alpha, 3 * C3, out=poly).add_(2 * C2).mul_(alpha).add_(C1).mul_(alpha).add_(0.5).neg_()
        _zero_outside_(d_s, s, -8.0, 0.0)

        def accumulate(grad_loc, grad_s, g):
            grad_s.add_(d_s, alpha=g)

        return kl, accumulate


FAMILIES: dict[str, Family] = {f.name: f for f in (GaussianFamily(), SparseVDFamily(), KingmaVDFamily())}


def get_family(name: str) -> Family:
    """The family registered as ``name`` (``graves``, ``sparse-vd``, ``kingma-vd``)."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown variational family {name!r}; valid families: {', '.join(FAMILIES)}") from None
