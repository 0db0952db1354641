"""A random mean head with a deterministic variance head, for likelihoods with ``heads > 1``.

A :class:`~zoo.likelihoods.HeteroscedasticGaussianLikelihood` network's output layer stacks
the mean rows (outputs ``0..T-1``) over the log-variance rows (``T..2T-1``).  :class:`MeanHead`
takes any selection and keeps only the mean rows of the output layer(s) random, the
variance rows deterministic (point estimates, trained jointly): the variance is then a
deterministic function of the random features.  Presets:

* ``"mean-head"`` — every parameter random except the output layer's variance rows;
* ``"last-mean-head"`` — only the output layer's mean rows random (last-layer BNN).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .stochastic import ElementMasks, Selector, as_selector, last_module_names

__all__ = ["MeanHead", "HEAD_PRESETS", "head_selector"]

#: ``--stochastic`` presets → the selection whose output-layer variance rows become deterministic
HEAD_PRESETS = {"mean-head": "all", "last-mean-head": "last"}


class MeanHead(Selector):
    """``inner``'s selection with the output layer's rows past the first ``1/heads`` fixed.

    Args:
        inner: any selection (``"all"``, ``"last"``, patterns, a :class:`Selector`).
        heads: network outputs per target (2 for mean and log-variance).

    The output layer is the module(s) ``"last"`` selects (:func:`zoo.stochastic.last_module_names`);
    its parameters whose first dimension is the network's output count are split by rows.
    """

    def __init__(self, inner="all", heads: int = 2):
        if isinstance(heads, bool) or not isinstance(heads, int) or heads < 2:
            raise ValueError(f"MeanHead needs heads >= 2 (outputs per target), got {heads!r}")
        self.inner, self.heads = as_selector(inner), heads

    def __repr__(self):
        return f"MeanHead({self.inner!r}, heads={self.heads})"

    def _select(self, module: nn.Module, example_input: Optional[torch.Tensor]):
        sites = self.inner.select(module, example_input)
        masks = {s.name: torch.ones(s.param_shape, dtype=torch.bool) if s.mask is None else s.mask.cpu().clone()
                 for s in sites}
        heads_of = last_module_names(module, example_input)
        split = False
        for owner in heads_of:
            for local, param in module.get_submodule(owner).named_parameters(recurse=False):
                name = f"{owner}.{local}" if owner else local
                rows = param.shape[0]
                if name not in masks or rows % self.heads:
                    continue
                masks[name][rows // self.heads:] = False
                split = True
        if not split:
            raise ValueError(f"{self!r}: the selection has no output-layer parameter whose rows split into "
                             f"{self.heads} heads (output modules: {', '.join(heads_of)})")
        return ElementMasks({n: m for n, m in masks.items() if bool(m.any())}, "current").select(module)


def head_selector(stochastic, heads: int) -> Optional[MeanHead]:
    """The :class:`MeanHead` of a ``HEAD_PRESETS`` name, ``None`` for any other selection.

    Raises ``ValueError`` for a head preset with a one-head likelihood.
    """
    if not isinstance(stochastic, str) or stochastic not in HEAD_PRESETS:
        return None
    if heads < 2:
        raise ValueError(f"--stochastic {stochastic} needs a likelihood with a variance head (heteroscedastic); "
                         f"this likelihood has one network output per target")
    return MeanHead(HEAD_PRESETS[stochastic], heads)
