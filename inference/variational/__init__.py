"""Variational families beyond the stock mean-field guide.

* :mod:`.protocol` — :class:`VariationalGuide`, the one interface of every guide (per-site mean and
  sd, pruning rule), and Pyro's module-local parameter mode for Pyro-module guides;
* :mod:`.families` — Graves / sparse VD / Kingma VD: parameterisations, KLs, pruning rules;
* :mod:`.meanfield` — :class:`MeanFieldGuide`, those families over any model's sites, with a fused
  training path (one noise draw for all weights, or local reparameterisation);
* :mod:`.lrt` — local reparameterisation by module type;
* :mod:`.radial` — the Radial AutoGuide with the naive and the M-independent MC cross-entropy;
* :mod:`.pruning` — sparsity, principled vs random pruning, repeated MC evaluation.
"""
from inference.variational.families import FAMILIES, get_family
from inference.variational.meanfield import ESTIMATORS, MeanFieldGuide
from inference.variational.protocol import PrunableGuide, PruningRule, VariationalGuide
from inference.variational.pruning import PRUNE_MODES, evaluate_repeated, prune, sparsity
from inference.variational.radial import AutoRadial, RadialNormal

__all__ = [
    "FAMILIES",
    "get_family",
    "ESTIMATORS",
    "MeanFieldGuide",
    "AutoRadial",
    "RadialNormal",
    "VariationalGuide",
    "PrunableGuide",
    "PruningRule",
    "PRUNE_MODES",
    "prune",
    "sparsity",
    "evaluate_repeated",
]
