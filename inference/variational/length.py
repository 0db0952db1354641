"""The length of a variational fit chosen on held-out rows, then a refit on every row (issue 38).

A fixed budget of 200 epochs leaves the ELBO of a mean-field fit over every weight of a small network far from
converged on a few hundred rows: on UCI energy (8-50-1, 691 rows, 2 200 steps) the ELBO is still rising, the
learned noise sd is 1.29 against a training RMSE of 0.695, and the predictive over-covers (90 % coverage 1.000;
3 000 epochs: noise sd 0.54, coverage 0.961).  A longer fixed budget (10 000 steps) converges there but costs two
moons its accuracy (a converged mean-field q over every weight underfits 200 points: 0.973 → 0.874) and a sine its
test LL (0.75 → 0.52).  So the length is chosen per problem, by the rule the ``map`` backend uses for its epochs
(:mod:`inference.optim.early_stopping`), on the honest metric of a variational fit, its predictive:

1. a seeded fifth of the training rows is held out (``validation_fraction``, :func:`~inference.optim.early_stopping.
   held_out_split`);
2. the fit runs on the other rows for at most :func:`max_epochs` E — the fixed 200 epochs, raised to
   ⌈``max_steps`` / steps per epoch⌉ (``max_steps`` 10 000 optimisation steps) on small data: 910 epochs on
   energy's 691 rows, 2 500 on 200 rows in minibatches of 64 — with its schedule over E; after every epoch the
   held-out log predictive density of the current q,

       ℓ_val(e) = (1/n_val) Σ_{i ∈ val} log (1/S) Σ_s p(y_i | x_i, w_s),   w_s ~ q_e,  S = 32,

   is recorded under one fixed seed (the same standard normals every epoch, so the curve follows q, not the
   Monte Carlo); the rule reads its mean over a window of ⌈E/50⌉ epochs (:func:`smoothing_window`: the iterates
   of a stochastic optimiser scatter about the trend), the run stops once ``patience`` epochs
   (:func:`default_patience`, max(10, ⌈E/4⌉)) have passed without a new maximum, and epochs inside a KL ramp
   (``kl_warmup_epochs + kl_anneal_epochs``: the objective is not yet the ELBO) are not candidates;
3. E* is the middle of the best window (``selection="best"``; ``"one-se"``: the earliest within one standard
   error), and the fit is refitted on all rows for E* epochs, its schedule compressed to them
   (``info["early_stopping"]`` holds the choice and the curve).

Measured (``benchmarks/defaults.py --cell SHAPE B SEL --threads 1``, issue 38's fourth pass): on energy the test LL
of every mean-field cell improves (over every weight −1.22…−1.44 → −0.67…−0.77; last layer −0.65…−0.79 →
−0.27…−0.47) and svi, svi-lrt and Radial over the last layer cover 0.92–0.96, but over every weight the held-out
predictive still rises at the cap and the fits cover 0.974–0.987 (converged, 3 000 epochs: 0.961).  Known bias:
the trial runs its schedule over E, so at an early epoch its learning rate has not decayed as a refit of that
length would, which undervalues short lengths — on the sine (200 rows) the choice runs to the cap (E* 2 255 of
2 500) and the test LL falls from 0.75 (200 epochs) to 0.53.

The cost is at most ``(1 − validation_fraction) · E + E`` epochs plus S draws on the held-out rows per epoch,
usually much less (the patience).  ``epochs=E`` trains exactly E (the budget the grids and the command line give);
``early_stopping=False`` is the former fixed 200 epochs; ``early_stopping=True`` chooses at most ``epochs``.  A
DataLoader's batches have no rows to hold out: the fixed 200 (``early_stopping=True`` is refused).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from inference.optim.batches import as_batches
from inference.optim.early_stopping import EarlyStoppingOptions, choose_epochs, uses_early_stopping

__all__ = ["FIXED_EPOCHS", "MAX_STEPS", "HELD_OUT_LENGTH_BLOCKER", "HeldOutLengthOptions", "chooses_length", "max_epochs", "default_patience", "smoothing_window",
           "fit_held_out_length"]

#: the variational backends' former fixed length, and the least the held-out choice may train to (epochs)
FIXED_EPOCHS = 200
#: the optimisation steps up to which the held-out choice may train on small data (:func:`max_epochs`)
MAX_STEPS = 10_000
#: why a fit that chooses its length cannot join a stacked batch (the stacked engines train a given length)
HELD_OUT_LENGTH_BLOCKER = ("the fit chooses its length on its own held-out rows (epochs=None), then refits for that "
                           "many; give epochs=E to stack the fits")


@dataclass
class HeldOutLengthOptions(EarlyStoppingOptions):
    """The held-out choice of a variational fit's length (see the module docstring).

    Attributes:
        epochs: passes over the training data (``None``: chosen on held-out rows, at most :func:`max_epochs`;
            the fixed :data:`FIXED_EPOCHS` where nothing is chosen).
        max_steps: the optimisation steps up to which the choice may train (:func:`max_epochs`).
        early_stopping, validation_fraction, patience, selection: the held-out choice
            (:class:`~inference.optim.early_stopping.EarlyStoppingOptions`; ``early_stopping=None``: when
            ``epochs`` is ``None``, :func:`chooses_length`; ``selection`` ``None``: ``"best"``).
    """

    epochs: Optional[int] = None
    max_steps: int = MAX_STEPS

    def validate(self):
        """Checks these options, then the loop's (at a stand-in length where ``epochs`` is ``None``)."""
        if self.epochs is not None and int(self.epochs) < 1:
            raise ValueError(f"epochs must be at least 1 (or None: chosen on held-out rows), got {self.epochs}")
        if int(self.max_steps) < 1:
            raise ValueError(f"max_steps (the optimisation steps up to which the held-out choice of the length may "
                             f"train) must be at least 1, got {self.max_steps}")
        self.check_early_stopping()
        stand_in = self if self.epochs is not None else dataclasses.replace(self, epochs=FIXED_EPOCHS)
        validate = getattr(super(HeldOutLengthOptions, stand_in), "validate", None)
        if validate is not None:
            validate()


def chooses_length(config, x=None) -> bool:
    """Whether the fit's length is chosen on held-out rows: ``config.early_stopping``, by default when ``epochs`` is
    ``None`` and ``x`` is a tensor (rows to hold out).  ``ValueError`` for ``early_stopping=True`` with a
    DataLoader's batches."""
    if config.early_stopping is not None:
        return uses_early_stopping(None, config, x)  # (its DataLoader refusal)
    return config.epochs is None and (x is None or isinstance(x, torch.Tensor))


def max_epochs(config, num_data: int, x=None) -> int:
    """The most epochs of a fit on ``num_data`` rows (exactly these when nothing is chosen): ``config.epochs`` when
    given; :data:`FIXED_EPOCHS` without the choice; else :data:`FIXED_EPOCHS` raised to ⌈``max_steps`` / steps per
    epoch⌉, steps per epoch ⌈N / batch⌉ (energy's 691 rows in 64s: 910; 200 rows: 2 500; 7 373 rows: 200)."""
    if config.epochs is not None:
        return int(config.epochs)
    if not chooses_length(config, x):
        return FIXED_EPOCHS
    batch = num_data if config.batch_size is None else min(int(config.batch_size), num_data)
    return max(FIXED_EPOCHS, math.ceil(int(config.max_steps) / math.ceil(num_data / batch)))


def default_patience(epochs: int) -> int:
    """Epochs without a better (windowed) held-out score before the trial stops: max(10, ⌈E / 4⌉) of a run of at
    most E epochs — longer than the ``map`` rule's E / 10, since a variational fit's held-out predictive can rest
    on a plateau for a long stretch before it rises again (Radial over every weight of energy's network: best
    at epoch 62 of a patience of 91, test LL −1.73; trained for 910 epochs, −0.78)."""
    return max(10, math.ceil(int(epochs) / 4))


def smoothing_window(epochs: int) -> int:
    """Epochs whose held-out scores the rule averages (:class:`~inference.optim.early_stopping.ValidationMonitor`'s
    ``window``): ⌈E / 50⌉ of a run of at most E epochs (19 of energy's 910, 50 of 2 500, 4 of 200)."""
    return max(1, math.ceil(int(epochs) / 50))


def fit_held_out_length(fit: Callable, bnn, x, y, config, seed: int):
    """The posterior of ``fit`` with the length of ``config`` resolved (the module docstring).

    ``fit(x, y, config, stop, held_out) -> VariationalPosterior`` runs the variational fit on ``x, y`` for
    ``config.epochs``, calling ``stop`` (``None``, or a :class:`~inference.optim.early_stopping.ValidationMonitor`
    over q's draws: :func:`inference.variational.fit.fit_guide`'s ``stop``) after every epoch; ``held_out`` says
    whether it is the trial on the kept rows.  The refit's ``info["early_stopping"]`` holds the choice; its
    ``config`` the epochs fitted (``early_stopping`` ``False``).
    """
    num_data = x.shape[0] if isinstance(x, torch.Tensor) else as_batches(x, y, config.batch_size).num_data
    choose = chooses_length(config, x)
    config = dataclasses.replace(config, epochs=max_epochs(config, num_data, x), early_stopping=False)
    record = None
    if choose:
        selection = config.selection or "best"
        ramp = int(getattr(config, "kl_warmup_epochs", 0)) + int(getattr(config, "kl_anneal_epochs", 0))
        rule = dataclasses.replace(config, patience=config.patience or default_patience(config.epochs))
        epochs, record = choose_epochs(lambda x_kept, y_kept, stop: fit(x_kept, y_kept, config, stop, True),
                                       bnn, x, y, config.epochs, rule, seed, selection=selection, predictive=True,
                                       min_epochs=min(ramp, config.epochs - 1), window=smoothing_window(config.epochs))
        config = dataclasses.replace(config, epochs=epochs)
    posterior = fit(x, y, config, None, False)
    if record is not None:
        posterior.info["early_stopping"] = record
    return posterior
