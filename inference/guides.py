"""Variational families (Pyro guides) over a :class:`~zoo.bnn.BayesianNetwork`'s sites.

Guides are built *and set up* at construction — their parameters exist before the first
SVI step — so ``state_dict`` / ``load_state_dict`` always work (unlike lazily built
guides).  ``GUIDES`` maps a name to a builder ``(bnn, init_values, **kwargs) -> guide``.
Every guide follows :class:`~inference.variational.protocol.VariationalGuide`.  The Pyro-module
guides (:class:`NormalGuide`, :class:`~inference.variational.AutoRadial`) keep their parameters
in the module (Pyro's module-local parameter mode, switched on for their construction and calls
only), so several fitted posteriors live in one process without sharing Pyro's global parameter
store, and importing this package changes no Pyro setting.
"""
from __future__ import annotations

from operator import attrgetter
from typing import Callable, Mapping, Optional

import torch
from pyro.infer.autoguide import AutoNormal
from pyro.infer.autoguide.initialization import init_to_median, init_to_value

from zoo.bnn import BayesianNetwork

from .variational.latents import is_real_support
from .variational.meanfield import build_mean_field_guide
from .variational.protocol import ModuleLocalParams
from .variational.radial import build_radial_guide

__all__ = ["GUIDES", "EmptyGuide", "NormalGuide", "build_guide", "register_guide"]


class NormalGuide(ModuleLocalParams, AutoNormal):
    """Pyro's mean-field Normal ``AutoNormal`` as a :class:`~inference.variational.protocol.VariationalGuide`.

    Its sites are the model's real-valued latent sites (the weights), with location and scale
    read from the public ``locs`` / ``scales`` parameters.  It defines no pruning rule.
    """

    def sites(self) -> list[str]:
        if self.prototype_trace is None:
            return []
        return [name for name, site in self.prototype_trace.iter_stochastic_nodes() if is_real_support(site["fn"].support)]

    def site_loc_scale(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(μ, σ)`` of real-valued site ``name``, detached."""
        if name not in self.sites():
            raise KeyError(f"{name!r} is not a real-valued site of this guide; its sites: {', '.join(self.sites())}")
        with torch.no_grad():
            return attrgetter(name)(self.locs).detach(), attrgetter(name)(self.scales).detach()

    def pruning_rule(self) -> None:
        return None


def _autonormal(bnn: BayesianNetwork, init_values: Mapping[str, torch.Tensor], init_scale: float = 1e-3) -> NormalGuide:
    """Mean-field Normal guide (:class:`NormalGuide`) with locs at ``init_values``.

    Sites without an initial value (e.g. the noise precision) start at their prior median.
    """
    if not (init_scale > 0):
        raise ValueError(f"init_scale must be positive, got {init_scale}")
    return NormalGuide(
        bnn.model,
        init_loc_fn=init_to_value(values=dict(init_values), fallback=init_to_median),
        init_scale=float(init_scale),
    )


class EmptyGuide(torch.nn.Module):
    """Guide of a model with no latent sites (the deterministic baseline): samples nothing."""

    def forward(self, *args, **kwargs):
        return {}

    def sites(self) -> list[str]:
        return []

    def site_loc_scale(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        raise KeyError(f"{name!r}: the model has no latent sites")

    def pruning_rule(self) -> None:
        return None


GUIDES: dict[str, Callable] = {"normal": _autonormal}
GUIDES["mean-field"] = build_mean_field_guide  # Graves / sparse VD / Kingma VD families
GUIDES["radial"] = build_radial_guide  # Radial AutoGuide (Farquhar, Osborne & Gal 2020)


def register_guide(name: str, builder: Callable) -> None:
    """Add a guide builder ``(bnn, init_values, **kwargs) -> guide`` to the registry.

    The guide should follow :class:`~inference.variational.protocol.VariationalGuide`; a
    ``PyroModule`` guide should mix in :class:`~inference.variational.protocol.ModuleLocalParams`.
    """
    GUIDES[name] = builder


def build_guide(name: str, bnn: BayesianNetwork, init_values: Optional[Mapping[str, torch.Tensor]] = None, **kwargs):
    """Build guide ``name`` for ``bnn`` and create all its parameters now."""
    try:
        builder = GUIDES[name]
    except KeyError:
        raise ValueError(f"unknown guide {name!r}; valid guides: {', '.join(GUIDES)}") from None
    if not bnn.site_names:
        return EmptyGuide()
    guide = builder(bnn, init_values if init_values is not None else bnn.initial_values(), **kwargs)
    guide()  # set up every parameter now (prototype trace of the weight sites only)
    return guide
