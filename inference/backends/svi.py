"""Stochastic variational inference with a guide from :data:`inference.variational.guides.GUIDES`
(default: Pyro's mean-field ``AutoNormal``, as :class:`inference.variational.guides.NormalGuide`).

The fit is the one training loop, :func:`inference.optim.training.fit_guide` (minibatches, KL
annealing, deterministic pretraining, particle averaging, non-finite checks); deterministic
parameters are trained jointly unless the model froze them.  Each step's ELBO is estimated on
one of two paths, recorded in ``posterior.info["elbo_path"]``:

* ``"fused"`` — the default guide on a model whose random weights all have Normal priors:
  :meth:`inference.variational.guides.NormalGuide.elbo_terms` draws every site's noise directly, forms the
  weights and the closed-form KL in one autograd function and runs the network once, with no
  Pyro trace (same guide, parameters, estimator and, for a seed, random numbers as Pyro's path);
  Adam is PyTorch's single-kernel (fused) one;
* ``"pyro-trace"`` — every other case (another guide, a Laplace or Student-t weight prior, a model
  that overrides the Pyro program, no latent sites; :func:`inference.variational.guides.fused_elbo_blocker`
  names the reason, kept in ``info["elbo_path_reason"]``), or when asked for with
  ``elbo_path="pyro-trace"``: :func:`inference.optim.training.trace_particle`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Optional

import pyro

from inference.variational.guides import GUIDES, fused_elbo_blocker
from inference.posterior import VariationalPosterior
from inference.optim.training import LoopOptions, fit_guide, trace_particle
from inference.backends.base import Backend

__all__ = ["SVIConfig", "SVIBackend", "ELBO_PATHS", "resolve_elbo_path", "choose_elbo_path", "svi_particle"]

#: ``auto`` picks ``fused`` where the model allows it, else ``pyro-trace``
ELBO_PATHS = ("auto", "fused", "pyro-trace")


@dataclass
class SVIConfig(LoopOptions):
    """Options of the SVI backend: :class:`~inference.optim.training.LoopOptions` plus the guide.

    Attributes:
        guide: a name in :data:`inference.variational.guides.GUIDES`.
        guide_options: extra keyword arguments for the guide builder.
        elbo_path: ``"auto"`` (fused where possible), ``"fused"`` (an error where it is not
            possible) or ``"pyro-trace"`` (always through Pyro traces).
    """

    guide: str = "normal"
    guide_options: Optional[dict] = None
    elbo_path: Literal["auto", "fused", "pyro-trace"] = "auto"

    def validate(self):
        super().validate()
        if self.guide not in GUIDES:
            raise ValueError(f"unknown guide {self.guide!r}; valid guides: {', '.join(GUIDES)}")
        if self.elbo_path not in ELBO_PATHS:
            raise ValueError(f"unknown elbo_path {self.elbo_path!r}; valid: {', '.join(ELBO_PATHS)}")


def resolve_elbo_path(requested: str, blocker: Optional[str]) -> tuple[str, Optional[str]]:
    """``(path, reason)`` for option ``elbo_path=requested`` when ``blocker`` (``None``: nothing) stands
    against the fused path: ``"fused"`` or ``"pyro-trace"``, and why the trace path was taken (else ``None``).

    Raises:
        ValueError: ``requested == "fused"`` where the fused path does not apply (the reason is given).
    """
    if requested == "pyro-trace":
        return "pyro-trace", "requested (elbo_path='pyro-trace')"
    if blocker is not None:
        if requested == "fused":
            raise ValueError(f"elbo_path='fused' is not available for this model: {blocker}; use 'auto' or 'pyro-trace'")
        return "pyro-trace", blocker
    return "fused", None


def choose_elbo_path(bnn, config: SVIConfig) -> tuple[str, Optional[str]]:
    """:func:`resolve_elbo_path` for the ``svi`` backend (blocker: :func:`inference.variational.guides.fused_elbo_blocker`)."""
    return resolve_elbo_path(config.elbo_path, fused_elbo_blocker(bnn, config.guide))


def svi_particle(bnn, path: str) -> Callable:
    """``particle(guide, x_batch, y_batch, num_data) -> (expected_log_likelihood, kl)`` on ``path``."""
    if path != "fused":
        return lambda guide, xb, yb, num_data: trace_particle(bnn, guide, xb, yb, num_data)

    def fused_particle(guide, xb, yb, num_data):
        with pyro.validation_enabled(False):  # as on the trace path: the data were checked once by fit()
            return guide.elbo_terms(bnn, xb, yb, num_data)

    return fused_particle


class SVIBackend(Backend):
    name = "svi"
    Config = SVIConfig

    def run(self, bnn, x, y, config: SVIConfig, seed: int, progress: bool) -> VariationalPosterior:
        guide_kwargs = {"init_scale": config.init_scale, **(config.guide_options or {})}
        path, reason = choose_elbo_path(bnn, config)
        info = {"elbo_path": path, **({"elbo_path_reason": reason} if reason else {})}
        return fit_guide(
            self.name, bnn, x, y, config, seed, progress, config.guide, guide_kwargs, svi_particle(bnn, path),
            info=lambda guide: info, fused_adam=path == "fused",
        )
