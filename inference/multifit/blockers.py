"""Which fits can join a stacked batch: :func:`batch_blocker`.

Kept apart from :mod:`inference.multifit` (which imports the backends registry) so that a backend
can ask it without an import cycle (the ``ensemble`` backend stacks its members when it says yes).
"""
from __future__ import annotations

from typing import Optional

from torch import nn

from zoo.bnn import BayesianNetwork

from inference.optim.early_stopping import uses_early_stopping
from inference.variational.elbo_paths import choose_elbo_path
from inference.variational.guides import normal_prior_blocker, stock_model_blocker
from inference.variational.radial_kl import resolve_mc_kl

__all__ = ["STACKABLE", "STACKED_STARTS", "TRAINED_BODY", "batch_blocker"]

#: backends with a stacked engine (:data:`inference.fitting.STACKED_BACKENDS`, in this order)
#: the SG-MCMC backends, whose MAP starts are stacked (then each fit's chains run on their own)
STACKED_STARTS = ("sgld", "psgld", "sghmc", "csgmcmc")
STACKABLE = ("map", "svi", "ensemble", "radial", *STACKED_STARTS)
#: stacked engines that also stack trained deterministic parameters (a last-layer model's body)
TRAINED_BODY = ("map", "svi", "radial", *STACKED_STARTS)

#: layers whose training-time forward is random or batch-dependent: such fits run one at a time
_TRAINING_TIME_LAYERS = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._NormBase)


def batch_blocker(bnn: BayesianNetwork, backend: str, config) -> Optional[str]:
    """Why fit ``(bnn, backend, config)`` cannot be stacked with others, or ``None`` when it can."""
    if backend not in STACKABLE:
        return f"backend {backend!r} has no stacked engine (only {', '.join(STACKABLE)})"
    if type(bnn).model is not BayesianNetwork.model:
        return f"{type(bnn).__name__} overrides the Pyro model"
    if not bnn.sites:
        return "the model has no random weights (stochastic='none')"
    if bnn.deterministic_parameters() and backend not in TRAINED_BODY:
        return (f"the model trains deterministic parameters (one network shared by every draw), which only the "
                f"{', '.join(TRAINED_BODY)} engines stack")
    if any(site.mask is not None for site in bnn.sites):
        return "the model has partially random parameters"
    if bnn.batched_draws is False:
        return f"the network has no vmap rules ({bnn.batching_error})"
    layers = sorted({type(m).__name__ for m in bnn.net.modules() if isinstance(m, _TRAINING_TIME_LAYERS)})
    if layers:
        return f"the network has layers that are random or batch-dependent in training ({', '.join(layers)})"
    if backend in ("map", "ensemble") and uses_early_stopping(bnn, config):
        return "the fit chooses its epochs on its own held-out rows (early_stopping), then refits for that many"
    if backend == "ensemble" and (config.parallel or not config.vectorise):
        return "the ensemble fits its members in other processes or one after another (workers, executor, vectorise)"
    if backend == "svi":
        path, reason = choose_elbo_path(bnn, config)
        if path != "fused":
            return f"the svi fit takes the Pyro-trace ELBO path ({reason})"
    if backend == "radial":
        return _radial_blocker(bnn, config)
    if backend in STACKED_STARTS and (config.init != "map" or config.map_steps <= 0):
        return f"{backend} starts from the network's weights (init={config.init!r}, map_steps={config.map_steps}): " \
               f"no MAP start to stack"
    return None


def _radial_blocker(bnn: BayesianNetwork, config) -> Optional[str]:
    """The stacked Radial engine runs the fused path with the exact cross-entropy, Normal weight priors."""
    if config.elbo_path == "pyro-trace":
        return "the radial fit takes the Pyro-trace ELBO path (requested)"
    if resolve_mc_kl(config.mc_kl_samples, config.mc_kl_estimator)[1] != "exact":
        return "the radial fit estimates the cross-entropy by Monte Carlo (mc_kl_samples / mc_kl_estimator)"
    reason = stock_model_blocker(bnn)
    if reason is not None:
        return f"the radial fit cannot take the fused path ({reason})"
    reason = normal_prior_blocker(bnn)
    return None if reason is None else f"{reason}; the exact Radial cross-entropy needs a Normal one"
