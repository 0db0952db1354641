"""Hostile input to the Python API (issue 24): every bad argument is a ValueError naming the argument,
raised before any work; every damaged save file is a SaveFileError naming the file and the entry; absurd
sizes are refused with their estimate.  One table per class: API shapes and types, save files, sizes."""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from zoo import BayesianNetwork, CategoricalLikelihood, GaussianLikelihood
from zoo.architectures import MLP
from zoo.checks import check_dataset
from zoo.data import Dataset

from inference import evaluate, fit, load_posterior
from inference.backends import BACKENDS
from inference.backends.base import parse_config
from inference.storage.posterior_io import MissingSaveError, SaveFileError

N = 20
X = torch.linspace(-2, 2, N).unsqueeze(1)
Y = 2 * X + 0.1 * torch.cos(7 * X)
QUICK = {"backend": "sgld", "progress": False, "num_samples": 4, "warmup_steps": 2, "map_steps": 2, "num_chains": 1}


def _bnn(**kw):
    torch.manual_seed(0)
    return BayesianNetwork(MLP(1, 1, hidden=(5,)), "last", **{"example_input": X[:2], **kw})


class Free(nn.Module):
    """A user network: no input layout can be read from it, only its forward tells."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(1, 1)

    def forward(self, x):
        return self.inner(x)


@pytest.fixture(scope="module")
def posterior():
    return fit(_bnn(), X, Y, seed=0, **QUICK)


@pytest.fixture(scope="module")
def classifier():
    torch.manual_seed(0)
    bnn = BayesianNetwork(MLP(1, 3, hidden=(4,)), "last", likelihood=CategoricalLikelihood(), example_input=X[:2])
    return fit(bnn, X, (torch.arange(N) % 3), seed=0, **QUICK)


def _dataset(y_loc=0.0, n_features=1):
    x = torch.randn(N, n_features)
    return Dataset("toy", "regression", x, Y, x[:5], Y[:5], torch.zeros(n_features), torch.ones(n_features),
                   torch.tensor([y_loc]), torch.ones(1))


# ---------------------------------------------------------------------- API shapes and types
API_CASES = {
    "fit 1-D x": (lambda p, c: fit(_bnn(), X[:, 0], Y, **QUICK), r"x has shape \(20,\).*reshape\(-1, 1\)"),
    "fit 3 features": (lambda p, c: fit(_bnn(), torch.randn(N, 3), Y, **QUICK),
                       r"x has 3 features .*the network was built for 1"),
    "fit list x": (lambda p, c: fit(_bnn(), X.tolist(), Y, **QUICK), r"x must be a torch.Tensor or a numpy array"),
    "fit string y": (lambda p, c: fit(_bnn(), X, np.array(["a"] * N), **QUICK), r"y is a numpy array of dtype"),
    "fit y rows": (lambda p, c: fit(_bnn(), X, Y[:5], **QUICK), r"x has 20 rows but y has 5"),
    "fit NaN x": (lambda p, c: fit(_bnn(), torch.where(X > 1, float("nan"), X), Y, **QUICK), r"x has \d+ NaN"),
    "fit bool x": (lambda p, c: fit(_bnn(), X > 0, Y, **QUICK), r"x has dtype torch.bool"),
    "fit y missing": (lambda p, c: fit(_bnn(), X, **QUICK), r"y is missing"),
    "fit seed a string": (lambda p, c: fit(_bnn(), X, Y, **{**QUICK, "seed": "a"}), r"seed must be an integer"),
    "fit a plain network": (lambda p, c: fit(MLP(1, 1), X, Y, **QUICK), r"bnn must be a zoo.BayesianNetwork, got MLP"),
    "fit user net, wrong width": (
        lambda p, c: fit(BayesianNetwork(Free(), output_dim=1), torch.randn(N, 4), Y, **QUICK),
        r"x \(shape \(20, 4\), torch.float32\) does not fit the network: Free.forward"),
    "fit fractional labels": (
        lambda p, c: fit(c.bnn, X, torch.arange(N) % 3 + 0.5, **QUICK), r"y holds class labels that are not whole"),
    "fit labels out of range": (lambda p, c: fit(c.bnn, X, torch.arange(N) % 5, **QUICK), r"labels in \[0, 4\]"),
    "predict 1-D x": (lambda p, c: p.predict(X[:, 0]), r"x has shape \(20,\)"),
    "predict 3 features": (lambda p, c: p.predict(torch.ones(5, 3)), r"x has 3 features .*built for 1"),
    "predict image rows": (lambda p, c: p.predict(torch.ones(5, 2, 2)), r"x has 4 entries per row"),
    "predict scalar x": (lambda p, c: p.predict(torch.tensor(1.0)), r"x is a scalar"),
    "predict list x": (lambda p, c: p.predict([[1.0]]), r"x must be a torch.Tensor or a numpy array, got list"),
    "predict complex x": (lambda p, c: p.predict(X.to(torch.complex64)), r"x has complex dtype"),
    "predict sparse x": (lambda p, c: p.predict(X.to_sparse()), r"x is a torch.sparse_coo tensor"),
    "predict empty x": (lambda p, c: p.predict(X[:0]), r"x has no rows"),
    "predict chunk_size=0": (lambda p, c: p.predict(X, chunk_size=0), r"chunk_size must be an integer, at least 1"),
    "predict chunk_size=1.5": (lambda p, c: p.predict(X, chunk_size=1.5), r"chunk_size must be an integer"),
    "predict num_samples='3'": (lambda p, c: p.predict(X, num_samples="3"), r"num_samples must be an integer"),
    "predict seed=-1": (lambda p, c: p.predict(X, seed=-1), r"seed must be an integer in \[0, 2\*\*32\)"),
    "predict y rows": (lambda p, c: p.predict(X, y=Y[:3]), r"x has 20 rows but y has 3"),
    "predict y columns": (lambda p, c: p.predict(X, y=torch.ones(N, 2)), r"y has 2 target columns"),
    "example_input width": (lambda p, c: _bnn(example_input=torch.randn(2, 3)),
                            r"example_input has 3 features .*built for 1"),
    "example_input numpy strings": (lambda p, c: _bnn(example_input=np.array([["a"]])),
                                    r"example_input is a numpy array of dtype"),
    "prior not a Prior": (lambda p, c: _bnn(prior="normal"), r"prior must be a zoo.priors.Prior"),
    "likelihood not a Likelihood": (lambda p, c: _bnn(likelihood="gaussian"), r"likelihood must be a"),
    "train_deterministic string": (lambda p, c: _bnn(train_deterministic="no"), r"train_deterministic must be True"),
    "output_dim 0": (lambda p, c: _bnn(output_dim=0), r"output_dim must be a positive integer"),
    "output_dim vs example_input": (lambda p, c: _bnn(output_dim=2), r"output_dim=2 but MLP returns 1 outputs"),
    "target_scale length": (lambda p, c: _bnn(target_scale=torch.ones(3)), r"target_scale has 3 values"),
    "target_loc NaN": (lambda p, c: _bnn(target_loc=torch.tensor([float("nan")])), r"target_loc has 1 NaN"),
    "evaluate lengths": (lambda p, c: evaluate(p.predict(X, y=Y), Y[:10]), r"y has 10 rows but the prediction is at 20"),
    "evaluate width": (lambda p, c: evaluate(p.predict(X, y=Y), torch.randn(N, 2)), r"y has shape \(20, 2\)"),
    "evaluate without targets": (lambda p, c: evaluate(p.predict(X), Y), r"evaluate needs a prediction made with the"),
    "evaluate not a prediction": (lambda p, c: evaluate({"mean": 1}, Y), r"pred must be a Prediction"),
    "evaluate labels": (lambda p, c: evaluate(c.predict(X, y=torch.arange(N) % 3), torch.full((N,), 7)),
                        r"y holds labels in \[7, 7\] but the prediction has 3 classes"),
    "report data of other width": (lambda p, c: check_dataset(p.bnn, _dataset(n_features=2)),
                                   r"data.x_train has 2 features"),
    "report data of other scaling": (lambda p, c: check_dataset(p.bnn, _dataset(y_loc=3.0)),
                                     r"data.y_loc is \[3.0\] but the model's target scaling"),
    "report data of other size": (lambda p, c: check_dataset(p.bnn, _dataset(), num_data=7),
                                  r"data has 20 training rows but the posterior was fitted on 7"),
    "report data not a Dataset": (lambda p, c: check_dataset(p.bnn, {"x": X}), r"data must be a zoo.data.Dataset"),
}


@pytest.mark.parametrize("case", API_CASES, ids=list(API_CASES))
def test_api_refuses_bad_arguments_naming_them(case, posterior, classifier):
    call, message = API_CASES[case]
    state = torch.random.get_rng_state()
    with pytest.raises(ValueError, match=message):
        call(posterior, classifier)
    if case.startswith("predict"):
        assert torch.equal(torch.random.get_rng_state(), state)  # checked before any draw


def test_numpy_is_accepted_and_converted_everywhere(posterior):
    """numpy arrays give the same numbers as tensors at fit, predict and evaluate, and integer
    features of a real-valued network the same as their float values."""
    a = fit(_bnn(), X.numpy(), Y.numpy().astype(np.float64), seed=0, **QUICK).predict(X.numpy(), y=Y.numpy(), seed=1)
    b = fit(_bnn(), X, Y, seed=0, **QUICK).predict(X, y=Y, seed=1)
    assert torch.equal(a.f, b.f) and torch.equal(a.log_lik, b.log_lik)
    assert evaluate(a, Y.numpy()) == evaluate(b, Y)
    whole = torch.arange(-3, 4).unsqueeze(1)
    assert torch.equal(posterior.predict(whole, seed=2).f, posterior.predict(whole.float(), seed=2).f)


def test_matching_dataset_passes_the_report_check(posterior):
    check_dataset(posterior.bnn, _dataset(), num_data=N)


# ---------------------------------------------------------------------- save files
def _edit_json(name, change):
    def edit(folder: Path):
        obj = json.loads((folder / name).read_text())
        change(obj)
        (folder / name).write_text(json.dumps(obj))
    return edit


def _edit_tensors(change):
    def edit(folder: Path):
        payload = torch.load(folder / "posterior.pt", weights_only=True)
        change(payload)
        torch.save(payload, folder / "posterior.pt")
    return edit


class _Planted:
    """A pickle that would create a file if it were ever unpickled."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def _relink(name, target):
    def edit(folder: Path):
        (folder / name).unlink()
        os.symlink(target, folder / name)
    return edit


SAVE_CASES = {
    "no save": (lambda d: [f.unlink() for f in d.iterdir()], MissingSaveError, r"no saved posterior at .*posterior.json"),
    "info.json missing": (lambda d: (d / "info.json").unlink(), MissingSaveError, r"info.json is missing"),
    "truncated posterior.pt": (lambda d: (d / "posterior.pt").write_bytes((d / "posterior.pt").read_bytes()[:-40]),
                               SaveFileError, r"posterior.pt is not a torch.save archive"),
    "posterior.pt not a zip": (lambda d: (d / "posterior.pt").write_bytes(pickle.dumps({"net": {}})),
                               SaveFileError, r"posterior.pt is not a torch.save archive"),
    "pickled object": (lambda d: torch.save({"net": _Planted(d / "PWNED")}, d / "posterior.pt"),
                       SaveFileError, r"posterior.pt holds objects other than tensors"),
    "bad JSON": (lambda d: (d / "posterior.json").write_text('{"format": '), SaveFileError,
                 r"posterior.json is not valid JSON \(.* at line 1, column 12\)"),
    "binary manifest": (lambda d: (d / "posterior.json").write_bytes(b"\xff\x00"), SaveFileError,
                        r"posterior.json is not a JSON text file"),
    "manifest a list": (lambda d: (d / "posterior.json").write_text("[]"), SaveFileError,
                        r"posterior.json holds a JSON list"),
    "version mismatch": (_edit_json("posterior.json", lambda m: m.update(format="bnn-zoo-posterior/9")), SaveFileError,
                         r"posterior.json has format 'bnn-zoo-posterior/9'"),
    "kind missing": (_edit_json("posterior.json", lambda m: m.pop("kind")), SaveFileError,
                     r"posterior.json has no 'kind' entry"),
    "site entry renamed": (_edit_json("posterior.json", lambda m: m["sites"][0].update(nom=m["sites"][0].pop("name"))),
                           SaveFileError, r"posterior.json has no sites\[0\].'name' entry"),
    "unknown posterior kind": (_edit_json("posterior.json", lambda m: m.update(kind="magic")), SaveFileError,
                               r"posterior.json: unknown posterior kind 'magic'"),
    "unknown prior class": (_edit_json("posterior.json", lambda m: m["prior"].update({"class": "Magic"})),
                            SaveFileError, r"posterior.json: unknown prior class 'Magic'"),
    "unknown prior argument": (_edit_json("posterior.json", lambda m: m["prior"].update(args={"sigma": 1})),
                               SaveFileError, r"posterior.json: the prior NormalPrior.*unexpected keyword .*'sigma'"),
    "output_dim a string": (_edit_json("posterior.json", lambda m: m.update(output_dim="1")), SaveFileError,
                            r"posterior.json: 'output_dim' is '1' \(str\)"),
    "hidden size changed": (_edit_json("posterior.json", lambda m: m["network"]["args"].update(hidden=[6])),
                            SaveFileError, r"posterior.json describes the network as mlp\(.*hidden=\[6\].*but "
                                           r".*posterior.pt holds weights of another network"),
    "unknown architecture": (_edit_json("posterior.json", lambda m: m["network"].update(zoo="resnet")), SaveFileError,
                             r"posterior.json: the network cannot be rebuilt .*unknown architecture 'resnet'"),
    "unknown module": (_edit_json("posterior.json", lambda m: m.update(active_at_prediction=["nope"])), SaveFileError,
                       r"posterior.json: active_at_prediction entry 'nope'"),
    "info.json a list": (lambda d: (d / "info.json").write_text("[]"), SaveFileError, r"info.json holds a JSON list"),
    "weights not tensors": (_edit_tensors(lambda p: p["net"].update({"fc1.weight": "w"})), SaveFileError,
                            r"posterior.pt: fc1.weight is a str, not a tensor"),
    "NaN weights": (_edit_tensors(lambda p: p["net"]["out.weight"].fill_(float("nan"))), SaveFileError,
                    r"posterior.pt: out.weight holds NaN"),
    "negative target scale": (_edit_tensors(lambda p: p["buffers"]["target_scale"].fill_(-1)), SaveFileError,
                              r"posterior.pt: buffers\['target_scale'\]"),
    "draws of another shape": (_edit_tensors(lambda p: p["posterior"]["draws"].update(
        {k: torch.zeros(1, 4, 3) for k in p["posterior"]["draws"]})), SaveFileError,
        r"posterior.pt: the posterior's draws have sites"),
    "draws missing": (_edit_tensors(lambda p: p["posterior"].pop("draws")), SaveFileError,
                      r"save: the 'samples' posterior's state \('posterior' of posterior.json and posterior.pt\) cannot be "
                      r"rebuilt .*KeyError: 'draws'"),
    "link out of the folder": (_relink("info.json", "/dev/zero"), SaveFileError,
                               r"info.json is a link to /dev/zero, outside the save folder"),
    "link to itself": (_relink("info.json", "info.json"), SaveFileError, r"info.json cannot be opened"),
    "a FIFO": (lambda d: ((d / "posterior.pt").unlink(), os.mkfifo(d / "posterior.pt")), SaveFileError,
               r"posterior.pt is not a regular file"),
}


@pytest.mark.parametrize("case", SAVE_CASES, ids=list(SAVE_CASES))
def test_damaged_save_is_a_save_file_error_naming_file_and_entry(case, posterior, tmp_path):
    damage, error, message = SAVE_CASES[case]
    folder = posterior.save(tmp_path / "save")
    damage(folder)
    with pytest.raises(error, match=message) as caught:
        load_posterior(folder)
    assert "weights_only" not in str(caught.value)
    assert not (folder / "PWNED").exists()


def test_a_link_inside_the_folder_is_followed(posterior, tmp_path):
    folder = posterior.save(tmp_path / "save")
    (folder / "posterior.pt").rename(folder / "weights.pt")
    os.symlink("weights.pt", folder / "posterior.pt")
    assert torch.equal(load_posterior(folder).predict(X, seed=0).f, posterior.predict(X, seed=0).f)


def test_net_given_that_does_not_match_says_net(posterior, tmp_path):
    folder = posterior.save(tmp_path / "save")
    with pytest.raises(SaveFileError, match=r"net= does not match the saved network"):
        load_posterior(folder, net=MLP(1, 1, hidden=(6,)))


# ---------------------------------------------------------------------- sizes
SIZE_CASES = {
    "network beyond memory": (lambda p: MLP(1, 1, hidden=(10**6, 10**6)),
                              r"MLP\(.*hidden=\(1000000, 1000000\)\), with 1,000,004,000,001 parameters .* needs about "
                              r"3.6 TiB of memory"),
    "epochs 1e30": (lambda p: parse_config(BACKENDS["svi"], {"epochs": 1e30}), r"option 'epochs' .* is 1e\+30"),
    "lr not finite": (lambda p: parse_config(BACKENDS["svi"], {"lr": float("inf")}),
                      r"option 'lr' .* must be a finite number"),
    "sampler draws beyond memory": (lambda p: fit(_bnn(), X, Y, **{**QUICK, "num_samples": 10**9, "num_chains": 10**4}),
                                    r"storing num_chains x num_samples = 10,000,000,000,000 draws of 6 random values"),
    "prediction beyond memory": (lambda p: p.predict(torch.zeros(10**5, 1), num_samples=10**9),
                                 r"predict with num_samples=1000000000 at 100000 points .* needs about"),
}


@pytest.mark.parametrize("case", SIZE_CASES, ids=list(SIZE_CASES))
def test_absurd_sizes_are_refused_with_their_estimate(case, posterior):
    call, message = SIZE_CASES[case]
    with pytest.raises(ValueError, match=message):
        call(posterior)


def test_save_edited_to_an_absurd_network_allocates_nothing(posterior, tmp_path):
    folder = posterior.save(tmp_path / "save")
    _edit_json("posterior.json", lambda m: m["network"]["args"].update(hidden=[10**6, 10**6]))(folder)
    with pytest.raises(SaveFileError, match=r"posterior.json: the network cannot be rebuilt .*needs about"):
        load_posterior(folder)
