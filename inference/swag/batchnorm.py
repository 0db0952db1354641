"""BatchNorm under SWAG (Maddox et al. 2019, §4 and their ``bn_update``).

The burn-in and the SWAG phase normalise by each minibatch's statistics (the layers' running buffers
set aside, :func:`batch_statistics`), and after sampling the running mean and variance are recomputed
with one pass over the training data (minibatches of ``batch_size`` in data order, momentum ``None``:
the average over the batches) for every draw (``batchnorm="draw"``) or once per member at its SWA mean
θ̄ (``batchnorm="mean"``, ``S`` times cheaper; :func:`refreshed_statistics`).  The statistics are stored
as extra draws ``batchnorm:<layer>.running_mean`` / ``.running_var`` ``[M, S, C]``, and the network
:class:`BatchNormDraws` predicts each draw with its own statistics.
"""
from __future__ import annotations

import contextlib
import math
from typing import Optional

import torch
from torch import nn
from torch.func import functional_call, vmap

from zoo.bnn import BayesianNetwork

__all__ = ["BATCHNORM_PREFIX", "batchnorm_layers", "batch_statistics", "batchnorm_statistics", "BatchNormDraws",
           "refreshed_statistics"]

#: draws named ``BATCHNORM_PREFIX + "<layer>.running_mean"`` hold a draw's BatchNorm statistics
BATCHNORM_PREFIX = "batchnorm:"


def batchnorm_layers(net: nn.Module) -> dict:
    """``{name: layer}`` of the BatchNorm layers that keep running statistics."""
    return {name: m for name, m in net.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats}


@contextlib.contextmanager
def batch_statistics(net: nn.Module):
    """Within: every BatchNorm layer normalises by the batch's own statistics, in train and eval mode
    alike (its running buffers are set aside and restored on exit), as SWAG's SGD does."""
    layers = batchnorm_layers(net)
    names = ("running_mean", "running_var", "num_batches_tracked")
    saved = {name: [getattr(m, b) for b in names] for name, m in layers.items()}
    try:
        for m in layers.values():
            m.track_running_stats = False
            for b in names:
                setattr(m, b, None)
        yield
    finally:
        for name, m in layers.items():
            m.track_running_stats = True
            for b, value in zip(names, saved[name]):
                setattr(m, b, value)


@torch.no_grad()
def batchnorm_statistics(bnn, weights: dict, x: torch.Tensor, batch_size: Optional[int]) -> dict:
    """Recomputed BatchNorm statistics ``{BATCHNORM_PREFIX + "<layer>.running_<mean|var>": [S, C]}`` of
    ``S`` weight draws ``{site: [S, *shape]}`` (Maddox et al. 2019's ``bn_update``).

    Per draw: fresh buffers, the BatchNorm layers in train mode with momentum ``None`` (the running
    statistics become the average over batches of the batch mean and unbiased variance), other
    layers in eval mode, one pass over ``x`` ``[N, ...]`` in ``ceil(N / batch_size)`` nearly equal
    batches in data order.
    """
    layers = batchnorm_layers(bnn.net)
    x = bnn.placed_input(x)
    num = next(iter(weights.values())).shape[0]
    batches = torch.tensor_split(x, math.ceil(x.shape[0] / (batch_size or x.shape[0])))
    modes = {m: m.training for m in bnn.net.modules()}
    momenta = {m: m.momentum for m in layers.values()}
    out = {f"{BATCHNORM_PREFIX}{name}.{b}": [] for name in layers for b in ("running_mean", "running_var")}
    try:
        bnn.net.eval()
        for m in layers.values():
            m.train()
            m.momentum = None
        for s in range(num):
            buffers = {}
            for name, m in layers.items():
                buffers.update({f"{name}.running_mean": torch.zeros_like(m.running_mean),
                                f"{name}.running_var": torch.ones_like(m.running_var),
                                f"{name}.num_batches_tracked": torch.zeros_like(m.num_batches_tracked)})
            params = {n: bnn.site(n).to_param(v[s]) for n, v in weights.items()}
            for batch in batches:  # the layers update ``buffers`` in place
                functional_call(bnn.net, {**params, **buffers}, (batch,), strict=False)
            for name in layers:
                for b in ("running_mean", "running_var"):
                    out[f"{BATCHNORM_PREFIX}{name}.{b}"].append(buffers[f"{name}.{b}"])
    finally:
        for m, mode in modes.items():
            m.training = mode
        for m, momentum in momenta.items():
            m.momentum = momentum
    return {k: torch.stack(v) for k, v in out.items()}


class BatchNormDraws(BayesianNetwork):
    """``bnn`` predicting each draw with its own BatchNorm statistics, read from the draws
    ``BATCHNORM_PREFIX + "<layer>.running_<mean|var>"`` ``[S, C]`` (:func:`batchnorm_statistics`)."""

    def __init__(self, bnn: BayesianNetwork):
        super().__init__(bnn.net, prior=bnn.prior, likelihood=bnn.likelihood,
                         train_deterministic=bnn.train_deterministic, output_dim=bnn.output_dim,
                         target_loc=bnn.target_loc.clone(),
                         target_scale=bnn.target_scale.clone(), sites=bnn.sites)
        self.active_at_prediction = tuple(getattr(bnn, "active_at_prediction", ()))

    def forward_draws(self, values, x):
        stats = {k[len(BATCHNORM_PREFIX):]: v for k, v in values.items() if k.startswith(BATCHNORM_PREFIX)}
        if not stats:
            return super().forward_draws(values, x)
        weights = {s.name: values[s.name] for s in self.sites}  # not the likelihood latents
        x = self.placed_input(x)
        if self.batched_draws is None:
            self.check_forward(x)

        def single(w, buffers):
            return functional_call(self.net, {**{n: self.site(n).to_param(v) for n, v in w.items()}, **buffers},
                                   (x,), strict=False)

        with self.prediction_mode():
            if self.batched_draws:
                return vmap(single, randomness="different")(weights, stats)
            num = next(iter(stats.values())).shape[0]
            return torch.stack([single({k: v[i] for k, v in weights.items()}, {k: v[i] for k, v in stats.items()})
                                for i in range(num)])


def refreshed_statistics(bnn, draws: dict, centre: torch.Tensor, potential, x, refresh: str,
                         batch_size: Optional[int]) -> dict:
    """BatchNorm statistics ``{name: [M, S, C]}`` of the draws ``{site: [M, S, ...]}`` (``refresh``: ``"draw"``,
    per draw, or ``"mean"``, per member at its ``centre`` θ̄ ``[M, D]``, repeated over its draws; the
    passes over ``x`` in minibatches of ``batch_size``, :func:`batchnorm_statistics`)."""
    num_members, num_samples = next(iter(draws.values())).shape[:2]
    if refresh == "mean":
        at_centre = potential.draws(centre.unsqueeze(1))
        weights = {s.name: at_centre[s.name][:, 0] for s in bnn.sites}
        stats = batchnorm_statistics(bnn, weights, x, batch_size)
        return {k: v.unsqueeze(1).expand(num_members, num_samples, *v.shape[1:]).clone() for k, v in stats.items()}
    weights = {s.name: draws[s.name].reshape(num_members * num_samples, *s.shape) for s in bnn.sites}
    stats = batchnorm_statistics(bnn, weights, x, batch_size)
    return {k: v.reshape(num_members, num_samples, *v.shape[1:]) for k, v in stats.items()}
