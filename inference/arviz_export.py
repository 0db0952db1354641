"""The one place where posteriors become ArviZ ``InferenceData``.

Groups written:

* ``posterior`` — every latent site ``[chain, draw, *site_shape]`` with named dims
  ``<site>_dim_<i>`` (skip big networks' weights with ``include_weights=False``), plus
  ``log_joint`` and the predictive mean ``f_mean`` at the given points as scalar-per-draw
  quantities whose R-hat/ESS are meaningful for neural networks (weights are not
  identifiable under neuron permutations);
* ``log_likelihood`` — pointwise ``obs`` ``[chain, draw, obs_id]`` in original units, so
  ``az.loo`` / ``az.waic`` / ``az.compare`` work;
* ``posterior_predictive`` — observation draws ``obs``;
* ``observed_data`` — the targets;
* ``sample_stats`` — the sampler's per-draw statistics, where the backend has them.

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

__all__ = ["to_inference_data", "save_netcdf", "load_netcdf", "quiet_arviz"]


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


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def to_inference_data(
    posterior,
    x: torch.Tensor,
    y: torch.Tensor,
    num_samples: Optional[int] = None,
    seed: int = 0,
    include_weights: bool = True,
    max_predictive_points: int = 16,
) -> az.InferenceData:
    """Export ``posterior`` evaluated on data ``(x, y)`` (``y`` in original units).

    For variational posteriors the ``num_samples`` draws form a single chain; sampler
    posteriors keep their chains and draws.  ``f_mean`` holds the network output at up
    to ``max_predictive_points`` of the points (evenly spaced), ``[chain, draw, point, output]``.
    """
    bnn = posterior.bnn
    draws = posterior.param_draws(num_samples, seed)
    if draws:
        chains, ndraws = next(iter(draws.values())).shape[:2]
    else:
        chains, ndraws = 1, 1
    flat = {k: v.reshape(chains * ndraws, *v.shape[2:]) for k, v in draws.items()}
    y_checked = posterior._check_targets(x, y)
    pred = _predict_from_flat(posterior, flat, x, y_checked, seed)
    shape = (chains, ndraws)
    log_lik = pred.log_lik.reshape(*shape, -1)
    with torch.no_grad():
        log_joint = bnn.log_prior(flat) + pred.log_lik.sum(-1) if flat else pred.log_lik.sum(-1)
    point_index = np.unique(np.linspace(0, x.shape[0] - 1, min(max_predictive_points, x.shape[0])).round().astype(int))

    posterior_vars, dims = {}, {}
    if include_weights:
        for name, value in draws.items():
            posterior_vars[name] = _np(value)
            dims[name] = [f"{name}_dim_{i}" for i in range(value.dim() - 2)]
    posterior_vars["log_joint"] = _np(log_joint.reshape(shape))
    if pred.task == "regression":
        f_sel = pred.f[:, point_index]
        posterior_vars["f_mean"] = _np(f_sel.reshape(*shape, *f_sel.shape[1:]))
        dims["f_mean"] = ["predictive_point", "output"]
        y_obs = pred.y.reshape(*shape, *pred.y.shape[1:])
        observed = _np(y_checked)
        dims["obs"] = ["obs_id", "output"]
    else:
        p_sel = pred.probs[:, point_index]
        posterior_vars["f_mean"] = _np(p_sel.reshape(*shape, *p_sel.shape[1:]))
        dims["f_mean"] = ["predictive_point", "class"]
        y_obs = pred.y.reshape(*shape, -1)
        observed = _np(y_checked)
        dims["obs"] = ["obs_id"]
    coords = {"predictive_point": point_index, "obs_id": np.arange(x.shape[0])}
    sample_stats = {k: _np(v) for k, v in getattr(posterior, "sample_stats", {}).items()}
    with quiet_arviz():
        idata = az.from_dict(
            posterior=posterior_vars,
            posterior_predictive={"obs": _np(y_obs)},
            observed_data={"obs": observed},
            sample_stats=sample_stats or None,
            coords=coords,
            dims=dims,
            attrs={
                "backend": str(posterior.info.get("backend", "")),
                "posterior_kind": posterior.kind,
                "task": pred.task,
                "num_random": int(bnn.num_random),
                "units": "original target units",
                **_sampler_limits(posterior.info),
            },
        )
        # pointwise log-likelihood has no output dim, so it gets its own dims
        idata.add_groups(
            log_likelihood=az.dict_to_dataset({"obs": _np(log_lik)}, coords=coords, dims={"obs": ["obs_id"]})
        )
    return idata


def _sampler_limits(info: dict) -> dict:
    """Sampler settings the diagnostics need to read ``sample_stats`` (NUTS: ``max_tree_depth``)."""
    depth = (info.get("config") or {}).get("max_tree_depth")
    return {"max_tree_depth": int(depth)} if depth else {}


def _predict_from_flat(posterior, flat: dict, x, y, seed):
    """Predict with exactly the given draws (so the exported draws and log-likelihoods align)."""
    from .posterior import SamplePosterior

    bnn = posterior.bnn
    if not flat:
        return posterior.predict(x, num_samples=1, y=y, seed=seed)
    fixed = SamplePosterior(bnn, {k: v.unsqueeze(0) for k, v in flat.items()}, info=posterior.info)
    return fixed.predict(x, y=y, seed=seed)


def save_netcdf(idata: az.InferenceData, path) -> None:
    """Write ``idata`` to NetCDF (h5netcdf engine; ArviZ's own ``to_netcdf``)."""
    idata.to_netcdf(str(path), engine="h5netcdf")


def load_netcdf(path) -> az.InferenceData:
    return az.from_netcdf(str(path), engine="h5netcdf")
