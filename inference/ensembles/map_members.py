"""K MAP fits as the members of an ensemble (after Lakshminarayanan, Pritzel & Blundell 2017).

``num_members`` K independently initialised MAP fits (:func:`inference.optim.map.fit_map`, the
prior as weight decay and the noise precision learned per member), each with its own minibatch
order.  Member k's seed is ``seed + k``; member 0 starts from the network's own weights (so it is
the ``map`` fit of the same seed, to float rounding), members k ≥ 1 from a fresh initialisation of
every random site (:func:`inference.ensembles.initialisation.member_initial_values`).

Deterministic parameters, which one network shares across draws, are fitted jointly by member 0
and held at its values while members 1..K−1 fit their random sites; with every parameter random, or
the deterministic ones frozen, all members are independent.  The members run one of three ways:

* as one stacked program (:func:`inference.optim.stacked_map.fit_map_members`: weights ``[K, ...]``, one
  forward pass and one Adam for all), when ``vectorise`` is set, the data are tensors, the members run
  in this process and the model stacks (:func:`inference.multifit.blockers.model_blocker`,
  :func:`inference.ensembles.stacked.ensemble_stack_blocker`);
* in ``workers`` local processes or as Ray tasks (:func:`inference.workers.run_calls`);
* one after another in this process (the only way from a DataLoader's batches).

:func:`fit_ensemble` fits the members for the configured epochs; :func:`fit_ensemble_held_out` first chooses those
epochs on held-out rows where the ``map`` backend's rule asks for it — the ``ensemble`` backend's fit and the ``swag`` /
``multiswag`` burn-in.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, fields, replace
from typing import Optional

from inference.ensembles.initialisation import check_member_options, member_initial_values
from inference.optim.batches import LoaderBatches
from inference.optim.early_stopping import choose_epochs, uses_early_stopping
from inference.optim.map import MAPFit, MAPOptions, fit_map, run_info, stack_members
from inference.optim.potential import frozen_deterministic
from inference.optim.training import NonFiniteLossError
from inference.ensembles.stacked import ensemble_stack_blocker
from inference.multifit.blockers import model_blocker
from inference.optim.stacked_map import fit_map_members
from inference.posterior import SamplePosterior
from inference.workers import run_calls

__all__ = ["EnsembleOptions", "fit_member", "fit_ensemble", "fit_ensemble_held_out"]


@dataclass
class EnsembleOptions(MAPOptions):
    """:class:`~inference.optim.map.MAPOptions` plus ``num_members`` K (default 5, as in
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


def fit_member(bnn, x, y, config: EnsembleOptions, seed: int, member: int,
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


def fit_ensemble(bnn, x, y, config: EnsembleOptions, seed: int, progress: bool) -> SamplePosterior:
    """The K members' MAP fits as a :class:`~inference.posterior.SamplePosterior` of K chains × 1 draw.

    Args:
        bnn, x, y: the model and validated training data ``[N, ...]`` (or ``x`` a
            :class:`~inference.optim.batches.LoaderBatches`, ``y`` ``None``).
        config: the :class:`EnsembleOptions`.
        seed: member k's seed is ``seed + k``.
        progress: show tqdm bars.
    Returns:
        The posterior; its ``info`` (backend ``"ensemble"``) holds ``vectorised``, ``member_seeds``,
        ``history`` (member 0's) and ``member_histories``.
    Raises:
        ValueError: a DataLoader with members outside this process.
        NonFiniteLossError: a member's loss or gradient became NaN/inf; ``.posterior`` holds every member's
            last finite point.
    """
    started = time.perf_counter()
    if isinstance(x, LoaderBatches) and config.parallel:
        raise ValueError("ensemble members fit from a DataLoader run in this process: use workers=1 and "
                         "executor='local', or pass the data as tensors fit(bnn, x, y, ...) to fit members in "
                         "worker processes or Ray tasks")
    members = list(range(config.num_members))
    results = []
    vectorised = (config.vectorise and not config.parallel and not isinstance(x, LoaderBatches)
                  and model_blocker(bnn, trained_body=False) is None  # the members share one body: not stacked
                  and ensemble_stack_blocker(bnn, config) is None)
    if vectorised:  # the members as one stacked program
        starts = [bnn.initial_values()] + [member_initial_values(bnn, seed + k) for k in members[1:]]
        fits, steps = fit_map_members(bnn, x, y, config, [seed + k for k in members], starts, progress)
        results, members = list(zip(fits, steps)), []
    elif bnn.deterministic_parameters() or not config.parallel:  # member 0 fits the shared parameters first
        results.append(fit_member(bnn, x, y, config, seed, 0, progress))
        members = members[1:]
    if config.parallel and members:
        results += run_calls(fit_member, [(bnn, x, y, config, seed, k, False) for k in members], config.workers,
                             config.executor)
    else:
        results += [fit_member(bnn, x, y, config, seed, k, progress) for k in members]
    fits = [fit for fit, _ in results]
    info = run_info("ensemble", config, seed, x, started, num_chains=config.num_members, chains_are_members=True,
                    vectorised=vectorised,
                    member_seeds=[seed + k for k in range(config.num_members)],
                    history=fits[0].history, member_histories=[fit.history for fit in fits])
    posterior = SamplePosterior(bnn, stack_members(fits), info=info)
    stopped = [(k, step) for k, (_, step) in enumerate(results) if step is not None]
    if stopped:
        member, step = stopped[0]
        raise NonFiniteLossError(step, f"the loss or gradient of ensemble member {member}", posterior)
    return posterior


def fit_ensemble_held_out(bnn, x, y, config: EnsembleOptions, seed: int, progress: bool, held_out=None,
                          desc: str = "ensemble") -> SamplePosterior:
    """:func:`fit_ensemble`, its epochs first chosen on held-out rows where ``held_out`` asks for it.

    ``held_out``: the :class:`~inference.optim.early_stopping.EarlyStoppingOptions` (or a config with their
    fields; ``None``: ``config`` itself).  Where :func:`~inference.optim.early_stopping.uses_early_stopping` says so
    (by default a variance head, or a trained body that sets a learned noise), member 0's MAP fit — the ``map``
    backend's fit of the same seed — runs on the kept rows for at most ``config.epochs`` and
    :func:`~inference.optim.early_stopping.choose_epochs` picks E* from its held-out curve; every member is then
    fitted on all rows for E* epochs, so member 0 stays the ``map`` fit.  The posterior's
    ``info["early_stopping"]`` holds the choice (absent when the epochs were not chosen); its ``config`` records
    the epochs fitted.  The ``ensemble`` backend's fit and the SWAG burn-in (:mod:`inference.swag.sgd`).
    """
    held_out = config if held_out is None else held_out
    if not uses_early_stopping(bnn, held_out, x):
        return fit_ensemble(bnn, x, y, config, seed, progress)
    no_choice = {"early_stopping": False} if "early_stopping" in {f.name for f in fields(config)} else {}
    config = replace(config, **no_choice)
    epochs, record = choose_epochs(
        lambda xk, yk, stop: fit_map(bnn, xk, yk, config, seed, progress, desc=f"{desc} (held-out epochs)", stop=stop),
        bnn, x, y, config.epochs, held_out, seed)
    posterior = fit_ensemble(bnn, x, y, replace(config, epochs=epochs), seed, progress)
    posterior.info["early_stopping"] = record
    return posterior
