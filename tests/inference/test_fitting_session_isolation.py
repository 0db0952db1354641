"""A fit leaves the caller's session as it was (every backend): the global torch / numpy / Python
random states, the train/eval mode of each submodule, and Pyro's global parameter store."""
from __future__ import annotations

import random

import numpy as np
import pyro
import pytest
import torch

from inference.backends import BACKENDS

from inference.fitting import fit

from tests.inference.backends.test_backends_x_likelihoods import TINY, tiny_problem


def _draws() -> tuple:
    return torch.rand(3), np.random.rand(3), random.random()


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_fit_leaves_rng_mode_and_param_store_unchanged(backend, mode):
    bnn, x, _, y_std = tiny_problem(backend, "heteroscedastic", beta=0.5)
    bnn.train(mode == "train")
    next(iter(bnn.net.children())).train(mode != "train")  # a mixed tree: each module's own flag must come back
    modes = {name: module.training for name, module in bnn.named_modules()}
    pyro.param("users_own_param", torch.ones(2))
    store = set(pyro.get_param_store().keys())

    torch.manual_seed(123), np.random.seed(123), random.seed(123)
    expected = _draws()
    torch.manual_seed(123), np.random.seed(123), random.seed(123)
    posterior = fit(bnn, x, y_std, backend=backend, seed=0, progress=False, **TINY[backend])
    after = _draws()

    assert torch.equal(after[0], expected[0]), "fit changed torch's global generator"
    assert np.array_equal(after[1], expected[1]), "fit changed numpy's global generator"
    assert after[2] == expected[2], "fit changed Python's global generator"
    assert {name: module.training for name, module in bnn.named_modules()} == modes
    assert set(pyro.get_param_store().keys()) == store
    assert posterior.predict(x[:4]).mean.isfinite().all()


def test_fit_restores_the_session_when_it_fails():
    bnn, x, _, y_std = tiny_problem("map", "heteroscedastic", beta=0.5)
    bnn.eval()
    torch.manual_seed(5)
    expected = torch.rand(2)
    torch.manual_seed(5)
    with pytest.raises(Exception):
        fit(bnn, x, y_std, backend="map", seed=0, progress=False, lr=1e30, epochs=3)
    assert torch.equal(torch.rand(2), expected)
    assert not any(module.training for module in bnn.modules())
