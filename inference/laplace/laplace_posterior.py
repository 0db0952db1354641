"""The Laplace posterior N(w*, Σ) over a network's random weights and its predictives.

Σ is held by a square root ``S`` (Σ = S Sᵀ): dense ``[P, P]`` (full GGN), the sds ``[P]``
(diagonal) or a :class:`KronRoot` (Kronecker-factored).  Predictives (``predictive`` of
:class:`LaplacePosterior`, chosen by the ``laplace`` backend's ``LaplaceConfig.predictive``):

* ``"glm"``: the network linearised at the MAP, f(x; w) ≈ f(x; w*) + J(x)(w − w*) (the GLM
  predictive of Immer et al. 2021), evaluated at the posterior draws: Monte Carlo over the
  Gaussian f(x) ~ N(μ(x), J Σ Jᵀ), μ(x) = f(x; w*).
* ``"sample"``: the network itself at the draws.
* ``"probit"`` (classification; MacKay 1992, as laplace-torch's ``link_approx="probit"``):
  E[softmax(f)] ≈ softmax(κ ⊙ μ),  κ_k = (1 + π/8 · (J Σ Jᵀ)_kk)^{-½}.
* ``"bridge"`` (classification; the Laplace bridge, Hobbhahn, Kristiadi & Hennig 2022): the
  Gaussian is first conditioned on a zero logit sum (softmax ignores it),
  μ' = μ − Σ1 (1ᵀμ)/(1ᵀΣ1), Σ' = Σ − Σ1 1ᵀΣ/(1ᵀΣ1), then mapped to the Dirichlet
  α_k = (1 − 2/K + e^{μ'_k} K⁻² Σ_l e^{−μ'_l}) / Σ'_kk, whose mean α/Σ_l α_l is the predictive.

The two closed forms give every draw the same logits (``κ ⊙ μ``, resp. ``log α``), so a
:class:`~inference.prediction.Prediction`'s mean probabilities and log densities are exactly the
closed-form predictive.  Every predictive runs the network in eval mode and gives each module
its mode back (:func:`~inference.laplace.curvature.evaluation_mode`): a network handed over in train
mode (e.g. a fresh module to ``load_posterior(..., net=...)``) predicts as the fitted one, and
batch-normalisation statistics are never updated.
"""
from __future__ import annotations

import math

import torch
from torch.func import jvp, vmap

from zoo.bnn import BayesianNetwork

from inference.laplace.curvature import KronBlock, WeightLayout, evaluation_mode, jacobian_chunks, kron_positions
from inference.posterior import SamplePosterior

__all__ = ["KronRoot", "LinearisedNetwork", "LaplacePosterior", "PREDICTIVES", "probit_logits", "bridge_log_alpha",
           "sample_offsets", "gaussian_draws", "VALIDATED", "validation_nll"]

#: the predictives of :class:`LaplacePosterior` (``probit`` and ``bridge`` for classification only)
PREDICTIVES = ("glm", "sample", "probit", "bridge")
CLOSED_FORM = ("probit", "bridge")


class KronRoot:
    """A square root ``S`` of the Kronecker-factored Laplace covariance Σ = S Sᵀ (Ritter et al. 2018).

    Per layer, with ``M = [W | b]`` ``[out, k]``, GGN block ``B ⊗ A`` (:class:`~inference.laplace.curvature.KronBlock`)
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


def sample_offsets(scale, eps: torch.Tensor) -> torch.Tensor:
    """``S ε`` ``[S, P]`` for the covariance root ``scale`` (``[P, P]`` dense, ``[P]`` sds, or :class:`KronRoot`)."""
    if isinstance(scale, KronRoot):
        return scale.sample(eps)
    return eps @ scale.T if scale.dim() == 2 else eps * scale


def gaussian_draws(layout: WeightLayout, mean: torch.Tensor, scale, latents: dict, num_samples: int,
                   seed: int) -> dict:
    """``{site: [1, S, ...]}``: ``num_samples`` draws ``mean + S ε`` of the weights (``mean`` ``[P]``, ``scale`` a
    root as in :func:`sample_offsets`, ε ~ N(0, I) from a generator seeded by ``seed`` on ``mean``'s device),
    the likelihood's ``latents`` ``{site: [T]}`` repeated in every draw (one chain)."""
    generator = torch.Generator(device=mean.device).manual_seed(seed)
    eps = torch.randn(num_samples, layout.dim, generator=generator, dtype=mean.dtype, device=mean.device)
    weights = mean + sample_offsets(scale, eps)
    draws = {k: v.unsqueeze(0) for k, v in layout.unflatten(weights).items()}
    draws.update({k: v.expand(1, num_samples, *v.shape).clone() for k, v in latents.items()})
    return draws


def _projected(scale, jac: torch.Tensor) -> torch.Tensor:
    """``J S`` ``[n, O, P]`` of Jacobians ``jac`` ``[n, O, P]``: its rows' inner products are ``J Σ Jᵀ``."""
    if isinstance(scale, KronRoot):
        return scale.project(jac)
    return jac @ scale if scale.dim() == 2 else jac * scale


def probit_logits(mean: torch.Tensor, variance: torch.Tensor) -> torch.Tensor:
    """``κ ⊙ μ`` ``[N, K]``, κ = (1 + π/8 σ²)^{-½}: softmax of it is the probit predictive (MacKay 1992).

    Args: ``mean`` μ and ``variance`` σ² (the diagonal of J Σ Jᵀ), both ``[N, K]`` logits."""
    return mean * (1.0 + math.pi / 8.0 * variance).rsqrt()


def bridge_log_alpha(mean: torch.Tensor, covariance: torch.Tensor) -> torch.Tensor:
    """``log α`` ``[N, K]`` of the Laplace bridge's Dirichlet (Hobbhahn, Kristiadi & Hennig 2022; module
    docstring) for logits N(``mean`` ``[N, K]``, ``covariance`` ``[N, K, K]``); softmax of it is α/Σα.

    Computed in float64 and in log space (e^{μ_k} Σ_l e^{−μ_l} ≥ 1, so α > 0 for K ≥ 2); a variance of 0
    (after the zero-sum conditioning) is raised to the smallest normal float64."""
    mu, cov = mean.double(), covariance.double()
    k = mu.shape[-1]
    row = cov.sum(-1)  # Σ1 [N, K]
    total = row.sum(-1, keepdim=True)  # 1ᵀΣ1 [N, 1]
    safe = torch.where(total > 0, total, torch.ones_like(total))
    active = (total > 0).to(mu.dtype)
    mu = mu - active * row * mu.sum(-1, keepdim=True) / safe
    var = cov.diagonal(dim1=-2, dim2=-1) - active * row * row / safe
    var = var.clamp_min(torch.finfo(torch.float64).tiny)
    log_numerator = torch.logaddexp(torch.full_like(mu, math.log(1.0 - 2.0 / k) if k > 2 else -math.inf),
                                    mu + torch.logsumexp(-mu, -1, keepdim=True) - 2.0 * math.log(k))
    return (log_numerator - var.log()).to(mean.dtype)


#: the classification predictives whose held-out NLL :func:`validation_nll` scores for every δ at once
VALIDATED = ("probit", "bridge", "glm")


@torch.no_grad()
def validation_nll(bnn: BayesianNetwork, mean: torch.Tensor, basis, eigenvalues: torch.Tensor,
                   deltas: torch.Tensor, x: torch.Tensor, y: torch.Tensor, predictive: str, num_samples: int = 200,
                   seed: int = 0) -> torch.Tensor:
    """Mean negative log predictive density ``[G]`` of a classification ``predictive`` of :data:`VALIDATED` on
    ``(x [N, ...], y [N])`` for each prior precision scale δ of ``deltas`` ``[G]``.

    The posterior covariance at δ is Σ(δ) = U diag((λ + δ)⁻¹) Uᵀ, ``basis`` U the covariance root with
    unit ``inv_sd`` (dense ``[P, P]``, ``[P]`` or a :class:`KronRoot`) and ``eigenvalues`` λ ``[P]`` those
    of the prior-whitened GGN, so each input's Jacobian is projected once, (J U)_{kp} ``[N, K, P]``, and
    J Σ(δ) Jᵀ = (J U) diag((λ + δ)⁻¹) (J U)ᵀ for every δ; ``mean`` ``[P]`` the MAP weights.

    ``"probit"`` and ``"bridge"`` are in closed form.  ``"glm"`` is the Monte Carlo GLM predictive
    (Immer et al. 2021; laplace-torch's ``gridsearch`` with ``link_approx="mc"``): per input,
    −log (1/S) Σ_s softmax(μ + R(δ) ε_s)_y with R(δ) the symmetric root of J Σ(δ) Jᵀ ``[K, K]`` and
    ``num_samples`` S standard normal ε_s ``[K]`` drawn once (a generator seeded by ``seed``) and shared by every
    δ (common random numbers: the scores of neighbouring δ differ by the predictive, not by the draws)."""
    layout = WeightLayout(bnn)
    inv = (eigenvalues[:, None] + deltas[None, :].to(eigenvalues)).reciprocal().to(mean.dtype)  # [P, G]
    total = torch.zeros(deltas.shape[0], dtype=torch.float64, device=mean.device)
    generator = torch.Generator(device=mean.device).manual_seed(seed)
    with torch.enable_grad():  # the Jacobians need autograd; nothing else builds a graph (detached)
        for index, f, jac in jacobian_chunks(layout, mean, x):
            projected, labels = _projected(basis, jac.detach()), y[index]  # [n, K, P], [n]
            if predictive == "probit":
                logits = probit_logits(f.unsqueeze(0), (projected.square() @ inv).permute(2, 0, 1))  # [G, n, K]
                total -= bnn.likelihood.log_prob(logits, labels, {}).double().sum(-1)
                continue
            k, size, grid = f.shape[-1], projected.shape[-1], inv.shape[1]
            glm = predictive == "glm"
            eps = torch.randn(num_samples, *f.shape, generator=generator, dtype=torch.float64,
                              device=f.device) if glm else None  # [S, n, K]
            per_row = max(k * (k + 1) // 2 * size, grid * num_samples * k if glm else 0)
            for rows in torch.split(torch.arange(f.shape[0], device=f.device), max(1, _ELEMENTS // per_row)):
                covariance = _logit_covariances(projected[rows], inv)  # [G, r, K, K]
                if not glm:  # the bridge
                    log_lik = bnn.likelihood.log_prob(bridge_log_alpha(f[rows], covariance), labels[rows], {})
                    total -= log_lik.double().sum(-1)
                else:
                    total -= _glm_log_density(bnn.likelihood, f[rows], covariance, labels[rows], eps[:, rows])
    return total / x.shape[0]


#: elements of the largest intermediate tensor of :func:`validation_nll` per block of rows
_ELEMENTS = 2**24


def _logit_covariances(projected: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """J Σ(δ) Jᵀ ``[G, n, K, K]`` for every δ from ``projected`` J U ``[n, K, P]`` and ``inv`` (λ + δ)⁻¹ ``[P, G]``:
    the K(K+1)/2 products of pairs of rows of J U (``[n, K(K+1)/2, P]``) weighted by ``inv`` in one matrix
    product, instead of one pass over J U per δ."""
    n, k, _ = projected.shape
    upper = torch.triu_indices(k, k, device=projected.device)
    entries = ((projected[:, upper[0]] * projected[:, upper[1]]) @ inv).permute(2, 0, 1)  # [G, n, K(K+1)/2]
    covariance = projected.new_zeros(inv.shape[1], n, k, k)
    covariance[..., upper[0], upper[1]] = entries
    covariance[..., upper[1], upper[0]] = entries
    return covariance


def _glm_log_density(likelihood, f: torch.Tensor, covariance: torch.Tensor, y: torch.Tensor,
                     eps: torch.Tensor) -> torch.Tensor:
    """``[G]``: Σ_n log (1/S) Σ_s p(y_n | μ_n + R_n(δ) ε_sn) of :func:`validation_nll`'s ``"glm"`` for ``n`` rows:
    ``f`` μ ``[n, K]``, ``covariance`` J Σ(δ) Jᵀ ``[G, n, K, K]`` (R its symmetric root, by an eigen-decomposition in
    float64, round-off below 0 clamped), labels ``y`` ``[n]``, standard normal ``eps`` ε ``[S, n, K]``."""
    values, vectors = torch.linalg.eigh(covariance.double())
    root = (vectors * values.clamp_min(0.0).sqrt().unsqueeze(-2)) @ vectors.transpose(-1, -2)  # [G, n, K, K]
    logits = f.double() + torch.einsum("gnkj,snj->gsnk", root, eps)  # [G, S, n, K]
    grid, draws = logits.shape[:2]
    log_lik = likelihood.log_prob(logits.reshape(grid * draws, *f.shape), y, {}).double().reshape(grid, draws, -1)
    return (torch.logsumexp(log_lik, 1) - math.log(draws)).sum(-1)


class LinearisedNetwork(BayesianNetwork):
    """``bnn`` with its outputs linearised in the random weights at ``mean``: f(x; w*) + J(x)(w − w*).

    With ``scale`` (a root of Σ) and ``predictive`` ``"probit"`` or ``"bridge"``, :meth:`forward_draws`
    returns the closed-form predictive's logits for every draw (module docstring).
    """

    def __init__(self, bnn: BayesianNetwork, mean: torch.Tensor, scale=None, predictive: str = "glm"):
        super().__init__(bnn.net, prior=bnn.prior, likelihood=bnn.likelihood, train_deterministic=bnn.train_deterministic,
                         output_dim=bnn.output_dim, target_loc=bnn.target_loc.clone(),
                         target_scale=bnn.target_scale.clone(), sites=bnn.sites)
        self.layout = WeightLayout(self)
        self.register_buffer("mean", mean.detach().clone())
        self.scale, self.predictive = scale, predictive
        self._closed_form = (None, -1, None)  # (x, its version, logits [N, K]) of the last closed-form call

    def moments(self, x: torch.Tensor, joint: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``(μ [N, O], σ² [N, O])`` of the GLM predictive f(x) ~ N(μ, J Σ Jᵀ), or with ``joint`` the
        per-input covariance ``[N, O, O]`` over the outputs."""
        x = self.placed_input(x)
        means, spreads = [], []
        with torch.enable_grad():
            for _, f, jac in jacobian_chunks(self.layout, self.mean, x):
                projected = _projected(self.scale, jac.detach())
                means.append(f)
                spreads.append(projected @ projected.transpose(-1, -2) if joint else projected.square().sum(-1))
        return torch.cat(means), torch.cat(spreads)

    def closed_form_logits(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, K]`` logits whose softmax is the ``probit`` / ``bridge`` predictive at ``x``."""
        cached, version, logits = self._closed_form  # predict() asks once per chunk of draws
        if cached is not x or version != x._version:
            if self.predictive == "probit":
                logits = probit_logits(*self.moments(x))
            else:
                logits = bridge_log_alpha(*self.moments(x, joint=True))
            self._closed_form = (x, x._version, logits)
        return logits

    def forward_draws(self, values, x):
        num_draws = self.layout.flatten(values).shape[0]
        if self.predictive in CLOSED_FORM:
            logits = self.closed_form_logits(x)
            return logits.unsqueeze(0).expand(num_draws, *logits.shape)
        fn = self.layout.output_fn()
        x = self.placed_input(x)
        delta = self.layout.flatten(values) - self.mean
        with evaluation_mode(self.net):
            f0 = fn(self.mean, x)
            tangent = vmap(lambda d: jvp(lambda w: fn(w, x), (self.mean,), (d,))[1])(delta)
        return f0 + tangent


class LaplacePosterior(SamplePosterior):
    """Draws ``[1, S, ...]`` from the Laplace approximation N(mean, scale scaleᵀ) over the random
    weights (latents at their MAP), with the Gaussian itself for the GLM predictives.

    Attributes:
        mean: MAP weights ``[P]`` (flat, in ``bnn.sites`` order, standardised-unit network).
        scale: ``[P, P]`` square root of the covariance (full), the sds ``[P]`` (diagonal) or a
            :class:`KronRoot` (KFAC).
        predictive: one of :data:`PREDICTIVES` (all but ``"sample"`` make ``bnn`` a :class:`LinearisedNetwork`).
    """

    kind = "laplace"

    def __init__(self, bnn, draws, mean, scale, predictive: str = "sample", sample_stats=None, info=None):
        if predictive not in PREDICTIVES:
            raise ValueError(f"unknown predictive {predictive!r}; valid: {', '.join(PREDICTIVES)}")
        if predictive in CLOSED_FORM and bnn.likelihood.task != "classification":
            raise ValueError(f"predictive={predictive!r} is a classification predictive; use 'glm' or 'sample'")
        self.mean, self.predictive = mean.detach(), predictive
        self.scale = scale if isinstance(scale, KronRoot) else scale.detach()
        if predictive != "sample" and not isinstance(bnn, LinearisedNetwork):
            bnn = LinearisedNetwork(bnn, mean, self.scale, predictive)
        super().__init__(bnn, draws, sample_stats, info)

    def _summary_rows(self):
        rows = super()._summary_rows() + [("predictive", self.predictive)]
        for label, key in (("hessian", "hessian_structure"), ("prior precision scale δ", "prior_precision_scale"),
                           ("effective parameters γ", "effective_dim")):
            if key in self.info:
                value = self.info[key]
                rows.append((label, f"{value:.4g}" if isinstance(value, float) else str(value)))
                if key == "prior_precision_scale" and self.info.get("prior_precision_at_edge"):
                    rows[-1] = (label, f"{rows[-1][1]} (the {self.info['prior_precision_at_edge']} edge of its grid)")
        return rows

    @property
    def covariance(self) -> torch.Tensor:
        """``[P, P]`` posterior covariance of the random weights (diagonal: ``diag(scale²)``)."""
        if isinstance(self.scale, KronRoot):
            return self.scale.covariance()
        return self.scale @ self.scale.T if self.scale.dim() == 2 else torch.diag(self.scale**2)

    def _linearised(self) -> LinearisedNetwork:
        if isinstance(self.bnn, LinearisedNetwork):
            return self.bnn
        return LinearisedNetwork(self.bnn, self.mean, self.scale)

    @torch.no_grad()
    def glm_moments(self, x: torch.Tensor, joint: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Closed-form GLM predictive of the network output (Immer et al. 2021): mean f(x; w*) ``[N, O]``
        and variance diag(J Σ Jᵀ) ``[N, O]`` (with ``joint``: J Σ Jᵀ ``[N, O, O]``), in standardised
        units (regression) or logits; the network in eval mode."""
        return self._linearised().moments(x, joint)

    def _state(self):
        _, tensors = super()._state()
        scale = self.scale.layers if isinstance(self.scale, KronRoot) else self.scale
        return {"predictive": self.predictive}, {**tensors, "mean": self.mean, "scale": scale}

    @classmethod
    def _from_state(cls, bnn, meta, tensors, info):
        scale = KronRoot(tensors["scale"]) if isinstance(tensors["scale"], list) else tensors["scale"]
        return cls(bnn, tensors["draws"], tensors["mean"], scale, meta["predictive"], tensors["sample_stats"], info)
