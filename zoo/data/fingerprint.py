"""A fingerprint of a training set, so that data handed over later can be recognised as the same points.

:func:`inference.fit` records ``data_fingerprint(x, y)`` of the checked training tensors in
``posterior.info["data_fingerprint"]``; a report given tensors (``lab.report.write_report(posterior,
..., data=(x, y))``) compares their fingerprint with it, to say whether its metrics are in-sample
(the fit's own points) or about other data.

The fingerprint is a SHA-256 over the shapes and the *values* (each tensor read as float64, row
block by row block, so memory stays bounded): the same points give the same fingerprint whatever
their dtype (float32, float64, integer labels) or device, a copy as well as the tensor itself, and
any changed value, row order or shape gives another.
"""
from __future__ import annotations

import hashlib

import torch

__all__ = ["data_fingerprint"]

#: rows hashed per block (bounds the float64 copy)
_BLOCK_ROWS = 4096


def data_fingerprint(*tensors: torch.Tensor) -> str:
    """A 16-hex-digit fingerprint of ``tensors`` (e.g. ``x [N, ...]`` and ``y``): shapes and values.

    Example:
        >>> data_fingerprint(torch.ones(3, 2), torch.zeros(3)) == data_fingerprint(torch.ones(3, 2).double(),
        ...                                                                         torch.zeros(3).long())
        True
    """
    digest = hashlib.sha256()
    for tensor in tensors:
        tensor = tensor.detach()
        digest.update(repr(tuple(tensor.shape)).encode())
        flat = tensor.reshape(tensor.shape[0], -1) if tensor.dim() else tensor.reshape(1, 1)
        for start in range(0, flat.shape[0], _BLOCK_ROWS):
            block = flat[start:start + _BLOCK_ROWS].to("cpu", torch.float64).contiguous()
            digest.update(block.numpy().tobytes())
    return digest.hexdigest()[:16]
