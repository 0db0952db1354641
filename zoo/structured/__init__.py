"""Structured partial stochasticity (Rochussen 2024, arXiv:2405.17666).

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
from .masks import FIXED_VALUES, StructuredMasks, structured_masks, symmetric_neuron_counts
from .patterns import PATTERNS, format_pattern, heavy_pattern, light_pattern, random_pattern
from .presets import STRUCTURED_PREFIX, STRUCTURED_PRESETS, parse_structured, preset_masks

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
