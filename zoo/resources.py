"""Sizes refused up front, with their estimate: :func:`check_memory` against :func:`available_memory`
(e.g. a network whose parameters alone exceed the memory, :func:`check_parameter_memory`, or a
prediction whose draws would; the estimates of fits and predictions are in :mod:`inference.memory`).
The environment variable ``ZOO_MEMORY_LIMIT`` overrides the memory available (:func:`memory_limit`)."""
from __future__ import annotations

import math
import os
import re
from typing import Optional

import torch

__all__ = ["check_memory", "check_parameter_memory", "available_memory", "memory_limit", "format_bytes",
           "MEMORY_LIMIT_VARIABLE"]


#: the environment variable that overrides the memory available: bytes (``64G``, ``512M``, ``1e9``) or ``off``
MEMORY_LIMIT_VARIABLE = "ZOO_MEMORY_LIMIT"
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


def memory_limit() -> Optional[float]:
    """``$ZOO_MEMORY_LIMIT`` in bytes (``inf`` for ``off``), or ``None`` when it is not set.

    The value is a number of bytes with an optional binary unit (``K``, ``M``, ``G``, ``T``, ``P``; an
    ``iB`` or ``B`` after it is allowed): ``64G`` on a machine whose swap the estimate does not count,
    ``2G`` to keep a shared machine's jobs small, ``off`` to refuse nothing.
    """
    text = os.environ.get(MEMORY_LIMIT_VARIABLE, "").strip()
    if not text:
        return None
    if text.lower() in ("off", "none", "inf", "unlimited"):
        return math.inf
    match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMGTP]?)(?:i?B)?", text, re.IGNORECASE)
    if match is None:
        raise ValueError(f"{MEMORY_LIMIT_VARIABLE}={text!r} is not a size: give bytes with an optional unit "
                         f"(e.g. 64G, 512M, 1e9) or 'off'")
    return float(match.group(1)) * _UNITS[match.group(2).upper()]


def available_memory(device: Optional[torch.device] = None) -> Optional[int]:
    """Bytes of memory available now on ``device`` (CPU: ``MemAvailable`` of ``/proc/meminfo``), or ``None``.

    ``$ZOO_MEMORY_LIMIT`` (:func:`memory_limit`) overrides it on every device; ``off`` gives ``None``.
    """
    limit = memory_limit()
    if limit is not None:
        return None if math.isinf(limit) else int(limit)
    device = torch.device("cpu") if device is None else torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def format_bytes(size: float) -> str:
    """``size`` bytes as ``"1.5 GiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(size) < 1024 or unit == "PiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} PiB"  # pragma: no cover - the loop always returns


def check_memory(needed: float, what: str, advice: str, device: Optional[torch.device] = None) -> None:
    """Refuse ``what`` (needing ``needed`` bytes) when it exceeds the memory available on ``device``.

    The message states the estimate, the memory available and ``advice``.  Nothing is refused
    where the available memory cannot be read.
    """
    available = available_memory(device)
    if available is not None and needed > available:
        where = "this machine" if device is None or torch.device(device).type == "cpu" else str(device)
        source = f" (${MEMORY_LIMIT_VARIABLE})" if memory_limit() is not None else ""
        raise ValueError(f"{what} needs about {format_bytes(needed)} of memory; {where} has "
                         f"{format_bytes(available)} available{source}: {advice} (or set {MEMORY_LIMIT_VARIABLE}, "
                         f"e.g. =64G with swap, =off to skip this check)")


def check_parameter_memory(count: int, what: str, advice: str) -> None:
    """Refuse building ``what``, a network of ``count`` parameters in the default dtype, that cannot fit in memory."""
    size = count * (torch.finfo(torch.get_default_dtype()).bits // 8)
    check_memory(size, f"{what}, with {count:,} parameters in {torch.get_default_dtype()},", advice)
