"""Partially stochastic Bayesian networks built from plain ``nn.Module``s.

:class:`BayesianNetwork` wraps a deterministic network ``f(x; w)`` and splits its
parameters into random sites ``w_s`` (selected by a :mod:`zoo.stochastic` selector,
with a prior from :mod:`zoo.priors`) and deterministic ones ``w_d``:

    p(y, w_s, θ | x) = p(w_s) · p(θ) · Π_n p(y_n | f(x_n; w_s, w_d), θ)

where θ are the likelihood's own latents (e.g. the noise precision).  Deterministic
parameters are either trained jointly (a point estimate, as in partially stochastic
networks of Sharma et al. 2023) or frozen at their current / pretrained values.

Two views of the same model are provided:

* :meth:`BayesianNetwork.model` — a Pyro model with one sample site per random
  parameter, named like the parameter (``"fc2.weight"``), and observed site ``"obs"``;
  used by SVI and any Pyro guide.
* pure-torch, vectorised functions over stacks of ``S`` parameter draws —
  :meth:`forward_draws`, :meth:`log_likelihood`, :meth:`log_prior` — built on
  :meth:`forward_single` (the network with its random sites set to one draw:
  :class:`zoo.parameter_swap.ParameterSlots`, ``functional_call`` under ``torch.compile``) +
  ``vmap``; used for prediction and by samplers that need a fast potential energy.

Prediction evaluates the network in eval mode (:meth:`BayesianNetwork.prediction_mode`):
dropout is off and batch normalisation uses its running statistics, so the output at a point
does not depend on the rest of the batch and is the same on every call; modules named in
``active_at_prediction`` (e.g. the dropout layers an MC-dropout posterior keeps on) stay in
training mode.  Training (:meth:`model`) runs the network in the mode it is in.  A network
whose layers have no ``vmap`` batching rule (``nn.GRU``, ``nn.LSTM``) is detected on an
example input (:meth:`check_forward`) and evaluated draw by draw instead; both live in
:mod:`zoo.evaluation`.
"""
from __future__ import annotations

from typing import Mapping, Optional

import pyro
import torch
from torch import nn
from torch.func import functional_call, vmap

from .checks import check_input, check_network_arguments, early_target_scaling, target_scaling
from .deferred_build import DeferredBuild, UnbuiltNetworkError
from .evaluation import NetworkEvaluation
from .likelihoods import GaussianLikelihood, Likelihood
from .parameter_swap import ParameterSlots
from .priors import NormalPrior, Prior
from .pyro_module import register_parameters, to_pyro_module
from .stochastic import StochasticSite, as_selector

__all__ = ["BayesianNetwork", "UnbuiltNetworkError"]


class BayesianNetwork(DeferredBuild, NetworkEvaluation, nn.Module):
    """A plain network with priors on a chosen subset of its parameters.

    Args:
        net: a plain ``nn.Module`` whose ``forward(x)`` returns predictions only,
            ``[N, O]`` (regression outputs or class logits).
        stochastic: which parameters are random — ``"all"``, ``"none"``, ``"last"``,
            glob patterns, boolean masks, or a :class:`~zoo.stochastic.Selector`.
        prior: a :class:`~zoo.priors.Prior` (default ``NormalPrior(1.0)``).
        likelihood: a :class:`~zoo.likelihoods.Likelihood` (default fixed-noise Gaussian).
        train_deterministic: train the non-random parameters jointly (``True``) or keep
            them frozen at their current / pretrained values (``False``).
        example_input: a small input batch; lets ``"last"`` follow forward order, and checks
            the network's output and ``vmap`` support (:meth:`check_forward`) at construction.
            Optional: without it (and without ``output_dim``) the network is completed by the
            first inputs it sees — :func:`inference.fit` builds it from the training data's first
            rows (:meth:`build`); until then its sites and output size are unknown
            (:class:`UnbuiltNetworkError` says so).
        output_dim: number of network outputs ``P`` (inferred from ``example_input`` when
            given; with ``output_dim`` alone, ``"last"`` follows registration order and the network
            is built at once); ``P = likelihood.heads · T`` with ``T`` = :attr:`target_dim` targets
            (e.g. a heteroscedastic likelihood has a mean and a log-variance output per target).
        target_loc, target_scale: ``[T]`` affine map from standardised to original target
            units (regression); predictions are reported in original units.
        sites: precomputed :class:`StochasticSite` list (used when loading from disk).

    Attributes:
        active_at_prediction: names of submodules kept in training mode at prediction
            (default none: the whole network is evaluated in eval mode).
        batched_draws: whether :meth:`forward_draws` ``vmap``-s over draws (``True``), loops
            draw by draw (``False``), or has not been checked yet (``None``).
        batching_error: why ``vmap`` failed on this network (``None`` if it did not).

    Raises:
        ValueError: ``net`` is not a module, or its forward on ``example_input`` does not
            return one ``[n, O]`` tensor.
    """

    def __init__(
        self,
        net: nn.Module,
        stochastic="all",
        prior: Optional[Prior] = None,
        likelihood: Optional[Likelihood] = None,
        train_deterministic: bool = True,
        example_input: Optional[torch.Tensor] = None,
        output_dim: Optional[int] = None,
        target_loc: Optional[torch.Tensor] = None,
        target_scale: Optional[torch.Tensor] = None,
        sites: Optional[list[StochasticSite]] = None,
    ):
        super().__init__()
        if not isinstance(net, nn.Module):
            raise ValueError(f"net must be a torch.nn.Module, got {type(net).__name__}")
        check_network_arguments(prior, likelihood, train_deterministic, output_dim)
        self.net = net
        self.active_at_prediction: tuple[str, ...] = ()
        self.batched_draws: Optional[bool] = None
        self.batching_error: Optional[str] = None
        self.prior = prior if prior is not None else NormalPrior(1.0)
        self.likelihood = likelihood if likelihood is not None else GaussianLikelihood()
        self.selection = stochastic
        self.train_deterministic = bool(train_deterministic)
        self._deferred: Optional[tuple] = None
        if example_input is None and output_dim is None and sites is None:  # the first fit's inputs complete it
            as_selector(stochastic)  # a bad selector is refused now, not at the fit
            self._deferred = (early_target_scaling(target_loc, "target_loc"),
                              early_target_scaling(target_scale, "target_scale"))
            return
        self._build(example_input, output_dim, target_loc, target_scale, sites)

    def _build(self, example_input, output_dim, target_loc, target_scale, sites) -> None:
        """Sites, output size, target scaling, frozen parameters and priors (see the class docstring)."""
        net = self.net
        example_output = None
        if example_input is not None:
            example_input = check_input(self, example_input, "example_input")
            example_output = self._example_output(example_input)
        self.sites: list[StochasticSite] = (
            sites if sites is not None else as_selector(self.selection).select(net, example_input)
        )
        self._site_by_name = {s.name: s for s in self.sites}
        if output_dim is None:
            output_dim = int(example_output.shape[-1])
        elif example_output is not None and example_output.shape[-1] != output_dim:
            raise ValueError(f"output_dim={output_dim} but {type(net).__name__} returns {example_output.shape[-1]} "
                             f"outputs for example_input; leave output_dim out or build the network with {output_dim}")
        self.output_dim = int(output_dim)
        heads = self.likelihood.heads
        if self.output_dim % heads:
            raise ValueError(f"{self.likelihood!r} needs {heads} network outputs per target, but the network has "
                             f"{self.output_dim} outputs; build it with {heads} x (number of targets) outputs")
        self.target_dim = self.output_dim // heads
        param = next(net.parameters(), None)
        like = {"dtype": torch.get_default_dtype()} if param is None else {"dtype": param.dtype, "device": param.device}
        target_loc = target_scaling(torch.zeros(self.target_dim) if target_loc is None else target_loc,
                                     "target_loc", self.target_dim).to(**like)
        target_scale = target_scaling(torch.ones(self.target_dim) if target_scale is None else target_scale,
                                       "target_scale", self.target_dim).to(**like)
        if not bool((target_scale > 0).all()):
            raise ValueError(f"target_scale must be positive, got {target_scale.tolist()}")
        self.register_buffer("target_loc", target_loc)
        self.register_buffer("target_scale", target_scale)
        random_names = {s.name for s in self.sites}  # overridden wholly by site values
        for name, param in net.named_parameters():
            if name in random_names or not self.train_deterministic:
                param.requires_grad_(False)
        self._build_priors()
        if example_input is not None:
            self.check_forward(example_input)

    def _build_priors(self) -> None:
        """(Re)build the weight priors (one per site) and the likelihood's latent priors.

        Their tensors take the dtype / device of the sites' reference weights and of the
        network's parameters, so they follow :meth:`_apply` conversions.
        """
        if not self.is_built:
            return
        self._weight_priors = {s.name: self.prior(s) for s in self.sites}
        param = next(self.net.parameters(), None)
        like = {} if param is None else {"dtype": param.dtype, "device": param.device}
        self._latent_priors = self.likelihood.latent_priors(self.target_dim, **like)

    def _apply(self, fn, *args, **kwargs):
        """``.double()``, ``.to(device)``, ...: convert the sites' tensors too and rebuild the priors."""
        super()._apply(fn, *args, **kwargs)
        for site in (self.sites if self.is_built else []):
            site.convert_(fn)
        self._build_priors()
        return self

    # ------------------------------------------------------------------ structure
    @property
    def site_names(self) -> list[str]:
        """Names of all latent sites: random weights first, then likelihood latents."""
        return [s.name for s in self.sites] + list(self._latent_priors)

    @property
    def site_shapes(self) -> dict[str, torch.Size]:
        shapes = {s.name: s.shape for s in self.sites}
        shapes.update({n: d.event_shape for n, d in self._latent_priors.items()})
        return shapes

    @property
    def num_random(self) -> int:
        """Number of random scalars (weights and likelihood latents)."""
        return sum(int(torch.Size(s).numel()) for s in self.site_shapes.values())

    def latent_priors(self) -> dict:
        """Priors of the likelihood's own latent sites (e.g. ``noise_precision``)."""
        return dict(self._latent_priors)

    def prior_distributions(self) -> dict:
        """``{site: Distribution}`` with event shape = site shape."""
        return {**self._weight_priors, **self._latent_priors}

    def deterministic_parameters(self) -> list[nn.Parameter]:
        """Parameters trained as point estimates (empty when frozen)."""
        return [p for p in self.net.parameters() if p.requires_grad]

    def site(self, name: str) -> StochasticSite:
        try:
            return self._site_by_name[name]
        except KeyError:
            raise ValueError(f"no stochastic site {name!r}; sites are: {', '.join(self._site_by_name)}") from None

    def initial_values(self) -> dict[str, torch.Tensor]:
        """Site-shaped current values of the random weights (for guide / chain init)."""
        params = dict(self.net.named_parameters())
        return {s.name: s.from_param(params[s.name].detach()).clone() for s in self.sites}

    def update_reference(self, values: Mapping[str, torch.Tensor]) -> None:
        """Adopt site values (e.g. after deterministic pretraining) as the reference weights.

        Writes them into the network's parameters (fixed entries keep their fixed
        values) and rebuilds the priors, so a prior centred at pretrained weights is
        centred at these.
        """
        params = dict(self.net.named_parameters())
        with torch.no_grad():
            for name, value in values.items():
                site = self.site(name)
                full = site.to_param(value.detach())
                params[name].copy_(full)
                site.reference = full.clone()
        self._build_priors()

    def set_target_scaling(self, loc, scale) -> None:
        """Set the standardised → original units map of regression targets (``[T]`` each).

        The buffers keep their dtype and device (float32 on CPU unless the module was converted).
        """
        like = {"dtype": self.target_scale.dtype, "device": self.target_scale.device}
        scale = torch.as_tensor(scale, **like).reshape(-1)
        if scale.numel() not in (1, self.target_dim) or not bool((scale > 0).all()):
            raise ValueError(f"target scale must be {self.target_dim} positive numbers, got {scale.tolist()}")
        self.target_loc = torch.as_tensor(loc, **like).reshape(-1).expand(self.target_dim).clone()
        self.target_scale = scale.expand(self.target_dim).clone()

    # ------------------------------------------------------------------ Pyro model
    def model(self, x: Optional[torch.Tensor] = None, y: Optional[torch.Tensor] = None, num_data: Optional[int] = None):
        """Pyro model.  With ``x=None`` only the latent sites are sampled (prototype trace).

        Args:
            x: inputs ``[n, ...]`` (a minibatch or the full data).
            y: targets ``[n, T]`` (regression, standardised) or ``[n]`` (class labels).
            num_data: full data size ``N``; the likelihood is scaled by ``N / n``.
        Returns:
            network output ``[n, P]`` (standardised units / logits), or ``None``.

        The trainable deterministic parameters are registered with Pyro as ``"net$$$<name>"``
        (:func:`zoo.pyro_module.register_parameters`), so stock ``pyro.infer.SVI`` trains them.
        They are not in Pyro's global parameter store, which ``JitTrace_ELBO`` compiles
        against: call ``pyro.module("net", bnn.net)`` once before a JIT-compiled ELBO (it puts
        the network's own tensors there) — otherwise Pyro's JIT fails with ``KeyError: 'net$$$…'``.
        """
        if x is not None and not self.is_built:
            self.build(x)
        register_parameters("net", self.net)
        values = {name: pyro.sample(name, d) for name, d in self._weight_priors.items()}
        latents = {name: pyro.sample(name, d) for name, d in self._latent_priors.items()}
        if x is None:
            return None
        f = self.forward_single(values, x)
        n = f.shape[0]
        with pyro.plate("data", size=num_data or n, subsample_size=n):
            self.likelihood.observe(f, y, latents)
        return f

    def to_pyro_module(self) -> pyro.nn.PyroModule:
        """A ``PyroModule`` copy of the network with ``PyroSample`` priors on the random sites:
        same sites and log joint as :meth:`model` (:func:`zoo.pyro_module.to_pyro_module`)."""
        return to_pyro_module(self)

    def forward_single(self, values: Mapping[str, torch.Tensor], x: torch.Tensor,
                       parameters: Optional[Mapping[str, torch.Tensor]] = None) -> torch.Tensor:
        """Network output ``[N, O]`` with the random sites set to one draw ``{site: site-shaped}`` and, for
        this call, the network's deterministic parameters named in ``parameters`` (``{name: tensor}``) replaced."""
        overrides = {name: self._site_by_name[name].to_param(v) for name, v in values.items()}
        if parameters:
            overrides.update(parameters)
        if torch.compiler.is_compiling():
            return functional_call(self.net, overrides, (x,), strict=False)
        slots = self.__dict__.get("_parameter_slots")
        if slots is None or slots.net is not self.net:
            slots = self.__dict__["_parameter_slots"] = ParameterSlots(self.net)
        with slots.swapped(overrides):
            return self.net(x)

    # ------------------------------------------------------------------ vectorised views
    def forward_draws(self, values: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """Network outputs for a stack of ``S`` parameter draws, in prediction mode.

        One batched (``vmap``-ed) pass, or a loop over the draws for a network without
        batching rules (see :meth:`check_forward`, run here on ``x`` if it has not been).

        Args:
            values: ``{site: [S, *site_shape]}`` (likelihood latents are ignored).
            x: inputs ``[N, ...]`` (moved to the model, :meth:`placed_input`).
        Returns:
            ``[S, N, O]`` outputs in standardised units (regression) or logits.
        """
        weights = {n: v for n, v in values.items() if n in self._site_by_name}
        x = self.placed_input(x)
        if weights and self.batched_draws is None:
            self.check_forward(x)
        changed = self._enter_prediction_mode()  # not the context manager: torch.compile traces this
        try:
            if not weights:
                out = self.net(x)
                num = next(iter(values.values())).shape[0] if values else 1
                return out.unsqueeze(0).expand(num, *out.shape)
            if not self.batched_draws:
                return self._loop_draws(weights, x)
            return vmap(self.forward_single, in_dims=(0, None), randomness="different")(weights, x)
        finally:
            for module, was_training in changed:
                module.training = was_training

    def placed_input(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` on the model's device; floating inputs in the model's dtype (a float64 model takes float32 data)."""
        like = self.target_scale
        return x.to(like.device, like.dtype) if x.is_floating_point() else x.to(like.device)

    def latents_of(self, values: Mapping[str, torch.Tensor]) -> dict:
        return {n: values[n] for n in self._latent_priors}

    def log_likelihood(self, values, x, y, original_units: bool = False) -> torch.Tensor:
        """Pointwise log-likelihood ``[S, N]`` for draws ``values`` (``{site: [S, ...]}``): the
        likelihood's honest density (:meth:`~zoo.likelihoods.Likelihood.log_prob`, never a
        re-weighted training objective), so samplers target the true posterior.

        With ``original_units`` the regression targets ``y`` are in original units and the
        density is reported in those units.
        """
        f = self.forward_draws(values, x)
        kwargs = {}
        if original_units and self.likelihood.task == "regression":
            kwargs = {"target_loc": self.target_loc, "target_scale": self.target_scale}
        return self.likelihood.log_prob(f, y, self.latents_of(values), **kwargs)

    def log_prior(self, values) -> torch.Tensor:
        """Joint log prior density ``[S]`` of the draws."""
        total = 0.0
        for name, d in self.prior_distributions().items():
            total = total + d.log_prob(values[name])
        return total

    def log_joint(self, values, x, y, num_data: Optional[int] = None) -> torch.Tensor:
        """``[S]`` log p(w_s, θ) + (N/n) Σ_n log p(y_n | x_n, w_s, θ) in standardised units."""
        scale = (num_data or x.shape[0]) / x.shape[0]
        return self.log_prior(values) + scale * self.log_likelihood(values, x, y).sum(-1)

    def to_original_units(self, f: torch.Tensor) -> torch.Tensor:
        """Map standardised regression targets or predictive means ``[..., T]`` to original units."""
        if self.likelihood.task != "regression":
            return f
        return f * self.target_scale + self.target_loc

    def extra_repr(self) -> str:
        if not self.is_built:
            return (f"not built yet (output size and random sites come from the first inputs), prior={self.prior!r}, "
                    f"likelihood={self.likelihood!r}, train_deterministic={self.train_deterministic}")
        return (
            f"random sites={len(self.sites)} ({self.num_random} scalars), prior={self.prior!r}, "
            f"likelihood={self.likelihood!r}, train_deterministic={self.train_deterministic}"
            + (", draws evaluated one at a time (no vmap)" if self.batched_draws is False else "")
        )
