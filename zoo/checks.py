"""Checks of what a user hands the Python API, run before any work.

Every public entry point (:class:`~zoo.bnn.BayesianNetwork`, ``inference.fit``,
``Posterior.predict``, ``inference.evaluate``, ``lab.report.write_report``) passes its arrays
through here, so that a bad argument is a ``ValueError`` naming the argument, what was expected
and what was given (``"x has 3 features; the network was built for 1"``) instead of a torch
error several frames deep.

* :func:`as_tensor` — numpy arrays are accepted everywhere and converted (the same rule at every
  entry point); anything else that is not a tensor is refused.
* :func:`check_input` — inputs ``x [N, ...]`` against a network: finite, at least one row, the
  input layout the network was built for (:func:`input_spec`: zoo MLPs and ``torch.nn``
  first layers are read statically), then one forward pass on two rows whose failure is reported
  as a problem of ``x`` (cached per input shape and dtype).
* :func:`check_targets` — targets against a model and a number of rows.
* :func:`check_dataset` — a :class:`~zoo.data.Dataset` given with a fitted model (reports).

Sizes are refused up front with their estimate by :mod:`zoo.resources`.
"""
from __future__ import annotations

import contextlib
import numbers
import warnings
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import nn

from .architectures import MLP, LeNet300100
from .data.checks import check_finite_array
from .likelihoods import Likelihood
from .priors import Prior

__all__ = ["as_tensor", "check_input", "check_targets", "check_dataset", "input_spec", "InputSpec", "check_count",
           "check_seed", "check_network_arguments", "target_scaling", "early_target_scaling", "IntegerTargetsWarning",
           "UnstandardisedTargetsWarning", "check_standardised_targets"]


class IntegerTargetsWarning(UserWarning):
    """Regression targets given with an integer dtype: fitted as real numbers, perhaps meant as class labels."""


class UnstandardisedTargetsWarning(UserWarning):
    """Regression targets far from standardised fitted by a model whose target scaling is the identity."""


#: a target column counts as standardised when |mean| ≤ 3 and its sd lies in [0.01, 10]
#: (:func:`check_standardised_targets`)
STANDARDISED_MEAN, STANDARDISED_SD = 3.0, (0.01, 10.0)


# ---------------------------------------------------------------------- conversion
def as_tensor(value, name: str) -> torch.Tensor:
    """``value`` as a dense real tensor: tensors as they are, numpy arrays converted (shared memory).

    Raises:
        ValueError: another type (lists, DataFrames, ...), a sparse or complex tensor, or a
            non-numeric numpy array; the message names ``name``.
    """
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            raise ValueError(f"{name} is a {value.layout} tensor; pass a dense tensor ({name}.to_dense())")
        if value.is_complex():
            raise ValueError(f"{name} has complex dtype {value.dtype}; pass real numbers")
        return value
    if isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
        if array.dtype.kind not in "biuf":
            raise ValueError(f"{name} is a numpy array of dtype {array.dtype}; pass numbers "
                             f"({name}.astype('float32'))")
        return torch.from_numpy(np.ascontiguousarray(array))
    raise ValueError(f"{name} must be a torch.Tensor or a numpy array, got {type(value).__name__}"
                     + ("; convert it with torch.as_tensor(...)" if isinstance(value, (list, tuple)) else ""))


def check_count(value, name: str, minimum: int = 1) -> int:
    """``value`` as an ``int >= minimum`` (integral floats such as ``1e3`` accepted; bools refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be an integer, at least {minimum}; got {value!r} ({type(value).__name__})")
    if not (isinstance(value, numbers.Integral) or (np.isfinite(float(value)) and float(value).is_integer())):
        raise ValueError(f"{name} must be an integer, at least {minimum}; got {value!r}")
    if int(value) < minimum:
        raise ValueError(f"{name} must be an integer, at least {minimum}; got {value!r}")
    return int(value)


def check_seed(seed) -> int:
    """``seed`` as an int in [0, 2**32) (the range of numpy's and Pyro's seeds)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an integer in [0, 2**32), got {seed!r} ({type(seed).__name__})")
    return int(seed)


# ---------------------------------------------------------------------- network inputs
@dataclass(frozen=True)
class InputSpec:
    """The inputs a network's first layer takes.

    Attributes:
        source: what the expectation was read from, e.g. ``"MLP(input_dim=1)"``.
        tokens: integer token ids (an embedding first) instead of real numbers.
        features: the number of features (``None`` for tokens).
        flat: ``features`` counts all entries of a row (the network flattens ``[N, ...]``);
            otherwise it is the size of dimension ``feature_dim``.
        feature_dim: the dimension holding the features when not ``flat`` (``-1``, or ``1``
            for convolutions' channels).
        dims: the allowed numbers of dimensions of ``x`` (``None``: any from 2 on).
    """

    source: str
    tokens: bool = False
    features: Optional[int] = None
    flat: bool = False
    feature_dim: int = -1
    dims: Optional[tuple] = None

    def layout(self) -> str:
        """The expected shape in words, e.g. ``"[N, 1]"``."""
        if self.tokens:
            return "[N, T] integer token ids"
        if self.flat:
            return f"[N, {self.features}]"
        if self.feature_dim == 1:
            return f"[N, {self.features}, ...] ({self.features} channels)"
        return f"[N, ..., {self.features}]"

    def check(self, x: torch.Tensor, name: str) -> None:
        """Raise a ``ValueError`` naming ``name`` if ``x`` does not have this layout."""
        expect = f"the network ({self.source}) takes {self.layout()}"
        if x.dim() < 2 or (self.dims is not None and x.dim() not in self.dims):
            hint = f"; for one feature per row pass {name}.reshape(-1, 1)" if x.dim() == 1 and self.features == 1 else ""
            raise ValueError(f"{name} has shape {tuple(x.shape)} ({x.dim()}-D); {expect}{hint}")
        if self.tokens:
            if x.is_floating_point():
                raise ValueError(f"{name} has dtype {x.dtype}; {expect}")
            return
        given = int(np.prod(x.shape[1:])) if self.flat else int(x.shape[self.feature_dim])
        if given != self.features:
            what = "entries per row" if self.flat and x.dim() > 2 else "channels" if self.feature_dim == 1 else "features"
            raise ValueError(f"{name} has {given} {what} (shape {tuple(x.shape)}); the network was built for "
                             f"{self.features} ({self.source} takes {self.layout()})")


def input_spec(net: nn.Module) -> Optional[InputSpec]:
    """The inputs ``net`` takes, read from its structure where that is certain, else ``None``.

    Known: the zoo's :class:`~zoo.architectures.MLP` and :class:`~zoo.architectures.LeNet300100`
    (flattened rows of ``input_dim`` features; not subclasses, whose forward may differ), and the
    ``torch.nn`` layers ``Linear``, ``Conv1d/2d/3d`` and ``Embedding``, alone or first in a
    ``Sequential`` (``Flatten`` + ``Linear`` counts flattened rows).  Other networks: ``None``, and
    :func:`check_input` relies on a forward pass.
    """
    if type(net) in (MLP, LeNet300100):
        return InputSpec(f"{type(net).__name__}(input_dim={net.input_dim})", features=net.input_dim, flat=True)
    if type(net) is nn.Sequential:
        children = list(net.children())
        if len(children) >= 2 and type(children[0]) is nn.Flatten and children[0].start_dim == 1 \
                and children[0].end_dim == -1 and type(children[1]) is nn.Linear:
            return InputSpec(f"Sequential(Flatten, Linear({children[1].in_features}, ...))",
                             features=children[1].in_features, flat=True)
        return input_spec(children[0]) if children else None
    if type(net) is nn.Linear:
        return InputSpec(f"Linear(in_features={net.in_features})", features=net.in_features)
    for cls, dims in ((nn.Conv1d, 3), (nn.Conv2d, 4), (nn.Conv3d, 5)):
        if type(net) is cls:
            return InputSpec(f"{cls.__name__}(in_channels={net.in_channels})", features=net.in_channels,
                             feature_dim=1, dims=(dims,))
    if type(net) is nn.Embedding:
        return InputSpec(f"Embedding({net.num_embeddings}, {net.embedding_dim})", tokens=True)
    return None


@contextlib.contextmanager
def _random_state_kept(device: torch.device):
    """The global RNG (and the device's) as it was on exit: a check never moves the user's random state."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        yield


def check_input(bnn, x, name: str = "x") -> torch.Tensor:
    """``x`` checked against ``bnn``'s network; returns it as a tensor (numpy converted).

    Checks, in order: a tensor or numpy array (:func:`as_tensor`) with at least one row and only
    finite values; the layout of :func:`input_spec` where the network's first layer says it
    (integer inputs of a real-valued network are converted to the model's floating dtype); then
    the network's forward on the first two rows (in prediction mode, the global random state
    kept), whose failure is reported as a problem of ``name``.  The forward check runs once per
    input shape after the batch dimension, dtype and device.

    Raises:
        ValueError: naming ``name``, what the network takes and what was given.
    """
    x = as_tensor(x, name)
    if x.dim() == 0:
        raise ValueError(f"{name} is a scalar; pass a batch of inputs [N, ...] (one row per point)")
    if x.dtype == torch.bool:
        raise ValueError(f"{name} has dtype torch.bool; pass numbers ({name}.float())")
    check_finite_array(x, name)
    spec = input_spec(bnn.net)
    if spec is not None:
        spec.check(x, name)
        if not spec.tokens and not x.is_floating_point():
            x = x.to(_model_like(bnn)["dtype"])
    key = (tuple(x.shape[1:]), x.dtype, x.device)
    accepted = bnn.__dict__.setdefault("_accepted_inputs", set())
    if key not in accepted:
        _probe(bnn, x, name)
        accepted.add(key)
    return x


def _model_like(bnn) -> dict:
    """``dtype`` and ``device`` of the model (its target scaling, or while it is built, its network's parameters)."""
    like = getattr(bnn, "target_scale", None)
    if like is None:
        like = next(bnn.net.parameters(), None)
    if like is None:
        return {"dtype": torch.get_default_dtype(), "device": torch.device("cpu")}
    return {"dtype": like.dtype, "device": like.device}


def _probe(bnn, x: torch.Tensor, name: str) -> None:
    """Run the network on ``x[:2]``; a failure becomes a ``ValueError`` about ``name``."""
    like = _model_like(bnn)
    sample = x[:2].to(**like) if x.is_floating_point() else x[:2].to(like["device"])
    net_name = type(bnn.net).__name__
    try:
        with torch.no_grad(), _random_state_kept(sample.device), bnn.prediction_mode():
            out = bnn.net(sample)
    except Exception as err:  # any failure of the user's forward on these inputs is reported as one about x
        reason = (str(err).strip().splitlines() or [""])[0]
        hint = ""
        if not x.is_floating_point():
            hint = f"; {name} holds integers ({x.dtype}): if they are numbers rather than token ids, pass {name}.float()"
        elif x.dim() == 1:
            hint = f"; {name} is 1-D: pass a batch [N, ...], e.g. {name}.reshape(-1, 1) for one feature per row"
        raise ValueError(f"{name} (shape {tuple(x.shape)}, {x.dtype}) does not fit the network: {net_name}.forward "
                         f"on its first rows raised {type(err).__name__}: {reason}{hint}") from err
    if isinstance(out, torch.Tensor) and out.dim() == 2 and out.shape[0] == sample.shape[0] \
            and getattr(bnn, "output_dim", None) is not None and out.shape[1] != bnn.output_dim:
        raise ValueError(f"{net_name} returns {out.shape[1]} outputs for {name}, but the model was built for "
                         f"{bnn.output_dim}")


# ---------------------------------------------------------------------- targets
def check_targets(bnn, y, rows: int, name: str = "y") -> torch.Tensor:
    """Targets ``y`` checked against ``bnn`` and ``rows`` inputs; returns them canonical.

    Regression: ``[N, T]`` (``[N]`` when ``T == 1``) real values, returned ``[N, T]`` in their
    own floating precision.  Targets of an integer dtype are accepted as numbers (float32) with an
    :class:`IntegerTargetsWarning` (they may be class labels given to a regression likelihood);
    one integer column for a network of several targets is refused with a ``ValueError`` naming
    ``CategoricalLikelihood``.  Whole numbers given as floats (e.g. UCI wine quality) are taken as
    they are, silently.  Classification: ``[N]`` integer labels in
    ``[0, K - 1]`` (integral floats accepted), returned int64.
    """
    y = as_tensor(y, name)
    if y.dim() == 0:
        raise ValueError(f"{name} is a scalar; pass one target per input row")
    if y.dtype == torch.bool:
        y = y.long()
    check_finite_array(y, name)
    if y.shape[0] != rows:
        raise ValueError(f"x has {rows} rows but {name} has {y.shape[0]}; they must match")
    if bnn.likelihood.task == "regression":
        integers = not y.is_floating_point()
        y = y.reshape(y.shape[0], -1)
        if integers and y.shape[1] == 1 and bnn.target_dim > 1:
            raise ValueError(
                f"{name} holds integer labels ({y.dtype}, values {int(y.min())}..{int(y.max())}) and the network has "
                f"{bnn.output_dim} outputs, but the model's likelihood is {type(bnn.likelihood).__name__}, for "
                f"regression. For classification, build the model with likelihood=CategoricalLikelihood() (from zoo; "
                f"one network output per class); for regression of whole numbers, pass {name}.float() with "
                f"{bnn.likelihood.heads} network output(s) per target")
        if integers:
            warnings.warn(
                f"{name} holds integers ({y.dtype}): {type(bnn.likelihood).__name__} fits them as real-valued "
                f"regression targets. If they are class labels, build the model with "
                f"likelihood=CategoricalLikelihood() and one network output per class; pass {name}.float() to say "
                f"they are numbers (and silence this note)", IntegerTargetsWarning, stacklevel=3)
            y = y.to(torch.float32)
        if y.shape[1] != bnn.target_dim:
            raise ValueError(f"{name} has {y.shape[1]} target columns but the model predicts {bnn.target_dim} targets "
                             f"({bnn.output_dim} network outputs, {bnn.likelihood.heads} per target for "
                             f"{type(bnn.likelihood).__name__}); build the network with "
                             f"{bnn.likelihood.heads * y.shape[1]} outputs")
        return y
    if y.dim() != 1:
        raise ValueError(f"class labels must be a 1-D tensor [N], got {name} of shape {tuple(y.shape)}")
    if y.is_floating_point():
        fractional = torch.nonzero(y != y.round()).flatten()
        if len(fractional):
            row = int(fractional[0])
            raise ValueError(f"{name} holds class labels that are not whole numbers (e.g. {float(y[row])!r} at row "
                             f"{row}); pass integer labels 0..{bnn.output_dim - 1}")
    y = y.long()
    if int(y.min()) < 0 or int(y.max()) >= bnn.output_dim:
        raise ValueError(f"class labels must lie in [0, {bnn.output_dim - 1}] for a network with {bnn.output_dim} "
                         f"outputs; got {name} with labels in [{int(y.min())}, {int(y.max())}]")
    return y


def check_standardised_targets(bnn, y: torch.Tensor, name: str = "y") -> None:
    """Warn (:class:`UnstandardisedTargetsWarning`) when checked regression targets ``y`` ``[N, T]`` are far from
    standardised — a column with |mean| > 3 or an sd outside [0.01, 10] — while ``bnn`` maps its outputs to
    original units by the identity (``target_loc`` 0, ``target_scale`` 1).  The library's priors and every
    backend's defaults (a noise sd of 0.1 or a Gamma prior around it, N(0, 1) weights, step sizes) assume targets
    of mean ≈ 0 and sd ≈ 1: raw targets (e.g. a mean of 30 and an sd of 7) are fitted, but the posteriors can be
    badly miscalibrated (a mean-field fit over every weight covered 32 % of a 90 % interval)."""
    if bnn.likelihood.task != "regression" or y.shape[0] < 2:
        return
    if not (bool((bnn.target_loc == 0).all()) and bool((bnn.target_scale == 1).all())):
        return
    mean, sd = y.mean(0), y.std(0)
    low, high = STANDARDISED_SD
    far = (mean.abs() > STANDARDISED_MEAN) | (sd < low) | (sd > high)
    if not bool(far.any()):
        return
    column = int(torch.nonzero(far).flatten()[0])
    warnings.warn(
        f"{name} is not standardised (column {column}: mean {float(mean[column]):.4g}, sd {float(sd[column]):.4g}) "
        f"but the model's target scaling is the identity; the priors and the backends' defaults assume targets of "
        f"mean ≈ 0 and sd ≈ 1, so the posterior can be badly miscalibrated. Standardise them and tell the model: "
        f"loc, scale = {name}.mean(0), {name}.std(0); bnn.set_target_scaling(loc, scale); then fit "
        f"({name} - loc) / scale — predictions come back in original units", UnstandardisedTargetsWarning,
        stacklevel=4)


def check_dataset(bnn, data, name: str = "data", num_data: Optional[int] = None) -> None:
    """A :class:`~zoo.data.Dataset` given with a model fitted on it (e.g. to a report), checked.

    Its task, inputs (:func:`check_input`, train and test) and targets (:func:`check_targets`)
    must fit ``bnn``; regression targets must be scaled as the model's (``data.y_loc`` /
    ``y_scale`` equal to ``bnn.target_loc`` / ``target_scale``), and ``num_data``, the
    training size the posterior records, must equal ``data.n_train`` when given.  A dataset
    other than the one fitted fails one of these in practice.
    """
    missing = [a for a in ("task", "x_train", "y_train", "x_test", "y_test", "y_loc", "y_scale") if not hasattr(data, a)]
    if missing:
        raise ValueError(f"{name} must be a zoo.data.Dataset, got {type(data).__name__} (no {', '.join(missing)})")
    task = bnn.likelihood.task
    if data.task != task:
        raise ValueError(f"{name} is a {data.task} dataset but the model's likelihood "
                         f"({type(bnn.likelihood).__name__}) is for {task}")
    for split in ("train", "test"):
        x = check_input(bnn, getattr(data, f"x_{split}"), f"{name}.x_{split}")
        check_targets(bnn, getattr(data, f"y_{split}"), x.shape[0], f"{name}.y_{split}")
    if num_data is not None and int(num_data) != data.x_train.shape[0]:
        raise ValueError(f"{name} has {data.x_train.shape[0]} training rows but the posterior was fitted on "
                         f"{int(num_data)}: pass the dataset it was fitted on")
    if task == "regression":
        for attr, buffer in (("y_loc", bnn.target_loc), ("y_scale", bnn.target_scale)):
            given = as_tensor(getattr(data, attr), f"{name}.{attr}").to(torch.float64).reshape(-1).cpu()
            model = buffer.detach().to(torch.float64).reshape(-1).cpu()
            if given.shape != model.shape or not torch.allclose(given, model, rtol=1e-5, atol=1e-6):
                raise ValueError(f"{name}.{attr} is {given.tolist()} but the model's target scaling is "
                                 f"{model.tolist()}: {name} is not the dataset the posterior was fitted on (or the "
                                 f"model was built without target_loc/target_scale from it)")


# ---------------------------------------------------------------------- BayesianNetwork arguments
def check_network_arguments(prior, likelihood, train_deterministic, output_dim) -> None:
    """A :class:`~zoo.bnn.BayesianNetwork`'s plain arguments, checked before any work (each error names one)."""
    if prior is not None and not isinstance(prior, Prior):
        raise ValueError(f"prior must be a zoo.priors.Prior (e.g. NormalPrior(1.0)), got {type(prior).__name__}")
    if likelihood is not None and not isinstance(likelihood, Likelihood):
        raise ValueError(f"likelihood must be a zoo.likelihoods.Likelihood (e.g. GaussianLikelihood()), got "
                         f"{type(likelihood).__name__}")
    if not isinstance(train_deterministic, bool):
        raise ValueError(f"train_deterministic must be True or False, got {train_deterministic!r}")
    if output_dim is not None and (isinstance(output_dim, bool) or not isinstance(output_dim, int) or output_dim < 1):
        raise ValueError(f"output_dim must be a positive integer, got {output_dim!r}")


def early_target_scaling(value, name: str):
    """``target_loc`` / ``target_scale`` checked as far as they can be before the number of targets is known."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    check_finite_array(as_tensor(value, name), name)
    return value


def target_scaling(value, name: str, target_dim: int) -> torch.Tensor:
    """``target_loc`` / ``target_scale``: finite numbers, one per target (or one for all), as a 1-D tensor."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = torch.tensor([float(value)])
    value = as_tensor(value, name).reshape(-1)
    check_finite_array(value, name)
    if value.numel() not in (1, target_dim):
        raise ValueError(f"{name} has {value.numel()} values; the model predicts {target_dim} target(s): give one "
                         f"value per target")
    return value if value.is_floating_point() else value.to(torch.get_default_dtype())
