"""The Pyro-native view of a :class:`~zoo.bnn.BayesianNetwork` (Pyro: Bingham et al. 2019).

A ``BayesianNetwork`` is one model with two views:

* ``bnn.model(x, y, num_data)`` — a Pyro model *function* over the plain network ``bnn.net``:
  one sample site per random parameter (``"fc2.weight"``), the likelihood's latents
  (``"noise_precision"``) and the observed site ``"obs"`` in a subsampled ``"data"`` plate.
  Its trainable deterministic parameters are Pyro ``param`` statements
  (:func:`register_parameters`; names ``"net$$$fc1.weight"``, as ``pyro.module("net", bnn.net)``
  would give, kept in the network rather than the global parameter store), so stock
  ``pyro.infer.SVI`` trains them.
* :func:`to_pyro_module` — a :class:`~pyro.nn.PyroModule` *copy* of the network whose random
  parameters are :class:`~pyro.nn.PyroSample` attributes with the same priors and whose
  ``forward(x, y=None, num_data=None)`` runs the same likelihood: same sample sites, same
  log joint density.  Its trainable deterministic parameters are ordinary
  ``nn.Parameter``\\ s of the copy (Pyro names them ``"fc1.bias"``); frozen ones become buffers.

Element masks (:class:`~zoo.stochastic.ElementMasks`): a masked site samples only its free
entries, ``[n_free]``; a ``PyroSample`` attribute cannot be part random, part fixed, so the
module owning a masked parameter becomes a subclass whose attribute read of that parameter
scatters the sampled free entries into the fixed tensor (:meth:`StochasticSite.to_param`).
"""
from __future__ import annotations

import copy
import weakref
from typing import Optional

import pyro
import torch
from pyro.distributions import constraints
from pyro.nn import PyroModule, PyroSample
from pyro.nn.module import to_pyro_module_
from pyro.params.param_store import param_with_module_name
from pyro.poutine.runtime import effectful
from torch import nn

__all__ = ["register_parameters", "to_pyro_module", "pointwise_log_likelihood"]


def register_parameters(name: str, module: nn.Module) -> None:
    """Pyro ``param`` statements for the trainable parameters of ``module`` (``requires_grad``).

    Each is named ``name$$$<parameter name>`` (``pyro.module``'s convention) and its statement
    carries the module's own tensor, so every Pyro handler sees it and stock
    ``pyro.infer.SVI`` (which optimises the parameters its trace records) trains exactly the
    tensors the network computes with.  As Pyro's ``PyroModule`` does under the
    ``module_local_params`` setting, the parameters stay in the module, not in the global
    parameter store, whatever the setting:

    * ``pyro.get_param_store()`` does not list them (save and load the network's
      ``state_dict``); a stale store entry of the same name can never stand in for them, and
      fits by :mod:`inference` leave the global store alone;
    * parameters with ``requires_grad=False`` (random sites, frozen weights) are skipped
      silently, unlike ``pyro.module``, which warns;
    * nothing is written onto the module's tensors (the ``.unconstrained`` weak reference SVI
      reads goes on a view), so the module stays picklable.
    """
    for param_name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        full_name = param_with_module_name(name, param_name)
        alias = param.view_as(param)
        alias.unconstrained = weakref.ref(param)
        effectful(type="param")(lambda *_, **__: alias)(
            full_name, param, constraint=constraints.real, name=full_name
        )


class _SitePrior:
    """``PyroSample`` prior of one site, rebuilt from the site at each draw.

    Built on call, the distribution follows the site's tensors through ``.double()`` /
    ``.to(device)`` of the module (see :class:`_PyroBayesianNetwork`).
    """

    def __init__(self, prior, site):
        self.prior = prior
        self.site = site

    def __call__(self, module):
        return self.prior(self.site)


class _ScatterFreeEntries:
    """Mixin of a module owning element-masked sites: reading such a parameter attribute
    returns the full tensor, the sampled free entries ``[n_free]`` scattered into the fixed values."""

    prefix = "Masked"

    def __getattr__(self, name):
        value = super().__getattr__(name)
        masked = self.__dict__.get("_masked_sites")
        if masked is not None and name in masked:
            return masked[name].to_param(value)
        return value


class _PyroBayesianNetwork:
    """Mixin of the root module: the sample sites in ``bnn.model``'s order, then the likelihood."""

    prefix = "Bayesian"

    def forward(self, x: Optional[torch.Tensor] = None, y: Optional[torch.Tensor] = None,
                num_data: Optional[int] = None):
        """Sample the weights and latents; with ``x`` also run the network and observe ``y``.

        Args and return as :meth:`zoo.bnn.BayesianNetwork.model`: ``x [n, ...]``, ``y [n, O]``
        or ``[n]``, ``num_data`` the full data size (the likelihood is scaled by ``N / n``);
        returns the output ``[n, O]``, or ``None`` without ``x``.
        """
        for site in self._pyro_sites:
            owner_name, _, attr = site.name.rpartition(".")
            getattr(self.get_submodule(owner_name), attr)  # draws and caches the site for this call
        like = {"dtype": self._pyro_reference.dtype, "device": self._pyro_reference.device}
        priors = self._pyro_likelihood.latent_priors(self._pyro_target_dim, **like)
        latents = {name: pyro.sample(name, d) for name, d in priors.items()}
        if x is None:
            return None
        f = super().forward(x)
        n = f.shape[0]
        with pyro.plate("data", size=num_data or n, subsample_size=n):
            self._pyro_likelihood.observe(f, y, latents)
        return f

    @property
    def _pyro_reference(self) -> torch.Tensor:
        """A tensor with the network's dtype and device (a site's reference, or a parameter / buffer)."""
        if self._pyro_sites:
            return self._pyro_sites[0].reference
        return next(t for t in (*self.parameters(), *self.buffers()))

    def _apply(self, fn, *args, **kwargs):
        """``.double()``, ``.to(device)``, ...: convert the sites' tensors too (the priors follow)."""
        super()._apply(fn, *args, **kwargs)
        for site in self._pyro_sites:
            site.convert_(fn)
        return self


_SUBCLASSES: dict = {}


def _subclass(mixin: type, cls: type, original: type) -> type:
    """``class <mixin.prefix><cls name>(mixin, cls)``, one per ``(mixin, cls)``, with ``cls``'s metaclass.

    ``cls`` is ``PyroModule[original]``, possibly with mixins already; the class records how it is
    built (``original`` and its mixins), so copies and pickles of its instances rebuild it.
    """
    key = (mixin, cls)
    if key not in _SUBCLASSES:
        namespace = {"_zoo_original": original, "_zoo_mixins": getattr(cls, "_zoo_mixins", ()) + (mixin,),
                     "__reduce__": _reduce}
        _SUBCLASSES[key] = type(cls)(mixin.prefix + cls.__name__, (mixin, cls), namespace)
    return _SUBCLASSES[key]


def _reduce(module):
    """``copy`` / ``pickle`` support: rebuild the class from its recipe, then restore the state."""
    cls = type(module)
    return _rebuild, (cls._zoo_original, cls._zoo_mixins), module.__getstate__()


def _rebuild(original: type, mixins: tuple) -> nn.Module:
    """An empty instance of ``PyroModule[original]`` with ``mixins`` applied in order."""
    cls = PyroModule[original]
    for mixin in mixins:
        cls = _subclass(mixin, cls, original)
    return cls.__new__(cls)


def _check_convertible(net: nn.Module, names: set[str]) -> None:
    """Parameters of ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` cannot be sampled or made buffers."""
    for owner_name, owner in net.named_modules():
        if not isinstance(owner, nn.RNNBase):
            continue
        hits = sorted(n for n in names if n.rpartition(".")[0] == owner_name)
        if hits:
            raise NotImplementedError(
                f"to_pyro_module() cannot make {hits} of the {type(owner).__name__} {owner_name!r} random or "
                "frozen: PyTorch's fused recurrent layers read their weights from a private flat list "
                "(_flat_weights), not by attribute, so a PyroSample there would not reach the layer.  Use a "
                "step-by-step layer with the same parameter names (MultiLSTM(unrolled=True) / UnrolledLSTM), "
                "or the function view bnn.model"
            )


def to_pyro_module(bnn) -> PyroModule:
    """A :class:`~pyro.nn.PyroModule` copy of ``bnn.net`` with ``PyroSample`` priors on the random sites.

    Args:
        bnn: a :class:`~zoo.bnn.BayesianNetwork`; it is not modified (its network and sites are
            deep-copied).
    Returns:
        the converted copy (``pyro.nn.module.to_pyro_module_``); calling it as
        ``module(x, y=None, num_data=None)`` has the same sample sites (names and shapes) and
        the same log joint density as ``bnn.model(x, y, num_data)``, and returns the network
        output ``[n, O]``.  A random parameter ``w`` becomes ``PyroSample(prior)``; an
        element-masked one samples its free entries ``[n_free]`` and reads as the full tensor
        with the fixed entries held.  Trainable deterministic parameters stay
        ``nn.Parameter``\\ s (Pyro registers them as ``"fc1.bias"``; a stock ``pyro.infer.SVI``
        trains those of the copy, not ``bnn.net``); frozen ones
        (``train_deterministic=False``) become buffers, so SVI cannot move them.  The priors
        follow ``.double()`` / ``.to(device)`` of the copy; ``copy.deepcopy`` and ``pickle``
        rebuild its classes.
    Raises:
        NotImplementedError: a random or frozen parameter belongs to a fused ``nn.LSTM`` /
            ``nn.GRU`` / ``nn.RNN`` (see the message for what to use instead).
    """
    sites = copy.deepcopy(bnn.sites)
    frozen = {n for n, p in bnn.net.named_parameters() if not p.requires_grad} - {s.name for s in sites}
    _check_convertible(bnn.net, {s.name for s in sites} | frozen)
    net = copy.deepcopy(bnn.net)
    originals = {name: type(module) for name, module in net.named_modules()}
    to_pyro_module_(net)
    for name in sorted(frozen):
        owner_name, _, attr = name.rpartition(".")
        owner = net.get_submodule(owner_name)
        value = getattr(owner, attr).detach()
        delattr(owner, attr)
        owner.register_buffer(attr, value)
    for site in sites:
        owner_name, _, attr = site.name.rpartition(".")
        owner = net.get_submodule(owner_name)
        delattr(owner, attr)
        setattr(owner, attr, PyroSample(_SitePrior(bnn.prior, site)))
        if site.mask is not None:
            if not isinstance(owner, _ScatterFreeEntries):
                owner.__class__ = _subclass(_ScatterFreeEntries, type(owner), originals[owner_name])
                owner._masked_sites = {}
            owner._masked_sites[attr] = site
    net.__class__ = _subclass(_PyroBayesianNetwork, type(net), originals[""])
    net._pyro_sites = sites
    net._pyro_likelihood = bnn.likelihood
    net._pyro_target_dim = bnn.target_dim
    return net


def pointwise_log_likelihood(bnn, samples: dict, x: torch.Tensor, y: torch.Tensor) -> dict:
    """ArviZ's ``log_likelihood`` group for chains of draws of ``bnn.model``'s latent sites.

    ``az.from_pyro`` computes this group with a vectorised trace of the model, which a network
    evaluated one draw per call does not support (it then warns and leaves the group out);
    ``idata.add_groups(log_likelihood=pointwise_log_likelihood(bnn, mcmc.get_samples(group_by_chain=True), x, y))``
    adds it.

    Args:
        bnn: the :class:`~zoo.bnn.BayesianNetwork` whose ``model`` was sampled.
        samples: ``{site: [C, D, *site_shape]}`` (chains, draws), e.g. a stock
            ``pyro.infer.MCMC``'s ``get_samples(group_by_chain=True)``.
        x, y: the data the model was conditioned on (``y`` in the model's standardised units).
    Returns:
        ``{"obs": ndarray [C, D, N]}``: log p(y_n | x_n, draw), the density of the model's
        ``"obs"`` site per point.
    """
    names = [n for n in bnn.site_names if n in samples]
    if not names or set(bnn.site_names) - set(names):
        raise ValueError(f"samples must hold every latent site {bnn.site_names}, got {sorted(samples)}")
    chains, draws = samples[names[0]].shape[:2]
    flat = {n: samples[n].reshape(chains * draws, *samples[n].shape[2:]) for n in names}
    with torch.no_grad():
        loglik = bnn.log_likelihood(flat, x, y)
    return {"obs": loglik.reshape(chains, draws, -1).cpu().numpy()}
