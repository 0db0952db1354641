"""Portable posterior files: no pickled modules; a notebook-defined network reloads in a fresh process
with ``net=`` (and says so without it); zoo architectures and torch.nn stacks rebuild by themselves."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from zoo.architectures import build_architecture
from zoo.bnn import BayesianNetwork
from zoo.likelihoods import GaussianLikelihood
from zoo.priors import NormalPrior, Prior, StudentTPrior
from zoo.stochastic import ElementMasks

from inference import SamplePosterior, fit, load_posterior
from inference.storage.net_spec import build_net, net_spec

ROOT = Path(__file__).resolve().parents[3]


def _data(n=30, d=3):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g)
    return x, (x[:, :1] - 0.5 * x[:, 1:2] + 0.1 * torch.randn(n, 1, generator=g))


def test_user_class_reloads_in_a_fresh_process_only_with_net(tmp_path):
    class TwoLayer(nn.Module):  # defined here: not importable from any module, like a notebook class
        def __init__(self, width):
            super().__init__()
            self.hidden, self.out = nn.Linear(3, width), nn.Linear(width, 1)

        def forward(self, x):
            return self.out(torch.tanh(self.hidden(x)))

    x, y = _data()
    torch.manual_seed(0)
    bnn = BayesianNetwork(TwoLayer(6), "last", likelihood=GaussianLikelihood(learn_noise=True), output_dim=1,
                          target_loc=torch.tensor([1.0]), target_scale=torch.tensor([2.0]))
    user = fit(bnn, x, y, seed=0, progress=False, epochs=5, batch_size=None)
    user.save(tmp_path / "user")
    torch.manual_seed(1)
    zoo_net = build_architecture("mlp", 3, 1, hidden=[5, 4], activation="tanh")
    masks = {"fc2.weight": torch.rand(4, 5) < 0.5}
    zoo_bnn = BayesianNetwork(zoo_net, ElementMasks(masks, fixed_values="current"), prior=StudentTPrior(4.0, 0.7),
                              likelihood=GaussianLikelihood(0.3), output_dim=1)
    zoo_post = fit(zoo_bnn, x, y, backend="sgld", seed=0, progress=False, num_chains=2, num_samples=6, thin=1,
                   warmup_steps=5, map_steps=5)
    zoo_post.save(tmp_path / "zoo")
    torch.save({"x": x, "user": user.predict(x, num_samples=7, seed=3).f,
                "zoo": zoo_post.predict(x, seed=3).f}, tmp_path / "expected.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        from torch import nn
        from inference import load_posterior
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        try:
            load_posterior({str(tmp_path / "user")!r})
        except ValueError as err:
            print("ERROR:", err)
        class TwoLayer(nn.Module):
            def __init__(self, width):
                super().__init__()
                self.hidden, self.out = nn.Linear(3, width), nn.Linear(width, 1)
            def forward(self, x):
                return self.out(torch.tanh(self.hidden(x)))
        user = load_posterior({str(tmp_path / "user")!r}, net=TwoLayer(6))
        zoo = load_posterior({str(tmp_path / "zoo")!r})
        print("USER", torch.equal(user.predict(expected["x"], num_samples=7, seed=3).f, expected["user"]))
        print("ZOO", torch.equal(zoo.predict(expected["x"], seed=3).f, expected["zoo"]))
        print("MASKED", [s.name for s in zoo.bnn.sites if s.mask is not None], repr(zoo.bnn.prior))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    error = next(line for line in out.splitlines() if line.startswith("ERROR:"))
    assert "TwoLayer" in error and "test_user_class_reloads_in_a_fresh_process_only_with_net.<locals>" in error
    assert f"load_posterior({str(tmp_path / 'user')!r}, net=TwoLayer(...))" in error
    assert "USER True" in out and "ZOO True" in out
    assert "MASKED ['fc2.weight'] StudentTPrior(df=4.0, scale=0.7)" in out


def test_files_are_plain_tensors_and_json(tmp_path, conjugate_regression):
    problem = conjugate_regression
    bnn = BayesianNetwork(problem.net(), "all", likelihood=GaussianLikelihood(learn_noise=True), output_dim=1)
    post = fit(bnn, problem.x, problem.y, progress=False, epochs=3, batch_size=None)
    post.save(tmp_path / "p")
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["info.json", "posterior.json", "posterior.pt"]
    tensors = torch.load(tmp_path / "p" / "posterior.pt", weights_only=True)  # no pickled objects
    assert set(tensors["net"]) == {"weight", "bias"} and set(tensors["posterior"]) == {"guide"}
    manifest = json.loads((tmp_path / "p" / "posterior.json").read_text())
    assert manifest["kind"] == "variational" and manifest["posterior"]["guide_name"] == "normal"
    assert manifest["network"] == {"torch": "Linear", "args": {"in_features": 2, "out_features": 1, "bias": True}}
    assert [s["name"] for s in manifest["sites"]] == ["weight", "bias"]
    assert manifest["likelihood"]["class"] == "GaussianLikelihood" and manifest["likelihood"]["args"]["learn_noise"]


def test_specs_rebuild_zoo_and_torch_networks_and_only_those():
    nets = [
        nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(48, 2)),
        build_architecture("cnn", 64, 3),
        build_architecture("multilstm", 2, 2, hidden=4, unrolled=True),
        build_architecture("transformer", None, 2, vocab_size=20, d_model=8, n_heads=2, hidden=16),
    ]
    for net in nets:
        spec = net_spec(net)
        assert "user" not in spec, spec
        assert repr(build_net(spec)) == repr(net)

    class Custom(nn.Linear):
        pass

    assert net_spec(Custom(2, 2))["user"].endswith("Custom")
    spec = net_spec(nn.Sequential(Custom(2, 2), nn.ReLU()))
    assert "user" in spec and spec["contains"].endswith("Custom")


def test_net_mismatch_old_files_and_user_prior_are_clear_errors(tmp_path):
    class ScaledNormal(Prior):
        def __init__(self, scale):
            self.inner = NormalPrior(scale)

        def site_distribution(self, site):
            return self.inner.site_distribution(site)

    x, y = _data()
    bnn = BayesianNetwork(nn.Linear(3, 1), "all", prior=ScaledNormal(2.0), output_dim=1)
    post = SamplePosterior(bnn, {"weight": torch.randn(1, 4, 1, 3), "bias": torch.randn(1, 4, 1)})
    post.save(tmp_path / "p")
    with pytest.raises(ValueError, match=r"ScaledNormal.*prior=ScaledNormal\(\.\.\.\)"):
        load_posterior(tmp_path / "p")
    loaded = load_posterior(tmp_path / "p", prior=ScaledNormal(2.0))
    assert torch.equal(loaded.predict(x, seed=1).f, post.predict(x, seed=1).f)
    with pytest.raises(ValueError, match=r"net= does not match the saved network \(Linear\): 'weight' has shape \(1, 4\), saved \(1, 3\)$"):
        load_posterior(tmp_path / "p", net=nn.Linear(4, 1), prior=ScaledNormal(2.0))
    (tmp_path / "old").mkdir()
    torch.save({"kind": "samples"}, tmp_path / "old" / "posterior.pt")  # the former, pickled layout
    with pytest.raises(ValueError, match="older version"):
        load_posterior(tmp_path / "old")
    with pytest.raises(FileNotFoundError, match="Posterior.save"):
        load_posterior(tmp_path / "nothing")


def test_a_subclass_with_its_own_kind_round_trips_with_dtype_kept(tmp_path):
    class Tagged(SamplePosterior):
        kind = "test-tagged"

    bnn = BayesianNetwork(nn.Linear(3, 2), "all", likelihood=GaussianLikelihood(0.2), output_dim=2).double()
    draws = {"weight": torch.randn(2, 3, 2, 3, dtype=torch.float64), "bias": torch.randn(2, 3, 2, dtype=torch.float64)}
    post = Tagged(bnn, draws, sample_stats={"lp": torch.randn(2, 3)}, info={"backend": "none"})
    loaded = load_posterior(post.save(tmp_path / "t"))
    assert type(loaded) is Tagged and loaded.info == {"backend": "none"}
    assert loaded.bnn.net.weight.dtype == torch.float64 and loaded.bnn.target_scale.dtype == bnn.target_scale.dtype
    x = torch.randn(5, 3, dtype=torch.float64)
    assert torch.equal(loaded.predict(x, seed=0).f, post.predict(x, seed=0).f)
