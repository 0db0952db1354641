"""Fully connected networks: :class:`MLP` and LeNet-300-100 (:class:`LeNet300100`).

Submodules are named ``fc1, fc2, ..., out`` so that stochastic selectors address them
naturally (``"out"`` for the last layer, ``"fc*"`` for the hidden ones).
"""
from __future__ import annotations

from typing import Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..resources import check_parameter_memory
from ._common import activation_by_name, positive_int

__all__ = ["MLP", "LeNet300100"]


class MLP(nn.Module):
    """Fully connected network ``fc1 -> act -> fc2 -> act -> ... -> out``.

    Args:
        input_dim: number of input features ``D``.
        output_dim: number of outputs ``K``.
        hidden: widths of the hidden layers (``()`` gives a linear model with only ``out``);
            an int means one hidden layer.
        activation: one of :data:`ACTIVATIONS` (``relu, tanh, sigmoid, gelu, elu, silu``).
        dropout: dropout rate p ∈ [0, 1) on the inputs of every linear layer (``fc1`` ...
            ``out``), active in training mode (Srivastava et al. 2014); 0 (default) adds none.
            The ``mc-dropout`` backend takes it as its default rate and applies dropout itself.

    Shapes:
        input ``[B, D]`` (inputs with more dims after the batch dim, e.g. images
        ``[B, C, H, W]``, are flattened to ``[B, D]``); output ``[B, K]``.
    """

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        hidden: Union[int, Sequence[int]] = (50,),
        activation: str = "relu",
        dropout: float = 0.0,
    ):
        super().__init__()
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
            raise ValueError(f"dropout rate must be a number in [0, 1), got {dropout!r}")
        self.dropout = float(dropout)
        input_dim = positive_int(input_dim, "input_dim")
        output_dim = positive_int(output_dim, "output_dim")
        hidden = (hidden,) if isinstance(hidden, int) else tuple(hidden)
        for width in hidden:
            positive_int(width, "every hidden width")
        widths = (input_dim, *hidden, output_dim)
        check_parameter_memory(sum((a + 1) * b for a, b in zip(widths, widths[1:])),
                               f"{type(self).__name__}(input_dim={input_dim}, output_dim={output_dim}, hidden={hidden})",
                               "use narrower or fewer hidden layers")
        self.input_dim, self.output_dim, self.hidden = input_dim, output_dim, hidden
        self.activation = activation.lower() if isinstance(activation, str) else activation
        self._act = activation_by_name(activation)
        width_in = input_dim
        for i, width in enumerate(hidden, start=1):
            setattr(self, f"fc{i}", nn.Linear(width_in, width))
            width_in = width
        self.out = nn.Linear(width_in, output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() > 2:
            x = x.flatten(1)
        for i in range(1, len(self.hidden) + 1):
            x = self._act(getattr(self, f"fc{i}")(self._drop(x)))
        return self.out(self._drop(x))

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, self.dropout, self.training) if self.dropout else x

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}" + (f", dropout={self.dropout}" if self.dropout else "")


class LeNet300100(MLP):
    """LeNet-300-100: ``fc1`` (→300), ``fc2`` (→100), ``out`` (→10), ReLU.

    The two-hidden-layer MNIST network of LeCun et al. 1998, the fully connected benchmark
    of sparse variational dropout (Molchanov et al. 2017) and of the variational-MLP
    comparison in the VariationalMLP.jl dissertation (see ``docs/references.md``).

    Shapes: input ``[B, 784]`` or images ``[B, 1, 28, 28]`` / ``[B, 28, 28]`` (flattened);
    output ``[B, output_dim]`` logits.
    """

    def __init__(self, input_dim: int = 784, output_dim: int = 10, activation: str = "relu", dropout: float = 0.0):
        super().__init__(input_dim, output_dim, hidden=(300, 100), activation=activation, dropout=dropout)
