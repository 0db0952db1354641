"""How: inference backends, posteriors, prediction, metrics and ArviZ diagnostics.

Importing the package changes no global state: no Pyro setting (guides switch Pyro's
module-local parameter mode on only around their own construction and calls, see
:mod:`inference.variational.protocol`) and no warning filter.
"""
import warnings

with warnings.catch_warnings():
    # ArviZ 0.2x announces its 1.0 refactor once, on import; this project pins arviz < 1.0
    warnings.filterwarnings("ignore", message="ArviZ is undergoing a major refactor", category=FutureWarning)
    from inference.evaluation.arviz_export import load_netcdf, save_netcdf, to_inference_data
from inference.backends import BACKENDS, NonFiniteLossError, register_backend
from inference.fitting import fit, fit_many
from inference.mcmc.budget import TimeBudgetExceeded
from inference.sgmcmc.pyro_kernels import PSGLD, SGHMC, SGLD
from inference.evaluation.metrics import classification_metrics, evaluate, regression_metrics
from inference.posterior import Posterior, Prediction, SamplePosterior, load_posterior
from inference.variational.posterior import VariationalPosterior

__all__ = [
    "fit",
    "fit_many",
    "BACKENDS",
    "register_backend",
    "NonFiniteLossError",
    "TimeBudgetExceeded",
    "Posterior",
    "VariationalPosterior",
    "SamplePosterior",
    "Prediction",
    "load_posterior",
    "evaluate",
    "regression_metrics",
    "classification_metrics",
    "to_inference_data",
    "save_netcdf",
    "load_netcdf",
    "SGLD", "PSGLD", "SGHMC",
]
