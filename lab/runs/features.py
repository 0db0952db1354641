"""The inputs of a network's output layer(s) as a data set: last-layer inference on a frozen body.

:func:`frozen_features` is used by the grids' ``frozen-features`` / ``frozen-states`` builders
(:mod:`lab.grids.experiment`) and by the frozen-body reference problems (:mod:`lab.references.problems`).
"""
from __future__ import annotations

import dataclasses

import torch

from zoo.architectures import output_modules
from zoo.data import Dataset

__all__ = ["frozen_features", "WHITENING_CUTOFF"]


#: principal components of the frozen features with variance below this share of the largest are dropped
WHITENING_CUTOFF = 1e-6


def frozen_features(data: Dataset, net: torch.nn.Module, cutoff: float = WHITENING_CUTOFF,
                    whiten: bool = True) -> Dataset:
    """The inputs of ``net``'s output layer(s), whitened, as a new dataset (same targets, same units).

    Last-layer inference with a linear model on these features is last-layer inference on the
    network with its body frozen at its trained weights.  For a
    :class:`~zoo.architectures.MultiLSTM` all three heads read the same 192-d concatenation,
    so one ``Linear(k, 3)`` spans exactly the three heads.  The features ``h [N, d]`` are
    nearly collinear (covariance eigenvalues many orders of magnitude below the largest),
    which makes a head's posterior extremely elongated; they are therefore mapped to their
    whitened principal components
    ``z = (h − mean) V Λ^{-1/2}`` (training statistics), keeping the ``k`` components with
    variance ≥ ``cutoff`` × the largest.  The head's function class is unchanged up to the
    dropped near-constant directions; its N(0, 1) prior is then a prior on whitened weights.
    ``info["whitened"]`` records ``k`` and ``d``.

    ``whiten=False`` keeps the features as the body computes them (``info["whitened"] = None``):
    the choice for a head that predicts a *log-variance*.  Linear in whitened features, whose
    low-variance directions are scaled up to unit variance (test points reach norms of 140
    against a median of 5.5 on the Euler states), a log-variance extrapolates exponentially and
    the β-NLL mean fit is starved on exactly those points; the LSTM's own states are bounded by tanh.
    """
    heads = [net.get_submodule(n) for n in output_modules(net, data.x_train[:2])]
    captured = []
    hooks = [h.register_forward_hook(lambda m, inputs, out: captured.append(inputs[0])) for h in heads]

    def features(x):
        chunks = []
        with torch.no_grad():
            for part in torch.split(x, 4096):
                captured.clear()
                net(part)
                if any(not torch.equal(c, captured[0]) for c in captured):
                    raise ValueError("the output layers read different inputs; frozen_features needs one shared input")
                chunks.append(captured[0])
        return torch.cat(chunks).double()

    try:
        h_train, h_test = features(data.x_train), features(data.x_test)
    finally:
        for h in hooks:
            h.remove()
    if whiten:
        mean = h_train.mean(0)
        values, vectors = torch.linalg.eigh(torch.cov(h_train.T, correction=0))
        keep = values >= cutoff * values.max()
        projection = vectors[:, keep] / values[keep].sqrt()
        x_train, x_test = ((h - mean) @ projection for h in (h_train, h_test))
        whitened = {"kept": int(keep.sum()), "of": int(h_train.shape[1])}
    else:
        x_train, x_test, whitened = h_train, h_test, None
    dim = x_train.shape[1]
    return dataclasses.replace(data, name=f"{data.name}-features", x_train=x_train.float(), x_test=x_test.float(),
                               x_loc=torch.zeros(dim), x_scale=torch.ones(dim), feature_names=[],
                               info={**data.info, "whitened": whitened})
