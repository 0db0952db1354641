"""Stochastic variational inference with a mean-field guide (default: Pyro ``AutoNormal``).

Objective per minibatch (see :mod:`inference.elbo`):

    L_t = −(N/n) Σ_batch E_q[log p(y|x,w)] + β_t KL(q ‖ p)

with the KL annealing schedule of seed 002 §4.2 (eq. 4.2): β_t = 0 for
``kl_warmup_epochs`` epochs, then a linear ramp to 1 over ``kl_anneal_epochs`` epochs.
Optional deterministic pretraining fits the network first (random entries as point
estimates, fixed entries held fixed) and starts the guide's means there.  Deterministic
parameters are trained jointly unless the model froze them.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import pyro
import torch
from tqdm.auto import tqdm

from ..elbo import elbo_terms
from ..guides import GUIDES, build_guide
from ..posterior import VariationalPosterior
from .base import Backend, NonFiniteLossError, minibatches

__all__ = ["LoopOptions", "SVIConfig", "SVIBackend", "FitStart", "start_fit", "kl_weight", "pretrain", "run_training_loop"]

LR_SCHEDULES = ("constant", "cosine", "step")
OPTIMIZERS = ("adam", "clipped-adam")


@dataclass
class LoopOptions:
    """Training-loop options shared by the SVI-style backends (``svi`` and the variational families).

    Attributes:
        epochs: passes over the training data.
        batch_size: minibatch size (``None``: full batch); the likelihood is scaled by N/n.
        lr: initial learning rate.
        lr_schedule: ``constant``, ``cosine`` (decay to ``lr · lr_final_factor``) or ``step``
            (multiply by ``lr_final_factor`` after ``lr_step_fraction`` of the epochs).
        optimizer: ``adam`` or ``clipped-adam`` (gradient norm clipped at ``clip_norm``).
        init_scale: initial posterior sd of every random weight.
        kl_warmup_epochs / kl_anneal_epochs: KL annealing (β = 0, then a linear ramp).
        pretrain_epochs / pretrain_lr: deterministic pretraining before VI.
        num_particles: Monte Carlo samples of the ELBO per step.
        num_samples: default number of posterior draws for predictions.
    """

    epochs: int = 200
    batch_size: Optional[int] = 64
    lr: float = 1e-2
    lr_schedule: str = "cosine"
    lr_final_factor: float = 0.1
    lr_step_fraction: float = 0.25
    optimizer: str = "adam"
    clip_norm: float = 10.0
    init_scale: float = 1e-3
    kl_warmup_epochs: int = 0
    kl_anneal_epochs: int = 0
    pretrain_epochs: int = 0
    pretrain_lr: Optional[float] = None
    num_particles: int = 1
    num_samples: int = 200

    def validate(self):
        """Clear ``ValueError``s for invalid loop options."""
        for name in ("epochs", "num_particles", "num_samples"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("kl_warmup_epochs", "kl_anneal_epochs", "pretrain_epochs"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"{name} must be non-negative, got {getattr(self, name)}")
        for name in ("lr", "init_scale", "clip_norm", "lr_final_factor"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be positive, got {value}")
        if self.batch_size is not None and int(self.batch_size) < 1:
            raise ValueError(f"batch_size must be at least 1 (or None for full batch), got {self.batch_size}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"unknown lr_schedule {self.lr_schedule!r}; valid: {', '.join(LR_SCHEDULES)}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; valid: {', '.join(OPTIMIZERS)}")


@dataclass
class SVIConfig(LoopOptions):
    """Options of the SVI backend: :class:`LoopOptions` plus the guide.

    Attributes:
        guide: a name in :data:`inference.guides.GUIDES`.
        guide_options: extra keyword arguments for the guide builder.
    """

    guide: str = "normal"
    guide_options: Optional[dict] = None

    def validate(self):
        super().validate()
        if self.guide not in GUIDES:
            raise ValueError(f"unknown guide {self.guide!r}; valid guides: {', '.join(GUIDES)}")


def kl_weight(epoch: float, warmup_epochs: int, anneal_epochs: int) -> float:
    """β at (fractional) ``epoch``: 0 during warm-up, then linear to 1 (seed 002 eq. 4.2)."""
    if epoch < warmup_epochs:
        return 0.0
    if anneal_epochs <= 0:
        return 1.0
    return min(1.0, (epoch - warmup_epochs) / anneal_epochs)


def _scheduler(optimizer, config: LoopOptions, total_steps: int):
    if config.lr_schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(
            optimizer, T_max=max(total_steps, 1), eta_min=config.lr * config.lr_final_factor
        )
    if config.lr_schedule == "step":
        milestone = max(1, int(total_steps * config.lr_step_fraction))
        return torch.optim.lr_scheduler.MultiStepLR(optimizer, [milestone], gamma=config.lr_final_factor)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def pretrain(bnn, x, y, epochs: int, lr: float, batch_size, generator, progress: bool) -> dict:
    """Deterministic pretraining: maximise the likelihood with every random weight as a point estimate.

    Fixed (masked-out) entries stay exactly at their fixed values; likelihood latents are
    held at their prior means.  Returns the pretrained site values ``{site: tensor}``.
    """
    values = {n: v.clone().requires_grad_(True) for n, v in bnn.initial_values().items()}
    latents = {n: d.mean.unsqueeze(0) for n, d in bnn.latent_priors().items()}
    params = list(values.values()) + bnn.deterministic_parameters()
    if not params:
        return {n: v.detach() for n, v in values.items()}
    optimizer = torch.optim.Adam(params, lr=lr)
    for _ in tqdm(range(epochs), desc="pretrain", disable=not progress, leave=False):
        for index in minibatches(x.shape[0], batch_size, generator):
            f = bnn.forward_single(values, x[index])
            loss = -bnn.likelihood.log_prob(f.unsqueeze(0), y[index], latents).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return {n: v.detach() for n, v in values.items()}


def run_training_loop(
    objective: Callable,
    params: list,
    num_data: int,
    config,
    generator: torch.Generator,
    history: dict,
    result: Callable,
    desc: str,
    progress: bool,
    on_epoch: Optional[Callable] = None,
    fused_adam: bool = False,
) -> None:
    """The minibatch training loop shared by the SVI-style backends.

    Args:
        objective: ``objective(index, beta) -> (loss, expected_log_likelihood, kl)`` for the
            minibatch ``index``; ``loss`` carries gradients and already includes ``β · KL``,
            the other two are detached scalars (for the history).
        params: tensors to optimise (Adam, learning-rate schedule and clipping from ``config``).
        num_data, config, generator: data size, loop options (``epochs``, ``batch_size``, ``lr``,
            ``lr_schedule``, ``optimizer``, ``clip_norm``, ``kl_warmup_epochs``,
            ``kl_anneal_epochs``) and the minibatch generator.
        history: dict of lists; per epoch it gains ``epoch``, ``loss``,
            ``expected_log_likelihood``, ``kl``, ``kl_weight`` and ``lr``.
        result: ``result() -> Posterior`` from the current parameters, attached to a
            :class:`NonFiniteLossError` (no non-finite update is ever applied).
        desc, progress: tqdm label and switch.
        on_epoch: ``on_epoch(epoch) -> dict`` after each epoch; its items join the progress
            bar's postfix (e.g. per-layer sparsity).
        fused_adam: use PyTorch's single-kernel Adam (faster for a few large tensors).
    """
    steps_per_epoch = math.ceil(num_data / (config.batch_size or num_data))
    total_steps = config.epochs * steps_per_epoch
    optimizer = torch.optim.Adam(params, lr=config.lr, **({"fused": True} if fused_adam else {}))
    scheduler = _scheduler(optimizer, config, total_steps)
    clip = config.clip_norm if config.optimizer == "clipped-adam" else math.inf
    step = 0
    bar = tqdm(range(config.epochs), desc=desc, disable=not progress)
    for epoch in bar:
        sums = [0.0, 0.0, 0.0]
        beta = 1.0
        for index in minibatches(num_data, config.batch_size, generator):
            beta = kl_weight(epoch + (step % steps_per_epoch) / steps_per_epoch, config.kl_warmup_epochs, config.kl_anneal_epochs)
            loss, loglik, kl = objective(index, beta)
            if not torch.isfinite(loss):
                raise NonFiniteLossError(step, "the loss", result())
            optimizer.zero_grad()
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(params, clip)
            if not torch.isfinite(norm):
                raise NonFiniteLossError(step, "the gradient", result())
            optimizer.step()
            scheduler.step()
            step += 1
            sums[0] += float(loss.detach())
            sums[1] += float(loglik)
            sums[2] += float(kl)
        n_batches = steps_per_epoch
        history["epoch"].append(epoch)
        history["loss"].append(sums[0] / n_batches)
        history["expected_log_likelihood"].append(sums[1] / n_batches)
        history["kl"].append(sums[2] / n_batches)
        history["kl_weight"].append(beta)
        history["lr"].append(optimizer.param_groups[0]["lr"])
        postfix = {"elbo": f"{-(sums[1] - sums[2]) / n_batches:.4g}", "kl_w": f"{beta:.2f}"}
        if on_epoch is not None:
            postfix.update(on_epoch(epoch))
        bar.set_postfix(**postfix)


class SVIBackend(Backend):
    name = "svi"
    Config = SVIConfig

    def run(self, bnn, x, y, config: SVIConfig, seed: int, progress: bool) -> VariationalPosterior:
        guide_kwargs = {"init_scale": config.init_scale, **(config.guide_options or {})}
        start = start_fit(self.name, bnn, x, y, config, seed, progress, config.guide, guide_kwargs,
                          ("epoch", "loss", "expected_log_likelihood", "kl", "kl_weight", "lr"))
        guide, history, info = start.guide, start.history, start.info

        def result():
            info["fit_seconds"] = time.perf_counter() - start.started
            return VariationalPosterior(bnn, guide, config.guide, guide_kwargs, info)

        if not start.params:  # nothing to optimise (frozen network, no latents)
            return result()
        num_data = x.shape[0]

        def objective(index, beta):
            loss, loglik, kl = 0.0, 0.0, 0.0
            for _ in range(config.num_particles):
                with pyro.validation_enabled(False):  # checked once below, not per distribution
                    terms = elbo_terms(bnn.model, guide, x[index], y[index], num_data)
                loss = loss + terms.loss(beta) / config.num_particles
                loglik = loglik + terms.expected_log_likelihood.detach() / config.num_particles
                kl = kl + terms.kl.detach() / config.num_particles
            return loss, loglik, kl

        run_training_loop(
            objective, start.params, num_data, config, start.generator, history, result,
            desc=f"svi ({bnn.num_random} random)", progress=progress,
        )
        return result()


@dataclass
class FitStart:
    """What :func:`start_fit` set up: the run's generator, guide, optimised parameters, history and info."""

    generator: torch.Generator
    guide: object
    params: list
    history: dict
    info: dict
    started: float


def start_fit(backend: str, bnn, x, y, config: LoopOptions, seed: int, progress: bool, guide_name: str,
              guide_kwargs: dict, history_keys) -> FitStart:
    """The common start of a variational fit: seed every draw, pretrain deterministically when
    ``config.pretrain_epochs`` (the guide's means start at the pretrained values), build the guide
    at once (so the posterior can be saved whatever happens next), and the run's history and info."""
    pyro.set_rng_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    started = time.perf_counter()
    init_values = None
    if config.pretrain_epochs:
        init_values = pretrain(
            bnn, x, y, config.pretrain_epochs, config.pretrain_lr or config.lr, config.batch_size, generator, progress
        )
        bnn.update_reference(init_values)
    guide = build_guide(guide_name, bnn, init_values=init_values, **guide_kwargs)
    params = list(guide.parameters()) + bnn.deterministic_parameters()
    history = {key: [] for key in history_keys}
    info = {
        "backend": backend,
        "config": asdict(config),
        "seed": seed,
        "num_samples": config.num_samples,
        "num_data": x.shape[0],
        "history": history,
    }
    return FitStart(generator, guide, params, history, info, started)
