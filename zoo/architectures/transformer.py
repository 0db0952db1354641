"""Attention networks: :class:`TransformerClassifier`, one Transformer encoder block.

The encoder block is that of Vaswani et al. 2017 (post-norm, ReLU feed-forward, learned
position embeddings, no dropout).  The VariationalMLP.jl dissertation (see
``docs/references.md``) makes only its feed-forward sublayer (``ffn.*``) Bayesian; here any
selection of parameters can be stochastic.

:class:`SelfAttention` computes attention with plain tensor maths, so the whole classifier
works under :func:`torch.func.vmap` (PyTorch's fused attention fast path has no batching
rule).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ._common import positive_int

__all__ = ["FeedForward", "SelfAttention", "TransformerClassifier"]


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
    """Sequence classifier with one Transformer encoder block (Vaswani et al. 2017).

    ``x = embedding(tokens) + pos_embedding(positions)``;
    ``x = norm1(x + attention(x))``; ``x = norm2(x + ffn(x))`` with ``ffn = fc2(relu(fc1))``;
    pooled over time (mean by default); ``head`` maps to class logits.  The
    VariationalMLP.jl dissertation (§3.2) makes only the feed-forward block (``ffn.*``)
    Bayesian.

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
        self.num_classes = positive_int(num_classes, "num_classes")
        positive_int(d_model, "d_model")
        positive_int(n_heads, "n_heads")
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.max_len = positive_int(max_len, "max_len")
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
            self.input_dim = positive_int(input_dim, "input_dim")
            self.input_proj = nn.Linear(input_dim, d_model)
        else:
            positive_int(vocab_size, "vocab_size")
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
