"""Local reparameterisation (Kingma, Salimans & Welling 2015, §2.3): sample pre-activations instead of weights.

For a layer ``b = x Wᵀ + c`` whose weights and bias are independent Gaussians,
W_ij ~ N(μ_ij, σ²_ij) and c_j ~ N(μ^c_j, (σ^c_j)²), every pre-activation is Gaussian given the
input (Kingma et al. 2015 eq. 6–7):

    b_nj ~ N(γ_nj, δ_nj),   γ = x μᵀ + μ^c,   δ = (x ⊙ x)(σ²)ᵀ + (σ^c)²,

so one draws ``b = γ + √δ ⊙ ε`` with ``ε ~ N(0, I)`` of the *output's* shape: independent noise
per data point (lower-variance gradients) and far fewer random numbers than one weight draw.
Convolutions are handled the same way with ``conv(x, μ)`` and ``conv(x ⊙ x, σ²)``
(Molchanov, Ashukha & Vetrov 2017 §4); there, and for a Linear layer applied to inputs with extra
dimensions (e.g. tokens ``[B, T, D]``), each output position gets its own noise, which keeps
every pre-activation's marginal exact but drops the correlations that one shared weight draw
would induce across positions — use weight sampling when those matter.

This is not a separate code path per architecture: :data:`LRT_LAYERS` maps a module *type* to a
function computing ``(γ, δ)``, :func:`lrt_modules` finds the modules of any network whose weight
site is fully random (bias random, deterministic or absent), and :func:`substituted_forwards`
temporarily replaces those modules' ``forward`` (an instance attribute, restored afterwards),
so the network's own ``forward`` — and :func:`torch.func.functional_call` over its other
parameters — run unchanged.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LRT_LAYERS", "register_lrt_layer", "lrt_modules", "lrt_forward", "substituted_forwards"]

#: variance floor inside the square root, so √δ has a finite gradient where δ = 0 (sd 1e-8)
_VAR_FLOOR = 1e-16


def _linear_moments(module: nn.Linear, x, w_mean, w_var, b_mean, b_var):
    return F.linear(x, w_mean, b_mean), F.linear(x * x, w_var, b_var)


def _conv_moments(conv: Callable):
    def moments(module, x, w_mean, w_var, b_mean, b_var):
        kw = dict(stride=module.stride, padding=module.padding, dilation=module.dilation, groups=module.groups)
        return conv(x, w_mean, b_mean, **kw), conv(x * x, w_var, b_var, **kw)

    return moments


#: module type → ``moments(module, x, w_mean, w_var, b_mean, b_var) -> (γ, δ)``
LRT_LAYERS: dict[type, Callable] = {
    nn.Linear: _linear_moments,
    nn.Conv1d: _conv_moments(F.conv1d),
    nn.Conv2d: _conv_moments(F.conv2d),
    nn.Conv3d: _conv_moments(F.conv3d),
}


def register_lrt_layer(module_type: type, moments: Callable) -> None:
    """Add a layer type: ``moments(module, x, w_mean, w_var, b_mean, b_var) -> (mean, variance)``."""
    LRT_LAYERS[module_type] = moments


def lrt_modules(net: nn.Module, random_sites: Mapping[str, object]) -> dict[str, tuple[str, Optional[str]]]:
    """Modules of ``net`` that local reparameterisation applies to.

    Args:
        net: the plain network.
        random_sites: ``{parameter name: StochasticSite}`` of the model's random sites.
    Returns:
        ``{module name: (weight site name, bias site name or None)}`` for every module whose
        type is in :data:`LRT_LAYERS`, whose ``weight`` is a fully random (unmasked) site, and
        whose ``bias`` is a fully random site, deterministic, or absent.  Conv layers with a
        non-zero ``padding_mode`` are left to weight sampling.
    """
    found = {}
    for name, module in net.named_modules():
        if type(module) not in LRT_LAYERS or getattr(module, "padding_mode", "zeros") != "zeros":
            continue
        prefix = f"{name}." if name else ""
        weight = random_sites.get(prefix + "weight")
        if weight is None or weight.mask is not None:
            continue
        bias = random_sites.get(prefix + "bias")
        if bias is not None and bias.mask is not None:
            continue
        found[name] = (prefix + "weight", prefix + "bias" if bias is not None else None)
    return found


def lrt_forward(module: nn.Module, x, w_mean, w_var, b_mean=None, b_var=None) -> torch.Tensor:
    """One locally reparameterised draw of ``module``'s output at input ``x``.

    ``w_mean``/``w_var`` have the weight's shape; ``b_mean``/``b_var`` the bias's (or ``None``:
    no bias / a deterministic bias has ``b_var=None``).  Returns ``γ + √δ ⊙ ε``, the module's
    output shape, with ε from the global torch generator.
    """
    mean, var = LRT_LAYERS[type(module)](module, x, w_mean, w_var, b_mean, b_var)
    noise = torch.randn_like(mean)
    return torch.addcmul(mean, (var + _VAR_FLOOR).sqrt(), noise)


@contextmanager
def substituted_forwards(net: nn.Module, forwards: Mapping[str, Callable]):
    """Within the block, module ``name``'s ``forward`` is ``forwards[name]`` (restored afterwards)."""
    modules = dict(net.named_modules())
    previous = {}
    try:
        for name, fn in forwards.items():
            module = modules[name]
            previous[name] = module.__dict__.get("forward")
            module.forward = fn
        yield
    finally:
        for name, old in previous.items():
            module = modules[name]
            if old is None:
                del module.forward
            else:
                module.forward = old
