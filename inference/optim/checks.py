"""Checks of option values for the ``validate()`` of every options dataclass (the backends' ``Config``,
:class:`~inference.optim.training.OptimiserOptions`, :mod:`inference.sgmcmc.config`): one message per kind of
check, naming the option, what it must be and the value given.  Family folders and backends both import it
(it imports nothing of ``inference``)."""
from __future__ import annotations

import math
from typing import Iterable

__all__ = ["check_choice", "check_interval", "check_positive"]


def check_choice(name: str, value, valid: Iterable[str]) -> None:
    """``value`` is one of ``valid``, else ``ValueError("unknown {name} {value!r}; valid: a, b, c")``."""
    if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(valid)}")


def check_interval(name: str, value: float, interval: str) -> None:
    """``value`` lies in ``interval``, written as in mathematics — ``"(0, 1)"``, ``"[0, 1)"``, ``"(0, 1]"``,
    ``"[0, 1]"``: a bracket includes its end, a parenthesis excludes it (NaN lies in none) — else
    ``ValueError("{name} must lie in {interval}, got {value}")``."""
    low, high = (float(end) for end in interval[1:-1].split(","))
    above = value >= low if interval[0] == "[" else value > low
    below = value <= high if interval[-1] == "]" else value < high
    if not (above and below):
        raise ValueError(f"{name} must lie in {interval}, got {value}")


def check_positive(name: str, value: float) -> None:
    """``value`` is a finite positive number, else ``ValueError("{name} must be positive, got {value}")``."""
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be positive, got {value}")
