"""The backends behind :func:`inference.fit`: one contract (:class:`~inference.backends.base.Backend`),
one module per backend, the explicit registry ``BACKENDS`` (``name -> Backend``).

A backend is a ``Config`` dataclass and a ``run`` that assembles the parts of its family folder
(``inference/optim``, ``variational``, ``laplace``, ``swag``, ``mcmc``, ``sgmcmc``, ``ensembles``,
``dropout``); no backend imports another (an import-linter contract).  Other modules add theirs with
:func:`register_backend` (docs/architecture.md).
"""
from __future__ import annotations

from inference.backends.base import Backend, NonFiniteLossError, parse_config
from inference.backends.svi import SVIBackend
from inference.backends.hmc import HMCBackend, NUTSBackend
from inference.backends.sgmcmc import CyclicalSGMCMCBackend, PSGLDBackend, SGHMCBackend, SGLDBackend
from inference.backends.laplace import LaplaceBackend
from inference.backends.swag import MultiSWAGBackend, SWAGBackend
from inference.backends.variational import GravesBackend, KingmaVDBackend, RadialBackend, SparseVDBackend, SVILRTBackend
from inference.backends.map import MAPBackend
from inference.backends.ensemble import EnsembleBackend
from inference.backends.mc_dropout import MCDropoutBackend

__all__ = ["BACKENDS", "register_backend", "get_backend", "loader_backends", "parse_config", "Backend", "NonFiniteLossError"]


BACKENDS: dict[str, Backend] = {"svi": SVIBackend()}
BACKENDS["hmc"] = HMCBackend()
BACKENDS["nuts"] = NUTSBackend()
BACKENDS["sgld"] = SGLDBackend()
BACKENDS["psgld"] = PSGLDBackend()
BACKENDS["sghmc"] = SGHMCBackend()
BACKENDS["csgmcmc"] = CyclicalSGMCMCBackend()
BACKENDS["svi-lrt"] = SVILRTBackend()
BACKENDS["graves"] = GravesBackend()
BACKENDS["sparse-vd"] = SparseVDBackend()
BACKENDS["kingma-vd"] = KingmaVDBackend()
BACKENDS["radial"] = RadialBackend()
BACKENDS["laplace"] = LaplaceBackend()
BACKENDS["swag"] = SWAGBackend()
BACKENDS["multiswag"] = MultiSWAGBackend()
BACKENDS["map"] = MAPBackend()
BACKENDS["ensemble"] = EnsembleBackend()
BACKENDS["mc-dropout"] = MCDropoutBackend()
BACKENDS["deep-ensemble"] = __import__("inference.backends.deep_ensemble", fromlist=["_"]).DeepEnsembleBackend()


def register_backend(backend: Backend) -> None:
    BACKENDS[backend.name] = backend


def get_backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; valid backends: {', '.join(BACKENDS)}") from None


def loader_backends() -> list[str]:
    """Names of the backends that accept a ``DataLoader`` in :func:`inference.fit`."""
    return [name for name, engine in BACKENDS.items() if engine.accepts_loader]
