"""The ``laplace`` backend: a Gaussian around the MAP of the random subset (MacKay 1992).

1. MAP: :func:`inference.potential.initial_point` (full-batch Adam on −log π, deterministic
   parameters trained jointly when the model trains them, then held).
2. Curvature: the GGN of the negative log-likelihood over the random *weights* at the MAP,
   built from the likelihood's output Fisher (:mod:`inference.curvature`; every likelihood):
   dense ``[P, P]`` for small subsets (last layer, named modules: subnetwork Laplace,
   Daxberger et al. 2021); for large ones Kronecker-factored per
   ``nn.Linear`` layer (KFAC, Martens & Grosse 2015; the Laplace approximation of Ritter et
   al. 2018, :class:`KronRoot`) or diagonal.
   Likelihood latents (a learned noise precision) are fixed at their MAP values for the
   curvature and in every draw.
3. Prior precision δ·P₀: ``P₀`` is the model prior's precision (``1/σ²`` per weight for
   Normal-family priors, else 1) and ``μ₀`` its mean.  ``prior_precision="model"`` keeps δ = 1
   (the model's own prior; exact for Bayesian linear regression); ``"marglik"`` maximises
   the Laplace evidence

       log Z(δ) = log p(y | w*) − δ/2 ‖w* − μ₀‖²_{P₀} + P/2 log δ − ½ Σ_i log(λ_i + δ) + const,

   λ_i the eigenvalues of the prior-whitened GGN ``P₀^{-½} G P₀^{-½}`` (KFAC: the products
   β_i α_j of the whitened factors' eigenvalues, layer by layer), by MacKay's (1992)
   fixed point δ ← γ / ‖w* − μ₀‖²_{P₀}, γ = Σ λ_i/(λ_i + δ), with the MAP held (post-hoc
   tuning as in Immer et al. 2021 and Daxberger et al. 2021).
4. Posterior N(w*, (G + δP₀)⁻¹); ``num_samples`` draws are taken at fit end into a
   :class:`LaplacePosterior` (a :class:`~inference.posterior.SamplePosterior`, one chain).
   ``predictive="glm"`` (the default) predicts with the network linearised at the MAP,
   f(x; w) ≈ f(x; w*) + J(x)(w − w*) at those draws (the GLM predictive of Immer et al. 2021,
   whose moments are also available in closed form, :meth:`LaplacePosterior.glm_moments`);
   ``"sample"`` with the network itself at the draws, which Immer et al. 2021 show to
   underfit when the random subset is large.  Where the network is linear in its random
   weights (``stochastic="last"``) the two coincide.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import pyro
import torch
from torch.func import jvp, vmap

from zoo.bnn import BayesianNetwork

from ..curvature import (KronBlock, WeightLayout, effective_dim, ggn, jacobian_chunks, kfac, kfac_unsupported,
                         kron_positions)
from ..posterior import SamplePosterior
from ..potential import INIT_STRATEGIES, Potential, frozen_deterministic, initial_point
from .base import Backend

__all__ = ["LaplaceConfig", "LaplaceBackend", "LaplacePosterior", "LinearisedNetwork", "KronRoot", "log_evidence",
           "mackay_precision"]

HESSIANS = ("auto", "full", "kfac", "diag")


@dataclass
class LaplaceConfig:
    """Options of the ``laplace`` backend.

    Attributes:
        hessian: ``"full"`` (dense GGN), ``"kfac"`` (Kronecker-factored per ``nn.Linear`` layer),
            ``"diag"`` (its diagonal) or ``"auto"`` (full when the random subset has at most
            ``max_full_dim`` weights, else KFAC where every random site is an ``nn.Linear`` weight
            or bias, else diagonal).
        max_full_dim: the ``"auto"`` threshold P (the dense GGN costs P² memory, P³ time).
        prior_precision: ``"marglik"`` (δ by the evidence) or ``"model"`` (δ = 1).
        predictive: ``"glm"`` (linearised network at the draws) or ``"sample"`` (network at the draws).
        num_samples: draws taken at fit end.
        init, map_steps, map_lr: the MAP fit (``"current"``: the network's weights as they are).
    """

    hessian: str = "auto"
    max_full_dim: int = 4000
    prior_precision: str = "marglik"
    predictive: str = "glm"
    num_samples: int = 200
    init: str = "map"
    map_steps: int = 2000
    map_lr: float = 0.01

    def validate(self):
        choices = {"hessian": HESSIANS, "prior_precision": ("marglik", "model"), "predictive": ("glm", "sample"),
                   "init": INIT_STRATEGIES}
        for name, valid in choices.items():
            if getattr(self, name) not in valid:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; valid: {', '.join(valid)}")
        for name in ("num_samples", "max_full_dim"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if int(self.map_steps) < 0:
            raise ValueError(f"map_steps must be non-negative, got {self.map_steps}")
        if not (math.isfinite(self.map_lr) and self.map_lr > 0):
            raise ValueError(f"map_lr must be positive, got {self.map_lr}")


def prior_moments(bnn, layout: WeightLayout) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``(μ₀ [P], P₀ [P], normal)``: the weight prior's mean and precision when every site's prior
    is a factorised Normal (``normal`` True), else zeros and ones (``normal`` False)."""
    means, precisions, normal = [], [], True
    priors = bnn.prior_distributions()
    for name, size in zip(layout.names, layout.sizes):
        d = priors[name]
        base = d.base_dist if isinstance(d, torch.distributions.Independent) else d
        if isinstance(base, torch.distributions.Normal):
            means.append(base.loc.reshape(-1).expand(size))
            precisions.append(base.scale.reshape(-1).expand(size) ** -2)
        else:
            normal = False
    if not normal:
        device = bnn.target_scale.device
        return (torch.zeros(layout.dim, dtype=torch.float64, device=device),
                torch.ones(layout.dim, dtype=torch.float64, device=device), False)
    return torch.cat(means).double(), torch.cat(precisions).double(), True


def log_evidence(log_lik: float, eigenvalues: torch.Tensor, sq_norm: float, delta: float) -> float:
    """log Z(δ) up to a δ-free constant (module docstring; MacKay 1992)."""
    p = eigenvalues.numel()
    return float(log_lik - 0.5 * delta * sq_norm + 0.5 * p * math.log(delta) - 0.5 * torch.log(eigenvalues + delta).sum())


def mackay_precision(eigenvalues: torch.Tensor, sq_norm: float, iterations: int = 500, tol: float = 1e-10) -> float:
    """δ maximising :func:`log_evidence`: MacKay's fixed point δ ← γ(δ)/‖w* − μ₀‖²_{P₀}, from δ = 1.

    At the fixed point ∂ log Z/∂δ = (P − δ Σ 1/(λ_i+δ) − δ‖·‖²)/(2δ) = (γ − δ‖·‖²)/(2δ) = 0.
    """
    delta = 1.0
    for _ in range(iterations):
        new = min(max(effective_dim(eigenvalues, delta) / max(sq_norm, 1e-300), 1e-10), 1e10)
        if abs(new - delta) <= tol * delta:
            return new
        delta = new
    return delta


class KronRoot:
    """A square root ``S`` of the Kronecker-factored Laplace covariance Σ = S Sᵀ (Ritter et al. 2018).

    Per layer, with ``M = [W | b]`` ``[out, k]``, GGN block ``B ⊗ A`` (:class:`~inference.curvature.KronBlock`)
    and prior precision ``δ·d_j`` on column ``j`` of ``M`` (equal across rows), the prior-whitened factors
    ``D^{-½} A D^{-½} = Q_A diag(α) Q_Aᵀ`` and ``B = Q_B diag(β) Q_Bᵀ`` give the posterior draw

        ΔM = (Q_B (Z ⊙ (βαᵀ + δ)^{-½}) Q_Aᵀ) D^{-½},   Z ~ N(0, I)  [out, k].

    Attributes:
        layers: per layer ``{"positions": [out, k] int64, "q_a": [k, k], "q_b": [out, out],
            "col": [k] (d^{-½}), "inv_sd": [out, k] ((βαᵀ + δ)^{-½})}``.
    """

    def __init__(self, layers: list[dict]):
        self.layers = layers

    @staticmethod
    def whiten(blocks: list[KronBlock], p0: torch.Tensor) -> tuple[list[dict], torch.Tensor]:
        """``(layers without inv_sd, eigenvalues [P])``: the whitened factors' eigen-decompositions and
        the P eigenvalues β_i α_j of the whitened GGN, from the blocks and the prior precisions ``p0`` ``[P]``."""
        layers, eigenvalues = [], []
        for block in blocks:
            col = p0[block.positions][0].rsqrt()  # equal across rows (:meth:`check_prior`)
            alpha, q_a = torch.linalg.eigh(col[:, None] * block.a * col[None, :])
            beta, q_b = torch.linalg.eigh(block.b)
            layers.append({"positions": block.positions, "q_a": q_a, "q_b": q_b, "col": col})
            eigenvalues.append((beta.clamp_min(0.0)[:, None] * alpha.clamp_min(0.0)[None, :]).reshape(-1))
        return layers, torch.cat(eigenvalues)

    @classmethod
    def with_sds(cls, layers: list[dict], inv_sd: torch.Tensor) -> "KronRoot":
        """The root from :meth:`whiten`'s ``layers`` and ``(λ + δ)^{-½}`` ``[P]`` in its eigenvalue order."""
        sizes = [layer["positions"].numel() for layer in layers]
        return cls([{**layer, "inv_sd": part.reshape(layer["positions"].shape)}
                    for layer, part in zip(layers, torch.split(inv_sd, sizes))])

    @staticmethod
    def check_prior(layout: WeightLayout, p0: torch.Tensor) -> None:
        """Raise ``ValueError`` unless every layer's prior precision ``p0[positions]`` is equal across rows."""
        for name, positions in kron_positions(layout).items():
            precision = p0[positions]
            if not torch.allclose(precision, precision[:1].expand_as(precision)):
                raise ValueError(f"hessian='kfac' needs the prior precision of layer {name!r} to be equal across "
                                 f"its output units; use hessian='diag' or 'full'")

    def to(self, dtype) -> "KronRoot":
        return KronRoot([{k: v if k == "positions" else v.to(dtype) for k, v in layer.items()}
                         for layer in self.layers])

    def sample(self, eps: torch.Tensor) -> torch.Tensor:
        """``S ε`` ``[S, P]`` for standard normal ``eps`` ``[S, P]``."""
        out = torch.empty_like(eps)
        for layer in self.layers:
            z = eps[:, layer["positions"]] * layer["inv_sd"]
            out[:, layer["positions"]] = (layer["q_b"] @ z @ layer["q_a"].T) * layer["col"]
        return out

    def project(self, jac: torch.Tensor) -> torch.Tensor:
        """``Sᵀ j`` ``[..., P]`` of rows ``jac`` ``[..., P]`` (so ``jᵀ Σ j = ‖Sᵀ j‖²``)."""
        parts = [((layer["q_b"].T @ (jac[..., layer["positions"]] * layer["col"]) @ layer["q_a"]) * layer["inv_sd"])
                 .flatten(-2) for layer in self.layers]
        return torch.cat(parts, dim=-1)

    def covariance(self) -> torch.Tensor:
        """The dense ``[P, P]`` Σ (small subsets only: P² memory)."""
        dim = sum(layer["positions"].numel() for layer in self.layers)
        root_t = self.project(torch.eye(dim, dtype=self.layers[0]["q_a"].dtype, device=self.layers[0]["q_a"].device))
        return root_t @ root_t.T


def _sample_offsets(scale, eps: torch.Tensor) -> torch.Tensor:
    """``S ε`` ``[S, P]`` for the covariance root ``scale`` (``[P, P]`` dense, ``[P]`` sds, or :class:`KronRoot`)."""
    if isinstance(scale, KronRoot):
        return scale.sample(eps)
    return eps @ scale.T if scale.dim() == 2 else eps * scale


def _output_variance(scale, jac: torch.Tensor) -> torch.Tensor:
    """``diag(J Σ Jᵀ)`` ``[n, O]`` of Jacobians ``jac`` ``[n, O, P]``."""
    if isinstance(scale, KronRoot):
        return scale.project(jac).square().sum(-1)
    return (jac @ scale).square().sum(-1) if scale.dim() == 2 else (jac.square() * scale**2).sum(-1)


class LinearisedNetwork(BayesianNetwork):
    """``bnn`` with its outputs linearised in the random weights at ``mean``: f(x; w*) + J(x)(w − w*)."""

    def __init__(self, bnn: BayesianNetwork, mean: torch.Tensor):
        super().__init__(bnn.net, prior=bnn.prior, likelihood=bnn.likelihood, train_deterministic=bnn.train_deterministic,
                         output_dim=bnn.output_dim, target_loc=bnn.target_loc.clone(),
                         target_scale=bnn.target_scale.clone(), sites=bnn.sites)
        self.layout = WeightLayout(self)
        self.register_buffer("mean", mean.detach().clone())

    def forward_draws(self, values, x):
        fn = self.layout.output_fn()
        delta = self.layout.flatten(values) - self.mean
        f0 = fn(self.mean, x)
        tangent = vmap(lambda d: jvp(lambda w: fn(w, x), (self.mean,), (d,))[1])(delta)
        return f0 + tangent


class LaplacePosterior(SamplePosterior):
    """Draws ``[1, S, ...]`` from the Laplace approximation N(mean, scale scaleᵀ) over the random
    weights (latents at their MAP), with the Gaussian itself for the GLM predictive.

    Attributes:
        mean: MAP weights ``[P]`` (flat, in ``bnn.sites`` order, standardised-unit network).
        scale: ``[P, P]`` square root of the covariance (full), the sds ``[P]`` (diagonal) or a
            :class:`KronRoot` (KFAC).
        predictive: ``"sample"`` or ``"glm"`` (then ``bnn`` is a :class:`LinearisedNetwork`).
    """

    kind = "laplace"

    def __init__(self, bnn, draws, mean, scale, predictive: str = "sample", sample_stats=None, info=None):
        if predictive == "glm" and not isinstance(bnn, LinearisedNetwork):
            bnn = LinearisedNetwork(bnn, mean)
        super().__init__(bnn, draws, sample_stats, info)
        self.mean, self.predictive = mean.detach(), predictive
        self.scale = scale if isinstance(scale, KronRoot) else scale.detach()

    def _summary_rows(self):
        rows = super()._summary_rows() + [("predictive", self.predictive)]
        for label, key in (("hessian", "hessian_structure"), ("prior precision scale δ", "prior_precision_scale"),
                           ("effective parameters γ", "effective_dim")):
            if key in self.info:
                value = self.info[key]
                rows.append((label, f"{value:.4g}" if isinstance(value, float) else str(value)))
        return rows

    @property
    def covariance(self) -> torch.Tensor:
        """``[P, P]`` posterior covariance of the random weights (diagonal: ``diag(scale²)``)."""
        if isinstance(self.scale, KronRoot):
            return self.scale.covariance()
        return self.scale @ self.scale.T if self.scale.dim() == 2 else torch.diag(self.scale**2)

    @torch.no_grad()
    def glm_moments(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Closed-form GLM predictive of the network output (Immer et al. 2021): mean f(x; w*) and
        variance diag(J Σ Jᵀ), both ``[N, O]`` in standardised units (regression) or logits."""
        layout = WeightLayout(self.bnn)
        means, variances = [], []
        with torch.enable_grad():
            for _, f, jac in jacobian_chunks(layout, self.mean, x):
                means.append(f)
                variances.append(_output_variance(self.scale, jac.detach()))
        return torch.cat(means), torch.cat(variances)

    def _state(self):
        _, tensors = super()._state()
        scale = self.scale.layers if isinstance(self.scale, KronRoot) else self.scale
        return {"predictive": self.predictive}, {**tensors, "mean": self.mean, "scale": scale}

    @classmethod
    def _from_state(cls, bnn, meta, tensors, info):
        scale = KronRoot(tensors["scale"]) if isinstance(tensors["scale"], list) else tensors["scale"]
        return cls(bnn, tensors["draws"], tensors["mean"], scale, meta["predictive"], tensors["sample_stats"], info)


def _structure(config: LaplaceConfig, layout: WeightLayout) -> str:
    """The GGN structure of ``config.hessian`` (``"auto"`` resolved; see :class:`LaplaceConfig`)."""
    if config.hessian != "auto":
        return config.hessian
    if layout.dim <= config.max_full_dim:
        return "full"
    return "diag" if kfac_unsupported(layout) else "kfac"


class LaplaceBackend(Backend):
    """Laplace approximation on the selected subset (MacKay 1992; Daxberger et al. 2021); module docstring."""

    name = "laplace"
    Config = LaplaceConfig

    def run(self, bnn, x, y, config, seed, progress):
        started = time.perf_counter()
        pyro.set_rng_seed(seed)
        layout = WeightLayout(bnn)
        if layout.dim == 0:
            raise ValueError("the laplace backend needs random weights; choose stochastic='all', 'last' or a pattern")
        if bnn.batched_draws is False:  # the curvature vmaps over the network's weights
            raise ValueError(f"the laplace backend needs a network that torch.func.vmap can batch over weight draws; "
                             f"this one cannot ({bnn.batching_error}); use svi, map, ensemble or sgld, or make the "
                             f"layer without a batching rule deterministic")
        mu0, p0, normal = prior_moments(bnn, layout)
        if config.prior_precision == "model" and not normal:
            raise ValueError(f"prior_precision='model' needs a Normal prior on the weights, got {bnn.prior!r}; "
                             f"use prior_precision='marglik' (an isotropic Gaussian prior tuned by the evidence)")
        structure = _structure(config, layout)
        if structure == "kfac":  # unsupported sites or layer priors: clear errors before the MAP fit
            KronRoot.check_prior(layout, p0)
        potential = Potential(bnn, x, y)
        z, record = initial_point(potential, config.init, config.map_steps, config.map_lr, progress)
        with frozen_deterministic(bnn):
            values, _ = potential.unpack(z.unsqueeze(0))
            w = layout.flatten({k: v[0] for k, v in values.items()})
            latents = {k: values[k][0] for k in bnn.latent_priors()}
            if structure == "kfac":
                g = kfac(layout, w, latents, x)
            else:
                g = ggn(layout, w, latents, x, structure)
            with torch.no_grad():
                log_lik = float(bnn.log_likelihood(values, x, y).sum())
        mu0, p0 = mu0.to(w.device), p0.to(w.device)
        root = p0.rsqrt()
        if structure == "full":
            eigenvalues, vectors = torch.linalg.eigh(root[:, None] * g * root[None, :])
            eigenvalues = eigenvalues.clamp_min(0.0)
        elif structure == "kfac":
            kron_layers, eigenvalues = KronRoot.whiten(g, p0)
        else:
            eigenvalues = (g * p0.reciprocal()).clamp_min(0.0)
        sq_norm = float((p0 * (w.double() - mu0) ** 2).sum())
        delta = 1.0 if config.prior_precision == "model" else mackay_precision(eigenvalues, sq_norm)
        inv_sd = (eigenvalues + delta).rsqrt()
        if structure == "kfac":
            scale = KronRoot.with_sds(kron_layers, inv_sd).to(w.dtype)
        else:
            scale = (root[:, None] * vectors * inv_sd[None, :] if structure == "full" else root * inv_sd).to(w.dtype)
        generator = torch.Generator(device=w.device).manual_seed(seed)
        eps = torch.randn(config.num_samples, layout.dim, generator=generator, dtype=w.dtype, device=w.device)
        weights = w + _sample_offsets(scale, eps)
        draws = {k: v.unsqueeze(0) for k, v in layout.unflatten(weights).items()}
        draws.update({k: v.expand(1, config.num_samples, *v.shape).clone() for k, v in latents.items()})
        info = {
            "backend": self.name, "config": asdict(config), "seed": seed, "num_data": x.shape[0],
            "num_random": layout.dim, "hessian_structure": structure, "prior_precision_scale": delta,
            "effective_dim": effective_dim(eigenvalues, delta), "log_evidence": log_evidence(log_lik, eigenvalues, sq_norm, delta),
            "map_log_likelihood": log_lik, **record, "fit_seconds": time.perf_counter() - started,
        }  # fmt: skip
        return LaplacePosterior(bnn, draws, w.detach(), scale, config.predictive, info=info)
