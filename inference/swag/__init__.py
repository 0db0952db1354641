"""SWA-Gaussian (Maddox et al. 2019) and its mixture MultiSWAG (Wilson & Izmailov 2020): a Gaussian
fitted to the iterates of SGD after a burn-in, one per member.

* :mod:`.moments` — the running moments of the iterates (θ̄, θ̄², the last K deviations) as a state
  with its init and update functions;
* :mod:`.sgd` — the burn-in (the members' MAP fits, :func:`inference.ensembles.map_members.fit_ensemble`)
  and the SWAG phase's SGD with momentum at a constant or cyclical rate, collecting snapshots;
* :mod:`.swag_posterior` — the SWAG draws θ̄ + Σ_diag^{½} z₁/√2 + D z₂/√(2(K−1)) and the posterior class;
* :mod:`.batchnorm` — BatchNorm under SWAG: batch statistics while training and the statistics
  recomputed per draw or per member (Maddox et al. 2019's ``bn_update``);
* :mod:`.fit` — the fit that assembles them (:func:`~inference.swag.fit.fit_swag`).

The backends are :mod:`inference.backends.swag` (``swag`` and ``multiswag``: their options and a one-line run).
"""
