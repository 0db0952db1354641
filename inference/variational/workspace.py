"""Reusable work tensors for the fused mean-field step (:class:`~inference.variational.meanfield.MeanFieldGuide`).

A variational-dropout step computes a dozen ``[P]`` intermediates (log α, α, the KL's derivative,
∂σ/∂μ, ...).  Allocated afresh each step, every one of them is new memory from the operating
system — above glibc's mmap threshold a tensor of 1 MB is mapped and unmapped each time, and its
first touch page-faults — which on LeNet-300-100 (P = 266 610) cost more than the arithmetic:
the sparse-VD and Kingma-VD KL passes took 5.3 and 7.6 ms per step, 2.9 and 2.5 ms without the
faults.  A :class:`Workspace` keeps those buffers between steps: a step takes them in its forward
pass (:meth:`Workspace.take`) and gives all of them back at the end of its backward pass
(:meth:`Workspace.give`).  Each step holds its own buffers until then, so several live steps
(particles averaged before one backward) never share one; a step whose backward never runs just
lets its buffers go to the garbage collector.
"""
from __future__ import annotations

import torch

__all__ = ["Workspace"]


class Workspace:
    """A free list of uninitialised tensors by ``(shape, dtype, device)``; pickles (and copies) empty."""

    def __init__(self):
        self._free: dict[tuple, list] = {}

    def take(self, like: torch.Tensor) -> torch.Tensor:
        """An uninitialised tensor shaped like ``like``: a returned one if there is one, else a new one."""
        free = self._free.get((like.shape, like.dtype, like.device))
        return free.pop() if free else torch.empty_like(like, memory_format=torch.contiguous_format)

    def give(self, tensors) -> None:
        """Return ``tensors`` (taken from :meth:`take`, no longer referenced by the caller) for reuse."""
        for tensor in tensors:
            self._free.setdefault((tensor.shape, tensor.dtype, tensor.device), []).append(tensor)

    def __getstate__(self):
        return {"_free": {}}
