"""Stochastic selection: which parameters of a plain ``nn.Module`` become random.

A *selector* turns a network into a list of :class:`StochasticSite`: one Pyro sample
site per selected parameter, named exactly like the parameter (``"fc2.weight"``), so
diagnostics read naturally.  Everything not selected stays deterministic.

Selectors (all check the names they are given and list the valid ones on error):

* :class:`AllParameters` — ``"all"``: every parameter is random (a fully stochastic BNN).
* :class:`NoParameters` — ``"none"``: nothing is random (the deterministic / MAP baseline
  fitted through the same machinery).
* :class:`LastLayer` — ``"last"``: the parameters of the last parametrised module in
  forward order (or the modules a network names in its ``last_layer_names`` attribute,
  e.g. the three output heads of a multi-head LSTM).
* :class:`ModuleNames` — glob patterns over module names (``"fc2"``, ``"ffn.*"``) or
  parameter names (``"out.weight"``).
* :class:`ElementMasks` — element-wise boolean masks per parameter (``True`` = random
  entry); the other entries are held *exactly* at fixed values: ``0``, a constant, or the
  current (e.g. pretrained) weights.  This is the basis of structured partial
  stochasticity (Rochussen 2024; :mod:`zoo.structured`).

Use :func:`as_selector` to turn the user-facing forms (``"all"``, ``"fc1,out"``,
``["fc*"]``, ``{"fc1.weight": mask}``) into selector objects.
"""
from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Union

import torch
from torch import nn

from .architectures import output_modules

__all__ = [
    "StochasticSite",
    "Selector",
    "AllParameters",
    "NoParameters",
    "LastLayer",
    "last_module_names",
    "ModuleNames",
    "ElementMasks",
    "as_selector",
    "SELECTOR_NAMES",
]


@dataclass
class StochasticSite:
    """One random parameter (or the random entries of one parameter).

    Attributes:
        name: the parameter's name in ``module.named_parameters()`` and the Pyro site name.
        param_shape: shape of the full parameter tensor.
        mask: ``None`` when the whole tensor is random, else a bool tensor of
            ``param_shape`` whose ``True`` entries are random.
        fixed_value: full-shape tensor holding the values of the fixed entries
            (only read where ``mask`` is ``False``); ``None`` when ``mask`` is ``None``.
        reference: full-shape tensor of the parameter's value when the model was built
            (initial / pretrained weights); used for guide initialisation and for priors
            centred at pretrained weights.
        fan_in: number of inputs feeding one unit of the owning layer (for fan-in
            scaled priors).
    """

    name: str
    param_shape: torch.Size
    mask: Optional[torch.Tensor]
    fixed_value: Optional[torch.Tensor]
    reference: torch.Tensor
    fan_in: int

    def __post_init__(self):
        if self.mask is not None:
            self._index = self.mask.reshape(-1).nonzero().squeeze(1)

    @property
    def shape(self) -> torch.Size:
        """Shape of the sample site: ``param_shape``, or ``(n_random,)`` when masked."""
        if self.mask is None:
            return torch.Size(self.param_shape)
        return torch.Size([int(self._index.numel())])

    @property
    def numel(self) -> int:
        return int(math.prod(self.shape))

    def to_param(self, value: torch.Tensor) -> torch.Tensor:
        """Scatter site values ``[..., *shape]`` into full parameters ``[..., *param_shape]``.

        Fixed entries take ``fixed_value`` exactly; differentiable in ``value`` and
        usable under ``torch.func.vmap``.
        """
        if self.mask is None:
            return value
        batch = value.shape[:-1]
        flat_fixed = self.fixed_value.reshape(-1).to(value.dtype)
        full = flat_fixed.expand(*batch, flat_fixed.numel())
        full = full.index_copy(-1, self._index.to(value.device), value)
        return full.reshape(*batch, *self.param_shape)

    def from_param(self, param: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`to_param`: the random entries of a full parameter tensor."""
        if self.mask is None:
            return param
        flat = param.reshape(*param.shape[: param.dim() - len(self.param_shape)], -1)
        return flat.index_select(-1, self._index.to(param.device))

    def reference_value(self) -> torch.Tensor:
        """The site-shaped reference (initial / pretrained) value."""
        return self.from_param(self.reference)

    def convert_(self, fn) -> None:
        """Convert ``reference`` and ``fixed_value`` with ``fn`` in place of the originals.

        ``fn`` is a tensor conversion as :meth:`torch.nn.Module._apply` passes it (from
        ``.double()``, ``.to(device)``, ...); the boolean ``mask`` only moves to the converted
        reference's device.
        """
        self.reference = fn(self.reference)
        if self.mask is not None:
            self.fixed_value = fn(self.fixed_value)
            self.mask = self.mask.to(self.reference.device)
            self._index = self._index.to(self.reference.device)


def _fan_in(module: nn.Module, param_name: str, param: torch.Tensor) -> int:
    """Inputs per unit of the layer owning ``param`` (weights: prod(shape[1:]))."""
    if param.dim() >= 2:
        return int(math.prod(param.shape[1:]))
    owner_name, _, _ = param_name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    for sibling_name, sibling in owner.named_parameters(recurse=False):
        if sibling.dim() >= 2 and sibling_name.startswith("weight"):
            return int(math.prod(sibling.shape[1:]))
    return 1


def _full_site(module: nn.Module, name: str, param: torch.Tensor) -> StochasticSite:
    return StochasticSite(
        name=name,
        param_shape=param.shape,
        mask=None,
        fixed_value=None,
        reference=param.detach().clone(),
        fan_in=_fan_in(module, name, param),
    )


def _parametrised_module_names(module: nn.Module) -> list[str]:
    return [n for n, m in module.named_modules() if any(True for _ in m.parameters(recurse=False))]


class Selector:
    """Base class: ``select(module, example_input) -> list[StochasticSite]``."""

    #: True when an empty selection is the intended result (only ``NoParameters``).
    allows_empty = False

    def select(self, module: nn.Module, example_input: Optional[torch.Tensor] = None) -> list[StochasticSite]:
        sites = self._select(module, example_input)
        if not sites and not self.allows_empty:
            raise ValueError(
                f"{self!r} selected no parameters of {type(module).__name__}; parametrised modules are: "
                f"{', '.join(_parametrised_module_names(module)) or '(none)'}"
            )
        return sites

    def _select(self, module, example_input):  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        return type(self).__name__ + "()"


class AllParameters(Selector):
    """Every parameter is random (a fully stochastic network)."""

    def _select(self, module, example_input):
        return [_full_site(module, n, p) for n, p in module.named_parameters()]


class NoParameters(Selector):
    """No parameter is random: the deterministic (maximum-likelihood / MAP) baseline."""

    allows_empty = True

    def _select(self, module, example_input):
        return []


class LastLayer(Selector):
    """Parameters of the last parametrised module in forward order.

    A network may name its output modules in a ``last_layer_names`` attribute (a
    multi-head network has several); otherwise the order in which modules' forward
    hooks fire on ``example_input`` decides, and without an example input the last
    parametrised module in registration order is used.
    """

    def _select(self, module, example_input):
        return ModuleNames(list(last_module_names(module, example_input)))._select(module, example_input)


def last_module_names(module: nn.Module, example_input=None) -> tuple[str, ...]:
    """The module(s) that :class:`LastLayer` selects: :func:`zoo.architectures.output_modules`, or,
    without an example input and without ``last_layer_names``, the last parametrised module in
    registration order."""
    if example_input is None and getattr(module, "last_layer_names", None) is None:
        owners = _parametrised_module_names(module)
        if not owners:
            raise ValueError(f"{type(module).__name__} has no parameters: 'last' selects nothing")
        return (owners[-1],)
    return output_modules(module, example_input)


class ModuleNames(Selector):
    """Parameters of modules (or parameters) whose names match glob patterns.

    A pattern matching a module name selects all parameters directly owned by that
    module and its children (``"fc2"`` → ``fc2.weight``, ``fc2.bias``); a pattern may
    also match parameter names directly (``"out.weight"``).  A pattern that matches
    nothing is an error listing the valid module and parameter names.
    """

    def __init__(self, patterns: Sequence[str]):
        patterns = [p.strip() for p in patterns if p.strip()]
        if not patterns:
            raise ValueError("ModuleNames needs at least one module-name pattern")
        self.patterns = patterns

    def __repr__(self):
        return f"ModuleNames({self.patterns!r})"

    def _select(self, module, example_input):
        param_names = [n for n, _ in module.named_parameters()]
        module_names = [n for n in _parametrised_module_names(module) if n]
        chosen: set[str] = set()
        for pattern in self.patterns:
            hits = {
                p
                for p in param_names
                if fnmatch.fnmatchcase(p, pattern)
                or any(fnmatch.fnmatchcase(prefix, pattern) for prefix in _prefixes(p))
            }
            if not hits:
                raise ValueError(
                    f"stochastic pattern {pattern!r} matches no module or parameter of "
                    f"{type(module).__name__}; valid module names: {', '.join(module_names)}; "
                    f"valid parameter names: {', '.join(param_names)}"
                )
            chosen |= hits
        params = dict(module.named_parameters())
        return [_full_site(module, n, params[n]) for n in param_names if n in chosen]


def _prefixes(param_name: str) -> list[str]:
    parts = param_name.split(".")[:-1]
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


FixedValues = Union[str, float, Mapping[str, Union[float, torch.Tensor]]]


class ElementMasks(Selector):
    """Element-wise selection: only the ``True`` entries of each mask are random.

    Args:
        masks: ``{param_name: BoolTensor of the parameter's shape}``; parameters not
            listed are deterministic.  An all-``True`` mask makes the whole tensor random.
        fixed_values: values of the fixed (``False``) entries: ``"current"`` (the
            module's current, e.g. pretrained, weights), a float constant (``0.0``), or a
            mapping ``{param_name: float | Tensor}`` (tensors of the parameter's shape,
            e.g. ±c patterns or MAP values); names missing from the mapping use the
            current weights.
    """

    def __init__(self, masks: Mapping[str, torch.Tensor], fixed_values: FixedValues = "current"):
        if not masks:
            raise ValueError("ElementMasks needs at least one mask")
        self.masks = dict(masks)
        self.fixed_values = fixed_values

    def __repr__(self):
        return f"ElementMasks({list(self.masks)})"

    def _fixed_for(self, name: str, param: torch.Tensor) -> torch.Tensor:
        spec = self.fixed_values
        if isinstance(spec, Mapping):
            spec = spec.get(name, "current")
        if isinstance(spec, str):
            if spec != "current":
                raise ValueError(f"fixed_values must be 'current', a number or a mapping; got {spec!r}")
            return param.detach().clone()
        value = torch.as_tensor(spec, dtype=param.dtype)
        if value.dim() and value.shape != param.shape:
            raise ValueError(
                f"fixed value for {name!r} has shape {tuple(value.shape)}, expected {tuple(param.shape)}"
            )
        return value.expand(param.shape).clone()

    def _select(self, module, example_input):
        params = dict(module.named_parameters())
        unknown = [n for n in self.masks if n not in params]
        if unknown:
            raise ValueError(f"masks name unknown parameters {unknown}; valid parameter names: {', '.join(params)}")
        sites = []
        for name, param in params.items():
            if name not in self.masks:
                continue
            mask = torch.as_tensor(self.masks[name])
            if mask.dtype != torch.bool:
                raise ValueError(f"mask for {name!r} must be a bool tensor, got dtype {mask.dtype}")
            if mask.shape != param.shape:
                raise ValueError(
                    f"mask for {name!r} has shape {tuple(mask.shape)}, parameter has {tuple(param.shape)}"
                )
            if not bool(mask.any()):
                continue
            if bool(mask.all()):
                sites.append(_full_site(module, name, param))
                continue
            sites.append(
                StochasticSite(
                    name=name,
                    param_shape=param.shape,
                    mask=mask.clone(),
                    fixed_value=self._fixed_for(name, param),
                    reference=param.detach().clone(),
                    fan_in=_fan_in(module, name, param),
                )
            )
        return sites


SELECTOR_NAMES = {
    "all": "every parameter random",
    "none": "nothing random (deterministic / MAP baseline)",
    "last": "the last parametrised module (output layer or heads)",
    "GLOB[,GLOB...]": "modules or parameters matching the glob patterns, e.g. 'fc2' or 'ffn.*'",
}


def as_selector(spec) -> Selector:
    """Turn the user-facing selection forms into a :class:`Selector`.

    ``"all"``, ``"none"``, ``"last"``, a comma-separated string or list of glob
    patterns, a mapping of boolean masks, or a ``Selector`` (returned unchanged).
    """
    if isinstance(spec, Selector):
        return spec
    if isinstance(spec, Mapping):
        return ElementMasks(spec)
    if isinstance(spec, str):
        key = spec.strip().lower()
        if key == "all":
            return AllParameters()
        if key == "none":
            return NoParameters()
        if key == "last":
            return LastLayer()
        if not key:
            raise ValueError(f"empty stochastic selection; valid forms: {', '.join(SELECTOR_NAMES)}")
        return ModuleNames(spec.split(","))
    if isinstance(spec, Sequence):
        return ModuleNames(list(spec))
    raise ValueError(f"cannot interpret stochastic selection {spec!r}; valid forms: {', '.join(SELECTOR_NAMES)}")
