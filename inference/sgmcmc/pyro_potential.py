"""A Pyro model's log density on the unconstrained space of its latent sites, for the SG-MCMC Pyro kernels.

log π̃(z) = Σ_sites scale · log p(site) − Σ_latents log|det ∂T/∂x| on one trace of the model conditioned on
x = T⁻¹(z) (``Trace.log_prob_sum()`` applies each site's scale); a ``pyro.plate`` that subsamples draws a
fresh minibatch per trace (:mod:`inference.sgmcmc.pyro_kernels`).
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import pyro.poutine as poutine
import torch
from pyro.poutine.subsample_messenger import _Subsample
from torch.distributions import biject_to

from inference.sgmcmc.step_sizes import CURVATURE_ROWS

__all__ = ["ModelPotential"]

_MAX_CURVATURE_BATCHES = 16  # fixed minibatches whose mean Hessian gives the default step's curvature


def _is_data_site(site) -> bool:
    """An observed sample site other than a ``pyro.deterministic`` record."""
    return site["type"] == "sample" and site["is_observed"] and not site["infer"].get("_deterministic")


def _is_latent_site(site) -> bool:
    return site["type"] == "sample" and not site["is_observed"] and not isinstance(site["fn"], _Subsample)



class ModelPotential:
    """The log density of a Pyro model's continuous latent sites on their unconstrained space.

    A mixin of the SG-MCMC Pyro kernels: ``_read_structure(trace)`` reads the latent sites, their
    transforms and shapes from a trace of the model; :meth:`potential_fn` is U = −log π̃ on one trace
    (a fresh minibatch where a plate subsamples), :meth:`_value_and_grad` its value and gradient, and
    :meth:`_fixed_batch_potential` U on fixed replayed minibatches (for the curvature).  The model and
    its arguments are ``self.model``, ``self._args``, ``self._kwargs``.
    """
    def _read_structure(self, trace) -> None:
        """Latent site names, transforms and unconstrained shapes; the number of data N."""
        transforms, shapes = {}, {}
        for name, site in trace.nodes.items():
            if not _is_latent_site(site):
                continue
            if site["fn"].has_enumerate_support:
                raise ValueError(f"SG-MCMC samples continuous latents only, not the discrete sample site {name!r}")
            transforms[name] = biject_to(site["fn"].support).inv
            shapes[name] = transforms[name](site["value"].detach()).shape
        if not transforms:
            raise ValueError("the model has no latent sample sites to sample")
        self.transforms, self._shapes = transforms, shapes
        self._names = sorted(transforms)
        self._num_observed = sum(
            site["value"].numel() * float(site["scale"]) for site in trace.nodes.values() if _is_data_site(site)
        )
        self._batch_ratio = max([1.0] + [float(site["scale"]) for site in trace.nodes.values() if _is_data_site(site)])
        self._plates = [site["fn"] for site in trace.nodes.values()
                        if site["type"] == "sample" and isinstance(site["fn"], _Subsample)]  # fmt: skip

    def _fixed_batch_potential(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """U(z) for ``z`` ``[D]`` with the likelihood on fixed minibatches: the mean of :meth:`potential_fn`
        over up to ``_MAX_CURVATURE_BATCHES`` subsamples (together ≈ :data:`CURVATURE_ROWS` rows)
        drawn once and replayed; the plain potential when no plate subsamples."""
        plates = self._plates
        if not plates:
            return lambda z: self.potential_fn(self._unpack(z))
        size, batch = plates[0].size, plates[0].subsample_size or plates[0].size
        models = []
        for _ in range(min(_MAX_CURVATURE_BATCHES, math.ceil(min(size, CURVATURE_ROWS) / batch))):
            drawn = poutine.trace(self.model).get_trace(*self._args, **self._kwargs)
            keep = poutine.Trace()
            for name, site in drawn.nodes.items():
                if site["type"] == "sample" and isinstance(site["fn"], _Subsample):
                    keep.add_node(name, **site)
            models.append(poutine.replay(self.model, trace=keep))
        return lambda z: sum(self.potential_fn(self._unpack(z), model) for model in models) / len(models)

    def _check_names(self, params: dict) -> None:
        unknown, missing = set(params) - set(self._names), set(self._names) - set(params)
        if unknown or missing:
            raise ValueError(f"initial_params: unknown sites {sorted(unknown)}, missing sites {sorted(missing)}")
        for n in self._names:
            if params[n].shape != self._shapes[n]:
                shape, expected = tuple(params[n].shape), tuple(self._shapes[n])
                raise ValueError(f"initial_params[{n!r}] has shape {shape}, expected {expected}")

    def _pack(self, params: dict) -> torch.Tensor:
        """``[1, D]`` from unconstrained values by site."""
        return torch.cat([params[n].detach().reshape(-1) for n in self._names]).unsqueeze(0)

    def _unpack(self, z: torch.Tensor) -> dict:
        """Unconstrained values by site from ``z`` ``[D]``."""
        sizes = [self._shapes[n].numel() for n in self._names]
        return {n: v.reshape(self._shapes[n]) for n, v in zip(self._names, z.split(sizes))}

    def potential_fn(self, params: dict, model: Optional[Callable] = None) -> torch.Tensor:
        """U = −log π̃ (a scalar) at unconstrained values by site, on one trace of the model (or of
        ``model``, e.g. the model replaying fixed subsamples): one stochastic estimate, with a
        fresh minibatch where the model subsamples a plate."""
        values = {n: self.transforms[n].inv(u) for n, u in params.items()}
        trace = poutine.trace(poutine.condition(model or self.model, values)).get_trace(*self._args, **self._kwargs)
        log_density = trace.log_prob_sum()
        for n, u in params.items():
            log_density = log_density - self.transforms[n].log_abs_det_jacobian(values[n], u).sum()
        return -log_density

    def _value_and_grad(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """log π̃(z) ``[1]`` and its gradient ``[1, D]`` from one :meth:`potential_fn` call."""
        with torch.enable_grad():
            z = z.detach().requires_grad_(True)
            potential = self.potential_fn(self._unpack(z[0]))
            (grad,) = torch.autograd.grad(potential, z)
        return -potential.detach().reshape(1), -grad

