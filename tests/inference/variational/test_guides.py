"""The one guide protocol (per-site location and scale, pruning rule) and no global side effects.

Every guide in ``inference.variational.guides.GUIDES`` follows ``VariationalGuide``; the values it reports are
checked against parameters set by hand.  Importing ``inference`` changes neither Pyro's settings
nor the warning filters, and stock Pyro code in the same process keeps working after importing
and after one of our fits (the guides switch Pyro's module-local parameter mode on only around
their own construction and calls), while several fitted posteriors still coexist.
"""
from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pyro
import pytest
import torch

from inference import fit
from inference.variational.guides import EmptyGuide, NormalGuide, build_guide
from inference.variational import AutoRadial, MeanFieldGuide, PrunableGuide, PruningRule, VariationalGuide
from inference.variational.protocol import SNR_RULE, module_local_params, rule_mask
from zoo import BayesianNetwork, GaussianLikelihood

ROOT = Path(__file__).resolve().parents[3]
SITES = ["0.weight", "0.bias", "2.weight", "2.bias"]
SHAPES = {"0.weight": (4, 3), "0.bias": (4,), "2.weight": (1, 4), "2.bias": (1,)}


def _bnn(stochastic="all"):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    return BayesianNetwork(net, stochastic=stochastic, likelihood=GaussianLikelihood(), output_dim=1)


def _values(seed):
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=g) for name, shape in SHAPES.items()}


def _run(code: str) -> str:
    """Run ``code`` in a fresh interpreter at the repository root; return its stdout."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# ------------------------------------------------------------------------------------------ conformance
def test_normal_guide_reports_its_locs_and_scales():
    bnn, init = _bnn(), _values(1)
    guide = build_guide("normal", bnn, init_values=init, init_scale=0.3)
    assert isinstance(guide, NormalGuide) and isinstance(guide, VariationalGuide)
    assert not isinstance(guide, PrunableGuide) and guide.pruning_rule() is None
    # the noise precision is constrained (positive): not a site with a per-entry (loc, scale)
    assert guide.sites() == SITES
    for name in SITES:
        loc, scale = guide.site_loc_scale(name)
        torch.testing.assert_close(loc, init[name])
        torch.testing.assert_close(scale, torch.full(SHAPES[name], 0.3))
        assert not loc.requires_grad and not scale.requires_grad
    with pytest.raises(KeyError, match="not a real-valued site"):
        guide.site_loc_scale("noise_precision")


@pytest.mark.parametrize("family", ["graves", "sparse-vd", "kingma-vd"])
def test_mean_field_guide_reports_family_sd_log_alpha_and_rule(family):
    bnn = _bnn()
    guide = build_guide("mean-field", bnn, family=family)
    assert isinstance(guide, MeanFieldGuide) and isinstance(guide, PrunableGuide)
    assert guide.sites() == SITES
    g = torch.Generator().manual_seed(2)
    loc = torch.randn(guide.loc.shape, generator=g)
    s = -3.0 * torch.rand(guide.loc.shape, generator=g)  # log σ, or log α ∈ (−3, 0) for Kingma VD
    with torch.no_grad():
        guide.loc.copy_(loc)
        guide.scale_param.copy_(s)
    theta, param = loc[:12].view(4, 3), s[:12].view(4, 3)  # 0.weight
    sd = {"graves": param.exp(), "sparse-vd": param.exp(), "kingma-vd": theta.abs() * (0.5 * param).exp()}[family]
    log_alpha = {
        "graves": -2 * torch.log(theta.abs() / param.exp()),
        "sparse-vd": (2 * param - torch.log(theta**2 + 1e-8)).clamp(-8, 8),
        "kingma-vd": param,
    }[family]
    got_loc, got_sd = guide.site_loc_scale("0.weight")
    torch.testing.assert_close(got_loc, theta)
    torch.testing.assert_close(got_sd, sd)
    torch.testing.assert_close(guide.log_alpha("0.weight"), log_alpha)
    rule = guide.pruning_rule()
    assert rule.family == family and rule.statistic == ("snr" if family == "graves" else "log_alpha")
    with pytest.raises(KeyError, match="not a weight site"):
        guide.site_loc_scale("noise_precision")


def test_radial_guide_reports_marginal_sd():
    bnn, init = _bnn(), _values(3)
    guide = build_guide("radial", bnn, init_values=init, init_scale=0.5)
    assert isinstance(guide, AutoRadial) and isinstance(guide, PrunableGuide)
    assert guide.sites() == SITES and guide.pruning_rule() is SNR_RULE
    for name in SITES:
        loc, sd = guide.site_loc_scale(name)
        dim = math.prod(SHAPES[name])
        torch.testing.assert_close(loc, init[name])
        torch.testing.assert_close(sd, torch.full(SHAPES[name], 0.5 / math.sqrt(dim)))  # E ξ_i² = 1/D
        torch.testing.assert_close(guide.log_alpha(name), -2 * torch.log(init[name].abs() / (0.5 / math.sqrt(dim))))


def test_empty_guide_has_no_sites():
    guide = build_guide("normal", _bnn(stochastic="none"))
    assert isinstance(guide, EmptyGuide) and isinstance(guide, VariationalGuide)
    assert guide.sites() == [] and guide.pruning_rule() is None
    with pytest.raises(KeyError):
        guide.site_loc_scale("0.weight")


@pytest.mark.parametrize("name, kwargs", [("mean-field", {"family": "graves"}), ("mean-field", {"family": "kingma-vd"}),
                                          ("radial", {})])
def test_prune_sets_mean_and_sd_to_zero(name, kwargs):
    bnn = _bnn()
    guide = build_guide(name, bnn, init_scale=0.2, **kwargs)
    mask = torch.zeros(4, 3, dtype=torch.bool)
    mask[:, 1] = True
    guide.prune_("0.weight", mask)
    loc, sd = guide.site_loc_scale("0.weight")
    assert bool((loc[mask] == 0).all() and (sd[mask] == 0).all())
    assert bool((sd[~mask] > 0).all())
    assert bool(rule_mask(guide, "0.weight")[mask].all())  # already pruned counts as prunable
    with torch.no_grad(), pyro.plate("draws", 50, dim=-1):
        draws = pyro.poutine.trace(guide).get_trace().nodes["0.weight"]["value"]
    assert bool((draws[:, mask] == 0).all())


def test_pruning_rules_on_known_statistics():
    assert SNR_RULE.mask(torch.tensor([0.5, 0.83, 1.0])).tolist() == [True, False, False]
    assert SNR_RULE.log_alpha_threshold() == pytest.approx(-2 * math.log(0.83))
    log_alpha = torch.tensor([-1.0, 0.0, 3.0, 3.5])
    inclusive = PruningRule("k", "log alpha >= t", "log_alpha", 0.0, (-8.0, 0.0), inclusive=True)
    strict = PruningRule("s", "log alpha > t", "log_alpha", 3.0, (-8.0, 8.0))
    assert inclusive.mask(log_alpha).tolist() == [False, True, True, True]
    assert strict.mask(log_alpha).tolist() == [False, False, False, True]
    assert strict.log_alpha_threshold(2.0) == 2.0
    with pytest.raises(ValueError, match="out of range"):
        strict.check_threshold(9.0)


def test_report_reads_the_protocol():
    from lab.report.layers import family_rule, loc_scale

    bnn = _bnn()
    x, y = torch.randn(16, 3), torch.randn(16, 1)
    post = fit(bnn, x, y, backend="radial", epochs=2, progress=False, init_scale=0.3)
    values, source = loc_scale(post)
    assert "'radial' guide" in source
    for name in SITES:
        loc, sd = post.guide.site_loc_scale(name)
        assert (values[name][0] == loc.reshape(-1).numpy()).all() and (values[name][1] == sd.reshape(-1).numpy()).all()
    fractions, rule, threshold = family_rule(post)
    assert set(fractions) == set(SITES) and threshold == pytest.approx(-2 * math.log(0.83))
    svi = fit(bnn, x, y, backend="svi", epochs=1, progress=False)
    assert family_rule(svi)[0] is None and "this guide has none" in family_rule(svi)[1]


# ------------------------------------------------------------------------------------------ side effects
def test_module_local_params_is_restored_after_errors():
    before = pyro.settings.get("module_local_params")
    with pytest.raises(RuntimeError):
        with module_local_params():
            assert pyro.settings.get("module_local_params") is True
            raise RuntimeError("boom")
    assert pyro.settings.get("module_local_params") == before


def test_import_changes_no_pyro_setting_and_no_warning_filter():
    out = _run(
        """
        import warnings
        import pyro
        settings, filters = pyro.settings.get(), list(warnings.filters)
        import inference, inference.variational.guides, inference.variational
        print(pyro.settings.get() == settings, list(warnings.filters) == filters,
              pyro.settings.get("module_local_params"))
        """
    )
    assert out.split() == ["True", "True", "False"]


STOCK_PYRO = """
import torch, pyro, pyro.distributions as dist
from pyro.infer import SVI, Trace_ELBO
from pyro.nn import PyroModule

def stock_fit():
    # stock Pyro: a PyroModule[nn.Linear] with plain nn.Parameters, fitted by SVI in the global store
    pyro.clear_param_store()
    torch.manual_seed(0)
    linear = PyroModule[torch.nn.Linear](2, 1)
    x = torch.randn(50, 2)
    y = x @ torch.tensor([1.0, -2.0]) + 0.1 * torch.randn(50)
    def model(x, y):
        with pyro.plate("data", len(x)):
            pyro.sample("obs", dist.Normal(linear(x).squeeze(-1), 0.5), obs=y)
    svi = SVI(model, lambda x, y: None, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    losses = [svi.step(x, y) for _ in range(100)]
    return losses[-1] < losses[0] / 10, sorted(pyro.get_param_store().keys())
"""


def test_stock_pyro_works_after_import_and_after_our_fits():
    out = _run(
        STOCK_PYRO
        + """
import inference
from zoo import BayesianNetwork, GaussianLikelihood
print(stock_fit())
for backend in ("svi", "radial"):
    bnn = BayesianNetwork(torch.nn.Linear(2, 1), stochastic="all", likelihood=GaussianLikelihood(0.5), output_dim=1)
    post = inference.fit(bnn, torch.randn(20, 2), torch.randn(20, 1), backend=backend, epochs=2, progress=False)
    post.predict(torch.randn(3, 2), num_samples=4)
    print(sorted(pyro.get_param_store().keys()), pyro.settings.get("module_local_params"))
print(stock_fit())
"""
    )
    lines = out.strip().splitlines()
    stock = "(True, ['bias', 'weight'])"
    # our fits leave the global parameter store alone (it still holds the stock run's parameters)
    assert lines == [stock, "['bias', 'weight'] False", "['bias', 'weight'] False", stock]


@pytest.mark.parametrize("backend", ["svi", "radial"])
def test_several_posteriors_coexist(backend):
    x = torch.randn(30, 3)
    y = x[:, :1] - x[:, 1:2]
    first = fit(_bnn(), x, y, backend=backend, seed=0, epochs=20, batch_size=None, progress=False)
    before = {k: v.clone() for k, v in first.sample_params(10, seed=0).items()}
    second = fit(_bnn(), x, -y, backend=backend, seed=1, epochs=20, batch_size=None, progress=False)
    after = first.sample_params(10, seed=0)
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert not torch.equal(second.sample_params(10, seed=0)["2.weight"], after["2.weight"])
    first_params = {id(p) for p in first.guide.parameters()}
    assert first_params.isdisjoint(id(p) for p in second.guide.parameters())
