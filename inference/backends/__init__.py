"""Inference backends behind one contract, and :func:`fit`.

``BACKENDS`` is the explicit registry ``name -> Backend``; each backend lives in its own
module (``svi.py``, ...).  Other modules add theirs with :func:`register_backend`.
"""
from __future__ import annotations

from .base import Backend, NonFiniteLossError, check_training_data, parse_config
from .svi import SVIBackend
from .hmc import HMCBackend, NUTSBackend
from .sgmcmc import CyclicalSGMCMCBackend, PSGLDBackend, SGHMCBackend, SGLDBackend
from .variational import GravesBackend, KingmaVDBackend, RadialBackend, SparseVDBackend, SVILRTBackend

__all__ = ["BACKENDS", "fit", "register_backend", "Backend", "NonFiniteLossError"]

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


def register_backend(backend: Backend) -> None:
    BACKENDS[backend.name] = backend


def get_backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; valid backends: {', '.join(BACKENDS)}") from None


def fit(bnn, x, y, backend: str = "svi", seed: int = 0, progress: bool = True, **options):
    """Infer the posterior of ``bnn``'s random sites given data ``(x, y)``.

    Args:
        bnn: a :class:`zoo.BayesianNetwork`.
        x: inputs ``[N, ...]`` (the network's input units, usually standardised).
        y: regression targets ``[N, O]`` in *standardised* units, or class labels ``[N]``.
        backend: a name in ``BACKENDS``.
        seed: fixes every random draw of the run.
        progress: show a tqdm progress bar.
        **options: the backend's options (see its ``Config``).
    Returns:
        a :class:`inference.Posterior`.
    """
    engine = get_backend(backend)
    config = parse_config(engine, options)
    x, y = check_training_data(bnn, x, y)
    return engine.run(bnn, x, y, config, int(seed), bool(progress))
