"""Run a network with some parameters replaced by given tensors: a lean ``functional_call``.

:meth:`zoo.bnn.BayesianNetwork.forward_single` evaluates the network at one draw of its random
sites on every training step.  ``torch.func.functional_call`` does that by re-resolving every
name, checking and re-registering each tensor on every call — about 0.4 ms per call for a
two-layer MLP, 14 % of a UCI SVI run.  :class:`ParameterSlots` resolves each parameter name once
to the ``(module, attribute)`` places that hold it (several for tied weights, as
``functional_call(..., tie_weights=True)`` treats them) and :meth:`ParameterSlots.swapped` puts
the given tensors into those modules' parameter dicts for the duration of a block, restoring the
originals afterwards (also on error).  The network's forward reads them exactly as it reads its
own parameters, so outputs are bitwise those of ``functional_call``; ``vmap`` and ``torch.func``
transforms work the same way.  Under ``torch.compile`` callers keep ``functional_call``, which
dynamo understands.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Mapping

import torch
from torch import nn

__all__ = ["ParameterSlots"]


class ParameterSlots:
    """The places ``(module, attribute)`` of each of a network's parameters, by dotted name.

    Args:
        net: the network; its parameter *objects* are recorded, so a parameter replaced later
            (``module.weight = nn.Parameter(...)``) is noticed and the places are resolved again.
    """

    def __init__(self, net: nn.Module):
        self.net = net
        self._resolve()

    def _resolve(self) -> None:
        places: dict[int, list] = {}
        seen = set()
        for module in self.net.modules():
            for attr, param in module._parameters.items():
                if param is not None and (id(module), attr) not in seen:
                    seen.add((id(module), attr))
                    places.setdefault(id(param), []).append((module, attr))
        self._slots = {name: (param, places[id(param)])
                       for name, param in self.net.named_parameters(remove_duplicate=False)}

    def _places(self, name: str) -> list:
        slot = self._slots.get(name)
        if slot is None or any(module._parameters.get(attr) is not slot[0] for module, attr in slot[1]):
            self._resolve()
            slot = self._slots.get(name)
            if slot is None:
                raise KeyError(f"{name!r} is not a parameter of the network")
        return slot[1]

    @contextmanager
    def swapped(self, overrides: Mapping[str, torch.Tensor]):
        """Within the block, parameter ``name`` of the network is ``overrides[name]`` (any tensor)."""
        saved = []
        try:
            for name, value in overrides.items():
                for module, attr in self._places(name):
                    saved.append((module, attr, module._parameters[attr]))
                    module._parameters[attr] = value
            yield
        finally:
            for module, attr, original in reversed(saved):
                module._parameters[attr] = original
