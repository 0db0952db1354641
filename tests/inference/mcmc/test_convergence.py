"""Every chain-based backend reports its convergence (inference/mcmc/convergence.py, evaluation/diagnostics.py):
R-hat and ESS of f_mean, log_joint and the latents in ``post.info`` and the repr, with a warning when unmixed."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.inference.conftest import make_conjugate_regression
from tests.inference.mcmc.test_hmc import FAST, linear_bnn
from inference import fit
from inference.evaluation.diagnostics import convergence_row, draws_convergence
from inference.mcmc.convergence import draw_quantities
from inference.optim.potential import Potential


def test_draws_convergence_tells_mixed_from_unmixed_chains():
    rng = np.random.default_rng(0)
    mixed = rng.normal(size=(4, 500, 3))
    shifted = mixed + np.arange(4).reshape(4, 1, 1)  # each chain around its own mean
    result = draws_convergence({"f_mean": mixed, "log_joint": mixed[..., 0]})
    assert result["rhat_max"] < 1.01 and result["ess_bulk_min"] > 1500  # independent draws: ESS ≈ 2000
    assert set(result["by_quantity"]) == {"f_mean", "log_joint"}
    bad = draws_convergence({"f_mean": shifted, "log_joint": mixed[..., 0]})
    assert bad["rhat_max"] > 1.5 and bad["by_quantity"]["log_joint"]["rhat_max"] < 1.01
    one_chain = draws_convergence({"f_mean": mixed[:1]})
    assert one_chain["rhat_max"] is None and one_chain["ess_bulk_min"] > 300
    assert draws_convergence({"f_mean": mixed[:, :3]})["ess_bulk_min"] is None  # too few draws per chain
    constant = draws_convergence({"f_mean": mixed, "flat": np.ones((4, 500))})
    assert constant["rhat_max"] == pytest.approx(result["rhat_max"])  # undefined R-hat left out
    with pytest.raises(ValueError, match="one shared"):
        draws_convergence({"a": mixed, "b": mixed[:, :10]})


def test_short_hmc_run_warns_and_shows_r_hat_in_info_and_repr():
    data = make_conjugate_regression()
    with pytest.warns(RuntimeWarning, match=r"hmc: rhat_max .* > 1.05: the chains disagree"):
        post = fit(linear_bnn(data, learn_noise=True), data.x, data.y, backend="hmc", seed=0, progress=False,
                   num_chains=4, warmup_steps=0, num_samples=30, num_steps=1, step_size=1e-4, init_jitter=1.0, **FAST)
    assert post.info["rhat_max"] > 1.05 and post.info["ess_bulk_min"] < 50
    quantities = post.info["convergence"]["quantities"]
    assert set(quantities) == {"f_mean", "log_joint", "noise_precision"}
    assert post.info["convergence"]["warning"].startswith("rhat_max")
    assert set(post.info["convergence"]["sites"]) == {"weight", "bias"}
    text = repr(post)
    assert f"R-hat max {post.info['rhat_max']:.3g}" in text and "the chains have not mixed" in text
    assert "R-hat max" in post._repr_html_()


@pytest.mark.parametrize("backend, options", [
    ("nuts", {"warmup_steps": 100, "num_samples": 100, **FAST}),
    ("sgld", {"warmup_steps": 500, "num_samples": 50, "init": "current", "batch_size": None, "time_budget": None}),
])
def test_mixed_chains_report_their_convergence_without_a_warning(backend, options, recwarn):
    data = make_conjugate_regression()
    post = fit(linear_bnn(data), data.x, data.y, backend=backend, seed=0, progress=False, num_chains=4, **options)
    assert post.info["rhat_max"] < 1.05 and post.info["convergence"]["warning"] is None
    assert not [w for w in recwarn if "rhat_max" in str(w.message)]
    assert "above 1.05" not in repr(post) and "R-hat max" in repr(post)


def test_the_log_joint_from_the_samplers_log_density_equals_the_one_evaluated_on_the_rows():
    data = make_conjugate_regression()
    bnn = linear_bnn(data, learn_noise=True)
    potential = Potential(bnn, data.x, data.y)
    z = 0.1 * torch.randn(2, 5, potential.dim, generator=torch.Generator().manual_seed(0))
    lp = potential.log_density(z.reshape(10, -1)).reshape(2, 5)
    from_lp, where = draw_quantities(potential, z, log_density=lp)
    evaluated, rows = draw_quantities(potential, z)
    assert torch.allclose(from_lp["log_joint"], evaluated["log_joint"], rtol=1e-5)
    values = potential.draws(z)
    flat = {k: v.reshape(10, *v.shape[2:]) for k, v in values.items()}
    assert torch.allclose(evaluated["log_joint"].reshape(10), bnn.log_joint(flat, data.x, data.y), rtol=1e-5)
    assert evaluated["f_mean"].shape == (2, 5, where["points"], 1) and where["rows"] == data.x.shape[0]
    assert torch.equal(evaluated["noise_precision"], values["noise_precision"])


def test_convergence_row_reads_the_record():
    assert convergence_row({}) is None
    record = {"rhat_max": 1.3, "ess_bulk_min": 8.2, "ess_tail_min": 20.0,
              "convergence": {"quantities": {"f_mean": {}, "log_joint": {}}}}
    label, text = convergence_row(record)
    assert label == "convergence"
    assert text == "R-hat max 1.3, bulk ESS min 8, tail ESS min 20 (f_mean, log_joint); above 1.05: the chains have not mixed"
    _, one = convergence_row({**record, "rhat_max": None})
    assert one.startswith("R-hat n/a (1 chain)")
