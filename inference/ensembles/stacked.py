"""K ``ensemble`` runs as one stacked program: their K·M MAP members trained together.

Run k's M members are the members :func:`inference.ensembles.map_members.fit_ensemble` fits one by one
(member 0 from the network's weights, member m ≥ 1 from :func:`~inference.ensembles.initialisation.member_initial_values`
under seed k + m, each shuffling with seed k + m), trained by the stacked MAP trainer
(:func:`inference.optim.stacked_map.train_stacked`, the one MAP step) — what ``fit_many(..., backend="ensemble")``
runs; :func:`ensemble_stack_blocker` says when an ensemble cannot be stacked.
"""
from __future__ import annotations

import time
from typing import Optional

import torch

from inference.ensembles.initialisation import member_initial_values
from inference.optim.map import run_info, stack_members
from inference.optim.stacked_map import map_stack_blocker, train_stacked
from inference.optim.training import NonFiniteLossError
from inference.posterior import SamplePosterior

__all__ = ["fit_ensemble_stacked", "ensemble_stack_blocker"]


def ensemble_stack_blocker(bnn, config) -> Optional[str]:
    """Why an ``ensemble`` fit's members cannot be stacked (beyond the model's own reasons,
    :func:`inference.multifit.blockers.model_blocker`), or ``None``."""
    reason = map_stack_blocker(bnn, config)
    if reason is None and (config.parallel or not config.vectorise):
        return "the ensemble fits its members in other processes or one after another (workers, executor, vectorise)"
    return reason


def fit_ensemble_stacked(bnns: list, xs: torch.Tensor, ys: torch.Tensor, config, seeds: list, progress: bool) -> list:
    """K ``ensemble`` fits of M = ``config.num_members`` members each, all K·M MAP fits as one stacked program.

    Run k's member m starts where :func:`~inference.ensembles.map_members.fit_ensemble` starts it (member 0 at
    the network's weights, member m ≥ 1 at :func:`~inference.ensembles.initialisation.member_initial_values` under
    seed k + m) and shuffles with seed k + m.  Returns per run a :class:`~inference.posterior.SamplePosterior`
    of M chains, or a :class:`~inference.optim.training.NonFiniteLossError` carrying it when a member stopped.
    """
    started, members = time.perf_counter(), int(config.num_members)
    starts, member_seeds = [], []
    for bnn, seed in zip(bnns, seeds):
        starts += [bnn.initial_values()] + [member_initial_values(bnn, int(seed) + m) for m in range(1, members)]
        member_seeds += [int(seed) + m for m in range(members)]
    fits, stopped = train_stacked(bnns[0], starts, xs.repeat_interleave(members, 0), ys.repeat_interleave(members, 0),
                           config, member_seeds, progress, f"ensemble {len(bnns)} x {members} members (stacked)")
    seconds = (time.perf_counter() - started) / len(bnns)
    results = []
    for k, (bnn, seed) in enumerate(zip(bnns, seeds)):
        own = fits[k * members:(k + 1) * members]
        info = run_info("ensemble", config, int(seed), xs[k], started, num_chains=members, chains_are_members=True, vectorised=True,
                        member_seeds=member_seeds[k * members:(k + 1) * members], history=own[0].history,
                        member_histories=[fit.history for fit in own], multifit={"fits": len(bnns), "index": k})
        info["fit_seconds"] = seconds
        posterior = SamplePosterior(bnn, stack_members(own), info=info)
        failed = [(m, s) for m, s in enumerate(stopped[k * members:(k + 1) * members]) if s is not None]
        results.append(posterior if not failed else NonFiniteLossError(
            failed[0][1][0], f"the loss or gradient of ensemble member {failed[0][0]}", posterior))
    return results
