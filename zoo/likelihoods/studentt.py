"""Student-t observation model with fixed or learned scale and degrees of freedom."""
from __future__ import annotations

import pyro.distributions as dist
import torch

from .base import Likelihood, check_positive, draw_device, standardise

__all__ = ["StudentTLikelihood", "student_t_cdf"]


class StudentTLikelihood(Likelihood):
    """``y_t ~ StudentT(ν_t, loc=f_t, scale=s_t)`` per target: heavy-tailed residuals.

    The scale ``s`` and the degrees of freedom ``ν`` are each fixed or learned.  A learned
    scale has a ``Gamma(precision_concentration, precision_rate)`` prior on the precision
    ``1/s²`` (site ``"noise_precision"`` ``[T]``, as :class:`GaussianLikelihood`); learned
    degrees of freedom have a ``Gamma(dof_concentration, dof_rate)`` prior, by default the
    ``Gamma(2, 0.1)`` of Juárez & Steel (2010) (mean 20, mode 10), site ``"dof"`` ``[T]``.
    The network output ``f`` is the location (the median; the mean only for ν > 1) and is
    reported as the point prediction.

    Args:
        scale: fixed scale ``s`` in standardised units (ignored when ``learn_scale``).
        learn_scale: infer ``s`` (prior on its precision).
        dof: fixed degrees of freedom ν (ignored when ``learn_dof``).
        learn_dof: infer ν.
        precision_concentration, precision_rate: Gamma prior of ``1/s²`` (shape, rate).
        dof_concentration, dof_rate: Gamma prior of ν (shape, rate).
    """

    name = "studentt"
    task = "regression"

    def __init__(self, scale: float = 0.1, learn_scale: bool = False, dof: float = 4.0, learn_dof: bool = False,
                 precision_concentration: float = 1.0, precision_rate: float = 0.01,
                 dof_concentration: float = 2.0, dof_rate: float = 0.1):
        check_positive("studentt", scale=scale, dof=dof, precision_concentration=precision_concentration,
                       precision_rate=precision_rate, dof_concentration=dof_concentration, dof_rate=dof_rate)
        self.scale, self.learn_scale = float(scale), bool(learn_scale)
        self.dof, self.learn_dof = float(dof), bool(learn_dof)
        self.precision_concentration, self.precision_rate = float(precision_concentration), float(precision_rate)
        self.dof_concentration, self.dof_rate = float(dof_concentration), float(dof_rate)

    def options(self):
        return {"scale": self.scale, "learn_scale": self.learn_scale, "dof": self.dof, "learn_dof": self.learn_dof,
                "precision_concentration": self.precision_concentration, "precision_rate": self.precision_rate,
                "dof_concentration": self.dof_concentration, "dof_rate": self.dof_rate}

    def latent_priors(self, target_dim, dtype=None, device=None):
        like = {"dtype": dtype, "device": device}

        def gamma(a, b):
            return dist.Gamma(torch.full((target_dim,), a, **like), torch.full((target_dim,), b, **like)).to_event(1)

        priors = {}
        if self.learn_scale:
            priors["noise_precision"] = gamma(self.precision_concentration, self.precision_rate)
        if self.learn_dof:
            priors["dof"] = gamma(self.dof_concentration, self.dof_rate)
        return priors

    def parameters_of(self, latents: dict, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(s, ν)`` broadcastable against ``f`` ``[..., N, T]``: ``[..., 1, T]`` when learned, else scalars."""
        like = {"dtype": f.dtype, "device": f.device}
        scale = (latents["noise_precision"].rsqrt().unsqueeze(-2) if self.learn_scale
                 else torch.full((), self.scale, **like))
        dof = latents["dof"].unsqueeze(-2) if self.learn_dof else torch.full((), self.dof, **like)
        return scale, dof

    def distribution(self, f, latents):
        scale, dof = self.parameters_of(latents, f)
        return dist.StudentT(dof, f, scale)

    def cdf(self, f, y, latents, target_loc=None, target_scale=None):
        y, _ = standardise(y, target_loc, target_scale)
        scale, dof = self.parameters_of(latents, f)
        return student_t_cdf((y.unsqueeze(0) - f) / scale, dof).mean(0)

    def sample(self, f, latents, generator=None):
        """``f + s · z / √(g/ν)``, ``z ~ N(0, 1)``, ``g ~ χ²_ν``; reproducible with ``generator``."""
        scale, dof = self.parameters_of(latents, f)
        device = draw_device(generator, f)
        z = torch.randn(f.shape, generator=generator, dtype=f.dtype, device=device)
        seed = int(torch.randint(2**62, (1,), generator=generator, device=device))
        half_dof = (0.5 * dof).expand(f.shape).to(device)
        with torch.random.fork_rng(devices=[] if device.type == "cpu" else [device]):
            torch.manual_seed(seed)
            gamma = torch._standard_gamma(half_dof.contiguous())  # Gamma(ν/2, 1) = χ²_ν / 2
        t = z * (half_dof / gamma).sqrt()
        return f + scale * t.to(f.device)

    def predictive_mean(self, f, latents):
        return f

    def noise_variance(self, f, latents):
        """``s² ν / (ν − 2)`` ``[S, 1, T]`` (``[S, 1, 1]`` broadcast when fixed); ``+inf`` where ν ≤ 2."""
        scale, dof = self.parameters_of(latents, f)
        var = scale**2 * dof / (dof - 2)
        var = torch.where(dof > 2, var, torch.full_like(var, float("inf")))
        return var.expand(f.shape[0], 1, f.shape[-1])

    def output_fisher(self, f, latents):
        """``diag((ν + 1) / ((ν + 3) s²))`` ``[N, T, T]``, the Fisher information of the location."""
        scale, dof = self.parameters_of({k: v.unsqueeze(0) for k, v in latents.items()}, f.unsqueeze(0))
        info = ((dof + 1) / ((dof + 3) * scale**2)).reshape(-1).expand(f.shape[-1])
        return torch.diag_embed(info.expand(f.shape))


def student_t_cdf(t: torch.Tensor, dof: torch.Tensor, max_terms: int = 500) -> torch.Tensor:
    """CDF of the standard Student-t with ``dof`` degrees of freedom at ``t`` (broadcast).

    ``F(t) = 1 − ½ I_x(ν/2, ½)`` for ``t > 0`` (``½ I_x`` for ``t ≤ 0``) with ``x = ν/(ν + t²)``
    and ``I`` the regularised incomplete beta function, evaluated in float64 by its continued
    fraction (modified Lentz; Press et al. 2007, §6.4), on the CPU for an MPS tensor (no float64
    there).  Returns ``t``'s dtype and device.
    """
    work = torch.device("cpu") if t.device.type == "mps" else t.device
    t64 = t.to(work, torch.float64)
    nu = torch.as_tensor(dof).to(work, torch.float64).expand_as(t64)
    x = nu / (nu + t64**2)
    tail = 0.5 * _betainc(0.5 * nu, torch.full_like(nu, 0.5), x, max_terms)
    return torch.where(t64 > 0, 1 - tail, tail).to(t.device, t.dtype)


def _betainc(a: torch.Tensor, b: torch.Tensor, x: torch.Tensor, max_terms: int) -> torch.Tensor:
    """Regularised incomplete beta ``I_x(a, b)`` (float64, elementwise)."""
    flip = x > (a + 1) / (a + b + 2)  # the continued fraction converges fast below this point
    a2, b2, x2 = torch.where(flip, b, a), torch.where(flip, a, b), torch.where(flip, 1 - x, x)
    log_front = (a2 * torch.log(x2) + b2 * torch.log1p(-x2) + torch.lgamma(a2 + b2)
                 - torch.lgamma(a2) - torch.lgamma(b2))
    value = torch.exp(log_front) * _beta_fraction(a2, b2, x2, max_terms) / a2
    value = torch.where(x2 > 0, value, torch.zeros_like(value))
    return torch.where(flip, 1 - value, value)


def _beta_fraction(a, b, x, max_terms: int, tiny: float = 1e-300, tol: float = 1e-14) -> torch.Tensor:
    """The continued fraction of ``I_x(a, b)`` by the modified Lentz method."""
    qab, qap, qam = a + b, a + 1, a - 1

    def guard(v):
        return torch.where(v.abs() < tiny, torch.full_like(v, tiny), v)

    c = torch.ones_like(x)
    d = 1 / guard(1 - qab * x / qap)
    h = d.clone()
    for m in range(1, max_terms + 1):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1 / guard(1 + aa * d)
        c = guard(1 + aa / c)
        h = h * d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1 / guard(1 + aa * d)
        c = guard(1 + aa / c)
        delta = d * c
        h = h * delta
        if m % 10 == 0 and bool(((delta - 1).abs() < tol).all()):
            break
    return h
