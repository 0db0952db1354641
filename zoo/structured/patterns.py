"""Fixed-weight patterns of one weight matrix ``W [n_out, n_in]`` (Rochussen 2024).

Each function returns a **fixed** mask (``True`` = fixed entry); see :mod:`zoo.structured`
for the conventions and the pictures.
"""
from __future__ import annotations

from typing import Optional

import torch

__all__ = ["PATTERNS", "light_pattern", "heavy_pattern", "random_pattern", "format_pattern"]

PATTERNS = ("light", "heavy", "random")


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

