"""What: architectures, priors, likelihoods, stochasticity selection and datasets.

* :mod:`zoo.architectures` — plain networks (MLP, LeNet-300-100, multi-head LSTM, CNN,
  Transformer classifier) and :func:`~zoo.architectures.build_architecture`;
* :mod:`zoo.stochastic` — selectors of the random parameters (partial stochasticity,
  Sharma et al. 2023); :mod:`zoo.structured` — structured fixed-weight masks (Rochussen 2024);
* :mod:`zoo.priors`, :mod:`zoo.likelihoods` — weight priors and observation models (Gaussian,
  heteroscedastic Gaussian, Student-t, categorical); :mod:`zoo.heads` — a random mean head with a
  deterministic variance head;
* :mod:`zoo.bnn` — :class:`BayesianNetwork`, the Pyro model and its vectorised densities;
* :mod:`zoo.data` — the bundled, user-given and generated data sets.

The papers cited in docstrings are listed in full in ``docs/references.md``.
"""
import sys as _sys

if "-m" in _sys.orig_argv[:-1] and _sys.orig_argv[_sys.orig_argv.index("-m") + 1] == __name__:
    # ``python -m zoo`` is starting: a Ctrl-C during the seconds of imports (torch, pyro, arviz) exits 130
    # with one line, not a traceback or a C++ abort; lab.cli.main installs its own handler once it runs
    import os as _os
    import signal as _signal

    _signal.signal(_signal.SIGINT, lambda signum, frame: (_sys.stderr.write("interrupted (Ctrl-C)\n"),
                                                          _os._exit(130)))

__version__ = "0.2.0"  # the one version: setup.cfg (attr: zoo.__version__) and the docs read it here

from .bnn import BayesianNetwork
from .heads import MeanHead
from .likelihoods import (
    CategoricalLikelihood,
    GaussianLikelihood,
    HeteroscedasticGaussianLikelihood,
    StudentTLikelihood,
    make_likelihood,
)
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
    "__version__",
    "BayesianNetwork",
    "GaussianLikelihood",
    "HeteroscedasticGaussianLikelihood",
    "StudentTLikelihood",
    "CategoricalLikelihood",
    "make_likelihood",
    "MeanHead",
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
