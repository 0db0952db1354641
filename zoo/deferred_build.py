"""Building a :class:`~zoo.bnn.BayesianNetwork` from its first inputs: :class:`DeferredBuild`.

A network made without ``example_input`` or ``output_dim`` does not know its output size, hence
neither its number of targets, its random sites (``"last"`` follows the forward order the first
inputs show) nor its priors.  It stays *unbuilt* until :meth:`DeferredBuild.build` gets example
inputs — :func:`inference.fit` passes the training data's first rows, :meth:`~zoo.bnn.BayesianNetwork.model`
its ``x`` — and until then every attribute that needs the build raises :class:`UnbuiltNetworkError`,
which says how to build it.
"""
from __future__ import annotations

from torch import nn

from .checks import check_input

__all__ = ["DeferredBuild", "UnbuiltNetworkError", "BUILT_ATTRIBUTES"]

#: what a BayesianNetwork knows only once built (:meth:`DeferredBuild.build`)
BUILT_ATTRIBUTES = frozenset({"sites", "output_dim", "target_dim", "target_loc", "target_scale", "_site_by_name",
                              "_weight_priors", "_latent_priors", "site_names", "site_shapes", "num_random"})


class UnbuiltNetworkError(AttributeError):
    """What a :class:`~zoo.bnn.BayesianNetwork` made without ``example_input`` / ``output_dim`` does not know
    before its first inputs (an ``AttributeError``, so ``getattr(bnn, name, default)`` keeps working)."""


class DeferredBuild:
    """Mixin of :class:`~zoo.bnn.BayesianNetwork` (which sets ``_deferred`` — ``None`` once built, else the
    target scaling to build with — and defines ``_build(example_input, output_dim, target_loc, target_scale,
    sites)``)."""

    @property
    def is_built(self) -> bool:
        """Whether the output size, random sites and priors are known (``False`` until :meth:`build`
        for a network made without ``example_input`` or ``output_dim``)."""
        return self.__dict__.get("_deferred") is None

    def build(self, example_input, name: str = "example_input") -> "BayesianNetwork":
        """Complete a network made without ``example_input`` / ``output_dim`` from example inputs
        ``[n, ...]`` (their first two rows), as if they had been given as ``example_input``: the
        output size, the ``"last"`` layer in forward order, the random sites and their priors.
        :func:`inference.fit` calls it with the first rows of the training data, and :meth:`model`
        with its ``x``; a network that is already built is returned as it is.  ``name`` names the
        inputs in errors.  Returns ``self``."""
        if self._deferred is None:
            return self
        deferred = self._deferred
        example_input = check_input(self, example_input, name)[:2]
        param = next(self.net.parameters(), None)  # the inputs follow the network (e.g. after .double())
        if param is not None:
            floating = example_input.is_floating_point()
            example_input = example_input.to(param.device, param.dtype if floating else example_input.dtype)
        self._deferred = None
        try:
            self._build(example_input, None, *deferred, None)
        except BaseException:
            self._deferred = deferred  # still unbuilt: a later call may build it
            raise
        return self

    def __getattr__(self, name: str):
        """``nn.Module``'s lookup; on a network not yet built (:meth:`build`), what it lacks is named clearly."""
        if name in BUILT_ATTRIBUTES and self.__dict__.get("_deferred") is not None:
            raise UnbuiltNetworkError(
                f"{name} is not known yet: this BayesianNetwork was made without example_input or output_dim, "
                f"so its output size, random sites and priors come from the first inputs it sees. "
                f"fit(bnn, x, y, ...) builds it from x; or call bnn.build(x[:2]) (or pass example_input=x[:2] "
                f"to BayesianNetwork)")
        return nn.Module.__getattr__(self, name)  # (not super(): this runs on every submodule / buffer access)
