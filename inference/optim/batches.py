"""Where a training loop's minibatches come from: in-memory tensors or a ``DataLoader``.

* :class:`TensorBatches` — tensors ``x [N, ...]``, ``y [N, ...]``, reshuffled every epoch by a
  seeded generator (:func:`minibatches`);
* :class:`LoaderBatches` — the batches of a ``torch.utils.data.DataLoader``, in its own order.

Both give ``num_data`` (N, for the N/n likelihood scaling), ``steps_per_epoch`` and
``epoch(generator)``, an iterator of ``(x_batch, y_batch)``.
"""
from __future__ import annotations

import itertools
import math
from typing import Callable, Optional

import torch

__all__ = ["minibatches", "TensorBatches", "LoaderBatches", "as_batches", "loader_info"]


def minibatches(num_data: int, batch_size: Optional[int], generator: torch.Generator):
    """Indices of one shuffled epoch, in batches of ``batch_size`` (``None`` = full batch)."""
    if batch_size is None or batch_size >= num_data:
        yield torch.arange(num_data)
        return
    order = torch.randperm(num_data, generator=generator)
    for start in range(0, num_data, batch_size):
        yield order[start : start + batch_size]


class TensorBatches:
    """Minibatches of in-memory tensors ``x [N, ...]``, ``y [N, ...]``: a fresh shuffle each epoch.

    ``batch_size=None`` gives one full batch per epoch (the generator is then not used).
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: Optional[int]):
        self.x, self.y, self.batch_size = x, y, batch_size
        self.num_data = x.shape[0]
        self.steps_per_epoch = math.ceil(self.num_data / (batch_size or self.num_data))

    def epoch(self, generator: torch.Generator):
        """``(x_batch, y_batch)`` pairs of one epoch."""
        for index in minibatches(self.num_data, self.batch_size, generator):
            yield self.x[index], self.y[index]


class LoaderBatches:
    """Minibatches from a ``torch.utils.data.DataLoader`` over a map-style dataset of ``(x, y)`` rows.

    Each epoch iterates the loader once (its own order: shuffled or not, its own batch size);
    N is ``len(loader.dataset)``, so the likelihood of a batch of n rows is scaled by N/n.
    ``check(x_batch, y_batch) -> (x_batch, y_batch)`` validates and canonicalises each batch.
    """

    def __init__(self, loader, check: Callable):
        self.loader, self.check = loader, check
        self.num_data = len(loader.dataset)
        self.steps_per_epoch = len(loader)

    def epoch(self, generator: torch.Generator):
        """``(x_batch, y_batch)`` pairs of one pass over the loader.

        The loader runs with the global random state forked: the seeds it draws (its shuffle,
        its workers' base seed) do not move the stream the fit's Monte Carlo draws come from.
        """
        with torch.random.fork_rng(devices=[]):
            batches = iter(self.loader)
        for number in itertools.count():
            with torch.random.fork_rng(devices=[]):
                batch = next(batches, None)
            if batch is None:
                return
            if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
                raise ValueError(f"DataLoader batch {number} is a {type(batch).__name__}; a batch must be a pair "
                                 f"(x_batch, y_batch), e.g. from a TensorDataset(x, y)")
            try:
                yield self.check(*batch)
            except ValueError as err:
                raise ValueError(f"DataLoader batch {number}: {err}") from None


def as_batches(x, y, batch_size: Optional[int]):
    """``x`` if it is already a batch source, else :class:`TensorBatches` of ``(x, y)``."""
    return x if isinstance(x, (TensorBatches, LoaderBatches)) else TensorBatches(x, y, batch_size)


def loader_info(data) -> dict:
    """``{"data_loader": {"batches_per_epoch", "batch_size"}}`` for ``posterior.info`` when ``data`` is a
    :class:`LoaderBatches`, else ``{}``."""
    if not isinstance(data, LoaderBatches):
        return {}
    return {"data_loader": {"batches_per_epoch": data.steps_per_epoch, "batch_size": data.loader.batch_size}}
