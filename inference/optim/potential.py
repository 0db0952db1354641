"""A flat-vector log density over a :class:`~zoo.bnn.BayesianNetwork`'s random sites.

Samplers (the parts in :mod:`inference.mcmc`, assembled by :mod:`inference.backends.hmc`
and :mod:`inference.backends.sgmcmc`) work on one unconstrained vector per chain,
``z ∈ R^D`` stacked as ``[C, D]``.  Site ``s`` occupies a slice of ``z``; constrained
latents (e.g. the noise precision, support ``(0, ∞)``) are mapped with
``T_s = biject_to(prior_s.support)`` and the density gains the log-Jacobian:

    log π(z) = log p(T(z)) + (N/n) Σ_{i∈batch} log p(y_i | x_i, T(z)) + Σ_s log|det ∂T_s/∂z_s|

Deterministic parameters are not part of ``z``: they keep the values held by the
network.  All ``C`` chains are evaluated in one batched forward pass
(:meth:`BayesianNetwork.log_likelihood` is ``vmap``-ed over draws, or looped for a network
without batching rules), and gradients come from one reverse pass, so the per-gradient
overhead is paid once for all chains.  The network is put in eval mode, where it stays:
the density must be a deterministic function of ``z`` (no dropout; batch normalisation on
its running statistics).  Every tensor here follows ``z``'s (the model's) dtype and device.  A
factorised Normal prior on the weights (the common case) is evaluated as one
expression over the flat weight slice instead of site by site (the same density).
Minibatches are rows ``index`` of the stored data (:meth:`Potential.log_density`), or batch
tensors themselves (:meth:`Potential.batch_log_density`, for a DataLoader's batches, where the
potential holds only N).  While :meth:`Potential.cached_head` is active, the rows ``index`` of the
stored data are evaluated from the sampled output module's cached input
(:mod:`inference.optim.output_head`) instead of the whole network: the same density, the body run once.

:func:`frozen_deterministic` holds the deterministic parameters during a sampler's loop and
:func:`compiled` ``torch.compile`` s a function of the potential; the starting point (the
network's current weights or a quick MAP fit) is :func:`inference.optim.start.initial_point`.
"""
from __future__ import annotations

import contextlib
import math
import types
import warnings
from dataclasses import dataclass
from functools import partial
from typing import Optional

import pyro
import pyro.distributions as dist
import torch
from torch.distributions import biject_to
from torch.func import grad_and_value

from inference.optim.batches import LoaderBatches
from inference.optim.output_head import OutputHead, cache_head

__all__ = ["Potential", "frozen_deterministic", "compiled"]


@dataclass
class _Block:
    name: str
    shape: torch.Size
    start: int
    stop: int
    transform: Optional[torch.distributions.Transform]  # None: identity (real support)


def _normal_base(d):
    """The elementwise Normal of a factorised Normal site prior, else ``None``."""
    base = d.base_dist if isinstance(d, torch.distributions.Independent) else d
    return base if type(base) in (dist.Normal, torch.distributions.Normal) else None


class Potential:
    """Log density ``log π(z)`` over flat unconstrained vectors ``z`` ``[C, D]``.

    Args:
        bnn: the model; must have at least one random site.
        x, y: training data ``[N, ...]`` and targets (standardised units for regression); or
            ``x`` a :class:`~inference.optim.batches.LoaderBatches` and ``y`` ``None``: then N is the
            loader's ``num_data`` and only the batch entry points (:meth:`batch_log_density`,
            :meth:`batch_value_and_grad`) evaluate the likelihood.
    """

    def __init__(self, bnn, x, y: Optional[torch.Tensor]):
        if not bnn.site_names:
            raise ValueError(
                "the model has no stochastic sites to sample (stochastic='none' and no likelihood latents); "
                "choose stochastic='all', 'last' or a pattern, or fit it with backend='svi'"
            )
        bnn.net.eval()  # log π must be a deterministic function of z: no dropout, batch norm on running statistics
        if isinstance(x, LoaderBatches):  # fit() checked the network on the loader's first row
            self.bnn, self.x, self.y, self.num_data = bnn, None, None, x.num_data
        else:
            bnn.check_forward(x)  # vmap over chains, or a loop for a network without batching rules
            self.bnn, self.x, self.y, self.num_data = bnn, x, y, x.shape[0]
        priors = bnn.prior_distributions()
        self.blocks: list[_Block] = []
        start = 0
        for name in bnn.site_names:
            shape = torch.Size(bnn.site_shapes[name])
            size = int(shape.numel())
            support = priors[name].support
            transform = None if _is_real(support) else biject_to(support)
            self.blocks.append(_Block(name, shape, start, start + size, transform))
            start += size
        self.dim = start
        self.priors = priors
        # fast path: one expression for the factorised Normal priors of the weight sites
        normal = [b for b in self.blocks if b.transform is None and _normal_base(priors[b.name]) is not None]
        contiguous = [b.name for b in normal] == [b.name for b in self.blocks[: len(normal)]]
        self._fast = normal if (normal and contiguous) else []
        if self._fast:
            loc = torch.cat([_normal_base(priors[b.name]).loc.reshape(-1) for b in self._fast])
            scale = torch.cat([_normal_base(priors[b.name]).scale.reshape(-1) for b in self._fast])
            self._fast_stop = self._fast[-1].stop
            self._loc, self._inv_scale = loc, 1.0 / scale
            self._log_norm = float(-(scale.log().sum()) - 0.5 * loc.numel() * math.log(2 * math.pi))
        self._slow = self.blocks[len(self._fast):]
        self.head: Optional[OutputHead] = None

    @property
    def device(self) -> torch.device:
        """The device of the model's tensors (its target scale's)."""
        return self.bnn.target_scale.device

    # ------------------------------------------------------------------ layout
    def unpack(self, z: torch.Tensor) -> tuple[dict, torch.Tensor]:
        """Constrained site values ``{site: [*batch, *shape]}`` and ``log|det J|`` ``[*batch]`` of ``z`` ``[*batch, D]``."""
        batch = z.shape[:-1]
        values, log_det = {}, z.new_zeros(batch)
        for b in self.blocks:
            u = z[..., b.start : b.stop]
            if b.transform is not None:
                v = b.transform(u)
                log_det = log_det + b.transform.log_abs_det_jacobian(u, v).reshape(*batch, -1).sum(-1)
                u = v
            values[b.name] = u.reshape(*batch, *b.shape)
        return values, log_det

    def pack(self, values: dict) -> torch.Tensor:
        """Inverse of :meth:`unpack`: ``{site: [*batch, *shape]}`` → ``z`` ``[*batch, D]``."""
        parts = []
        for b in self.blocks:
            v = values[b.name]
            batch = v.shape[: v.dim() - len(b.shape)]
            if b.transform is not None:
                v = b.transform.inv(v)
            parts.append(v.reshape(*batch, -1))
        return torch.cat(parts, dim=-1)

    def draws(self, z: torch.Tensor) -> dict:
        """Constrained draws ``{site: [C, S, *shape]}`` from ``z`` ``[C, S, D]``."""
        return self.unpack(z)[0]

    # ------------------------------------------------------------------ density
    @contextlib.contextmanager
    def cached_head(self, name: Optional[str]):
        """Within the context, the stored rows are evaluated through the output module ``name``'s input, computed
        here once (:func:`~inference.optim.output_head.cache_head`): enter it once the deterministic parameters
        are final and frozen (:func:`frozen_deterministic`).  ``name`` ``None`` (no such module,
        :func:`~inference.optim.output_head.head_module`) changes nothing."""
        if name is None or self.x is None:
            yield self
            return
        self.head = cache_head(self.bnn, name, self.x)
        try:
            yield self
        finally:
            self.head = None

    def outputs(self, z: torch.Tensor, index: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Network outputs ``[C, n, O]`` (standardised units or logits) of the draws ``z`` ``[C, D]`` on the stored
        rows ``index`` (all when ``None``)."""
        values, _ = self.unpack(z)
        if self.head is not None:
            return self.head.outputs(self.bnn, values, index)
        return self.bnn.forward_draws(values, self.x if index is None else self.x[index])

    def log_density(self, z: torch.Tensor, index: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``[C]`` log π(z) on the full data, or on minibatch ``index`` with the N/n scaling."""
        y = self.y if index is None else self.y[index]
        if self.head is not None:
            values, log_det = self.unpack(z)
            f = self.head.outputs(self.bnn, values, index)
            log_lik = self.bnn.likelihood.log_prob(f, y, self.bnn.latents_of(values))
            return self._log_prior(z, values, log_det + (self.num_data / y.shape[0]) * log_lik.sum(-1))
        return self.batch_log_density(z, self.x if index is None else self.x[index], y)

    def batch_log_density(self, z: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``[C]`` log π(z) with the likelihood of the batch ``x [n, ...]``, ``y [n, ...]`` scaled by N/n."""
        values, log_det = self.unpack(z)
        scale = self.num_data / x.shape[0]
        return self._log_prior(z, values, log_det + scale * self.bnn.log_likelihood(values, x, y).sum(-1))

    def prior_and_likelihood(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log p(T(z)) + log|det J| [C], log p(y | x, T(z)) [C])`` on the full stored data: the two terms of
        :meth:`log_density`, whose sum it is, kept apart for tempered targets p(θ) p(y | θ)^β
        (:mod:`inference.smc`)."""
        if self.x is None:
            raise ValueError("the likelihood of a DataLoader's potential is only available per batch")
        values, log_det = self.unpack(z)
        if self.head is not None:
            f = self.head.outputs(self.bnn, values, None)
            log_lik = self.bnn.likelihood.log_prob(f, self.y, self.bnn.latents_of(values)).sum(-1)
        else:
            log_lik = self.bnn.log_likelihood(values, self.x, self.y).sum(-1)
        return self._log_prior(z, values, log_det), log_lik

    def _log_prior(self, z: torch.Tensor, values: dict, lp: torch.Tensor) -> torch.Tensor:
        """``lp`` plus the log prior of ``values`` (the factorised Normal weights as one expression over ``z``)."""
        if self._fast:
            w = (z[..., : self._fast_stop] - self._loc) * self._inv_scale
            lp = lp + (self._log_norm - 0.5 * (w * w).sum(-1))
        for b in self._slow:
            lp = lp + self.priors[b.name].log_prob(values[b.name])
        return lp

    def value_and_grad(self, z: torch.Tensor, index: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log π(z) [C], ∇_z log π(z) [C, D])`` — one batched forward and reverse pass."""
        with torch.enable_grad():
            z = z.detach().requires_grad_(True)
            lp = self.log_density(z, index)
            (grad,) = torch.autograd.grad(lp.sum(), z)
        return lp.detach(), grad

    def batch_value_and_grad(self, z: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`value_and_grad` on the batch ``x [n, ...]``, ``y [n, ...]`` (likelihood scaled by N/n)."""
        with torch.enable_grad():
            z = z.detach().requires_grad_(True)
            lp = self.batch_log_density(z, x, y)
            (grad,) = torch.autograd.grad(lp.sum(), z)
        return lp.detach(), grad

    def functional_value_and_grad(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`value_and_grad` on the full data via ``torch.func`` (traceable by ``torch.compile``)."""

        def total(z):
            lp = self.log_density(z)
            return lp.sum(), lp

        grad, (_, lp) = grad_and_value(total, has_aux=True)(z)
        return lp, grad

    def latent_init(self) -> dict:
        """Starting values of the likelihood latents: the prior median (of 501 seeded prior draws)."""
        out = {}
        for b in self.blocks:
            if b.name in self.bnn._site_by_name:
                continue
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                out[b.name] = self.priors[b.name].sample((501,)).median(0).values
        return out


def _is_real(support) -> bool:
    base = getattr(support, "base_constraint", support)
    return base is torch.distributions.constraints.real


@contextlib.contextmanager
def frozen_deterministic(bnn):
    """Stop gradients into the deterministic parameters and turn off argument validation (hot loops)."""
    params = bnn.deterministic_parameters()
    for p in params:
        p.requires_grad_(False)
    try:
        with pyro.validation_enabled(False):
            yield
    finally:
        for p in params:
            p.requires_grad_(True)


def compiled(fn, enabled: bool, *args, device=None):
    """``partial(fn, *args)``, ``torch.compile``-d when ``enabled``; eager with a warning if compilation fails.

    The compiled function is a private copy of ``fn`` (its own code object) called with ``args``
    prepended: torch.compile caches per code object, so every sampler run owns its graph — runs
    on other models in the same process neither share nor exhaust one cache (a ``partial`` would
    be wrapped in a frame that all of them share) — and guards can be cut to the input tensors'
    metadata, since ``args`` (model, potential) are fixed for the run, which removes most
    per-call overhead (and with them inductor's redundant size asserts inside the call).

    On a CPU (``device``), inductor writes the code that calls its kernels in C++ (``cpp_wrapper``), not
    Python: a compiled ``while_loop`` (the NUTS subtree) then loops in C++ instead of running a Python body
    per step — 23.6 against 27.4 µs per vectorised gradient on the tiny benchmark model, 292 against 311 on
    energy — and its C++ build is found in inductor's disk cache by a later process (docs/mcmc.md, "Cold
    start").  Elsewhere the Python wrapper is kept.
    """
    eager = partial(fn, *args)
    if not enabled:
        return eager
    own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    # the tensor guards check every input's size and stride, so inductor's own per-call size asserts are
    # redundant; compiling in-process skips starting a pool of compile workers (seconds on a busy machine)
    options = {"guard_filter_fn": torch.compiler.keep_tensor_guards_unsafe, "size_asserts": False, "alignment_asserts": False,
               "compile_threads": 1, "cpp_wrapper": device is not None and torch.device(device).type == "cpu"}
    state = {"fn": partial(torch.compile(own, dynamic=False, options=options), *args)}

    def call(*call_args):
        try:
            return state["fn"](*call_args)
        except Exception as err:  # a model torch.compile cannot handle: run eagerly instead
            if state["fn"] is eager:
                raise
            reason = (str(err).strip().splitlines() or [""])[0]
            warnings.warn(f"torch.compile failed ({type(err).__name__}: {reason}); running without compilation", RuntimeWarning)
            state["fn"] = eager
            return eager(*call_args)

    return call
