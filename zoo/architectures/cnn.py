"""Convolutional networks: :class:`SmallCNN`, a LeNet-5 style CNN (LeCun et al. 1998)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._common import positive_int

__all__ = ["SmallCNN"]


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
        self.in_channels = positive_int(in_channels, "in_channels")
        self.image_size = positive_int(image_size, "image_size")
        if image_size < 4:
            raise ValueError(f"image_size must be at least 4 (two 2x2 poolings), got {image_size}")
        self.num_classes = positive_int(num_classes, "num_classes")
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
