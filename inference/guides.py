"""Variational families (Pyro guides) over a :class:`~zoo.bnn.BayesianNetwork`'s sites.

Guides are built *and set up* at construction — their parameters exist before the first
SVI step — so ``state_dict`` / ``load_state_dict`` always work (unlike lazily built
guides).  ``GUIDES`` maps a name to a builder ``(bnn, init_values, **kwargs) -> guide``;
the Pyro module-local parameter mode is used so several fitted posteriors can live in
one process without sharing Pyro's global parameter store.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional

import pyro
import torch
from pyro.infer.autoguide import AutoNormal
from pyro.infer.autoguide.initialization import init_to_median, init_to_value

from zoo.bnn import BayesianNetwork

from .variational.meanfield import build_mean_field_guide
from .variational.radial import build_radial_guide

__all__ = ["GUIDES", "EmptyGuide", "build_guide", "register_guide"]

pyro.settings.set(module_local_params=True)


def _autonormal(bnn: BayesianNetwork, init_values: Mapping[str, torch.Tensor], init_scale: float = 1e-3):
    """Mean-field Normal guide (Pyro ``AutoNormal``) with locs at ``init_values``.

    Sites without an initial value (e.g. the noise precision) start at their prior median.
    """
    if not (init_scale > 0):
        raise ValueError(f"init_scale must be positive, got {init_scale}")
    return AutoNormal(
        bnn.model,
        init_loc_fn=init_to_value(values=dict(init_values), fallback=init_to_median),
        init_scale=float(init_scale),
    )


class EmptyGuide(torch.nn.Module):
    """Guide of a model with no latent sites (the deterministic baseline): samples nothing."""

    def forward(self, *args, **kwargs):
        return {}


GUIDES: dict[str, Callable] = {"normal": _autonormal}
GUIDES["mean-field"] = build_mean_field_guide  # Graves / sparse VD / Kingma VD families
GUIDES["radial"] = build_radial_guide  # Radial AutoGuide (Farquhar et al. 2020)


def register_guide(name: str, builder: Callable) -> None:
    """Add a guide builder ``(bnn, init_values, **kwargs) -> guide`` to the registry."""
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
