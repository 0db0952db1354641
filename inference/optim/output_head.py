"""A sampled output layer evaluated on cached features: the same density, without re-running the body.

When every random weight belongs to one module ``M`` (``stochastic="last"``, a named head such as a
GRU regressor's ``out`` or a BatchNorm net's ``fc2``) and the network returns ``M``'s output as it is,

    f(x; w) = M(h(x); w),   h(x) the network up to ``M``'s input,

and during sampling ``h`` does not change: the deterministic parameters are frozen
(:func:`~inference.optim.potential.frozen_deterministic`) and the network is in eval mode (batch
normalisation on its running statistics, no dropout).  A sampler then needs ``h`` on the training rows
once, and each gradient of log π costs ``M``'s forward and backward pass for all chains instead of
the whole network's: a small CNN's last layer on the 1 347 digits rows, a GRU regressor's head (whose
recurrent body torch.compile cannot trace) or a BatchNorm net's ``fc2`` went from 10–50 s per NUTS
iteration to a fraction of a second (docs/mcmc.md, "Sampling an output layer on cached features").

* :func:`head_module` — the module ``M`` whose output is the network's, or why there is none: checked on
  two rows by forward hooks (``M`` called once, with one tensor argument, and its output tensor returned
  by the network itself), before any fitting;
* :class:`OutputHead` — ``M`` with its input ``h`` ``[N, ...]`` on the training rows, computed by
  :func:`cache_head` once the body is final (after the MAP start); :meth:`OutputHead.outputs` evaluates
  ``f`` for a stack of draws (``vmap`` of ``torch.func.functional_call`` over ``M``).
"""
from __future__ import annotations

from typing import Mapping, NamedTuple, Optional

import torch
from torch import nn
from torch.func import functional_call, vmap

__all__ = ["OutputHead", "head_module", "cache_head"]


class OutputHead(NamedTuple):
    """The sampled output module ``module`` (named ``name`` in the network) and its input ``features``
    ``[N, ...]`` on the training rows (the model's dtype and device)."""

    name: str
    module: nn.Module
    features: torch.Tensor

    def outputs(self, bnn, values: Mapping[str, torch.Tensor], index: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Network outputs ``[S, n, O]`` for draws ``values`` (``{site: [S, *site_shape]}``; latents ignored) on the
        rows ``index`` of the cached features (all when ``None``): ``M(h; w_s)``, the sites turned into
        ``M``'s parameters by :meth:`zoo.stochastic.StochasticSite.to_param` (masked sites keep their fixed
        entries), ``M``'s deterministic parameters as they are."""
        features = self.features if index is None else self.features[index]
        start = len(self.name) + 1  # "name." before each parameter's own name

        def single(draw):
            params = {site.name[start:]: site.to_param(draw[site.name]) for site in bnn.sites}
            return functional_call(self.module, params, (features,), strict=False)

        return vmap(single)({site.name: values[site.name] for site in bnn.sites})


def head_module(bnn, x: torch.Tensor) -> tuple[Optional[str], Optional[str]]:
    """``(name, None)``: the module whose output the network returns and which owns every random weight;
    or ``(None, reason)``.

    Checked on the first two rows of ``x`` with forward hooks, in eval mode and without gradients: the
    random weight sites of ``bnn`` all belong to one module ``M``, ``M`` runs once with one positional
    tensor and no keyword arguments, the network's output *is* the tensor ``M`` returned (nothing
    is computed after it), and :meth:`OutputHead.outputs` on ``M``'s captured input reproduces it for a
    stack of two draws.  A network with modules active at prediction (MC dropout) has no head.
    """
    sites = list(bnn.sites)
    if not sites:
        return None, "no random weights"
    owners = {site.name.rpartition(".")[0] for site in sites}
    if len(owners) != 1 or "" in owners:
        return None, f"the random weights belong to {len(owners)} modules"
    name = owners.pop()
    if bnn.active_at_prediction:
        return None, f"modules active at prediction ({', '.join(bnn.active_at_prediction)})"
    module = bnn.net.get_submodule(name)
    seen = {"calls": 0, "args_ok": True, "output": None, "input": None}

    def before(_module, args, kwargs):
        seen["calls"] += 1
        seen["args_ok"] = seen["args_ok"] and not kwargs and len(args) == 1 and isinstance(args[0], torch.Tensor)
        seen["input"] = args[0] if args else None

    def after(_module, _args, output):
        seen["output"] = output

    handles = [module.register_forward_pre_hook(before, with_kwargs=True), module.register_forward_hook(after)]
    modes = [(m, m.training) for m in bnn.net.modules()]
    bnn.net.eval()
    try:
        with torch.no_grad():
            out = bnn.net(bnn.placed_input(x[:2]))
    finally:
        for handle in handles:
            handle.remove()
        for m, training in modes:
            m.training = training
    if seen["calls"] != 1 or not seen["args_ok"]:
        return None, f"{name} runs {seen['calls']} times or with other than one tensor argument"
    if out is not seen["output"]:
        return None, f"the network computes on after {name}"
    current = {site: value.unsqueeze(0).expand(2, *value.shape) for site, value in bnn.initial_values().items()}
    try:  # the head alone, batched over draws, gives the network's output
        with torch.no_grad():
            again = OutputHead(name, module, seen["input"]).outputs(bnn, current)
    except Exception as err:  # noqa: BLE001 - a module vmap cannot batch: the whole network is evaluated instead
        return None, f"{name} cannot be evaluated on its own for a stack of draws ({type(err).__name__})"
    if not torch.allclose(again[1], out, rtol=1e-4, atol=1e-5):
        return None, f"{name} on its own does not reproduce the network's output"
    return name, None


def cache_head(bnn, name: str, x: torch.Tensor, chunk: int = 4096) -> OutputHead:
    """:class:`OutputHead` of module ``name`` with its input on all rows of ``x`` (in chunks of ``chunk`` rows, in
    eval mode, without gradients): call it once the network's deterministic parameters are final."""
    module = bnn.net.get_submodule(name)
    captured = []
    handle = module.register_forward_pre_hook(lambda _m, args: captured.append(args[0].detach()))
    modes = [(m, m.training) for m in bnn.net.modules()]
    bnn.net.eval()
    try:
        with torch.no_grad():
            for rows in bnn.placed_input(x).split(chunk):
                bnn.net(rows)
    finally:
        handle.remove()
        for m, training in modes:
            m.training = training
    return OutputHead(name, module, torch.cat(captured))
