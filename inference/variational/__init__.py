"""The variational family: guides, ELBO estimators and the variational fit.

* :mod:`.protocol` — :class:`VariationalGuide`, the one interface of every guide (per-site mean and
  sd, pruning rule), and Pyro's module-local parameter mode for Pyro-module guides;
* :mod:`.guides` — the guide registry (``GUIDES``, ``build_guide``), Pyro's ``AutoNormal`` as
  ``NormalGuide`` with its fused ELBO, and what blocks the fused path;
* :mod:`.elbo` — the KL-weighted ELBO's two terms, on Pyro traces and fused for mean-field Normals;
* :mod:`.elbo_paths` — option ``elbo_path``: the fused or the Pyro-trace ELBO, and the choice;
* :mod:`.fit` — :func:`~inference.variational.fit.fit_guide`, the whole fit around the training
  loop of :mod:`inference.optim.training`, and the Pyro-trace particle;
* :mod:`.length` — the fit's length chosen on held-out rows (``epochs=None``: a ladder of fits of doubling length,
  each with its own cosine schedule, the held-out predictive read at each one's end), then a refit on every row;
* :mod:`.families` — Graves / sparse VD / Kingma VD: parameterisations, KLs, pruning rules;
* :mod:`.meanfield` — :class:`MeanFieldGuide`, those families over any model's sites, with a fused
  training path (one noise draw for all weights, or local reparameterisation);
* :mod:`.lrt` — local reparameterisation by module type;
* :mod:`.workspace` — reusable buffers of the fused mean-field path;
* :mod:`.latents` — Normal prior parameters and mean-field factors for constrained likelihood latents;
* :mod:`.radial` — the Radial AutoGuide (Farquhar, Osborne & Gal 2020); :mod:`.radial_kl` — its prior
  cross-entropy, exact or by the naive or M-independent MC estimator (Nazarovs et al. 2021);
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
