"""The ``ensemble`` backend: ensembles of MAP fits (after Lakshminarayanan, Pritzel & Blundell 2017).

The paper's own protocol — mean-variance members, adversarial training, its training budget — is
the ``deep-ensemble`` backend (:mod:`inference.backends.deep_ensemble`); this one fits the model as
given (any likelihood, the prior as weight decay, the noise learned per member) with the MAP
optimiser's options.

``num_members`` K independently initialised MAP fits (:func:`inference.backends.map.fit_map`,
the prior as weight decay and the noise precision learned per member), each with its own
minibatch order.  Member k's seed is ``seed + k``; member 0 starts from the network's own
weights (so it is the ``map`` fit of the same seed, to float rounding), members k ≥ 1 from a fresh
initialisation of every random site (each layer's ``reset_parameters`` under the member's
seed; fixed entries of partially random parameters keep their values).

The posterior is a :class:`~inference.posterior.SamplePosterior` of K chains × 1 draw, one
chain per member, so it predicts by the equally weighted mixture of the members (the
ensemble's Bayesian model average) and the ArviZ export has the members as chains.
Deterministic parameters, which one network shares across draws, are fitted jointly by
member 0 and held at its values while members 1..K−1 fit their random sites (as the
SG-MCMC chains start from one MAP fit); with every parameter random, or the deterministic
ones frozen, all members are independent.

With a DataLoader (``fit(bnn, loader, backend="ensemble")``) every member reads the loader's
batches in the loader's own order (so members differ only by their initialisation), and the
members are fitted in this process (``workers`` must be 1: the loader does not travel to
worker processes).

With tensors, every parameter random (or the deterministic ones frozen) and a network that ``vmap``
runs (:func:`inference.multifit.blockers.batch_blocker`), the members train as one stacked program
(:func:`inference.multifit.map.fit_map_members`: weights ``[K, ...]``, one forward pass and one Adam for
all, each member its own start and minibatch order), the same fits to float rounding;
``vectorise=False`` fits them one after another (``info["vectorised"]`` says which).
``info["member_histories"]`` holds each member's per-epoch history (``info["history"]`` is
member 0's).  ``workers`` > 1 fits the members in that many local worker processes (one
torch thread each; they die with the parent process); ``executor="ray"`` fits them as Ray
tasks instead (:func:`inference.workers.run_calls`: on the Ray instance this process is
connected to, or a local one with ``workers`` CPUs).  With the heteroscedastic likelihood
(:class:`zoo.likelihoods.HeteroscedasticGaussianLikelihood`) each member fits its
:meth:`~zoo.likelihoods.Likelihood.training_log_prob` (``beta=0``: the negative log-likelihood, the
default ``beta=0.5`` the β-NLL of Seitzer et al. 2022); with a Gaussian likelihood the noise is
homoscedastic, learned per member.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Optional


from inference.optim.batches import LoaderBatches
from inference.evaluation.member_metrics import member_initial_values
from inference.posterior import SamplePosterior
from inference.optim.potential import frozen_deterministic
from inference.workers import check_executor, run_calls
from inference.backends.base import Backend, NonFiniteLossError
from inference.backends.map import MAPConfig, MAPFit, fit_map, run_info, stack_members

__all__ = ["EnsembleConfig", "EnsembleBackend", "member_initial_values", "check_member_options"]


def check_member_options(config, symbol: str) -> None:
    """Validate a multi-member config's ``num_members`` (called ``symbol`` in errors), ``workers`` and
    ``executor`` (:data:`inference.workers.EXECUTORS`)."""
    if int(config.num_members) < 1:
        raise ValueError(f"num_members ({symbol}) must be at least 1, got {config.num_members}")
    if int(config.workers) < 1:
        raise ValueError(f"workers must be at least 1, got {config.workers}")
    check_executor(config.executor)


@dataclass
class EnsembleConfig(MAPConfig):
    """:class:`~inference.backends.map.MAPConfig` plus ``num_members`` K (default 5, as in
    Lakshminarayanan et al. 2017), ``workers``, the local processes fitting members in parallel
    (1: one after another in this process), ``executor``: ``"local"`` or ``"ray"`` (members as
    Ray tasks), and ``vectorise``: train the members as one stacked program where the model allows it."""

    num_members: int = 5
    workers: int = 1
    executor: str = "local"
    vectorise: bool = True

    def validate(self):
        super().validate()
        check_member_options(self, "K")

    @property
    def parallel(self) -> bool:
        """Whether members are fitted outside this process."""
        return self.workers > 1 or self.executor == "ray"


def _fit_member(bnn, x, y, config: EnsembleConfig, seed: int, member: int,
                progress: bool) -> tuple[MAPFit, Optional[int]]:
    """Member ``member``'s MAP fit and the step at which it met a NaN/inf (``None`` if it finished).

    Members after the first hold the deterministic parameters at the network's values.
    """
    init = None if member == 0 else member_initial_values(bnn, seed + member)
    context = (lambda: frozen_deterministic(bnn)) if member else contextlib.nullcontext
    desc = f"ensemble member {member + 1}/{config.num_members}"
    try:
        return fit_map(bnn, x, y, config, seed + member, progress, init_values=init, training_context=context,
                       desc=desc), None
    except NonFiniteLossError as error:  # its last finite point travels back (the exception does not pickle)
        return error.posterior, error.step


class EnsembleBackend(Backend):
    """Deep ensembles: K MAP fits, one chain each (see the module docstring)."""

    name = "ensemble"
    Config = EnsembleConfig
    accepts_loader = True

    def run(self, bnn, x, y, config: EnsembleConfig, seed: int, progress: bool) -> SamplePosterior:
        started = time.perf_counter()
        if isinstance(x, LoaderBatches) and config.parallel:
            raise ValueError("ensemble members fit from a DataLoader run in this process: use workers=1 and "
                             "executor='local', or pass the data as tensors fit(bnn, x, y, ...) to fit members in "
                             "worker processes or Ray tasks")
        members = list(range(config.num_members))
        results = []
        from inference.multifit.blockers import batch_blocker  # deferred: importing inference.multifit imports the backends
        vectorised = (config.vectorise and not config.parallel and not isinstance(x, LoaderBatches)
                      and batch_blocker(bnn, "map", config) is None)
        if vectorised:  # the members as one stacked program
            from inference.multifit.map import fit_map_members
            starts = [bnn.initial_values()] + [member_initial_values(bnn, seed + k) for k in members[1:]]
            fits, steps = fit_map_members(bnn, x, y, config, [seed + k for k in members], starts, progress)
            results, members = list(zip(fits, steps)), []
        elif bnn.deterministic_parameters() or not config.parallel:  # member 0 fits the shared parameters first
            results.append(_fit_member(bnn, x, y, config, seed, 0, progress))
            members = members[1:]
        if config.parallel and members:
            results += run_calls(_fit_member, [(bnn, x, y, config, seed, k, False) for k in members], config.workers,
                                 config.executor)
        else:
            results += [_fit_member(bnn, x, y, config, seed, k, progress) for k in members]
        fits = [fit for fit, _ in results]
        info = run_info(self.name, config, seed, x, started, num_chains=config.num_members, vectorised=vectorised,
                        member_seeds=[seed + k for k in range(config.num_members)],
                        history=fits[0].history, member_histories=[fit.history for fit in fits])
        posterior = SamplePosterior(bnn, stack_members(fits), info=info)
        stopped = [(k, step) for k, (_, step) in enumerate(results) if step is not None]
        if stopped:
            member, step = stopped[0]
            raise NonFiniteLossError(step, f"the loss or gradient of ensemble member {member}", posterior)
        return posterior
