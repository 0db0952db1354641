"""MC dropout (Gal & Ghahramani 2016): dropout on the inputs of the chosen ``nn.Linear`` layers during
training and at prediction, as a variational posterior over those layers' weights.

* :mod:`.sampling` — the dropout layers, inverted dropout on their inputs during the MAP fit (the prior
  scaled by the keep probability) and the posterior's mask draws W·diag(z)/q;
* :mod:`.gal2016` — the UCI protocol of Gal & Ghahramani 2016's code: the validation search over the
  dropout rate (and noise precision τ) grid, the grid's cells as one ``vmap``-ed model, the refit.

The backend is :mod:`inference.backends.mc_dropout`.
"""
