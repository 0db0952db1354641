"""Many small fits as one vectorised program: the engine behind :func:`inference.fit_many`.

K fits that share an architecture, a backend and its options — data splits, seeds, grid cells that
differ only in data or seed — train as one program over stacked parameters ``[K, ...]``: the
network runs once per step for all fits (``torch.func.vmap`` over the stacked weights, as the
deep-ensemble backend runs its members), one Adam steps every stacked tensor, and each fit keeps
its own data, minibatch order and random numbers (:mod:`inference.multifit.stacked`).  Fit k's
result is what ``fit(bnns[k], xs[k], ys[k], backend=..., seed=seeds[k], **options)`` returns, up to
float rounding (same seed, same protocol; tested in ``tests/inference/multifit/test_stacked.py``).

Backends with a stacked engine: ``map`` and ``ensemble`` (its K·M members; :mod:`inference.multifit.stacked_map`),
``svi`` on its fused ELBO path (the default mean-field Normal guide, Normal weight priors;
:mod:`inference.multifit.stacked_svi`), ``radial`` on its fused path with the exact cross-entropy
(Normal weight priors; :mod:`inference.multifit.stacked_radial`), and the SG-MCMC backends, whose MAP starts are
stacked (:func:`~inference.multifit.stacked_map.fit_map_starts`) before each fit's chains run on their own.
:func:`~inference.multifit.blockers.batch_blocker` says why a fit cannot join a batch (then it runs one at a time, as before):
another backend or ELBO path, no random weights, trainable deterministic parameters (one network shared by all
draws; ``map``, ``svi``, ``radial`` and the samplers' starts stack each fit's own, the body of a last-layer model),
partially random parameters, layers that are random at training time (dropout, batch norm) or
without ``vmap`` rules, or a model that overrides the Pyro program.  Fits in one batch must also
have the same data size N, the same site shapes, likelihood and (MAP) priors (:func:`inference.fitting.batch_signature`).
"""
