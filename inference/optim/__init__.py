"""Optimisation shared by the families: the one training loop, the MAP start point, LeanAdam.

* :mod:`.training` — :func:`~inference.optim.training.run_training_loop` (minibatches, KL warm-up and
  annealing, learning-rate schedule, NaN stop with the step number) and its options;
* :mod:`.potential` — the log density over the flattened random sites (HMC, SG-MCMC, Laplace, MAP);
* :mod:`.start` — the samplers' and Laplace's start point: the ``map`` backend's fit, or the current values;
* :mod:`.map` — the MAP fit (``map``, ensemble members, SWAG's burn-in, MC dropout) and its options;
* :mod:`.batches` — minibatches from tensors or a ``DataLoader``;
* :mod:`.lean_adam` — an Adam over flat parameter lists with a fused update;
* :mod:`.latent_fit` — the likelihood's latent parameters at a fixed network.
"""
