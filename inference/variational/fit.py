"""The whole variational fit around the one training loop: :func:`fit_guide`.

Seed, optional deterministic pretraining (:func:`inference.optim.training.pretrain`; the guide's
means start at the pretrained weights, as Molchanov, Ashukha & Vetrov 2017 start from a
pretrained network), the guide (:func:`inference.variational.guides.build_guide`), the loop
(:func:`inference.optim.training.run_training_loop`: minibatches, KL annealing, Adam with the
learning-rate schedule, particle averaging, non-finite checks), optional per-epoch sparsity by the
guide's pruning rule, and the :class:`~inference.variational.posterior.VariationalPosterior`.  A backend
supplies the guide and ``particle``, one draw of the ELBO's two terms; :func:`trace_particle` is
that draw through Pyro traces for any guide.
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable, Optional

import pyro
import torch

from inference.optim.batches import as_batches
from inference.optim.early_stopping import choose_epochs, trains_body
from inference.optim.map import run_info
from inference.optim.potential import frozen_deterministic
from inference.optim.start import START_EARLY_STOPPING
from inference.optim.training import HISTORY_KEYS, LoopOptions, pretrain, run_training_loop
from inference.variational.posterior import VariationalPosterior
from inference.variational.elbo import elbo_terms
from inference.variational.guides import build_guide
from inference.variational.pruning import guide_sparsity

__all__ = ["MONITOR_DRAWS", "trace_particle", "fit_guide"]

#: draws of q per epoch with which a ``stop`` callback scores the held-out predictive (:func:`fit_guide`)
MONITOR_DRAWS = 32


def trace_particle(bnn, guide, x, y, num_data: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One draw of ``(E_q[(N/n) Σ log p(y|x,w)], KL)`` through Pyro traces (:func:`inference.variational.elbo.elbo_terms`)."""
    with pyro.validation_enabled(False):  # the data are checked once by fit(), not per distribution
        terms = elbo_terms(bnn.model, guide, x, y, num_data)
    return terms.expected_log_likelihood, terms.kl


def fit_guide(
    backend: str,
    bnn,
    x: torch.Tensor,
    y: torch.Tensor,
    config: LoopOptions,
    seed: int,
    progress: bool,
    guide_name: str,
    guide_kwargs: dict,
    particle: Callable,
    info: Optional[Callable] = None,
    sparsity: Optional[tuple[Optional[float], bool]] = None,
    fused_adam: bool = False,
    held_out_pretraining: bool = False,
    stop: Optional[Callable] = None,
    desc: Optional[str] = None,
) -> VariationalPosterior:
    """A whole variational fit: seed, pretrain, build the guide, train it, return the posterior.

    Args:
        backend: the backend's name (recorded in ``info``).
        bnn, x, y: the model and validated training data ``[N, ...]``, or ``x`` a
            :class:`~inference.optim.batches.LoaderBatches` (``y`` then ``None``; ``config.batch_size`` is
            not used).
        config: the loop options (:class:`~inference.optim.training.LoopOptions` or a subclass; recorded
            in ``info``).
        seed: seeds Pyro/torch draws and the minibatch order.
        progress: show tqdm bars.
        guide_name, guide_kwargs: the guide, built by :func:`inference.variational.guides.build_guide` (its
            means start at the pretrained weights and latents when ``config.pretrain_epochs``).
        particle: ``particle(guide, x_batch, y_batch, num_data) -> (expected_log_likelihood, kl)``.
        info: ``info(guide) -> dict`` of extra items for ``posterior.info``.
        sparsity: ``(threshold, every_epoch)``: record the guide's rule-based sparsity report in
            ``info["sparsity"]`` and, when ``every_epoch``, per epoch in the history
            (``sparsity``, ``layer_sparsity``) and the progress bar.
        fused_adam: use PyTorch's single-kernel Adam.
        held_out_pretraining: for a model with a learned noise (likelihood latents) fitted on tensors with
            pretraining, choose the pretraining epochs on held-out rows
            (:func:`~inference.optim.early_stopping.choose_epochs`: a fifth of the rows held out, the epoch
            of the best held-out log-likelihood, at most ``config.epochs``, the whole fit's, since the body and the
            noise train only there; ``info["early_stopping"]``), pretrain on every row for that many, and keep
            what the pretraining fitted outside the weight factors at those values while the guide trains
            (``info["body"]``): the deterministic body, if any (as the samplers keep their MAP start's body: a long
            variational budget on a few hundred rows otherwise fits the body to the training residuals, and the
            noise with it), and the likelihood's latents as point masses (the guide's ``fixed_latents``): learned
            by the ELBO, the noise variance grows by the function variance under q, σ² ≈ E_q[(y − f_w(x))²] =
            residual² + Var_q f, and the predictive adds Var_q f again — on UCI energy over every weight, Kingma
            et al.'s α at its cap of 1 made that a noise sd of 0.61 against a test RMSE of 0.41 (coverage 0.987).
        stop: ``stop(epoch, draws) -> bool`` after each epoch, ``draws()`` (called only where the epoch is scored)
            :data:`MONITOR_DRAWS` draws ``{site: [S, ...]}`` of the current q under one fixed seed (common random
            numbers: the held-out curve moves with q, not with the Monte Carlo); ``True`` ends the training there
            (the held-out choice of the ELBO's length, :mod:`inference.variational.length`).
        desc: the progress bar's label (default: the backend and its number of random weights).
    Returns:
        the :class:`~inference.variational.posterior.VariationalPosterior`; ``info["history"]`` holds the
        per-epoch history.
    Raises:
        ~inference.optim.training.NonFiniteLossError: a NaN/inf loss or gradient (with the step and the last finite posterior).
    """
    pyro.set_rng_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    started = time.perf_counter()
    init_values = None
    data = as_batches(x, y, config.batch_size)
    body = {}  # the held-out choice of the pretraining epochs and what it fixed (body, noise), when made
    if config.pretrain_epochs:
        lr, epochs = config.pretrain_lr or config.lr, config.pretrain_epochs
        latents = list(bnn.latent_priors())
        if held_out_pretraining and latents and isinstance(x, torch.Tensor):
            epochs = max(epochs, config.epochs)  # body and noise train only here: up to the whole fit's epochs
            epochs, body["early_stopping"] = choose_epochs(
                lambda x_kept, y_kept, stop: pretrain(bnn, x_kept, y_kept, epochs, lr, config.batch_size,
                                                      torch.Generator().manual_seed(seed), False, stop=stop),
                bnn, x, y, epochs, START_EARLY_STOPPING, seed, selection="best")
            fixed = (["the body"] if trains_body(bnn) else []) + [f"{', '.join(latents)} (a point mass)"]
            body["body"] = f"pretrained for {epochs} epochs (chosen on held-out rows), then fixed: {' and '.join(fixed)}"
            guide_kwargs = {**guide_kwargs, "fixed_latents": tuple(latents)}
        init_values = pretrain(bnn, data, None, epochs, lr, None, generator, progress)
        bnn.update_reference({s.name: init_values[s.name] for s in bnn.sites})
    guide = build_guide(guide_name, bnn, init_values=init_values, **guide_kwargs)
    params = list(guide.parameters()) + ([] if body else bnn.deterministic_parameters())
    history = {key: [] for key in HISTORY_KEYS + (("sparsity", "layer_sparsity") if sparsity else ())}
    record = run_info(backend, config, seed, data, started, num_samples=config.num_samples, history=history, **body)
    if info is not None:
        record.update(info(guide))

    def result():
        record["fit_seconds"] = time.perf_counter() - started
        if sparsity:
            record["sparsity"] = guide_sparsity(guide, bnn, sparsity[0])
        return VariationalPosterior(bnn, guide, guide_name, guide_kwargs, record)

    def on_epoch(epoch):
        report = guide_sparsity(guide, bnn, sparsity[0])
        history["sparsity"].append(report["sparsity"])
        history["layer_sparsity"].append(report["layers"])
        return {"sparsity": f"{report['sparsity']:.3f}", "layers": "/".join(f"{v:.2f}" for v in report["layers"].values())}

    def draws(epoch):  # q's draws under one seed, every epoch the same (VariationalPosterior's own sampler)
        return stop(epoch, lambda: VariationalPosterior(bnn, guide, guide_name, guide_kwargs).sample_params(
            MONITOR_DRAWS, seed))

    if not params:  # nothing to optimise (frozen network, no latents)
        return result()
    with frozen_deterministic(bnn) if body else contextlib.nullcontext():
        run_training_loop(
            lambda xb, yb: particle(guide, xb, yb, data.num_data), params, data, config, generator, history,
            result, desc=desc or f"{backend} ({bnn.num_random} random)", progress=progress,
            on_epoch=on_epoch if sparsity and sparsity[1] else None, fused_adam=fused_adam,
            stop=None if stop is None else draws,
        )
    return result()
