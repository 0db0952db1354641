"""The Laplace approximation (MacKay 1992; Ritter et al. 2018; Immer et al. 2021; Daxberger et al. 2021).

* :mod:`.curvature` — the generalised Gauss-Newton: full, diagonal and Kronecker-factored (KFAC)
  blocks, Jacobians of the network in chunks, the weight layout;
* :mod:`.map_ggn` — the MAP, the prior-whitened GGN there and the covariance root for a prior precision;
* :mod:`.evidence` — the prior precision: the weight prior's moments, the Laplace evidence (log
  marginal likelihood), MacKay's fixed point and the validation grid search;
* :mod:`.laplace_posterior` — the Gaussian posterior, its Kronecker roots and draws, the linearised network and
  the predictives (sampled network, GLM, probit, Laplace bridge);
* :mod:`.fit` — :func:`~inference.laplace.fit.fit_laplace`, the fit that assembles these parts (the ``laplace``
  backend, :mod:`inference.backends.laplace`, holds its options and calls it).
"""
