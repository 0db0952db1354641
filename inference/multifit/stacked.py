"""The stacked state of the multi-fit engine: K fits' data, module state and outputs as ``[K, ...]`` tensors.

K fits that share an architecture, a backend and its options, but each with its own data, seed
and minibatch order, train as one program: every parameter of fit k is row k of a stacked tensor and
the network runs once per step for all fits (``torch.func.vmap`` over the stacked weights and the
fits' own minibatches, as the deep-ensemble backend runs its members).  Here: the fits' minibatches
(:class:`StackedBatches`, each fit's order drawn from its own generator exactly as
:func:`inference.optim.batches.minibatches` draws it), the stacked forward pass, the stacked trained
body of a last-layer model, and the fits' log-likelihoods.  The loop that trains the stacked parameters
is :func:`inference.optim.stacked_training.run_stacked_loop`; each family's stacked fit assembles them.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch.func import vmap

__all__ = ["StackedBatches", "stacked_forward", "stacked_body", "write_body", "stacked_log_likelihood"]


class StackedBatches:
    """Minibatches of K fits' data ``x [K, N, ...]``, ``y [K, N, ...]``, each fit its own order.

    Fit k's epoch order is ``torch.randperm(N, generator=generators[k])``, the order that
    :func:`inference.optim.batches.minibatches` draws for a one-at-a-time fit with the same generator
    (full batch, ``batch_size=None`` or ≥ N: no draw, rows in order).
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: Optional[int], generators: list):
        self.x, self.y, self.generators = x, y, generators
        self.num_fits, self.num_data = x.shape[0], x.shape[1]
        self.batch_size = None if batch_size is None or batch_size >= self.num_data else int(batch_size)
        self.steps_per_epoch = math.ceil(self.num_data / (self.batch_size or self.num_data))
        self._offsets = (torch.arange(self.num_fits, device=x.device) * self.num_data).unsqueeze(1)
        self._flat_x, self._flat_y = x.reshape(-1, *x.shape[2:]), y.reshape(-1, *y.shape[2:])

    def orders(self) -> torch.Tensor:
        """``[K, N]`` row orders of one epoch (advances each fit's generator as one fit's epoch does)."""
        if self.batch_size is None:
            return torch.arange(self.num_data, device=self.x.device).expand(self.num_fits, -1)
        return torch.stack([torch.randperm(self.num_data, generator=g) for g in self.generators]).to(self.x.device)

    def epoch(self):
        """``(x_batch [K, n, ...], y_batch [K, n, ...])`` of one epoch."""
        if self.batch_size is None:
            yield self.x, self.y
            return
        order = self.orders() + self._offsets  # rows of the flattened [K·N, ...] data
        for start in range(0, self.num_data, self.batch_size):
            index = order[:, start:start + self.batch_size]
            rows = index.reshape(-1)
            yield (self._flat_x.index_select(0, rows).reshape(*index.shape, *self.x.shape[2:]),
                   self._flat_y.index_select(0, rows).reshape(*index.shape, *self.y.shape[2:]))


def stacked_forward(bnn, body: bool = False) -> Callable:
    """``forward(values {site: [K, *shape]}, x [K, n, ...]) -> [K, n, O]``: fit k's network at its own
    weights and inputs — ``vmap`` of :meth:`~zoo.bnn.BayesianNetwork.forward_single` over both, as the
    deep-ensemble backend runs its members (``_Members.outputs``).  With ``body``, the signature is
    ``forward(values, body {name: [K, *shape]}, x)``: fit k's trained deterministic parameters too
    (:func:`stacked_body`).  Networks without ``vmap`` rules are not stacked
    (:func:`inference.fitting.batch_blocker`)."""
    if body:
        return vmap(lambda values, params, x: bnn.forward_single(values, x, parameters=params),
                    in_dims=(0, 0, 0), randomness="different")
    return vmap(bnn.forward_single, in_dims=(0, 0), randomness="different")


def stacked_body(bnns: list) -> dict:
    """``{name: [K, *shape]}`` leaf tensors (with gradients) of the K networks' trained deterministic parameters
    (the body of a last-layer model, :meth:`~zoo.bnn.BayesianNetwork.deterministic_parameters`); ``{}`` without."""
    trained = [[(n, p) for n, p in bnn.net.named_parameters() if p.requires_grad] for bnn in bnns]
    return {name: torch.stack([dict(own)[name].detach() for own in trained]).clone().requires_grad_(True)
            for name, _ in trained[0]}


def write_body(bnn, body: dict, k: int) -> None:
    """Write row ``k`` of the stacked ``body`` (:func:`stacked_body`, or ``{name: [*shape]}`` with ``k=None``)
    into ``bnn``'s network, as a one-at-a-time fit leaves its trained deterministic parameters there."""
    params = dict(bnn.net.named_parameters())
    with torch.no_grad():
        for name, value in body.items():
            params[name].copy_(value if k is None else value[k])


def stacked_log_likelihood(likelihood, f: torch.Tensor, y: torch.Tensor, latents: dict) -> torch.Tensor:
    """``[K]`` Σ_n of fit k's training objective (:meth:`~zoo.likelihoods.Likelihood.training_log_prob`) at its
    outputs ``f[k]`` ``[n, P]``, targets ``y[k]`` and latents ``{name: [K, T]}``: ``vmap`` over the fits, so
    every likelihood sees one fit's tensors, as in a one-at-a-time fit."""
    def one(f_k, y_k, latents_k):
        one_draw = {n: v.unsqueeze(0) for n, v in latents_k.items()}
        return likelihood.training_log_prob(f_k.unsqueeze(0), y_k, one_draw).sum()

    return vmap(one)(f, y, latents)
