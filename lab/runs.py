"""One reproducible run: data × architecture × stochastic subset × backend → a run directory.

:class:`RunSpec` is everything that defines a run; :func:`execute` performs it and writes

* ``metrics.json`` — test metrics in original units (RMSE, test log-likelihood, coverage,
  or accuracy/NLL/Brier/ECE), predictive R-hat/ESS, timings and the run's identity;
* ``posterior.nc`` — ArviZ InferenceData on the test set (NetCDF);
* ``posterior/`` — the saved :class:`~inference.posterior.Posterior` (reload with
  :func:`inference.load_posterior`);
* ``config.json`` — the spec, the resolved backend options and the data summary.

The CLI (``python -m zoo fit``) and the experiment runner both go through here.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

import torch

from zoo.architectures import build_architecture
from zoo.bnn import BayesianNetwork
from zoo.datasets import Dataset, load_dataset
from zoo.likelihoods import CategoricalLikelihood, GaussianLikelihood
from zoo.priors import make_prior
from zoo.stochastic import ElementMasks
from zoo.structured import STRUCTURED_PRESETS, parse_structured, preset_masks

from inference.arviz_export import save_netcdf
from inference.backends import BACKENDS, fit, get_backend
from inference.diagnostics import convergence_metrics, convergence_warning
from inference.metrics import evaluate
from inference.posterior import to_jsonable

__all__ = ["RunSpec", "build_model", "execute", "GENERIC_OPTIONS", "default_epochs"]

#: spec attribute → backend Config field, passed on when set (or defaulted) and the backend has it
GENERIC_OPTIONS = ("epochs", "batch_size", "lr", "num_samples", "pretrain_epochs")

#: optimisation steps the default number of epochs aims for
_TARGET_STEPS = 5000


@dataclass
class RunSpec:
    """Everything that defines one run (all fields JSON-serialisable).

    ``noise`` is ``"learned"`` (Gamma prior on the precision) or a fixed noise sd in
    standardised target units.  ``None`` options take the backend's / data's defaults.
    ``backend_options`` holds backend-specific options (e.g. ``num_chains``,
    ``warmup_steps``, ``step_size``, ``mc_kl_samples``).
    """

    data: str
    model: str = "mlp"
    stochastic: str = "all"
    backend: str = "svi"
    split: int = 0
    seed: int = 0
    hidden: Optional[list] = None
    activation: Optional[str] = None
    prior: str = "normal"
    prior_scale: Optional[float] = None
    noise: Union[str, float] = "learned"
    epochs: Optional[int] = None
    batch_size: Optional[int] = None
    lr: Optional[float] = None
    num_samples: Optional[int] = None
    pretrain_epochs: Optional[int] = None
    prune: str = "none"
    backend_options: dict = field(default_factory=dict)
    data_options: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def default_epochs(num_data: int, batch_size: Optional[int]) -> int:
    """Epochs giving about 5000 optimisation steps, clamped to [100, 2000]."""
    steps_per_epoch = math.ceil(num_data / (batch_size or num_data))
    return int(min(2000, max(100, math.ceil(_TARGET_STEPS / steps_per_epoch))))


def _likelihood(spec: RunSpec, data: Dataset):
    if data.task == "classification":
        return CategoricalLikelihood()
    if spec.noise == "learned":
        return GaussianLikelihood(learn_noise=True)
    try:
        noise_sd = float(spec.noise)
    except (TypeError, ValueError):
        raise ValueError(f"noise must be 'learned' or a positive number, got {spec.noise!r}") from None
    return GaussianLikelihood(noise_sd=noise_sd)


def build_model(spec: RunSpec, data: Dataset) -> BayesianNetwork:
    """The spec's architecture with its priors, sized for ``data`` and seeded by ``spec.seed``.

    ``stochastic="structured:PRESET"`` applies a :data:`zoo.structured.STRUCTURED_PRESETS`
    pattern (seed 003); ``*-map`` presets first fit the same net deterministically
    (``stochastic="none"``, SVI backend, the spec's epochs / batch size / lr) and fix the
    pattern's entries at those MAP values, the other weights starting from a fresh init.
    A ``multilstm`` whose LSTM weights are random uses the vmap-able unrolled LSTM.
    """
    preset = parse_structured(spec.stochastic)
    stochastic = spec.stochastic
    map_state = _map_state(spec, data) if preset and STRUCTURED_PRESETS[preset]["fixed_value"] == "map" else None
    unrolled = spec.model == "multilstm" and spec.stochastic not in ("none", "last")
    torch.manual_seed(spec.seed)
    net = build_architecture(
        spec.model, data.input_dim, data.output_dim, hidden=spec.hidden, activation=spec.activation,
        **({"unrolled": True} if unrolled else {}),
    )
    if preset:
        stochastic = ElementMasks(*preset_masks(net, preset, pretrained_state=map_state, seed=spec.seed))
    return BayesianNetwork(
        net,
        stochastic=stochastic,
        prior=make_prior(spec.prior, spec.prior_scale),
        likelihood=_likelihood(spec, data),
        example_input=data.x_train[:2],
        target_loc=data.y_loc if data.task == "regression" else None,
        target_scale=data.y_scale if data.task == "regression" else None,
    )


def _map_state(spec: RunSpec, data: Dataset) -> dict:
    """State dict of the spec's net fitted deterministically (for MAP-valued structured presets)."""
    det = dataclasses.replace(spec, stochastic="none", backend="svi", backend_options={}, prune="none")
    bnn = build_model(det, data)
    fit(bnn, data.x_train, data.y_train, backend="svi", seed=spec.seed, progress=False, **_backend_options(det, data))
    return {k: v.detach().clone() for k, v in bnn.net.state_dict().items()}


def _backend_options(spec: RunSpec, data: Dataset) -> dict:
    engine = get_backend(spec.backend)
    fields = {f.name for f in dataclasses.fields(engine.Config)}
    options = dict(spec.backend_options)
    for name in GENERIC_OPTIONS:
        value = getattr(spec, name)
        if value is None:
            continue
        if name not in fields:
            raise ValueError(
                f"option {name!r} does not apply to backend {spec.backend!r}; its options are: {', '.join(sorted(fields))}"
            )
        options[name] = value
    if "epochs" in fields and "epochs" not in options:
        batch = options.get("batch_size", _field_default(engine.Config, "batch_size"))
        options["epochs"] = default_epochs(data.n_train, batch)
    if "pretrain_epochs" in fields and "pretrain_epochs" not in options and spec.stochastic != "none":
        options["pretrain_epochs"] = options["epochs"] // 4
    return options


def _field_default(config_cls, name):
    for f in dataclasses.fields(config_cls):
        if f.name == name:
            return f.default
    return None


def execute(spec: RunSpec, out_dir, progress: bool = True, data: Optional[Dataset] = None) -> dict:
    """Fit, evaluate and export one run into ``out_dir``; returns the metrics dict."""
    if spec.backend not in BACKENDS:
        raise ValueError(f"unknown backend {spec.backend!r}; valid backends: {', '.join(BACKENDS)}")
    if data is None:
        data = load_dataset(spec.data, split=spec.split, seed=spec.seed, **spec.data_options)
    bnn = build_model(spec, data)
    options = _backend_options(spec, data)
    started = time.perf_counter()
    posterior = fit(bnn, data.x_train, data.y_train, backend=spec.backend, seed=spec.seed, progress=progress, **options)
    fit_seconds = time.perf_counter() - started
    prune_report = None
    if spec.prune != "none":
        from inference.variational.pruning import prune

        posterior, prune_report = prune(posterior, mode=spec.prune, seed=spec.seed)
    y_test = data.y_test_original() if data.task == "regression" else data.y_test
    started = time.perf_counter()
    prediction = posterior.predict(data.x_test, y=y_test, seed=spec.seed)
    predict_seconds = time.perf_counter() - started
    metrics = evaluate(prediction, y_test)
    idata = posterior.to_arviz(data.x_test, y_test, seed=spec.seed, include_weights=bnn.num_random <= 20000)
    metrics.update(convergence_metrics(idata))
    unmixed = convergence_warning(metrics)
    if unmixed:
        warnings.warn(f"{spec.backend}: {unmixed}", RuntimeWarning, stacklevel=2)
    if prune_report is not None:
        metrics["sparsity"] = float(prune_report["sparsity"])
    metrics.update(
        {
            "fit_seconds": fit_seconds,
            "predict_seconds": predict_seconds,
            "n_train": data.n_train,
            "n_test": data.n_test,
            "num_random": bnn.num_random,
            "backend": spec.backend,
            "stochastic": spec.stochastic,
            "model": spec.model,
            "data": spec.data,
            "split": spec.split,
            "seed": spec.seed,
            "task": data.task,
        }
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    posterior.save(out / "posterior")
    save_netcdf(idata, out / "posterior.nc")
    config = {"spec": spec.to_dict(), "backend_options": options, "data": data.summary(), "prune": prune_report}
    _write_json(out / "config.json", config)
    _write_json(out / "metrics.json", metrics)
    return metrics


def _write_json(path: Path, obj) -> None:
    with open(path, "w") as fh:
        json.dump(to_jsonable(obj), fh, indent=2)
