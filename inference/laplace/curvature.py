"""Curvature of the negative log-likelihood over a network's random weights, via ``torch.func``.

The generalised Gauss–Newton matrix (GGN; Schraudolph 2002, Martens 2020) of
``−Σ_n log p(y_n | f(x_n; w))`` at weights ``w``:

    G = Σ_n J_nᵀ Λ_n J_n,     J_n = ∂f(x_n; w)/∂w  [O, P],     Λ_n = E_y[−∂² log p(y | f_n)/∂f²]  [O, O]

with ``Λ_n`` the likelihood's output Fisher (:meth:`zoo.likelihoods.Likelihood.output_fisher`:
``diag(1/σ²)`` for a Gaussian, ``diag(p) − p pᵀ`` for a categorical, ``diag(1/σ², ½)`` in
(μ, log σ²) for the heteroscedastic Gaussian, the location Fisher of a Student-t), so every
likelihood has one.  ``G`` is positive semi-definite and equals the Hessian wherever the network
is linear in ``w`` (e.g. its last layer) and the likelihood is Gaussian or categorical (there
the Fisher is the Hessian).  ``Λ_n`` is factorised by its symmetric square root ``L_n`` (``L_n
L_nᵀ = Λ_n``), so ``G = Σ_n V_nᵀ V_n`` with ``V_n = L_nᵀ J_n``.  Per-datum Jacobians come from
``torch.func.jacrev`` in chunks of data whose ``[n, O, P]`` Jacobian stays within a memory
budget: ``vmap``-ed over the data where the network has batching rules for that, else (a
recurrent layer: ``nn.GRU``, ``nn.LSTM``) one ``jacrev`` of a small chunk's outputs, whose
rows are independent because the network runs in eval mode (:func:`jacobian_path`).  Every
function here runs the network in eval mode and restores each module's mode afterwards
(:func:`evaluation_mode`): the curvature is that of the deterministic prediction-time network
(no dropout; batch normalisation on its running statistics, which are never updated).  :func:`ggn` returns the dense ``[P, P]`` matrix (small subsets: last layer, named
modules) or its diagonal ``[P]`` (large subsets).

:func:`kfac` returns the Kronecker-factored GGN (KFAC; Martens & Grosse 2015, for the Laplace
approximation Ritter et al. 2018): one :class:`KronBlock` per ``nn.Linear`` layer, with the
layer's random parameters as the matrix ``M = [W | b]`` ``[out, k]`` and its block

    G_l ≈ A_l ⊗ B_l  (quadratic form tr(ΔMᵀ B ΔM A)),
    A = Σ_n a_n a_nᵀ  [k, k],   B = (1/N) Σ_n Σ_o g_no g_noᵀ  [out, out],

``a_n`` the layer's input augmented by 1 for a random bias and ``g_no = ∂(L_nᵀ f_n)_o/∂s_n`` the
gradient of the ``o``-th column of ``L_nᵀ f_n`` with respect to the layer's output ``s_n``.  It is
exact for one datum (and for a layer whose ``g`` does not vary over the data, e.g. a single linear
layer with a Gaussian likelihood); blocks of different layers are zero.  Each chunk of data costs
one forward pass and ``O`` backward passes; no per-datum Jacobian is formed.

The weights are the flat vector of the network's random *weight* sites in
``bnn.sites`` order (:class:`WeightLayout`); likelihood latents such as the noise precision
are held at given values.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn
from torch.func import jacrev, vmap

__all__ = ["WeightLayout", "KronBlock", "fisher_sqrt", "ggn", "kfac", "kron_positions", "kfac_unsupported",
           "jacobian_chunks", "jacobian_path", "evaluation_mode", "effective_dim"]

#: upper bound on the elements of one chunk's per-datum Jacobian ``[n, O, P]``
_ELEMENT_BUDGET = 2**24
#: rows per chunk of the ``"rows"`` Jacobian path (its backward passes cost rows² per chunk)
_ROWS_CHUNK = 16


@contextlib.contextmanager
def evaluation_mode(net: nn.Module):
    """Run ``net`` in eval mode inside the block and give every submodule its own mode back afterwards."""
    modes = [(module, module.training) for module in net.modules()]
    net.eval()
    try:
        yield net
    finally:
        for module, training in modes:
            module.training = training


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


def fisher_sqrt(likelihood, f: torch.Tensor, latents: dict) -> torch.Tensor:
    """``L`` ``[n, O, O]`` with ``L Lᵀ = Λ``, the likelihood's output Fisher at outputs ``f`` ``[n, O]``
    (latents ``{name: [T]}`` held fixed): the symmetric square root ``Q diag(√λ) Qᵀ`` of its
    eigen-decomposition in float64 (eigenvalues below 0 from round-off clamped to 0), in ``f``'s dtype."""
    fisher = likelihood.output_fisher(f.detach(), latents).double()
    if not bool(torch.isfinite(fisher).all()):
        raise ValueError(f"the output Fisher of {type(likelihood).__name__} is not finite at the MAP outputs")
    eigenvalues, vectors = torch.linalg.eigh(fisher)
    return ((vectors * eigenvalues.clamp_min(0.0).sqrt().unsqueeze(-2)) @ vectors.transpose(-1, -2)).to(f.dtype)


def _data_vmap_jacobian(single, w: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
    return vmap(jacrev(single), in_dims=(None, 0))(w, xs)


def jacobian_path(layout: WeightLayout, w: torch.Tensor, x: torch.Tensor) -> str:
    """How :func:`jacobian_chunks` forms per-datum Jacobians for this network, tried on two rows of ``x``:
    ``"vmap"`` (``jacrev`` ``vmap``-ed over the data) where the network has batching rules for its
    inputs, else ``"rows"`` (one ``jacrev`` of a chunk's outputs, the backward pass ``vmap``-ed over
    the outputs only: recurrent layers).

    Raises:
        ValueError: neither works (what failed is in the message).
    """
    fn = layout.output_fn()
    single = lambda w, xi: fn(w, xi.unsqueeze(0)).squeeze(0)  # noqa: E731 - one datum: [O]
    probe = x[:2]
    errors = []
    with evaluation_mode(layout.bnn.net), torch.enable_grad():
        for path, jacobian in (("vmap", lambda: _data_vmap_jacobian(single, w, probe)),
                               ("rows", lambda: jacrev(lambda v: fn(v, probe))(w))):
            try:
                jacobian()
                return path
            except (RuntimeError, NotImplementedError) as error:
                errors.append(f"{path}: {type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}")
    raise ValueError("the per-datum Jacobians of this network's outputs cannot be formed with torch.func ("
                     + "; ".join(errors) + "); use a backend without curvature (svi, map, ensemble, sgld)")


def jacobian_chunks(layout: WeightLayout, w: torch.Tensor, x: torch.Tensor, path: Optional[str] = None):
    """Yield ``(index, f [n, O], J [n, O, P])``: outputs and per-datum Jacobians over chunks of ``x``,
    the network in eval mode (its modes restored after each chunk).

    ``path``: ``"vmap"`` or ``"rows"`` (:func:`jacobian_path`; ``None``: found on ``x`` first)."""
    if path is None:
        path = jacobian_path(layout, w, x)
    fn = layout.output_fn()
    single = lambda w, xi: fn(w, xi.unsqueeze(0)).squeeze(0)  # noqa: E731 - one datum: [O]
    num_out = layout.bnn.output_dim
    chunk = max(1, _ELEMENT_BUDGET // max(1, num_out * layout.dim))
    if path == "rows":
        chunk = min(chunk, _ROWS_CHUNK)
    for start in range(0, x.shape[0], chunk):
        index = torch.arange(start, min(start + chunk, x.shape[0]))
        xs = x[index]
        with evaluation_mode(layout.bnn.net):
            if path == "vmap":
                jac = _data_vmap_jacobian(single, w, xs)
            else:
                jac = jacrev(lambda v: fn(v, xs))(w)
            with torch.no_grad():
                f = fn(w, xs)
        yield index, f, jac


@torch.no_grad()
def ggn(layout: WeightLayout, w: torch.Tensor, latents: dict, x: torch.Tensor, structure: str = "full",
        path: Optional[str] = None) -> torch.Tensor:
    """GGN of the negative log-likelihood of data ``x`` at weights ``w`` ``[P]``.

    Args:
        layout: the flat-weight layout of the model.
        w: flat random weights ``[P]``.
        latents: likelihood latents ``{name: [*shape]}`` (e.g. ``noise_precision`` ``[O]``), held fixed.
        x: inputs ``[N, ...]`` (the GGN does not depend on the targets).
        structure: ``"full"`` → ``[P, P]``; ``"diag"`` → its diagonal ``[P]``.
        path: the Jacobian path (:func:`jacobian_chunks`).
    """
    if structure not in ("full", "diag"):
        raise ValueError(f"unknown GGN structure {structure!r}; valid: full, diag")
    likelihood = layout.bnn.likelihood
    out = torch.zeros((layout.dim, layout.dim) if structure == "full" else (layout.dim,), dtype=torch.float64,
                      device=w.device)
    with torch.enable_grad():
        for _, f, jac in jacobian_chunks(layout, w.detach(), x, path):
            root = fisher_sqrt(likelihood, f, latents)  # [n, O, O]
            v = (root.transpose(-1, -2) @ jac.detach()).double()  # [n, O, P]
            if structure == "full":
                flat = v.reshape(-1, layout.dim)
                out += flat.T @ flat
            else:
                out += (v * v).sum((0, 1))
    if not bool(torch.isfinite(out).all()):
        raise ValueError("the GGN has non-finite entries; the network's outputs or Jacobians at the MAP are not finite")
    return out


@dataclass
class KronBlock:
    """The Kronecker-factored GGN block of one ``nn.Linear`` layer (module docstring).

    Attributes:
        module: the layer's name in the network.
        positions: ``[out, k]`` int64, where the entries of ``M = [W | b]`` sit in the flat weights ``w``.
        a: ``[k, k]`` Σ_n a_n a_nᵀ (float64).
        b: ``[out, out]`` (1/N) Σ_n Σ_o g_no g_noᵀ (float64).
    """

    module: str
    positions: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor

    def dense(self) -> torch.Tensor:
        """The block ``B ⊗ A`` ``[out·k, out·k]`` in the row-major order of ``M`` (``positions.reshape(-1)``)."""
        return torch.kron(self.b, self.a)


def _linear_layers(layout: WeightLayout) -> dict:
    """``{module name: {"weight": offset, "bias": offset}}`` of the random sites' ``nn.Linear`` layers.

    Raises:
        ValueError: a random site that is not the whole weight or bias of an ``nn.Linear``.
    """
    layers, offset = {}, 0
    for site, size in zip(layout.bnn.sites, layout.sizes):
        module_name, _, param = site.name.rpartition(".")
        module = layout.bnn.net.get_submodule(module_name)
        if not isinstance(module, nn.Linear) or param not in ("weight", "bias") or site.mask is not None:
            raise ValueError(f"the Kronecker-factored GGN covers whole weights and biases of nn.Linear layers; the "
                             f"random site {site.name!r} is not one; use hessian='diag' or 'full'")
        layers.setdefault(module_name, {})[param] = offset
        offset += size
    return layers


def kfac_unsupported(layout: WeightLayout) -> Optional[str]:
    """Why :func:`kfac` cannot treat this model's random sites, or ``None`` when it can."""
    try:
        _linear_layers(layout)
    except ValueError as error:
        return str(error)
    return None


def kron_positions(layout: WeightLayout) -> dict:
    """``{layer name: [out, k] int64}``: where the entries of each layer's ``M = [W | b]`` sit in the flat
    weights (``W`` or ``b`` left out when it is not random).

    Raises:
        ValueError: a random site that is not the whole weight or bias of an ``nn.Linear``.
    """
    positions = {}
    for name, offsets in _linear_layers(layout).items():
        module = layout.bnn.net.get_submodule(name)
        out, inp = module.out_features, module.in_features
        columns = []
        if "weight" in offsets:
            columns.append(offsets["weight"] + torch.arange(out * inp).reshape(out, inp))
        if "bias" in offsets:
            columns.append(offsets["bias"] + torch.arange(out).unsqueeze(1))
        positions[name] = torch.cat(columns, dim=1)
    return positions


@torch.no_grad()
def kfac(layout: WeightLayout, w: torch.Tensor, latents: dict, x: torch.Tensor) -> list[KronBlock]:
    """The Kronecker-factored GGN of the negative log-likelihood of data ``x`` ``[N, ...]`` at ``w`` ``[P]``.

    Args as :func:`ggn`.  Returns one :class:`KronBlock` per ``nn.Linear`` layer holding random sites.
    Raises:
        ValueError: a random site outside ``nn.Linear`` layers, a layer called more than once per forward
            pass (weight sharing) or fed inputs that are not ``[n, in]``, or non-finite factors.
    """
    layers = _linear_layers(layout)
    positions = kron_positions(layout)
    net, likelihood = layout.bnn.net, layout.bnn.likelihood
    modules = {name: net.get_submodule(name) for name in layers}
    factors = {}
    for name, module in modules.items():
        k = positions[name].shape[1]
        factors[name] = [torch.zeros(k, k, dtype=torch.float64, device=w.device),
                         torch.zeros(module.out_features, module.out_features, dtype=torch.float64, device=w.device)]
    fn = layout.output_fn()
    widest = max(max(m.in_features, m.out_features) for m in modules.values())
    chunk = max(1, _ELEMENT_BUDGET // (widest * max(1, layout.bnn.output_dim) * len(modules)))
    w = w.detach().requires_grad_(True)  # the layers' outputs must carry a graph
    for start in range(0, x.shape[0], chunk):
        seen = {name: [] for name in modules}
        hooks = [m.register_forward_hook(lambda _m, args, out, name=name: seen[name].append((args[0], out)))
                 for name, m in modules.items()]
        try:
            with torch.enable_grad(), evaluation_mode(net):
                f = fn(w, x[start: start + chunk])
        finally:
            for hook in hooks:
                hook.remove()
        for name, calls in seen.items():
            if len(calls) != 1:
                raise ValueError(f"the Kronecker-factored GGN needs each nn.Linear called once per forward pass; "
                                 f"{name!r} ran {len(calls)} times (weight sharing); use hessian='diag' or 'full'")
            if calls[0][0].dim() != 2:
                raise ValueError(f"the Kronecker-factored GGN needs [n, in] inputs to each nn.Linear; {name!r} got "
                                 f"{tuple(calls[0][0].shape)}; use hessian='diag' or 'full'")
        root = fisher_sqrt(likelihood, f.detach(), latents)  # [n, O, O]
        outputs = [seen[name][0][1] for name in modules]
        for o in range(f.shape[-1]):
            with torch.enable_grad():
                grads = torch.autograd.grad((f * root[:, :, o]).sum(), outputs, retain_graph=True)
            for name, g in zip(modules, grads):
                g = g.double()
                factors[name][1] += g.T @ g
        for name in modules:
            inputs = seen[name][0][0].detach().double()
            parts = ([inputs] if "weight" in layers[name] else []) + (
                [torch.ones_like(inputs[:, :1])] if "bias" in layers[name] else [])
            a = torch.cat(parts, dim=1)
            factors[name][0] += a.T @ a
    blocks = [KronBlock(name, positions[name].to(w.device), a, b / x.shape[0])
              for name, (a, b) in factors.items()]
    if not all(bool(torch.isfinite(t).all()) for blk in blocks for t in (blk.a, blk.b)):
        raise ValueError("the Kronecker factors have non-finite entries; the network's outputs at the MAP are not "
                         "finite")
    return blocks


def effective_dim(eigenvalues: torch.Tensor, delta: float) -> float:
    """γ = Σ λ_i / (λ_i + δ): the number of well-determined parameters (MacKay 1992)."""
    return float((eigenvalues / (eigenvalues + delta)).sum())

