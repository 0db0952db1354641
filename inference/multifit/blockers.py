"""Which models can join a stacked batch, whatever the backend: :func:`model_blocker`.

The generic half of :func:`inference.fitting.batch_blocker`: the backend table says whether a backend
stacks at all and whether its engine stacks trained deterministic parameters
(:attr:`~inference.backends.base.Backend.fit_stacked`, ``stacks_trained_body``), each backend adds its own
reasons (:meth:`~inference.backends.base.Backend.stack_blocker`), and this module checks the model.
"""
from __future__ import annotations

from typing import Optional, Sequence

from torch import nn

from zoo.bnn import BayesianNetwork

__all__ = ["model_blocker"]

#: layers whose training-time forward is random or batch-dependent: such fits run one at a time
_TRAINING_TIME_LAYERS = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._NormBase)


def model_blocker(bnn: BayesianNetwork, trained_body: bool, trained_body_engines: Sequence[str] = ()) -> Optional[str]:
    """Why ``bnn`` cannot be stacked with others, or ``None`` when it can.

    Args:
        bnn: the model.
        trained_body: whether the stacked engine also stacks trained deterministic parameters (a last-layer
            model's body).
        trained_body_engines: the names of the engines that do (for the message).
    """
    if type(bnn).model is not BayesianNetwork.model:
        return f"{type(bnn).__name__} overrides the Pyro model"
    if not bnn.sites:
        return "the model has no random weights (stochastic='none')"
    if bnn.deterministic_parameters() and not trained_body:
        return (f"the model trains deterministic parameters (one network shared by every draw), which only the "
                f"{', '.join(trained_body_engines)} engines stack")
    if any(site.mask is not None for site in bnn.sites):
        return "the model has partially random parameters"
    if bnn.batched_draws is False:
        return f"the network has no vmap rules ({bnn.batching_error})"
    layers = sorted({type(m).__name__ for m in bnn.net.modules() if isinstance(m, _TRAINING_TIME_LAYERS)})
    if layers:
        return f"the network has layers that are random or batch-dependent in training ({', '.join(layers)})"
    return None
