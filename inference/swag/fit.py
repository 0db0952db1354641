"""The SWAG fit: SWA-Gaussian (Maddox et al. 2019) and its mixture MultiSWAG (Wilson & Izmailov 2020),
assembled from the parts of :mod:`inference.swag` (the backends' options are
:class:`~inference.backends.swag.SWAGConfig` and :class:`~inference.backends.swag.MultiSWAGConfig`;
:func:`fit_swag` reads them).

Each member (``swag``: one; ``multiswag``: ``num_members`` M, default 5):

1. Burn-in: the members' MAP fits, ``burnin_epochs`` of minibatch Adam at ``burnin_lr``
   (cosine decay), as an ensemble (:func:`inference.ensembles.map_members.fit_ensemble`; in
   ``workers`` local processes for ``multiswag``).
2. SWAG phase: ``epochs`` of minibatch SGD (momentum ``momentum``) on −log π(z)/N over the
   random sites, deterministic parameters held, at a constant (``lr``) or cyclical rate (``lr`` down
   to ``lr_min`` over each collection period); a snapshot θ_i every ``collect_every`` steps (default
   one epoch; cyclical: at the end of each period) updates the running moments θ̄, θ̄² and the last
   K = ``max_rank`` deviation columns (:mod:`inference.swag.sgd`, :mod:`inference.swag.moments`).
3. ``num_samples`` draws per member, taken at fit end,

       θ = θ̄ + Σ_diag^{½} z₁/√2 + D z₂/√(2(K−1)),   Σ_diag = mean(θ_i²) − θ̄²,   z₁ ~ N(0, I_P), z₂ ~ N(0, I_K)

   (``diag=True``: SWAG-Diagonal, θ = θ̄ + Σ_diag^{½} z₁), into a
   :class:`~inference.swag.swag_posterior.SWAGPosterior` (a :class:`~inference.posterior.SamplePosterior`) of
   M chains (the MultiSWAG mixture with the members as ArviZ chains).

BatchNorm (Maddox et al. 2019, §4; :mod:`inference.swag.batchnorm`): training normalises by each
minibatch's statistics, and after sampling the running statistics are recomputed with one pass over
the training data for every draw (``batchnorm="draw"``) or once per member at its SWA mean θ̄
(``batchnorm="mean"``, ``S`` times cheaper), stored as extra draws that the posterior's network
predicts each draw with.
"""
from __future__ import annotations

import math
import time

import torch

from inference.optim.map import run_info
from inference.optim.potential import Potential
from inference.optim.training import NonFiniteLossError
from inference.swag.batchnorm import batch_statistics, batchnorm_layers, refreshed_statistics
from inference.swag.moments import init_moments
from inference.swag.sgd import swag_iterates
from inference.swag.swag_posterior import SWAGPosterior, swag_samples

__all__ = ["fit_swag"]


def fit_swag(bnn, x, y, config, seed: int, progress: bool, name: str = "swag") -> SWAGPosterior:
    """The SWAG posterior of ``bnn`` on ``(x [N, ...], y [N, T] or [N])`` (module docstring): one member, or
    ``config.num_members`` for MultiSWAG; ``name`` is the backend recorded in ``info``.

    Raises:
        ValueError: ``max_rank`` K exceeds the snapshots the SWAG phase collects.
        NonFiniteLossError: a non-finite SWAG gradient; it carries a posterior of one draw per member, the
            last finite state.
    """
    started = time.perf_counter()
    num_members = int(getattr(config, "num_members", 1))
    potential = Potential(bnn, x, y)
    num_data = potential.num_data
    steps_per_epoch = math.ceil(num_data / (config.batch_size or num_data))
    collect_every = config.collect_every or steps_per_epoch
    if not config.diag and config.num_snapshots(steps_per_epoch) < config.max_rank:
        raise ValueError(f"max_rank K={config.max_rank} exceeds the number of snapshots "
                         f"({config.num_snapshots(steps_per_epoch)} = epochs × {steps_per_epoch} steps / "
                         f"collect_every {collect_every}); raise epochs or lower max_rank")
    like = bnn.target_scale  # the model's dtype and device
    moments = init_moments(num_members, potential.dim, config.max_rank, like.dtype, like.device)
    with batch_statistics(bnn.net):
        z, stopped, burnin_epochs, burnin_choice = swag_iterates(bnn, x, y, config, seed, progress, potential, moments,
                                                                 collect_every)
    info = run_info(name, config, seed, x, started, num_chains=num_members, chains_are_members=num_members > 1,
                    num_random=potential.dim, collect_every=collect_every, num_snapshots=moments.count,
                    burnin_epochs=burnin_epochs, **({"burnin_early_stopping": burnin_choice} if burnin_choice else {}))
    if stopped is None:
        generator = torch.Generator(device=like.device).manual_seed(seed)
        theta = swag_samples(moments, config.num_samples, config.diag, generator)
    else:  # stopped early: the last finite state, one draw per member
        info["draws_from_last_finite_state"] = True
        theta = z.unsqueeze(1)
    draws = potential.draws(theta)
    if batchnorm_layers(bnn.net):
        centre = moments.mean if stopped is None else z
        draws.update(refreshed_statistics(bnn, draws, centre, potential, x, config.batchnorm, config.batch_size))
    info["fit_seconds"] = time.perf_counter() - started
    posterior = SWAGPosterior(bnn, draws, info=info)
    if stopped is not None:
        raise NonFiniteLossError(stopped, "the SWAG gradient", posterior)
    return posterior
