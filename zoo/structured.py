"""Structured partial stochasticity (seed 003: Rochussen 2024, arXiv:2405.17666).

Permutation symmetries make a BNN posterior have factorially many equivalent modes.  Fixing
a few weights of each layer to constants in a *structured* pattern gives the neurons of a
layer distinct connection patterns, so permuting them changes the function and the
symmetry is gone; mean-field VI (or any other inference) then runs on the remaining
weights.

Convention (shared with :class:`zoo.stochastic.ElementMasks`): a selection is a dict
``{param_name: BoolTensor of the parameter's shape}`` with ``True`` = stochastic entry and
``False`` = fixed entry, plus ``{param_name: Tensor}`` holding the fixed entries' values.
The *pattern* functions below return the opposite, a **fixed** mask (``True`` = fixed), for
one weight matrix in PyTorch layout ``W [n_out, n_in]`` (row ``i`` = incoming weights of
output neuron ``i``).

Patterns (following the paper's reference code; ``m = min(n_out, n_in)``):

* The pattern lives in an ``m x m`` block ``B``: the first ``m`` input columns and the
  *last* ``m`` output rows (so when ``n_out > n_in`` the first ``n_out - m`` rows stay
  free; when ``n_in > n_out`` the last ``n_in - m`` columns stay free).
* **light**: ``B[i, i-1]`` is fixed for ``i = 1..m-1`` (the sub-diagonal): block neuron
  ``i`` loses exactly its connection from input ``i-1``; block neuron 0 keeps all.
  ``m - 1`` fixed weights.
* **heavy**: ``B[i, j]`` is fixed for ``j < i`` (strict lower triangle): block neuron ``i``
  loses its connections from inputs ``0..i-1``, so each has a different *number* of free
  inputs.  ``m (m - 1) / 2`` fixed weights.
* ``flip=True`` mirrors the block's input axis (column ``j`` -> ``m-1-j``).
  :func:`structured_masks` flips every other ``nn.Linear`` (odd positions), as the
  reference code does, so the neurons without fixed incoming weights in one layer are
  likely to get fixed outgoing weights in the next.
* **random** (the control): the same number of fixed weights, drawn uniformly over the
  whole matrix.

Within a square block every neuron's pattern is unique.  A hidden neuron's full pattern is
its fixed incoming row *and* its fixed outgoing column in the next layer, so across a
network every hidden neuron is unique when at most one neuron of each hidden layer has
neither (the paper's condition ``D_fc <= 1``, ``D_fc = D_l - D_{l-1} - D_{l+1} + 2``); e.g.
``[8, 50, 50, 2]`` qualifies, a single hidden layer of 50 on 8 inputs does not.
:func:`symmetric_neuron_counts` checks this for a given network.

Fixed values: ``zero`` (pruning), ``constant`` (``+c, -c, +c, ...`` alternating over the
fixed entries of each weight in row-major order — deterministic, unlike the reference
code's random signs) or ``map`` (the values of a deterministically trained net).

Example (``print_pattern(light_pattern(4, 4))`` / ``heavy_pattern(4, 4)``; ``X`` = fixed)::

    light        heavy
    . . . .      . . . .
    X . . .      X . . .
    . X . .      X X . .
    . . X .      X X X .
"""
from __future__ import annotations

import math
from typing import Mapping, NamedTuple, Optional, Sequence, Union

import torch
from torch import nn

__all__ = [
    "PATTERNS",
    "FIXED_VALUES",
    "light_pattern",
    "heavy_pattern",
    "random_pattern",
    "format_pattern",
    "StructuredMasks",
    "structured_masks",
    "symmetric_neuron_counts",
    "STRUCTURED_PRESETS",
    "preset_masks",
    "STRUCTURED_PREFIX",
    "parse_structured",
]

PATTERNS = ("light", "heavy", "random")
FIXED_VALUES = ("zero", "constant", "map")


def _check_dims(n_out: int, n_in: int) -> None:
    for what, value in (("n_out", n_out), ("n_in", n_in)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} must be a positive integer, got {value!r}")


def _block_pattern(n_out: int, n_in: int, fixed_in_block: torch.Tensor, flip: bool) -> torch.Tensor:
    """Place an ``m x m`` fixed block in the last ``m`` rows and first ``m`` columns."""
    m = fixed_in_block.shape[0]
    if flip:
        fixed_in_block = fixed_in_block.flip(1)
    fixed = torch.zeros(n_out, n_in, dtype=torch.bool)
    fixed[n_out - m :, :m] = fixed_in_block
    return fixed


def light_pattern(n_out: int, n_in: int, flip: bool = False) -> torch.BoolTensor:
    """Light pattern: fixed mask (``True`` = fixed) of a weight ``[n_out, n_in]``.

    With ``m = min(n_out, n_in)`` and the ``m x m`` block ``B = W[n_out-m:, :m]``, fixes
    the sub-diagonal ``B[i, i-1]``, ``i = 1..m-1`` (``m - 1`` weights; with ``flip``,
    ``B[i, m-i]``).  Each block neuron ``i >= 1`` misses exactly one, distinct, input, so no
    two block neurons can be swapped: the lightest structure that breaks the symmetry
    (1 fixed weight per neuron).  6 outputs x 5 inputs (``X`` = fixed)::

        . . . . .
        . . . . .
        X . . . .
        . X . . .
        . . X . .
        . . . X .
    """
    _check_dims(n_out, n_in)
    m = min(n_out, n_in)
    return _block_pattern(n_out, n_in, torch.ones(m - 1, dtype=torch.bool).diag(-1), flip)


def heavy_pattern(n_out: int, n_in: int, flip: bool = False) -> torch.BoolTensor:
    """Heavy pattern: fixed mask (``True`` = fixed) of a weight ``[n_out, n_in]``.

    With ``m = min(n_out, n_in)`` and the ``m x m`` block ``B = W[n_out-m:, :m]``, fixes the
    strict lower triangle ``B[i, j], j < i`` (``m (m-1) / 2`` weights; with ``flip``,
    ``j > m-1-i``).  Block neuron ``i`` has ``m - i`` free inputs of the block — a different
    number for each neuron, which makes patterns unique even up to a relabelling of inputs
    and pins every neuron to its position by its fan-in.  6 outputs x 5 inputs::

        . . . . .
        . . . . .
        X . . . .
        X X . . .
        X X X . .
        X X X X .
    """
    _check_dims(n_out, n_in)
    m = min(n_out, n_in)
    return _block_pattern(n_out, n_in, torch.ones(m, m, dtype=torch.bool).tril(-1), flip)


def random_pattern(
    n_out: int, n_in: int, n_fixed: int, generator: Optional[torch.Generator] = None
) -> torch.BoolTensor:
    """Control pattern: ``n_fixed`` entries of ``[n_out, n_in]`` fixed uniformly at random.

    ``True`` = fixed.  Uses ``torch.randperm(n_out * n_in, generator=generator)``.
    """
    _check_dims(n_out, n_in)
    if isinstance(n_fixed, bool) or not isinstance(n_fixed, int) or not 0 <= n_fixed <= n_out * n_in:
        raise ValueError(f"n_fixed must be an integer in [0, {n_out * n_in}], got {n_fixed!r}")
    fixed = torch.zeros(n_out * n_in, dtype=torch.bool)
    fixed[torch.randperm(n_out * n_in, generator=generator)[:n_fixed]] = True
    return fixed.reshape(n_out, n_in)


def format_pattern(fixed: torch.Tensor) -> str:
    """Render a 2-D fixed mask as text: ``X`` = fixed, ``.`` = free (one row per line)."""
    return "\n".join(" ".join("X" if v else "." for v in row.tolist()) for row in fixed)


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
        pattern: ``"light"``, ``"heavy"`` or ``"random"`` (see the module docstring).
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
            reference code of seed 003 patterns every layer, output included.
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


STRUCTURED_PRESETS: dict[str, dict] = {
    "light-zero": {"pattern": "light", "fixed_value": "zero"},
    "light-const": {"pattern": "light", "fixed_value": "constant", "c": 4.0},
    "light-map": {"pattern": "light", "fixed_value": "map"},
    "heavy-zero": {"pattern": "heavy", "fixed_value": "zero"},
    "heavy-const": {"pattern": "heavy", "fixed_value": "constant", "c": 1.0},
    "heavy-map": {"pattern": "heavy", "fixed_value": "map"},
    "random-zero": {"pattern": "random", "fixed_value": "zero", "random_like": "heavy"},
    "random-const": {"pattern": "random", "fixed_value": "constant", "c": 1.0, "random_like": "heavy"},
    "random-map": {"pattern": "random", "fixed_value": "map", "random_like": "heavy"},
}
"""Named :func:`structured_masks` settings.  ``c`` follows the seed-003 reference code on
UCI energy (heavy 1.0, light 4.0); the random controls copy the heavy pattern's counts."""


def preset_masks(module: nn.Module, preset: str, **kw) -> StructuredMasks:
    """:func:`structured_masks` with the settings of ``STRUCTURED_PRESETS[preset]``.

    ``kw`` overrides or adds settings (e.g. ``pretrained_state=`` for the ``*-map``
    presets, ``c=5.0``, ``include_output=True``).

    Raises:
        ValueError: unknown preset (the valid names are listed).
    """
    if preset not in STRUCTURED_PRESETS:
        raise ValueError(f"unknown structured preset {preset!r}; valid presets: {', '.join(STRUCTURED_PRESETS)}")
    return structured_masks(module, **{**STRUCTURED_PRESETS[preset], **kw})


STRUCTURED_PREFIX = "structured:"
"""A stochastic-selection string ``"structured:PRESET"`` names a :data:`STRUCTURED_PRESETS` entry."""


def parse_structured(stochastic) -> Optional[str]:
    """The preset of a ``"structured:PRESET"`` selection string (e.g. ``"structured:heavy-map"``).

    Returns ``None`` for every other selection (``"all"``, globs, masks, ...).

    Raises:
        ValueError: the prefix is there but the preset is unknown (the valid ones are listed).
    """
    if not isinstance(stochastic, str) or not stochastic.startswith(STRUCTURED_PREFIX):
        return None
    preset = stochastic[len(STRUCTURED_PREFIX):]
    if preset not in STRUCTURED_PRESETS:
        raise ValueError(
            f"unknown structured preset {preset!r} in {stochastic!r}; valid: "
            + ", ".join(STRUCTURED_PREFIX + p for p in STRUCTURED_PRESETS)
        )
    return preset
