"""The two ways of estimating a step's ELBO, and the choice between them (option ``elbo_path``).

* ``"fused"`` — the guide's own ``elbo_terms(bnn, x, y, num_data)``
  (:meth:`inference.variational.guides.NormalGuide.elbo_terms`,
  :meth:`inference.variational.radial.AutoRadial.elbo_terms`): every site's noise drawn directly,
  the weights and the closed-form or Monte Carlo KL formed without Pyro traces (same guide,
  parameters, estimator and, for a seed, random numbers as the trace path);
* ``"pyro-trace"`` — :func:`inference.variational.fit.trace_particle`, through Pyro traces, for
  any guide and model.

``"auto"`` takes ``fused`` unless a *blocker* (a reason, e.g. from
:func:`inference.variational.guides.fused_elbo_blocker`) stands against it.  The chosen path and
the reason for the trace path are recorded in ``posterior.info`` (:func:`elbo_path_info`).
"""
from __future__ import annotations

from typing import Callable, Optional

import pyro

from inference.variational.fit import trace_particle
from inference.variational.guides import fused_elbo_blocker

__all__ = ["ELBO_PATHS", "check_elbo_path", "resolve_elbo_path", "choose_elbo_path", "elbo_path_info", "elbo_particle"]

#: ``auto`` picks ``fused`` where the model allows it, else ``pyro-trace``
ELBO_PATHS = ("auto", "fused", "pyro-trace")


def check_elbo_path(elbo_path: str) -> None:
    """A clear ``ValueError`` unless ``elbo_path`` is one of :data:`ELBO_PATHS`."""
    if elbo_path not in ELBO_PATHS:
        raise ValueError(f"unknown elbo_path {elbo_path!r}; valid: {', '.join(ELBO_PATHS)}")


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


def choose_elbo_path(bnn, config) -> tuple[str, Optional[str]]:
    """:func:`resolve_elbo_path` for the ``svi`` backend: ``config`` (an
    :class:`~inference.backends.svi.SVIConfig`) gives ``elbo_path`` and ``guide``; the blocker is
    :func:`inference.variational.guides.fused_elbo_blocker`."""
    return resolve_elbo_path(config.elbo_path, fused_elbo_blocker(bnn, config.guide))


def elbo_path_info(path: str, reason: Optional[str]) -> dict:
    """The ``posterior.info`` items of a resolved path: ``elbo_path``, and ``elbo_path_reason`` when given."""
    return {"elbo_path": path, **({"elbo_path_reason": reason} if reason else {})}


def elbo_particle(bnn, path: str) -> Callable:
    """``particle(guide, x_batch, y_batch, num_data) -> (expected_log_likelihood, kl)`` on ``path``
    (the argument of :func:`inference.variational.fit.fit_guide`)."""
    if path != "fused":
        return lambda guide, xb, yb, num_data: trace_particle(bnn, guide, xb, yb, num_data)

    def fused_particle(guide, xb, yb, num_data):
        with pyro.validation_enabled(False):  # as on the trace path: the data were checked once by fit()
            return guide.elbo_terms(bnn, xb, yb, num_data)

    return fused_particle
