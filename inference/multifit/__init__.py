"""Many small fits as one vectorised program: the engine behind :func:`inference.fit_many`.

K fits that share an architecture, a backend and its options — data splits, seeds, grid cells that
differ only in data or seed — train as one program over stacked parameters ``[K, ...]``: the
network runs once per step for all fits (``torch.func.vmap`` over the stacked weights, as the
deep-ensemble backend runs its members), one Adam steps every stacked tensor, and each fit keeps
its own data, minibatch order and random numbers (:mod:`inference.multifit.stacked`).  Fit k's
result is what ``fit(bnns[k], xs[k], ys[k], backend=..., seed=seeds[k], **options)`` returns, up to
float rounding (same seed, same protocol; tested per family in ``tests/inference/<family>/test_stacked*.py``, the
machinery in ``tests/inference/multifit/test_stacked.py``).

This folder holds the generic machinery only — stacking module state and data, the loop over K fits'
parameters, their streams of minibatches (:mod:`inference.multifit.stacked`) and which models can be
stacked at all (:mod:`inference.multifit.blockers`).  Each family owns its stacked fit, which calls the
same maths as its single fit: ``map`` (:mod:`inference.optim.stacked_map`, the one MAP step of
:func:`inference.optim.map.map_objective`), ``ensemble`` (its K·M members, :mod:`inference.ensembles.stacked`),
``svi`` on its fused ELBO path (:mod:`inference.variational.stacked_svi`, the one Gaussian KL
:func:`inference.variational.families.normal_kl`), ``radial`` on its fused path with the exact cross-entropy
(:mod:`inference.variational.stacked_radial`, the one Radial KL of :mod:`inference.variational.radial_kl`), and
the SG-MCMC backends, whose MAP starts are stacked (:func:`~inference.optim.stacked_map.fit_map_starts`) before
each fit's chains run on their own.  A backend declares its stacked fit on itself
(:attr:`~inference.backends.base.Backend.fit_stacked`); :func:`inference.fitting.batch_blocker` says why a fit
cannot join a batch (then it runs one at a time): a backend without a stacked engine, another ELBO path, no
random weights, trainable deterministic parameters where the engine does not stack them (``map``, ``svi``,
``radial`` and the samplers' starts stack each fit's own body of a last-layer model), partially random
parameters, layers that are random at training time (dropout, batch norm) or without ``vmap`` rules, or a model
that overrides the Pyro program.  Fits in one batch must also have the same data size N, the same site shapes,
likelihood and (MAP) priors (:func:`inference.fitting.batch_signature`).
"""
