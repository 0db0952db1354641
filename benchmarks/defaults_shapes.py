"""The problem shapes of the defaults matrix (``benchmarks/defaults.py``): the networks people try first.

Each shape builds, from a fixed seed, what a new user at a notebook writes before calling
``fit(bnn, x, y, backend=B)`` with nothing else: a plain ``nn.Module``, a
:class:`~zoo.BayesianNetwork` around it (the selector, the likelihood a user of that task picks,
an example input), training tensors and a held-out test set in original units.

* ``sine`` — a 1-32-32-1 tanh MLP (``nn.Sequential``) on 200 points x ~ U(−3, 3),
  y = sin x + ε, ε ~ N(0, 0.1²); 1000 test points from the same law; ``BayesianNetwork(net,
  stochastic=...)`` with nothing else: no ``example_input`` (the fit builds the model) and the default
  likelihood, a Gaussian of fixed noise sd 0.1 — the data's own, so coverage measures how well the
  posterior fits the function.  Also ``mean_error``: RMSE of the predictive mean against sin x.
* ``moons`` — a 2-32-32-2 tanh MLP on 200 points of scikit-learn's two moons (noise 0.2),
  1000 test points; categorical likelihood.
* ``energy`` — the README's model: ``MLP(8, 1, hidden=(50,))`` on UCI energy, split 0, targets
  standardised (``target_loc`` / ``target_scale``), learned Gaussian noise.
* ``cnn`` — the zoo's ``SmallCNN`` (LeNet-5 style) on scikit-learn's 8×8 digits (1347 training,
  450 test images), categorical likelihood; ``last`` only.
* ``gru`` — a GRU regressor (``nn.GRU(1, 32)`` and a linear head on the last state) predicting the
  next value of a noisy sine of random frequency and phase from its 20 previous values: 300 training
  and 500 test sequences, learned Gaussian noise; ``last`` (the head) only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from zoo import BayesianNetwork, CategoricalLikelihood, GaussianLikelihood

__all__ = ["Problem", "SHAPES", "SELECTORS", "build_problem", "GRURegressor"]

SINE_NOISE_SD = 0.1
GRU_STEPS = 20


@dataclass
class Problem:
    """One shape, built: the model, training tensors (the model's units) and the test set.

    ``y_test`` is in original units (regression ``[N, T]``, classification labels ``[N]``);
    ``f_test`` the noise-free regression function at ``x_test`` where known (sine), else ``None``.
    """

    bnn: BayesianNetwork
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    task: str
    f_test: Optional[torch.Tensor] = None


def _mlp(widths: tuple[int, ...]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


def _sine(selector: str) -> Problem:
    g = torch.Generator().manual_seed(0)
    x_train, x_test = torch.rand(200, 1, generator=g) * 6 - 3, torch.rand(1000, 1, generator=g) * 6 - 3
    y_train = torch.sin(x_train) + SINE_NOISE_SD * torch.randn(200, 1, generator=g)
    y_test = torch.sin(x_test) + SINE_NOISE_SD * torch.randn(1000, 1, generator=g)
    torch.manual_seed(0)
    bnn = BayesianNetwork(_mlp((1, 32, 32, 1)), stochastic=selector)  # the default likelihood: noise sd 0.1, fixed
    return Problem(bnn, x_train, y_train, x_test, y_test, "regression", f_test=torch.sin(x_test))


def _moons(selector: str) -> Problem:
    from zoo.data import make_moons_dataset

    data = make_moons_dataset(n=1200, noise=0.2, seed=0, test_fraction=1000 / 1200)
    torch.manual_seed(0)
    bnn = BayesianNetwork(_mlp((2, 32, 32, 2)), stochastic=selector, likelihood=CategoricalLikelihood(),
                          example_input=data.x_train[:2])
    return Problem(bnn, data.x_train, data.y_train, data.x_test, data.y_test, "classification")


def _energy(selector: str, split: int = 0) -> Problem:
    from zoo.architectures import MLP
    from zoo.data import load_dataset

    data = load_dataset("uci:energy", split=split)
    torch.manual_seed(0)
    bnn = BayesianNetwork(MLP(data.input_dim, 1, hidden=(50,)), stochastic=selector,
                          likelihood=GaussianLikelihood(learn_noise=True), example_input=data.x_train[:2],
                          target_loc=data.y_loc, target_scale=data.y_scale)
    return Problem(bnn, data.x_train, data.y_train, data.x_test, data.y_test_original(), "regression")


def _cnn(selector: str) -> Problem:
    from zoo.architectures import SmallCNN
    from zoo.data import load_digits_dataset

    data = load_digits_dataset()
    torch.manual_seed(0)
    bnn = BayesianNetwork(SmallCNN(in_channels=1, image_size=8, num_classes=10), stochastic=selector,
                          likelihood=CategoricalLikelihood(), example_input=data.x_train[:2])
    return Problem(bnn, data.x_train, data.y_train, data.x_test, data.y_test, "classification")


class GRURegressor(nn.Module):
    """``[N, T, 1]`` sequences → ``[N, 1]``: a one-layer ``nn.GRU`` and a linear head on its last state."""

    def __init__(self, hidden: int = 32):
        super().__init__()
        self.gru = nn.GRU(1, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        states, _ = self.gru(x)
        return self.head(states[:, -1])


def _sequences(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` windows of a sine of frequency U(0.5, 1.5) rad/step and phase U(0, 2π): 20 values
    with N(0, 0.05²) noise in, the next value with N(0, 0.1²) noise out."""
    omega = 0.5 + torch.rand(n, 1, generator=g)
    phase = 2 * math.pi * torch.rand(n, 1, generator=g)
    steps = torch.arange(GRU_STEPS + 1, dtype=torch.float32)
    clean = torch.sin(omega * steps + phase)
    x = clean[:, :GRU_STEPS] + 0.05 * torch.randn(n, GRU_STEPS, generator=g)
    y = clean[:, GRU_STEPS:] + 0.1 * torch.randn(n, 1, generator=g)
    return x.unsqueeze(-1), y


def _gru(selector: str) -> Problem:
    g = torch.Generator().manual_seed(0)
    (x_train, y_train), (x_test, y_test) = _sequences(300, g), _sequences(500, g)
    torch.manual_seed(0)
    bnn = BayesianNetwork(GRURegressor(), stochastic=selector, likelihood=GaussianLikelihood(learn_noise=True),
                          example_input=x_train[:2])
    return Problem(bnn, x_train, y_train, x_test, y_test, "regression")


#: shape name -> builder(selector) -> Problem
SHAPES: dict[str, Callable[[str], Problem]] = {"sine": _sine, "moons": _moons, "energy": _energy, "cnn": _cnn,
                                               "gru": _gru}
#: the selectors each shape is fitted with (the CNN and the GRU: their last layer, as a user starts)
SELECTORS = {"sine": ("last", "all"), "moons": ("last", "all"), "energy": ("last", "all"), "cnn": ("last",),
             "gru": ("last",)}


def build_problem(shape: str, selector: str, split: int = 0) -> Problem:
    """The shape's problem; ``split``: energy's UCI split (the matrix's cells use split 0; the other shapes have one
    data set)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; valid shapes: {', '.join(SHAPES)}")
    if selector not in SELECTORS[shape]:
        raise ValueError(f"shape {shape!r} is fitted with stochastic in {SELECTORS[shape]}, not {selector!r}")
    if split and shape != "energy":
        raise ValueError(f"--split applies to the energy shape only (UCI splits); {shape!r} has one data set")
    return SHAPES[shape](selector, split) if shape == "energy" else SHAPES[shape](selector)
