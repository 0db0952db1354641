"""The one training loop of the loop-trained backends (the variational family ``svi``, ``svi-lrt``,
``graves``, ``sparse-vd``, ``kingma-vd``, ``radial``; MAP and its kin) and its options.

The minibatches come from in-memory tensors (reshuffled every epoch) or from a ``DataLoader``
(its own batches and order; :mod:`inference.optim.batches`).  Per minibatch of size n out of N the
loop minimises the KL-weighted negative ELBO

    L_t = −(N/n) Σ_batch E_q[log p(y|x,w)] + β_t KL(q ‖ p)

(Blundell et al. 2015, eq. 8 with the minibatch weighting of Graves 2011), averaged over
``num_particles`` Monte Carlo draws.  β_t is KL annealing (Bowman et al. 2016): β = 0 for
``kl_warmup_epochs`` epochs, then a linear ramp to 1 over ``kl_anneal_epochs`` epochs.  Optional
deterministic pretraining fits the network first (random entries as point estimates, fixed
entries held fixed, then the likelihood's latents at their MAP) and the guide's means start
there, as Molchanov, Ashukha & Vetrov (2017) start from a pretrained network.  Adam with a
constant, cosine or step learning-rate schedule and optional gradient-norm clipping; a NaN/inf
loss or gradient stops the run with :class:`NonFiniteLossError`, which names the step and
carries the posterior of the last finite parameters.  Progress is a ``zoo.progress.tqdm`` bar
(``progress=False`` silences it).

The whole variational fit around the loop (seed, pretraining, guide, posterior) is
:func:`inference.variational.fit.fit_guide`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from zoo.progress import tqdm

from inference.optim.batches import as_batches
from inference.optim.checks import check_choice, check_positive
from inference.optim.latent_fit import fit_latents, network_outputs
from inference.optim.lean_adam import LeanAdam, gradient_norm

__all__ = ["NonFiniteLossError", "OptimiserOptions", "LoopOptions", "LR_SCHEDULES", "OPTIMIZERS", "HISTORY_KEYS",
           "OBJECTIVES", "kl_weight", "lr_scheduler", "pretrain", "average_particles", "optimiser_step",
           "run_training_loop"]

LR_SCHEDULES = ("constant", "cosine", "step")
OPTIMIZERS = ("adam", "clipped-adam")
#: per-epoch history of every variational fit (plus ``sparsity`` / ``layer_sparsity`` when tracked)
HISTORY_KEYS = ("epoch", "loss", "expected_log_likelihood", "kl", "kl_weight", "lr")
#: what the training loop's progress bar shows (:func:`run_training_loop`'s ``objective``)
OBJECTIVES = ("elbo", "log_joint")


class NonFiniteLossError(RuntimeError):
    """Raised when a loss or gradient becomes NaN/inf.

    Attributes:
        step: the optimisation step (0-based) at which it happened.
        posterior: the result built from the last finite parameters (no update with a
            non-finite loss or gradient is ever applied), so the run is not lost.
    """

    def __init__(self, step: int, what: str, posterior=None, finite: bool = True):
        kept = ("kept the last finite parameters (available as .posterior)" if finite
                else "its parameters are non-finite (.posterior holds them for inspection only)")
        super().__init__(
            f"{what} became non-finite at step {step}; the run stopped and {kept}. Try a smaller learning "
            f"rate, gradient clipping (optimizer='clipped-adam'), or check the data scaling."
        )
        self.step, self.what = step, what
        self.posterior = posterior

    def __reduce__(self):
        """Pickle as ``(step, what)``: the error crosses process boundaries (an experiment's worker
        sends it to its parent) with its message and step, without the in-process ``posterior``."""
        return type(self), (self.step, self.what)


@dataclass
class OptimiserOptions:
    """Optimiser options shared by every loop-trained backend (the variational family, MAP and its kin).

    Attributes:
        epochs: passes over the training data.
        batch_size: minibatch size (``None``: full batch); the likelihood is scaled by N/n.
        lr: initial learning rate.
        lr_schedule: ``constant``, ``cosine`` (decay to ``lr · lr_final_factor``) or ``step``
            (multiply by ``lr_final_factor`` after ``lr_step_fraction`` of the epochs).
        optimizer: ``adam`` or ``clipped-adam`` (gradient norm clipped at ``clip_norm``).
    """

    epochs: int = 200
    batch_size: Optional[int] = 64
    lr: float = 1e-2
    lr_schedule: str = "cosine"
    lr_final_factor: float = 0.1
    lr_step_fraction: float = 0.25
    optimizer: str = "adam"
    clip_norm: float = 10.0

    def validate(self):
        """Clear ``ValueError``s for invalid optimiser options."""
        if int(self.epochs) < 1:
            raise ValueError(f"epochs must be at least 1, got {self.epochs}")
        for name in ("lr", "clip_norm", "lr_final_factor"):
            check_positive(name, getattr(self, name))
        if self.batch_size is not None and int(self.batch_size) < 1:
            raise ValueError(f"batch_size must be at least 1 (or None for full batch), got {self.batch_size}")
        check_choice("lr_schedule", self.lr_schedule, LR_SCHEDULES)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)


@dataclass
class LoopOptions(OptimiserOptions):
    """Training-loop options of the variational backends: the optimiser's and these.

    Attributes:
        init_scale: initial posterior sd of every random weight.
        kl_warmup_epochs / kl_anneal_epochs: KL annealing (β = 0, then a linear ramp).
        pretrain_epochs / pretrain_lr: deterministic pretraining before VI (``pretrain_lr``
            defaults to ``lr``).
        num_particles: Monte Carlo samples of the ELBO per step.
        num_samples: default number of posterior draws for predictions.
    """

    init_scale: float = 1e-3
    kl_warmup_epochs: int = 0
    kl_anneal_epochs: int = 0
    pretrain_epochs: int = 0
    pretrain_lr: Optional[float] = None
    num_particles: int = 1
    num_samples: int = 200

    def validate(self):
        """Clear ``ValueError``s for invalid loop options."""
        super().validate()
        for name in ("num_particles", "num_samples"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("kl_warmup_epochs", "kl_anneal_epochs", "pretrain_epochs"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"{name} must be non-negative, got {getattr(self, name)}")
        if not (math.isfinite(self.init_scale) and self.init_scale > 0):
            raise ValueError(f"init_scale must be positive, got {self.init_scale}")


def kl_weight(epoch: float, warmup_epochs: int, anneal_epochs: int) -> float:
    """β at (fractional) ``epoch``: 0 during warm-up, then linear to 1 (Bowman et al. 2016)."""
    if epoch < warmup_epochs:
        return 0.0
    if anneal_epochs <= 0:
        return 1.0
    return min(1.0, (epoch - warmup_epochs) / anneal_epochs)


def lr_scheduler(optimizer, config: LoopOptions, total_steps: int):
    """The learning-rate schedule of ``config`` over ``total_steps`` optimiser steps."""
    if config.lr_schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(
            optimizer, T_max=max(total_steps, 1), eta_min=config.lr * config.lr_final_factor
        )
    if config.lr_schedule == "step":
        milestone = max(1, int(total_steps * config.lr_step_fraction))
        return torch.optim.lr_scheduler.MultiStepLR(optimizer, [milestone], gamma=config.lr_final_factor)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def pretrain(bnn, x, y, epochs: int, lr: float, batch_size, generator, progress: bool,
             stop: Optional[Callable] = None) -> dict:
    """Deterministic pretraining: maximise the likelihood with every random weight as a point estimate.

    ``x, y`` are training tensors (minibatches of ``batch_size``), or ``x`` is a batch source of
    :mod:`inference.optim.batches` (then ``y`` and ``batch_size`` are not used).  Fixed (masked-out)
    entries stay at their fixed values.  The likelihood's latents (noise precision, a Student-t's
    scale and ν) are held at their prior means while the weights train, then set to their MAP given
    the pretrained network (:func:`inference.optim.latent_fit.fit_latents`, on the last epoch's batches, so a
    data loader is not iterated once more and keeps the tensor path's batch sequence): a robust likelihood's redescending loss is started from a near-least-squares
    fit, not fitted from scratch (the starting point of an MM-estimator, Yohai 1987).
    ``stop(epoch, values) -> bool`` after each epoch (``values``: the weights and the latents' prior means,
    detached) ends the training there (:class:`~inference.optim.early_stopping.ValidationMonitor`).
    Returns the pretrained values of every latent site ``{site: tensor}``, weights and latents.
    """
    values = {n: v.clone().requires_grad_(True) for n, v in bnn.initial_values().items()}
    latents = {n: d.mean for n, d in bnn.latent_priors().items()}
    params, data = list(values.values()) + bnn.deterministic_parameters(), as_batches(x, y, batch_size)
    optimizer = torch.optim.Adam(params, lr=lr) if params else None
    last_epoch = []  # the final epoch's batches: the latent fit's data, without another pass over the source
    for epoch in tqdm(range(epochs if params else 0), desc="pretrain", disable=not progress, leave=False):
        last_epoch.clear()
        for xb, yb in data.epoch(generator):
            last_epoch.append((xb, yb))
            f = bnn.forward_single(values, xb)
            loss = -bnn.likelihood.training_log_prob(f.unsqueeze(0), yb, {n: v[None] for n, v in latents.items()})
            optimizer.zero_grad()
            loss.mean().backward()
            optimizer.step()
        if stop is not None and stop(epoch, {**{n: v.detach() for n, v in values.items()}, **latents}):
            break
    if latents:
        batches = last_epoch or data.epoch(torch.Generator())
        latents = fit_latents(bnn.likelihood, *network_outputs(bnn, values, batches), latents)
    return {**{n: v.detach() for n, v in values.items()}, **latents}


def average_particles(particle: Callable, num_particles: int, beta: float):
    """``(loss, expected_log_likelihood, kl)`` averaged over ``num_particles`` calls of ``particle()``.

    ``particle() -> (expected_log_likelihood, kl)``; ``loss = β · KL − E log-lik`` keeps its
    gradient, the other two are detached (for the history).
    """
    if num_particles == 1:  # the same numbers without the running sums (x / 1, 1 · x and 0 + x are exact)
        ell, divergence = particle()
        return (divergence if beta == 1.0 else beta * divergence) - ell, ell.detach(), divergence.detach()
    loss, loglik, kl = 0.0, 0.0, 0.0
    for _ in range(num_particles):
        ell, divergence = particle()
        loss = loss + (beta * divergence - ell) / num_particles
        loglik = loglik + ell.detach() / num_particles
        kl = kl + divergence.detach() / num_particles
    return loss, loglik, kl


def optimiser_step(particle: Callable, num_particles: int, beta: float, optimizer, scheduler, params: list,
                   clip: float, step: int, result: Callable):
    """One step of :func:`run_training_loop`: the particle-averaged loss, its finiteness, backward, the
    gradient norm (clipped at ``clip`` when finite), the optimiser and the schedule.

    With ``clip = inf`` the norm is only computed (:func:`inference.optim.lean_adam.gradient_norm`, the value
    ``clip_grad_norm_`` returns), not applied: no pass multiplying every gradient by 1.  ``optimizer``
    is a ``torch.optim`` optimiser or a :class:`~inference.optim.lean_adam.LeanAdam`.

    Returns:
        ``(loss, expected_log_likelihood, kl)``, detached.
    Raises:
        NonFiniteLossError: a non-finite loss, gradient norm or (a distribution refuses them) parameters.
    """
    try:
        loss, loglik, kl = average_particles(particle, num_particles, beta)
    except ValueError as err:  # torch.distributions validates its parameters: the last update made them non-finite
        if "found invalid values" not in str(err):
            raise
        what = "the model's parameters (the update of that step)" if step else "the model's starting parameters"
        raise NonFiniteLossError(max(step - 1, 0), what, result(), finite=False) from None
    if not torch.isfinite(loss):
        raise NonFiniteLossError(step, "the loss", result())
    optimizer.zero_grad()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(params, clip) if math.isfinite(clip) else gradient_norm(params)
    if not torch.isfinite(norm):
        raise NonFiniteLossError(step, "the gradient", result())
    optimizer.step()
    scheduler.step()
    return loss.detach(), loglik, kl


def run_training_loop(
    particle: Callable,
    params: list,
    data,
    config: LoopOptions,
    generator: torch.Generator,
    history: dict,
    result: Callable,
    desc: str,
    progress: bool,
    on_epoch: Optional[Callable] = None,
    fused_adam: bool = False,
    objective: str = "elbo",
    stop: Optional[Callable] = None,
    on_step: Optional[Callable[[], None]] = None,
) -> None:
    """Minibatches, particle averaging, KL annealing, Adam with the schedule, non-finite checks.

    Args:
        particle: ``particle(x_batch, y_batch) -> (expected_log_likelihood, kl)``, one draw on a
            minibatch (scalars with gradients; the likelihood already scaled by N/n).
        params: tensors to optimise.
        data: the minibatches, a :class:`~inference.optim.batches.TensorBatches` or
            :class:`~inference.optim.batches.LoaderBatches`.
        config, generator: loop options and the generator of the tensor minibatches' shuffles.
        history: dict of lists; per epoch it gains ``epoch``, ``loss``,
            ``expected_log_likelihood``, ``kl``, ``kl_weight`` and ``lr`` (epoch means).
        result: ``result() -> Posterior`` from the current parameters, attached to a
            :class:`NonFiniteLossError` (no non-finite update is ever applied).
        desc, progress: tqdm label and switch.
        on_epoch: ``on_epoch(epoch) -> dict`` after each epoch; its items join the progress
            bar's postfix (e.g. per-layer sparsity).
        fused_adam: use PyTorch's single-kernel Adam (faster for a few large tensors).  Either Adam
            is stepped by :class:`~inference.optim.lean_adam.LeanAdam` (the same update, less overhead).
        objective: what ``particle``'s two terms make, for the bar's label (:data:`OBJECTIVES`): ``"elbo"``
            (expected log-likelihood and KL: the ELBO, at β = 1) or ``"log_joint"`` (log-likelihood and minus
            the log prior of a point estimate: its log joint density, the MAP objective).  The bar shows the
            epoch's mean of it, and the KL weight β only while an annealing schedule changes it.
        stop: ``stop(epoch) -> bool`` after each epoch (and ``on_epoch``); ``True`` ends the loop there (early
            stopping on held-out rows, :mod:`inference.optim.early_stopping`).  The schedule is not changed.  Such
            a held-out trial's bar clears itself when the loop ends (it stops short of its epochs by design); the
            refit that follows, without ``stop``, keeps its bar.
        on_step: ``on_step()`` after each optimiser step; what it raises ends the loop (a sampler's time budget
            watching its MAP start, :func:`inference.mcmc.budget.start_budget`).
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}")
    annealed = config.kl_warmup_epochs > 0 or config.kl_anneal_epochs > 0
    steps_per_epoch = data.steps_per_epoch
    total_steps = config.epochs * steps_per_epoch
    optimizer = LeanAdam(torch.optim.Adam(params, lr=config.lr, **({"fused": True} if fused_adam else {})))
    scheduler = lr_scheduler(optimizer.optimizer, config, total_steps)
    clip = config.clip_norm if config.optimizer == "clipped-adam" else math.inf
    step = 0
    bar = tqdm(range(config.epochs), desc=desc, disable=not progress, leave=stop is None)
    for epoch in bar:
        sums = [0.0, 0.0, 0.0]
        beta = 1.0
        for xb, yb in data.epoch(generator):
            beta = kl_weight(epoch + (step % steps_per_epoch) / steps_per_epoch, config.kl_warmup_epochs, config.kl_anneal_epochs)
            loss, loglik, kl = optimiser_step(
                lambda: particle(xb, yb), config.num_particles, beta, optimizer, scheduler, params, clip, step, result
            )
            step += 1
            if on_step is not None:
                on_step()
            sums[0] += float(loss)
            sums[1] += float(loglik)
            sums[2] += float(kl)
        history["epoch"].append(epoch)
        history["loss"].append(sums[0] / steps_per_epoch)
        history["expected_log_likelihood"].append(sums[1] / steps_per_epoch)
        history["kl"].append(sums[2] / steps_per_epoch)
        history["kl_weight"].append(beta)
        history["lr"].append(optimizer.param_groups[0]["lr"])
        postfix = {objective: f"{(sums[1] - sums[2]) / steps_per_epoch:.4g}"}
        if annealed:
            postfix["kl_weight"] = f"{beta:.2f}"
        if on_epoch is not None:
            postfix.update(on_epoch(epoch))
        bar.set_postfix(**postfix)
        if stop is not None and stop(epoch):
            break
