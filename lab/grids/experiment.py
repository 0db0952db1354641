"""What a grid run is made of: :class:`GridRun`, :class:`Experiment`, the dataset builders and extra metrics.

A grid (registered in :mod:`lab.grids.registry`) is a list of :class:`GridRun` s: a :class:`lab.runs.spec.RunSpec`, the labels
that identify its configuration in the result tables, and optionally a dataset builder (a name
in :data:`DATASETS`, for data that :func:`zoo.data.load_dataset` cannot express) and a
prerequisite run whose output the builder reads (e.g. last-layer inference on the *frozen* body
of a deterministically trained network).  :data:`EXTRAS` are metrics computed from the run's own
test-set prediction.  Both are registries in the one registration style (``docs/architecture.md``): a
:class:`DatasetBuilder` or :class:`ExtraMetric` carries its own name and is added by one
:func:`register_dataset` / :func:`register_extra` call.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Optional

import torch

from inference import load_posterior
from inference.backends import BACKENDS
from lab.runs.spec import RunSpec
from zoo.data import Dataset, euler_increments, load_dataset, load_uci_full_random_split

from lab.runs.features import frozen_features
from lab.references.problems import problem_data
from lab.references.build import load_reference

__all__ = ["GridRun", "Experiment", "run_key", "DatasetBuilder", "DATASETS", "register_dataset", "ExtraMetric", "EXTRAS",
           "register_extra", "CONFIDENCE_THRESHOLDS", "load_run_data", "available_backends", "frozen_features",
           "unguarded"]


def run_key(*parts) -> str:
    """A run directory's name from its configuration's parts (``""`` parts left out; spaces, ``/`` and
    ``:`` made ``_``)."""
    return "-".join(str(p).replace(" ", "_").replace("/", "_").replace(":", "_") for p in parts if p != "")


@dataclass
class GridRun:
    """One cell of a grid (one run of it).

    Attributes:
        key: the run directory's name under ``OUT/runs/`` (unique in the grid).
        spec: what :func:`lab.runs.execution.execute` runs.
        labels: configuration columns of the result tables (e.g. ``{"variant": "full SVI"}``).
        dataset: a name in :data:`DATASETS` building the data, or ``None`` for
            ``load_dataset(spec.data, split, seed, **spec.data_options)``.
        after: key of a run that must finish first; the builder reads its directory.
        extras: names in :data:`EXTRAS`: metrics computed from ``execute``'s test-set
            prediction and added to ``metrics.json``.
    """

    key: str
    spec: RunSpec
    labels: dict
    dataset: Optional[str] = None
    after: Optional[str] = None
    extras: tuple = ()


@dataclass
class Experiment:
    """A named grid: ``build(fast, data_root) -> [GridRun]`` and how to summarise it.

    ``group`` are the label columns a configuration is identified by (mean ± standard error
    over the others, i.e. splits / seeds); ``metrics`` the columns of ``summary.md``;
    ``published(row) -> {column: text}`` adds published numbers beside ours; ``tables(summary) -> str``
    adds markdown tables of its own after the summary (e.g. a metric against a shift's intensity).
    """

    name: str
    description: str
    build: Callable[[bool, Optional[str]], list]
    group: tuple
    metrics: tuple
    published: Optional[Callable[[dict], dict]] = None
    hidden: bool = False
    tables: Optional[Callable] = None


def available_backends(wanted, note=print) -> list:
    """The backends of ``wanted`` registered now, with a printed note for the others."""
    missing = [b for b in wanted if b not in BACKENDS]
    if missing:
        note(f"note: backends not registered, left out of the grid: {', '.join(missing)}")
    return [b for b in wanted if b in BACKENDS]


def unguarded(backend: str) -> dict:
    """Backend options that switch off a sampler's wall-clock guard (``{"time_budget": None}``; ``{}`` for a backend
    without one).  The guard stops a new user's default fit by projected *wall* seconds, which follow the machine's
    load, not the algorithm; a grid's chains are long by design (on the loaded 2 cores it stopped every digits
    SG-MCMC run of ``shift-rotation`` and the moons NUTS defaults of ``fidelity`` at 120 s)."""
    return {"time_budget": None} if "time_budget" in {f.name for f in fields(BACKENDS[backend].Config)} else {}


# --------------------------------------------------------------------------------------------
# Dataset builders
# --------------------------------------------------------------------------------------------


def load_run_data(run: GridRun, root, prerequisite: Optional[GridRun] = None) -> Optional[Dataset]:
    """The data of ``run`` (``None``: :func:`lab.runs.execution.execute` loads ``spec.data`` itself).

    ``root`` is the folder of the grid's run directories; ``prerequisite`` the run named by
    ``run.after`` (its data is the base of a ``frozen-features`` dataset).
    """
    if run.dataset is None:
        return None
    return DATASETS[run.dataset].build(run, Path(root), prerequisite)


def _frozen(run: GridRun, root: Path, prerequisite: GridRun, whiten: bool = True) -> Dataset:
    spec = prerequisite.spec
    base = load_run_data(prerequisite, root) or load_dataset(spec.data, split=spec.split, seed=spec.seed,
                                                             **spec.data_options)
    return frozen_features(base, load_posterior(root / run.after / "posterior").bnn.net, whiten=whiten)


def _frozen_states(run: GridRun, root: Path, prerequisite: GridRun) -> Dataset:
    return _frozen(run, root, prerequisite, whiten=False)


def _uci_random(run: GridRun, root, prerequisite) -> Dataset:
    options = run.spec.data_options
    return load_uci_full_random_split(run.spec.data.partition(":")[2], test_fraction=options["test_fraction"],
                                      seed=options["split_seed"], standardise_on=options["standardise_on"])


def _euler_increments(run: GridRun, root, prerequisite) -> Dataset:
    return euler_increments(load_dataset(run.spec.data, seed=run.spec.seed, **run.spec.data_options))


def _reference(run: GridRun, root, prerequisite) -> Dataset:
    """The data of the run's reference problem (``labels["problem"]``): the data set drawn from the problem's
    data seed, or its frozen body's features (:mod:`lab.references.problems`), whatever the run's seed."""
    reference = load_reference(run.labels["problem"])
    return problem_data(reference.problem, reference.body())


def _register(registry: dict, entry, what: str, replace: bool):
    """Add ``entry`` (it carries its own ``name``) to ``registry``; ``ValueError`` if the name is taken (unless
    ``replace``).  Returns ``entry``."""
    if entry.name in registry and not replace:
        raise ValueError(f"{what} {entry.name!r} is already registered")
    registry[entry.name] = entry
    return entry


@dataclass(frozen=True)
class DatasetBuilder:
    """A named builder of a grid run's data: ``build(run, runs_root, prerequisite_run) -> Dataset``."""

    name: str
    build: Callable


DATASETS: dict[str, DatasetBuilder] = {}
"""Registered dataset builders by name (:func:`register_dataset`), named by :attr:`GridRun.dataset`."""


def register_dataset(entry: DatasetBuilder, replace: bool = False) -> DatasetBuilder:
    """Add ``entry`` to :data:`DATASETS`; ``ValueError`` if its name is taken (unless ``replace``).  Returns it."""
    return _register(DATASETS, entry, "dataset builder", replace)



# --------------------------------------------------------------------------------------------
# Extra metrics (from execute's test-set prediction)
# --------------------------------------------------------------------------------------------


def _euler_metrics(prediction, data: Dataset) -> dict:
    """RMSE of the step-20 angles in degrees as plain numbers, as Bagga et al. 2025 report it (the
    increments' predicted angles x₁₉ + Δ taken mod 360°); the run's ``rmse_circular`` and
    ``test_ll_circular`` score them on the circle (the dataset's ``target_period``)."""
    mean = prediction.mean.double()
    if data.info.get("euler_target") == "increments":
        angles = torch.as_tensor(data.info["last_test"]) + mean
        angles, target = angles % 360.0, torch.as_tensor(data.info["target_test"])
    else:
        angles, target = mean, data.y_test_original().double()
    return {"rmse_plain": float(((angles - target) ** 2).mean().sqrt())}


CONFIDENCE_THRESHOLDS = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99)


def _confidence_curve(prediction, data: Dataset) -> dict:
    """Accuracy on the test points whose max predictive probability ≥ t, and the share kept (Nazarovs et al. 2021, Fig. 7)."""
    probs = prediction.mean
    confidence, label = probs.max(-1)
    out = {}
    for t in CONFIDENCE_THRESHOLDS:
        keep = confidence >= t
        out[f"kept_{t:g}"] = float(keep.float().mean())
        out[f"acc_{t:g}"] = float((label[keep] == data.y_test[keep]).float().mean()) if keep.any() else float("nan")
    return out


def _standardised_rmse(prediction, data: Dataset) -> dict:
    """Test RMSE in standardised target units, averaged over outputs (Rochussen 2024's metric)."""
    mean = prediction.mean
    per_output = (((mean - data.y_test_original()) / data.y_scale) ** 2).mean(0).sqrt()
    return {"rmse_std": float(per_output.mean())}


@dataclass(frozen=True)
class ExtraMetric:
    """Named extra metrics ``compute(prediction, data) -> {name: float}`` from the test-set
    :class:`~inference.prediction.Prediction` that :func:`lab.runs.execution.execute` evaluated."""

    name: str
    compute: Callable


EXTRAS: dict[str, ExtraMetric] = {}
"""Registered extra metrics by name (:func:`register_extra`), named by :attr:`GridRun.extras`."""


def register_extra(entry: ExtraMetric, replace: bool = False) -> ExtraMetric:
    """Add ``entry`` to :data:`EXTRAS`; ``ValueError`` if its name is taken (unless ``replace``).  Returns it."""
    return _register(EXTRAS, entry, "extra metric", replace)


# the built-in dataset builders and extra metrics
register_dataset(DatasetBuilder("euler-increments", _euler_increments))
register_dataset(DatasetBuilder("reference", _reference))
register_dataset(DatasetBuilder("frozen-features", _frozen))
register_dataset(DatasetBuilder("frozen-states", _frozen_states))
register_dataset(DatasetBuilder("uci-random", _uci_random))
register_extra(ExtraMetric("euler", _euler_metrics))
register_extra(ExtraMetric("confidence", _confidence_curve))
register_extra(ExtraMetric("rmse_std", _standardised_rmse))
