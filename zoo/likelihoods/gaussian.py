"""Gaussian observation models: homoscedastic (fixed or learned noise) and heteroscedastic.

* :class:`GaussianLikelihood` — ``y ~ Normal(f, σ)``, σ fixed, or learned with a
  ``Gamma(a, b)`` prior on the precision ``τ = 1/σ²`` per target (the standard UCI BNN set-up
  of Hernández-Lobato & Adams 2015), sample site ``"noise_precision"``.
* :class:`HeteroscedasticGaussianLikelihood` — the network predicts a mean and a log-variance
  per target (``heads = 2``, Nix & Weigend 1994), optionally trained with the β-NLL loss of
  Seitzer et al. (2022).
"""
from __future__ import annotations

import math

import pyro.distributions as dist
import torch

from .base import Likelihood, check_positive, draw_device

__all__ = ["GaussianLikelihood", "HeteroscedasticGaussianLikelihood", "LOG_VARIANCE_RANGE", "VARIANCE_LINKS",
           "SOFTPLUS_MIN_VARIANCE"]

#: clamp of the predicted log-variance (standardised units): σ between 1e-3 and 10 target sds (a
#: log-variance linear in unbounded features would otherwise grow exponentially off the training inputs)
LOG_VARIANCE_RANGE = (2 * math.log(1e-3), 2 * math.log(10.0))
#: links of the heteroscedastic likelihood's variance head (:class:`HeteroscedasticGaussianLikelihood`)
VARIANCE_LINKS = ("log", "softplus")
#: the softplus link's minimum variance (standardised units; Lakshminarayanan et al. 2017, Section 2.2.1)
SOFTPLUS_MIN_VARIANCE = 1e-6


def _normal_draw(f: torch.Tensor, sd: torch.Tensor, generator) -> torch.Tensor:
    """``f + sd · ε``, ε standard normal drawn on the generator's device."""
    noise = torch.randn(f.shape, generator=generator, dtype=f.dtype, device=draw_device(generator, f))
    return f + sd * noise.to(f.device)


class GaussianLikelihood(Likelihood):
    """Homoscedastic Gaussian noise, fixed or learned: ``y ~ Normal(f, σ)`` per target.

    Args:
        noise_sd: fixed noise standard deviation in standardised target units; ignored
            when ``learn_noise``.
        learn_noise: put a ``Gamma(precision_concentration, precision_rate)`` prior on
            the noise precision of each target (site ``"noise_precision"`` ``[T]``) and infer it
            with the weights.
        precision_concentration, precision_rate: Gamma prior parameters (shape, rate).
    """

    name = "gaussian"
    task = "regression"

    def __init__(self, noise_sd: float = 0.1, learn_noise: bool = False, precision_concentration: float = 1.0,
                 precision_rate: float = 0.01):
        check_positive("gaussian", noise_sd=noise_sd, precision_concentration=precision_concentration,
                       precision_rate=precision_rate)
        self.noise_sd = float(noise_sd)
        self.learn_noise = bool(learn_noise)
        self.precision_concentration = float(precision_concentration)
        self.precision_rate = float(precision_rate)

    def options(self):
        return {"noise_sd": self.noise_sd, "learn_noise": self.learn_noise,
                "precision_concentration": self.precision_concentration, "precision_rate": self.precision_rate}

    def __repr__(self):
        if self.learn_noise:
            return (f"GaussianLikelihood(learned noise, precision ~ Gamma({self.precision_concentration}, "
                    f"{self.precision_rate}))")
        return f"GaussianLikelihood(noise_sd={self.noise_sd})"

    def latent_priors(self, target_dim, dtype=None, device=None):
        if not self.learn_noise:
            return {}
        like = {"dtype": dtype, "device": device}
        prior = dist.Gamma(torch.full((target_dim,), self.precision_concentration, **like),
                           torch.full((target_dim,), self.precision_rate, **like)).to_event(1)
        return {"noise_precision": prior}

    def noise_sd_of(self, latents: dict, f: torch.Tensor) -> torch.Tensor:
        """Noise sd broadcastable against ``f`` ``[..., N, T]`` (standardised units)."""
        if not self.learn_noise:
            return torch.full((), self.noise_sd, dtype=f.dtype, device=f.device)
        return latents["noise_precision"].rsqrt().unsqueeze(-2)  # [..., 1, T]

    def distribution(self, f, latents):
        return dist.Normal(f, self.noise_sd_of(latents, f))

    def sample(self, f, latents, generator=None):
        return _normal_draw(f, self.noise_sd_of(latents, f), generator)

    def predictive_mean(self, f, latents):
        return f

    def noise_variance(self, f, latents):
        """σ² ``[S, 1, T]``."""
        return (self.noise_sd_of(latents, f) ** 2).expand(f.shape[0], 1, f.shape[-1])

    def mixture_params(self, f, latents):
        """``{"loc": f [S, N, T], "scale": σ [S, 1, T]}``."""
        return {"loc": f, "scale": self.noise_sd_of(latents, f).expand(f.shape[0], 1, f.shape[-1])}

    def output_fisher(self, f, latents):
        """``diag(1/σ²)`` ``[N, T, T]``."""
        sd = self.noise_sd_of({k: v.unsqueeze(0) for k, v in latents.items()}, f.unsqueeze(0))
        precision = (sd.reshape(-1) ** -2).expand(f.shape[-1])
        return torch.diag_embed(precision.expand(f.shape))


class HeteroscedasticGaussianLikelihood(Likelihood):
    """``y_t ~ Normal(μ_t(x), σ_t²(x))`` with the network predicting both (``heads = 2``).

    The network's ``P = 2T`` outputs are ``f[..., :T] = μ`` and ``f[..., T:] = v``, the variance head
    (standardised units), mapped to σ² by its ``variance`` link:

    * ``"log"`` (default): ``v = log σ²`` (Nix & Weigend 1994), clamped to :data:`LOG_VARIANCE_RANGE`
      (σ in [1e-3, 10]) so a variance head cannot collapse the density onto a training point, nor
      extrapolate exponentially on inputs far from the training data (standardised targets have sd 1: no
      region holding more than 1 % of the data can have σ > 10); outside that range it gets no gradient;
    * ``"softplus"``: ``σ² = log(1 + e^v) + 10⁻⁶``, Lakshminarayanan et al. 2017's mean-variance network
      (Section 2.2.1: softplus for positivity, a minimum variance of 10⁻⁶ for numerical stability); σ² grows
      linearly, not exponentially, in ``v``; log σ² has the same upper clamp (σ ≤ 10) and no other.

    With the log link the output Fisher is constant in the variance direction, ``diag(1/σ², 1/2)``; with
    the softplus link it is ``diag(1/σ², s(v)²/(2σ⁴))``, ``s`` the logistic function.  A variance head that
    is deterministic while the mean head is random is the selector :func:`zoo.likelihoods.mean_head` (or
    ``--stochastic mean-head``).

    Args:
        beta: the β of the β-NLL training loss (Seitzer et al. 2022): optimisers maximise
            ``Σ_n Σ_t w_nt · log N(y_nt | μ_nt, σ_nt²)`` with ``w ∝ sg(σ²)^β`` (``sg`` =
            stop-gradient), which keeps points with a large predicted variance from being ignored
            by the mean fit.  The weights are normalised to mean 1 over the points and targets of
            each draw, so the data term keeps the weight of the log-likelihood against a prior or
            KL term (unnormalised, ``sg(σ²)^β`` tempers the likelihood by the typical σ^{2β}: an
            all-weights SVI net on energy then widened its posterior and noise until RMSE 1.55
            against 0.46 normalised; issue 29).  A batch of one point gets the plain NLL.
            ``0`` is the plain NLL; ``0.5`` is the paper's recommendation; ``1`` gives the mean
            the gradient of a squared error (up to the normalisation).  It changes
            :meth:`training_log_prob` (used by SVI, MAP and pretraining, and by :meth:`observe`) only; :meth:`log_prob` — reported
            densities, ArviZ, samplers — is always the honest Gaussian density.
        variance: the variance head's link, ``"log"`` or ``"softplus"`` (:data:`VARIANCE_LINKS`).
    """

    name = "heteroscedastic"
    task = "regression"
    heads = 2

    def __init__(self, beta: float = 0.5, variance: str = "log"):
        ok = isinstance(beta, (int, float)) and not isinstance(beta, bool) and 0 <= float(beta) <= 1
        if not ok:
            raise ValueError(f"heteroscedastic option beta must be a number in [0, 1] (0: plain NLL, 0.5: "
                             f"Seitzer et al. 2022), got {beta!r}")
        if variance not in VARIANCE_LINKS:
            raise ValueError(f"heteroscedastic option variance must be one of {', '.join(VARIANCE_LINKS)} (the "
                             f"variance head's link: log σ², or softplus + 10⁻⁶ as Lakshminarayanan et al. 2017), "
                             f"got {variance!r}")
        self.beta = float(beta)
        self.variance = variance

    def options(self):
        """``beta``, and ``variance`` when it is not the default log link (saves and reprs of log-link
        likelihoods stay as they were)."""
        return {"beta": self.beta, **({"variance": self.variance} if self.variance != "log" else {})}

    def split(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(μ, clamped log σ²)``, each ``[..., N, T]``, from outputs ``f`` ``[..., N, 2T]``."""
        if f.shape[-1] % 2:
            raise ValueError(f"a heteroscedastic likelihood needs 2 network outputs per target (mean, "
                             f"variance head), got {f.shape[-1]} outputs")
        mean, head = f.chunk(2, dim=-1)
        if self.variance == "softplus":
            return mean, (torch.nn.functional.softplus(head) + SOFTPLUS_MIN_VARIANCE).log().clamp(
                max=LOG_VARIANCE_RANGE[1])
        return mean, head.clamp(*LOG_VARIANCE_RANGE)

    def distribution(self, f, latents):
        mean, log_var = self.split(f)
        return dist.Normal(mean, (0.5 * log_var).exp())

    def training_log_prob(self, f, y, latents):
        """``[S, N]`` β-NLL objective ``Σ_t w_nt log N(y_nt | μ_nt, σ_nt²)``, ``w = sg(σ²)^β`` divided
        by its mean over the ``N`` points and ``T`` targets of each draw (standardised units)."""
        elementwise = self.distribution(f, latents).log_prob(y.unsqueeze(0))
        if self.beta == 0:
            return elementwise.sum(-1)
        weight = (self.beta * self.split(f)[1]).detach().exp()
        weight = weight / weight.mean(dim=(-2, -1), keepdim=True)  # mean 1 per draw: the ELBO's data/KL balance
        return (weight * elementwise).sum(-1)

    def sample(self, f, latents, generator=None):
        mean, log_var = self.split(f)
        return _normal_draw(mean, (0.5 * log_var).exp(), generator)

    def predictive_mean(self, f, latents):
        return self.split(f)[0]

    def noise_variance(self, f, latents):
        """σ²(x) ``[S, N, T]``."""
        return self.split(f)[1].exp()

    def mixture_params(self, f, latents):
        """``{"loc": μ [S, N, T], "scale": σ(x) [S, N, T]}``."""
        mean, log_var = self.split(f)
        return {"loc": mean, "scale": (0.5 * log_var).exp()}

    def output_fisher(self, f, latents):
        """``[N, 2T, 2T]`` in (μ, variance head): ``diag(1/σ², 1/2)`` for the log link, ``diag(1/σ², s(v)²/(2σ⁴))``
        for the softplus link; the variance entry is 0 where log σ² is clamped."""
        mean, head = f.chunk(2, dim=-1)
        log_var = self.split(f)[1]
        if self.variance == "softplus":
            inside = (log_var < LOG_VARIANCE_RANGE[1]).to(f.dtype)
            head_fisher = torch.sigmoid(head) ** 2 * (-2 * log_var).exp() / 2
        else:
            inside = (head == log_var).to(f.dtype)
            head_fisher = torch.full_like(head, 0.5)
        return torch.diag_embed(torch.cat([(-log_var).exp(), head_fisher * inside], dim=-1))
