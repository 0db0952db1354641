"""Variational families (Pyro guides) over a :class:`~zoo.bnn.BayesianNetwork`'s sites.

Guides are built *and set up* at construction — their parameters exist before the first
SVI step — so ``state_dict`` / ``load_state_dict`` always work (unlike lazily built
guides).  ``GUIDES`` maps a name to a builder ``(bnn, init_values, **kwargs) -> guide``.
:class:`NormalGuide` (the ``svi`` backend's default) also has a fused training path,
:meth:`NormalGuide.elbo_terms`, used where :func:`fused_elbo_blocker` finds nothing against it.
Every guide follows :class:`~inference.variational.protocol.VariationalGuide`.  The Pyro-module
guides (:class:`NormalGuide`, :class:`~inference.variational.AutoRadial`) keep their parameters
in the module (Pyro's module-local parameter mode, switched on for their construction and calls
only), so several fitted posteriors live in one process without sharing Pyro's global parameter
store, and importing this package changes no Pyro setting.
"""
from __future__ import annotations

from operator import attrgetter
from typing import Callable, Mapping, Optional

import torch
from pyro.infer.autoguide import AutoNormal
from pyro.infer.autoguide.initialization import init_to_median, init_to_value

from zoo.bnn import BayesianNetwork

from inference.variational.elbo import NormalFactor, mean_field_normal_elbo_terms
from inference.variational.latents import is_real_support, normal_prior_params
from inference.variational.meanfield import build_mean_field_guide
from inference.variational.protocol import ModuleLocalParams
from inference.variational.radial import build_radial_guide

__all__ = ["GUIDES", "EmptyGuide", "NormalGuide", "build_guide", "register_guide", "fused_elbo_blocker", "stock_model_blocker",
           "normal_prior_blocker"]


class NormalGuide(ModuleLocalParams, AutoNormal):
    """Pyro's mean-field Normal ``AutoNormal`` as a :class:`~inference.variational.protocol.VariationalGuide`.

    Its sites are the model's real-valued latent sites (the weights), with location and scale
    read from the public ``locs`` / ``scales`` parameters.  It defines no pruning rule.

    Training can bypass Pyro's traces through :meth:`elbo_terms` (same parameters, same
    estimator); prediction and saving use the guide as a Pyro guide as usual.
    """

    def sites(self) -> list[str]:
        if self.prototype_trace is None:
            return []
        return [name for name, site in self.prototype_trace.iter_stochastic_nodes() if is_real_support(site["fn"].support)]

    def site_loc_scale(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(μ, σ)`` of real-valued site ``name``, detached."""
        if name not in self.sites():
            raise KeyError(f"{name!r} is not a real-valued site of this guide; its sites: {', '.join(self.sites())}")
        with torch.no_grad():
            return attrgetter(name)(self.locs).detach(), attrgetter(name)(self.scales).detach()

    def pruning_rule(self) -> None:
        return None

    def elbo_terms(self, bnn: BayesianNetwork, x, y, num_data: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One-draw ``(E_q[(N/n) Σ log p(y|x,w)], KL(q‖p))`` on a minibatch, without Pyro traces.

        Valid only where :func:`fused_elbo_blocker` returns ``None`` for ``bnn``; computed by
        :func:`inference.variational.elbo.mean_field_normal_elbo_terms` from this guide's own parameters
        (μ = ``locs.<site>``, σ = softplus of the unconstrained ``scales.<site>``), so gradients
        flow into them and into the network's deterministic parameters.

        Args:
            bnn: the model this guide was built for.
            x, y: minibatch ``[n, ...]``, targets as for :func:`inference.fit`.
            num_data: ``N``, the full data size.
        Returns:
            scalars with gradients: the scaled expected log-likelihood and the total KL (weights:
            closed form; likelihood latents: one-sample Monte Carlo, as on Pyro's path).
        """
        priors = self._normal_priors(bnn)
        factors, latents = {}, {}
        for name, loc, raw in self._site_parameters():
            if name in priors:
                factors[name] = NormalFactor(loc, raw, *priors[name])
            else:
                latents[name] = (loc, raw)
        terms = mean_field_normal_elbo_terms(bnn, factors, latents, x, y, num_data)
        return terms.expected_log_likelihood, terms.kl

    def _site_parameters(self) -> list:
        """``[(site, loc, raw_scale)]`` in the prototype trace's order: the unconstrained ``locs`` /
        ``scales`` parameters, looked up once per set-up guide (not by a ``named_parameters`` walk
        on every training step)."""
        cached = self.__dict__.get("_site_parameter_cache")
        if cached is None or cached[0] is not self.prototype_trace:
            params = dict(self.named_parameters())
            sites = [(name, params[f"locs.{name}_unconstrained"], params[f"scales.{name}_unconstrained"])
                     for name, _ in self.prototype_trace.iter_stochastic_nodes()]
            self.__dict__["_site_parameter_cache"] = cached = (self.prototype_trace, sites)
        return cached[1]

    def _normal_priors(self, bnn: BayesianNetwork) -> dict:
        """``{weight site: (m, s)}`` of the model's Normal priors, cached while the priors are unchanged."""
        distributions = bnn.prior_distributions()
        weights = [site.name for site in bnn.sites]
        cached = self.__dict__.get("_prior_cache")
        if cached is None or any(cached[0].get(n) is not distributions[n] for n in weights):
            params = {n: normal_prior_params(distributions[n], n) for n in weights}
            self.__dict__["_prior_cache"] = cached = ({n: distributions[n] for n in weights}, params)
        return cached[1]


def stock_model_blocker(bnn: BayesianNetwork) -> Optional[str]:
    """Why ``bnn``'s Pyro program is not the stock :meth:`~zoo.bnn.BayesianNetwork.model` with latent
    sites (which every fused ELBO path reproduces), or ``None`` when it is."""
    if not bnn.site_names:
        return "the model has no latent sites"
    if type(bnn).model is not BayesianNetwork.model:
        return f"{type(bnn).__name__} overrides the Pyro model"
    return None


def fused_elbo_blocker(bnn: BayesianNetwork, guide_name: str) -> Optional[str]:
    """Why guide ``guide_name`` on ``bnn`` cannot use the fused ELBO path, or ``None`` when it can.

    The fused path (:meth:`NormalGuide.elbo_terms`) needs Pyro's mean-field ``AutoNormal``
    (guide ``"normal"``, as registered here), a model whose Pyro program is the stock
    :meth:`~zoo.bnn.BayesianNetwork.model` with at least one latent site, and a Normal prior
    (``NormalPrior``, ``FanInNormalPrior``, ``PretrainedNormalPrior``) on every random weight
    site, so that every weight KL has the closed form.  Likelihood latents (e.g. the noise
    precision) may have any prior.  Everything else — another guide, a Laplace or Student-t
    weight prior (Monte Carlo KL), an overridden model — trains through Pyro traces.
    """
    if guide_name != "normal" or GUIDES.get("normal") is not _autonormal:
        return f"guide {guide_name!r} is not the built-in mean-field Normal (AutoNormal) guide"
    blocker = stock_model_blocker(bnn)
    if blocker is not None:
        return blocker
    blocker = normal_prior_blocker(bnn)
    return None if blocker is None else f"{blocker} (no closed-form KL against a Normal guide)"


def normal_prior_blocker(bnn: BayesianNetwork) -> Optional[str]:
    """``"site 'name' has a Laplace prior"`` for the first random weight site without a Normal prior
    (:func:`~inference.variational.latents.normal_prior_params`), or ``None`` when every one has one."""
    distributions = bnn.prior_distributions()
    for site in bnn.sites:
        try:
            normal_prior_params(distributions[site.name], site.name)
        except ValueError:
            base = distributions[site.name]
            while hasattr(base, "base_dist"):
                base = base.base_dist
            return f"site {site.name!r} has a {type(base).__name__} prior"
    return None


def _autonormal(bnn: BayesianNetwork, init_values: Mapping[str, torch.Tensor], init_scale: float = 1e-3) -> NormalGuide:
    """Mean-field Normal guide (:class:`NormalGuide`) with locs at ``init_values``.

    ``init_values`` may hold the likelihood latents too (pretraining fits them; their locs are then
    ``T⁻¹(value)`` in the unconstrained space); a site without one starts at its prior median.
    """
    if not (init_scale > 0):
        raise ValueError(f"init_scale must be positive, got {init_scale}")
    return NormalGuide(
        bnn.model,
        init_loc_fn=init_to_value(values=dict(init_values), fallback=init_to_median),
        init_scale=float(init_scale),
    )


class EmptyGuide(torch.nn.Module):
    """Guide of a model with no latent sites (the deterministic baseline): samples nothing."""

    def forward(self, *args, **kwargs):
        return {}

    def sites(self) -> list[str]:
        return []

    def site_loc_scale(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        raise KeyError(f"{name!r}: the model has no latent sites")

    def pruning_rule(self) -> None:
        return None


GUIDES: dict[str, Callable] = {"normal": _autonormal}
GUIDES["mean-field"] = build_mean_field_guide  # Graves / sparse VD / Kingma VD families
GUIDES["radial"] = build_radial_guide  # Radial AutoGuide (Farquhar, Osborne & Gal 2020)


def register_guide(name: str, builder: Callable) -> None:
    """Add a guide builder ``(bnn, init_values, **kwargs) -> guide`` to the registry.

    The guide should follow :class:`~inference.variational.protocol.VariationalGuide`; a
    ``PyroModule`` guide should mix in :class:`~inference.variational.protocol.ModuleLocalParams`.
    """
    GUIDES[name] = builder


def build_guide(name: str, bnn: BayesianNetwork, init_values: Optional[Mapping[str, torch.Tensor]] = None, **kwargs):
    """Build guide ``name`` for ``bnn`` and create all its parameters now."""
    try:
        builder = GUIDES[name]
    except KeyError:
        raise ValueError(f"unknown guide {name!r}; valid guides: {', '.join(GUIDES)}") from None
    if not bnn.site_names:
        return EmptyGuide()
    guide = builder(bnn, init_values if init_values is not None else bnn.initial_values(), **kwargs)
    guide()  # set up every parameter now (prototype trace of the weight sites only)
    return guide
