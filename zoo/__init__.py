"""What: architectures, priors, likelihoods, stochasticity selection and datasets."""
from .bnn import BayesianNetwork
from .likelihoods import CategoricalLikelihood, GaussianLikelihood, make_likelihood
from .priors import (
    FanInNormalPrior,
    LaplacePrior,
    NormalPrior,
    PretrainedNormalPrior,
    StudentTPrior,
    make_prior,
)
from .stochastic import AllParameters, ElementMasks, LastLayer, ModuleNames, NoParameters, as_selector

__all__ = [
    "BayesianNetwork",
    "GaussianLikelihood",
    "CategoricalLikelihood",
    "make_likelihood",
    "NormalPrior",
    "FanInNormalPrior",
    "LaplacePrior",
    "StudentTPrior",
    "PretrainedNormalPrior",
    "make_prior",
    "AllParameters",
    "NoParameters",
    "LastLayer",
    "ModuleNames",
    "ElementMasks",
    "as_selector",
]
