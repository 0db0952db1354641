"""``write_report(posterior, path, data=...)`` with plain tensors as given to ``fit``."""
from __future__ import annotations

import pytest
import torch

from inference import fit
from lab.report import write_report
from lab.report.rundata import tensors_as_dataset
from zoo import BayesianNetwork, GaussianLikelihood
from zoo.architectures import MLP


def _fitted():
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 40).unsqueeze(1)
    y = 5.0 + 2.0 * torch.sin(3 * x) + 0.2 * torch.randn(40, 1)
    bnn = BayesianNetwork(MLP(1, 1, hidden=(8,)), "last", likelihood=GaussianLikelihood(learn_noise=True),
                          example_input=x, target_loc=y.mean(0), target_scale=y.std(0))
    y_std = (y - bnn.target_loc) / bnn.target_scale
    return fit(bnn, x, y_std, backend="map", epochs=30, progress=False), x, y, y_std


@pytest.mark.parametrize("parts", [2, 4])
def test_report_from_tensors(tmp_path, parts):
    posterior, x, y, y_std = _fitted()
    data = (x, y_std) if parts == 2 else (x[:30], y_std[:30], x[30:], y_std[30:])
    dataset = tensors_as_dataset(posterior.bnn, data)
    assert torch.allclose(dataset.y_test_original(), y if parts == 2 else y[30:], atol=1e-5)  # original units
    path = write_report(posterior, tmp_path / "report.html", data=data)
    html = path.read_text()
    assert "passed to the report" in html and "<html" in html.lower()


def test_report_data_of_the_wrong_kind_is_a_clear_error(tmp_path):
    posterior, x, _, y_std = _fitted()
    with pytest.raises(ValueError, match="2 or 4 tensors"):
        write_report(posterior, tmp_path / "r.html", data=(x, y_std, x))
    with pytest.raises(ValueError, match="data= for the report"):
        write_report(posterior, tmp_path / "r.html", data=(x, y_std[:5]))


def test_report_refuses_another_dataset_than_the_fit(tmp_path):
    """A Dataset with another target scaling than the model's (another split or set) is refused by name."""
    from zoo.data import regression_dataset

    posterior, x, y, _ = _fitted()
    other = regression_dataset("other", x.numpy(), (3 * y).numpy(), x[:10].numpy(), (3 * y[:10]).numpy(),
                               feature_names=["x"], target_names=["y"], info={})
    with pytest.raises(ValueError, match="data"):
        write_report(posterior, tmp_path / "r.html", data=other)
