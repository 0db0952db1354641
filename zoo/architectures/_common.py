"""Shared by the architecture modules: element-wise activations by name and argument checks."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

__all__ = ["ACTIVATIONS", "activation_by_name", "positive_int"]

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "gelu": F.gelu,
    "elu": F.elu,
    "silu": F.silu,
}
"""Element-wise activations by name (parameter-free, so they never appear in names)."""


def activation_by_name(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The :data:`ACTIVATIONS` entry for ``name`` (case-insensitive).

    Raises:
        ValueError: unknown name (the valid ones are listed).
    """
    if not isinstance(name, str) or name.lower() not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; valid activations: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name.lower()]


def positive_int(value, what: str) -> int:
    """``value`` if it is an ``int >= 1`` (not a bool); else ``ValueError`` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return value
