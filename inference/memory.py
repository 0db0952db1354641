"""Memory estimates of a fit and of a prediction, checked before anything is allocated.

An estimate is a sum of named parts, each ``count × dtype size`` in bytes (b = the model's element size,
4 for float32), from the model's sizes — P parameters, R random scalars (``bnn.num_random``), O outputs,
A activations per row (the widths of its ``nn.Linear`` / ``nn.Conv*`` / ``nn.LSTM`` outputs, a lower
bound for other layers) — and the options that multiply them:

=====================  =============================================================  =====================
part                   bytes                                                           lowered by
=====================  =============================================================  =====================
stored draws           ``num_chains × num_samples × R × b``                            num_samples, num_chains
sampler states         ``num_chains × P × b × 4`` (position, momentum, gradient, mass)  num_chains
dense mass matrix      ``num_chains × R² × b × 2`` (``dense_mass=True``)               dense_mass=false
ensemble members       ``num_members × P × b × 4`` (weights, gradient, Adam moments)    num_members
SWAG moments           ``members × (max_rank + 2) × P × b``                            max_rank, num_members
full Laplace GGN       ``R² × b × 2`` (the matrix and its factor; ``hessian="full"``)   hessian="kfac"/"diag"
activations            ``batch rows × A × b × 3`` (forward, gradient, one copy)         batch_size
=====================  =============================================================  =====================

and a prediction ``5 × num_samples × points × O × b`` (:data:`PREDICTION_COPIES` arrays of draws ×
points × outputs).  These are the arrays that grow with the options; the framework's own overhead
(hundreds of MiB for torch) is not counted, so an estimate is a lower bound, and a refusal means the
request cannot fit.  :func:`check_fit_memory` and :func:`check_prediction_memory` raise ``ValueError``
with the estimate, its largest parts and what to lower; the memory available is
:func:`zoo.resources.available_memory` (``MemAvailable``; the environment variable ``ZOO_MEMORY_LIMIT``
overrides it, e.g. ``ZOO_MEMORY_LIMIT=64G`` on a machine with swap, or ``off``).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import nn

from zoo.resources import check_memory, format_bytes

__all__ = ["MemoryPart", "fit_memory", "prediction_memory", "run_prediction_memory", "check_fit_memory",
           "check_prediction_memory", "PREDICTION_COPIES"]

#: arrays of draws × points × outputs a prediction keeps (f, y, noise variance, mixture loc and scale)
PREDICTION_COPIES = 5
#: per-parameter arrays of a gradient-trained copy of the weights (weights, gradient, two Adam moments)
_TRAINED_COPIES = 4
#: per-parameter arrays of a sampler chain's state (position, momentum or noise, gradient, mass diagonal)
_CHAIN_COPIES = 4
#: values per draw × point a run's prediction and ArviZ exports hold at their peak (measured: run_prediction_memory)
_EXPORT_VALUES = 24
#: per-activation arrays of a training step (forward value, its gradient, one temporary)
_ACTIVATION_COPIES = 3


class MemoryPart(NamedTuple):
    """One part of an estimate: ``size`` bytes for ``what``, lowered by ``lower`` (an option or a size)."""

    size: float
    what: str
    lower: str


def activation_width(net: nn.Module) -> int:
    """Activations per input row: the output widths of the network's linear, convolutional and recurrent
    layers (a convolution counts its channels once per position it is not known at; a lower bound)."""
    width = 0
    for module in net.modules():
        if isinstance(module, nn.Linear):
            width += module.out_features
        elif isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            width += module.out_channels
        elif isinstance(module, (nn.LSTM, nn.GRU, nn.RNN)):
            width += module.hidden_size * (2 if module.bidirectional else 1) * module.num_layers
    return width


def _count(config, name: str, default: int = 1) -> int:
    value = getattr(config, name, default)
    return default if value is None else int(value)


def fit_memory(bnn, config, rows: Optional[int] = None) -> list:
    """The parts (:class:`MemoryPart`) of fitting ``bnn`` with backend options ``config`` on batches of
    ``rows`` rows (default: the config's ``batch_size``)."""
    element = bnn.target_scale.element_size()
    params = sum(p.numel() for p in bnn.net.parameters())
    random = int(bnn.num_random)
    parts = []
    chains = _count(config, "num_chains")
    if hasattr(config, "num_chains") and hasattr(config, "num_samples"):
        draws = chains * _count(config, "num_samples")
        parts.append(MemoryPart(draws * random * element, f"storing num_chains x num_samples = {draws:,} draws of "
                                f"{random:,} random values", "num_samples or num_chains"))
        parts.append(MemoryPart(chains * params * element * _CHAIN_COPIES, f"{chains:,} sampler chains' states",
                                "num_chains"))
        if getattr(config, "dense_mass", False):
            parts.append(MemoryPart(chains * random**2 * element * 2, f"a dense {random:,}x{random:,} mass matrix "
                                    f"per chain", "dense_mass (false: a diagonal mass matrix)"))
    members = _count(config, "num_members")
    if hasattr(config, "num_members"):
        parts.append(MemoryPart(members * params * element * _TRAINED_COPIES,
                                f"{members:,} ensemble members of {params:,} parameters", "num_members"))
    if hasattr(config, "max_rank"):
        rank = _count(config, "max_rank") + (1 if getattr(config, "diag", False) else 2)
        parts.append(MemoryPart(members * rank * params * element, f"SWAG moments (rank {rank - 2}) of "
                                f"{members:,} member(s)", "max_rank"))
    if getattr(config, "hessian", None) == "full" or (getattr(config, "hessian", None) == "auto"
                                                      and random <= _count(config, "max_full_dim", 0)):
        parts.append(MemoryPart(random**2 * element * 2, f"a dense {random:,}x{random:,} Laplace GGN",
                                "the network's random weights, or hessian='kfac' / 'diag'"))
    batch = rows if rows is not None else _count(config, "batch_size", 1)
    copies, per, lower = 1, "", "batch_size"
    if hasattr(config, "num_chains") and chains > 1:
        copies, per, lower = chains, f" x {chains:,} chains", "num_chains or batch_size"
    elif hasattr(config, "num_members") and members > 1:
        copies, per, lower = members, f" x {members:,} members", "num_members or batch_size"
    parts.append(MemoryPart(copies * batch * activation_width(bnn.net) * element * _ACTIVATION_COPIES,
                            f"activations of {batch:,} rows{per}", lower))
    return parts


def prediction_memory(bnn, num_samples: int, points: int, draws_from: Optional[dict] = None) -> MemoryPart:
    """The draws × points × outputs arrays of a prediction (:data:`PREDICTION_COPIES` of them).

    ``draws_from``: the options whose product is ``num_samples`` (e.g. ``{"num_samples": 200, "num_chains": 4}``),
    named in the message and in what to lower."""
    size = PREDICTION_COPIES * int(num_samples) * int(points) * bnn.output_dim * bnn.target_scale.element_size()
    draws_from = {k: v for k, v in (draws_from or {"num_samples": num_samples}).items() if int(v) > 1} or {
        "num_samples": num_samples}
    source = " x ".join(f"{k}={int(v):,}" for k, v in draws_from.items())
    return MemoryPart(size, f"predict {int(num_samples):,} draws ({source}) at {int(points):,} points "
                            f"({bnn.output_dim} outputs)", f"{' or '.join(draws_from)}, or predict fewer points at a time")


def run_prediction_memory(bnn, num_samples: int, test_points: int, train_points: int,
                          draws_from: Optional[dict] = None) -> MemoryPart:
    """A run's prediction and its ArviZ exports (``lab.runs.execution``: the test set's ``posterior.nc`` and the
    training subset's ``train.nc``): ``draws × (test + train points) × 24 × b`` bytes.

    Measured (float32, peak resident memory less a 10-draw run's, ``zoo fit --backend svi --hidden 8
    --epochs 1``): toy1d (1 output, 500 + 40 points) 101 and 115 bytes per draw × point at 10,000 and
    20,000 draws; digits (10 classes, 450 + 1,347 points) 125 at 2,000 draws; 24 × 4 = 96 stays below."""
    points = int(test_points) + int(train_points)
    part = prediction_memory(bnn, num_samples, points, draws_from)
    size = int(num_samples) * points * _EXPORT_VALUES * bnn.target_scale.element_size()
    what = part.what.replace(f"at {points:,} points", f"and export at {int(test_points):,} + {int(train_points):,} points")
    return part._replace(size=size, what=what, lower=part.lower.split(", or predict")[0])


def _refuse(parts: list, what: str, device: Optional[torch.device]) -> None:
    total = sum(p.size for p in parts)
    biggest = sorted((p for p in parts if p.size > 0), key=lambda p: -p.size)[:2]
    detail = "; ".join(f"{p.what}: {format_bytes(p.size)}" for p in biggest)
    lower = " or ".join(dict.fromkeys(p.lower for p in biggest)) or "the model's size"
    check_memory(total, f"{what} ({detail})", f"lower {lower}", device)


def check_fit_memory(bnn, config, rows: Optional[int] = None, backend: str = "the fit") -> None:
    """``ValueError`` before any allocation when fitting needs more memory than is available."""
    _refuse(fit_memory(bnn, config, rows), f"{backend}", bnn.target_scale.device)


def check_prediction_memory(bnn, num_samples: int, points: int, draws_from: Optional[dict] = None,
                            train_points: Optional[int] = None) -> None:
    """``ValueError`` before any allocation when a prediction (with ``train_points``: a run's prediction and
    its exports, :func:`run_prediction_memory`) needs more memory than is available."""
    part = prediction_memory(bnn, num_samples, points, draws_from) if train_points is None else \
        run_prediction_memory(bnn, num_samples, points, train_points, draws_from)
    check_memory(part.size, part.what, f"lower {part.lower}", bnn.target_scale.device)
