"""Portable save / load of posteriors: plain tensors and a JSON manifest, no pickled objects.

:meth:`Posterior.save(dir) <inference.posterior.Posterior.save>` writes

* ``posterior.json`` — the manifest: format, posterior ``kind`` and its JSON state (e.g. the
  guide's name and options), the network's spec (:mod:`inference.storage.net_spec`), the random
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

from inference.storage.net_spec import build_net, describe_spec, net_spec
from inference.storage.save_files import FORMAT, INFO, MANIFEST, TENSORS, MissingSaveError, SaveFileError, check_manifest, check_tensor, \
    read_json, read_tensors, rebuild

__all__ = ["save_posterior", "load_posterior", "SaveFileError", "MissingSaveError", "POSTERIOR_KINDS", "register_kind",
           "to_jsonable", "FORMAT"]


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
    path = directory / MANIFEST
    if "user" in spec:
        name = str(spec["user"]).rpartition(".")[2]
        raise SaveFileError(f"the saved {what} is a {name} ({spec['user']}: {spec.get('repr', '?')}), which this "
                            f"library cannot rebuild; pass it: load_posterior({str(directory)!r}, {what}={name}(...))")
    by_name = {cls.__name__: cls for cls in registry.values()}
    name, args = spec.get("class"), spec.get("args")
    if not isinstance(name, str) or name not in by_name:
        raise SaveFileError(f"{path}: unknown {what} class {name!r}; this library has {', '.join(sorted(by_name))}")
    if not isinstance(args, dict):
        raise SaveFileError(f"{path}: the {what}'s 'args' is {args!r:.80}; expected a JSON object of arguments")
    return rebuild(path, f"the {what} {name}(**{args!r:.120})", lambda: by_name[name](**args))


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

    The folder is read as untrusted data: its three files must be regular files inside it (a
    symbolic link out of the folder is refused), ``posterior.pt`` is read with
    ``torch.load(weights_only=True)`` only (tensors, numbers, strings, lists, dicts; never
    pickled objects), and every entry of the manifest and the tensor file is checked before it
    is used: what is missing, renamed, of the wrong type or shape, or unknown to this library is
    a :class:`SaveFileError` naming the file and the entry.

    Args:
        directory: the folder ``save`` wrote.
        net: an instance of the network's class (any weights: the saved ones are loaded into
            it).  Needed when the network is not a zoo architecture, a ``torch.nn`` layer or a
            ``Sequential`` of them, e.g. a class defined in a notebook.
        prior, likelihood: instances for a prior / likelihood class outside the zoo.
    Raises:
        MissingSaveError: no saved posterior in ``directory`` (a :class:`SaveFileError` and a
            ``FileNotFoundError``).
        SaveFileError: (a ``ValueError``) the save is damaged, edited, of another format
            version, or its network (prior, likelihood) cannot be rebuilt and was not given, or
            ``net`` does not match the saved parameters.
    """
    directory = Path(directory)
    manifest_path = directory / MANIFEST
    if not (manifest_path.exists() or manifest_path.is_symlink()):
        if (directory / TENSORS).exists():
            raise SaveFileError(f"{directory} holds a posterior saved by an older version of this library (a pickled "
                                f"posterior.pt, no {MANIFEST}); refit it and save it again")
        raise MissingSaveError(f"no saved posterior at {manifest_path}; expected a directory written by "
                               f"Posterior.save()")
    manifest = read_json(directory, MANIFEST)
    check_manifest(manifest, manifest_path, POSTERIOR_KINDS)
    cls = POSTERIOR_KINDS[manifest["kind"]]
    payload = read_tensors(directory)
    net = _network(manifest["network"], payload["net"], net, directory)
    sites = _sites(manifest["sites"], payload["sites"], net, directory)
    bnn = rebuild(manifest_path, "the BayesianNetwork", lambda: BayesianNetwork(
        net,
        prior=_build_component(manifest["prior"], PRIORS, "prior", prior, directory),
        likelihood=_build_component(manifest["likelihood"], LIKELIHOODS, "likelihood", likelihood, directory),
        train_deterministic=manifest["train_deterministic"],
        output_dim=manifest["output_dim"],
        sites=sites,
    ))
    for name, value in payload["buffers"].items():  # dtype and values exactly as saved
        if value.shape != (bnn.target_dim,) or (name == "target_scale" and not bool((value > 0).all())):
            raise SaveFileError(f"{directory / TENSORS}: buffers[{name!r}] has shape {tuple(value.shape)}"
                                f"{'' if name == 'target_loc' else ' or entries <= 0'}; the model has "
                                f"{bnn.target_dim} target(s)")
        setattr(bnn, name, value)
    for name in manifest["active_at_prediction"]:
        rebuild(manifest_path, f"active_at_prediction entry {name!r}", lambda: net.get_submodule(name))
    if manifest["active_at_prediction"]:
        bnn.active_at_prediction = tuple(manifest["active_at_prediction"])
    info = read_json(directory, INFO)
    state = f"the {manifest['kind']!r} posterior's state ('posterior' of {MANIFEST} and {TENSORS})"
    posterior = rebuild(directory, state, lambda: cls._from_state(bnn, manifest["posterior"], payload["posterior"], info))
    _check_draw(posterior, directory)
    return posterior


def _sites(records: list, stored: dict, net: nn.Module, directory: Path) -> list:
    """The random sites of the manifest, each checked against the network and the saved tensors."""
    params = dict(net.named_parameters())
    sites = []
    for record in records:
        name, shape = record["name"], tuple(record["param_shape"])
        if name not in params or tuple(params[name].shape) != shape:
            found = f"shape {tuple(params[name].shape)}" if name in params else "no such parameter"
            raise SaveFileError(f"{directory / MANIFEST}: site {name!r} of shape {shape} does not match the network "
                                f"({found})")
        tensors = stored.get(name)
        if not isinstance(tensors, dict):
            raise SaveFileError(f"{directory / TENSORS} has no tensors for site {name!r}")
        check_tensor(tensors.get("reference"), f"sites[{name!r}]['reference']", directory / TENSORS, shape)
        if record["masked"]:
            for key in ("mask", "fixed_value"):
                check_tensor(tensors.get(key), f"sites[{name!r}][{key!r}]", directory / TENSORS, shape)
            if tensors["mask"].dtype != torch.bool:
                raise SaveFileError(f"{directory / TENSORS}: sites[{name!r}]['mask'] has dtype "
                                    f"{tensors['mask'].dtype}; expected torch.bool")
        sites.append(StochasticSite(name, torch.Size(shape), tensors.get("mask") if record["masked"] else None,
                                    tensors.get("fixed_value") if record["masked"] else None,
                                    tensors["reference"], record["fan_in"]))
    return sites


def _check_draw(posterior, directory: Path) -> None:
    """One draw of the loaded posterior: every site present, site-shaped and finite (the global RNG kept)."""
    bnn = posterior.bnn
    with torch.random.fork_rng(devices=[]):
        draw = rebuild(directory / TENSORS, "a draw of the posterior", lambda: posterior.sample_params(1, seed=0))
    expected = {name: (1, *shape) for name, shape in bnn.site_shapes.items()}
    got = {name: tuple(value.shape) for name, value in draw.items()}
    if any(got.get(name) != shape for name, shape in expected.items()):  # SWAG adds batch-norm statistics
        raise SaveFileError(f"{directory / TENSORS}: the posterior's draws have sites {got}; the model has "
                            f"{expected}: the save is damaged or was edited")
    bad = sorted(name for name, value in draw.items()
                 if value.is_floating_point() and not bool(torch.isfinite(value).all()))
    if bad:
        raise SaveFileError(f"{directory / TENSORS}: the posterior draws NaN or infinite values at {bad}")


def _network(spec: dict, state: dict, net: Optional[nn.Module], directory: Path) -> nn.Module:
    """The saved network: rebuilt from ``spec`` or ``net``, with the saved ``state`` (dtypes kept)."""
    manifest = directory / MANIFEST
    given = net is not None
    if net is None:
        if "user" in spec:
            cls = str(spec["user"]).rpartition(".")[2]
            raise SaveFileError(f"cannot load the posterior's network: it is {describe_spec(spec)}, which this library "
                                f"cannot rebuild. Pass an instance of it: load_posterior({str(directory)!r}, "
                                f"net={cls}(...)) — its weights are replaced by the saved ones")
        try:  # its layout first, on the meta device (no memory): a spec edited to an absurd size allocates nothing
            with torch.device("meta"):
                shell = build_net(spec)
        except Exception:  # noqa: BLE001 - a spec that fails here fails again below, with its reason
            shell = None
        if shell is not None:
            _compare_layout(shell, state, spec, directory, given=False)
        net = rebuild(manifest, "the network", lambda: build_net(spec))
    elif not isinstance(net, nn.Module):
        raise ValueError(f"net must be a torch.nn.Module instance, got {type(net).__name__}")
    _compare_layout(net, state, spec, directory, given)
    net.load_state_dict(state, assign=True)
    return net


def _compare_layout(net: nn.Module, state: dict, spec: dict, directory: Path, given: bool) -> None:
    """``net``'s state-dict names and shapes against the saved ``state``'s."""
    own = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    saved = {k: tuple(v.shape) for k, v in state.items()}
    if own != saved:
        problems = [f"missing {sorted(set(saved) - set(own))}" if set(saved) - set(own) else "",
                    f"unexpected {sorted(set(own) - set(saved))}" if set(own) - set(saved) else ""]
        problems += [f"{k!r} has shape {own[k]}, saved {saved[k]}" for k in sorted(set(own) & set(saved))
                     if own[k] != saved[k]]
        problems = "; ".join(p for p in problems if p)
        if given:
            raise SaveFileError(f"net= does not match the saved network ({_describe(spec)}): {problems}")
        raise SaveFileError(f"{directory / MANIFEST} describes the network as {_describe(spec)}, but "
                            f"{directory / TENSORS} holds weights of another network ({problems}): the save is "
                            f"damaged, was edited or mixes two saves")


def _describe(spec: dict) -> str:
    name = describe_spec(spec)
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in spec['args'].items())})" if "zoo" in spec else name


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
