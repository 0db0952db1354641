"""Ensembles of point estimates: K independently initialised networks mixed equally (Lakshminarayanan,
Pritzel & Blundell 2017), as the ``ensemble``, ``deep-ensemble`` and (for the burn-in) ``swag`` /
``multiswag`` backends assemble them.

* :mod:`.initialisation` — the members' fresh initialisations and the checks of the member options
  (``num_members``, ``workers``, ``executor``);
* :mod:`.map_members` — K MAP fits (:func:`inference.optim.map.fit_map`) as one ensemble: in this process,
  in worker processes or Ray tasks, or as one stacked program (:mod:`inference.optim.stacked_map`);
* :mod:`.stacked` — K ``ensemble`` runs' K·M members as one stacked program (``fit_many``);
* :mod:`.deep` — the paper's own protocol: mean-variance members trained with adversarial examples
  (the fast gradient sign method of Goodfellow et al. 2015) in one ``vmap``-ed loop.

The backends are :mod:`inference.backends.ensemble` and :mod:`inference.backends.deep_ensemble`.
"""
