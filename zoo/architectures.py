"""Plain deterministic architectures of the zoo.

Every network here is an ordinary :class:`torch.nn.Module` whose ``forward`` returns the
predictions only (never ``(out, kl)``).  Priors and the choice of which parameters are
stochastic are applied afterwards by other code that addresses parameters by their
``named_parameters()`` names, so the submodule names are chosen to make selection natural:

* :class:`MLP` / :class:`LeNet300100` — ``fc1, fc2, ..., out``;
* :class:`MultiLSTM` (seed 000, Fig. 1) — ``lstm_phi1, lstm_phi, lstm_phi2`` and
  ``head_phi1, head_phi, head_phi2``;
* :class:`SmallCNN` — ``conv1, conv2, fc1, fc2, out``;
* :class:`TransformerClassifier` (seed 002, §3.2) — ``embedding, pos_embedding,
  attention, norm1, ffn.fc1, ffn.fc2, norm2, head``.

All of them work under :func:`torch.func.functional_call`.  All but the default
(fused) :class:`MultiLSTM` also work under :func:`torch.func.vmap` over a leading batch of
parameter sets (``vmap(lambda p, x: functional_call(net, p, (x,)), in_dims=(0, None))``):
PyTorch has no batching rule for the fused ``aten::lstm`` kernel, so
``MultiLSTM(unrolled=True)`` provides a step-by-step implementation with the *same*
parameter names and values that does vmap.

:func:`build_architecture` builds any of them by name (:data:`ARCHITECTURES`);
:func:`parametrised_modules_in_forward_order` and :func:`output_modules` tell which
modules are "last" (for the ``last`` stochastic selector).
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "ACTIVATIONS",
    "MLP",
    "LeNet300100",
    "UnrolledLSTM",
    "MultiLSTM",
    "SmallCNN",
    "FeedForward",
    "SelfAttention",
    "TransformerClassifier",
    "ARCHITECTURES",
    "build_architecture",
    "parametrised_modules_in_forward_order",
    "output_modules",
]

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "gelu": F.gelu,
    "elu": F.elu,
    "silu": F.silu,
}
"""Element-wise activations by name (parameter-free, so they never appear in names)."""


def _activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if not isinstance(name, str) or name.lower() not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; valid activations: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name.lower()]


def _positive_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return value


# --------------------------------------------------------------------------------------------
# Multi-layer perceptrons
# --------------------------------------------------------------------------------------------


class MLP(nn.Module):
    """Fully connected network ``fc1 -> act -> fc2 -> act -> ... -> out``.

    Args:
        input_dim: number of input features ``D``.
        output_dim: number of outputs ``K``.
        hidden: widths of the hidden layers (``()`` gives a linear model with only ``out``);
            an int means one hidden layer.
        activation: one of :data:`ACTIVATIONS` (``relu, tanh, sigmoid, gelu, elu, silu``).

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
    ):
        super().__init__()
        input_dim = _positive_int(input_dim, "input_dim")
        output_dim = _positive_int(output_dim, "output_dim")
        hidden = (hidden,) if isinstance(hidden, int) else tuple(hidden)
        for width in hidden:
            _positive_int(width, "every hidden width")
        self.input_dim, self.output_dim, self.hidden = input_dim, output_dim, hidden
        self.activation = activation.lower() if isinstance(activation, str) else activation
        self._act = _activation(activation)
        width_in = input_dim
        for i, width in enumerate(hidden, start=1):
            setattr(self, f"fc{i}", nn.Linear(width_in, width))
            width_in = width
        self.out = nn.Linear(width_in, output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() > 2:
            x = x.flatten(1)
        for i in range(1, len(self.hidden) + 1):
            x = self._act(getattr(self, f"fc{i}")(x))
        return self.out(x)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


class LeNet300100(MLP):
    """LeNet-300-100 (seed 002): ``fc1`` (→300), ``fc2`` (→100), ``out`` (→10), ReLU.

    Shapes: input ``[B, 784]`` or images ``[B, 1, 28, 28]`` / ``[B, 28, 28]`` (flattened);
    output ``[B, output_dim]`` logits.
    """

    def __init__(self, input_dim: int = 784, output_dim: int = 10, activation: str = "relu"):
        super().__init__(input_dim, output_dim, hidden=(300, 100), activation=activation)


# --------------------------------------------------------------------------------------------
# Multi-head LSTM (seed 000, Fig. 1)
# --------------------------------------------------------------------------------------------


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
    """Seed 000, Fig. 1: one LSTM per Euler angle over the same sequence, three linear heads.

    Each LSTM ``lstm_<name>`` (one layer, batch-first) reads the *whole* input sequence; their
    last hidden states are concatenated (the "combined representation", ``[B, n*H]``) and
    every head ``head_<name>`` (``Linear(n*H, 1)``) maps the combined representation to one
    output; head outputs are concatenated in ``names`` order.

    Args:
        input_size: features per time step ``F`` (3, the three angles; Fig. 1 lists 17,408
            parameters per LSTM = 4*64*(3+64+1), i.e. 3 features, although it prints a
            ``(None, 15, 1)`` input).
        hidden_size: LSTM width ``H`` (64 in Fig. 1).
        n_outputs: number of LSTM/head pairs; must equal ``len(names)``.
        names: suffixes of the module names, default ``("phi1", "phi", "phi2")``.
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
        unrolled: bool = False,
    ):
        super().__init__()
        self.input_size = _positive_int(input_size, "input_size")
        self.hidden_size = _positive_int(hidden_size, "hidden_size")
        names = tuple(names)
        if n_outputs != len(names):
            raise ValueError(
                f"n_outputs={n_outputs} but {len(names)} names {names!r} were given; pass "
                f"names=... with one name per output"
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
            setattr(self, f"head_{name}", nn.Linear(len(names) * hidden_size, 1))
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
        return torch.cat([getattr(self, f"head_{n}")(combined) for n in self.names], dim=-1)


# --------------------------------------------------------------------------------------------
# LeNet-5 style CNN
# --------------------------------------------------------------------------------------------


class SmallCNN(nn.Module):
    """LeNet-5 style CNN: ``conv1 -> pool -> conv2 -> pool -> fc1 -> fc2 -> out``.

    ``conv1``: C→6 channels, ``conv2``: 6→16 channels, both 5x5 with padding 2 (size kept),
    each followed by ReLU and 2x2 max pooling; then ``fc1`` (→120), ``fc2`` (→84), ReLU, and
    ``out`` (→num_classes).  Works for 8x8 digits and 28x28 MNIST alike.

    Args:
        in_channels: ``C``.
        image_size: side ``S`` of the square images (at least 4).
        num_classes: ``K``.

    Shapes: input ``[B, C, S, S]`` or flat ``[B, C*S*S]`` (also ``[B, S, S]`` when
    ``C == 1``); output ``[B, K]`` logits.
    """

    def __init__(self, in_channels: int = 1, image_size: int = 28, num_classes: int = 10):
        super().__init__()
        self.in_channels = _positive_int(in_channels, "in_channels")
        self.image_size = _positive_int(image_size, "image_size")
        if image_size < 4:
            raise ValueError(f"image_size must be at least 4 (two 2x2 poolings), got {image_size}")
        self.num_classes = _positive_int(num_classes, "num_classes")
        self.conv1 = nn.Conv2d(in_channels, 6, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, kernel_size=5, padding=2)
        side = image_size // 2 // 2
        self.fc1 = nn.Linear(16 * side * side, 120)
        self.fc2 = nn.Linear(120, 84)
        self.out = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c, s = self.in_channels, self.image_size
        if x.dim() == 2:
            if x.shape[1] != c * s * s:
                raise ValueError(f"flat input must have {c}*{s}*{s} = {c * s * s} features, got {x.shape[1]}")
            x = x.reshape(x.shape[0], c, s, s)
        elif x.dim() == 3 and c == 1:
            x = x.unsqueeze(1)
        if x.dim() != 4 or tuple(x.shape[1:]) != (c, s, s):
            raise ValueError(f"SmallCNN expects [B, {c}, {s}, {s}] or [B, {c * s * s}], got {tuple(x.shape)}")
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.out(x)


# --------------------------------------------------------------------------------------------
# Transformer classifier (seed 002, §3.2)
# --------------------------------------------------------------------------------------------


class FeedForward(nn.Module):
    """Position-wise feed-forward block ``fc2(relu(fc1(x)))``: ``[..., d_model] -> [..., d_model]``."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)))


class SelfAttention(nn.MultiheadAttention):
    """Batch-first multi-head *self*-attention with plain tensor maths.

    Same parameters (``in_proj_weight``, ``in_proj_bias``, ``out_proj.weight``,
    ``out_proj.bias``) and same result as ``nn.MultiheadAttention(d, h, batch_first=True)``
    called as ``mha(x, x, x, key_padding_mask=mask, need_weights=False)[0]`` (no dropout),
    but it never takes PyTorch's fused fast path, which has no ``vmap`` batching rule.

    Shapes: ``x [B, T, d]``, optional ``key_padding_mask [B, T]`` (``True`` = ignore that
    key); returns ``[B, T, d]`` (a tensor, not a tuple).
    """

    def __init__(self, embed_dim: int, num_heads: int):
        super().__init__(embed_dim, num_heads, batch_first=True)

    def forward(self, x: torch.Tensor, key_padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        batch, steps, dim = x.shape
        heads = self.num_heads
        q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        q, k, v = (t.reshape(batch, steps, heads, dim // heads).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(dim // heads)  # [B, h, T, T]
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, None, :], torch.finfo(scores.dtype).min)
        attended = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(batch, steps, dim)
        return self.out_proj(attended)


_POOLINGS = ("mean", "max")


class TransformerClassifier(nn.Module):
    """Sequence classifier with one Transformer encoder block (seed 002, §3.2).

    ``x = embedding(tokens) + pos_embedding(positions)``;
    ``x = norm1(x + attention(x))``; ``x = norm2(x + ffn(x))`` with ``ffn = fc2(relu(fc1))``;
    pooled over time (mean by default); ``head`` maps to class logits.  In seed 002 only the
    feed-forward block (``ffn.*``) is Bayesian.

    Args:
        vocab_size: number of token ids; ``None`` for real-valued sequences, which are
            projected by ``input_proj`` (``Linear(input_dim, d_model)``) instead of embedded.
        num_classes: ``K``.
        d_model, n_heads, d_ff: width, attention heads (must divide ``d_model``), FFN width.
        max_len: longest sequence (size of ``pos_embedding``).
        pooling: ``"mean"`` or ``"max"`` over time (padding positions excluded).
        input_dim: features per time step ``F`` when ``vocab_size is None``.
        padding_idx: token id of padding (token mode only); padded keys are masked out of
            attention and pooling.

    Shapes:
        token mode: int64 ``[B, T]``; real mode: ``[B, T, F]``, or flat ``[B, T*F]``
        (reshaped to ``[B, T, F]``, e.g. 8x8 digits as 8 rows of 8 pixels).  ``T <= max_len``.
        Output ``[B, K]`` logits.
    """

    def __init__(
        self,
        vocab_size: Optional[int],
        num_classes: int,
        d_model: int = 32,
        n_heads: int = 4,
        d_ff: int = 64,
        max_len: int = 512,
        pooling: str = "mean",
        input_dim: Optional[int] = None,
        padding_idx: Optional[int] = None,
    ):
        super().__init__()
        self.num_classes = _positive_int(num_classes, "num_classes")
        _positive_int(d_model, "d_model")
        _positive_int(n_heads, "n_heads")
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.max_len = _positive_int(max_len, "max_len")
        if pooling not in _POOLINGS:
            raise ValueError(f"unknown pooling {pooling!r}; valid poolings: {', '.join(_POOLINGS)}")
        self.pooling = pooling
        self.vocab_size = vocab_size
        self.padding_idx = padding_idx
        if vocab_size is None:
            if input_dim is None:
                raise ValueError("vocab_size=None (real-valued sequences) needs input_dim (features per step)")
            if padding_idx is not None:
                raise ValueError("padding_idx applies to token inputs only (vocab_size is None)")
            self.input_dim = _positive_int(input_dim, "input_dim")
            self.input_proj = nn.Linear(input_dim, d_model)
        else:
            _positive_int(vocab_size, "vocab_size")
            if padding_idx is not None and not 0 <= padding_idx < vocab_size:
                raise ValueError(f"padding_idx={padding_idx} is outside [0, {vocab_size})")
            self.input_dim = None
            self.embedding = nn.Embedding(vocab_size, d_model)
        self.pos_embedding = nn.Embedding(max_len, d_model)
        self.attention = SelfAttention(d_model, n_heads)
        self.norm1 = nn.LayerNorm(d_model)
        self.ffn = FeedForward(d_model, d_ff)
        self.norm2 = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def _embed(self, x: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        if self.vocab_size is not None:
            if x.dim() != 2 or x.dtype not in (torch.int64, torch.int32):
                raise ValueError(f"token mode expects integer tokens [B, T], got {tuple(x.shape)} {x.dtype}")
            pad = None if self.padding_idx is None else x == self.padding_idx
            return self.embedding(x), pad
        if x.dim() == 2:
            if x.shape[1] % self.input_dim:
                raise ValueError(
                    f"flat input [B, {x.shape[1]}] is not a whole number of steps of input_dim={self.input_dim}"
                )
            x = x.reshape(x.shape[0], -1, self.input_dim)
        if x.dim() != 3 or x.shape[-1] != self.input_dim:
            raise ValueError(f"real-valued mode expects [B, T, {self.input_dim}], got {tuple(x.shape)}")
        return self.input_proj(x), None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, pad = self._embed(x)
        steps = h.shape[1]
        if steps > self.max_len:
            raise ValueError(f"sequence length {steps} exceeds max_len={self.max_len}")
        h = h + self.pos_embedding(torch.arange(steps, device=h.device))
        h = self.norm1(h + self.attention(h, key_padding_mask=pad))
        h = self.norm2(h + self.ffn(h))
        if self.pooling == "mean":
            if pad is None:
                pooled = h.mean(dim=1)
            else:
                keep = (~pad).unsqueeze(-1).to(h.dtype)
                pooled = (h * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1.0)
        else:
            if pad is not None:
                h = h.masked_fill(pad.unsqueeze(-1), torch.finfo(h.dtype).min)
            pooled = h.amax(dim=1)
        return self.head(pooled)


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------


def _no_option(name: str, option: str, value) -> None:
    if value is not None:
        raise ValueError(f"architecture {name!r} does not take {option}={value!r}")


def _build_mlp(input_dim, output_dim, hidden=None, activation=None, **kw) -> nn.Module:
    return MLP(input_dim, output_dim, hidden=(50,) if hidden is None else hidden, activation=activation or "relu", **kw)


def _build_lenet(input_dim, output_dim, hidden=None, activation=None, **kw) -> nn.Module:
    if hidden is not None and tuple([hidden] if isinstance(hidden, int) else hidden) != (300, 100):
        raise ValueError(f"lenet300100 has hidden widths (300, 100); got hidden={hidden!r} (use 'mlp' instead)")
    return LeNet300100(784 if input_dim is None else input_dim, 10 if output_dim is None else output_dim,
                       activation=activation or "relu", **kw)


def _build_multilstm(input_dim, output_dim, hidden=None, activation=None, **kw) -> nn.Module:
    _no_option("multilstm", "activation", activation)
    if hidden is not None and not isinstance(hidden, int):
        hidden = tuple(hidden)
        if len(hidden) != 1:
            raise ValueError(f"multilstm takes one hidden size (LSTM width), got hidden={hidden!r}")
        hidden = hidden[0]
    if "names" not in kw and output_dim is not None and output_dim != 3:
        kw["names"] = tuple(f"y{i}" for i in range(output_dim))
    return MultiLSTM(
        input_size=3 if input_dim is None else input_dim,
        hidden_size=64 if hidden is None else hidden,
        n_outputs=3 if output_dim is None else output_dim,
        **kw,
    )


def _build_cnn(input_dim, output_dim, hidden=None, activation=None, **kw) -> nn.Module:
    _no_option("cnn", "hidden", hidden)
    _no_option("cnn", "activation", activation)
    in_channels = kw.pop("in_channels", None)
    image_size = kw.pop("image_size", None)
    if isinstance(input_dim, (tuple, list, torch.Size)):
        if len(input_dim) != 3 or input_dim[1] != input_dim[2]:
            raise ValueError(f"cnn input_dim must be (C, S, S) or C*S*S, got {tuple(input_dim)}")
        in_channels = in_channels or input_dim[0]
        image_size = image_size or input_dim[1]
    elif input_dim is not None:
        in_channels = in_channels or 1
        if image_size is None:
            image_size = math.isqrt(input_dim // in_channels)
        if in_channels * image_size * image_size != input_dim:
            raise ValueError(
                f"cnn: input_dim={input_dim} is not in_channels*S*S for in_channels={in_channels}; "
                "pass in_channels= and image_size="
            )
    return SmallCNN(
        in_channels=in_channels or 1,
        image_size=image_size or 28,
        num_classes=10 if output_dim is None else output_dim,
        **kw,
    )


def _build_transformer(input_dim, output_dim, hidden=None, activation=None, **kw) -> nn.Module:
    _no_option("transformer", "activation", activation)
    if hidden is not None:
        hidden = (hidden,) if isinstance(hidden, int) else tuple(hidden)
        if len(hidden) != 1:
            raise ValueError(f"transformer takes one hidden size (the FFN width d_ff), got hidden={hidden!r}")
        kw.setdefault("d_ff", hidden[0])
    vocab_size = kw.pop("vocab_size", None)
    token_dim = kw.pop("token_dim", None)
    if vocab_size is None:
        kw["input_dim"] = token_dim or kw.get("input_dim") or input_dim
    return TransformerClassifier(vocab_size, 2 if output_dim is None else output_dim, **kw)


ARCHITECTURES: dict[str, Callable[..., nn.Module]] = {
    "mlp": _build_mlp,
    "lenet300100": _build_lenet,
    "multilstm": _build_multilstm,
    "cnn": _build_cnn,
    "transformer": _build_transformer,
}
"""Architecture builders by name; each is called as ``builder(input_dim, output_dim,
hidden=None, activation=None, **kw)`` (see :func:`build_architecture`)."""


def build_architecture(
    name: str,
    input_dim,
    output_dim: Optional[int],
    hidden=None,
    activation: Optional[str] = None,
    **kw,
) -> nn.Module:
    """Build an architecture of :data:`ARCHITECTURES` by name.

    Args:
        name: ``mlp`` | ``lenet300100`` | ``multilstm`` | ``cnn`` | ``transformer``.
        input_dim: ``mlp``/``lenet300100``: number of input features; ``multilstm``:
            features per time step; ``cnn``: ``C*S*S`` (``C = in_channels``, default 1) or
            ``(C, S, S)``; ``transformer``: features per time step of real-valued sequences
            (ignored when ``vocab_size=`` is given; ``token_dim=`` overrides it, e.g.
            ``input_dim=64, token_dim=8`` reads 8x8 digits as 8 rows of 8 pixels).
        output_dim: outputs / classes.
        hidden: ``mlp``: hidden widths (default one layer of 50 units, the UCI standard);
            ``multilstm``: LSTM width (default 64); ``transformer``: FFN width ``d_ff``;
            ``lenet300100`` only accepts ``(300, 100)``; ``cnn`` accepts none.
        activation: ``mlp`` / ``lenet300100`` only (default ``"relu"``).
        **kw: passed to the class (e.g. ``vocab_size=``, ``d_model=``, ``unrolled=``,
            ``image_size=``).

    Raises:
        ValueError: unknown name (listing the valid ones) or an option the architecture
            does not take.
    """
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}; valid architectures: {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[name](input_dim, output_dim, hidden=hidden, activation=activation, **kw)


# --------------------------------------------------------------------------------------------
# Forward order / output modules
# --------------------------------------------------------------------------------------------


def _owners(module: nn.Module) -> list[str]:
    """Names of the modules owning parameters directly (``""`` for the root), registration order."""
    return [name for name, m in module.named_modules() if next(m.parameters(recurse=False), None) is not None]


def parametrised_modules_in_forward_order(module: nn.Module, example_input) -> list[str]:
    """Names of the modules that own parameters, in the order their forward hooks fire.

    A module "owns" parameters when it has parameters of its own (not only through
    children): leaf layers, but also e.g. an attention module's ``in_proj_weight``.  A
    forward hook fires when a module's forward *returns*, so a parent owner comes after its
    children; a module called twice is listed at its first call; a parametrised module whose
    forward is never called but whose parent's is (e.g. a weight read directly by the parent)
    is listed right before that parent.  Owners never reached by the forward pass are left
    out.  The root module is listed as ``""`` if it owns parameters.

    Args:
        module: the network (its train/eval mode is left as is; runs under ``no_grad``).
        example_input: a tensor (or a tuple of positional arguments) to run the forward on.
    """
    owners = set(_owners(module))
    fired: list[str] = []
    seen: set[str] = set()
    called: set[str] = set()
    names = {id(m): n for n, m in module.named_modules()}

    def hook(mod, _inputs, _output):
        name = names[id(mod)]
        called.add(name)
        if name in seen:
            return
        prefix = f"{name}." if name else ""
        # owners below this module that never ran themselves (their weights were used directly)
        for child in sorted(owners):
            if child != name and child.startswith(prefix) and child not in seen and child not in called:
                fired.append(child)
                seen.add(child)
        if name in owners:
            fired.append(name)
            seen.add(name)

    handles = [m.register_forward_hook(hook) for m in module.modules()]
    args = example_input if isinstance(example_input, tuple) else (example_input,)
    try:
        with torch.no_grad():
            module(*args)
    finally:
        for h in handles:
            h.remove()
    return fired


def output_modules(module: nn.Module, example_input=None) -> tuple[str, ...]:
    """The "last" parametrised module(s) of a network (for the ``last`` selector).

    If the network has a ``last_layer_names`` attribute (a multi-head net such as
    :class:`MultiLSTM`: all heads are fed by the final concatenation) those names are
    returned; otherwise the last entry of :func:`parametrised_modules_in_forward_order` on
    ``example_input`` (e.g. ``("out",)`` for an :class:`MLP`).

    Raises:
        ValueError: ``last_layer_names`` names an unknown module, the forward order is
            needed but ``example_input`` is missing, or nothing parametrised ran.
    """
    names = getattr(module, "last_layer_names", None)
    if names is not None:
        names = (names,) if isinstance(names, str) else tuple(names)
        known = dict(module.named_modules())
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"last_layer_names lists unknown modules {unknown}; modules: {', '.join(n for n in known if n)}")
        return names
    if example_input is None:
        raise ValueError(
            f"{type(module).__name__} has no last_layer_names attribute: pass example_input so the "
            "forward order can decide which module is last"
        )
    order = parametrised_modules_in_forward_order(module, example_input)
    if not order:
        raise ValueError(f"no parametrised module of {type(module).__name__} ran on the example input")
    return (order[-1],)
