"""Student-t observation model with fixed or learned scale and degrees of freedom."""
from __future__ import annotations

import pyro.distributions as dist
import torch

from .base import Likelihood, check_positive, draw_device

__all__ = ["StudentTLikelihood"]


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

    def mixture_params(self, f, latents):
        """``{"loc": f [S, N, T], "scale": s [S, 1, T], "df": ν [S, 1, T]}``."""
        scale, dof = self.parameters_of(latents, f)
        shape = (f.shape[0], 1, f.shape[-1])
        return {"loc": f, "scale": scale.expand(shape), "df": dof.expand(shape)}

    def output_fisher(self, f, latents):
        """``diag((ν + 1) / ((ν + 3) s²))`` ``[N, T, T]``, the Fisher information of the location."""
        scale, dof = self.parameters_of({k: v.unsqueeze(0) for k, v in latents.items()}, f.unsqueeze(0))
        info = ((dof + 1) / ((dof + 3) * scale**2)).reshape(-1).expand(f.shape[-1])
        return torch.diag_embed(info.expand(f.shape))
