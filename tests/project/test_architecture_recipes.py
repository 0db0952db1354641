"""The recipes of docs/architecture.md, run: a new backend (single and stacked) and a new likelihood.

The toy backend is the smallest posterior family there is — independent draws from the prior — built the
way the recipe says: a ``Config`` dataclass (its options, checked by :func:`inference.backends.parse_config`)
and a ``run`` that assembles parts (here one: the prior's ``sample``), returning a posterior of an
existing kind so that save/load and ArviZ export come for free.  The toy stacked backend is a point
estimate whose single fit and stacked fit call the same MAP step (``optim/``), declaring its capabilities
on itself; the toy likelihood is a Gaussian with a fixed noise sd per target, registered with ``register_likelihood``.
(The "new grid" recipe's test is ``tests/lab/grids/test_registry.py``.)
"""
from __future__ import annotations

import dataclasses
import math
import time

import pyro
import pyro.distributions as dist
import pytest
import torch

from inference import BACKENDS, fit, fit_many, load_posterior, register_backend
from inference.backends.base import Backend
from inference.fitting import batch_blocker
from inference.optim.map import MAPOptions, fit_map, run_info, stack_members
from inference.optim.stacked_map import fit_map_starts
from inference.posterior import SamplePosterior
from zoo import BayesianNetwork
from zoo.architectures import MLP
from zoo.likelihoods import LIKELIHOODS, Likelihood, make_likelihood, register_likelihood


@dataclasses.dataclass
class PriorDrawsConfig:
    num_samples: int = 64

    def validate(self) -> None:
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be at least 1, got {self.num_samples}")


class PriorDrawsBackend(Backend):
    """``num_samples`` independent draws of every random site from its prior (one chain)."""

    name = "prior-draws"
    Config = PriorDrawsConfig

    def run(self, bnn, x, y, config, seed, progress):
        pyro.set_rng_seed(seed)  # fit() restores the caller's random state afterwards
        draws = {site: prior.sample((1, config.num_samples))  # [chains, draws, *site_shape]
                 for site, prior in bnn.prior_distributions().items()}
        return SamplePosterior(bnn, draws, info={"backend": self.name})


@pytest.fixture
def toy_backend():
    register_backend(PriorDrawsBackend())
    try:
        yield BACKENDS["prior-draws"]
    finally:
        del BACKENDS["prior-draws"]


def _problem():
    x = torch.linspace(-2, 2, 30).unsqueeze(1)
    y = torch.sin(x) + 0.1 * torch.randn(30, 1, generator=torch.Generator().manual_seed(0))
    bnn = BayesianNetwork(MLP(1, 1, hidden=(8,)), "last", example_input=x, target_loc=y.mean(0),
                          target_scale=y.std(0))
    return bnn, x, y


def test_a_new_backend_registers_fits_saves_loads_and_exports(toy_backend, tmp_path):
    bnn, x, y = _problem()
    posterior = fit(bnn, x, (y - bnn.target_loc) / bnn.target_scale, backend="prior-draws", seed=3,
                    progress=False, num_samples=40)
    draws = posterior.sample_params(seed=0)
    assert all(v.shape[0] == 40 for v in draws.values())
    # the prior's spread, not a fitted one: the last layer's weights have the prior's sd (N(0, 1) by default)
    weight = next(v for k, v in draws.items() if k.endswith("weight"))
    assert 0.6 < float(weight.std()) < 1.5
    prediction = posterior.predict(x, y=y, seed=0)
    posterior.save(tmp_path / "toy")
    reloaded = load_posterior(tmp_path / "toy").predict(x, y=y, seed=0)
    assert torch.equal(prediction.f, reloaded.f)
    idata = posterior.to_arviz(x, y, seed=0)
    assert idata.log_likelihood["obs"].shape[:2] == (1, 40)
    same_seed = fit(bnn, x, (y - bnn.target_loc) / bnn.target_scale, backend="prior-draws", seed=3,
                    progress=False, num_samples=40)
    assert all(torch.equal(same_seed.draws[k], posterior.draws[k]) for k in posterior.draws)


def test_a_new_backends_options_are_checked_by_the_one_contract(toy_backend):
    bnn, x, y = _problem()
    with pytest.raises(ValueError, match="unknown option.*num_sample.*valid options: num_samples"):
        fit(bnn, x, y, backend="prior-draws", num_sample=5)
    with pytest.raises(ValueError, match="num_samples must be at least 1"):
        fit(bnn, x, y, backend="prior-draws", num_samples=0)
    with pytest.raises(ValueError, match="prior-draws"):  # a DataLoader needs LoopOptions or accepts_loader
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=10)
        fit(bnn, loader, backend="prior-draws")


def test_unknown_backends_list_the_registered_ones(toy_backend):
    bnn, x, y = _problem()
    with pytest.raises(ValueError, match="valid backends: .*prior-draws"):
        fit(bnn, x, y, backend="prior-draw")


def test_a_backend_without_a_stacked_fit_is_refused_by_fit_many(toy_backend):
    bnn, x, y = _problem()
    assert toy_backend.fit_stacked is None and toy_backend.budget == "chains"  # the base's declarations
    with pytest.raises(ValueError, match="cannot be stacked: backend 'prior-draws' has no stacked engine"):
        fit_many([bnn], [x], [y], backend="prior-draws")
    with pytest.raises(ValueError, match="already registered"):
        register_backend(PriorDrawsBackend())


# ---------------------------------------------------------------------- a new backend, stacked
@dataclasses.dataclass
class PointConfig(MAPOptions):
    """The MAP optimiser's options (epochs, lr, batch_size, ...)."""


def _point_posterior(name, bnn, fitted, config, seed, x, started, **extra):
    info = run_info(name, config, seed, x, started, history=fitted.history, **extra)
    return SamplePosterior(bnn, stack_members([fitted]), info=info)


class PointBackend(Backend):
    """A point estimate (one chain of one draw) whose single and stacked fits take the one MAP step."""

    name = "toy-point"
    Config = PointConfig
    budget = "map"  # grids size it as a MAP fit: epochs of minibatches
    stacks_trained_body = True  # fit_map_starts stacks a last-layer model's body too

    def run(self, bnn, x, y, config, seed, progress):
        started = time.perf_counter()
        return _point_posterior(self.name, bnn, fit_map(bnn, x, y, config, seed, progress), config, seed, x, started)

    def fit_stacked(self, bnns, xs, ys, config, seeds, progress):
        started = time.perf_counter()
        fits, stopped = fit_map_starts(bnns, xs, ys, config, seeds, progress, f"{self.name} x{len(bnns)}")
        return [_point_posterior(self.name, bnn, fitted, config, int(seed), x, started,
                                 multifit={"fits": len(bnns), "index": k})
                for k, (bnn, fitted, seed, x) in enumerate(zip(bnns, fits, seeds, xs))]

    def stack_blocker(self, bnn, config):
        return "this toy stacks no gradient clipping" if config.optimizer == "clipped-adam" else None


@pytest.fixture
def stacked_backend():
    register_backend(PointBackend())
    try:
        yield BACKENDS["toy-point"]
    finally:
        del BACKENDS["toy-point"]


def _problems(count):
    out = []
    for k in range(count):
        torch.manual_seed(k)
        bnn, x, y = _problem()
        out.append((bnn, x, (y - bnn.target_loc) / bnn.target_scale + 0.05 * k))
    return out


def test_a_new_stacked_backend_fits_k_problems_as_the_single_fits_do(stacked_backend):
    problems = _problems(3)
    singles = [fit(bnn, x, y, backend="toy-point", seed=k, progress=False, epochs=30, lr=0.05)
               for k, (bnn, x, y) in enumerate(_problems(3))]
    stacked = fit_many([p[0] for p in problems], [p[1] for p in problems], [p[2] for p in problems],
                       backend="toy-point", seeds=[0, 1, 2], epochs=30, lr=0.05)
    for one, many in zip(singles, stacked):  # the same MAP step, batched: equal to float rounding
        assert many.info["multifit"]["fits"] == 3
        for site, value in one.draws.items():
            assert torch.allclose(value, many.draws[site], atol=1e-4), site
    # its declared blocker and the generic model checks are asked before any fit
    assert "no gradient clipping" in batch_blocker(problems[0][0], "toy-point", PointConfig(optimizer="clipped-adam"))
    assert batch_blocker(problems[0][0], "toy-point", PointConfig()) is None


# ---------------------------------------------------------------------- a new likelihood
class PerTargetNoiseLikelihood(Likelihood):
    """``y_t ~ Normal(f_t, s_t²)`` with a fixed noise sd ``s_t`` per target (standardised units)."""

    name = "per-target-noise"
    task = "regression"

    def __init__(self, sds: tuple = (0.3,)):
        if not sds or not all(sd > 0 for sd in sds):
            raise ValueError(f"sds must be positive numbers, one per target, got {sds!r}")
        self.sds = [float(sd) for sd in sds]

    def options(self):
        return {"sds": self.sds}

    def _sd(self, f):
        return torch.tensor(self.sds, dtype=f.dtype, device=f.device)  # [T], broadcast against [..., N, T]

    def distribution(self, f, latents):
        return dist.Normal(f, self._sd(f))

    def sample(self, f, latents, generator=None):
        return f + self._sd(f) * torch.randn(f.shape, generator=generator, dtype=f.dtype).to(f.device)

    def predictive_mean(self, f, latents):
        return f

    def noise_variance(self, f, latents):
        return (self._sd(f) ** 2).expand(f.shape[0], 1, f.shape[-1])

    def mixture_params(self, f, latents):
        return {"loc": f, "scale": self._sd(f).expand(f.shape[0], 1, f.shape[-1])}

    def output_fisher(self, f, latents):
        return torch.diag_embed((self._sd(f) ** -2).expand(f.shape))


@pytest.fixture
def toy_likelihood():
    register_likelihood(PerTargetNoiseLikelihood)
    try:
        yield PerTargetNoiseLikelihood
    finally:
        del LIKELIHOODS["per-target-noise"]


def test_a_new_likelihood_registers_fits_predicts_saves_and_loads(toy_likelihood, tmp_path):
    likelihood = make_likelihood("per-target-noise", sds=[0.5])
    with pytest.raises(ValueError, match="no option 'sd'.*sds"):
        make_likelihood("per-target-noise", sd=0.5)
    with pytest.raises(ValueError, match="already registered"):
        register_likelihood(PerTargetNoiseLikelihood)
    # the closed form: log p(y | f) = −log(s √(2π)) − (y − f)² / (2 s²)
    f, y = torch.tensor([[[0.2], [1.0]]]), torch.tensor([[0.5], [0.0]])
    expected = -math.log(0.5 * math.sqrt(2 * math.pi)) - ((y - f[0]) ** 2).squeeze(-1) / (2 * 0.25)
    assert torch.allclose(likelihood.log_prob(f, y, {})[0], expected)
    x = torch.linspace(-2, 2, 30).unsqueeze(1)
    y = torch.sin(x) + 0.1 * torch.randn(30, 1, generator=torch.Generator().manual_seed(0))
    bnn = BayesianNetwork(MLP(1, 1, hidden=(8,)), "last", likelihood=likelihood, example_input=x,
                          target_loc=y.mean(0), target_scale=y.std(0))
    posterior = fit(bnn, x, (y - bnn.target_loc) / bnn.target_scale, backend="map", seed=0, progress=False,
                    epochs=50)
    prediction = posterior.predict(x, y=y, seed=0)
    assert torch.isfinite(prediction.f).all()
    posterior.save(tmp_path / "toy-likelihood")  # a registered likelihood is rebuilt from its attributes
    reloaded = load_posterior(tmp_path / "toy-likelihood")
    assert isinstance(reloaded.bnn.likelihood, PerTargetNoiseLikelihood) and reloaded.bnn.likelihood.sds == [0.5]
    assert torch.equal(reloaded.predict(x, y=y, seed=0).f, prediction.f)
