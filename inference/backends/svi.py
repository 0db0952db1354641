"""Stochastic variational inference with a guide from :data:`inference.variational.guides.GUIDES`
(default: Pyro's mean-field ``AutoNormal``, as :class:`inference.variational.guides.NormalGuide`).

The fit is the one training loop, :func:`inference.variational.fit.fit_guide` (minibatches, KL
annealing, deterministic pretraining, particle averaging, non-finite checks); deterministic
parameters are trained jointly unless the model froze them.  The length is chosen on held-out rows unless
``epochs`` is given (:mod:`inference.variational.length`).  Each step's ELBO is estimated on
one of two paths (:mod:`inference.variational.elbo_paths`), recorded in ``posterior.info["elbo_path"]``:

* ``"fused"`` — the default guide on a model whose random weights all have Normal priors:
  :meth:`inference.variational.guides.NormalGuide.elbo_terms` draws every site's noise directly, forms the
  weights and the closed-form KL in one autograd function and runs the network once, with no
  Pyro trace (same guide, parameters, estimator and, for a seed, random numbers as Pyro's path);
  Adam is PyTorch's single-kernel (fused) one;
* ``"pyro-trace"`` — every other case (another guide, a Laplace or Student-t weight prior, a model
  that overrides the Pyro program, no latent sites; :func:`inference.variational.guides.fused_elbo_blocker`
  names the reason, kept in ``info["elbo_path_reason"]``), or when asked for with
  ``elbo_path="pyro-trace"``: :func:`inference.variational.fit.trace_particle`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from inference.backends.base import Backend
from inference.optim.training import LoopOptions
from inference.variational.posterior import VariationalPosterior
from inference.variational.elbo_paths import check_elbo_path, choose_elbo_path, elbo_particle, elbo_path_info
from inference.variational.fit import fit_guide
from inference.variational.guides import GUIDES
from inference.variational.length import HeldOutLengthOptions, fit_held_out_length
from inference.variational.stacked_svi import fit_svi_stacked, svi_stack_blocker

__all__ = ["SVIConfig", "SVIBackend"]


@dataclass
class SVIConfig(HeldOutLengthOptions, LoopOptions):
    """Options of the SVI backend: :class:`~inference.optim.training.LoopOptions`, the held-out choice of the
    length (:class:`~inference.variational.length.HeldOutLengthOptions`: ``epochs`` ``None`` chooses it on
    held-out rows, :mod:`inference.variational.length`) and the guide.

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
        check_elbo_path(self.elbo_path)


class SVIBackend(Backend):
    name = "svi"
    Config = SVIConfig
    budget = "elbo"
    fit_stacked = staticmethod(fit_svi_stacked)  # the fused path (the default guide, Normal weight priors)
    stack_blocker = staticmethod(svi_stack_blocker)
    stacks_trained_body = True
    stacks_weight_priors = True

    def run(self, bnn, x, y, config: SVIConfig, seed: int, progress: bool) -> VariationalPosterior:
        guide_kwargs = {"init_scale": config.init_scale, **(config.guide_options or {})}
        path, reason = choose_elbo_path(bnn, config)
        info = elbo_path_info(path, reason)

        def one_fit(xs, ys, options, stop, held_out):
            return fit_guide(
                self.name, bnn, xs, ys, options, seed, progress, options.guide, guide_kwargs, elbo_particle(bnn, path),
                info=lambda guide: info, fused_adam=path == "fused", stop=stop,
                desc=f"{self.name} (held-out length)" if held_out else None,
            )

        return fit_held_out_length(one_fit, bnn, x, y, config, seed)
