"""The problems that have a reference posterior: data, network, prior, likelihood and sampler settings.

A :class:`ReferenceProblem` is one Bayesian model — a :class:`~lab.runs.spec.RunSpec`'s data,
architecture, stochastic selection, prior and likelihood — small enough for long full-batch sampling on
two cores, and the sampler that builds its reference: NUTS (``method="nuts"``), or for the every-weight
regression networks whose posterior is multimodal in function space (NUTS chains do not mix even within one
fit; RESULTS, section 10) tempered SMC with HMC moves (``method="smc"``, :mod:`inference.smc`); :mod:`lab.references.build` builds and stores its reference posterior predictive.  The backends
fit exactly the same model (:func:`problem_model` builds it from the same spec, through
:func:`lab.runs.model.build_model`), so a distance to the reference measures inference, not a
different model.

Data drawn from a seed (``toy1d``, ``moons``, ``digits``) are drawn from the problem's ``data_seed``,
whatever the seed of a fit on it.  A *last-layer* problem (``frozen_body``) is the output layer's
posterior given a body trained once (the ``map`` backend over all weights, seed ``data_seed``) and
then frozen; the body is stored with the reference, and the problem's data are the body's
features (the inputs of its output layer, :func:`lab.runs.features.frozen_features` without whitening),
on which the head is a one-layer network with every weight random — the same posterior as
``stochastic="last"`` on the frozen network.

:data:`PROBLEMS` lists them; :data:`TINY` are seconds-long settings for tests.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

import torch

from inference.fitting import fit
from zoo.data import Dataset, load_dataset

from lab.runs.features import frozen_features
from lab.runs.model import build_model
from lab.runs.spec import RunSpec, resolve_backend_options

__all__ = ["ReferenceProblem", "PROBLEMS", "TINY", "TINY_SMC", "METHODS", "SMC_RUNS", "SMC_SETTINGS", "get_problem",
           "problem_data", "problem_model", "head_spec", "train_body", "plot_grid", "data_fingerprint", "model_signature"]


@dataclass(frozen=True)
class ReferenceProblem:
    """One model with a reference posterior.

    Attributes:
        name: the reference's name (``python -m zoo reference build NAME``).
        description: one line for ``reference list``.
        spec: the model as a run spec (data, model, hidden, activation, stochastic, prior, prior
            scale, noise, likelihood, UCI split); its backend and seed are not used.
        data_seed: the seed of data drawn from a seed (toy1d, moons, digits) and of the frozen body.
        frozen_body: the problem is the last layer on a body trained once and frozen (module docstring).
        grid: ``"line"`` (1-D inputs: a plotting line), ``"plane"`` (2-D inputs: a plotting grid) or ``None``.
        method: the sampler: ``"nuts"`` (the ``nuts`` backend) or ``"smc"`` (:func:`inference.smc.smc_posterior`).
        sampler: the sampler's options for every fit of the build (explicit: never the backend's defaults):
            the ``nuts`` backend's options, or the fields of :class:`inference.smc.SMCConfig`.
        fits: independent fits per reference half, each its own seed (NUTS: its own initial weights, MAP
            start and chains; SMC: its own prior draws and moves, one "chain" of its particles).
    """

    name: str
    description: str
    spec: RunSpec
    data_seed: int = 0
    frozen_body: bool = False
    grid: Optional[str] = None
    sampler: dict = field(default_factory=dict)
    fits: int = 2
    method: str = "nuts"

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"reference {self.name!r}: unknown method {self.method!r}; valid methods: {', '.join(METHODS)}")


#: the samplers a reference can be built with
METHODS = ("nuts", "smc")


def _smc(particles, moves, leapfrog, target_ess=0.5, target_accept=0.8, trajectory_length=None) -> dict:
    return {"num_particles": particles, "target_ess": target_ess, "num_moves": moves, "num_leapfrog": leapfrog,
            "target_accept": target_accept, "step_size": 0.5, "step_jitter": 0.2, "max_stages": 1000,
            "trajectory_length": trajectory_length}


def _nuts(chains, warmup, samples, depth, thin=1, target_accept=0.9, map_steps=2000, dense=False,
          adapt_mass=True) -> dict:
    return {"num_chains": chains, "warmup_steps": warmup, "num_samples": samples, "thin": thin,
            "max_tree_depth": depth, "target_accept": target_accept, "map_steps": map_steps,
            "init": "map", "adapt_step_size": True, "adapt_mass": adapt_mass, "dense_mass": dense,
            "time_budget": None}  # a reference is a long run by design (no time budget, docs/mcmc.md)


#: independent SMC runs per reference half (the "chains" of its diagnostics)
SMC_RUNS = 8
#: SMC settings of the every-weight regression networks: what builds in minutes on two shared cores; the builds
#: with them miss the targets by far (independent runs end in different modes, their log evidence nats apart;
#: RESULTS, section 10): a reference that meets them needs far longer HMC moves per stage and more particles
SMC_SETTINGS = {"energy-small": _smc(128, 3, 10), "yacht-small": _smc(128, 5, 20)}

#: the reference problems (see the module docstring); sampler settings measured in RESULTS, section 10
PROBLEMS: dict[str, ReferenceProblem] = {p.name: p for p in (
    ReferenceProblem("toy1d", "notebook 08's toy: 1-50-1 tanh MLP, every weight, FanInNormal(3) prior, learned "
                     "noise, on the toy1d data (seed 0)",
                     RunSpec(data="toy1d", model="mlp", hidden=[50], activation="tanh", stochastic="all",
                             prior="fan-in", prior_scale=3.0), grid="line",
                     sampler=_nuts(4, 300, 200, 10)),
    ReferenceProblem("moons", "two moons: 2-16-16-2 tanh MLP, every weight, FanInNormal(3) prior, categorical "
                     "likelihood (500 points, seed 0)",
                     RunSpec(data="moons", model="mlp", hidden=[16, 16], activation="tanh", stochastic="all",
                             prior="fan-in", prior_scale=3.0), grid="plane",
                     sampler=_nuts(4, 400, 250, 10, dense=True)),
    ReferenceProblem("energy-last", "UCI energy split 0: 8-50-1 ReLU MLP, last layer on a MAP body, Normal(0, 1) "
                     "prior, learned noise",
                     RunSpec(data="uci:energy", model="mlp", hidden=[50], stochastic="last"), frozen_body=True,
                     sampler=_nuts(4, 400, 250, 10, dense=True)),
    ReferenceProblem("energy-small", "UCI energy split 0: 8-10-1 tanh MLP, every weight, FanInNormal(3) prior, "
                     "learned noise",
                     RunSpec(data="uci:energy", model="mlp", hidden=[10], activation="tanh", stochastic="all",
                             prior="fan-in", prior_scale=3.0),
                     method="smc", sampler=SMC_SETTINGS["energy-small"], fits=SMC_RUNS),
    ReferenceProblem("yacht-small", "UCI yacht split 0: 6-10-1 tanh MLP, every weight, FanInNormal(3) prior, "
                     "learned noise",
                     RunSpec(data="uci:yacht", model="mlp", hidden=[10], activation="tanh", stochastic="all",
                             prior="fan-in", prior_scale=3.0),
                     method="smc", sampler=SMC_SETTINGS["yacht-small"], fits=SMC_RUNS),
    ReferenceProblem("digits-last", "scikit-learn digits (seed 0): LeNet-300-100, last layer on a MAP body, "
                     "Normal(0, 1) prior, categorical likelihood",
                     RunSpec(data="digits", model="lenet300100", stochastic="last"), frozen_body=True,
                     # the metric is the curvature at the MAP start, kept (the sampler's own choice for an output
                     # layer, adapt_mass="auto"): 1 010 dimensions, more than a window's 100–800 pooled draws
                     sampler=_nuts(4, 400, 250, 10, dense=True, adapt_mass="auto")),
)}

#: seconds-long sampler settings for tests (``build_reference(..., tiny=True)``), per method; a tiny SMC build has
#: two runs per half (R-hat needs two "chains"), a tiny NUTS build one fit of two chains
TINY = {"num_chains": 2, "warmup_steps": 20, "num_samples": 10, "thin": 1, "max_tree_depth": 4,
        "target_accept": 0.8, "map_steps": 50, "init": "map", "compile": False}
TINY_SMC = {**_smc(16, 1, 3), "max_stages": 200}


def get_problem(name: str) -> ReferenceProblem:
    """The problem called ``name``, or a ``ValueError`` listing the valid names."""
    if name not in PROBLEMS:
        raise ValueError(f"unknown reference {name!r}; valid references: {', '.join(PROBLEMS)}")
    return PROBLEMS[name]


def head_spec(problem: ReferenceProblem) -> RunSpec:
    """The spec a fit of the problem runs: the problem's own, or for a frozen body the one-layer head
    (``mlp`` with no hidden layer, every weight random) on the body's features."""
    spec = dataclasses.replace(problem.spec, seed=problem.data_seed)
    if problem.frozen_body:
        spec = dataclasses.replace(spec, model="mlp", hidden=[], activation=None, stochastic="all")
    return spec


def _base_data(problem: ReferenceProblem) -> Dataset:
    spec = problem.spec
    return load_dataset(spec.data, split=spec.split, seed=problem.data_seed, **spec.data_options)


def train_body(problem: ReferenceProblem, progress: bool = False, map_steps: Optional[int] = None) -> dict:
    """The body of a frozen-body problem: its network's MAP over every weight (``map`` backend, the run's
    default budget or ``map_steps`` epochs, seed ``data_seed``), as a state dict."""
    data = _base_data(problem)
    spec = dataclasses.replace(problem.spec, stochastic="all", backend="map", seed=problem.data_seed,
                               epochs=map_steps)
    bnn = build_model(spec, data)
    posterior = fit(bnn, data.x_train, data.y_train, backend="map", seed=problem.data_seed, progress=progress,
                    **resolve_backend_options(spec, data))
    net = posterior.bnn.net
    params = dict(net.named_parameters())
    missing = set(params) - set(posterior.draws)
    if missing:
        raise RuntimeError(f"the MAP fit left parameters {sorted(missing)} without values")
    with torch.no_grad():
        for name, value in posterior.draws.items():
            if name in params:
                params[name].copy_(value[0, 0])
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def problem_data(problem: ReferenceProblem, body: Optional[dict] = None) -> Dataset:
    """The data a fit of the problem sees: the data set drawn from ``data_seed``, or for a frozen body
    (``body``, the stored state dict, required) the body's features, computed in float64."""
    data = _base_data(problem)
    if not problem.frozen_body:
        return data
    if body is None:
        raise ValueError(f"reference {problem.name!r} is the last layer on a frozen body: its data need the body "
                         f"stored with the reference (build it first)")
    spec = dataclasses.replace(problem.spec, seed=problem.data_seed)
    net = build_model(spec, data).net
    net.load_state_dict(body)
    features = frozen_features(dataclasses.replace(data, x_train=data.x_train.double(), x_test=data.x_test.double()),
                               net.double(), whiten=False)
    return dataclasses.replace(features, name=f"{problem.name}-features",
                               info={**features.info, "reference": problem.name})


def problem_model(problem: ReferenceProblem, data: Dataset, seed: int):
    """The problem's :class:`~zoo.bnn.BayesianNetwork` on ``data``, initial weights from ``seed``."""
    return build_model(dataclasses.replace(head_spec(problem), seed=int(seed)), data)


def plot_grid(problem: ReferenceProblem, data: Dataset) -> Optional[torch.Tensor]:
    """Network inputs ``[G, D]`` (standardised units) of the problem's plotting grid, or ``None``: 200 points on
    the line x ∈ [−0.6, 1.3] (original units) for the 1-D toy; a 40 × 40 grid over the training inputs' range
    widened by 1 (standardised units) in the plane."""
    if problem.grid == "line":
        x = torch.linspace(-0.6, 1.3, 200, dtype=torch.float64).unsqueeze(-1)
        return ((x - data.x_loc.double()) / data.x_scale.double()).float()
    if problem.grid == "plane":
        low, high = data.x_train.min(0).values - 1, data.x_train.max(0).values + 1
        axes = [torch.linspace(float(low[i]), float(high[i]), 40) for i in range(2)]
        g0, g1 = torch.meshgrid(*axes, indexing="xy")
        return torch.stack([g0.reshape(-1), g1.reshape(-1)], -1)
    return None


def data_fingerprint(data: Dataset) -> str:
    """:meth:`zoo.data.Dataset.fingerprint`: SHA-256 of the training data as the network sees them."""
    return data.fingerprint()


def model_signature(bnn) -> dict:
    """What makes two Bayesian networks the same model: the network's structure, the random sites and their
    shapes, the prior and the likelihood (with its options and latents)."""
    likelihood = bnn.likelihood
    return {"net": repr(bnn.net), "sites": {s.name: list(s.param_shape) for s in bnn.sites},
            "prior": repr(bnn.prior), "likelihood": type(likelihood).__name__,
            "likelihood_options": {k: v for k, v in sorted(likelihood.options().items())}}
