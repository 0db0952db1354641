"""The iterates SWAG summarises (Maddox et al. 2019; MultiSWAG, Wilson & Izmailov 2020): a burn-in,
then SGD with momentum collecting snapshots.

1. Burn-in: the members' MAP fits, ``burnin_epochs`` (:func:`burnin_epochs_of`) of minibatch Adam at
   ``burnin_lr`` (cosine decay), as an ensemble (:func:`inference.ensembles.map_members.fit_ensemble`; in ``workers`` local
   processes or Ray tasks): member 0 starts from the network's weights and fits the deterministic
   parameters jointly; members m ≥ 1 start from a fresh initialisation under seed ``seed + m`` with the
   deterministic parameters held at member 0's values.  Without burn-in the members start there.
2. SWAG phase: ``epochs`` of minibatch SGD (momentum ``momentum``) on −log π(z)/N over the random
   sites in unconstrained coordinates (:class:`inference.optim.potential.Potential`, the likelihood
   scaled by N/n), deterministic parameters held.  The learning rate is constant (``lr``) or cyclical
   (linear from ``lr`` down to ``lr_min`` over each collection period, Maddox et al. 2019, §3); a
   snapshot is added to the moments (:func:`inference.swag.moments.update_moments`) every
   ``collect_every`` steps.  All members take this phase together as one ``[M, D]`` batch (one batched
   forward and backward pass per step, sharing the minibatch).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import pyro
import torch

from inference.ensembles.map_members import EnsembleOptions, fit_ensemble_held_out
from inference.optim.early_stopping import EarlyStoppingOptions
from inference.ensembles.initialisation import member_initial_values
from inference.optim.batches import minibatches
from inference.optim.potential import Potential, frozen_deterministic
from inference.swag.moments import SWAGMoments, update_moments

__all__ = ["SWAGIterates", "swag_iterates", "burnin_epochs_of"]


def burnin_epochs_of(config) -> int:
    """The burn-in's configured epochs: ``config.burnin_epochs``, else (``None``) the ``ensemble`` backend's members'
    epochs (:class:`~inference.ensembles.map_members.EnsembleOptions`, 200), or the SWAG phase's where more — and
    then, as that backend does for a variance head or a trained body that sets a learned noise, at most that many,
    chosen on held-out rows (:func:`~inference.ensembles.map_members.fit_ensemble_held_out`; the length run is
    ``info["burnin_epochs"]``, the choice ``info["burnin_early_stopping"]``) — so that each member starts SWAG from the
    fit that backend returns: SWAG summarises SGD iterates around a trained solution
    (Maddox et al. 2019 start from a pretrained network; MultiSWAG is SWAG around each deep-ensemble member, Wilson &
    Izmailov 2020).  The SWAG phase's 100 epochs left members from fresh starts underfitted (UCI energy, 8-50-1:
    training RMSE 0.39–0.96 against 0.32–0.34), their iterates drifting, so the SWAG covariances and the members'
    noise grew with the misfit (MultiSWAG 90 % coverage 0.987, test RMSE 0.436; with the ensemble's 200, 0.961 and
    0.305; issue 38)."""
    if config.burnin_epochs is not None:
        return int(config.burnin_epochs)
    return max(int(config.epochs), EnsembleOptions().epochs)


class SWAGIterates(NamedTuple):
    """What :func:`swag_iterates` leaves besides the moments: ``z`` the last finite iterate ``[M, D]``, ``stopped``
    the step of a NaN/inf gradient (``None``: the phase finished), ``burnin_epochs`` the burn-in's epochs as run (the
    chosen length where it was chosen on held-out rows; 0 without burn-in) and ``burnin_early_stopping`` the choice's
    record (:func:`~inference.optim.early_stopping.choose_epochs`; ``None`` when the length was not chosen)."""

    z: torch.Tensor
    stopped: Optional[int]
    burnin_epochs: int
    burnin_early_stopping: Optional[dict]


def swag_iterates(bnn, x, y, config, seed: int, progress: bool, potential: Potential, moments: SWAGMoments,
                  collect_every: int) -> SWAGIterates:
    """Burn-in and the SWAG phase, collecting into ``moments`` (``M`` members, in place).

    ``config`` is the ``swag`` / ``multiswag`` config (``epochs``, ``batch_size``, ``lr``, ``lr_schedule``,
    ``lr_min``, ``momentum``, ``burnin_epochs``, ``burnin_lr``; ``workers`` and ``executor`` where it has them).
    Returns the :class:`SWAGIterates`.
    """
    num_members, num_data = moments.mean.shape[0], potential.num_data
    burnin_epochs, record = burnin_epochs_of(config), None
    if burnin_epochs:  # the burn-in is a deep ensemble of the members' MAP fits, as the ensemble backend fits them
        burn_in = EnsembleOptions(epochs=burnin_epochs, batch_size=config.batch_size, lr=config.burnin_lr,
                                  num_members=num_members, workers=int(getattr(config, "workers", 1)),
                                  executor=getattr(config, "executor", "local"))
        held_out = EarlyStoppingOptions(early_stopping=None if config.burnin_epochs is None else False)
        members = fit_ensemble_held_out(bnn, x, y, burn_in, seed, progress, held_out, desc="swag burn-in")
        record = members.info.get("early_stopping")
        burnin_epochs = record["epochs"] if record else burnin_epochs
        starts = members.draws  # {site: [M, 1, ...]}
        z = potential.pack({name: value[:, 0] for name, value in starts.items()})
    else:
        inits = [{}] + [member_initial_values(bnn, seed + m) for m in range(1, num_members)]
        z = torch.stack([potential.pack({**bnn.initial_values(), **potential.latent_init(), **init}) for init in inits])
    pyro.set_rng_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    z = z.detach()
    velocity = torch.zeros_like(z)
    step = 0
    with torch.no_grad(), frozen_deterministic(bnn):
        for _ in range(config.epochs):
            for index in minibatches(num_data, config.batch_size, generator):
                phase = (step % collect_every + 1) / collect_every
                lr = config.lr if config.lr_schedule == "constant" else (1 - phase) * config.lr + phase * config.lr_min
                _, grad = potential.value_and_grad(z, index)
                if not bool(torch.isfinite(grad).all()):
                    return SWAGIterates(z, step, burnin_epochs, record)
                velocity = config.momentum * velocity + grad / num_data
                z = z + lr * velocity
                step += 1
                if step % collect_every == 0:
                    update_moments(moments, z)
    return SWAGIterates(z, None, burnin_epochs, record)
