"""Curvature of the negative log-likelihood over a network's random weights, via ``torch.func``.

The generalised Gauss–Newton matrix (GGN; Schraudolph 2002, Martens 2020) of
``−Σ_n log p(y_n | f(x_n; w))`` at weights ``w``:

    G = Σ_n J_nᵀ Λ_n J_n,     J_n = ∂f(x_n; w)/∂w  [O, P],     Λ_n = −∂² log p(y_n | f)/∂f²  [O, O]

is positive semi-definite and equals the Hessian wherever the network is linear in ``w``
(e.g. its last layer) and the likelihood is Gaussian.  ``Λ_n`` is factorised as ``L_n L_nᵀ``:
a Gaussian with noise precisions ``τ`` gives ``L = diag(√τ)``; a categorical with
probabilities ``p`` gives ``L = diag(√p) − p √pᵀ`` (then ``L Lᵀ = diag(p) − p pᵀ``), so
``G = Σ_n V_nᵀ V_n`` with ``V_n = L_nᵀ J_n``.  Per-datum Jacobians come from
``torch.func.jacrev`` in chunks of data whose ``[n, O, P]`` Jacobian stays within a memory
budget.  :func:`ggn` returns the dense ``[P, P]`` matrix (small subsets: last layer, named
modules) or its diagonal ``[P]`` (large subsets).

The weights are the flat vector of the network's random *weight* sites in
``bnn.sites`` order (:class:`WeightLayout`); likelihood latents such as the noise precision
are held at given values.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.func import jacrev, vmap

from zoo.likelihoods import CategoricalLikelihood, GaussianLikelihood

__all__ = ["WeightLayout", "hessian_sqrt", "ggn", "jacobian_chunks", "effective_dim"]

#: upper bound on the elements of one chunk's per-datum Jacobian ``[n, O, P]``
_ELEMENT_BUDGET = 2**24


class WeightLayout:
    """Flat vector ``w`` ``[P]`` ↔ the random weight sites ``{site: site-shaped}`` of ``bnn``."""

    def __init__(self, bnn):
        self.bnn = bnn
        self.names = [s.name for s in bnn.sites]
        self.shapes = [torch.Size(s.shape) for s in bnn.sites]
        self.sizes = [int(s.numel()) for s in self.shapes]
        self.dim = sum(self.sizes)

    def unflatten(self, w: torch.Tensor) -> dict:
        """``{site: [*batch, *shape]}`` from ``w`` ``[*batch, P]``."""
        batch = w.shape[:-1]
        parts = torch.split(w, self.sizes, dim=-1)
        return {n: p.reshape(*batch, *s) for n, p, s in zip(self.names, parts, self.shapes)}

    def flatten(self, values: dict) -> torch.Tensor:
        """Inverse of :meth:`unflatten` (extra keys such as latents are ignored)."""
        parts = []
        for name, shape in zip(self.names, self.shapes):
            v = values[name]
            parts.append(v.reshape(*v.shape[: v.dim() - len(shape)], -1))
        return torch.cat(parts, dim=-1)

    def output_fn(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """``f(w, x) -> [n, O]``: the network output with the random weights set to ``w`` ``[P]``."""
        return lambda w, x: self.bnn.forward_single(self.unflatten(w), x)


def hessian_sqrt(likelihood, f: torch.Tensor, latents: dict) -> torch.Tensor:
    """``L`` ``[n, O, O]`` with ``L Lᵀ = −∂² log p(y | f)/∂f²`` at outputs ``f`` ``[n, O]``.

    Gaussian: ``diag(√τ)`` (τ the noise precision per output, fixed or from ``latents``);
    categorical: ``diag(√p) − p √pᵀ`` with ``p = softmax(f)``.  Neither depends on ``y``.
    """
    n, num_out = f.shape
    if isinstance(likelihood, GaussianLikelihood):
        sd = likelihood.noise_sd_of({k: v.unsqueeze(0) for k, v in latents.items()}, f.unsqueeze(0))
        precision = (sd.reshape(-1) ** -2).expand(num_out)
        return torch.diag_embed(precision.sqrt().expand(n, num_out))
    if isinstance(likelihood, CategoricalLikelihood):
        p = torch.softmax(f, dim=-1)
        return torch.diag_embed(p.sqrt()) - p.unsqueeze(-1) * p.sqrt().unsqueeze(-2)
    raise ValueError(
        f"no GGN for likelihood {type(likelihood).__name__}; Laplace supports GaussianLikelihood and CategoricalLikelihood"
    )


def jacobian_chunks(layout: WeightLayout, w: torch.Tensor, x: torch.Tensor):
    """Yield ``(index, f [n, O], J [n, O, P])``: outputs and per-datum Jacobians over chunks of ``x``."""
    fn = layout.output_fn()
    single = lambda w, xi: fn(w, xi.unsqueeze(0)).squeeze(0)  # noqa: E731 - one datum: [O]
    num_out = layout.bnn.output_dim
    chunk = max(1, _ELEMENT_BUDGET // max(1, num_out * layout.dim))
    for start in range(0, x.shape[0], chunk):
        index = torch.arange(start, min(start + chunk, x.shape[0]))
        xs = x[index]
        jac = vmap(jacrev(single), in_dims=(None, 0))(w, xs)
        with torch.no_grad():
            f = fn(w, xs)
        yield index, f, jac


@torch.no_grad()
def ggn(layout: WeightLayout, w: torch.Tensor, latents: dict, x: torch.Tensor, structure: str = "full") -> torch.Tensor:
    """GGN of the negative log-likelihood of data ``x`` at weights ``w`` ``[P]``.

    Args:
        layout: the flat-weight layout of the model.
        w: flat random weights ``[P]``.
        latents: likelihood latents ``{name: [*shape]}`` (e.g. ``noise_precision`` ``[O]``), held fixed.
        x: inputs ``[N, ...]`` (the GGN does not depend on the targets).
        structure: ``"full"`` → ``[P, P]``; ``"diag"`` → its diagonal ``[P]``.
    """
    if structure not in ("full", "diag"):
        raise ValueError(f"unknown GGN structure {structure!r}; valid: full, diag")
    likelihood = layout.bnn.likelihood
    out = torch.zeros((layout.dim, layout.dim) if structure == "full" else (layout.dim,), dtype=torch.float64)
    with torch.enable_grad():
        for _, f, jac in jacobian_chunks(layout, w.detach(), x):
            root = hessian_sqrt(likelihood, f, latents)  # [n, O, O]
            v = (root.transpose(-1, -2) @ jac.detach()).double()  # [n, O, P]
            if structure == "full":
                flat = v.reshape(-1, layout.dim)
                out += flat.T @ flat
            else:
                out += (v * v).sum((0, 1))
    if not bool(torch.isfinite(out).all()):
        raise ValueError("the GGN has non-finite entries; the network's outputs or Jacobians at the MAP are not finite")
    return out


def effective_dim(eigenvalues: torch.Tensor, delta: float) -> float:
    """γ = Σ λ_i / (λ_i + δ): the number of well-determined parameters (MacKay 1992)."""
    return float((eigenvalues / (eigenvalues + delta)).sum())

