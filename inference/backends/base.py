"""The contract every inference backend follows.

A backend is an object with a ``name``, a ``Config`` dataclass of its options and
``run(bnn, x, y, config, seed, progress) -> Posterior``.  :func:`inference.fit` parses
options into the config (unknown options → a ``ValueError`` listing the valid ones),
validates the data, and dispatches through the ``BACKENDS`` registry.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

__all__ = ["Backend", "NonFiniteLossError", "parse_config", "check_training_data", "minibatches"]


class NonFiniteLossError(RuntimeError):
    """Raised when a loss or gradient becomes NaN/inf.

    Attributes:
        step: the optimisation step (0-based) at which it happened.
        posterior: the result built from the last finite parameters (no update with a
            non-finite loss or gradient is ever applied), so the run is not lost.
    """

    def __init__(self, step: int, what: str, posterior=None):
        super().__init__(
            f"{what} became non-finite at step {step}; the run stopped and kept the last finite "
            f"parameters (available as .posterior). Try a smaller learning rate, gradient clipping "
            f"(optimizer='clipped-adam'), or check the data scaling."
        )
        self.step = step
        self.posterior = posterior


class Backend:
    """Base class of inference backends (one file per backend)."""

    name: str = ""
    Config: type = object

    def run(self, bnn, x, y, config, seed: int, progress: bool):  # pragma: no cover - abstract
        raise NotImplementedError


def parse_config(backend: Backend, options: dict):
    """``backend.Config(**options)`` with a clear error for unknown or invalid options."""
    fields = {f.name for f in dataclasses.fields(backend.Config)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for backend {backend.name!r}; valid options: {', '.join(sorted(fields))}"
        )
    config = backend.Config(**options)
    validate = getattr(config, "validate", None)
    if validate is not None:
        validate()
    return config


def check_training_data(bnn, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate training tensors against the model; return them with canonical dtypes/shapes."""
    from zoo.datasets import check_finite_array

    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise ValueError(f"x and y must be torch tensors, got {type(x).__name__} and {type(y).__name__}")
    check_finite_array(x, "x")
    check_finite_array(y, "y")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x has {x.shape[0]} rows but y has {y.shape[0]}; they must match")
    if bnn.likelihood.task == "regression":
        y = y.reshape(y.shape[0], -1).to(torch.float32)
        if y.shape[1] != bnn.output_dim:
            raise ValueError(f"y has {y.shape[1]} target columns but the network has {bnn.output_dim} outputs")
    else:
        if y.dim() != 1:
            raise ValueError(f"class labels must be a 1-D tensor [N], got shape {tuple(y.shape)}")
        y = y.long()
        if int(y.min()) < 0 or int(y.max()) >= bnn.output_dim:
            raise ValueError(
                f"class labels must lie in [0, {bnn.output_dim - 1}] for a network with {bnn.output_dim} "
                f"outputs; got labels in [{int(y.min())}, {int(y.max())}]"
            )
    return x, y


def minibatches(num_data: int, batch_size: Optional[int], generator: torch.Generator):
    """Indices of one shuffled epoch, in batches of ``batch_size`` (``None`` = full batch)."""
    if batch_size is None or batch_size >= num_data:
        yield torch.arange(num_data)
        return
    order = torch.randperm(num_data, generator=generator)
    for start in range(0, num_data, batch_size):
        yield order[start : start + batch_size]
