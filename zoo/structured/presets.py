"""Named settings of :func:`~zoo.structured.masks.structured_masks` and the
``"structured:PRESET"`` selection strings that name them."""
from __future__ import annotations

from typing import Optional

from torch import nn

from .masks import StructuredMasks, structured_masks

__all__ = ["STRUCTURED_PRESETS", "preset_masks", "STRUCTURED_PREFIX", "parse_structured"]


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
"""Named :func:`structured_masks` settings.  ``c`` follows the reference code of Rochussen 2024 on
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
