"""Recurrent networks: the multi-head LSTM of Bagga et al. 2025 (:class:`MultiLSTM`).

Bagga, Singh, Lalwani & Senthil 2025 (Fig. 1) predict the three Euler angles of each pixel
of a microstructure under increasing strain with one LSTM (Hochreiter & Schmidhuber 1997)
per angle over the same input sequence and one linear head per angle on the concatenated
last hidden states.

The default :class:`MultiLSTM` uses PyTorch's fused ``nn.LSTM``, which works under
:func:`torch.func.functional_call` but not under :func:`torch.func.vmap` (PyTorch has no
batching rule for ``aten::lstm``); ``MultiLSTM(unrolled=True)`` uses
:class:`UnrolledLSTM`, a step-by-step LSTM with the *same* parameter names and values
that does vmap.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ._common import positive_int

__all__ = ["UnrolledLSTM", "MultiLSTM"]


class UnrolledLSTM(nn.Module):
    """A one-layer, batch-first LSTM written step by step, so it works under ``vmap``.

    Its parameters have exactly the names, shapes and gate order (input, forget, cell,
    output) of a one-layer ``nn.LSTM`` — ``weight_ih_l0 [4H, F]``, ``weight_hh_l0 [4H, H]``,
    ``bias_ih_l0 [4H]``, ``bias_hh_l0 [4H]`` — so state dicts are interchangeable and the
    outputs agree with ``nn.LSTM`` to rounding.

    Shapes: input ``[B, T, F]``; returns ``(outputs [B, T, H], (h_T [1, B, H], c_T [1, B, H]))``
    like ``nn.LSTM(batch_first=True)``.
    """

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.weight_ih_l0 = nn.Parameter(torch.empty(4 * hidden_size, input_size))
        self.weight_hh_l0 = nn.Parameter(torch.empty(4 * hidden_size, hidden_size))
        self.bias_ih_l0 = nn.Parameter(torch.empty(4 * hidden_size))
        self.bias_hh_l0 = nn.Parameter(torch.empty(4 * hidden_size))
        bound = 1.0 / math.sqrt(hidden_size)  # nn.LSTM's initialisation
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def forward(self, x: torch.Tensor):
        batch, steps = x.shape[0], x.shape[1]
        h = x.new_zeros(batch, self.hidden_size)
        c = x.new_zeros(batch, self.hidden_size)
        # Input projections of all steps at once; only the recurrence is sequential.
        gates_x = F.linear(x, self.weight_ih_l0, self.bias_ih_l0 + self.bias_hh_l0)
        outputs = []
        for t in range(steps):
            gates = gates_x[:, t] + F.linear(h, self.weight_hh_l0)
            i, f, g, o = gates.chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outputs.append(h)
        return torch.stack(outputs, dim=1), (h.unsqueeze(0), c.unsqueeze(0))

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, batch_first=True"


class MultiLSTM(nn.Module):
    """Bagga et al. 2025, Fig. 1: one LSTM per Euler angle over the same sequence, one linear head per angle.

    Each LSTM ``lstm_<name>`` (one layer, batch-first) reads the *whole* input sequence; their
    last hidden states are concatenated (the "combined representation", ``[B, n*H]``) and
    every head ``head_<name>`` (``Linear(n*H, heads)``) maps the combined representation to
    its target's ``heads`` outputs.  The outputs are stacked head-output-major, the layout of
    :class:`~zoo.likelihoods.Likelihood` (``P = heads · T``): output ``k·n + t`` is output
    ``k`` of target ``t``'s head (with a heteroscedastic likelihood, ``heads = 2``: the ``n``
    means, then the ``n`` log-variances, each pair from the same LSTM and head).

    Args:
        input_size: features per time step ``F`` (3, the three angles; Fig. 1 lists 17,408
            parameters per LSTM = 4*64*(3+64+1), i.e. 3 features, although it prints a
            ``(None, 15, 1)`` input).
        hidden_size: LSTM width ``H`` (64 in Fig. 1).
        n_outputs: network outputs ``P``; must equal ``heads * len(names)``.
        names: one suffix per target (LSTM/head pair), default ``("phi1", "phi", "phi2")``.
        heads: outputs per target (a likelihood's ``heads``; default 1).
        unrolled: use :class:`UnrolledLSTM` (works under ``torch.func.vmap``; slower)
            instead of the fused ``nn.LSTM`` (the default; works under
            ``torch.func.functional_call`` but **not** under ``vmap``, for lack of a batching
            rule for ``aten::lstm``).  Parameter names and values are the same either way.

    Shapes:
        input ``[B, T, F]`` for any ``T >= 1`` (``[B, T]`` is accepted when ``F == 1``);
        output ``[B, n_outputs]``.

    ``last_layer_names`` lists the heads: all of them are fed by the final concatenation, so
    the ``last`` selector makes all heads stochastic.
    """

    last_layer_names: tuple[str, ...] = ("head_phi1", "head_phi", "head_phi2")

    def __init__(
        self,
        input_size: int = 3,
        hidden_size: int = 64,
        n_outputs: int = 3,
        names: Sequence[str] = ("phi1", "phi", "phi2"),
        heads: int = 1,
        unrolled: bool = False,
    ):
        super().__init__()
        self.input_size = positive_int(input_size, "input_size")
        self.hidden_size = positive_int(hidden_size, "hidden_size")
        self.heads = positive_int(heads, "heads")
        names = tuple(names)
        if n_outputs != self.heads * len(names):
            raise ValueError(
                f"n_outputs={n_outputs} but {len(names)} names {names!r} with heads={self.heads} give "
                f"{self.heads * len(names)} outputs; pass names=... with one name per target"
            )
        if len(set(names)) != len(names) or not all(isinstance(n, str) and n.isidentifier() for n in names):
            raise ValueError(f"names must be distinct identifiers, got {names!r}")
        self.names = names
        self.unrolled = bool(unrolled)
        for name in names:
            lstm = (
                UnrolledLSTM(input_size, hidden_size)
                if unrolled
                else nn.LSTM(input_size, hidden_size, batch_first=True)
            )
            setattr(self, f"lstm_{name}", lstm)
        for name in names:
            setattr(self, f"head_{name}", nn.Linear(len(names) * hidden_size, self.heads))
        self.last_layer_names = tuple(f"head_{name}" for name in names)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and self.input_size == 1:
            x = x.unsqueeze(-1)
        if x.dim() != 3 or x.shape[-1] != self.input_size:
            raise ValueError(
                f"MultiLSTM expects input [B, T, {self.input_size}], got {tuple(x.shape)}"
            )
        last = [getattr(self, f"lstm_{n}")(x)[1][0][-1] for n in self.names]  # each [B, H]
        combined = torch.cat(last, dim=-1)  # [B, n*H]
        outputs = torch.stack([getattr(self, f"head_{n}")(combined) for n in self.names], dim=-1)  # [B, heads, n]
        return outputs.flatten(-2)
