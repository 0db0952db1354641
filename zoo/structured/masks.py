"""Element-wise stochastic masks and fixed values of a whole network (Rochussen 2024)."""
from __future__ import annotations

import math
from typing import Mapping, NamedTuple, Optional, Sequence, Union

import torch
from torch import nn

from .patterns import PATTERNS, heavy_pattern, light_pattern, random_pattern

__all__ = ["FIXED_VALUES", "StructuredMasks", "structured_masks", "symmetric_neuron_counts"]

FIXED_VALUES = ("zero", "constant", "map")

_PATTERN_FUNCTIONS = {"light": light_pattern, "heavy": heavy_pattern}


class StructuredMasks(NamedTuple):
    """Result of :func:`structured_masks` (unpacks as ``masks, fixed = ...``).

    Attributes:
        stochastic_masks: ``{name: BoolTensor}`` for *every* parameter, ``True`` = stochastic.
        fixed_values: ``{name: Tensor}`` (parameter's shape) for every parameter with fixed
            entries; the fixed entries hold their values, the others 0.
    """

    stochastic_masks: dict[str, torch.Tensor]
    fixed_values: dict[str, torch.Tensor]


def _linear_layers(module: nn.Module) -> dict[str, nn.Linear]:
    """``nn.Linear`` modules in registration order, without attention projections."""
    attention_children = {
        f"{name}.{child}" if name else child
        for name, m in module.named_modules()
        if isinstance(m, nn.MultiheadAttention)
        for child, _ in m.named_modules()
        if child
    }
    return {
        name: m
        for name, m in module.named_modules()
        if isinstance(m, nn.Linear) and name not in attention_children
    }


def _output_layer_names(module: nn.Module, linears: Sequence[str]) -> tuple[str, ...]:
    names = getattr(module, "last_layer_names", None)
    if names is not None:
        return (names,) if isinstance(names, str) else tuple(names)
    return (linears[-1],) if linears else ()


def _select_layers(module, layers, include_output) -> list[str]:
    linears = _linear_layers(module)
    if layers is None:
        outputs = () if include_output else _output_layer_names(module, list(linears))
        chosen = [n for n in linears if n not in outputs]
        if not chosen:
            raise ValueError(
                f"{type(module).__name__} has no hidden nn.Linear layer to pattern"
                f" (nn.Linear layers: {', '.join(linears) or 'none'}); pass layers=[...]"
            )
        return chosen
    if isinstance(layers, str):
        layers = [layers]
    modules = dict(module.named_modules())
    for name in layers:
        if name not in modules or not name:
            raise ValueError(f"unknown layer {name!r}; nn.Linear layers: {', '.join(linears)}")
        if not isinstance(modules[name], nn.Linear):
            raise ValueError(
                f"layer {name!r} is a {type(modules[name]).__name__}, but the patterns apply to "
                f"nn.Linear weights only; nn.Linear layers: {', '.join(linears)}"
            )
    if len(set(layers)) != len(layers):
        raise ValueError(f"layers lists a layer twice: {list(layers)}")
    return list(layers)


def _alternating_constant(fixed: torch.Tensor, c: float, dtype) -> torch.Tensor:
    """``+c, -c, +c, ...`` over the fixed entries in row-major order, 0 elsewhere."""
    values = torch.zeros(fixed.shape, dtype=dtype)
    n = int(fixed.sum())
    signs = torch.ones(n, dtype=dtype)
    signs[1::2] = -1.0
    values[fixed] = c * signs
    return values


def structured_masks(
    module: nn.Module,
    pattern: str = "heavy",
    fixed_value: str = "zero",
    c: float = 1.0,
    layers: Optional[Sequence[str]] = None,
    pretrained_state: Optional[Union[Mapping[str, torch.Tensor], nn.Module]] = None,
    seed: int = 0,
    include_output: bool = False,
    alternate: bool = True,
    random_like: str = "heavy",
) -> StructuredMasks:
    """Element-wise stochastic masks and fixed values for structured partial stochasticity.

    Applies ``pattern`` to the weight of each selected ``nn.Linear`` layer; biases and every
    other parameter are fully stochastic (all-``True`` masks).

    Args:
        module: the plain network (e.g. :class:`zoo.architectures.MLP`).
        pattern: ``"light"``, ``"heavy"`` or ``"random"`` (see :mod:`zoo.structured`).
        fixed_value: ``"zero"`` (pruning), ``"constant"`` (``±c`` alternating ``+c, -c, ...``
            over each weight's fixed entries in row-major order) or ``"map"`` (the values in
            ``pretrained_state``).
        c: magnitude of the constant (must be > 0; the reference code used 1 for heavy and
            4 for light on UCI energy).
        layers: explicit module names to pattern (``nn.Linear`` only); default: every
            ``nn.Linear`` except the output layer(s) (the modules in
            ``module.last_layer_names``, else the last ``nn.Linear``) and the projections
            inside ``nn.MultiheadAttention``.
        pretrained_state: ``state_dict()`` (or the module itself) of a deterministically
            trained net with the same parameter names; required for ``"map"``.
        seed: seed of the random pattern (one generator, drawn layer after layer).
        include_output: also pattern the output layer(s) when ``layers`` is None — the
            reference code of Rochussen 2024 patterns every layer, output included.
        alternate: flip the pattern (``flip=True``) on ``nn.Linear`` layers at odd positions
            among the module's ``nn.Linear`` layers (0-based), as the reference code does.
        random_like: ``"heavy"`` or ``"light"``: whose number of fixed weights per layer the
            random pattern copies.

    Returns:
        :class:`StructuredMasks` ``(stochastic_masks, fixed_values)``: a mask for every
        parameter of ``module`` (``True`` = stochastic) and the fixed values of every
        parameter that has fixed entries.

    Raises:
        ValueError: unknown pattern / fixed value / random_like, ``c <= 0``, an unknown or
            non-``nn.Linear`` layer name (the valid ones are listed), no hidden
            ``nn.Linear`` layer, ``"map"`` without ``pretrained_state`` or with a missing /
            mis-shaped entry.
    """
    if pattern not in PATTERNS:
        raise ValueError(f"unknown pattern {pattern!r}; valid patterns: {', '.join(PATTERNS)}")
    if fixed_value not in FIXED_VALUES:
        raise ValueError(f"unknown fixed_value {fixed_value!r}; valid fixed values: {', '.join(FIXED_VALUES)}")
    if random_like not in _PATTERN_FUNCTIONS:
        raise ValueError(f"unknown random_like {random_like!r}; valid: {', '.join(_PATTERN_FUNCTIONS)}")
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c <= 0:
        raise ValueError(f"c must be a finite number > 0, got {c!r}")
    chosen = _select_layers(module, layers, include_output)
    if fixed_value == "map":
        if pretrained_state is None:
            raise ValueError(
                "fixed_value='map' needs pretrained_state: the state_dict of a deterministically "
                "trained network with the same parameter names"
            )
        if isinstance(pretrained_state, nn.Module):
            pretrained_state = pretrained_state.state_dict()

    positions = {name: i for i, name in enumerate(_linear_layers(module))}
    generator = torch.Generator().manual_seed(seed)
    params = dict(module.named_parameters())
    masks = {name: torch.ones_like(p, dtype=torch.bool) for name, p in params.items()}
    fixed_values: dict[str, torch.Tensor] = {}
    for layer in chosen:
        name = f"{layer}.weight"
        weight = params[name]
        n_out, n_in = weight.shape
        flip = alternate and positions.get(layer, 0) % 2 == 1
        if pattern == "random":
            n_fixed = int(_PATTERN_FUNCTIONS[random_like](n_out, n_in).sum())
            fixed = random_pattern(n_out, n_in, n_fixed, generator)
        else:
            fixed = _PATTERN_FUNCTIONS[pattern](n_out, n_in, flip=flip)
        fixed = fixed.to(weight.device)
        masks[name] = ~fixed
        if not fixed.any():
            continue
        if fixed_value == "zero":
            values = torch.zeros_like(weight, requires_grad=False)
        elif fixed_value == "constant":
            values = _alternating_constant(fixed.cpu(), float(c), weight.dtype).to(weight.device)
        else:
            if name not in pretrained_state:
                raise ValueError(f"pretrained_state has no entry {name!r} (needed for fixed_value='map')")
            source = torch.as_tensor(pretrained_state[name]).detach()
            if source.shape != weight.shape:
                raise ValueError(
                    f"pretrained_state[{name!r}] has shape {tuple(source.shape)}, expected {tuple(weight.shape)}"
                )
            values = torch.where(fixed, source.to(weight.device, weight.dtype), 0.0)
        fixed_values[name] = values.detach()
    return StructuredMasks(masks, fixed_values)


def symmetric_neuron_counts(module: nn.Module, stochastic_masks: Mapping[str, torch.Tensor]) -> dict[str, int]:
    """How many hidden neurons still share their fixed-connection pattern with another neuron.

    For consecutive ``nn.Linear`` layers ``A -> B`` (registration order, shapes chained:
    ``A.out_features == B.in_features``, as in an :class:`~zoo.architectures.MLP`), a hidden
    neuron ``k`` of ``A`` has the pattern (fixed entries of row ``k`` of ``A.weight``, fixed
    entries of column ``k`` of ``B.weight``).  Returns ``{A: number of neurons whose pattern
    is not unique}``; 0 means no permutation of that layer's neurons preserves the mask.
    Parameters missing from ``stochastic_masks`` count as fully stochastic.
    """
    linears = list(_linear_layers(module).items())
    counts: dict[str, int] = {}
    for (name_a, a), (name_b, b) in zip(linears, linears[1:]):
        if a.out_features != b.in_features:
            continue
        fixed_in = ~stochastic_masks.get(f"{name_a}.weight", torch.ones_like(a.weight, dtype=torch.bool))
        fixed_out = ~stochastic_masks.get(f"{name_b}.weight", torch.ones_like(b.weight, dtype=torch.bool))
        signatures = torch.cat([fixed_in, fixed_out.T], dim=1).cpu()
        _, inverse, counts_per = torch.unique(signatures, dim=0, return_inverse=True, return_counts=True)
        counts[name_a] = int((counts_per[inverse] > 1).sum())
    return counts
