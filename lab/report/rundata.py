"""A run directory (written by :func:`lab.runs.execute`) opened for reporting.

:class:`Run` reads ``metrics.json``, ``config.json`` and ``posterior.nc`` eagerly and the
saved posterior, the dataset and a test-set prediction lazily: a section that needs one
of them and cannot get it raises :class:`NotApplicable`, which the report renders as a
one-line remark instead of failing.
"""
from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

import torch

__all__ = ["Run", "NotApplicable", "open_run"]


#: PSIS-LOO on training data uses at most this many (seeded, random) points
MAX_LOO_POINTS = 2000


class NotApplicable(Exception):
    """A report section does not apply to this run (the message says why, in one line)."""


class Run:
    """One run directory.  ``name`` labels the run in comparisons (the directory name)."""

    def __init__(self, directory):
        self.dir = Path(directory)
        self.metrics = _read_json(self.dir / "metrics.json")
        self.config = _read_json(self.dir / "config.json") if (self.dir / "config.json").exists() else {}
        self.spec = self.config.get("spec", {})
        self.seed = int(self.spec.get("seed", self.metrics.get("seed", 0)))
        self.name = self.dir.resolve().name

    # ------------------------------------------------------------------ identity
    @property
    def backend(self) -> str:
        return str(self.metrics.get("backend") or self.spec.get("backend") or self.idata.attrs.get("backend", "?"))

    @property
    def task(self) -> str:
        return str(self.metrics.get("task") or self.idata.attrs.get("task", "regression"))

    def title(self) -> str:
        m = self.metrics
        return (
            f"{m.get('data', '?')} · {m.get('model', '?')} · stochastic={m.get('stochastic', '?')} · "
            f"backend={self.backend} · seed {m.get('seed', '?')}"
        )

    # ------------------------------------------------------------------ lazily loaded parts
    @cached_property
    def idata(self):
        from inference.arviz_export import load_netcdf

        path = self.dir / "posterior.nc"
        if not path.exists():
            raise NotApplicable(f"no {path.name} in {self.dir}")
        return load_netcdf(path)

    @cached_property
    def posterior(self):
        from inference.posterior import load_posterior

        try:
            return load_posterior(self.dir / "posterior")
        except FileNotFoundError as err:
            raise NotApplicable(f"the saved posterior is unavailable ({err})") from None

    @property
    def info(self) -> dict:
        """The posterior's ``info`` record (from ``posterior/info.json``; no model needed)."""
        path = self.dir / "posterior" / "info.json"
        return _read_json(path) if path.exists() else {}

    @cached_property
    def dataset(self):
        from zoo.datasets import load_dataset

        if not self.spec:
            raise NotApplicable("config.json has no run spec, so the data cannot be re-created")
        try:
            return load_dataset(
                self.spec["data"], split=self.spec.get("split", 0), seed=self.spec.get("seed", 0),
                **self.spec.get("data_options", {}),
            )
        except (ValueError, FileNotFoundError) as err:
            raise NotApplicable(f"the dataset cannot be re-created here: {str(err).splitlines()[0]}") from None

    def test_targets(self):
        data = self.dataset
        return data.y_test_original() if data.task == "regression" else data.y_test

    @cached_property
    def train_idata(self):
        """InferenceData on (up to ``MAX_LOO_POINTS`` seeded random) *training* points, for PSIS-LOO/WAIC.

        ``posterior.nc`` holds test-set log-likelihoods; PSIS-LOO needs those of the data
        the posterior was fitted to.
        """
        data = self.dataset
        index = torch.arange(data.n_train)
        if data.n_train > MAX_LOO_POINTS:
            generator = torch.Generator().manual_seed(self.seed)
            index = torch.randperm(data.n_train, generator=generator)[:MAX_LOO_POINTS].sort().values
        y = data.y_train_original() if data.task == "regression" else data.y_train
        return self.posterior.to_arviz(data.x_train[index], y[index], seed=self.seed, include_weights=False)

    @cached_property
    def prediction(self):
        """Seeded posterior predictive on the test set, with targets (PIT / log densities)."""
        return self.posterior.predict(self.dataset.x_test, y=self.test_targets(), seed=self.seed)


def open_run(directory) -> Run:
    """A :class:`Run`, or a ``FileNotFoundError`` saying what a run directory must hold."""
    directory = Path(directory)
    if not (directory / "metrics.json").exists():
        raise FileNotFoundError(
            f"{directory} is not a run directory (no metrics.json); create one with "
            "'python -m zoo fit ... --out DIR'"
        )
    return Run(directory)


def _read_json(path: Path) -> dict:
    with open(path) as fh:
        return json.load(fh)
