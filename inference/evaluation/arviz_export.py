"""The one place where arrays of posterior draws become ArviZ ``InferenceData``.

This module takes plain tensors (draws, pointwise log-likelihoods, predictive summaries)
and knows nothing about posteriors; :meth:`inference.posterior.Posterior.to_arviz`
computes them and calls :func:`to_inference_data`.  Groups written:

* ``posterior`` — every latent site ``[chain, draw, *site_shape]`` with named dims
  ``<site>_dim_<i>`` (optional: big networks skip their weights), plus ``log_joint`` and
  ``f_mean``, the network output at a few of the points (class probabilities for
  classification): scalar-per-draw quantities whose R-hat/ESS are meaningful for neural
  networks (weights are not identifiable under neuron permutations);
* ``log_likelihood`` — pointwise ``obs`` ``[chain, draw, obs_id]`` in original units, so
  ``az.loo`` (Vehtari, Gelman & Gabry 2017) and ``az.waic`` (Watanabe 2010) work.  A point
  mass (one chain of one draw: ``map``) is written as two identical draws, with the group
  attribute ``point_mass = 1``: PSIS needs at least two draws (ArviZ raises an IndexError on
  one), and with identical draws every importance weight is equal, so ``az.loo`` returns the
  plug-in estimate elpd_loo = Σ_n log p(y_n | ŵ) with p_loo = 0 and flags it as unreliable
  (Pareto k̂ = ∞, "very bad"): leave-one-out cross-validation cannot be estimated from a
  point mass, and the plug-in value is the in-sample log-likelihood, an optimistic score.
  ``az.waic`` gives the same numbers.  It is stored in float64 (PSIS in float32 can return NaN);
* ``posterior_predictive`` — observation draws ``obs``; ``observed_data`` — the targets;
* ``sample_stats`` — the sampler's per-draw statistics, where the backend has them;
* ``predictions`` (optional) — per-point summaries of the run's own prediction, without
  chain/draw dims: predictive ``mean``, ``sd``, ``epistemic_sd``, the PIT value ``pit``
  (Gneiting & Raftery 2007), central-interval bounds ``lower_<p>``/``upper_<p>``,
  ``log_predictive_density``, or mean class probabilities ``probs``;
* ``constant_data`` (optional) — the inputs ``x`` ``[obs_id]`` when they are 1-D.

Top-level ``attrs`` name the backend, the posterior kind, the task and, for NUTS, the
``max_tree_depth`` that ``sample_stats.tree_depth`` is read against.
"""
from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Optional

import arviz as az
import numpy as np
import torch
import xarray as xr

__all__ = ["to_inference_data", "save_netcdf", "load_netcdf", "quiet_arviz", "loo_subset", "MAX_LOO_POINTS"]

#: PSIS-LOO on training data uses at most this many (seeded, random) points
MAX_LOO_POINTS = 2000


@contextlib.contextmanager
def quiet_arviz():
    """Silence ArviZ's warnings and log messages (e.g. 'Shape validation failed' for one chain)."""
    # ArviZ 0.2x logs through its own Logger instance, not the one logging.getLogger("arviz") returns
    logger = getattr(az, "_log", None) or logging.getLogger("arviz")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _np(t) -> np.ndarray:
    return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


def loo_subset(n_train: int, seed: int, max_points: int = MAX_LOO_POINTS) -> torch.Tensor:
    """Sorted training indices ``[min(n_train, max_points)]`` for PSIS-LOO/WAIC.

    All points when ``n_train <= max_points``, else a random subset fixed by ``seed``.
    """
    if n_train < 1 or max_points < 1:
        raise ValueError(f"loo_subset needs n_train >= 1 and max_points >= 1, got {n_train} and {max_points}")
    if n_train <= max_points:
        return torch.arange(n_train)
    generator = torch.Generator().manual_seed(int(seed))
    return torch.randperm(n_train, generator=generator)[:max_points].sort().values


def to_inference_data(
    *,
    task: str,
    log_likelihood: torch.Tensor,
    log_joint: torch.Tensor,
    observed: torch.Tensor,
    observation_draws: torch.Tensor,
    f_points: torch.Tensor,
    point_index,
    params: Optional[dict] = None,
    sample_stats: Optional[dict] = None,
    predictions: Optional[dict] = None,
    prediction_attrs: Optional[dict] = None,
    x: Optional[torch.Tensor] = None,
    attrs: Optional[dict] = None,
) -> az.InferenceData:
    """Assemble ``InferenceData`` from draws evaluated at ``N`` observations.

    Args:
        task: ``"regression"`` or ``"classification"``.
        log_likelihood: ``[C, D, N]`` log p(y_n | draw) in original units.
        log_joint: ``[C, D]`` log prior + total log-likelihood per draw.
        observed: targets ``[N, O]`` in original units, or class labels ``[N]``.
        observation_draws: ``[C, D, N, O]`` (regression) or ``[C, D, N]`` (labels).
        f_points: ``[C, D, P, O]`` outputs or ``[C, D, P, K]`` class probabilities at the
            ``P`` observations ``point_index``.
        params: ``{site: [C, D, *site_shape]}`` latent draws (left out when ``None``).
        sample_stats: ``{name: [C, D]}`` sampler statistics.
        predictions: ``{name: [N] or [N, O|K]}`` per-point summaries (see module docstring).
        prediction_attrs: attributes of the ``predictions`` group (e.g. ``num_samples``, ``seed``).
        x: ``[N]`` 1-D inputs written to ``constant_data``.
        attrs: top-level attributes.
    """
    if task not in ("regression", "classification"):
        raise ValueError(f"task must be 'regression' or 'classification', got {task!r}")
    n = observed.shape[0]
    if log_likelihood.dim() != 3 or log_likelihood.shape[-1] != n:
        raise ValueError(f"log_likelihood must be [chain, draw, {n}], got {tuple(log_likelihood.shape)}")
    last = "output" if task == "regression" else "class"
    posterior_vars, dims = {}, {"f_mean": ["predictive_point", last]}
    for name, value in (params or {}).items():
        posterior_vars[name] = _np(value)
        dims[name] = [f"{name}_dim_{i}" for i in range(value.dim() - 2)]
    posterior_vars["log_joint"] = _np(log_joint)
    posterior_vars["f_mean"] = _np(f_points)
    dims["obs"] = ["obs_id", "output"] if task == "regression" else ["obs_id"]
    point_index = np.asarray(point_index)
    coords = {"predictive_point": point_index, "obs_id": np.arange(n)}
    stats = {k: _np(v) for k, v in (sample_stats or {}).items()}
    with quiet_arviz():
        idata = az.from_dict(
            posterior=posterior_vars,
            posterior_predictive={"obs": _np(observation_draws)},
            observed_data={"obs": _np(observed)},
            sample_stats=stats or None,
            coords=coords,
            dims=dims,
            attrs={"task": task, "units": "original target units", **(attrs or {})},
        )
        # pointwise log-likelihood has no output dim, so it gets its own dims
        point_mass = tuple(log_likelihood.shape[:2]) == (1, 1)
        # float64 whatever the model's dtype: ArviZ's PSIS in float32 returns NaN for heavy-tailed
        # importance ratios (elpd_loo = nan on a heteroscedastic SVI fit that float64 scores −501)
        pointwise = _np(log_likelihood.expand(1, 2, n) if point_mass else log_likelihood).astype(np.float64)
        idata.add_groups(log_likelihood=az.dict_to_dataset(
            {"obs": pointwise}, coords=coords, dims={"obs": ["obs_id"]}, attrs={"point_mass": int(point_mass)}))
    extra = {}
    if predictions:
        data_vars = {}
        for name, value in predictions.items():
            value = _np(value)
            if value.shape[0] != n:
                raise ValueError(f"prediction summary {name!r} has {value.shape[0]} rows, expected {n}")
            data_vars[name] = (("obs_id", last)[: value.ndim], value)
        extra["predictions"] = xr.Dataset(data_vars, coords={"obs_id": coords["obs_id"]},
                                          attrs=dict(prediction_attrs or {}))
    if x is not None:
        x = _np(x).reshape(n, -1)
        if x.shape[1] == 1:
            extra["constant_data"] = xr.Dataset({"x": (("obs_id",), x[:, 0])}, coords={"obs_id": coords["obs_id"]})
    if extra:
        with quiet_arviz():
            idata.add_groups(**extra)
    return idata


def save_netcdf(idata: az.InferenceData, path) -> None:
    """Write ``idata`` to NetCDF (h5netcdf engine; ArviZ's own ``to_netcdf``)."""
    idata.to_netcdf(str(path), engine="h5netcdf")


def load_netcdf(path) -> az.InferenceData:
    """Read an ``InferenceData`` written by :func:`save_netcdf` (every group, including ``predictions``)."""
    return az.from_netcdf(str(path), engine="h5netcdf")
