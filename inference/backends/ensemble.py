"""The ``ensemble`` backend: ensembles of MAP fits (after Lakshminarayanan, Pritzel & Blundell 2017).

The paper's own protocol — mean-variance members, adversarial training, its training budget — is
the ``deep-ensemble`` backend (:mod:`inference.backends.deep_ensemble`); this one fits the model as
given (any likelihood, the prior as weight decay, the noise learned per member) with the MAP
optimiser's options: ``num_members`` K MAP fits, member k under seed ``seed + k``, member 0 from the
network's weights and members k ≥ 1 from fresh initialisations
(:func:`inference.ensembles.map_members.fit_ensemble`, which says how the deterministic parameters
are shared and when the members train as one stacked program).

The posterior is a :class:`~inference.posterior.SamplePosterior` of K chains × 1 draw, one
chain per member, so it predicts by the equally weighted mixture of the members (the
ensemble's Bayesian model average) and the ArviZ export has the members as chains.

With a DataLoader (``fit(bnn, loader, backend="ensemble")``) every member reads the loader's
batches in the loader's own order (so members differ only by their initialisation), and the
members are fitted in this process (``workers`` must be 1: the loader does not travel to
worker processes).  ``vectorise=False`` fits the members one after another (``info["vectorised"]``
says which).  ``info["member_histories"]`` holds each member's per-epoch history (``info["history"]``
is member 0's).  ``workers`` > 1 fits the members in that many local worker processes (one torch
thread each; they die with the parent process); ``executor="ray"`` fits them as Ray tasks instead
(:func:`inference.workers.run_calls`: on the Ray instance this process is connected to, or a local
one with ``workers`` CPUs).  With the heteroscedastic likelihood
(:class:`zoo.likelihoods.HeteroscedasticGaussianLikelihood`) each member fits its
:meth:`~zoo.likelihoods.Likelihood.training_log_prob` (``beta=0``: the negative log-likelihood, the
default ``beta=0.5`` the β-NLL of Seitzer et al. 2022); with a Gaussian likelihood the noise is
homoscedastic, learned per member.

With a likelihood that has a variance head (the heteroscedastic Gaussian) the members' number of epochs is
chosen on held-out rows by member 0's MAP fit (the ``map`` backend's choice for the same seed, so member 0
stays the ``map`` fit), and every member is then fitted on all rows for that many epochs (``early_stopping``,
:mod:`inference.optim.early_stopping`; ``info["early_stopping"]``;
:func:`inference.ensembles.map_members.fit_ensemble_held_out`).
"""
from __future__ import annotations

from dataclasses import dataclass

from inference.ensembles.map_members import EnsembleOptions, fit_ensemble_held_out
from inference.ensembles.stacked import ensemble_stack_blocker, fit_ensemble_stacked
from inference.optim.early_stopping import EarlyStoppingOptions
from inference.posterior import SamplePosterior
from inference.backends.base import Backend

__all__ = ["EnsembleConfig", "EnsembleBackend"]


@dataclass
class EnsembleConfig(EnsembleOptions, EarlyStoppingOptions):
    """The MAP optimiser's options plus ``num_members`` K (default 5, as in Lakshminarayanan et al.
    2017), ``workers``, the local processes fitting members in parallel (1: one after another in this
    process), ``executor``: ``"local"`` or ``"ray"`` (members as Ray tasks), and ``vectorise``: train
    the members as one stacked program where the model allows it
    (:class:`~inference.ensembles.map_members.EnsembleOptions`), and the held-out choice of the epochs
    (:class:`~inference.optim.early_stopping.EarlyStoppingOptions`)."""

    def validate(self):
        super().validate()
        self.check_early_stopping()


class EnsembleBackend(Backend):
    """Deep ensembles: K MAP fits, one chain each (see the module docstring)."""

    name = "ensemble"
    Config = EnsembleConfig
    accepts_loader = True
    budget = "members"
    fit_stacked = staticmethod(fit_ensemble_stacked)  # K runs' K·M members at once
    stack_blocker = staticmethod(ensemble_stack_blocker)

    def run(self, bnn, x, y, config: EnsembleConfig, seed: int, progress: bool) -> SamplePosterior:
        return fit_ensemble_held_out(bnn, x, y, config, seed, progress)
