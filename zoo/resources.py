"""Sizes refused up front, with their estimate: :func:`check_memory` against :func:`available_memory`
(e.g. a network whose parameters alone exceed the memory, :func:`check_parameter_memory`, or a
prediction whose draws would)."""
from __future__ import annotations

import os
from typing import Optional

import torch

__all__ = ["check_memory", "check_parameter_memory", "available_memory", "format_bytes"]


def available_memory(device: Optional[torch.device] = None) -> Optional[int]:
    """Bytes of memory available now on ``device`` (CPU: ``MemAvailable`` of ``/proc/meminfo``), or ``None``."""
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
        raise ValueError(f"{what} needs about {format_bytes(needed)} of memory; {where} has "
                         f"{format_bytes(available)} available: {advice}")


def check_parameter_memory(count: int, what: str, advice: str) -> None:
    """Refuse building ``what``, a network of ``count`` parameters in the default dtype, that cannot fit in memory."""
    size = count * (torch.finfo(torch.get_default_dtype()).bits // 8)
    check_memory(size, f"{what}, with {count:,} parameters in {torch.get_default_dtype()},", advice)
