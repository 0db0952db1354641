"""Portable save / load of posteriors: plain tensors and a JSON manifest, no pickled objects.

:meth:`Posterior.save(dir) <inference.posterior.Posterior.save>` writes

* ``posterior.json`` — the manifest: format, posterior ``kind`` and its JSON state (e.g. the
  guide's name and options), the network's spec (:mod:`inference.net_spec`), the random
  sites' layout (names, parameter shapes, fan-in, which are masked), the prior and likelihood
  (class and arguments) and the :class:`~zoo.bnn.BayesianNetwork` settings (including the
  modules kept in training mode at prediction, ``active_at_prediction``, e.g. MC dropout's);
* ``posterior.pt`` — a plain dict of tensors (``torch.save``; read back with
  ``weights_only=True``): the network's ``state_dict``, the sites' reference / mask /
  fixed-value tensors, the target scaling and the posterior's own tensors (draws, guide state);
* ``info.json`` — the fit's record (``posterior.info``).

:func:`load_posterior` rebuilds the network from its spec — a zoo architecture, a
``torch.nn`` layer or a ``Sequential`` of them — or takes it from ``net=`` (a class defined in
a notebook or script has no spec: the error says to pass ``net=YourNet(...)``).  Each posterior
class says what it stores through ``_state()`` / ``_from_state()`` and is found by its ``kind``
in :data:`POSTERIOR_KINDS` (a subclass that sets its own ``kind`` registers itself).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from zoo.bnn import BayesianNetwork
from zoo.likelihoods import LIKELIHOODS
from zoo.priors import PRIORS
from zoo.stochastic import StochasticSite

from .net_spec import build_net, describe_spec, net_spec

__all__ = ["save_posterior", "load_posterior", "POSTERIOR_KINDS", "register_kind", "to_jsonable", "FORMAT"]

FORMAT = "bnn-zoo-posterior/1"
MANIFEST, TENSORS, INFO = "posterior.json", "posterior.pt", "info.json"

#: posterior ``kind`` -> class with ``_from_state(bnn, meta, tensors, info)``
POSTERIOR_KINDS: dict = {}


def register_kind(cls) -> None:
    """Make ``cls`` (a Posterior class with its own ``kind``) loadable by :func:`load_posterior`."""
    POSTERIOR_KINDS[cls.kind] = cls


def _component_spec(obj, registry: dict) -> dict:
    """``{"class", "args"}`` of a prior / likelihood of the zoo (its attributes are its arguments)."""
    cls = type(obj)
    args = dict(vars(obj))
    if cls in registry.values() and _is_json(args):
        return {"class": cls.__name__, "args": args}
    return {"user": f"{cls.__module__}.{cls.__qualname__}", "repr": repr(obj)}


def _build_component(spec: dict, registry: dict, what: str, given, directory):
    if given is not None:
        return given
    if "user" in spec:
        name = spec["user"].rpartition(".")[2]
        raise ValueError(f"the saved {what} is a {name} ({spec['user']}: {spec['repr']}), which this library cannot "
                         f"rebuild; pass it: load_posterior({str(directory)!r}, {what}={name}(...))")
    by_name = {cls.__name__: cls for cls in registry.values()}
    return by_name[spec["class"]](**spec["args"])


def _is_json(obj) -> bool:
    try:
        json.dumps(obj, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def save_posterior(posterior, directory) -> Path:
    """Write ``posterior`` to ``directory`` (created if needed); see the module docstring."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    bnn = posterior.bnn
    meta, tensors = posterior._state()
    if not _is_json(meta):
        raise ValueError(f"{type(posterior).__name__} state {meta!r} is not JSON-serialisable; options of a saved "
                         f"posterior must be numbers, strings, booleans, None, lists or dicts")
    manifest = {
        "format": FORMAT,
        "kind": posterior.kind,
        "posterior": meta,
        "network": net_spec(bnn.net),
        "sites": [{"name": s.name, "param_shape": list(s.param_shape), "fan_in": int(s.fan_in),
                   "masked": s.mask is not None} for s in bnn.sites],
        "prior": _component_spec(bnn.prior, PRIORS),
        "likelihood": _component_spec(bnn.likelihood, LIKELIHOODS),
        "train_deterministic": bool(bnn.train_deterministic),
        "output_dim": int(bnn.output_dim),
        "active_at_prediction": list(getattr(bnn, "active_at_prediction", ())),
    }
    sites = {}
    for s in bnn.sites:
        sites[s.name] = {"reference": s.reference}
        if s.mask is not None:
            sites[s.name].update(mask=s.mask, fixed_value=s.fixed_value)
    payload = {
        "net": bnn.net.state_dict(),
        "buffers": {"target_loc": bnn.target_loc, "target_scale": bnn.target_scale},
        "sites": sites,
        "posterior": tensors,
    }
    torch.save(payload, directory / TENSORS)
    _write_json(directory / MANIFEST, manifest)
    _write_json(directory / INFO, to_jsonable(posterior.info))
    return directory


def load_posterior(directory, net: Optional[nn.Module] = None, prior=None, likelihood=None):
    """Load a posterior written by :meth:`Posterior.save`; same predictions for the same seed.

    Args:
        directory: the folder ``save`` wrote.
        net: an instance of the network's class (any weights: the saved ones are loaded into
            it).  Needed when the network is not a zoo architecture, a ``torch.nn`` layer or a
            ``Sequential`` of them, e.g. a class defined in a notebook.
        prior, likelihood: instances for a prior / likelihood class outside the zoo.
    Raises:
        FileNotFoundError: no saved posterior in ``directory``.
        ValueError: the network (prior, likelihood) cannot be rebuilt and was not given, or
            ``net`` does not match the saved parameters.
    """
    directory = Path(directory)
    if not (directory / MANIFEST).exists():
        if (directory / TENSORS).exists():
            raise ValueError(f"{directory} holds a posterior saved by an older version of this library (a pickled "
                             f"posterior.pt, no {MANIFEST}); refit it and save it again")
        raise FileNotFoundError(f"no saved posterior at {directory / MANIFEST}; expected a directory written by "
                                f"Posterior.save()")
    with open(directory / MANIFEST) as fh:
        manifest = json.load(fh)
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{directory / MANIFEST} has format {manifest.get('format')!r}; this library reads {FORMAT!r}")
    try:
        cls = POSTERIOR_KINDS[manifest["kind"]]
    except KeyError:
        raise ValueError(f"unknown posterior kind {manifest['kind']!r}; known: {', '.join(POSTERIOR_KINDS)}") from None
    payload = torch.load(directory / TENSORS, weights_only=True, map_location="cpu")  # a GPU-fitted posterior loads anywhere; move it with .to()
    net = _network(manifest["network"], payload["net"], net, directory)
    sites = []
    for record in manifest["sites"]:
        stored = payload["sites"][record["name"]]
        sites.append(StochasticSite(record["name"], torch.Size(record["param_shape"]), stored.get("mask"),
                                    stored.get("fixed_value"), stored["reference"], record["fan_in"]))
    bnn = BayesianNetwork(
        net,
        prior=_build_component(manifest["prior"], PRIORS, "prior", prior, directory),
        likelihood=_build_component(manifest["likelihood"], LIKELIHOODS, "likelihood", likelihood, directory),
        train_deterministic=manifest["train_deterministic"],
        output_dim=manifest["output_dim"],
        sites=sites,
    )
    for name, value in payload["buffers"].items():  # dtype and values exactly as saved
        setattr(bnn, name, value)
    if manifest["active_at_prediction"]:
        bnn.active_at_prediction = tuple(manifest["active_at_prediction"])
    with open(directory / INFO) as fh:
        info = json.load(fh)
    return cls._from_state(bnn, manifest["posterior"], payload["posterior"], info)


def _network(spec: dict, state: dict, net: Optional[nn.Module], directory: Path) -> nn.Module:
    """The saved network: rebuilt from ``spec`` or ``net``, with the saved ``state`` (dtypes kept)."""
    if net is None:
        try:
            net = build_net(spec)
        except ValueError as err:
            cls = spec["user"].rpartition(".")[2] if "user" in spec else "YourNet"
            raise ValueError(f"cannot load the posterior's network: {err}. Pass an instance of it: "
                             f"load_posterior({str(directory)!r}, net={cls}(...)) — its weights are replaced by "
                             f"the saved ones") from None
    elif not isinstance(net, nn.Module):
        raise ValueError(f"net must be a torch.nn.Module instance, got {type(net).__name__}")
    own = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    saved = {k: tuple(v.shape) for k, v in state.items()}
    if own != saved:
        problems = [f"missing {sorted(set(saved) - set(own))}" if set(saved) - set(own) else "",
                    f"unexpected {sorted(set(own) - set(saved))}" if set(own) - set(saved) else ""]
        problems += [f"{k!r} has shape {own[k]}, saved {saved[k]}" for k in sorted(set(own) & set(saved))
                     if own[k] != saved[k]]
        raise ValueError(f"net= does not match the saved network ({describe_spec(spec)}): "
                         + "; ".join(p for p in problems if p))
    net.load_state_dict(state, assign=True)
    return net


def _write_json(path: Path, obj) -> None:
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=2)


def to_jsonable(obj):
    """``obj`` with tensors as lists, non-finite floats as ``None`` and other objects as their ``repr``."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return repr(obj)
