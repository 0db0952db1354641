"""A run predicts its test set once (issue 26, item 4): metrics, member metrics and the ArviZ export share it."""
import pytest
import torch

from inference import fit
from inference.evaluation.member_metrics import member_metrics, member_predictions
from inference.posterior import member_posteriors
from inference.evaluation.metrics import evaluate
from lab.cli import main
from lab.runs.model import build_model
from lab.runs.spec import RunSpec
from zoo.bnn import BayesianNetwork
from zoo.data import load_dataset

TINY = ["--data", "toy1d", "--hidden", "4", "--epochs", "3", "--quiet"]


@pytest.mark.parametrize("backend", ["svi", "ensemble", "map"])
def test_a_cli_run_predicts_the_test_set_once(tmp_path, monkeypatch, capsys, backend):
    """Every network evaluation at the test inputs is counted: one prediction per run (a multi-member
    posterior included), the ArviZ export and the member metrics read it."""
    x_test = load_dataset("toy1d").x_test
    calls = []
    original = BayesianNetwork.forward_draws

    def counting(self, values, x):
        if x.shape == x_test.shape and torch.equal(x.to(x_test), x_test):
            calls.append(next(iter(values.values())).shape[0] if values else 1)
        return original(self, values, x)

    monkeypatch.setattr(BayesianNetwork, "forward_draws", counting)
    extra = {"svi": ["--num-samples", "10"], "ensemble": ["--option", "num_members=3"], "map": []}[backend]
    assert main(["fit", *TINY, "--backend", backend, *extra, "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    assert len(calls) == 1


def test_member_metrics_read_off_the_mixture_equal_each_members_own_prediction():
    data = load_dataset("toy1d")
    spec = RunSpec(data="toy1d", hidden=[4], backend="ensemble")
    posterior = fit(build_model(spec, data), data.x_train, data.y_train, backend="ensemble", num_members=3, epochs=3,
                    progress=False)
    y_test = data.y_test_original()
    mixture = posterior.predict(data.x_test, y=y_test, seed=0)
    parts = member_predictions(mixture, posterior.num_chains, y_test)
    for part, member in zip(parts, member_posteriors(posterior)):
        own = member.predict(data.x_test, y=y_test, seed=0)
        torch.testing.assert_close(part.f, own.f)
        torch.testing.assert_close(part.log_lik, own.log_lik)
        torch.testing.assert_close(part.pit, own.pit)
        assert evaluate(part, y_test) == pytest.approx(evaluate(own, y_test))
    record = member_metrics(posterior, data.x_test, y_test, mixture)
    assert record["num_members"] == 3 and 0 <= record["disagreement"] <= 1
    with pytest.raises(ValueError, match="points but x has"):
        member_metrics(posterior, data.x_test[:5], y_test[:5], mixture)


def test_the_arviz_export_reuses_the_prediction_of_its_draws():
    data = load_dataset("toy1d")
    spec = RunSpec(data="toy1d", hidden=[4])
    posterior = fit(build_model(spec, data), data.x_train, data.y_train, epochs=3, num_samples=10, progress=False)
    y_test = data.y_test_original()
    prediction = posterior.predict(data.x_test, y=y_test, seed=3)
    reused = posterior.to_arviz(data.x_test, y_test, seed=3, prediction=prediction)
    fresh = posterior.to_arviz(data.x_test, y_test, seed=3)  # predicted anew from the exported draws
    torch.testing.assert_close(torch.as_tensor(reused.log_likelihood["obs"].values),
                               torch.as_tensor(fresh.log_likelihood["obs"].values))
