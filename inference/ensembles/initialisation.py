"""The members of an ensemble: their fresh starting values and the checks of the member options.

Member 0 of every ensemble starts from the network's own weights; member m ≥ 1 from
:func:`member_initial_values` under seed ``seed + m`` (Lakshminarayanan et al. 2017: independent random
initialisations).
"""
from __future__ import annotations

import copy

import torch

from inference.workers import check_executor

__all__ = ["member_initial_values", "check_member_options"]


def member_initial_values(bnn, seed: int) -> dict:
    """Fresh site values ``{site: site-shaped}``: every layer's ``reset_parameters`` under ``seed``.

    Raises:
        ValueError: a random site whose layer has no ``reset_parameters`` (it cannot be re-initialised).
    """
    net = copy.deepcopy(bnn.net)
    reset = set()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for prefix, module in net.named_modules():
            if callable(getattr(module, "reset_parameters", None)):
                module.reset_parameters()
                reset.update(f"{prefix}.{n}" if prefix else n for n, _ in module.named_parameters(recurse=False))
    missing = [s.name for s in bnn.sites if s.name not in reset]
    if missing:
        raise ValueError(f"cannot re-initialise ensemble members: the layers of {', '.join(missing)} have no "
                         f"reset_parameters(); use num_members=1 or make those parameters deterministic")
    params = dict(net.named_parameters())
    return {s.name: s.from_param(params[s.name].detach()).clone() for s in bnn.sites}


def check_member_options(config, symbol: str) -> None:
    """Validate a multi-member config's ``num_members`` (called ``symbol`` in errors), ``workers`` and
    ``executor`` (:data:`inference.workers.EXECUTORS`)."""
    if int(config.num_members) < 1:
        raise ValueError(f"num_members ({symbol}) must be at least 1, got {config.num_members}")
    if int(config.workers) < 1:
        raise ValueError(f"workers must be at least 1, got {config.workers}")
    check_executor(config.executor)
