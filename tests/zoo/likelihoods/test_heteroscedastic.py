"""The heteroscedastic likelihood on the generated set that broke it (issue 29): the generator, the last layer
against the Gaussian one at a small size, and the bound on the variance head."""
import importlib.util
import math
from pathlib import Path

import pytest
import torch

from lab.runs.spec import RunSpec
from lab.runs.execution import execute
from zoo.likelihoods import HeteroscedasticGaussianLikelihood

ROOT = Path(__file__).resolve().parents[3]


def _generator():
    spec = importlib.util.spec_from_file_location("heteroscedastic_uci", ROOT / "benchmarks" / "heteroscedastic_uci.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_set_is_in_the_uci_layout_bounded_skewed_and_heteroscedastic(tmp_path):
    generator = _generator()
    folder = generator.write_heteroscedastic_uci(tmp_path / "het", n_rows=400, n_splits=2)
    table = generator.heteroscedastic_table(400)
    y = table[:, -1]
    low, high = generator.TARGET_RANGE
    assert ((low <= y) & (y <= high)).all() and ((y - y.mean()) ** 3).mean() > 0  # bounded, right-skewed
    for split in (0, 1):
        train = set((folder / f"index_train_{split}.txt").read_text().split())
        test = set((folder / f"index_test_{split}.txt").read_text().split())
        assert len(test) == 40 and not train & test and len(train | test) == 400
    with pytest.raises(ValueError, match="n_rows >= 20"):
        generator.write_heteroscedastic_uci(tmp_path / "small", n_rows=5)


def test_heteroscedastic_last_layer_is_no_worse_than_the_gaussian_one(tmp_path):
    folder = _generator().write_heteroscedastic_uci(tmp_path / "het", n_rows=3000)
    common = dict(data=f"uci:{folder}", model="mlp", hidden=[50], stochastic="last", backend="svi", epochs=40,
                  num_samples=50)
    metrics = {name: execute(RunSpec(likelihood=name, **common), progress=False).metrics
               for name in ("gaussian", "heteroscedastic")}
    gaussian, heteroscedastic = metrics["gaussian"], metrics["heteroscedastic"]
    assert heteroscedastic["rmse"] <= 1.1 * gaussian["rmse"], metrics
    assert heteroscedastic["test_ll"] >= gaussian["test_ll"], metrics
    assert not heteroscedastic["failed_fit"], heteroscedastic["failed_fit_reason"]


def test_variance_head_is_bounded_at_ten_target_sds_far_from_the_data():
    """A log-variance linear in ReLU features grows without bound off the training inputs; the
    likelihood caps σ at 10 standardised units (it was 1e3: 165x the targets' range on the generated set)."""
    likelihood = HeteroscedasticGaussianLikelihood()
    f = torch.tensor([[[0.0, 0.0], [0.0, 4.0], [0.0, 60.0]]])  # [S=1, N=3, (mean, log σ²)]
    expected = torch.tensor([1.0, math.exp(4.0), 100.0])
    torch.testing.assert_close(likelihood.noise_variance(f, {})[0, :, 0], expected)
    fisher = likelihood.output_fisher(f[0], {})
    assert fisher[2, 1, 1] == 0 and fisher[1, 1, 1] == 0.5  # clamped: no gradient, no curvature



def test_sampler_start_is_the_map_backends_fit():
    """The MAP start of HMC / NUTS / SG-MCMC / Laplace is the ``map`` backend's fit (the β-NLL optimum of a
    heteroscedastic likelihood, whose mean head does not starve) with the same seed, step budget and held-out
    choice of the epochs (a variance head: the ``map`` backend's rule, inference.optim.early_stopping): the same
    site values, bitwise."""
    from inference import fit
    from inference.optim.potential import Potential
    from inference.optim.start import MAP_BATCH_SIZE, initial_point, map_epochs
    from zoo import BayesianNetwork
    from zoo.architectures import MLP

    x = torch.randn(100, 2, generator=torch.Generator().manual_seed(0))
    y = x[:, :1] + 0.3 * torch.randn(100, 1, generator=torch.Generator().manual_seed(1)) * (1 + x[:, 1:].abs())

    def model():
        torch.manual_seed(0)
        likelihood = HeteroscedasticGaussianLikelihood(beta=0.5)
        return BayesianNetwork(MLP(2, likelihood.heads, hidden=(6,)), "all", likelihood=likelihood, example_input=x)

    bnn = model()
    potential = Potential(bnn, x, y)
    z, record = initial_point(potential, "map", map_steps=40, map_lr=0.01, seed=3)
    epochs = map_epochs(100, None, 40)
    assert epochs == 20 and MAP_BATCH_SIZE == 64
    chosen = record["early_stopping"]["epochs"]
    assert record["early_stopping"]["max_epochs"] == epochs and record["map_steps"] == 2 * chosen  # 2 batches an epoch
    reference = fit(model(), x, y, backend="map", seed=3, progress=False, epochs=epochs, batch_size=MAP_BATCH_SIZE,
                    lr=0.01)
    assert reference.info["early_stopping"]["epochs"] == chosen
    values = potential.unpack(z.unsqueeze(0))[0]
    assert all(torch.equal(values[name][0], reference.draws[name][0, 0]) for name in reference.draws)


def test_ratio_table_pairs_each_heteroscedastic_row_with_its_gaussian_row():
    import pandas as pd
    spec = importlib.util.spec_from_file_location("heteroscedastic_ratio", ROOT / "benchmarks" / "heteroscedastic_ratio.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    row = dict(dataset="energy", backend="svi", stochastic="all", n=20, failed_fit=0, test_ll_mean=-1.0, test_ll_se=0.1,
               coverage_90_mean=0.9, rmse_se=0.01)
    summary = pd.DataFrame([{**row, "likelihood": "gaussian", "rmse_mean": 0.5},
                            {**row, "likelihood": "heteroscedastic", "rmse_mean": 0.7, "failed_fit": 3},
                            {**row, "stochastic": "last", "likelihood": "heteroscedastic", "rmse_mean": 0.4}])
    lines, worst = module.ratio_table(summary)
    assert worst == pytest.approx(1.4)
    assert lines[2].endswith("| 3/20 | 0.500 | -1.00 | **1.40** |") and lines[3].endswith("| — | — | — |")
