"""Variational families beyond the stock mean-field guide (seeds 002 and 004).

* :mod:`.families` — Graves / sparse VD / Kingma VD: parameterisations, KLs, pruning rules;
* :mod:`.meanfield` — :class:`MeanFieldGuide`, those families over any model's sites, with a fused
  training path (one noise draw for all weights, or local reparameterisation);
* :mod:`.lrt` — local reparameterisation by module type;
* :mod:`.radial` — the Radial AutoGuide with the naive and the M-independent MC cross-entropy;
* :mod:`.pruning` — sparsity, principled vs random pruning, repeated MC evaluation.
"""
from .families import FAMILIES, get_family
from .meanfield import ESTIMATORS, MeanFieldGuide
from .pruning import evaluate_repeated, prune, sparsity
from .radial import AutoRadial, RadialNormal

__all__ = [
    "FAMILIES",
    "get_family",
    "ESTIMATORS",
    "MeanFieldGuide",
    "AutoRadial",
    "RadialNormal",
    "prune",
    "sparsity",
    "evaluate_repeated",
]
