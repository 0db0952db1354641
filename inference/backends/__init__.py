"""The backends behind :func:`inference.fit`: one contract (:class:`~inference.backends.base.Backend`),
one module per backend, the explicit registry ``BACKENDS`` (``name -> Backend``).

A backend is a ``Config`` dataclass and a ``run`` that assembles the parts of its family folder
(``inference/optim``, ``variational``, ``laplace``, ``swag``, ``mcmc``, ``sgmcmc``, ``ensembles``,
``dropout``); no backend imports another (an import-linter contract).  Each declares what it can do on
itself (its stacked fit, the budget kind grids size it by, ...: :class:`~inference.backends.base.Backend`),
so this table is the one place that knows a backend by name.  Built-in and user backends alike are added
with :func:`register_backend` (docs/architecture.md).
"""
from __future__ import annotations

from inference.backends.base import BUDGETS, TASKS, Backend, NonFiniteLossError, parse_config
from inference.backends.deep_ensemble import DeepEnsembleBackend
from inference.backends.ensemble import EnsembleBackend
from inference.backends.hmc import HMCBackend, NUTSBackend
from inference.backends.laplace import LaplaceBackend
from inference.backends.map import MAPBackend
from inference.backends.mc_dropout import MCDropoutBackend
from inference.backends.sgmcmc import CyclicalSGMCMCBackend, PSGLDBackend, SGHMCBackend, SGLDBackend
from inference.backends.svi import SVIBackend
from inference.backends.swag import MultiSWAGBackend, SWAGBackend
from inference.backends.variational import GravesBackend, KingmaVDBackend, RadialBackend, SparseVDBackend, SVILRTBackend

__all__ = ["BACKENDS", "register_backend", "get_backend", "loader_backends", "stacked_backends", "parse_config",
           "Backend", "BUDGETS", "TASKS", "NonFiniteLossError"]


BACKENDS: dict[str, Backend] = {}
"""Registered backends by name (:func:`register_backend`), in registration order."""


def register_backend(backend: Backend, replace: bool = False) -> Backend:
    """Add ``backend`` (an instance; it carries its ``name`` and declares its capabilities,
    :class:`~inference.backends.base.Backend`) to :data:`BACKENDS`; ``ValueError`` if the name is taken
    (unless ``replace``).  Returns it."""
    if not backend.name:
        raise ValueError(f"{type(backend).__name__} has no name")
    if backend.name in BACKENDS and not replace:
        raise ValueError(f"backend {backend.name!r} is already registered")
    if backend.budget not in BUDGETS:
        raise ValueError(f"backend {backend.name!r} declares budget {backend.budget!r}; valid: {', '.join(BUDGETS)}")
    BACKENDS[backend.name] = backend
    return backend


def get_backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown backend {name!r}; valid backends: {', '.join(BACKENDS)}") from None


def loader_backends() -> list[str]:
    """Names of the backends that accept a ``DataLoader`` in :func:`inference.fit`."""
    return [name for name, engine in BACKENDS.items() if engine.accepts_loader]


def stacked_backends() -> list[str]:
    """Names of the backends with a stacked engine (:attr:`~inference.backends.base.Backend.fit_stacked`)."""
    return [name for name, engine in BACKENDS.items() if engine.fit_stacked is not None]


register_backend(SVIBackend())
register_backend(HMCBackend())
register_backend(NUTSBackend())
register_backend(SGLDBackend())
register_backend(PSGLDBackend())
register_backend(SGHMCBackend())
register_backend(CyclicalSGMCMCBackend())
register_backend(SVILRTBackend())
register_backend(GravesBackend())
register_backend(SparseVDBackend())
register_backend(KingmaVDBackend())
register_backend(RadialBackend())
register_backend(LaplaceBackend())
register_backend(SWAGBackend())
register_backend(MultiSWAGBackend())
register_backend(MAPBackend())
register_backend(EnsembleBackend())
register_backend(MCDropoutBackend())
register_backend(DeepEnsembleBackend())
