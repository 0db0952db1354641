"""A network described without pickling it: :func:`net_spec` and :func:`build_net`.

A saved posterior (:mod:`inference.storage.posterior_io`) stores its network as a JSON *spec* plus
its ``state_dict``, so it loads in any process that has this library, whatever process
defined the network.  A spec exists for

* the registered architectures (:data:`zoo.architectures.ARCHITECTURES`, the one registry, whose
  entry's ``describe`` gives the arguments): ``{"zoo": name, "args": {...}}``, rebuilt with
  :func:`zoo.architectures.build_architecture`;
* ``torch.nn`` layers whose constructor arguments are their declared constants
  (``Linear``, ``Conv2d``, ``Tanh``, ``LayerNorm``, ...): ``{"torch": class, "args": {...}}``;
* ``torch.nn.Sequential`` of the above: ``{"torch": "Sequential", "children": [[name, spec], ...]}``.

Any other class (e.g. one defined in a notebook) has no spec: it is recorded as ``{"user":
"module.QualName"}`` and :func:`build_net` raises a ``ValueError`` that says to pass an
instance (``load_posterior(dir, net=YourNet(...))``).  :func:`net_spec` checks each spec by
rebuilding it (the same ``repr`` and parameter / buffer layout), so a spec never rebuilds a
different network.
"""
from __future__ import annotations

import inspect
import json
from collections import OrderedDict
from typing import Optional

import torch
from torch import nn

from zoo.architectures import build_architecture, registered_architecture

__all__ = ["net_spec", "build_net", "describe_spec"]


def _torch_args(module: nn.Module) -> Optional[dict]:
    """Constructor arguments of a ``torch.nn`` layer: its ``__constants__`` (and ``bias``), or ``None``."""
    params = inspect.signature(type(module).__init__).parameters
    args = {}
    for name in getattr(module, "__constants__", ()):
        if name in params:
            args[name] = getattr(module, name)
    if "bias" in params and "bias" not in args and isinstance(getattr(module, "bias", None), (torch.Tensor, type(None))):
        args["bias"] = module.bias is not None
    required = [n for n, p in params.items() if n != "self" and p.default is inspect.Parameter.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return args if all(n in args for n in required) else None


def _raw_spec(net: nn.Module) -> dict:
    cls = type(net)
    architecture = registered_architecture(cls)
    if architecture is not None:
        args = architecture.describe(net)
        if args is not None:
            return {"zoo": architecture.name, "args": args}
    elif cls is nn.Sequential:
        children = [[name, _raw_spec(child)] for name, child in net.named_children()]
        inner = [child["user"] for _, child in children if "user" in child]
        if not inner:
            return {"torch": "Sequential", "children": children}
        return {"user": _qualname(cls), "contains": inner[0]}
    elif cls.__module__.startswith("torch.nn.modules.") and getattr(nn, cls.__name__, None) is cls:
        args = _torch_args(net)
        if args is not None:
            return {"torch": cls.__name__, "args": args}
    return {"user": _qualname(cls)}


def _qualname(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def net_spec(net: nn.Module) -> dict:
    """The JSON spec of ``net`` (see the module docstring); ``{"user": ...}`` when it has none.

    A candidate spec is kept only if the network it rebuilds has ``net``'s ``repr`` and
    state-dict layout (names and shapes); the rebuild leaves the global random state as it was.
    """
    user = {"user": _qualname(type(net))}
    try:
        spec = json.loads(json.dumps(_raw_spec(net), allow_nan=False))  # exactly what a saved manifest holds
    except (TypeError, ValueError):  # an argument JSON cannot hold
        return user
    if "user" in spec:
        return spec
    try:
        rebuilt = build_net(spec)
    except (TypeError, ValueError):
        rebuilt = None
    same = rebuilt is not None and repr(rebuilt) == repr(net) and _shapes(rebuilt) == _shapes(net)
    return spec if same else user


def _shapes(net: nn.Module) -> dict:
    return {k: tuple(v.shape) for k, v in net.state_dict().items()}


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def build_net(spec: dict) -> nn.Module:
    """A freshly initialised network from a spec of :func:`net_spec` (the global random state is kept).

    Raises:
        ValueError: a ``{"user": ...}`` spec (the network's class cannot be rebuilt here), or an
            unknown spec.
    """
    with torch.random.fork_rng(devices=[]):
        return _build(spec)


def _build(spec: dict) -> nn.Module:
    if "zoo" in spec:
        args = dict(spec["args"])
        return build_architecture(spec["zoo"], args.pop("input_dim"), args.pop("output_dim"), **args)
    if spec.get("torch") == "Sequential":
        return nn.Sequential(OrderedDict((name, _build(child)) for name, child in spec["children"]))
    if "torch" in spec:
        cls = getattr(nn, spec["torch"], None)
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise ValueError(f"unknown torch.nn layer {spec['torch']!r} in the saved network spec")
        return cls(**{k: _tuples(v) for k, v in spec["args"].items()})
    if "user" in spec:
        raise ValueError(f"the network is {describe_spec(spec)}, which this library cannot rebuild")
    raise ValueError(f"not a network spec: {spec!r}")


def describe_spec(spec: dict) -> str:
    """A short name for a spec: ``"mlp"``, ``"Sequential(Linear, Tanh, Linear)"``, ``"a MyNet (__main__.MyNet)"``."""
    if "zoo" in spec:
        return spec["zoo"]
    if spec.get("torch") == "Sequential":
        return "Sequential(" + ", ".join(describe_spec(child) for _, child in spec["children"]) + ")"
    if "user" in spec:
        name = f"a {spec['user'].rpartition('.')[2]} ({spec['user']})"
        return name + (f" containing a {spec['contains']}" if "contains" in spec else "")
    return spec.get("torch", "?")
