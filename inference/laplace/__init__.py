"""The Laplace approximation (MacKay 1992; Ritter et al. 2018; Immer et al. 2021; Daxberger et al. 2021).

* :mod:`.curvature` — the generalised Gauss-Newton: full, diagonal and Kronecker-factored (KFAC)
  blocks, Jacobians of the network in chunks, the weight layout;
* :mod:`.posterior` — the Gaussian posterior, its Kronecker roots, the linearised network and the
  predictives (sampled network, GLM, probit, Laplace bridge).

The backend is :mod:`inference.backends.laplace`.
"""
