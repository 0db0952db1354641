"""The stacked training loop of the multi-fit engine: K fits' parameters ``[K, ...]``, one optimiser.

K fits that share an architecture, a backend and its options, but each with its own data, seed
and minibatch order, train as one program: every parameter of fit k is row k of a stacked tensor,
the network runs once per step for all fits (``torch.func.vmap`` over the stacked weights and the
fits' own minibatches, as the deep-ensemble backend runs its members), and one Adam steps every
stacked tensor.

Why each fit gets the update it would get alone:

* the loss is the sum Σ_k L_k of the fits' own losses, and L_k depends on row k only, so
  ∂(Σ L)/∂θ_k = ∂L_k/∂θ_k;
* Adam is element-wise and the learning-rate schedule the same for every fit (same options,
  same data size N, hence the same number of steps), so row k's update is fit k's update;
* gradient-norm clipping (``clipped-adam``) and the NaN/inf checks are per fit: a fit whose loss
  or gradient becomes non-finite is stopped at that step (its last finite parameters are kept,
  as :class:`~inference.optim.training.NonFiniteLossError` promises) while the others go on;
* each fit's minibatch order comes from its own generator seeded with its seed, drawn exactly as
  :func:`inference.optim.batches.minibatches` draws it, so the batches are the one-at-a-time fit's.

What differs from K one-at-a-time fits is float rounding only (a batched matrix product sums in
another order than K single ones), which the tests bound.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch.func import vmap
from zoo.progress import tqdm

from inference.optim.training import HISTORY_KEYS, kl_weight, lr_scheduler
from inference.variational.latents import normal_prior_params

__all__ = ["StackedBatches", "stacked_forward", "stacked_body", "write_body", "stacked_log_likelihood",
           "stacked_normal_priors", "run_stacked_loop", "per_fit_norms"]


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


def stacked_normal_priors(bnns: list, name: str, like: torch.Tensor) -> tuple:
    """``(m, s)`` of site ``name``'s Normal prior in every fit: floats when all fits share them, else
    ``[K, *shape]`` tensors."""
    params = [normal_prior_params(bnn.prior_distributions()[name], name) for bnn in bnns]
    if all(not isinstance(m, torch.Tensor) and not isinstance(s, torch.Tensor) for m, s in params) \
            and len(set(params)) == 1:
        return params[0]
    return tuple(torch.stack([torch.as_tensor(p[i], dtype=like.dtype, device=like.device).expand(like.shape[1:])
                              for p in params]) for i in (0, 1))


def per_fit_norms(params: list) -> torch.Tensor:
    """``[K]`` gradient norms of each fit over the stacked ``params`` (each ``[K, ...]``, ``.grad`` set)."""
    total = None
    for p in params:
        if p.grad is None:
            continue
        squares = p.grad.reshape(p.shape[0], -1).pow(2).sum(1)
        total = squares if total is None else total + squares
    return total.sqrt()


def run_stacked_loop(step_terms: Callable, params: list, data: StackedBatches, config, histories: list,
                     desc: str, progress: bool, on_stop: Callable, on_epoch: Optional[Callable] = None) -> list:
    """Train the stacked ``params`` by Adam over the fits' minibatches; the loop of
    :func:`inference.optim.training.run_training_loop` for K fits at once.

    Args:
        step_terms: ``step_terms(x_batch, y_batch) -> (expected_log_likelihood [K], kl [K])``, one draw per
            fit on its own minibatch (the likelihood scaled by N/n), with gradients.
        params: stacked leaf tensors ``[K, ...]`` to optimise.
        data: the fits' :class:`StackedBatches`.
        config: :class:`~inference.optim.training.LoopOptions` (one particle per step: ``num_particles`` > 1
            is averaged as in the one-at-a-time loop).
        histories: K dicts of lists (:data:`inference.optim.training.HISTORY_KEYS`), filled per epoch.
        desc, progress: tqdm label and switch.
        on_stop: ``on_stop(k, step, what)`` when fit k's loss or gradient becomes non-finite, before any
            update with it: the caller keeps fit k's current (last finite) parameters.
        on_epoch: ``on_epoch(epoch, alive)`` after each epoch's history rows (``alive``: the fits not stopped).
    Returns:
        ``[step or None]`` per fit: the step at which it stopped (``None``: it finished).
    """
    count, steps_per_epoch = data.num_fits, data.steps_per_epoch
    optimizer = torch.optim.Adam(params, lr=config.lr, foreach=True)
    scheduler = lr_scheduler(optimizer, config, config.epochs * steps_per_epoch)
    clip = config.clip_norm if config.optimizer == "clipped-adam" else math.inf
    alive = torch.ones(count, dtype=torch.bool, device=params[0].device)
    stopped: list = [None] * count
    step = 0
    for epoch in tqdm(range(config.epochs), desc=desc, disable=not progress):
        sums, beta = torch.zeros(3, count, dtype=torch.float64, device=alive.device), 1.0
        for xb, yb in data.epoch():
            beta = kl_weight(epoch + (step % steps_per_epoch) / steps_per_epoch, config.kl_warmup_epochs,
                             config.kl_anneal_epochs)
            ell, kl = 0.0, 0.0
            for _ in range(config.num_particles):
                draw_ell, draw_kl = step_terms(xb, yb)
                ell, kl = ell + draw_ell / config.num_particles, kl + draw_kl / config.num_particles
            loss = (kl if beta == 1.0 else beta * kl) - ell
            finite = torch.isfinite(loss)
            optimizer.zero_grad()
            torch.where(alive & finite, loss, torch.zeros_like(loss)).sum().backward()
            norms = per_fit_norms(params)
            finite = finite & torch.isfinite(norms)
            if not bool((finite | ~alive).all()):
                for k in (alive & ~finite).nonzero().flatten().tolist():
                    what = "the loss" if not bool(torch.isfinite(loss[k])) else "the gradient"
                    on_stop(k, step, what)
                    stopped[k] = step
                alive = alive & finite
            if math.isfinite(clip):
                scale = (clip / (norms + 1e-6)).clamp(max=1.0)
                for p in params:
                    if p.grad is not None:
                        p.grad.mul_(scale.reshape(-1, *([1] * (p.dim() - 1))).to(p.grad.dtype))
            optimizer.step()
            scheduler.step()
            step += 1
            sums += torch.stack([loss.detach(), ell.detach(), kl.detach()]).to(sums.dtype)
        means = (sums / steps_per_epoch).tolist()
        lr = optimizer.param_groups[0]["lr"]
        for k, history in enumerate(histories):
            if stopped[k] is None:
                for key, value in zip(HISTORY_KEYS, (epoch, means[0][k], means[1][k], means[2][k], beta, lr)):
                    history[key].append(value)
        if on_epoch is not None:
            on_epoch(epoch, [k for k in range(count) if stopped[k] is None])
    return stopped
