"""HMC and NUTS chains from a start point: starts, warm-up wiring, the run's record and its warnings.

* :func:`jittered_starts` — ``C`` chain starts ``[C, D]`` around one point (SG-MCMC uses them too);
* :func:`sample_chains` — checks the log density at the starts, wires Stan's windowed adaptation
  (:func:`~inference.mcmc.adaptation.window_adaptation`: dual-averaging step size from the initial
  ``step_size``, Welford (co)variance metric, the initial step-size heuristic of Hoffman & Gelman 2014,
  Alg. 4, after every slow window) to :func:`~inference.mcmc.driver.run_chains`, and returns the draws,
  the per-draw statistics and a record of the adapted step sizes and masses;
* :func:`sampling_warnings` — Stan's warnings on divergent transitions and saturated NUTS trees;
* :func:`last_layer_dim` — the random values a model would have with ``stochastic="last"`` (for the
  advice of :class:`~inference.mcmc.budget.TimeBudgetExceeded`).
"""
from __future__ import annotations

import warnings
from typing import Callable, Optional

import torch

from inference.evaluation.diagnostics import tree_depth_saturation
from inference.mcmc.adaptation import find_step_size, window_adaptation
from inference.mcmc.budget import Monitor
from inference.mcmc.driver import run_chains, thinned
from inference.mcmc.kernels import HMCState
from inference.mcmc.mass_matrix import Metric
from inference.optim.potential import Potential

__all__ = ["jittered_starts", "sample_chains", "sampling_warnings", "last_layer_dim"]


def jittered_starts(z0: torch.Tensor, num_chains: int, jitter: float, generator: torch.Generator) -> torch.Tensor:
    """``[C, D]``: ``z0`` ``[D]`` plus independent N(0, ``jitter``²) noise per chain (drawn on the CPU from
    ``generator``, then moved to ``z0``'s dtype and device)."""
    return z0 + (jitter * torch.randn(num_chains, z0.shape[-1], generator=generator)).to(z0)


def sample_chains(
    potential: Potential, z0: torch.Tensor, transition: Callable, generator: torch.Generator, progress: bool,
    name: str, *, warmup_steps: int, num_samples: int, thin: int, step_size: float, target_accept: float,
    dense_mass: bool, pool_adaptation: bool, adapt_step_size: bool, adapt_mass: bool,
    monitor: Optional[Monitor] = None, initial_metric: Optional[Metric] = None,
) -> tuple[torch.Tensor, dict, dict]:
    """Warm up and sample all chains; returns ``(z draws [C, S, D], stats {name: [C, S]}, record)``.

    ``transition(state, step_size [C], metric, generator) -> (state, info)`` is a kernel of
    :mod:`inference.mcmc.kernels`; ``z0`` ``[C, D]`` are the chains' starting points.  ``warmup_steps``
    adaptation iterations (``target_accept``, ``dense_mass``, ``pool_adaptation``, ``adapt_step_size``,
    ``adapt_mass`` of :func:`~inference.mcmc.adaptation.window_adaptation`, from ``step_size``) are
    followed by ``num_samples · thin`` iterations of which every ``thin``-th is kept.  ``monitor`` (a
    :func:`~inference.mcmc.budget.time_budget`) may stop the run; ``initial_metric`` is the warm-up's first
    metric (default the identity).

    Raises:
        ValueError: the log density or its gradient is not finite at a start.
    """
    vg = potential.value_and_grad
    lp, grad = vg(z0)
    if not bool(torch.isfinite(lp).all() and torch.isfinite(grad).all()):
        raise ValueError(
            f"the log density or its gradient is not finite at the start of chains "
            f"{(~torch.isfinite(lp)).nonzero().flatten().tolist()}; try init='map', a smaller init_jitter or check the data"
        )
    state = HMCState(z0, lp, grad)
    adaptation, windows = window_adaptation(
        warmup_steps, target_accept, dense=dense_mass, pooled=pool_adaptation,
        adapt_step_size=adapt_step_size, adapt_mass=adapt_mass,
        find_step_size=lambda s, step_size, metric: find_step_size(vg, s, step_size, metric, generator),
    )  # fmt: skip
    params = adaptation.init(state, torch.full((z0.shape[0],), float(step_size)), initial_metric)

    def step(state, params):
        new, info = transition(state, params.step_size, params.metric, generator)
        return new, {**info, "lp": new.log_density, "step_size": params.step_size}

    run = run_chains(
        step, state, params=params, adaptation=adaptation, num_warmup=warmup_steps,
        num_iterations=warmup_steps + num_samples * thin, num_draws=num_samples,
        draw_index=thinned(warmup_steps, thin), progress=progress,
        desc=f"{name} ({z0.shape[0]} chains, {z0.shape[1]} dims)", monitor=monitor,
    )  # fmt: skip
    stats = dict(run.stats)
    stats["acceptance_rate"] = stats.pop("accept_prob")
    for key in ("tree_depth", "n_steps"):
        if key in stats:
            stats[key] = stats[key].long()
    metric = run.params.metric
    record = {
        "step_size": run.params.step_size.tolist(),
        "inverse_mass_mean": (metric.inv_mass.diagonal(dim1=-2, dim2=-1) if metric.dense else metric.inv_mass).mean(-1).tolist(),
        "warmup_divergences": run.warmup_divergences,
        "adaptation_windows": windows,
        "warmup_seconds": run.warmup_seconds,
        "sampling_seconds": run.sampling_seconds,
    }
    return run.z, stats, record


def sampling_warnings(name: str, stats: dict, target_accept: float, max_tree_depth, stacklevel: int) -> tuple[int, float]:
    """``(divergences, saturated)``: the post-warm-up divergent transitions in ``stats["diverging"]``
    ``[C, S]`` and the fraction of NUTS trees that reached ``max_tree_depth`` (0 without
    ``stats["tree_depth"]``), each with a ``RuntimeWarning`` (at ``stacklevel`` above this function's caller)
    when not zero."""
    divergences = int(stats["diverging"].sum())
    if divergences:
        warnings.warn(
            f"{name}: {divergences} of {stats['diverging'].numel()} post-warm-up transitions diverged; "
            f"the draws may be biased — raise target_accept (now {target_accept}) or reparameterise",
            RuntimeWarning,
            stacklevel=stacklevel + 1,
        )
    saturated = tree_depth_saturation(stats["tree_depth"], max_tree_depth) if "tree_depth" in stats else 0.0
    if saturated:
        warnings.warn(
            f"{name}: {saturated:.0%} of the post-warm-up transitions hit the maximum tree depth "
            f"{max_tree_depth}: their trajectories were cut short, so the chains move slowly "
            f"(expect low ESS and high R-hat); raise max_tree_depth, or simplify / reparameterise a badly "
            f"conditioned posterior (docs/mcmc.md, 'When NUTS does not mix')",
            RuntimeWarning,
            stacklevel=stacklevel + 1,
        )
    return divergences, saturated


def last_layer_dim(bnn, x) -> Optional[int]:
    """The random values of ``bnn`` with ``stochastic="last"``: the output module(s) of
    :func:`zoo.stochastic.last_module_names` (found on the first two rows of ``x`` when it is a tensor)
    plus the likelihood's latents; ``None`` when they cannot be found."""
    from zoo.stochastic import last_module_names

    example = x[:2] if isinstance(x, torch.Tensor) else None
    try:
        names = last_module_names(bnn.net, example)
    except Exception:  # noqa: BLE001 - only advice: a network whose last layer cannot be found gets none
        return None
    modules = dict(bnn.net.named_modules())
    weights = sum(p.numel() for name in names for p in modules[name].parameters())
    latents = sum(int(torch.Size(bnn.site_shapes[name]).numel()) for name in bnn.latent_priors())
    return int(weights + latents)
